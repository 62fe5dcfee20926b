"""Rules at the edges, each found by comparing with torch: in-place writes of values that require grad, the .grad
setter's dtype, copy_'s broadcast, view without a copy, flip's copy, detach_ after a use, pow at 0 and below."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import Tensor, no_grad
from tinygrad_ssm.autograd import functional as F

from tests.support.tensors import leaf


# --- writes into a tensor: a value that requires grad is refused, not silently cut from the graph -------------

@pytest.mark.parametrize("write", [
    lambda buf, v: buf.__setitem__(slice(0, 2), v), lambda buf, v: buf[:2].copy_(v),
    lambda buf, v: buf[:2].add_(v), lambda buf, v: buf[:2].mul_(v), lambda buf, v: buf[:2].fill_(v[0]),
], ids=["setitem", "copy_", "add_", "mul_", "fill_"])
def test_writing_a_value_that_requires_grad_is_refused(write):
    """buf[0:2] = w * 2 stored the numbers and dropped w's gradient (torch records the write: w.grad 20, 30)."""
    w = leaf([2.0, 3.0])
    buf = Tensor(np.zeros(3))
    with pytest.raises(RuntimeError, match="the value requires grad.*gradient would be lost.*value.detach"):
        write(buf, w * 2)
    assert np.array_equal(buf.data, np.zeros(3))
    with no_grad():  # nothing is recorded there, so nothing is lost
        write(buf, w * 2)
    write(buf, (w * 2).detach())  # the caller says no gradient flows


def test_an_assigned_grad_is_cut_from_the_graph_it_came_from():
    """torch keeps the graph of a tensor assigned to .grad; here it is detached (as .grad always is): the engine
    records no in-place op, so a .grad that required grad would refuse every in-place update that follows (the next
    backward's sum into it, zero_grad(set_to_none=False)'s zero_, clip_grad_norm_'s mul_)."""
    w, p = leaf([1.0, 2.0]), leaf([0.0, 0.0])
    p.grad = w * 2
    assert not p.grad.requires_grad and p.grad.grad_fn is None
    (p * 3).sum().backward()
    assert p.grad.data.tolist() == [5.0, 7.0] and w.grad is None
    p.grad.zero_()
    assert p.grad.data.tolist() == [0.0, 0.0]


def test_a_gradient_given_as_a_list_seeds_backward_in_the_outputs_dtype():
    """backward(gradient=[0.1, ...]) on a float64 output: the list takes the output's dtype (torch's rule for the
    in-place ops' Python numbers too); as a new tensor it would be float32, and x.grad 0.10000000149."""
    x = leaf([1.0, 2.0, 3.0])
    (x * 1.0).backward([0.1, 0.2, 0.3])
    assert x.grad.dtype == np.float64 and x.grad.data.tolist() == [0.1, 0.2, 0.3]


def test_assigned_grad_must_have_the_tensors_dtype():
    """A float32 .grad on a float64 tensor was kept, and later gradients were summed into it in float32."""
    p = leaf([1.0, 2.0])
    with pytest.raises(TypeError, match="grad: assigned grad has dtype float32 but the tensor has dtype float64"):
        p.grad = Tensor(np.zeros(2, np.float32))
    p.grad = Tensor(np.zeros(2))
    (p * (1 + 1e-10)).sum().backward()
    assert p.grad.dtype == np.float64 and p.grad.data[0] == 1 + 1e-10


def test_an_in_place_op_that_cannot_cast_names_the_op():
    t = Tensor(np.arange(3))
    with pytest.raises(TypeError, match=r"add_: the result cannot be stored in place in this int64 tensor .*"
                                        r"t.double\(\)"):
        t.add_(1.5)
    assert np.array_equal(t.data, [0, 1, 2]) and t._version[0] == 0


def test_copy_broadcasts_its_source_as_torch():
    t = Tensor(np.zeros((2, 3)))
    t.copy_(Tensor(np.arange(3.0)))
    assert np.array_equal(t.data, [[0, 1, 2], [0, 1, 2]])
    with pytest.raises(ValueError, match="copy_: shapes .* broadcast to .* in-place op keeps the tensor's shape"):
        Tensor(np.zeros(3)).copy_(Tensor(np.zeros((2, 3))))


