"""Shape ops: the data moves, nothing is computed, so each backward moves the gradient back.

Arguments arrive checked and normalised from `functional` (axes non-negative, shapes tuples).
An op whose output can share memory with its input says so with `is_view` (a class attribute when it
always does, an instance attribute set in forward when NumPy decides), so the output shares its input's
version counter and an in-place change through either one is caught at backward
(tests/autograd/test_views.py checks every op in functional.OPS).
"""
import numpy as np

from ..function import Function, gradient_slot


class Reshape(Function):
    def forward(self, a, shape=()):
        self.input_shape = a.shape
        out = a.reshape(shape)
        self.is_view = np.may_share_memory(out, a)  # NumPy copies when the strides can't express the shape
        return out

    def gradient_slot(self, output, dtype):
        """The input's slot reshaped like the output, when that is a view of it (then backward's reshape of
        the gradient is that slot itself)."""
        slot = gradient_slot(self.inputs[0], dtype) if self.is_view and self.inputs else None
        if slot is None:
            return None
        view = slot.reshape(output.shape)
        return view if np.may_share_memory(view, slot) else None

    def backward(self, grad):
        return grad.reshape(self.input_shape)


class Permute(Function):
    is_view = True

    def forward(self, a, axes=()):
        self.axes = axes
        return np.transpose(a, axes)

    def backward(self, grad):
        return np.transpose(grad, np.argsort(self.axes))


class Expand(Function):
    """broadcast_to: a read-only view; the engine's unbroadcast sums the gradient back."""

    is_view = True

    def forward(self, a, shape=()):
        return np.broadcast_to(a, shape)

    def backward(self, grad):
        return grad


class Getitem(Function):
    """a[index]. Basic indexing (ints, slices, None, Ellipsis) selects each element at most once, so
    backward writes the gradient into a zero array; integer-array indexing may pick an element twice,
    so backward scatter-adds (np.add.at) to sum both contributions."""

    def forward(self, a, index=None):
        # index arrays are copied: the caller may change an index tensor in place before backward
        self.input_shape, self.index = a.shape, _copy_index_arrays(index)
        self.advanced = _is_advanced(index)
        out = a[index]
        if np.isscalar(out):  # a single element comes back as a NumPy scalar: take it as a 0-d view (in-place
            # ops on it reach `a`, as torch's t[0].add_()), a copy where the index holds arrays
            out = np.array(out) if self.advanced else a[(*index, ...) if isinstance(index, tuple) else (index, ...)]
        self.is_view = np.may_share_memory(out, a)  # basic indexing gives a view, integer arrays a copy
        return out

    def backward(self, grad):
        full = np.zeros(self.input_shape, dtype=grad.dtype)
        if self.advanced:
            np.add.at(full, self.index, grad)
        else:
            full[self.index] = grad
        return full


def _copy_index_arrays(index):
    if isinstance(index, tuple):
        return tuple(np.array(i) if isinstance(i, np.ndarray) else i for i in index)
    return np.array(index) if isinstance(index, np.ndarray) else index


def _is_advanced(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (list, np.ndarray)) for i in items)


class Cat(Function):
    """Concatenate along one axis; backward cuts the gradient back into the input sizes."""

    def forward(self, *arrays, axis=0):
        self.axis = axis
        self.bounds = np.cumsum([a.shape[axis] for a in arrays])[:-1]
        return np.concatenate(arrays, axis=axis)

    def backward(self, grad):
        return tuple(np.split(grad, self.bounds, axis=self.axis))


class Stack(Function):
    def forward(self, *arrays, axis=0):
        self.axis, self.count = axis, len(arrays)
        return np.stack(arrays, axis=axis)

    def backward(self, grad):
        return tuple(np.take(grad, i, axis=self.axis) for i in range(self.count))


class Pad(Function):
    """Constant padding; widths is ((before, after), ...) for every axis. Backward slices the middle out."""

    def forward(self, a, widths=(), value=0.0):
        self.keep = tuple(slice(lo, lo + n) for (lo, _), n in zip(widths, a.shape))
        if a.ndim == 0:  # nothing to pad (np.pad refuses a 0-d array)
            return a.copy()
        a = a if a.flags.c_contiguous else a.copy(order="C")          # a C-ordered result, as torch's
        return np.pad(a, widths, mode="constant", constant_values=value)

    def backward(self, grad):
        return grad[self.keep]


class Flip(Function):
    """A reversed copy, as torch.flip (np.flip alone is a view with negative strides: a write to the result
    would change the input)."""

    def forward(self, a, axis=()):
        self.axis = axis
        return np.flip(a, axis).copy()

    def backward(self, grad):
        return np.flip(grad, self.axis)


class Triangle(Function):
    """tril / triu over the last two axes: entries outside the triangle become 0 and get no gradient."""

    def forward(self, a, k=0, lower=True):
        rows, cols = a.shape[-2:]
        mask = (np.tri(rows, cols, k, dtype=bool) if lower else ~np.tri(rows, cols, k - 1, dtype=bool))
        self.mask = mask        # the op's own constant, not a saved array: backward may run twice, as torch's
        return np.where(mask, a, np.zeros((), a.dtype))

    def backward(self, grad):
        return np.where(self.mask, grad, np.zeros((), grad.dtype))
