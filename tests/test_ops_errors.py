"""Bad input fails loudly: the exception type is the one NumPy/PyTorch users expect, and the message names
the op and the shapes involved (nothing is silently broadcast wrong)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tinygrad_ssm import Tensor
from tinygrad_ssm import functional as F


def t(*shape, dtype=np.float64):
    return Tensor(np.ones(shape, dtype=dtype))


def raises_naming(exception, op: str, *fragments: str):
    """pytest.raises that also checks the message starts with the op's name and contains every fragment
    (shapes, axes, letters) verbatim."""
    pattern = "^" + re.escape(op + ":") + "".join(f"(?s:.*){re.escape(f)}" for f in fragments)
    return pytest.raises(exception, match=pattern)


# --- broadcasting ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary_ops_reject_shapes_that_do_not_broadcast(op):
    with raises_naming(ValueError, op, "(2, 3)", "(4,)", "do not broadcast"):
        getattr(F, op)(t(2, 3), t(4))


def test_operators_reject_shapes_that_do_not_broadcast():
    with raises_naming(ValueError, "add", "(3, 2)", "(3,)"):
        t(3, 2) + t(3)
    with raises_naming(ValueError, "mul", "(5,)", "(2, 1, 4)"):
        np.ones(5) * t(2, 1, 4)  # an ndarray on the left defers to Tensor's reflected operator


def test_where_rejects_shapes_that_do_not_broadcast_and_non_bool_conditions():
    with raises_naming(ValueError, "where", "(2,)", "(3,)", "(4,)"):
        F.where(np.ones(2, bool), t(3), t(4))
    with raises_naming(TypeError, "where", "float64"):
        F.where(np.ones(3), t(3), t(3))


def test_expand_rejects_a_target_the_shape_does_not_broadcast_to():
    with raises_naming(ValueError, "expand", "(2, 3)", "(4, 3)"):
        F.expand(t(2, 3), (4, 3))
    with raises_naming(ValueError, "expand", "(2, 3)", "(3,)"):
        F.expand(t(2, 3), (3,))


# --- linear algebra -------------------------------------------------------------------------------------

def test_matmul_inner_size_mismatch():
    with raises_naming(ValueError, "matmul", "(2, 3)", "(4, 5)"):
        F.matmul(t(2, 3), t(4, 5))
    with raises_naming(ValueError, "matmul", "(3,)", "(2,)"):
        t(3) @ t(2)


def test_matmul_batch_mismatch_and_scalars():
    with raises_naming(ValueError, "matmul", "batch", "(2, 2, 3)", "(3, 3, 4)"):
        F.matmul(t(2, 2, 3), t(3, 3, 4))
    with raises_naming(ValueError, "matmul", "()", "(3,)"):
        F.matmul(t(), t(3))


def test_einsum_size_mismatch_and_bad_subscripts():
    with raises_naming(ValueError, "einsum", "'j'", "3", "4", "(2, 3)", "(4, 5)"):
        F.einsum("ij,jk->ik", t(2, 3), t(4, 5))
    with raises_naming(ValueError, "einsum", "'ijk'", "(2, 3)"):
        F.einsum("ijk->i", t(2, 3))
    with raises_naming(ValueError, "einsum", "2 operands", "got 1"):
        F.einsum("ij,jk->ik", t(2, 3))
    with raises_naming(ValueError, "einsum", "'iz'"):
        F.einsum("ij->iz", t(2, 3))


# --- axes -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["sum", "mean", "max", "logsumexp", "flip"])
def test_reductions_reject_an_axis_out_of_range(op):
    with raises_naming(IndexError, op, "axis 2", "(2, 3)"):
        getattr(F, op)(t(2, 3), axis=2)
    with raises_naming(IndexError, op, "axis -3", "(2, 3)"):
        getattr(F, op)(t(2, 3), axis=(0, -3))


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cumsum"])
def test_along_axis_ops_reject_an_axis_out_of_range(op):
    with raises_naming(IndexError, op, "axis 3", "(4, 5)"):
        getattr(F, op)(t(4, 5), 3)


def test_a_0d_tensor_takes_only_axis_0_or_minus_1():
    with raises_naming(IndexError, "sum", "axis 1", "()"):
        F.sum(t(), axis=1)
    with raises_naming(IndexError, "softmax", "axis -2", "()"):
        F.softmax(t(), -2)


def test_repeated_and_non_integer_axes():
    with raises_naming(ValueError, "sum", "repeats", "(2, 3)"):
        F.sum(t(2, 3), axis=(1, -1))
    with raises_naming(TypeError, "mean", "1.5", "(2, 3)"):
        F.mean(t(2, 3), axis=1.5)


def test_shape_ops_reject_bad_axes():
    with raises_naming(IndexError, "transpose", "axis 2", "(2, 3)"):
        F.transpose(t(2, 3), 0, 2)
    with raises_naming(ValueError, "permute", "(0, 0)", "(2, 3)"):
        F.permute(t(2, 3), (0, 0))
    with raises_naming(IndexError, "unsqueeze", "axis 3", "(2, 3)"):
        F.unsqueeze(t(2, 3), 3)
    with raises_naming(IndexError, "squeeze", "axis 5", "(1, 3)"):
        F.squeeze(t(1, 3), 5)
    with raises_naming(IndexError, "cat", "axis 1", "(3,)"):
        F.cat([t(3), t(3)], axis=1)
    with raises_naming(IndexError, "stack", "axis 3", "(2, 2)"):
        F.stack([t(2, 2), t(2, 2)], axis=3)
    with raises_naming(IndexError, "split", "axis 1", "(4,)"):
        F.split(t(4), 2, axis=1)
    with raises_naming(IndexError, "flatten", "axis 2", "(2, 2)"):
        F.flatten(t(2, 2), 0, 2)


# --- shapes of shape ops --------------------------------------------------------------------------------

def test_bad_reshape():
    with raises_naming(ValueError, "reshape", "(2, 3)", "6 elements", "(4,)"):
        F.reshape(t(2, 3), (4,))
    with raises_naming(ValueError, "reshape", "(2, 3)", "(-1, -1)"):
        t(2, 3).reshape(-1, -1)
    with raises_naming(ValueError, "reshape", "(2, 3)", "(4, -1)"):
        t(2, 3).reshape(4, -1)


def test_cat_stack_split_pad_triangles_reject_mismatched_shapes():
    with raises_naming(ValueError, "cat", "(2, 3)", "(2, 4)", "axis 0"):
        F.cat([t(2, 3), t(2, 4)], axis=0)
    with raises_naming(ValueError, "stack", "(2, 3)", "(3, 2)"):
        F.stack([t(2, 3), t(3, 2)])
    with raises_naming(ValueError, "split", "[1, 1]", "3", "(3, 2)"):
        F.split(t(3, 2), [1, 1])
    with raises_naming(ValueError, "pad", "(1, 1, 1, 1, 1, 1)", "(2, 2)"):
        F.pad(t(2, 2), (1, 1, 1, 1, 1, 1))
    with raises_naming(ValueError, "tril", "(3,)"):
        F.tril(t(3))
    with raises_naming(ValueError, "triu", "(3,)"):
        F.triu(t(3))


# --- indexing -------------------------------------------------------------------------------------------

def test_index_out_of_range():
    with raises_naming(IndexError, "getitem", "5", "(3, 2)"):
        t(3, 2)[5]
    with raises_naming(IndexError, "getitem", "(3, 2)"):
        t(3, 2)[np.array([0, 3])]
    with raises_naming(IndexError, "getitem", "(3, 2)"):
        t(3, 2)[0, 0, 0]
    with raises_naming(IndexError, "getitem", "float64"):
        t(3)[np.array([0.0, 1.0])]


def test_embedding_rejects_ids_out_of_range_and_float_ids():
    with raises_naming(IndexError, "embedding", "(4, 2)", "max 4", "(3,)"):
        F.embedding(np.array([0, 1, 4]), t(4, 2))
    with raises_naming(IndexError, "embedding", "min -1"):
        F.embedding(np.array([-1]), t(4, 2))
    with raises_naming(TypeError, "embedding", "float64"):
        F.embedding(np.array([0.0]), t(4, 2))
    with raises_naming(ValueError, "embedding", "(4,)"):
        F.embedding(np.array([0]), t(4))


# --- losses and layers ----------------------------------------------------------------------------------

def test_cross_entropy_bad_targets():
    logits = t(4, 5)
    with raises_naming(IndexError, "cross_entropy", "7", "5 classes", "(4, 5)", "(4,)"):
        F.cross_entropy(logits, np.array([0, 1, 7, 2]))
    with raises_naming(IndexError, "cross_entropy", "-2", "(4, 5)"):
        F.cross_entropy(logits, np.array([0, 1, -2, 2]))
    with raises_naming(ValueError, "cross_entropy", "(4, 5)", "(4,)", "(4, 1)"):
        F.cross_entropy(logits, np.zeros((4, 1), np.int64))  # would broadcast silently in a naive version
    with raises_naming(TypeError, "cross_entropy", "float64"):
        F.cross_entropy(logits, np.zeros(4))
    with raises_naming(ValueError, "cross_entropy", "'avg'"):
        F.cross_entropy(logits, np.zeros(4, np.int64), reduction="avg")


def test_causal_conv1d_and_rms_norm_reject_mismatched_parameters():
    with raises_naming(ValueError, "causal_conv1d", "(2, 5, 3)", "(4, 1, 2)"):
        F.causal_conv1d(t(2, 5, 3), t(4, 1, 2))
    with raises_naming(ValueError, "causal_conv1d", "(5, 3)"):
        F.causal_conv1d(t(5, 3), t(3, 1, 2))
    with raises_naming(ValueError, "causal_conv1d", "(3,)", "(2,)"):
        F.causal_conv1d(t(2, 5, 3), t(3, 1, 2), t(2))
    with raises_naming(ValueError, "rms_norm", "(4,)", "(3,)"):
        F.rms_norm(t(2, 4), t(3))


# --- tensor-level misuse --------------------------------------------------------------------------------

def test_integer_tensor_cannot_require_grad_and_grad_must_match_shape():
    with raises_naming(TypeError, "requires_grad", "int64"):
        Tensor(np.arange(3), requires_grad=True)
    x = Tensor(np.ones(3), requires_grad=True)
    with raises_naming(ValueError, "grad", "(2,)", "(3,)"):
        x.grad = np.ones(2)
    with raises_naming(RuntimeError, "backward", "(2,)", "(3,)"):
        (x * 2).backward(gradient=np.ones(2))
    with raises_naming(ValueError, "copy_", "(2,)", "(3,)"):
        Tensor(np.ones(3)).copy_(np.ones(2))
    with raises_naming(TypeError, "cast", "int64"):
        F.cast(x, np.int64)
