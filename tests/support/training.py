"""Helpers of the tests that run training (tests/train/, tests/test_distributed.py)."""
import json
import os


def quiet(msg):
    """A `say=` for train() that prints nothing."""


# the smallest training run of the tests that stop, resume and damage runs (tests/train/)
TINY = dict(d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=2, seq_len=32, eval_batches=1,
            sample_bytes=4, warmup_steps=1, checkpoint_every=1)


def forget_digest(checkpoint, name):
    """Remove `name`'s size and SHA-256 from a checkpoint's trainer_state.json, as for a file changed on purpose:
    the tests that damage a file's values in place test the checks after the digest's."""
    path = os.path.join(checkpoint, "trainer_state.json")
    with open(path) as f:
        state = json.load(f)
    del state["files"][name]
    with open(path, "w") as f:
        json.dump(state, f)


def snapshot(folder):
    """relative path -> bytes (None for a folder, the target for a link) of everything under `folder`."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = os.path.join(root, name)
            rel = os.path.relpath(p, folder)
            out[rel] = ("->" + os.readlink(p)) if os.path.islink(p) else None if os.path.isdir(p) else \
                open(p, "rb").read()
    return out