def test_view_never_copies():
    """x.T.view(-1) returned a copy, so a write to it did not reach x (torch raises)."""
    x = Tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(RuntimeError, match=r"view: shape \(3, 2\) .* cannot be viewed as \(6,\) without a copy; "
                                           r"use .reshape"):
        x.T.view(-1)
    v = x.view(3, 2)
    v[0, 0] = 99.0
    assert x.data[0, 0] == 99.0
    assert x.T.reshape(-1).shape == (6,)  # reshape may copy


def test_flip_is_a_copy_as_torch():
    """flip returned NumPy's view, so writing to the result changed the input."""
    x = Tensor(np.array([1.0, 2.0, 3.0]))
    y = x.flip(0)
    y.add_(10.0)
    assert np.array_equal(x.data, [1.0, 2.0, 3.0]) and np.array_equal(y.data, [13.0, 12.0, 11.0])
    assert x._version[0] == 0


def test_detach_in_place_after_a_use_keeps_the_recorded_graph():
    """y.detach_() after loss = f(y) made backward stop at y: x got no gradient and y one (torch: x.grad = e^x)."""
    x = leaf([1.0, 2.0])
    y = x.exp()
    loss = y.sum()
    y.detach_()
    loss.backward()
    np.testing.assert_allclose(x.grad.data, np.exp([1.0, 2.0]), rtol=1e-15)
    assert y.grad is None and not y.requires_grad and y.is_leaf
    z = (y * x).sum()  # a graph made after detach_ sees y as a constant
    x.grad = None
    z.backward()
    np.testing.assert_allclose(x.grad.data, np.exp([1.0, 2.0]), rtol=1e-15)


# --- pow where its formulas meet 0 * inf or log of a negative number ----------------------------------------

def test_pow_gradient_at_exponent_zero_is_zero():
    """x ** 0 gave NaN at x = 0 (0 * 0^-1), so a polynomial basis sum(x ** k) had a NaN gradient."""
    x = leaf([0.0, 1.0, 2.0])
    F.stack([x ** k for k in range(3)]).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [1.0, 3.0, 5.0])


def test_pow_gradients_match_torch_at_zero_and_negative_bases():
    torch = pytest.importorskip("torch")
    bases = np.array([-2.0, -1.0, 0.0, 0.0, 0.0, 0.5, 2.0])
    exponents = np.array([2.0, 3.0, 0.0, 2.0, -1.0, 0.0, 1.5])
    a, b = leaf(bases), leaf(exponents)
    ta = torch.tensor(bases, requires_grad=True)
    tb = torch.tensor(exponents, requires_grad=True)
    with np.errstate(divide="ignore"):
        (a ** b).backward(np.ones(7))
    (ta ** tb).backward(torch.ones(7, dtype=torch.float64))
    np.testing.assert_array_equal(a.grad.data, ta.grad.numpy())  # NaN where torch has NaN (log of a < 0)
    np.testing.assert_array_equal(b.grad.data, tb.grad.numpy())
    assert np.isnan(b.grad.data[:2]).all() and b.grad.data[2] == 0


@pytest.mark.parametrize("name", ["abs", "relu"])
def test_abs_and_relu_gradients_at_nan_and_zero_match_torch(name):
    """abs'(NaN) was NaN (torch's sgn gives 0) and relu'(NaN) 0 (torch's threshold_backward passes it)."""
    torch = pytest.importorskip("torch")
    values = [np.nan, 0.0, -0.0, 1.0, -1.0, np.inf, -np.inf]
    x, tx = leaf(values), torch.tensor(values, requires_grad=True)
    getattr(F, name)(x).backward(np.ones(len(values)))
    getattr(torch, name)(tx).backward(torch.ones(len(values), dtype=torch.float64))
    np.testing.assert_array_equal(x.grad.data, tx.grad.numpy())


