"""The shape ops' pieces of the op table in tests/support/op_specs.py (reshape to flip): gradient cases and
forward checks as in tests/support/op_checks.py, the forward values compared bit for bit (a shape op moves
elements, it computes nothing)."""
from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .op_references import assert_close, assert_same_elements, gather_ref, row_major
from .strategies import (arrays, axis_arguments, concat_cases, expand_pairs, getitem_cases, reshape_targets,
                        shape_and_axis, shapes)
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F


# --- shape ops: forward values bit for bit --------------------------------------------------------------

def reshape_grad(data):
    shape = data.draw(shapes(), label="shape")
    target = data.draw(reshape_targets(shape), label="target")
    return (lambda t: F.reshape(t, target)), [data.draw(arrays(shape), label="x")]


def reshape_forward(data):
    x = data.draw(arrays(data.draw(shapes())), label="x")
    target = data.draw(reshape_targets(x.shape), label="target")
    known = math.prod(n for n in target if n != -1)
    assert_same_elements(F.reshape(Tensor(x), target), [x.size // known if n == -1 else n for n in target],
                         row_major(x))


def flatten_grad(data):
    shape = data.draw(shapes(min_dims=1), label="shape")
    start = data.draw(st.integers(0, len(shape) - 1), label="start")
    end = data.draw(st.integers(start, len(shape) - 1), label="end")
    return (lambda t: F.flatten(t, start, end)), [data.draw(arrays(shape), label="x")]


def flatten_forward(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    start = data.draw(st.integers(0, x.ndim - 1), label="start")
    end = data.draw(st.integers(start, x.ndim - 1), label="end")
    expected = x.shape[:start] + (math.prod(x.shape[start:end + 1]),) + x.shape[end + 1:]
    assert_same_elements(F.flatten(Tensor(x), start, end - x.ndim), expected, row_major(x))
    assert_same_elements(F.flatten(Tensor(np.array(2.5))), (1,), [2.5])


def permute_grad(data):
    shape = data.draw(shapes(), label="shape")
    axes = data.draw(st.permutations(range(len(shape))), label="axes")
    return (lambda t: F.permute(t, axes)), [data.draw(arrays(shape), label="x")]


def permute_forward(data):
    x = data.draw(arrays(data.draw(shapes())), label="x")
    axes = data.draw(st.permutations(range(x.ndim)), label="axes")

    def source(index):  # out[index] = x[j] with j[axes[d]] = index[d]
        j = [0] * x.ndim
        for d, a in enumerate(axes):
            j[a] = index[d]
        return x[tuple(j)]
    assert_close(F.permute(Tensor(x), axes), gather_ref(tuple(x.shape[a] for a in axes), source), rtol=0, atol=0)


def transpose_grad(data):
    shape = data.draw(shapes(min_dims=2), label="shape")
    axis0, axis1 = (data.draw(st.integers(-len(shape), len(shape) - 1), label=n) for n in ("axis0", "axis1"))
    return (lambda t: F.transpose(t, axis0, axis1)), [data.draw(arrays(shape), label="x")]


def transpose_forward(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    i, j = data.draw(st.integers(-x.ndim, x.ndim - 1)), data.draw(st.integers(-x.ndim, x.ndim - 1))
    swapped = list(range(x.ndim))
    swapped[i], swapped[j] = swapped[j], swapped[i]
    expected = gather_ref(tuple(x.shape[a] for a in swapped), lambda k: x[tuple(k[swapped.index(a)]
                                                                                for a in range(x.ndim))])
    assert_close(F.transpose(Tensor(x), i, j), expected, rtol=0, atol=0)


def expand_grad(data):
    source, target = data.draw(expand_pairs(), label="source, target")
    return (lambda t: F.expand(t, target)), [data.draw(arrays(source), label="x")]


def expand_forward(data):
    source, target = data.draw(expand_pairs(), label="source, target")
    x = data.draw(arrays(source), label="x")
    lead = len(target) - len(source)
    expected = gather_ref(target, lambda i: x[tuple(0 if n == 1 else i[lead + d] for d, n in enumerate(source))])
    assert_close(F.expand(Tensor(x), target), expected, rtol=0, atol=0)


def unsqueeze_grad(data):
    shape = data.draw(shapes(), label="shape")
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="axis")
    return (lambda t: F.unsqueeze(t, axis)), [data.draw(arrays(shape), label="x")]


def unsqueeze_forward(data):
    x = data.draw(arrays(data.draw(shapes(max_side=2))), label="x")
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim), label="unsqueeze axis")
    at = axis % (x.ndim + 1)
    assert_same_elements(F.unsqueeze(Tensor(x), axis), x.shape[:at] + (1,) + x.shape[at:], row_major(x))


