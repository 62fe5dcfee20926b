"""tinygrad_ssm/fast/heap_reuse.py: once a fused model is built, arrays allocated and freed step after step reuse
the same memory instead of faulting in fresh pages; importing the package alone changes nothing (what that saves
a training step is measured by benchmarks/profile_step.py, not asserted here)."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc's")

# A step's worth of arrays (a few MB each, like a training step's activations), made and freed five times;
# prints the page faults those five steps took, and whether the setting took effect.
SCRIPT = """
import resource, sys
{setup}
import numpy as np
def step():
    arrays = [np.ones(n, np.float32) for n in (5_000_000, 1_000_000, 250_000, 3_000_000)]
    del arrays
    a = np.ones(4_000_000, np.float32); b = a * 2; del a, b
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
module = sys.modules.get("tinygrad_ssm.fast.heap_reuse")
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, module.took_effect if module else None)
"""
FUSED_MODEL = ("import tinygrad_ssm as tg; tg.Mamba2LMHeadModel(tg.Mamba2Config(d_model=16, n_layer=1, "
               "vocab_size=16, d_state=4, headdim=8), fused=True)")


def _faults(setup: str, **env) -> tuple:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and
               k != "TINYGRAD_SSM_KEEP_FREED_MEMORY"} | env
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(setup=setup)], env=environ, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), {"True": True, "False": False, "None": None}[out[1]]


def test_a_fused_model_makes_freed_arrays_be_reused_without_page_faults():
    faults, took_effect = _faults(FUSED_MODEL)
    assert took_effect
    assert faults < 20, f"{faults} page faults in 5 steps of reused array sizes"


def test_importing_the_package_changes_nothing():
    """The baseline that makes the test above mean something, and the import's promise: with the package imported
    (even its models), glibc's adaptive defaults stay and the same steps take fresh pages again and again."""
    faults, took_effect = _faults("import tinygrad_ssm, tinygrad_ssm.models")
    assert took_effect is False
    assert faults > 100


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "134217728"}, {"TINYGRAD_SSM_KEEP_FREED_MEMORY": "0"}])
def test_the_environment_wins(env):
    faults, took_effect = _faults(FUSED_MODEL, **env)
    assert took_effect is False


# --- the pool of large arrays (heap_reuse.empty) -------------------------------------------------------------

@pytest.fixture
def pool(monkeypatch):
    """heap_reuse with the pool on, empty, and LARGE at 1 KiB: arrays of 128 float64 and more are pooled."""
    from tinygrad_ssm.fast import heap_reuse
    monkeypatch.setattr(heap_reuse, "pooling", True)
    monkeypatch.setattr(heap_reuse, "LARGE", 1024)
    monkeypatch.setattr(heap_reuse, "_blocks", [])
    monkeypatch.setattr(heap_reuse, "_peak_in_use", 0)
    return heap_reuse


def test_a_freed_array_s_block_is_handed_out_again(pool):
    a = pool.empty((16, 16), np.float64)
    address = a.ctypes.data
    del a
    b = pool.empty((256,), np.float64)
    assert b.ctypes.data == address and b.shape == (256,) and b.flags.c_contiguous
    assert pool.pooled_bytes() == 2048


def test_a_block_is_never_handed_out_while_anything_made_from_it_lives(pool):
    import tinygrad_ssm as tg
    makers = {"a view": lambda a: a[10:20], "a view of a view": lambda a: a.reshape(16, 16).T[3],
              "a tensor": lambda a: tg.Tensor(a).data}
    for what, make in makers.items():
        a = pool.empty((256,), np.float64)
        held = make(a)
        assert np.shares_memory(held, a), what
        del a
        b = pool.empty((256,), np.float64)
        assert not np.shares_memory(b, held), what
        del held, b                                                     # both blocks unused again
    assert len(pool._blocks) == 2


def test_a_block_serves_only_its_dtype_and_requests_of_three_quarters_of_its_size_or_more(pool, monkeypatch):
    monkeypatch.setattr(pool, "HOLD", 100)                             # no block handed back here
    a = pool.empty((400,), np.float64)
    address = a.ctypes.data                                            # (holding a.base would keep it in use)
    del a
    other = pool.empty((800,), np.float32)                             # the same bytes, another dtype
    assert other.dtype == np.float32 and other.ctypes.data != address and len(pool._blocks) == 2
    del other
    half = pool.empty((400,), np.float32)                              # 400 items, as the float64 block holds
    assert half.dtype == np.float32 and half.ctypes.data != address
    small = pool.empty((299,), np.float64)                             # under 3/4 of 400: a block of its own
    assert small.ctypes.data != address and small.base.size == 299
    fits = pool.empty((300,), np.float64)                              # 3/4 of 400: the old block
    assert fits.ctypes.data == address and fits.base.size == 400


def test_small_arrays_and_the_pool_off_are_plain_numpy(pool, monkeypatch):
    small = pool.empty((127,), np.float64)                             # under LARGE
    assert small.base is None and not pool._blocks
    monkeypatch.setattr(pool, "pooling", False)
    assert pool.empty((4096,), np.float64).base is None and not pool._blocks
    z = pool.zeros((3, 100), np.float32)
    assert z.base is None and not z.any()


