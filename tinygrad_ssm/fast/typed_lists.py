"""Per-layer arrays for the numba decoder (models/mamba2/decode.py) as typed Lists, so that one compilation serves
every number of layers."""
from __future__ import annotations

from numba.typed import List

from .jit import njit


def array_list(arrays) -> List:
    """One array per layer as a numba typed List, whose type names the arrays' dtype and ndim only: a tuple's
    type holds its length, and every n_layer compiled the decoder anew (15-55 s; see docs/kernels.md). Built by
    cached functions of ours: typed List's own Python methods compile at every start (0.2 s per item type)."""
    arrays = iter(arrays)
    out = _new_list(next(arrays))
    for a in arrays:
        _list_append(out, a)
    return out


@njit(cache=True)
def _new_list(first):
    out = List()
    out.append(first)
    return out


@njit(cache=True)
def _list_append(items, a):
    items.append(a)