@pytest.mark.parametrize("low, high", [(-1.0, 2.0), (-1.0, None), (None, 2.0)])
def test_clip_passes_the_gradient_at_its_bounds_as_torch_clamp(low, high):
    """torch.clamp's backward keeps the gradient where low <= x <= high, the bounds included: an entry sitting
    on a bound (a clamp reached exactly, or clip(x, 0) of a ReLU-like 0) still learns. Gradcheck cannot see
    this: finite differences straddle the kink."""
    values = [-3.0, -1.0, 0.5, 2.0, 4.0]
    x = leaf(values)
    F.clip(x, low, high).backward(np.ones(5))
    inside = [(low is None or v >= low) and (high is None or v <= high) for v in values]
    np.testing.assert_array_equal(x.grad.data, np.array(inside, dtype=np.float64))
    torch = pytest.importorskip("torch")
    tx = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    torch.clamp(tx, low, high).backward(torch.ones(5, dtype=torch.float64))
    np.testing.assert_array_equal(x.grad.data, tx.grad.numpy())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_over_no_classes_with_every_target_ignored_matches_torch(reduction):
    """It raised NumPy's IndexError (index 0 out of bounds) forward and backward; torch gives nan / 0 / zeros."""
    torch = pytest.importorskip("torch")
    logits = leaf(np.zeros((3, 0)))
    loss = F.cross_entropy(logits, np.full(3, -100), reduction=reduction)
    theirs = torch.nn.functional.cross_entropy(torch.zeros(3, 0, dtype=torch.float64), torch.full((3,), -100),
                                               reduction=reduction)
    np.testing.assert_array_equal(loss.data, theirs.numpy())
    (loss.sum() if reduction == "none" else loss).backward()
    assert logits.grad.shape == (3, 0)


def test_numpy_scalar_arguments_do_not_widen_float32():
    """eps=np.float64(1e-5) made rms_norm's float32 output float64, as did clip's np.float64 bounds (a Python
    number never widens a tensor, and neither does a NumPy scalar in an operator)."""
    x = Tensor(np.ones((2, 4), np.float32), requires_grad=True)
    assert F.rms_norm(x, Tensor(np.ones(4, np.float32)), eps=np.float64(1e-5)).dtype == np.float32
    assert F.clip(x, np.float64(0), np.float64(0.5)).dtype == np.float32
    assert F.pad(x, (1, 1), value=np.float64(2)).dtype == np.float32


# --- dtype promotion: every op that meets two dtypes follows the one rule, as torch -------------------------

def test_every_op_that_meets_two_dtypes_follows_torchs_rule():
    """where, cat, stack and matmul used NumPy's result_type (int64 with float32 gave float64), int32 + 1 became
    int64, and arange over Python floats gave float64 against its docstring's float32."""
    torch = pytest.importorskip("torch")
    ints, floats = np.array([1, 2]), np.array([0.5, 1.5], np.float32)
    cases = {
        "where": (F.where(np.array([True, False]), Tensor(ints), 0.5),
                  torch.where(torch.tensor([True, False]), torch.tensor(ints), 0.5)),
        "cat": (F.cat([Tensor(floats), Tensor(ints)]), torch.cat([torch.tensor(floats), torch.tensor(ints)])),
        "stack": (F.stack([Tensor(ints), Tensor(floats)]), torch.stack([torch.tensor(ints), torch.tensor(floats)])),
        "int32 + 1": (Tensor(ints.astype(np.int32)) + 1, torch.tensor(ints.astype(np.int32)) + 1),
        "uint8 * 2": (Tensor(ints.astype(np.uint8)) * 2, torch.tensor(ints.astype(np.uint8)) * 2),
        "int32 + 1.5": (Tensor(ints.astype(np.int32)) + 1.5, torch.tensor(ints.astype(np.int32)) + 1.5),
        "bool + 1": (Tensor(np.array([True])) + 1, torch.tensor([True]) + 1),
        "arange of floats": (tg.arange(0, 1, 0.25), torch.arange(0, 1, 0.25)),
        "arange of ints": (tg.arange(3), torch.arange(3)),
    }
    for name, (ours, theirs) in cases.items():
        assert str(ours.dtype) == str(theirs.dtype).removeprefix("torch."), name
        np.testing.assert_array_equal(ours.data, theirs.numpy(), err_msg=name)
    assert (Tensor(floats) @ Tensor(np.eye(2, dtype=np.int64))).dtype == np.float32  # torch refuses; the rule holds


