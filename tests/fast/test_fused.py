"""Fused ops (tinygrad_ssm/fast/fused.py) against their engine-op twins: values and every input's gradient
equal to 1e-10 in float64 on hypothesis-drawn shapes; gradchecks; float32 stays float32. The ops cut rows into
blocks shared by the threads: tests draw the block size down to one row, so blocks split sequences and
every thread gets some; inputs come contiguous, as views at a column offset, and in layouts that are copied."""
import itertools
import math
import threading
import time

import numpy as np
import pytest
from tests.support.gradcheck import gradcheck
from tests.support.row_blocks import BLOCKS, block_bytes
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tinygrad_ssm.autograd import functional as F
from tinygrad_ssm.fast import fused, row_blocks
from tests.support.fused_checks import (LAYOUTS, TOL, assert_same, fused_values_and_grads, layout,
                                        values_and_grads)


# --- the threads ---------------------------------------------------------------------------------------------

def test_every_block_runs_once_and_a_helper_error_reaches_the_caller():
    import numba
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    seen = []

    def work(blocks, share):
        for blk in blocks:
            seen.append((blk, share))
    row_blocks.on_threads(work, 50)
    assert sorted(b for b, _ in seen) == list(range(50))

    def fail(blocks, share):
        for _ in blocks:
            if share > 0:
                raise ValueError("from a helper")
            time.sleep(0.001)                       # leave blocks for the helper
    if numba.get_num_threads() > 1:
        with pytest.raises(ValueError, match="from a helper"):
            row_blocks.on_threads(fail, 200)


def test_an_op_at_interpreter_shutdown_does_every_block_on_the_callers_thread(monkeypatch):
    """A fused op in a non-daemon thread after the main thread returned, or in an atexit handler: the pool (a
    ThreadPoolExecutor) takes no new work then and raised "cannot schedule new futures after interpreter
    shutdown" (found by an audit); the caller's thread does every block."""
    import os

    class ShutDown:
        def submit(self, *args, **kwargs):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
    monkeypatch.setattr(row_blocks, "_pool", ShutDown())
    monkeypatch.setattr(row_blocks, "_pool_pid", os.getpid())
    seen = []
    row_blocks.on_threads(lambda blocks, share: seen.extend((b, share) for b in blocks), 10, threads=2)
    assert sorted(seen) == [(b, 0) for b in range(10)]


def test_the_caller_does_not_wait_for_a_helper_that_never_starts():
    """With every pool thread held up elsewhere, the op runs all blocks on the caller's thread and returns."""
    import numba
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    row_blocks.on_threads(lambda blocks, share: None, 4)               # the pool exists
    if row_blocks._pool is None:
        pytest.skip("one thread: no pool")
    release = threading.Event()
    held = [row_blocks._pool.submit(release.wait, 30) for _ in range(row_blocks._pool._max_workers)]
    try:
        calls, shares = [], []

        def work(blocks, share):
            calls.append(share)
            shares.extend(share for _ in blocks)
        start = time.perf_counter()
        row_blocks.on_threads(work, 20)
        assert shares == [0] * 20 and time.perf_counter() - start < 5
    finally:
        release.set()
        for f in held:
            f.result()
    # the helpers queued behind the held threads start now, after the op returned: they must not run its work
    # (each pool thread in a barrier at once: every task queued before has ended)
    barrier = threading.Barrier(row_blocks._pool._max_workers)
    for f in [row_blocks._pool.submit(barrier.wait, 10) for _ in range(row_blocks._pool._max_workers)]:
        f.result()
    assert calls == [0]


