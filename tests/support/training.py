"""Helpers of the tests that run training (tests/train/, tests/test_distributed.py)."""


def quiet(msg):
    """A `say=` for train() that prints nothing."""


# the smallest training run of the tests that stop, resume and damage runs (tests/train/)
TINY = dict(d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=2, seq_len=32, eval_batches=1,
            sample_bytes=4, warmup_steps=1, checkpoint_every=1)