def test_zeros_are_zero_in_a_reused_block(pool):
    a = pool.empty((512,), np.float32)
    a[:] = 7
    del a
    z = pool.zeros((16, 32), np.float32)
    assert z.base is pool._blocks[0] and not z.any()


def test_release_unused_hands_back_only_what_nothing_uses(pool):
    kept = pool.empty((256,), np.float64)
    pool.empty((512,), np.float64)                                     # dropped at once
    assert pool.pooled_bytes() == 2048 + 4096
    assert pool.release_unused() == 4096
    assert pool.pooled_bytes() == 2048 and np.shares_memory(kept, pool._blocks[0])
    pool.empty((1024,), np.float64), pool.empty((4096,), np.float64)  # two unused blocks after the used one
    assert len(pool._blocks) == 3 and pool.release_unused() == 8192 + 32768
    assert len(pool._blocks) == 1 and np.shares_memory(kept, pool._blocks[0])


@given(ops=st.lists(st.tuples(st.booleans(), st.integers(128, 2048), st.sampled_from([np.float32, np.float64]),
                              st.integers(0, 63)), min_size=1, max_size=60))
def test_live_arrays_never_share_memory_and_keep_their_values(ops):
    """Random allocations and frees: every live array keeps what was written into it, no two overlap, and the
    pool never holds more than twice the most its arrays had in use at once."""
    from tinygrad_ssm.fast import heap_reuse
    saved = heap_reuse.pooling, heap_reuse.LARGE, heap_reuse._blocks, heap_reuse._peak_in_use
    heap_reuse.pooling, heap_reuse.LARGE, heap_reuse._blocks, heap_reuse._peak_in_use = True, 1024, [], 0
    try:
        live, stamp = [], 0
        for allocate, count, dtype, pick in ops:
            if allocate or not live:
                stamp += 1
                a = heap_reuse.empty((count,), dtype)
                a[:] = stamp
                live.append((a, stamp))
            else:
                live.pop(pick % len(live))
            for i, (a, s) in enumerate(live):
                assert (a == s).all()
                assert not any(np.shares_memory(a, b) for b, _ in live[i + 1:])
            assert heap_reuse.pooled_bytes() <= heap_reuse.HOLD * heap_reuse._peak_in_use
    finally:
        heap_reuse.pooling, heap_reuse.LARGE, heap_reuse._blocks, heap_reuse._peak_in_use = saved


def test_training_steps_give_the_same_bits_with_every_array_pooled(monkeypatch):
    """A fused model's steps with LARGE at 1 KiB (nearly every output and gradient of the fast paths pooled,
    reused step after step) give the same losses and weights as with the pool off."""
    import tinygrad_ssm as tg
    from tinygrad_ssm.fast import heap_reuse
    from tinygrad_ssm.optim import AdamW

    def train(pooled: bool):
        monkeypatch.setattr(heap_reuse, "_blocks", [])
        monkeypatch.setattr(heap_reuse, "_peak_in_use", 0)
        config = tg.Mamba2Config(d_model=32, n_layer=2, vocab_size=64, d_state=16, headdim=8, chunk_size=8)
        model = tg.Mamba2LMHeadModel(config, tg.VarMap(seed=3), fused=True)
        monkeypatch.setattr(heap_reuse, "pooling", pooled)
        monkeypatch.setattr(heap_reuse, "LARGE", 1024)
        opt = AdamW(model.varmap.all_vars(), lr=1e-2)
        data = np.random.default_rng(0).integers(0, 64, (4, 4, 33))
        losses = []
        for batch in data:
            opt.zero_grad()
            loss = model.loss(batch[:, :-1], batch[:, 1:])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [v.data.copy() for v in model.varmap.all_vars()], len(heap_reuse._blocks)

    plain_losses, plain_weights, _ = train(pooled=False)
    pooled_losses, pooled_weights, blocks = train(pooled=True)
    assert blocks > 0
    assert pooled_losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, pooled_weights))


def test_a_tied_embedding_s_two_pooled_gradients_are_summed_in_place(monkeypatch):
    """The head's and the lookup's gradients of a tied embedding both come from the pool; the backward walk
    (told by the pool which blocks are its own) sums one into the other and keeps it as .grad: no new array.
    Every gradient of the pooled size is a view of a block, never a copy of one."""
    import tinygrad_ssm as tg
    from tinygrad_ssm.fast import heap_reuse
    monkeypatch.setattr(heap_reuse, "_blocks", [])
    monkeypatch.setattr(heap_reuse, "_peak_in_use", 0)
    config = tg.Mamba2Config(d_model=32, n_layer=2, vocab_size=64, d_state=16, headdim=8, chunk_size=8)
    model = tg.Mamba2LMHeadModel(config, tg.VarMap(seed=3), fused=True)
    assert model.config.tie_embeddings
    monkeypatch.setattr(heap_reuse, "pooling", True)
    monkeypatch.setattr(heap_reuse, "LARGE", 1024)
    data = np.random.default_rng(0).integers(0, 64, (4, 33))
    model.loss(data[:, :-1], data[:, 1:]).backward()
    embedding = dict(model.varmap.named_vars())["backbone.embedding.weight"]
    assert embedding.grad.data.base is not None
    assert any(embedding.grad.data.base is block for block in heap_reuse._blocks)