def test_gradients_are_the_same_bits_whatever_the_threads():
    """Training resumes bit-identically only if a step's gradients do not depend on which thread summed
    which block: the weight gradients are summed per block, in a fixed order."""
    import numba
    r = np.random.default_rng(10)
    arrays = [r.standard_normal((4, 16, 9)).astype(np.float32), r.standard_normal((4, 16, 5)).astype(np.float32),
              r.standard_normal((5, 1, 4)).astype(np.float32), r.standard_normal(5).astype(np.float32),
              r.standard_normal(4).astype(np.float32)]

    def grads():
        p, y, cw, cb, nw = (tg.Tensor(a, requires_grad=True) for a in arrays)
        z, xBC = fused.split_last(p, [4, 5])
        loss = F.sum(fused.conv1d_silu(xBC, cw, cb) * 3.0) + F.sum(fused.gated_rms_norm(y[..., :4], z, nw, 2) ** 2)
        loss.backward()
        return [t.grad.data for t in (p, y, cw, cb, nw)]
    before = numba.get_num_threads()
    try:
        with block_bytes(1):
            results = []
            for threads in (1, numba.config.NUMBA_NUM_THREADS, 1, numba.config.NUMBA_NUM_THREADS):
                numba.set_num_threads(threads)
                results.append(grads())
    finally:
        numba.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_as_rows_reads_a_split_view_in_place_and_copies_other_layouts():
    base = np.arange(2 * 4 * 7.0).reshape(2, 4, 7)
    cases = [(base, True), (base[..., 2:5], True), (base[:, ::2, 1:4], True), (base[..., ::2], False),
             (base.transpose(1, 0, 2)[..., :3], False), (base[:1, :1, 3:6], True), (base[..., 4:7], True)]
    for x, in_place in cases:
        rows, col = row_blocks.as_rows(x, np.float64)
        assert rows.flags.c_contiguous and np.shares_memory(rows, base) == in_place
        np.testing.assert_array_equal(rows[:, col:col + x.shape[-1]], x.reshape(-1, x.shape[-1]))
    rows, col = row_blocks.as_rows(base[..., 2:5], np.float32)   # another dtype: a converted copy
    assert rows.dtype == np.float32 and col == 0 and not np.shares_memory(rows, base)


def test_as_rows_of_every_small_strided_view_hold_its_rows():
    """A view whose rows start mid-way through its base's rows (t[5:33].reshape(4, 7)[:, :6]: base rows of 7, the
    view's from column 5, 6 long) was read in place as rows of 7 from column 5, the kernels' row slices cut short:
    the fused gated norm gave values off by 2.5, no error. Such a view is copied. Every case up to 8 columns."""
    for offset, width, n in itertools.product(range(9), range(1, 9), (2, 3)):
        flat = np.arange(offset + n * width + 3.0)
        for c in range(1, width + 1):
            x = flat[offset:offset + n * width].reshape(n, width)[:, :c]
            rows, col = row_blocks.as_rows(x, np.float64)
            assert col + c <= rows.shape[1] and rows.flags.c_contiguous, (offset, width, n, c)
            np.testing.assert_array_equal(rows[:, col:col + c], x)


def test_the_fused_gated_norm_of_a_view_across_its_bases_rows_equals_the_engines():
    from tinygrad_ssm import nn
    from tinygrad_ssm.registry import VarBuilder, VarMap
    rng = np.random.default_rng(0)
    base, z0, weights = rng.standard_normal(40), rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    vb = VarBuilder.from_varmap(VarMap(seed=0), dtype="float64")
    norms = [nn.GatedRMSNorm(vb.pp(name), 6, group_size=2, fused=fused) for name, fused in (("f", True), ("p", False))]
    results = []
    for norm in norms:                                                  # the values, and the gradients through the view
        x, z = tg.Tensor(base, requires_grad=True), tg.Tensor(z0, requires_grad=True)
        out = norm(F.reshape(x[5:33], (4, 7))[:, :6], z)                # (4, 6): rows 7 apart in x
        (out * tg.Tensor(weights)).sum().backward()
        results.append((out.data, x.grad, z.grad))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# --- split ---------------------------------------------------------------------------------------------------

