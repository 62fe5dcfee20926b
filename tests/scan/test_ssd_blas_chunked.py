"""The "blas" backend's own machinery (scan/blas_chunked.py): its chunking at the edges (chunk 1, chunk >= l,
q not dividing l, tails), several heads per group summed before the matmuls, the blocked segment sums of long
chunks, slabs and threads (bit-identical to one thread), the chunk states it saves, float32 against float64.
The registry-wide tests of tests/test_ssd_kernels.py run it against the reference as well."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tests.support.gradcheck import gradcheck
from tests.scan.test_ssd import make_inputs, numpy_scan
from tests.scan.test_ssd_kernels import differences
from tinygrad_ssm.scan import blas_chunked, ssd

NAMES = ["x", "dt", "A", "B", "C", "D", "initial_state"]


def assert_equals_reference(inputs, chunk_size, seed=0, tolerance=1e-10):
    for name, (diff, scale) in differences(inputs, chunk_size, "blas", seed=seed).items():
        assert diff < tolerance * max(1.0, scale), (name, diff, scale)


@pytest.mark.parametrize("l, chunk_size", [(1, 1), (1, 8), (5, 1), (7, 7), (7, 100), (13, 4), (17, 16), (24, 8),
                                           (25, 8), (31, 10)],
                         ids=lambda v: str(v))
def test_chunk_edges_equal_the_reference(l, chunk_size):
    """chunk 1 (every step a chunk), chunk >= l (one chunk), q dividing l, and q not dividing l (a padded tail: 13 in
    chunks of 4 -> 4 chunks of 4, 3 padded steps; 31 in chunks of 10 -> 4 chunks of 8, 1 padded)."""
    inputs = make_inputs(np.random.default_rng(l * 100 + chunk_size), b=2, l=l, h=6, p=3, g=2, n=4)
    assert_equals_reference(inputs, chunk_size)


@pytest.mark.parametrize("g, r", [(1, 1), (1, 4), (2, 3), (3, 1)])
def test_heads_of_a_group_summed_before_the_matmuls(g, r):
    """dB and dC sum the r heads of a group in the (q, q) matrix W and in the (q, r p) side-by-side matrices: any r,
    g = 1 (the model's) and g > 1."""
    inputs = make_inputs(np.random.default_rng(10 * g + r), b=2, l=19, h=g * r, p=2, g=g, n=3)
    assert_equals_reference(inputs, 8)


def test_blocked_segment_sums_equal_the_plain_sums():
    """seg[t, s] = a_{s+1} + ... + a_t below the diagonal, from blocks of ~sqrt(q) steps (q a square, not a square,
    not a multiple of the block), against the sums written out; the exp is finite everywhere."""
    rng = np.random.default_rng(3)
    for q in (1, 2, 3, 5, 8, 9, 10, 17, 30, 64, 65):
        a = -rng.uniform(0.0, 3.0, (2, 3, q))
        seg = blas_chunked._segsum_blocked(a)
        plain = np.zeros((2, 3, q, q))
        for t in range(q):
            for s in range(t + 1):
                plain[..., t, s] = a[..., s + 1:t + 1].sum(-1)
        below = np.tri(q, q, 0, dtype=bool)
        assert np.abs(seg - plain)[..., below].max(initial=0) < 1e-13, q
        assert np.isfinite(np.exp(seg)).all()


@pytest.mark.parametrize("l, chunk_size", [(23, 8), (40, 17)])
def test_long_chunks_through_the_blocked_segment_sums(monkeypatch, l, chunk_size):
    """Forward and gradients with the blocked segment sums (the path of chunks longer than SEGSUM_MATMUL_MAX_Q)."""
    monkeypatch.setattr(blas_chunked, "SEGSUM_MATMUL_MAX_Q", 0)
    inputs = make_inputs(np.random.default_rng(l), b=2, l=l, h=4, p=3, g=2, n=4)
    assert_equals_reference(inputs, chunk_size)


@given(b=st.integers(1, 3), chunks=st.integers(1, 5), q=st.integers(1, 6), r=st.integers(1, 3),
       slab=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_slabs_and_threads_are_bit_identical_to_one_thread(b, chunks, q, r, slab, seed):
    """The chunks cut into slabs of `slab` chunks, taken by 2 threads, give the same bits as one thread, and equal
    the reference."""
    import tinygrad_ssm.scan.blas_chunked as bc
    l = chunks * q
    inputs = make_inputs(np.random.default_rng(seed), b=b, l=l, h=2 * r, p=2, g=2, n=3)
    arrays = [inputs[k] for k in NAMES]
    rng = np.random.default_rng(seed + 1)
    dy, d_final = rng.standard_normal(inputs["x"].shape), rng.standard_normal(inputs["initial_state"].shape)
    saved_settings = bc.SLAB_ELEMENTS, bc.THREADS, bc.PARALLEL_MIN_WORK
    try:
        bc.SLAB_ELEMENTS, bc.PARALLEL_MIN_WORK = slab * 2 * r * q * q, 0
        results = []
        for threads in (1, 2):
            bc.THREADS = threads
            y, state, saved = bc.forward(*arrays, q)
            results.append([y, state, *bc.backward(saved, dy, d_final)])
    finally:
        bc.SLAB_ELEMENTS, bc.THREADS, bc.PARALLEL_MIN_WORK = saved_settings
    for one, two in zip(*results):
        assert np.array_equal(one, two)
    assert_equals_reference(inputs, q, seed=seed)


def test_saved_chunk_states_are_the_scan_states_at_chunk_starts():
    """What the forward keeps: the state entering chunk z is the recurrence's state after z q steps."""
    inputs = make_inputs(np.random.default_rng(5), b=2, l=21, h=6, p=3, g=2, n=4)
    y, state, saved = blas_chunked.forward(*[inputs[k] for k in NAMES], 8)     # 3 chunks of 7
    S_in = saved[6]                                                     # (b, c, g, n, r p)
    assert S_in.shape == (2, 3, 2, 4, 3 * 3)
    for z in range(3):
        part = {k: (v[:, :7 * z] if k in ("x", "dt", "B", "C") else v) for k, v in inputs.items()}
        expected = inputs["initial_state"] if z == 0 else numpy_scan(**part)[1]          # (b, h, p, n)
        assert np.abs(blas_chunked._states_as_heads(S_in[:, z], 3) - expected).max() < 1e-12, z


def test_float32_training_like_shape_close_to_float64():
    """Float32 in, float32 out, within float32 rounding of the float64 reference at a chunk of 64 (the training
    step's) over a padded tail; the tolerance is the registry test's 4 eps sqrt(l n p) relative."""
    inputs = make_inputs(np.random.default_rng(6), b=2, l=150, h=4, p=8, g=1, n=8, initial_state=True)
    inputs["dt"] = np.random.default_rng(7).uniform(0.001, 0.2, inputs["dt"].shape)
    tolerance = 4 * np.finfo(np.float32).eps * np.sqrt(150 * 8 * 8)
    for name, (diff, scale) in differences(inputs, 64, "blas", dtype=np.float32).items():
        assert diff <= tolerance * scale, (name, diff / scale, tolerance)


def test_gradcheck_heads_sharing_a_group_across_a_tail():
    """Central finite differences of the op: g = 1 with r = 3 heads, l = 8 in chunks of 3 (one padded step)."""
    inputs = make_inputs(np.random.default_rng(8), b=1, l=8, h=3, p=2, g=1, n=2, initial_state=True)

    def both_outputs(*tensors):
        y, state = ssd(**dict(zip(NAMES, tensors)), chunk_size=3, backend="blas")
        return tg.cat([tg.functional.flatten(y), tg.functional.flatten(state)])

    assert gradcheck(both_outputs, *inputs.values())


@pytest.mark.parametrize("threads", [1, 2])
def test_openblas_thread_setting_is_restored(monkeypatch, threads):
    """The slabs run on one OpenBLAS thread each; the caller's own OpenBLAS setting is what it was afterwards."""
    setter = blas_chunked._set_blas_threads
    if setter is None:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS with openblas_set_num_threads_local")
    monkeypatch.setattr(blas_chunked, "THREADS", threads)
    monkeypatch.setattr(blas_chunked, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(blas_chunked, "SLAB_ELEMENTS", 1)
    inputs = make_inputs(np.random.default_rng(9), b=2, l=12, h=2, p=2, g=1, n=3)
    before = setter(3)
    try:
        y, state, saved = blas_chunked.forward(*[inputs[k] for k in NAMES], 4)
        blas_chunked.backward(saved, np.ones_like(y), np.ones_like(state))
    finally:
        during = setter(before)
    assert during == 3


def test_a_slab_error_reaches_the_caller():
    """An exception inside a slab taken by a worker thread is raised in the caller, not lost."""
    def work(k0, k1):
        if k0 == 2:
            raise ValueError("slab 2")
    with pytest.raises(ValueError, match="slab 2"):
        blas_chunked._run_slabs(work, chunks=4, per_chunk=blas_chunked.SLAB_ELEMENTS, threads=2)


def test_slabs_run_with_openblas_on_one_thread():
    """While the slabs run (on the caller's thread or the workers), OpenBLAS is set to one thread; after, to what
    the caller had."""
    setter = blas_chunked._set_blas_threads
    if setter is None:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS with openblas_set_num_threads_local")
    seen = []
    before = setter(4)
    try:
        for threads in (1, 2):
            blas_chunked._run_slabs(lambda k0, k1: seen.append(setter(1)), chunks=4,
                                    per_chunk=blas_chunked.SLAB_ELEMENTS, threads=threads)
    finally:
        after = setter(before)
    assert seen == [1] * 8 and after == 4