def squeeze_grad(data):
    shape = data.draw(shapes(min_side=1, max_side=2), label="shape")  # plenty of size-1 axes
    axis = data.draw(axis_arguments(len(shape)), label="axis")
    return (lambda t: F.squeeze(t, axis)), [data.draw(arrays(shape), label="x")]


def squeeze_forward(data):
    x = data.draw(arrays(data.draw(shapes(max_side=2))), label="x")  # plenty of size-1 axes
    assert_same_elements(F.squeeze(Tensor(x)), [n for n in x.shape if n != 1], row_major(x))
    squeeze_axes = data.draw(axis_arguments(x.ndim), label="squeeze axes")
    if squeeze_axes is not None:
        chosen = {a % max(x.ndim, 1) for a in (squeeze_axes if isinstance(squeeze_axes, tuple) else (squeeze_axes,))}
        expected = [n for d, n in enumerate(x.shape) if not (d in chosen and n == 1)]  # size > 1 axes stay
        assert_same_elements(F.squeeze(Tensor(x), squeeze_axes), expected, row_major(x))


def getitem_grad(data):
    shape, index, kind = data.draw(getitem_cases(), label="shape, index, kind")
    event(f"index kind: {kind}")
    return (lambda t: F.getitem(t, index)), [data.draw(arrays(shape), label="x")]


X43 = np.arange(12.0).reshape(4, 3) * 1.5 - 4.0
L43 = X43.tolist()
ROWS, COLS = [2, 0, 2, -1], [0, 1, 2, 1]
MASK = (np.arange(12).reshape(4, 3) % 5) < 2
GETITEM_CASES = {  # index -> the expected value written with Python lists
    "int": (1, L43[1]), "negative int": (-1, L43[3]), "two ints": ((2, -2), L43[2][1]),
    "slice with step": ((1, slice(None, None, 2)), L43[1][::2]),
    "reversed rows": (slice(None, None, -1), L43[::-1]),
    "ellipsis and None": ((Ellipsis, None, 1), [[r[1]] for r in L43]),
    "integer array": (np.array(ROWS), [L43[r] for r in ROWS]),
    "integer tensor": (Tensor(np.array(ROWS)), [L43[r] for r in ROWS]),
    "integer list": (ROWS, [L43[r] for r in ROWS]),
    "integer tuple at axis 1": ((slice(None), (0, 2, 0)), [[r[0], r[2], r[0]] for r in L43]),
    "integer range": (range(1, 3), L43[1:3]),
    "integer array and slice": ((np.array(ROWS), slice(1, 3)), [L43[r][1:3] for r in ROWS]),
    "two integer arrays": ((np.array(ROWS), np.array(COLS)), [L43[r][c] for r, c in zip(ROWS, COLS)]),
    "bool mask": (MASK, [L43[i][j] for i in range(4) for j in range(3) if MASK[i, j]]),
    "bool rows": (MASK[:, 0], [L43[i] for i in range(4) if MASK[i, 0]]),
}


def getitem_forward(name):
    def check(data):
        index, expected = GETITEM_CASES[name]
        assert_close(F.getitem(Tensor(X43), index), np.array(expected), rtol=0, atol=0)
        assert_close(Tensor(X43)[index], np.array(expected), rtol=0, atol=0)
    return check


def getitem_basic_forward(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    index = data.draw(hnp.basic_indices(x.shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True), label="index")
    assert_close(F.getitem(Tensor(x), index), x[index], rtol=0, atol=0)  # NumPy's indexing is the definition


def cat_grad(data):
    shape_list, axis = data.draw(concat_cases(same_shape=False), label="shapes, axis")
    inputs = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(shape_list)]
    return (lambda *ts: F.cat(ts, axis)), inputs


def cat_forward(data):
    shape_list, axis = data.draw(concat_cases(same_shape=False, min_side=0), label="shapes, axis")
    pieces = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(shape_list)]
    axis %= pieces[0].ndim
    shape = list(pieces[0].shape)
    shape[axis] = sum(p.shape[axis] for p in pieces)
    expected, start = np.full(shape, np.nan), 0
    for p in pieces:  # each piece written into its own stretch of the axis
        expected[(slice(None),) * axis + (slice(start, start + p.shape[axis]),)] = p
        start += p.shape[axis]
    assert_close(F.cat([Tensor(p) for p in pieces], axis), expected, rtol=0, atol=0)


def stack_grad(data):
    shape_list, _ = data.draw(concat_cases(same_shape=True), label="shapes")
    axis = data.draw(st.integers(-len(shape_list[0]) - 1, len(shape_list[0])), label="stack axis")
    inputs = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(shape_list)]
    return (lambda *ts: F.stack(ts, axis)), inputs


