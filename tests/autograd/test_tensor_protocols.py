"""Python's and NumPy's protocols on Tensor, as PyTorch defines them: elementwise comparisons (==, != too)
giving bool tensors, hashing by identity, iteration over the first axis, `in`, len, np.asarray / np.array,
NumPy ufuncs, and the dtypes a tensor can hold (no str, None, objects or complex numbers)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.gradcheck import gradcheck
from tests.support.tensors import leaf
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F


# --- comparisons ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("symbol, ufunc", [("==", np.equal), ("!=", np.not_equal), ("<", np.less),
                                           ("<=", np.less_equal), (">", np.greater), (">=", np.greater_equal)])
def test_comparisons_are_elementwise_bool_tensors(symbol, ufunc):
    a = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    b = np.array([1.0, 1.0, 1.0])
    for left, right, expected in ((Tensor(a), 1.0, ufunc(a, 1.0)), (Tensor(a), Tensor(b), ufunc(a, b)),
                                  (Tensor(a), b, ufunc(a, b)), (a, Tensor(b), ufunc(a, b)),
                                  (1.0, Tensor(a), ufunc(1.0, a))):
        out = eval(f"left {symbol} right")
        assert isinstance(out, Tensor) and out.dtype == np.bool_ and not out.requires_grad
        np.testing.assert_array_equal(out.data, expected)


def test_a_mask_from_equality_selects_entries():
    ids = Tensor(np.array([0, 3, 0, 2]))
    np.testing.assert_array_equal(ids[ids == 0].data, [0, 0])  # was empty: == compared identity
    np.testing.assert_array_equal(ids[ids != 0].data, [3, 2])
    x = leaf([1.0, -2.0, 3.0])
    x[x > 0].sum().backward()  # a comparison makes a mask, the mask indexes, the gradient flows
    np.testing.assert_array_equal(x.grad.data, [1.0, 0.0, 1.0])


def test_comparing_with_a_python_float_uses_the_tensor_dtype():
    # 0.1 is compared in float64 against a float64 tensor and rounded to float32 against a float32 one
    assert (Tensor(np.array([0.1])) == 0.1).item()
    assert (Tensor(np.array([0.1], np.float32)) == 0.1).item()
    assert not (Tensor(np.array([np.float32(0.1)], np.float64)) == 0.1).item()


def test_comparisons_with_non_numbers_and_mismatched_shapes():
    t = Tensor(np.ones(2))
    assert (t == "a") is False and (t == None) is False and (t != "a") is True  # noqa: E711, as torch
    with pytest.raises(TypeError, match="not supported between"):
        t < "a"
    with pytest.raises(ValueError, match=r"^eq: shapes \(2,\) and \(3,\) do not broadcast"):
        t == np.ones(3)


def test_hash_stays_identity_so_tensors_are_dict_keys():
    a, b = Tensor(np.ones(2)), Tensor(np.ones(2))
    table = {a: "a", b: "b"}
    assert table[a] == "a" and table[b] == "b" and hash(a) != hash(b)
    assert len({a, b, a}) == 2


# --- iteration, len, in ---------------------------------------------------------------------------------

def test_iteration_goes_over_the_first_axis():
    x = np.arange(6.0).reshape(3, 2)
    rows = list(Tensor(x))
    assert len(rows) == 3 and all(isinstance(r, Tensor) and r.shape == (2,) for r in rows)
    np.testing.assert_array_equal(np.stack([r.data for r in rows]), x)
    w = leaf([1.0, 2.0, 3.0])
    a, b, c = w  # unpacking is differentiable, like indexing
    (a * 2 + c).backward()
    np.testing.assert_array_equal(w.grad.data, [2.0, 0.0, 1.0])


def test_a_0d_tensor_has_no_iteration_and_no_len():
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(Tensor(np.array(1.0)))
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(Tensor(np.array(1.0)))
    assert len(Tensor(np.zeros((4, 2)))) == 4


def test_contains_looks_for_an_equal_entry():
    t = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert 3.0 in t and 4 in t and np.float64(1.0) in t
    assert 5.0 not in t and 2.5 not in t
    assert Tensor(np.array([3.0, 4.0])) in t and Tensor(np.array([4.0, 3.0])) not in t
    with pytest.raises(RuntimeError, match="only supports Tensor or scalar, but you passed in a str"):
        "a" in t


# --- NumPy ----------------------------------------------------------------------------------------------

def test_asarray_gives_the_tensor_array_not_an_object_array():
    x = np.arange(6.0).reshape(2, 3)
    t = Tensor(x)
    assert np.asarray(t) is x  # no copy, numeric dtype (was an object array of 0-d tensors)
    copied = np.array(t)
    assert copied.dtype == np.float64 and not np.shares_memory(copied, x)
    np.testing.assert_array_equal(copied, x)
    assert np.asarray(t, dtype=np.float32).dtype == np.float32
    np.testing.assert_array_equal(np.stack([Tensor(np.ones(2)), Tensor(np.zeros(2))]), [[1, 1], [0, 0]])


def test_asarray_of_a_tensor_that_requires_grad_raises_as_numpy_does():
    x = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match="requires grad.*detach\\(\\).numpy\\(\\)"):
        np.asarray(x)
    with pytest.raises(RuntimeError, match="requires grad"):
        np.array(x * 2)
    np.testing.assert_array_equal(np.asarray(x.detach()), [1.0, 2.0])


def test_numpy_ufuncs_that_are_engine_ops_are_differentiable():
    x = np.array([[0.5, 1.5], [2.0, 0.25]])
    for ufunc, op in ((np.exp, F.exp), (np.log, F.log), (np.sqrt, F.sqrt), (np.tanh, F.tanh),
                      (np.negative, F.neg), (np.abs, F.abs)):
        out = ufunc(Tensor(x))
        assert isinstance(out, Tensor)
        np.testing.assert_array_equal(out.data, op(Tensor(x)).data)
        gradcheck(ufunc, x)
    y = np.array([1.5, -0.5])
    for ufunc in (np.add, np.subtract, np.multiply, np.divide, np.maximum, np.minimum, np.matmul):
        gradcheck(lambda a, b, u=ufunc: u(a, b), x, y)
        gradcheck(lambda b, u=ufunc: u(x, b), y)  # ndarray on the left: the tensor still gets its gradient
    gradcheck(lambda a: np.power(a, 2.5), x)


def test_other_ufuncs_work_without_grad_and_refuse_a_tensor_that_requires_grad():
    x = np.array([0.5, 1.5])
    out = np.sin(Tensor(x))
    assert isinstance(out, Tensor)
    np.testing.assert_array_equal(out.data, np.sin(x))
    np.testing.assert_array_equal(np.add.reduce(Tensor(x)).data, x.sum())
    with pytest.raises(TypeError, match="np.sin: not differentiable.*tinygrad_ssm.autograd.functional.*detach"):
        np.sin(leaf(x))
    with pytest.raises(TypeError, match="np.add.reduce: not differentiable"):
        np.add.reduce(leaf(x))
    with pytest.raises(TypeError, match="np.exp: out= is not supported"):
        np.exp(Tensor(x), out=np.empty(2))


def test_np_exp_of_a_large_tensor_is_one_array_op():
    t = Tensor(np.linspace(-1.0, 1.0, 200_000))
    out = np.exp(t)  # was 200k 0-d tensors in an object array
    assert isinstance(out, Tensor) and out.dtype == np.float64 and out.shape == (200_000,)


# --- what a tensor can hold -----------------------------------------------------------------------------

@pytest.mark.parametrize("data, fragment", [
    (np.array([1 + 2j]), "dtype complex128: complex tensors are not supported"),
    (np.array([1 + 2j], np.complex64), "dtype complex64"),
    (1 + 2j, "complex128"),
    ("abc", "got str 'abc'"),
    (None, "got NoneType None"),
    (np.array([object()]), "got an array of dtype object"),
    ([1, "a"], "a list that NumPy turns into dtype <U"),
    (np.array(["a"]), "array of dtype <U1"),
])
def test_a_tensor_holds_only_bool_integer_or_float_numbers(data, fragment):
    with pytest.raises(TypeError, match=r"^Tensor: .*" + fragment.replace("(", r"\(").replace(")", r"\)")):
        Tensor(data)


def test_complex_dtype_argument_is_refused():
    with pytest.raises(TypeError, match="complex64"):
        Tensor([1.0, 2.0], dtype=np.complex64)


# --- tg.tensor, torch.tensor's equivalent ----------------------------------------------------------------

def test_tg_tensor_is_new_tensor_and_copies_like_torch_tensor():
    import tinygrad_ssm as tg
    from tinygrad_ssm.autograd import tensor as tensor_module
    assert tg.tensor is tg.new_tensor and tensor_module.Tensor is tg.Tensor
    array = np.array([1.0, 2.0])
    t = tg.tensor(array, requires_grad=True)  # torch.tensor: a copy
    assert t.dtype == np.float64 and t.requires_grad and not np.shares_memory(t.data, array)
    assert tg.tensor([1.0, 2.0]).dtype == np.float32 and tg.tensor([1, 2]).dtype == np.int64


# --- in-place writes ------------------------------------------------------------------------------------

def test_in_place_writes_of_python_numbers_keep_float64_precision():
    t = Tensor(np.zeros(3))
    t[0] = 0.1                    # was stored as float32(0.1)
    t.copy_([0.1, 0.2, 0.3])      # was copied through a float32 array
    assert t.data.tolist() == [0.1, 0.2, 0.3]
    t[1] = 0.7
    t.fill_(0.1)
    assert t.data.tolist() == [0.1, 0.1, 0.1]
    t.add_(0.2)
    assert t.data.tolist() == [0.1 + 0.2] * 3
    f = Tensor(np.zeros(2, np.float32))
    f.copy_(np.array([0.1, 0.2]))  # float64 into float32: rounded, as torch
    assert f.dtype == np.float32 and f.data.tolist() == [np.float32(0.1), np.float32(0.2)]


def test_add_in_place_scales_its_operand_by_alpha_as_torch():
    """t.add_(other, alpha=a) is t += a * other (torch's signature; the optimizers' update spelling): with a
    tensor, an array and a number, and alpha 1 left as the plain sum."""
    t = Tensor(np.array([1.0, 2.0, 3.0]))
    t.add_(Tensor(np.array([1.0, 10.0, 100.0])), alpha=-0.5)
    assert t.data.tolist() == [0.5, -3.0, -47.0]
    t.add_(np.array([2.0, 2.0, 2.0]), alpha=2)
    t.add_(1.0, alpha=0.25)
    assert t.data.tolist() == [4.75, 1.25, -42.75]
    t.add_(1.0)
    assert t.data.tolist() == [5.75, 2.25, -41.75] and t._version[0] == 4


def test_in_place_writes_refuse_wrong_values_and_read_only_views():
    t = Tensor(np.ones(3))
    for write, op in ((lambda: t.add_("abc"), "add_"), (lambda: t.mul_(None), "mul_"),
                      (lambda: t.__setitem__(0, "x"), "__setitem__"), (lambda: t.fill_("x"), "fill_"),
                      (lambda: t.copy_(np.array([1j, 2, 3])), "copy_")):
        with pytest.raises(TypeError, match=f"^{op}: the value"):
            write()
    with pytest.raises(RuntimeError, match=r"^add_: this tensor is read-only \(a view from expand"):
        Tensor(np.ones(3)).expand(2, 3).add_(1.0)
    np.testing.assert_array_equal(t.data, [1.0, 1.0, 1.0])


def test_numpy_reductions_and_array_functions_on_tensors():
    x = np.array([[1.0, -2.0], [3.0, 0.5]])
    for function, op in ((np.sum, F.sum), (np.mean, F.mean), (np.max, F.max)):
        out = function(Tensor(x), axis=1)  # NumPy calls the method, with its dtype= / out= keywords
        assert isinstance(out, Tensor)
        np.testing.assert_array_equal(out.data, op(Tensor(x), 1).data)
        gradcheck(lambda t, f=function: f(t, axis=0), x)
    assert np.sum(Tensor(x), dtype=np.float32).dtype == np.float32
    with pytest.raises(TypeError, match="^sum: out= is not supported"):
        np.sum(Tensor(x), out=np.empty(()))
    # other NumPy functions read the array (no copy), as torch; a tensor that requires grad is refused
    np.testing.assert_array_equal(np.concatenate([Tensor(x), Tensor(x)]), np.concatenate([x, x]))
    with pytest.raises(RuntimeError, match="requires grad"):
        np.sort(leaf([2.0, 1.0]))


def test_the_protocols_benchmark_runs():
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "dev" / "numpy_protocols.py"
    spec = importlib.util.spec_from_file_location("numpy_protocols", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--size", "1000", "--repeats", "1", "--json"])
    assert result["size"] == 1000 and set(result["cases"]) >= {"np.asarray(t)", "np.exp(t)", "ids[ids == 0]"}


def test_numpy_scalars_and_integer_arrays_as_arguments():
    x = Tensor(np.array([16777217.0]))  # 2**24 + 1: not a float32
    assert (x / np.int64(16777217)).item() == 1.0 and (np.int64(16777217) / x).item() == 1.0
    assert (Tensor(np.ones(2, np.float32)) / np.int64(3)).dtype == np.float32
    assert F.reshape(Tensor(np.ones(6)), np.array([2, 3])).shape == (2, 3)
    assert F.permute(Tensor(np.ones((2, 3))), np.argsort([1, 0])).shape == (3, 2)
