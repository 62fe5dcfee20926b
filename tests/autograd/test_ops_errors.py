"""Bad input fails loudly: the exception type is the one NumPy/PyTorch users expect, and the message names
the op and the shapes involved (nothing is silently broadcast wrong). A wrong type in any argument of any op
(swept over the examples of tests/support/op_specs.py) is a TypeError naming the op and the argument."""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from tests.support.op_references import strict_floats
from tests.support.op_specs import SPECS
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F


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


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "logsumexp"])
def test_reductions_take_keepdims_as_a_bool_only(op):
    """keepdims="yes" reached NumPy, which read the str as an int (found by an API fuzz)."""
    with raises_naming(TypeError, op, "keepdims", "'yes'"):
        getattr(F, op)(t(2, 3), 1, "yes")
    assert getattr(F, op)(t(2, 3), 1, np.bool_(True)).shape == (2, 1)


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
    with raises_naming(TypeError, "cross_entropy", "targets", "class indices", "probability targets"):
        F.cross_entropy(logits, np.full((4, 5), 0.2))                  # torch's soft labels: refused, and said so
    with raises_naming(ValueError, "cross_entropy", "'avg'"):
        F.cross_entropy(logits, np.zeros(4, np.int64), reduction="avg")


def test_causal_conv1d_and_rms_norm_reject_mismatched_parameters():
    with raises_naming(ValueError, "causal_conv1d", "(2, 5, 3)", "(4, 1, 2)"):
        F.causal_conv1d(t(2, 5, 3), t(4, 1, 2))
    with raises_naming(ValueError, "causal_conv1d", "(5, 3)"):
        F.causal_conv1d(t(5, 3), t(3, 1, 2))
    with raises_naming(ValueError, "causal_conv1d", "(3,)", "(2,)"):
        F.causal_conv1d(t(2, 5, 3), t(3, 1, 2), t(2))
    for empty in ((3, 1, 0), (3, 0)):                                   # NumPy's pad said "negative values"
        with raises_naming(ValueError, "causal_conv1d", "k >= 1", str(empty)):
            F.causal_conv1d(t(2, 5, 3), t(*empty))
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
    assert not F.cast(x, np.int64).requires_grad   # as torch: the cast ends the graph (test_porting.py)


# --- wrong types: every op, every tensor argument ---------------------------------------------------------

BAD_VALUES = {"str": "abc", "None": None, "object array": np.array([object(), object()], dtype=object),
              "complex array": np.array([1 + 2j, 3.0]), "ragged list": [[1.0, 2.0], [3.0]]}


def _tensor_arguments(name):
    """(position, argument name, example value, whether None is allowed) for each argument of the op's
    example that is a tensor, an array or a list of tensors (cat, stack); names from the signature of
    functional.<name>."""
    parameters = list(inspect.signature(getattr(F, name)).parameters.values())
    for position, value in enumerate(SPECS[name].example()):
        parameter = parameters[min(position, len(parameters) - 1)]
        label = (f"{parameter.name}[{position - parameters.index(parameter)}]"
                 if parameter.kind is inspect.Parameter.VAR_POSITIONAL else parameter.name)
        if isinstance(value, (Tensor, np.ndarray)) or (isinstance(value, list) and value and
                                                       isinstance(value[0], Tensor)):
            yield position, label, value, parameter.default is None  # an optional bias or weight


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_every_op_names_the_argument_of_a_wrong_type(name, bad):
    """A str, None, an object array, complex numbers or a ragged list in place of any tensor argument of any
    op (in place of one element of a list of tensors too) is a TypeError that starts with the op's name and
    names the argument, never a raw NumPy error."""
    arguments = list(_tensor_arguments(name))
    assert arguments, f"{name}'s example has no tensor argument to sweep"
    for position, label, value, optional in arguments:
        replacements = []
        if not (optional and bad == "None") and not (isinstance(value, list) and bad == "ragged list"):
            replacements.append((label, BAD_VALUES[bad]))  # (None: no bias; a list of lists: a list of tensors)
        if isinstance(value, list):  # one element of a list of tensors
            replacements.append((f"{label}[1]", [value[0], BAD_VALUES[bad]]))
        for expected_label, replacement in replacements:
            call = SPECS[name].example()
            call = call[:position] + (replacement,) + call[position + 1:]
            with pytest.raises(TypeError) as error:
                getattr(F, name)(*call)
            message = str(error.value)
            assert message.startswith(f"{name}: "), f"{name}({expected_label}={bad}): {message!r}"
            assert expected_label in message, f"{name}({expected_label}={bad}) doesn't name it: {message!r}"