@given(lead=st.lists(st.integers(1, 3), max_size=2), sizes=st.lists(st.integers(0, 4), min_size=1, max_size=4),
       unused=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_split_last_equals_split(lead, sizes, unused, seed):
    x = np.random.default_rng(seed).standard_normal((*lead, sum(sizes)))
    keep = [i for i in range(len(sizes)) if i != unused % len(sizes)] or [0]   # one piece may not reach the loss

    def use(pieces):
        return F.cat([F.reshape(pieces[i], (-1,)) * (i + 1.0) for i in keep], axis=0)
    assert_same(lambda t: use(fused.split_last(t, sizes)), lambda t: use(F.split(t, sizes, axis=-1)), [x])


@pytest.mark.parametrize("split", ["fused", "engine"])
def test_every_piece_of_a_split_shares_its_bases_version_as_torch(split):
    """Only the first piece of split_last shared its input's version counter: the scan's B and C (pieces 1 and 2
    of the mixer's split) changed through the input in place after the forward gave a gradient of the changed
    values, no error (dx off by 7.5 through the reference scan); torch raises "Output 2 of SplitWithSizes is a
    view and its base ... has been modified inplace", and so does F.split."""
    rng = np.random.default_rng(0)
    for piece in range(3):
        x = tg.Tensor(rng.standard_normal((2, 6)), requires_grad=True)
        pieces = fused.split_last(x, [1, 2, 3]) if split == "fused" else F.split(x, [1, 2, 3], axis=-1)
        loss = (pieces[piece] * pieces[piece]).sum()                    # Mul saves the piece
        with tg.no_grad():
            x.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
        assert pieces[piece]._version is x._version


def test_split_last_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"sizes \(2, 2\) don't add up to the last axis of \(3, 5\)"):
        fused.split_last(tg.Tensor(np.zeros((3, 5))), [2, 2])


@given(b=st.integers(1, 3), l=st.integers(1, 7), d=st.integers(1, 6), groups=st.integers(1, 2),
       conv=st.integers(1, 5), h=st.integers(1, 3), k=st.integers(1, 4), with_bias=st.booleans(),
       z_twice=st.booleans(), blocks=BLOCKS, seed=st.integers(0, 2**16))
