"""Engine errors that still spoke NumPy (issue 24, class 10): the in-place ops, item assignment, indexing with
a boolean mask or too many indices, and a ragged Tensor(...) now name the op and the shapes, as every other op
does (tests/autograd/test_ops_errors.py: the message starts with "op:" and holds the shapes verbatim). The
in-place ops and __setitem__ are Tensor methods, not ops of functional.OPS, so they have no entry in
tests/support/op_specs.py."""
import numpy as np
import pytest

from tests.autograd.test_ops_errors import raises_naming, t
from tinygrad_ssm import Tensor


@pytest.mark.parametrize("method", ["add_", "sub_", "mul_", "div_"])
def test_in_place_ops_name_themselves_and_both_shapes(method):
    x = t(2, 3)
    with raises_naming(ValueError, method, "(4, 5)", "(2, 3)"):
        getattr(x, method)(t(4, 5))
    with raises_naming(ValueError, method, "(4, 1, 3)", "(4, 2, 3)", "(2, 3)"):  # broadcasts, to a larger shape
        getattr(x, method)(np.ones((4, 1, 3)))
    assert np.array_equal(x.data, np.ones((2, 3)))                    # and nothing was written


@pytest.mark.parametrize("operator,method", [("__iadd__", "add_"), ("__isub__", "sub_"), ("__imul__", "mul_"),
                                             ("__itruediv__", "div_")])
def test_augmented_assignment_names_the_op(operator, method):
    with raises_naming(ValueError, method, "(4, 5)", "(2, 3)"):
        getattr(t(2, 3), operator)(t(4, 5))


def test_setitem_names_the_value_and_the_indexed_shapes():
    x = t(2, 3)
    with raises_naming(ValueError, "__setitem__", "(5,)", "(3,)", "(2, 3)"):
        x[0] = np.ones(5)
    with raises_naming(ValueError, "__setitem__", "(3,)", "(2,)", "(2, 3)"):
        x[:, 0] = Tensor(np.ones(3))
    with raises_naming(IndexError, "__setitem__", "index 5", "size 2", "(2, 3)"):
        x[5] = 1.0
    assert np.array_equal(x.data, np.ones((2, 3)))


def test_getitem_with_a_boolean_mask_or_too_many_indices_names_the_shapes():
    with raises_naming(IndexError, "getitem", "(3,)", "axis 0", "size 2", "(2, 3)"):
        t(2, 3)[np.array([True, False, True])]
    with raises_naming(IndexError, "getitem", "3 indices", "(2, 3)"):
        t(2, 3)[0, 0, 0]


def test_ragged_data_names_tensor():
    with pytest.raises(ValueError, match=r"^Tensor: .*ragged"):
        Tensor([[1.0, 2.0], [3.0]])