def test_causal_conv1d_follows_the_one_dtype_rule():
    """An integer x and weight with a float bias raised NumPy's bare casting error; an int64 x with a float32 weight
    gave float64 (NumPy's rule, not torch's), and a float64 bias was rounded into a float32 output. Now every operand
    meets in dtypes.promoted, as the binary ops and matmul, and each gradient comes back in its input's dtype."""
    rng = np.random.default_rng(0)
    x, w, b = rng.integers(-3, 4, (2, 5, 3)), rng.standard_normal((3, 1, 2)), rng.standard_normal(3)
    for dtypes, expected in ((("int64", "int64", "float32"), np.float32), (("int64", "float32", "float32"), np.float32),
                             (("int32", "int64", "float64"), np.float64), (("float32", "float32", "float64"), np.float64),
                             (("float32", "float64", None), np.float64), (("int64", "int32", None), np.int64)):
        operands = [Tensor(a.astype(d)) for a, d in zip((x, w, b), dtypes) if d is not None]
        out = F.causal_conv1d(*operands)
        assert out.dtype == expected, dtypes
        exact = F.causal_conv1d(*[Tensor(o.data.astype(np.float64)) for o in operands])  # the operands' values
        np.testing.assert_allclose(out.data, exact.data, rtol=1e-6, err_msg=str(dtypes))
    x32, w32, b64 = (Tensor(a, requires_grad=True) for a in (x.astype(np.float32), w.astype(np.float32), b))
    F.causal_conv1d(x32, w32, b64).sum().backward()
    assert (x32.grad.dtype, w32.grad.dtype, b64.grad.dtype) == (np.float32, np.float32, np.float64)
    np.testing.assert_array_equal(b64.grad.data, np.full(3, 10.0))              # every (b, l) step once


def test_a_zero_dim_tensor_does_not_widen_a_tensor_of_its_kind_and_gets_its_own_gradient():
    """float32 tensor * 0-d float64 tensor was float64 (torch: float32, the 0-d operand counts like a number)."""
    torch = pytest.importorskip("torch")
    x = np.array([0.5, -1.25, 2.0], np.float32)
    scale = leaf(np.array(1.1))                                          # 0-d float64, requires grad
    t_scale = torch.tensor(1.1, dtype=torch.float64, requires_grad=True)
    out, t_out = Tensor(x) * scale, torch.tensor(x) * t_scale
    assert out.dtype == np.float32 and t_out.dtype == torch.float32
    np.testing.assert_array_equal(out.data, t_out.detach().numpy())
    out.sum().backward(), t_out.sum().backward()
    assert scale.grad.dtype == np.float64 and scale.grad.data == pytest.approx(t_scale.grad.item(), rel=1e-7)
    assert (Tensor(np.array([1, 2], np.int32)) + Tensor(np.array(3))).dtype == np.int32   # int64 0-d, as torch


# --- a backward's gradients: one per input, each in a shape its input broadcasts to ----------------------------

def _op_whose_backward_returns(make_grads):
    from tinygrad_ssm.autograd.function import Function

    class Scale(Function):
        def forward(self, x):
            return 2 * x

        def backward(self, grad):
            return make_grads(2 * grad)
    return Scale


@pytest.mark.parametrize("make_grads", [lambda g: g.T, lambda g: g.reshape(-1), lambda g: g.reshape(1, -1),
                                        lambda g: g[:1]])
def test_a_gradient_no_broadcast_could_make_is_refused_naming_the_op(make_grads):
    """A backward that returned g.T for a (3, 2) input was reshaped into a scrambled gradient without a word;
    torch: "returned an invalid gradient at index 0"."""
    x = leaf(np.arange(6.0).reshape(3, 2))
    y = _op_whose_backward_returns(make_grads).apply(x)
    with pytest.raises(RuntimeError, match=r"Scale\.backward returned an invalid gradient for input 0: got a "
                                           r"gradient of shape .* for an input of shape \(3, 2\)"):
        y.backward(np.arange(6.0).reshape(3, 2))


def test_a_broadcast_gradient_is_summed_and_extra_gradients_are_refused():
    x = leaf(np.ones((3, 2)))
    _op_whose_backward_returns(lambda g: np.stack([g, g])).apply(x).backward(np.ones((3, 2)))
    np.testing.assert_array_equal(x.grad.data, np.full((3, 2), 4.0))  # (2, 3, 2) summed over its leading axis
    y = _op_whose_backward_returns(lambda g: (g, None)).apply(leaf(np.ones(2)))
    y.backward(np.ones(2))                                               # a trailing None is no gradient
    y = _op_whose_backward_returns(lambda g: (g, g)).apply(leaf(np.ones(2)))
    with pytest.raises(RuntimeError, match=r"Scale\.backward returned 2 gradients for 1 tensor input\(s\)"):
        y.backward(np.ones(2))


# --- found by differential testing against torch (2026-12-06) -------------------------------------------------