def test_split_into_the_fused_ops_equals_reference(b, l, d, groups, conv, h, k, with_bias, z_twice, blocks, seed):
    """The mixer's chain: in_proj's output split into z, xBC, dt; z gates the norm (and, if z_twice, is used a
    second time: that user keeps its own gradient and the split sums), xBC goes through conv + silu, dt through
    softplus. The fused ops write their input gradients into the split's one gradient array."""
    r = np.random.default_rng(seed)
    d *= groups
    proj, y, nw = r.standard_normal((b, l, d + conv + h)), r.standard_normal((b, l, d)), r.standard_normal(d)
    cw, dtb = r.standard_normal((conv, 1, k)), r.standard_normal(h)
    cb = r.standard_normal(conv) if with_bias else None

    def chain(split, conv1d_silu, norm, softplus):
        def fn(p, yy, nww, cww, dtbb, cbb=None):
            z, xBC, dt = split(p)
            out = norm(yy, z, nww)
            if z_twice:
                out = out * F.exp(z)
            return F.cat([F.reshape(out, (-1,)), F.reshape(conv1d_silu(xBC, cww, cbb), (-1,)),
                          F.reshape(softplus(dt, dtbb), (-1,))], axis=0)
        return fn
    sizes = [d, conv, h]
    fast = chain(lambda p: fused.split_last(p, sizes), fused.conv1d_silu,
                 lambda yy, z, w: fused.gated_rms_norm(yy, z, w, d // groups), fused.dt_softplus)
    slow = chain(lambda p: F.split(p, sizes, axis=-1), fused.reference_conv1d_silu,
                 lambda yy, z, w: fused.reference_gated_rms_norm(yy, z, w, d // groups), fused.reference_dt_softplus)
    with block_bytes(blocks):
        assert_same(fast, slow, [proj, y, nw, cw, dtb, cb])


def test_split_lends_each_gradient_slot_once_and_a_second_backward_gets_a_new_one():
    """retain_graph: the second backward gets the same gradients again (a slot lent the first time is not
    written again), and gradient_slot lends a piece's slot only once per backward."""
    r = np.random.default_rng(8)
    p = tg.Tensor(r.standard_normal((2, 5, 7)), requires_grad=True)
    cw = tg.Tensor(r.standard_normal((4, 1, 3)), requires_grad=True)
    z, xBC = fused.split_last(p, [3, 4])
    loss = F.sum(fused.conv1d_silu(xBC, cw) * 2.0) + F.sum(fused.gated_rms_norm(z, z, tg.Tensor(np.ones(3)), 3))
    loss.backward(retain_graph=True)
    first = p.grad.data.copy()
    loss.backward()
    np.testing.assert_allclose(p.grad.data, 2 * first, rtol=1e-12)
    split = xBC._ctx
    assert split.gradient_slot(xBC, np.float64) is not None
    assert split.gradient_slot(xBC, np.float64) is None                          # lent already
    assert split.gradient_slot(z, np.float32) is None                            # not the piece's dtype


# --- conv1d + silu ---------------------------------------------------------------------------------------------

@given(b=st.integers(1, 3), l=st.integers(1, 9), c=st.integers(1, 5), k=st.integers(1, 5), with_bias=st.booleans(),
       strided=st.booleans(), blocks=BLOCKS, how=LAYOUTS, seed=st.integers(0, 2**16))
def test_conv1d_silu_equals_reference(b, l, c, k, with_bias, strided, blocks, how, seed):
    r = np.random.default_rng(seed)
    x = layout(r.standard_normal((b, l, c + 2)), how)            # a strided view when `strided`, as after a split
    w, bias = r.standard_normal((c, 1, k)), (r.standard_normal(c) if with_bias else None)

    def run(op):
        def fn(xx, ww, bb=None):
            xx = xx[:, :, 1:c + 1] if strided else xx[:, :, :c]
            return op(xx, ww, bb)
        return fn
    with block_bytes(blocks):
        assert_same(run(fused.conv1d_silu), run(fused.reference_conv1d_silu), [x, w, bias])


@given(b=st.integers(1, 3), l=st.integers(1, 9), c=st.integers(1, 5), k=st.integers(1, 5), with_bias=st.booleans(),
       blocks=BLOCKS, how=LAYOUTS, seed=st.integers(0, 2**16))
def test_conv1d_silu_with_history_equals_reference(b, l, c, k, with_bias, blocks, how, seed):
    """A sequence continued from a cache: the conv reads the k - 1 inputs before x where it would read zeros. With a
    graph (gradients of x, the weights and the history), the conv of cat(history, x); without one, the conv of x
    with its first k - 1 steps done again from a window (l < k - 1 too): both equal to the reference."""
    r = np.random.default_rng(seed)
    x = layout(r.standard_normal((b, l, c)), how)
    history = r.standard_normal((b, k - 1, c))
    w, bias = r.standard_normal((c, 1, k)), (r.standard_normal(c) if with_bias else None)
    with block_bytes(blocks):
        assert_same(fused.conv1d_silu, fused.reference_conv1d_silu, [x, w, bias, history])
        with tg.no_grad():
            args = [tg.Tensor(a) if a is not None else None for a in (x, w, bias, history)]
            fast, slow = fused.conv1d_silu(*args).data, fused.reference_conv1d_silu(*args).data
    np.testing.assert_allclose(fast, slow, **TOL)


def test_conv1d_silu_rejects_a_history_of_the_wrong_shape():
    x, w = tg.Tensor(np.ones((2, 5, 3))), tg.Tensor(np.ones((3, 1, 4)))
    with pytest.raises(ValueError, match=r"history must be \(b, k - 1, c\) = \(2, 3, 3\)"):
        fused.conv1d_silu(x, w, None, tg.Tensor(np.ones((2, 4, 3))))
    for is_fused in (True, False):  # the layer's engine path cut a shorter output instead
        conv = tg.nn.CausalDepthwiseConv1d(tg.VarBuilder(tg.VarMap(seed=0)), 3, 4, fused=is_fused)
        with pytest.raises(ValueError, match=r"history must be \(b, k - 1, c\) = \(2, 3, 3\), got \(2, 2, 3\)"):
            conv.silu_of(x, tg.Tensor(np.ones((2, 2, 3))))


@pytest.mark.parametrize("blocks", [1, 40 * 8, 64 * 1024])
def test_conv1d_silu_width_4_loops_equal_reference(blocks):
    """Width 4 runs its own loops from step 3 on (backward: up to step l - 4); blocks of 1 step, 5 steps (a block
    boundary inside the k - 1 steps a block reads past its end) and all: every step of every path."""
    r = np.random.default_rng(11)
    x = layout(r.standard_normal((2, 13, 7)), "offset view")
    w, bias = r.standard_normal((5, 1, 4)), r.standard_normal(5)
    run = lambda op: lambda xx, ww, bb: op(xx[:, :, 1:6], ww, bb)  # noqa: E731
    with block_bytes(blocks):
        assert_same(run(fused.conv1d_silu), run(fused.reference_conv1d_silu), [x, w, bias])


@pytest.mark.parametrize("dtype,big", [(np.float64, 800.0), (np.float32, 100.0)])
def test_saturated_sigmoids_equal_reference(dtype, big):
    """Pre-activations and gates far past exp's overflow (exp = inf: sigmoid 1) or underflow (sigmoid 0) give
    the reference's values and gradients, with no NaN."""
    r = np.random.default_rng(9)
    x = (r.choice([-big, big], (2, 5, 3)) + r.standard_normal((2, 5, 3))).astype(dtype)
    z = (r.choice([-big, big], (2, 5, 3)) + r.standard_normal((2, 5, 3))).astype(dtype)
    w, y = np.ones((3, 1, 1), dtype), r.standard_normal((2, 5, 3)).astype(dtype)
    for fast, slow, arrays in ((lambda a, b_: fused.conv1d_silu(a, b_), fused.reference_conv1d_silu, [x, w]),
                               (lambda a, b_: fused.gated_rms_norm(a, b_, tg.Tensor(np.ones(3, dtype)), 3),
                                lambda a, b_: fused.reference_gated_rms_norm(a, b_, tg.Tensor(np.ones(3, dtype)), 3),
                                [y, z])):
        (out_f, grads_f), (out_s, grads_s) = fused_values_and_grads(fast, arrays), values_and_grads(slow, arrays)
        tol = TOL if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
        assert np.isfinite(out_f).all() and all(np.isfinite(g).all() for g in grads_f)
        np.testing.assert_allclose(out_f, out_s, **tol)
        for gf, gs in zip(grads_f, grads_s):
            np.testing.assert_allclose(gf, gs, **tol)


def test_conv1d_silu_gradcheck():
    r = np.random.default_rng(1)
    assert gradcheck(fused.conv1d_silu, r.standard_normal((2, 6, 3)), r.standard_normal((3, 1, 4)),
                     r.standard_normal(3))


# --- dt softplus ----------------------------------------------------------------------------------------------

@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=2), h=st.integers(1, 4),
       limit=st.sampled_from([(0.0, math.inf), (0.2, 1.5), (0.0, 0.8)]), seed=st.integers(0, 2**16))
def test_dt_softplus_equals_reference(lead, h, limit, seed):
    r = np.random.default_rng(seed)
    dt = r.uniform(-25, 25, (*lead, h))                         # softplus' whole range: (-4, 4) left out (5, 20)
    dt[..., 0] = 21.0 + r.random(lead)                          # past softplus' threshold: the identity
    bias = r.uniform(-1, 1, h)
    soft = np.logaddexp(0, dt + bias)
    # away from the clip's kinks: exactly on one, either subgradient is right and the two ops may differ
    dt = np.where(np.isclose(soft, limit[0], atol=1e-3) | np.isclose(soft, limit[1], atol=1e-3), dt + 0.01, dt)
    assert_same(lambda a, b_: fused.dt_softplus(a, b_, *limit),
                lambda a, b_: fused.reference_dt_softplus(a, b_, *limit),
                [dt, bias])


def test_dt_softplus_gradcheck():
    r = np.random.default_rng(2)
    assert gradcheck(lambda a, b_: fused.dt_softplus(a, b_, 0.1, 2.0), r.uniform(-2, 2, (3, 4)), r.uniform(-1, 1, 4))
    assert gradcheck(lambda a, b_: fused.dt_softplus(a, b_), r.uniform(-8, 18, (3, 4)), r.uniform(-1, 1, 4))  # unclipped


def test_the_callers_errstate_holds_on_the_helper_threads():
    """np.errstate is per thread: the CLI's errstate (NumPy's overflow warnings off: it says a NaN in one line)
    missed the blocks the pool's threads computed, and their warnings came out before the error line."""
    from tinygrad_ssm.fast.row_blocks import on_threads
    seen = {}

    def work(blocks, share):
        for _ in blocks:
            seen.setdefault(share, np.geterr()["over"])
            time.sleep(0.01)                                            # every thread takes blocks
    with np.errstate(over="ignore"):
        on_threads(work, 8, threads=2)
    assert seen == {0: "ignore", 1: "ignore"}, seen
    assert np.geterr()["over"] != "ignore"                              # the caller's own state back as it was
