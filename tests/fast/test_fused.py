"""Fused ops (tinygrad_ssm/fast/fused.py) against their engine-op twins: values and every input's gradient
equal to 1e-10 in float64 on hypothesis-drawn shapes; gradchecks; float32 stays float32. The ops cut rows into
blocks shared by the threads: tests draw the block size down to one row, so blocks split sequences and
every thread gets some; inputs come contiguous, as views at a column offset, and in layouts that are copied."""
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

TOL = dict(rtol=1e-10, atol=1e-10)


def values_and_grads(fn, arrays, weight_seed=0):
    """fn(*tensors) and the gradient of sum(fn * w) for each input, float64."""
    tensors = [None if a is None else tg.Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    w = np.random.default_rng(weight_seed).standard_normal(out.shape)
    (out * tg.Tensor(w)).sum().backward()
    return out.data, [None if t is None else t.grad.data for t in tensors]


def layout(x: np.ndarray, how: str) -> np.ndarray:
    """The same values as x (b, l, c) in another memory layout: a column slice at an offset (a split's view) or
    of every other step, both read in place; every other column or a transpose, both copied by the ops."""
    if how == "offset view":
        wide = np.zeros(x.shape[:-1] + (x.shape[-1] + 3,))
        wide[..., 2:-1] = x
        return wide[..., 2:-1]
    if how == "every other column":
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],))
        wide[..., ::2] = x
        return wide[..., ::2]
    if how == "every other step":                             # rows evenly spaced, two base rows apart
        wide = np.zeros((x.shape[0], 2 * x.shape[1], x.shape[2] + 3))
        wide[:, ::2, 2:-1] = x
        return wide[:, ::2, 2:-1]
    if how == "transposed":
        return np.ascontiguousarray(np.swapaxes(x, 0, 1)).swapaxes(0, 1)
    return x


LAYOUTS = st.sampled_from(["contiguous", "offset view", "every other step", "every other column", "transposed"])


def assert_same(fast, slow, arrays):
    out_f, grads_f = values_and_grads(fast, arrays)
    out_s, grads_s = values_and_grads(slow, arrays)
    np.testing.assert_allclose(out_f, out_s, **TOL)
    for i, (gf, gs) in enumerate(zip(grads_f, grads_s)):
        if gs is not None:
            np.testing.assert_allclose(gf, gs, **TOL, err_msg=f"input {i}")


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
        shares = []
        start = time.perf_counter()
        row_blocks.on_threads(lambda blocks, share: shares.extend(share for _ in blocks), 20)
        assert shares == [0] * 20 and time.perf_counter() - start < 5
    finally:
        release.set()
        for f in held:
            f.result()


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
             (base.transpose(1, 0, 2)[..., :3], False), (base[:1, :1, 3:6], True)]
    for x, in_place in cases:
        rows, col = row_blocks.as_rows(x, np.float64)
        assert rows.flags.c_contiguous and np.shares_memory(rows, base) == in_place
        np.testing.assert_array_equal(rows[:, col:col + x.shape[-1]], x.reshape(-1, x.shape[-1]))
    rows, col = row_blocks.as_rows(base[..., 2:5], np.float32)   # another dtype: a converted copy
    assert rows.dtype == np.float32 and col == 0 and not np.shares_memory(rows, base)


# --- split ---------------------------------------------------------------------------------------------------