def test_an_int_and_an_index_array_index_as_torch_reads_them():
    """x[0, :, [1, 2]] was NumPy's (2, 3) (the int broadcast with the list, their axis first); torch applies the int
    first: (3, 2). Writing through such an index took the transposed value and refused torch's."""
    x = np.arange(24.0).reshape(2, 3, 4)
    picked = Tensor(x)[0, :, [1, 2]]
    np.testing.assert_array_equal(picked.data, x[0][:, [1, 2]])
    assert picked.shape == (3, 2)
    assert Tensor(x)[:, 2, np.array([[0], [3]])].shape == (2, 2, 1)            # torch: (2, 2, 1); NumPy: (2, 1, 2)
    assert Tensor(x)[Tensor(np.array(1)), :, [0, 3]].shape == (3, 2)         # a 0-d index tensor counts as an int
    buf = Tensor(np.zeros((2, 3, 4)))
    buf[1, :, [0, 3]] = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(buf.data[1][:, [0, 3]], np.arange(6.0).reshape(3, 2))
    assert buf.data[0].sum() == 0 and buf.data[1][:, 1:3].sum() == 0
    buf[Tensor(np.array(0)), :, [0]] = 7.0                                   # a 0-d index tensor writes too
    assert (buf.data[0][:, 0] == 7).all() and buf.data[0].sum() == 21
    with pytest.raises(ValueError, match=r"a value of shape \(2, 3\) does not broadcast to the indexed shape \(3, 2\)"):
        buf[1, :, [0, 3]] = np.zeros((2, 3))