@pytest.mark.parametrize("expression, fragments", [
    (lambda: F.reshape(t(2, 3), None), ("shape", "NoneType")),
    (lambda: F.reshape(t(2, 3), (True, 6)), ("shape", "(True, 6)")),          # a bool is no size
    (lambda: F.permute(t(2, 3), (True, False)), ("axes", "(True, False)")),
    (lambda: F.permute(t(2, 3), "ab"), ("axes", "str")),
    (lambda: F.expand(t(1, 3), None), ("shape",)),
    (lambda: F.pad(t(2, 3), None), ("pad",)),
    (lambda: F.pad(t(2, 3), (1, 1), value="x"), ("value",)),
    (lambda: F.split(t(4), None), ("split_size_or_sections",)),
    (lambda: F.clip(t(3), "a", None), ("min",)),
    (lambda: F.softplus(t(3), beta=None), ("beta",)),
    (lambda: F.rms_norm(t(2, 3), eps="x"), ("eps",)),
    (lambda: F.tril(t(3, 3), k=None), ("k",)),
    (lambda: F.cast(t(3), None), ("dtype",)),
    (lambda: F.cast(t(3), "complex64"), ("dtype", "complex64")),
    (lambda: F.cast(t(3), "not a dtype"), ("dtype",)),
    (lambda: F.einsum(None, t(2, 3)), ("subscripts",)),
    (lambda: F.cross_entropy(t(2, 3), np.array([0, 1]), ignore_index=None), ("ignore_index",)),
    (lambda: F.cat(t(2, 3)), ("tensors", "list or tuple")),
    (lambda: F.stack(None), ("tensors",)),
], ids=["reshape", "reshape of bools", "permute of bools", "permute", "expand", "pad", "pad value", "split", "clip",
        "softplus", "rms_norm", "tril",
        "cast None", "cast complex", "cast unknown", "einsum", "cross_entropy", "cat of a tensor", "stack"])
def test_non_tensor_arguments_of_a_wrong_type(expression, fragments):
    with pytest.raises(TypeError) as error:
        expression()
    assert all(f in str(error.value) for f in fragments), str(error.value)


# --- 0-d inputs and empty reductions --------------------------------------------------------------------

def test_0d_inputs_to_cat_and_cross_entropy():
    with raises_naming(ValueError, "cat", "tensors[1] is 0-d", "stack"):
        F.cat([t(2), t()])
    with raises_naming(ValueError, "cross_entropy", "class axis", "0-d"):
        F.cross_entropy(t(), np.array(0))
    # unbatched (C,) logits with a 0-d target are fine, as torch
    assert F.cross_entropy(Tensor(np.array([0.0, 0.0])), np.array(1)).item() == pytest.approx(np.log(2))
    with raises_naming(ValueError, "rms_norm", "0-d"):
        F.rms_norm(t())
    with raises_naming(ValueError, "split", "0-d"):
        F.split(t(), 1)
    pieces = F.split(t(0, 3), 2)  # an empty axis: one empty piece, as torch
    assert len(pieces) == 1 and pieces[0].shape == (0, 3)


def test_max_of_an_empty_axis_raises_naming_it():
    with raises_naming(ValueError, "max", "axis 0", "(0, 3)", "empty"):
        F.max(t(0, 3), axis=0)
    with raises_naming(ValueError, "max", "the tensor", "(0,)"):
        F.max(t(0))
    out = F.max(t(0, 3), axis=1)  # reducing the non-empty axis of an empty tensor: an empty result (torch)
    assert out.shape == (0,)


def test_reductions_over_no_elements_as_torch():
    with strict_floats():  # no NumPy warnings either
        assert np.isnan(F.mean(t(0)).item())
        np.testing.assert_array_equal(F.mean(t(2, 0), axis=1).data, [np.nan, np.nan])
        assert F.sum(t(0)).item() == 0.0
        assert F.logsumexp(t(0)).item() == -np.inf
        np.testing.assert_array_equal(F.logsumexp(t(2, 0), axis=1).data, [-np.inf, -np.inf])
        assert F.softmax(t(2, 0), -1).shape == (2, 0) and F.log_softmax(t(0, 3), 0).shape == (0, 3)
        assert F.cumsum(t(0), 0).shape == (0,)
        assert np.isnan(F.cross_entropy(t(0, 3), np.zeros(0, np.int64)).item())
        x = Tensor(np.ones((2, 0)), requires_grad=True)
        F.mean(x, axis=1).sum().backward()
        assert x.grad.shape == (2, 0)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("kind", ["0-d", "empty"])
def test_every_op_on_a_0d_or_empty_input_works_or_names_itself(name, kind):
    """The first tensor argument of each op's example made 0-d (or empty along its first axis): the op
    either gives a result whose backward runs without a NumPy warning, or raises an error that starts
    with the op's name, never a raw NumPy or Python error."""
    def shrink(x):
        return Tensor(np.array(0.5) if kind == "0-d" else np.zeros((0,) + x.shape[1:]), requires_grad=True)
    arguments = list(SPECS[name].example())
    position = next(i for i, a in enumerate(arguments) if isinstance(a, (Tensor, list)))
    value = arguments[position]
    arguments[position] = [shrink(t) for t in value] if isinstance(value, list) else shrink(value)
    try:
        with strict_floats():
            out = getattr(F, name)(*arguments)
            for piece in (out if isinstance(out, tuple) else (out,)):
                if piece.requires_grad:
                    piece.sum().backward()
    except (ValueError, IndexError, TypeError) as error:
        assert str(error).startswith(f"{name}: "), f"{name} on a {kind} input: {type(error).__name__}: {error}"