@given(lead=st.lists(st.integers(1, 3), max_size=2), sizes=st.lists(st.integers(0, 4), min_size=1, max_size=4),
       unused=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_split_last_equals_split(lead, sizes, unused, seed):
    x = np.random.default_rng(seed).standard_normal((*lead, sum(sizes)))
    keep = [i for i in range(len(sizes)) if i != unused % len(sizes)] or [0]   # one piece may not reach the loss

    def use(pieces):
        return F.cat([F.reshape(pieces[i], (-1,)) * (i + 1.0) for i in keep], axis=0)
    assert_same(lambda t: use(fused.split_last(t, sizes)), lambda t: use(F.split(t, sizes, axis=-1)), [x])


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
        (out_f, grads_f), (out_s, grads_s) = values_and_grads(fast, arrays), values_and_grads(slow, arrays)
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
    dt = r.uniform(-4, 4, (*lead, h))
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


# --- gated rms norm -------------------------------------------------------------------------------------------

@given(lead=st.lists(st.integers(1, 3), max_size=2), groups=st.integers(1, 3), group=st.integers(1, 5),
       gated=st.booleans(), blocks=BLOCKS, how=LAYOUTS, seed=st.integers(0, 2**16))
def test_gated_rms_norm_equals_reference(lead, groups, group, gated, blocks, how, seed):
    r = np.random.default_rng(seed)
    d = groups * group
    y, w = r.standard_normal((*lead, d)), r.standard_normal(d)
    z = r.standard_normal((*lead, d)) * 2 if gated else None
    if len(lead) == 2 and z is not None:
        z = layout(z, how)
    with block_bytes(blocks):
        assert_same(lambda yy, ww, zz=None: fused.gated_rms_norm(yy, zz, ww, group, 1e-5),
                    lambda yy, ww, zz=None: fused.reference_gated_rms_norm(yy, zz, ww, group, 1e-5), [y, w, z])


def test_gated_rms_norm_gradcheck():
    r = np.random.default_rng(3)
    assert gradcheck(lambda y, z, w: fused.gated_rms_norm(y, z, w, 3, 1e-5), r.standard_normal((2, 3, 6)),
                     r.standard_normal((2, 3, 6)), r.standard_normal(6))
    assert gradcheck(lambda y, w: fused.gated_rms_norm(y, None, w, 4, 1e-5), r.standard_normal((5, 4)),
                     r.standard_normal(4))


def test_gated_rms_norm_rejects_bad_shapes():
    with pytest.raises(ValueError, match="gated_rms_norm: .*group_size 4"):
        fused.gated_rms_norm(tg.Tensor(np.zeros((2, 6))), None, tg.Tensor(np.ones(6)), 4)


# --- residual add + rms norm -----------------------------------------------------------------------------------

def both_outputs(add_norm):
    """x, m, w -> 0.7 total + out: one tensor through which gradients reach both outputs of an add + norm."""
    def fn(x, m, w):
        total, out = add_norm(x, m, w)
        return total * 0.7 + out
    return fn


@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), d=st.integers(1, 9), return_total=st.booleans(),
       blocks=BLOCKS, how=LAYOUTS, seed=st.integers(0, 2**16))
def test_add_rms_norm_equals_reference(lead, d, return_total, blocks, how, seed):
    r = np.random.default_rng(seed)
    x, m, w = r.standard_normal((*lead, d)), r.standard_normal((*lead, d)) * 3, r.standard_normal(d)
    if len(lead) == 2:
        m = layout(m, how)
    with block_bytes(blocks):
        if return_total:
            assert_same(both_outputs(lambda xx, mm, ww: fused.add_rms_norm(xx, mm, ww, 1e-5)),
                        both_outputs(lambda xx, mm, ww: fused.reference_add_rms_norm(xx, mm, ww, 1e-5)), [x, m, w])
        else:
            assert_same(lambda xx, mm, ww: fused.add_rms_norm(xx, mm, ww, 1e-5, return_total=False),
                        lambda xx, mm, ww: fused.reference_add_rms_norm(xx, mm, ww, 1e-5, False), [x, m, w])


def test_add_rms_norm_gradcheck():
    r = np.random.default_rng(4)
    args = r.standard_normal((2, 3, 5)), r.standard_normal((2, 3, 5)), r.standard_normal(5)
    assert gradcheck(both_outputs(lambda x, m, w: fused.add_rms_norm(x, m, w, 1e-5)), *args)
    assert gradcheck(lambda x, m, w: fused.add_rms_norm(x, m, w, 1e-5, return_total=False), *args)


