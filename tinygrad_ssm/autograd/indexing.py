"""What an index means, as torch reads it, for `x[index]` (functional.getitem) and `x[index] = value`
(Tensor.__setitem__).

NumPy does the indexing; two places where torch reads an index differently are settled here first:

- A sequence inside the index (a list, a tuple, a range, a Tensor) is an index array: `x[:, (0, 0)]` picks
  column 0 twice, as in both NumPy and torch. An empty one is an empty integer array (NumPy would make a
  float array of `[]` and refuse it).
- Integers are applied before index arrays. `x[0, :, [1, 2]]` of an x of shape (2, 3, 4) is (3, 2) in torch:
  the 0 selects first, then `[:, [1, 2]]`. NumPy counts the 0 as one more index array, broadcast with
  [1, 2] and separated from it by the slice, which puts the arrays' axis first: (2, 3). So an index with
  both is split in two stages: the integers (and slices, in every other place) first, a view of x; then the
  rest on that view.
"""
from __future__ import annotations

import numpy as np

from .tensor import Tensor


def index_items(index) -> tuple:
    """The index as a tuple of items, every sequence or Tensor among them an array."""
    items = index if isinstance(index, tuple) else (index,)
    return tuple(_as_array(i) if isinstance(i, (Tensor, list, tuple, range)) else i for i in items)


def _as_array(item) -> np.ndarray:
    array = np.asarray(item.data if isinstance(item, Tensor) else item)
    return array.astype(np.intp) if array.size == 0 and array.dtype == np.float64 else array


def is_integer(item) -> bool:
    """An integer, or a 0-d integer array (a 0-d index tensor): both select one element of an axis."""
    if isinstance(item, np.ndarray):
        return item.ndim == 0 and np.issubdtype(item.dtype, np.integer)
    return isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_))


def is_index_array(item) -> bool:
    return isinstance(item, np.ndarray) and item.ndim > 0


def torch_stages(items: tuple) -> tuple[tuple, tuple] | None:
    """(integers first, the rest after) when `items` hold both integers and index arrays, as torch applies
    them; None when NumPy's one step already means what torch means.

    x of shape (2, 3, 4), items (0, :, [1, 2]):  first (0, :, :) -> shape (3, 4); then (:, [1, 2]) -> (3, 2)."""
    if not (any(map(is_integer, items)) and any(map(is_index_array, items))):
        return None
    first, rest = [], []
    for item in items:
        if is_integer(item):
            first.append(int(item))  # selects (a view: NumPy copies for a 0-d array), and its axis is gone
        elif is_index_array(item):
            first.extend([slice(None)] * (item.ndim if item.dtype == np.bool_ else 1))  # a mask spans its ndim axes
            rest.append(item)
        elif isinstance(item, slice):
            first.append(item)
            rest.append(slice(None))  # the axis is already sliced
        elif item is Ellipsis:
            first.append(item)
            rest.append(item)
        else:  # None or a bool scalar: adds an axis and consumes none, so only the second stage sees it
            rest.append(item)
    return tuple(first), tuple(rest)
