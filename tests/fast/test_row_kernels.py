"""fast/row_ops.py's ops (on fast/row_kernels.py's kernels) against their engine twins, the NumPy reference:
cross entropy's losses and gradients equal to 1e-10 in float64 on hypothesis-drawn shapes (rows cut into blocks
down to one row, so every thread gets some), rows that are not finite handled by the reference, a retained
graph's second backward, gradchecks; the embedding's gradient the same bits as np.add.at."""
import numpy as np
import pytest
from tests.support.gradcheck import gradcheck
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp
from tests.support.row_blocks import block_bytes

import tinygrad_ssm as tg
from tinygrad_ssm.autograd import functional as F
from tinygrad_ssm.autograd.ops import nn as N, reduce as R
from tinygrad_ssm.fast import row_kernels, row_ops

TOL = dict(rtol=1e-10, atol=1e-10)


def cross_entropy_and_grad(logits, targets, reduction, weight, kernels: bool, ignore_index=-100):
    """(loss, d loss.w / d logits, whether the kernels ran): row_ops.cross_entropy with kernels, else the engine's
    F.cross_entropy (the reference)."""
    cross_entropy = row_ops.cross_entropy if kernels else F.cross_entropy
    x = tg.Tensor(logits.copy(), requires_grad=True)
    loss = cross_entropy(x, targets, ignore_index=ignore_index, reduction=reduction)
    op = [ctx for ctx in _ops(loss) if isinstance(ctx, R.CrossEntropy)][0]
    assert isinstance(op, row_ops.FusedCrossEntropy) == kernels
    ran = kernels and op.by_kernels
    (loss * tg.Tensor(np.asarray(weight, logits.dtype))).sum().backward()
    return loss.data, x.grad.data, ran


def _ops(t):
    """The ops of t's graph (cross entropy sits under a reshape for reduction='none')."""
    seen, stack = [], [t._ctx]
    while stack:
        ctx = stack.pop()
        if ctx is not None:
            seen.append(ctx)
            stack += [i._ctx for i in ctx.inputs if isinstance(i, tg.Tensor)]
    return seen


@st.composite
def cross_entropy_cases(draw):
    """logits (N, C) (C up to 40: rows shorter and longer than the max's 16 lanes), targets with some ignored,
    a reduction, an output gradient (1 or not), and a block size down to one row."""
    n, c = draw(st.integers(1, 12), label="N"), draw(st.integers(1, 40), label="C")
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16), label="seed"))
    logits = rng.standard_normal((n, c)) * draw(st.sampled_from([0.1, 3.0, 30.0]), label="spread")
    targets = rng.integers(0, c, n)
    targets[rng.random(n) < draw(st.sampled_from([0.0, 0.3]), label="ignored share")] = -100
    reduction = draw(st.sampled_from(["mean", "sum", "none"]), label="reduction")
    weight = rng.standard_normal(n) if reduction == "none" else draw(st.sampled_from([1.0, -2.5]), label="w")
    return logits, targets, reduction, weight, draw(st.sampled_from([1, 64, 1 << 17]), label="block bytes")


@given(cross_entropy_cases())
def test_cross_entropy_kernels_equal_the_reference_in_float64(case):
    logits, targets, reduction, weight, block = case
    with block_bytes(block):
        loss, grad, ran = cross_entropy_and_grad(logits, targets, reduction, weight, kernels=True)
    ref_loss, ref_grad, ref_ran = cross_entropy_and_grad(logits, targets, reduction, weight, kernels=False)
    assert ran and not ref_ran
    np.testing.assert_allclose(loss, ref_loss, **TOL)
    np.testing.assert_allclose(grad, ref_grad, **TOL)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_kernels_in_float32_stay_float32_and_close(reduction):
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((300, 70)) * 4).astype(np.float32)  # several blocks of rows at 128 KiB
    targets = rng.integers(0, 70, 300)
    targets[::7] = -100
    weight = rng.standard_normal(300) if reduction == "none" else 1.0
    with block_bytes(4096):
        loss, grad, ran = cross_entropy_and_grad(logits, targets, reduction, weight, kernels=True)
    ref_loss, ref_grad, _ = cross_entropy_and_grad(logits, targets, reduction, weight, kernels=False)
    assert ran and loss.dtype == grad.dtype == np.float32
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)


def test_cross_entropy_rows_that_are_not_finite_go_to_the_reference():
    """nan, +inf, a row of -inf (nan in the reference) and a -inf entry (an infinite loss): the same values."""
    logits = np.random.default_rng(0).standard_normal((6, 20))
    logits[0, 3], logits[1, 5], logits[2, :], logits[3, 7] = np.nan, np.inf, -np.inf, -np.inf
    targets = np.array([1, 2, 3, 7, -100, 4])
    for reduction in ("none", "sum"):
        weight = np.arange(6.0) if reduction == "none" else 1.0
        with np.errstate(invalid="ignore"):
            loss, grad, ran = cross_entropy_and_grad(logits, targets, reduction, weight, kernels=True)
            ref_loss, ref_grad, _ = cross_entropy_and_grad(logits, targets, reduction, weight, kernels=False)
        assert not ran
        np.testing.assert_array_equal(loss, ref_loss)
        np.testing.assert_array_equal(grad, ref_grad)
    finite = logits[4:]                                                  # the same without the bad rows: kernels
    assert cross_entropy_and_grad(finite, targets[4:], "sum", 1.0, kernels=True)[2]