def test_add_rms_norm_rejects_bad_shapes():
    with pytest.raises(ValueError, match="add_rms_norm: .*m \\(2, 5\\)"):
        fused.add_rms_norm(tg.Tensor(np.zeros((2, 6))), tg.Tensor(np.zeros((2, 5))), tg.Tensor(np.ones(6)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_model_fused_residual_stream_is_the_blocks_one_by_one(dtype):
    """The fused model's forward (each residual add done with the next norm: AddRMSNorm) gives the same bits,
    logits and every parameter's gradient, as its blocks called one by one (x + mixer(norm(x)), then norm_f)."""
    config = tg.Mamba2Config(d_model=16, n_layer=3, vocab_size=40, d_state=4, headdim=4, chunk_size=4)
    model = tg.Mamba2LMHeadModel(config, tg.VarMap(seed=9), dtype=dtype)
    ids = np.random.default_rng(9).integers(0, 40, (2, 11))

    def one_by_one(ids):
        x = model.embedding(ids)
        for layer in model.layers:
            x = layer(x)
        return model._head(x)
    results = []
    for forward in (model, one_by_one):
        for t in model.varmap.all_vars():
            t.grad = None
        logits = forward(ids)
        F.cross_entropy(logits[:, :-1], ids[:, 1:]).backward()
        results.append((logits.data, {name: t.grad.data.copy() for name, t in model.varmap.named_vars()}))
    (fused_logits, fused_grads), (plain_logits, plain_grads) = results
    np.testing.assert_array_equal(fused_logits, plain_logits)
    for name in plain_grads:
        np.testing.assert_array_equal(fused_grads[name], plain_grads[name], err_msg=name)


# --- dtypes ---------------------------------------------------------------------------------------------------

def test_float32_in_float32_out_and_gradients():
    """No accidental float64 in a float32 model: outputs and gradients keep float32."""
    r = np.random.default_rng(4)
    f32 = lambda shape: tg.Tensor(r.standard_normal(shape).astype(np.float32), requires_grad=True)  # noqa: E731
    x, w, bias, z, nw, dt, dtb = f32((2, 5, 3)), f32((3, 1, 4)), f32(3), f32((2, 5, 3)), f32(3), f32((2, 5, 2)), f32(2)
    outs = [fused.conv1d_silu(x, w, bias), fused.gated_rms_norm(x, z, nw, 3), fused.dt_softplus(dt, dtb, 0.0, 3.0),
            *fused.split_last(x, [1, 2])]
    assert all(o.dtype == np.float32 for o in outs)
    sum(F.sum(o) for o in outs).backward()
    assert all(t.grad.dtype == np.float32 for t in (x, w, bias, z, nw, dt, dtb))


def test_float32_split_into_the_fused_ops_matches_float64():
    """The float32 mixer chain (split pieces read in place, gradients written into the split's array) keeps
    float32 and agrees with the same chain in float64 to float32 precision."""
    r = np.random.default_rng(6)
    arrays = [r.standard_normal((2, 6, 13)), r.standard_normal((2, 6, 4)), r.standard_normal((6, 1, 4)),
              r.standard_normal(6), r.standard_normal(4)]
    results = []
    for dtype in (np.float32, np.float64):
        p, y, cw, cb, nw = (tg.Tensor(a.astype(dtype), requires_grad=True) for a in arrays)
        z, xBC, dt = fused.split_last(p, [4, 6, 3])
        loss = (F.sum(fused.gated_rms_norm(y, z, nw, 2) * 1.5) + F.sum(fused.conv1d_silu(xBC, cw, cb) ** 2)
                + F.sum(dt * 3.0))
        loss.backward()
        results.append([p.grad.data, y.grad.data, cw.grad.data, cb.grad.data, nw.grad.data])
    for g32, g64 in zip(*results):
        assert g32.dtype == np.float32
        np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-4)


def _f32_gap(fast, exact, scale):
    """max |fast - exact| in float32 ulps of scale (the largest magnitude in play)."""
    return float(np.max(np.abs(fast.astype(np.float64) - exact))) / (np.finfo(np.float32).eps * scale)


def test_float32_sigmoid_is_within_two_float32_ulp_and_float64_keeps_its_own():
    from tests.support.numba_functions import elementwise
    from tinygrad_ssm.fast.fast_exp import exp as exp64, sigmoid

    sigmoid_all = elementwise(sigmoid)
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.uniform(-88, 88, 20000), rng.normal(0, 3, 20000), [0.0, -0.0, 1e-30]]).astype(np.float32)
    x64 = x.astype(np.float64)
    assert sigmoid_all(x).dtype == np.float32
    np.testing.assert_allclose(sigmoid_all(x), 1 / (1 + np.exp(-x64)), rtol=2 * np.finfo(np.float32).eps, atol=1e-37)
    ends = sigmoid_all(np.array([np.nan, np.inf, -np.inf, 100.0, -100.0], np.float32))
    assert math.isnan(ends[0]) and (ends[1:] == [1.0, 0.0, 1.0, 0.0]).all()
    np.testing.assert_array_equal(sigmoid_all(x64), 1 / (1 + np.vectorize(exp64)(-x64)))   # not exp32's values


