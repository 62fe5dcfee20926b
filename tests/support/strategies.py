"""Hypothesis strategies for the op tests: small shapes, shapes that broadcast together, and float64 arrays
whose values stay away from each op's kinks (finite differences across a kink measure nothing useful).

Values are bounded (no NaN/inf), shapes are small (gradcheck perturbs every entry), and every array is
float64, because gradcheck's tolerances are meant for float64.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

MAX_DIMS = 3
MAX_SIDE = 4


# --- shapes ----------------------------------------------------------------------------------------------

def shapes(min_dims: int = 0, max_dims: int = MAX_DIMS, min_side: int = 1, max_side: int = MAX_SIDE):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcastable_shapes(num_shapes: int = 2, min_dims: int = 0, max_dims: int = MAX_DIMS):
    """Tuples of `num_shapes` shapes that broadcast together (size-1 axes and missing leading axes included)."""
    return hnp.mutually_broadcastable_shapes(num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims,
                                             min_side=1, max_side=MAX_SIDE).map(lambda r: r.input_shapes)


# --- values ----------------------------------------------------------------------------------------------

def _floats(lo: float, hi: float):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def smooth(lo: float = -3.0, hi: float = 3.0):
    """Any value in [lo, hi], for ops that are smooth everywhere (exp, tanh, mul, ...)."""
    return _floats(lo, hi)


def positive(lo: float = 0.2, hi: float = 3.0):
    """Strictly positive values: log, sqrt, rsqrt and the base of pow."""
    return _floats(lo, hi)


def away_from_zero(lo: float = 0.1, hi: float = 3.0):
    """|value| in [lo, hi] with either sign: abs and relu have their kink at 0, div divides by it."""
    return st.one_of(_floats(lo, hi), _floats(-hi, -lo))


def away_from(points, margin: float = 0.1, lo: float = -3.0, hi: float = 3.0):
    """Values in [lo, hi] at least `margin` from every kink in `points` (e.g. clip's bounds)."""
    edges = [lo] + [edge for p in sorted(points) for edge in (p - margin, p + margin)] + [hi]
    pieces = [_floats(a, b) for a, b in zip(edges[::2], edges[1::2]) if a < b]
    return st.one_of(*pieces)


def arrays(shape, elements=None):
    """A float64 array of `shape` with bounded values."""
    return hnp.arrays(np.float64, shape, elements=elements if elements is not None else smooth())


def distinct_arrays(shape, spacing: float = 0.1):
    """Float64 values on a grid `spacing` apart, all different: max has no ties to split."""
    size = int(np.prod(shape))
    return hnp.arrays(np.int64, shape, elements=st.integers(-10 * size - 10, 10 * size + 10), unique=True
                      ).map(lambda a: a * spacing)


@st.composite
def untied_pair(draw, shape_pairs):
    """Two arrays that broadcast together and are never equal (nor close) at any broadcast position:
    a sits on the grid k * 0.2, b on the grid k * 0.2 + 0.1, each with jitter below 0.03, so |a - b| > 0.04.
    That keeps maximum/minimum away from their kink a == b."""
    shape_a, shape_b = draw(shape_pairs)
    jitter = _floats(-0.03, 0.03)
    grid = st.integers(-15, 15)
    a = draw(hnp.arrays(np.int64, shape_a, elements=grid)) * 0.2 + draw(arrays(shape_a, jitter))
    b = draw(hnp.arrays(np.int64, shape_b, elements=grid)) * 0.2 + 0.1 + draw(arrays(shape_b, jitter))
    return a, b



@st.composite
def where_inputs(draw):
    """(condition, x, y) for where(): a bool mask and two float64 arrays, all three broadcasting together."""
    shape_c, shape_x, shape_y = draw(broadcastable_shapes(3))
    return draw(hnp.arrays(np.bool_, shape_c)), draw(arrays(shape_x)), draw(arrays(shape_y))


# --- axes ------------------------------------------------------------------------------------------------

def axis_arguments(ndim: int):
    """What a reduction accepts as axis=: None, one axis (negative too) or a tuple of distinct axes.
    A 0-d tensor takes axis 0 or -1, as in torch."""
    if ndim == 0:
        return st.sampled_from([None, 0, -1, (0,), (-1,)])
    single = st.integers(-ndim, ndim - 1)
    return st.one_of(st.none(), single, hnp.valid_tuple_axes(ndim, min_size=1))


@st.composite
def shape_and_axis(draw, min_dims: int = 1, max_dims: int = MAX_DIMS):
    """A shape and one valid (possibly negative) axis of it (0 or -1 for a 0-d shape, as in torch)."""
    shape = draw(shapes(min_dims=min_dims, max_dims=max_dims))
    ndim = max(len(shape), 1)
    return shape, draw(st.integers(-ndim, ndim - 1))


@st.composite
def reshape_targets(draw, shape):
    """Another shape with the same number of elements, sometimes with one -1 to infer."""
    remaining, target = int(np.prod(shape)), []
    for _ in range(draw(st.integers(0, 3))):
        divisors = [d for d in range(1, remaining + 1) if remaining % d == 0]
        d = draw(st.sampled_from(divisors))
        target.append(d)
        remaining //= d
    target.append(remaining)
    target = draw(st.permutations(target))
    if draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return tuple(target)


@st.composite
def expand_pairs(draw):
    """(input shape, target shape): the input has some of the target's axes set to 1 and may miss leading ones."""
    target = draw(shapes(min_dims=1))
    lead = draw(st.integers(0, len(target)))
    ones = draw(st.lists(st.booleans(), min_size=len(target) - lead, max_size=len(target) - lead))
    source = tuple(1 if one else n for one, n in zip(ones, target[lead:]))
    return source, target


@st.composite
def matmul_shapes(draw):
    """(shape_a, shape_b) for a @ b: batch axes that broadcast, or 1-d operands (a row / a column)."""
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch_a, batch_b = draw(broadcastable_shapes(2, max_dims=2))
    a = (k,) if draw(st.integers(0, 3)) == 3 else batch_a + (m, k)  # mostly matrices, 1-d now and then
    b = (k,) if draw(st.integers(0, 3)) == 3 else batch_b + (k, n)
    return a, b


# The contractions Mamba-2's SSD needs (ssd_minimal's einsums) plus the classic ones, with and without "->".
EINSUM_SPECS = (
    "ij,jk->ik", "bij,bjk->bik", "i,i->", "i,j->ij", "ij->i", "ij->", "ij", "ij,jk",
    "...ij,...jk->...ik", "bhcl,bclhp->bchp",
    "bclhn,bcshn->bclhs",                     # C . B within a chunk
    "bclhs,bcshp->bclhp",                     # (L * CB) . x
    "bclhn,bcshn,bhcls,bcshp->bclhp",         # Y_diag in one shot
    "bclhn,bhcl,bclhp->bchpn",                # chunk states
    "bhzc,bchpn->bzhpn",                      # inter-chunk recurrence
    "bclhn,bchpn,bhcl->bclhp",                # state -> output (Y_off)
)


@st.composite
def einsum_shapes(draw, spec: str):
    """Operand shapes for `spec`: a size per letter; sometimes 1 in one operand, broadcast against the others."""
    inputs = spec.split("->")[0].split(",")
    ellipsis = draw(shapes(min_dims=0, max_dims=2, max_side=2))
    letters = sorted(set("".join(inputs).replace(".", "")))
    biggest = 3 if len(letters) <= 3 else 2  # the 4- and 5-letter SSD contractions stay small
    sizes = {c: draw(st.integers(1, biggest)) for c in letters}
    shape_list = []
    for operand in inputs:
        lead = ellipsis if "..." in operand else ()
        # now and then an operand has size 1 where the others have more: einsum broadcasts it
        shape_list.append(lead + tuple(1 if draw(st.integers(0, 4)) == 4 else sizes[c]
                                       for c in operand.replace("...", "")))
    return tuple(shape_list)


@st.composite
def getitem_cases(draw):
    """(shape, index, kind): basic indexing (ints, slices with steps, None, Ellipsis), integer arrays (repeats
    make the scatter-add matter), integer arrays mixed with a slice, a tuple of ints at some axis (a sequence
    is an index array too), an int and an integer array with a slice between them (torch applies the int first),
    or a bool mask."""
    shape = draw(shapes(min_dims=1))
    kind = draw(st.sampled_from(["basic", "integer", "mixed", "tuple", "int then array", "mask"]))
    if kind == "int then array" and len(shape) < 3:
        kind = "tuple"
    if kind == "basic":
        index = draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    elif kind == "integer":
        index = draw(hnp.integer_array_indices(shape, result_shape=shapes(min_dims=1, max_dims=2)))
    elif kind == "mixed":
        rows = draw(hnp.arrays(np.int64, draw(shapes(min_dims=1, max_dims=2)),
                               elements=st.integers(-shape[0], shape[0] - 1)))
        index = (rows,) + (slice(None, None, -1),) * (len(shape) > 1)
    elif kind == "tuple":
        axis = draw(st.integers(0, len(shape) - 1))
        picks = draw(st.lists(st.integers(-shape[axis], shape[axis] - 1), min_size=1, max_size=4))
        index = (slice(None),) * axis + (tuple(picks),)
    elif kind == "int then array":
        columns = draw(st.lists(st.integers(-shape[2], shape[2] - 1), min_size=1, max_size=4))
        index = (draw(st.integers(-shape[0], shape[0] - 1)), slice(None), np.array(columns))
    else:
        index = draw(hnp.arrays(np.bool_, shape))
    return shape, index, kind


@st.composite
def concat_cases(draw, same_shape: bool, min_side: int = 1):
    """1-3 shapes equal except along `axis` (there each from min_side to 3; all equal when `same_shape`),
    and the axis."""
    base, axis = draw(shape_and_axis(min_dims=1))
    out = []
    for _ in range(draw(st.integers(1, 3))):
        shape = list(base)
        if not same_shape:
            shape[axis] = draw(st.integers(min_side, 3))
        out.append(tuple(shape))
    return out, axis


@st.composite
def cross_entropy_grad_inputs(draw):
    """logits (..., C), integer targets (...) with some rows ignored (-100), and a reduction."""
    lead = draw(shapes(min_dims=1, max_dims=2))
    classes = draw(st.integers(1, 5))
    logits = draw(arrays(lead + (classes,), smooth(-4, 4)))
    targets = draw(hnp.arrays(np.int64, lead, elements=st.one_of(st.integers(0, classes - 1), st.just(-100))))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    if reduction == "mean" and (targets == -100).all():
        targets.flat[0] = classes - 1  # a mean over no rows is nan, as in torch; that case has its own test
    return logits, targets, reduction


@st.composite
def cross_entropy_forward_inputs(draw):
    """logits (..., C), integer targets (...) with some rows ignored, an ignore_index (sometimes a real class,
    which torch ignores too) and a reduction."""
    lead = draw(shapes(min_dims=1, max_dims=2))
    classes = draw(st.integers(1, 5))
    ignore_index = draw(st.sampled_from([-100, 0, classes - 1]))
    logits = draw(arrays(lead + (classes,), smooth(-6, 6)))
    targets = draw(hnp.arrays(np.int64, lead, elements=st.integers(0, classes - 1) | st.just(ignore_index)))
    return logits, targets, ignore_index, draw(st.sampled_from(["mean", "sum", "none"]))