def test_cross_entropy_retained_graph_gives_the_same_gradient_twice():
    rng = np.random.default_rng(1)
    logits, targets = rng.standard_normal((9, 17)), rng.integers(0, 17, 9)
    targets[4] = -100                                                   # an ignored row: no gradient either time
    x = tg.Tensor(logits, requires_grad=True)
    loss = row_ops.cross_entropy(x, targets)
    assert loss._ctx.by_kernels
    loss.backward(retain_graph=True)
    first = x.grad.data.copy()
    x.grad = None
    (loss * 3).backward()                                               # the gradient computed again, scaled
    np.testing.assert_allclose(x.grad.data, 3 * first, **TOL)
    _, ref_grad, _ = cross_entropy_and_grad(logits, targets, "mean", 1.0, kernels=False)
    np.testing.assert_allclose(first, ref_grad, **TOL)


@pytest.mark.parametrize("cross_entropy", [row_ops.cross_entropy, F.cross_entropy])
def test_logits_changed_in_place_after_the_loss_are_no_error_as_torch(cross_entropy):
    """The fused op saved the logits' own array (version-checked) though its first backward reads only the gradient
    it made in forward: changing the logits in place raised, where torch and the engine's op give the gradient of
    the logits as they were. A second backward of a retained graph recomputes from the logits: then it raises."""
    rng = np.random.default_rng(0)
    start, targets = rng.standard_normal((3, 4)), np.array([0, 3, 1])
    want = np.exp(start - np.log(np.exp(start).sum(1, keepdims=True)))
    want[np.arange(3), targets] -= 1
    w = tg.Tensor(start.copy(), requires_grad=True)
    logits = w * 1.0
    loss = cross_entropy(logits, tg.Tensor(targets))
    with tg.no_grad():
        logits.mul_(0.0)
    loss.backward(retain_graph=True)
    np.testing.assert_allclose(w.grad.data, want / 3, rtol=1e-12, atol=1e-15)
    if cross_entropy is row_ops.cross_entropy:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_cross_entropy_without_grad_mode_computes_the_loss_only():
    rng = np.random.default_rng(2)
    logits, targets = rng.standard_normal((5, 33)), rng.integers(0, 33, 5)
    with tg.no_grad():
        loss = row_ops.cross_entropy(tg.Tensor(logits), targets, reduction="none")
    expected = F.cross_entropy(tg.Tensor(logits), targets, reduction="none")
    np.testing.assert_allclose(loss.data, expected.data, **TOL)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_kernels_gradcheck(reduction):
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((4, 19)) * 2, np.array([0, -100, 18, 5])
    assert cross_entropy_and_grad(logits, targets, reduction, np.ones(4) if reduction == "none" else 1.0, True)[2]
    gradcheck(lambda t: row_ops.cross_entropy(t, targets, reduction=reduction), logits)


def test_cross_entropy_bad_targets_still_raise():
    with pytest.raises(IndexError, match="out of range for 4 classes"):
        row_ops.cross_entropy(tg.Tensor(np.zeros((2, 4)), requires_grad=True), np.array([1, 4]))
    with pytest.raises(IndexError):                                      # straight to the op: the reference's error
        row_ops.FusedCrossEntropy.apply(tg.Tensor(np.zeros((2, 4)), requires_grad=True), np.array([1, 9]))


# --- the embedding's gradient ----------------------------------------------------------------------------

@given(vocab=st.integers(1, 9), dim=st.integers(1, 40), dtype=st.sampled_from([np.float32, np.float64]),
       ids_dtype=st.sampled_from([np.int64, np.int32, np.uint8]), data=st.data())
def test_embedding_gradient_is_np_add_at_bit_for_bit(vocab, dim, dtype, ids_dtype, data):
    low = 0 if np.dtype(ids_dtype).kind == "u" else -vocab                # the op (not F.embedding, which checks)
    ids = data.draw(hnp.arrays(ids_dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=6),
                               elements=st.integers(low, vocab - 1)), label="ids")
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    weight = rng.standard_normal((vocab, dim)).astype(dtype)
    out_grad = (rng.standard_normal(ids.shape + (dim,)) * 10).astype(dtype)
    grads = []
    for op in (row_ops.FusedEmbedding, N.Embedding):
        w = tg.Tensor(weight.copy(), requires_grad=True)
        (op.apply(w, ids) * tg.Tensor(out_grad)).sum().backward()       # takes ids from the end as NumPy
        grads.append(w.grad.data)
    expected = np.zeros_like(weight)
    np.add.at(expected, ids.ravel(), out_grad.reshape(-1, dim))
    np.testing.assert_array_equal(grads[0], expected)
    np.testing.assert_array_equal(grads[1], expected)
    assert grads[0].dtype == dtype


def test_embedding_kernel_adds_in_index_order():
    """Three float32 additions whose sum depends on the order: only np.add.at's order gives its bits."""
    out = np.zeros((1, 1), np.float32)
    rows = np.array([[1e8], [-1e8], [1.0]], np.float32)
    row_kernels.scatter_add_rows(out, np.array([0, 0, 0]), rows)
    expected = np.zeros((1, 1), np.float32)
    np.add.at(expected, [0, 0, 0], rows)
    assert out[0, 0] == expected[0, 0] == 1.0                            # (1e8 - 1e8) + 1; from the end: 0


def test_embedding_kernel_gradcheck():
    ids = np.array([[0, 3, 3], [1, 0, 2]])
    gradcheck(lambda w: row_ops.embedding(ids, w), np.random.default_rng(5).standard_normal((4, 18)))