def test_float32_kernels_are_within_a_few_ulp_of_float64():
    """The float32 kernels (exp32's sigmoid and silu, float32 sums) against the same ops in float64 on the same
    (float32) numbers: outputs within 4 float32 ulps of the largest output, gradients within 16 ulps of the
    largest gradient (the weight gradients sum ~50 rows; measured: 1 and 4). The float64 ops agree with their
    twins to 1e-12, so they do not take the float32 exp."""
    r = np.random.default_rng(13)
    x, cw, cb = r.standard_normal((2, 23, 6)) * 2, r.standard_normal((6, 1, 4)), r.standard_normal(6)
    y, z, nw = r.standard_normal((2, 23, 8)), r.standard_normal((2, 23, 8)) * 3, r.standard_normal(8)
    cases = [(fused.conv1d_silu, fused.reference_conv1d_silu, [x, cw, cb]),
             (lambda a, b_, w: fused.gated_rms_norm(a, b_, w, 4),
              lambda a, b_, w: fused.reference_gated_rms_norm(a, b_, w, 4), [y, z, nw]),
             (lambda a, w: fused.gated_rms_norm(a, None, w, 8),
              lambda a, w: fused.reference_gated_rms_norm(a, None, w, 8), [y, nw])]
    for fast, slow, arrays in cases:
        arrays = [a.astype(np.float32).astype(np.float64) for a in arrays]       # numbers float32 can hold
        with block_bytes(40):
            out32, grads32 = values_and_grads(fast, [a.astype(np.float32) for a in arrays])
            out64, grads64 = values_and_grads(fast, arrays)
        out_ref, grads_ref = values_and_grads(slow, arrays)
        np.testing.assert_allclose(out64, out_ref, rtol=1e-12, atol=1e-12)
        assert out32.dtype == np.float32 and _f32_gap(out32, out64, np.abs(out64).max()) <= 4
        for g32, g64, g_ref in zip(grads32, grads64, grads_ref):
            np.testing.assert_allclose(g64, g_ref, rtol=1e-12, atol=1e-12)
            assert g32.dtype == np.float32 and _f32_gap(g32, g64, np.abs(g64).max()) <= 16


# --- the model's switch ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("ngroups,dt_limit,with_cache", [(1, (0.0, math.inf), False), (2, (0.02, 0.4), True)])
def test_model_fused_and_reference_paths_agree(ngroups, dt_limit, with_cache):
    """fused=True and fused=False on one VarMap: the same logits, loss and gradient of every parameter."""
    config = tg.Mamba2Config(d_model=16, n_layer=2, vocab_size=40, d_state=4, headdim=4, chunk_size=4,
                             ngroups=ngroups, dt_limit=dt_limit, bias=with_cache, conv_bias=True)
    varmap = tg.VarMap(seed=7)
    models = [tg.Mamba2LMHeadModel(config, varmap, dtype="float64", fused=f) for f in (True, False)]
    assert [m.fused for m in models] == [True, False]
    ids = np.random.default_rng(7).integers(0, 40, (2, 9))
    results = []
    for model in models:
        for t in varmap.all_vars():
            t.grad = None
        cache = model.allocate_cache(2) if with_cache else None
        logits = model(ids, cache)
        F.cross_entropy(logits[:, :-1], ids[:, 1:]).backward()
        results.append((logits.data, {name: t.grad.data.copy() for name, t in varmap._vars.items()},
                        None if cache is None else [s.ssm.data for s in cache.layers]))
    (lf, gf, sf), (ls, gs, ss) = results
    np.testing.assert_allclose(lf, ls, **TOL)
    assert gf.keys() == gs.keys()
    for name in gf:
        np.testing.assert_allclose(gf[name], gs[name], **TOL, err_msg=name)
    if with_cache:
        for a, b in zip(sf, ss):
            np.testing.assert_allclose(a, b, **TOL)


def test_model_rejects_a_non_bool_fused():
    with pytest.raises(TypeError, match="fused must be True or False"):
        tg.Mamba2LMHeadModel(tg.Mamba2Config(d_model=8, n_layer=1, vocab_size=10, d_state=4, headdim=4), fused="yes")


def test_an_input_changed_in_place_before_backward_is_caught():
    """The fused ops save their inputs as given (views included), so the version counter still guards them."""
    r = np.random.default_rng(5)
    for make in (lambda t: fused.conv1d_silu(t[:, :, :3], tg.Tensor(r.standard_normal((3, 1, 2)))),
                 lambda t: fused.gated_rms_norm(t[:, :, :3], t[:, :, 1:], tg.Tensor(np.ones(3)), 3)):
        base = tg.Tensor(r.standard_normal((2, 4, 4)), requires_grad=True)
        view = base * 1.0
        out = make(view)
        with tg.no_grad():
            view.mul_(0.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            F.sum(out).backward()