def stack_forward(data):
    shape_list, _ = data.draw(concat_cases(same_shape=True), label="shapes")
    pieces = [data.draw(arrays(s), label=f"x{i}") for i, s in enumerate(shape_list)]
    axis = data.draw(st.integers(-pieces[0].ndim - 1, pieces[0].ndim), label="axis")
    at = axis % (pieces[0].ndim + 1)
    expected = gather_ref(pieces[0].shape[:at] + (len(pieces),) + pieces[0].shape[at:],
                          lambda i: pieces[i[at]][i[:at] + i[at + 1:]])
    assert_close(F.stack([Tensor(p) for p in pieces], axis), expected, rtol=0, atol=0)


def split_grad(data):
    shape, axis = data.draw(shape_and_axis(), label="shape, axis")
    n = shape[axis]
    sections = data.draw(st.one_of(st.integers(1, n + 1), st.lists(st.integers(0, n), min_size=1, max_size=3)
                                   .map(lambda cuts: np.diff([0, *sorted(cuts), n]).tolist())), label="sections")

    def split_then_join(t):  # each piece scaled differently, so a gradient routed to the wrong piece shows
        pieces = F.split(t, sections, axis)
        return F.cat([p * float(i + 1) for i, p in enumerate(pieces)], axis)
    return split_then_join, [data.draw(arrays(shape), label="x")]


def split_forward(data):
    shape, axis = data.draw(shape_and_axis(), label="shape, axis")
    x = data.draw(arrays(shape), label="x")
    n, axis = shape[axis], axis % len(shape)
    size = data.draw(st.integers(1, n + 1), label="size")
    sections = data.draw(st.lists(st.integers(0, n), max_size=3).map(lambda c: np.diff([0, *sorted(c), n]).tolist()))
    for argument, sizes in ((size, [min(size, n - s) for s in range(0, n, size)]), (sections, sections)):
        pieces = F.split(Tensor(x), argument, axis - len(shape))
        assert len(pieces) == len(sizes)
        starts = list(itertools.accumulate([0] + sizes))
        for piece, start, length in zip(pieces, starts, sizes):
            expected = gather_ref(shape[:axis] + (length,) + shape[axis + 1:],
                                  lambda i: x[i[:axis] + (start + i[axis],) + i[axis + 1:]])
            assert_close(piece, expected, rtol=0, atol=0)


def pad_grad(data):
    value = data.draw(st.sampled_from([0.0, -1.5]), label="value")
    shape = data.draw(shapes(min_dims=1), label="shape")
    pad = data.draw(st.lists(st.integers(0, 2), min_size=0, max_size=2 * len(shape))
                    .filter(lambda p: len(p) % 2 == 0), label="pad")
    return (lambda t: F.pad(t, pad, value)), [data.draw(arrays(shape), label="x")]


def pad_forward(data):
    # written as "fill, then copy the middle in": the op itself calls np.pad
    value = data.draw(st.sampled_from([0.0, -1.5]), label="value")
    x = data.draw(arrays(data.draw(shapes(min_dims=1))), label="x")
    pad = data.draw(st.lists(st.integers(0, 2), max_size=2 * x.ndim).filter(lambda p: len(p) % 2 == 0), label="pad")
    before, after = [0] * x.ndim, [0] * x.ndim
    for i in range(len(pad) // 2):  # torch order: the last axis first
        before[x.ndim - 1 - i], after[x.ndim - 1 - i] = pad[2 * i], pad[2 * i + 1]
    expected = np.full([b + n + a for b, n, a in zip(before, x.shape, after)], value)
    expected[tuple(slice(b, b + n) for b, n in zip(before, x.shape))] = x
    assert_close(F.pad(Tensor(x), pad, value), expected, rtol=0, atol=0)


def flip_grad(data):
    shape = data.draw(shapes(), label="shape")
    axis = data.draw(axis_arguments(len(shape)), label="axis")
    return (lambda t: F.flip(t, axis)), [data.draw(arrays(shape), label="x")]


def flip_forward(data):
    x = data.draw(arrays(data.draw(shapes())), label="x")
    axis = data.draw(axis_arguments(x.ndim), label="axis")
    flipped = (set(range(x.ndim)) if axis is None else
               {a % max(x.ndim, 1) for a in (axis if isinstance(axis, tuple) else (axis,))})
    expected = gather_ref(x.shape, lambda i: x[tuple(n - 1 - j if d in flipped else j
                                                      for d, (j, n) in enumerate(zip(i, x.shape)))])
    assert_close(F.flip(Tensor(x), axis), expected, rtol=0, atol=0)