def test_a_tuple_inside_an_index_is_an_index_array_whose_repeats_add_up():
    """x[:, (0, 0)] picked column 0 twice, but its gradient counted it once: the tuple was not seen as an index array,
    so backward wrote the gradient instead of adding it."""
    x = leaf(np.arange(6.0).reshape(2, 3))
    x[:, (0, 0)].sum().backward()
    assert x.grad.data.tolist() == [[2.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
    z = leaf([1.0, 2.0, 3.0])
    z[(0, 0, 2),].sum().backward()
    assert z.grad.data.tolist() == [2.0, 0.0, 1.0]


def test_an_empty_index_list_picks_nothing():
    """x[[]] was refused as a float index (np.asarray([]) is float64); NumPy and torch give an empty selection."""
    x = Tensor(np.zeros((3, 4)))
    assert x[[]].shape == (0, 4) and x[:, []].shape == (3, 0)


def test_where_with_a_zero_dim_operand_keeps_the_tensors_dtype():
    """where(c, float32 tensor, 0-d float64 tensor) was float64; the binary ops' rule (torch's) keeps float32."""
    c = np.array([True, False])
    assert F.where(c, Tensor(np.ones(2, np.float32)), Tensor(np.array(2.0))).dtype == np.float32
    assert F.where(c, Tensor(np.ones(2, np.int32)), Tensor(np.array(2))).dtype == np.int32
    assert F.where(c, Tensor(np.ones(2, np.float32)), Tensor(np.ones(2))).dtype == np.float64  # both n-d: widens


@pytest.mark.parametrize("reduce", [F.sum, F.mean, F.amax, F.amin, F.logsumexp])
def test_reducing_over_no_listed_axes_reduces_every_axis_as_torch(reduce):
    """sum(x, dim=()) reduced nothing (NumPy's axis=()); torch reduces every axis."""
    x = np.arange(6.0).reshape(2, 3)
    for empty in ((), []):
        out = reduce(Tensor(x), empty)
        assert out.shape == () and out.data == pytest.approx(reduce(Tensor(x)).data)
    assert F.flip(Tensor(x), ()).data.tolist() == x.tolist()                  # not a reduction: no axes, no change


@pytest.mark.parametrize("op, smaller_gets", [(F.maximum, 0.0), (F.minimum, 1.0)])
def test_maximum_and_minimum_pass_the_gradient_to_both_sides_of_a_nan(op, smaller_gets):
    """torch's formula: where a NaN meets a number, both inputs get the whole gradient (here the NaN side got none)."""
    a, b = leaf([np.nan, 1.0, 2.0, 3.0]), leaf([1.0, np.nan, 2.0, 5.0])
    op(a, b).sum().backward()
    assert a.grad.data.tolist() == [1.0, 1.0, 0.5, smaller_gets]
    assert b.grad.data.tolist() == [1.0, 1.0, 0.5, 1.0 - smaller_gets]


def test_einsum_takes_a_zero_dim_operand():
    """einsum(',i->i', s, v) was refused ("subscripts '' don't fit an operand of shape ()")."""
    s, v = leaf(np.array(2.0)), leaf([1.0, 2.0, 3.0])
    out = F.einsum(",i->i", s, v)
    assert out.data.tolist() == [2.0, 4.0, 6.0]
    out.sum().backward()
    assert s.grad.data == 6.0 and v.grad.data.tolist() == [2.0, 2.0, 2.0]
    assert F.einsum("->", Tensor(np.array(3.0))).data == 3.0


def test_integer_tensors_reduce_and_clip_in_torchs_dtypes():
    """sum and cumsum of uint8 were uint64 (NumPy's; torch: int64), clip of an int64 tensor to float bounds float64
    (torch: float32, as int64 + 0.5)."""
    u8 = Tensor(np.array([200, 100], np.uint8))
    assert F.sum(u8).dtype == np.int64 and F.sum(u8).data == 300
    assert F.cumsum(u8, 0).dtype == np.int64 and F.cumsum(u8, 0).data.tolist() == [200, 300]
    assert F.sum(Tensor(np.array([True, True]))).dtype == np.int64
    clipped = F.clip(Tensor(np.array([0, 1, 2])), 0.5, 1.5)
    assert clipped.dtype == np.float32 and clipped.data.tolist() == [0.5, 1.0, 1.5]
    assert F.clip(Tensor(np.array([0, 1, 2])), 0, 1).dtype == np.int64


def test_flatten_with_start_after_end_says_so():
    with pytest.raises(ValueError, match=r"flatten: start axis 2 comes after end axis 0 .*give start <= end"):
        F.flatten(Tensor(np.zeros((2, 3, 4))), 2, 0)


DIVISION_DTYPES = [np.bool_, np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64]


def test_true_division_gives_torchs_dtype_for_every_pair_of_operands():
    """Each integer operand was made float32 before the operands met: int64 / a 0-d float64 was float32 (torch:
    float64, the precision lost) and int / float16 float32 (torch: float16), 42 pairs in all (an audit). The rule
    (torch's type promotion docs) without torch, then every pair against it."""
    ints = Tensor(np.array([1, 2, 3]))
    for other, want in ((Tensor(np.float64(3.0)), np.float64), (Tensor(np.ones(3, np.float16)), np.float16),
                        (Tensor(np.array([2, 2, 2], np.int8)), np.float32), (2, np.float32), (True, np.float32)):
        assert F.div(ints, other).dtype == want and F.div(other, ints).dtype == want, (other, want)
    np.testing.assert_allclose(F.div(ints, Tensor(np.float64(3.0))).data, [1 / 3, 2 / 3, 1.0], rtol=1e-15)
    torch = pytest.importorskip("torch")
    operands = [(f"{np.dtype(d).name}{shape}", np.array([1, 2, 3] if shape else 2).astype(d))
                for d in DIVISION_DTYPES for shape in ("[3]", "()")] + [(repr(s), s) for s in (True, 3, 2.5)]
    for (name_a, a), (name_b, b) in itertools.product(operands, repeat=2):
        if not (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)):
            continue
        theirs = (torch.tensor(a) if isinstance(a, np.ndarray) else a) / (torch.tensor(b) if isinstance(b, np.ndarray)
                                                                          else b)
        ours = F.div(Tensor(a) if isinstance(a, np.ndarray) else a, Tensor(b) if isinstance(b, np.ndarray) else b)
        assert str(ours.dtype) == str(theirs.dtype).removeprefix("torch."), (name_a, name_b)
        np.testing.assert_allclose(ours.data.astype(np.float64), theirs.double().numpy(), rtol=1e-3,
                                   err_msg=f"{name_a} / {name_b}")


def test_einsum_meets_its_operands_in_one_dtype_as_matmul():
    """np.einsum's own rule widened int32 with float16, and int64 with float32, to float64."""
    for a_dtype, b_dtype, want in ((np.int32, np.float16, np.float16), (np.int64, np.float32, np.float32),
                                   (np.float32, np.float64, np.float64)):
        a, b = np.arange(6).reshape(2, 3).astype(a_dtype), np.arange(6).reshape(3, 2).astype(b_dtype)
        out = F.einsum("ij,jk->ik", Tensor(a), Tensor(b))
        assert out.dtype == want == (Tensor(a) @ Tensor(b)).dtype
        np.testing.assert_array_equal(out.data, a.astype(np.float64) @ b.astype(np.float64))
    x, w = leaf(np.ones((2, 3)), np.float32), leaf(np.ones((3, 2)))
    F.einsum("ij,jk->ik", x, w).sum().backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float64     # each gradient in its input's dtype


def test_sum_in_a_narrower_dtype_asked_for_is_in_that_dtype():
    """t.sum(dtype=np.int8) of bools was int64 (NumPy and torch: int8, wrapping as they do)."""
    assert Tensor(np.array([True, True])).sum(dtype=np.int8).dtype == np.int8
    wrapped = Tensor(np.array([100, 100], np.int8)).sum(dtype=np.int8)
    assert wrapped.dtype == np.int8 and wrapped.data == np.array([100, 100], np.int8).sum(dtype=np.int8)
    x = leaf(np.ones(3), np.float32)
    total = x.sum(dtype=np.float64)
    total.backward()
    assert total.dtype == np.float64 and x.grad.dtype == np.float32


def _int_op(name, value):
    def run(t):
        if name == "t[0] = v":
            t[0] = value
            return t
        return {"t + v": lambda: t + value, "t * v": lambda: t * value, "v - t": lambda: value - t}.get(
            name, lambda: getattr(t, name)(value))()
    return run


def test_a_python_int_meets_an_integer_tensor_as_in_torch():
    """uint8 + 300 and uint8 + -1 raised NumPy 2's bare OverflowError (torch wraps), uint8.add_(1) was refused
    ('cannot be stored in place'), and t[0] = 300 on uint8 stored 44 where torch refuses it (an audit). The cases
    without torch, then every pair against it."""
    u8 = np.array([1, 2, 3], np.uint8)
    assert (Tensor(u8) + 300).data.tolist() == [45, 46, 47] and (Tensor(u8) + -1).data.tolist() == [0, 1, 2]
    assert Tensor(u8).add_(1).data.tolist() == [2, 3, 4] and (Tensor(u8) + 300).dtype == np.uint8
    with pytest.raises(OverflowError, match=r"__setitem__: the value 300 does not fit in this uint8 tensor \(-255..255\)"):
        Tensor(u8)[0] = 300
    torch = pytest.importorskip("torch")
    for dtype, value, name in itertools.product(
            (np.uint8, np.int8, np.int16, np.int32, np.int64), (1, 300, -1, -129, -255, -256, 255, 128, 70000, 2**40),
            ("t + v", "t * v", "v - t", "add_", "mul_", "sub_", "t[0] = v", "fill_")):
        where, array = f"{np.dtype(dtype).name} {name} with v = {value}", np.array([1, 2, 3], dtype)
        try:
            theirs = _int_op(name, value)(torch.tensor(array)).numpy()
        except RuntimeError:
            with pytest.raises(OverflowError, match=r"the value -?\d+ does not fit in this \w+ tensor"):
                _int_op(name, value)(Tensor(array))
            continue
        ours = _int_op(name, value)(Tensor(array)).data
        assert ours.dtype == theirs.dtype and ours.tolist() == theirs.tolist(), where
    with pytest.raises(OverflowError, match=r"add: b = 2361183241434822606848 is beyond int64"):
        Tensor(np.array([1])) + 2**71


def test_a_bool_tensor_to_a_bool_power_is_bool_as_torch():
    """bool tensor ** True was int8 (NumPy's result type; an audit of the engine against torch, whose result is
    bool; torch refuses bool tensor ** bool tensor, which here follows the same table: 0^0 = 1, 0^1 = 0)."""
    a = Tensor(np.array([True, False, True, False]))
    assert (a ** True).dtype == np.bool_ and (a ** True).data.tolist() == [True, False, True, False]
    assert (a ** False).dtype == np.bool_ and (a ** False).data.tolist() == [True, True, True, True]
    both = a ** Tensor(np.array([True, True, False, False]))
    assert both.dtype == np.bool_ and both.data.tolist() == [True, False, True, True]
    assert (a ** 2).dtype == np.int64 and (a ** 2).data.tolist() == [1, 0, 1, 0]   # an int exponent: int64 (torch)
    torch = pytest.importorskip("torch")
    assert (torch.tensor([True, False]) ** True).tolist() == (Tensor(np.array([True, False])) ** True).data.tolist()
