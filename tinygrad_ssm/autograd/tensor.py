"""The Tensor and the graph it records.

A Tensor wraps a NumPy array. When an op runs on a tensor that requires grad, the op's `Function` object
(forward and backward side by side, see `tinygrad_ssm/autograd/ops/`) is stored on the result as `_ctx`, together
with the input tensors: that is the graph. `backward()` walks it (autograd/backward.py): sorted topologically once,
each op's backward called in reverse, the gradients that reach a tensor from several uses summed, and
broadcasting undone in one place, `unbroadcast`, for every op.
"""
from __future__ import annotations

import warnings

from typing import TYPE_CHECKING

import numpy as np

from .dtypes import DEFAULT_FLOAT, _as_dtype, _check_numeric, carries_dtype, is_float, keeps_float64  # noqa: F401
from .grad_mode import enable_grad, is_grad_enabled, no_grad  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # only for the annotation of _ctx: function.py imports this module
    from .function import Function

# ----------------------------------------------------------------------------------------------------------
# dtypes

def _to_array(data, dtype=None, what=("Tensor", "data")) -> np.ndarray:
    """Python data -> ndarray. Python floats become float32 (torch's default), ints int64, bools bool;
    an ndarray keeps its dtype and its memory (like torch.from_numpy) unless a dtype is asked for, and
    anything else that states its dtype (a torch tensor, a NumPy scalar) keeps that dtype."""
    if isinstance(data, Tensor):
        data = data.data
    if dtype is not None:
        if not isinstance(data, np.ndarray) and not carries_dtype(data):  # [None, 1.] became [nan, 1.], "3" 3.0
            _check_numeric(*what, data, np.asarray(data))
        array = np.asarray(data, dtype=_as_dtype(dtype))
    elif isinstance(data, np.ndarray):
        array = data
    else:
        try:
            array = np.asarray(data)
        except ValueError as e:  # NumPy's "inhomogeneous shape" for a ragged nested list
            raise ValueError(f"Tensor: data must be rectangular (every row of a nested list the same length); "
                             f"got ragged data ({e})") from None
        if array.dtype == np.float64 and not keeps_float64(data):
            array = array.astype(DEFAULT_FLOAT)
    _check_numeric(*what, data, array)
    return array


# ----------------------------------------------------------------------------------------------------------
# the Tensor

class Tensor:
    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected operators

    def __init__(self, data, dtype=None, requires_grad: bool = False):
        self._data: np.ndarray = _to_array(data, dtype)
        self._ctx: Function | None = None  # the op that produced this tensor, when recorded
        self._grad: Tensor | None = None
        self._retains_grad = False
        self._version = [0]  # a box, so detach() and views share it with their base
        if isinstance(data, Tensor) and self.data is data.data:
            self._version = data._version  # Tensor(t) wraps t's storage: an in-place change must count for both
        self._requires_grad = False
        if requires_grad is not False:
            self.requires_grad_(requires_grad)

    # --- basic properties ---------------------------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        """The array the tensor wraps."""
        return self._data

    @data.setter
    def data(self, value):
        """`t.data = ...` replaces the array, unrecorded (torch's .data: the graph does not see it, the version
        counter does not move). A Tensor gives its array (`p.data = p.data - lr * p.grad`), anything else is
        converted as Tensor(...) converts it; a tensor that requires grad must stay floating point."""
        array = value.data if isinstance(value, Tensor) else _to_array(value)
        if self.requires_grad and not is_float(array.dtype):
            raise TypeError(f"t.data = ...: the tensor requires grad, so its data must be floating point, got "
                            f"dtype {array.dtype} (only floating point tensors can require gradients)")
        self._data = array

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    is_leaf = property(lambda self: self._ctx is None)
    grad_fn = property(lambda self: self._ctx)

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return len(self.data)

    # --- Python and NumPy protocols, as torch ------------------------------------------------------------
    def __iter__(self):
        """Over the first axis, each item a tensor (recorded, like any indexing)."""
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __contains__(self, element): return P.contains(self, element)
    def __getstate__(self): return P.pickled_state(self)                 # pickle: a leaf, no hooks (as torch)
    def __deepcopy__(self, memo): return P.deep_copy(self, memo)         # leaves only, no hooks (as torch)

    def __array__(self, dtype=None, copy=None):
        """np.asarray(t): the tensor's own array, refused when t requires grad (protocols.as_array)."""
        return P.as_array(self, dtype, copy)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """NumPy ufuncs on tensors (also `ndarray + tensor`): the engine's ops where they are ones
        (protocols.array_ufunc)."""
        return P.array_ufunc(ufunc, method, inputs, kwargs)

    def numel(self) -> int:
        return int(self.data.size)

    def numpy(self) -> np.ndarray:
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self.data

    def item(self):
        if self.data.size != 1:
            raise ValueError(f"item: only one-element tensors can be converted to Python scalars, "
                             f"got shape {self.shape}")
        return self.data.item()

    def tolist(self):
        return self.data.tolist()

    def __repr__(self):
        extra = (f", grad_fn={self._ctx.name}" if self._ctx is not None else
                 ", requires_grad=True" if self.requires_grad else "")
        body = np.array2string(self.data, precision=4, separator=", ", threshold=20)
        return f"Tensor({body}, dtype={self.dtype}{extra})"

    def __bool__(self):
        if self.data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with shape {self.shape} is ambiguous")
        return bool(self.data)

    def __float__(self): return float(self.item())
    def __int__(self): return int(self.item())

    def __format__(self, spec: str) -> str:
        """f"{loss:.4f}": a one-element tensor formats as its number (as torch's 0-d tensors); others as repr."""
        return format(self.item(), spec) if spec and self.data.size == 1 else format(repr(self), spec)

    # --- autograd flags -----------------------------------------------------------------------------------
    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if not isinstance(requires_grad, (bool, np.bool_)):  # requires_grad="no" is truthy: torch refuses it too
            raise TypeError(f"requires_grad must be True or False, got {requires_grad!r}")
        if requires_grad and not is_float(self.dtype):
            raise TypeError(f"requires_grad: only floating point tensors can require gradients, got dtype {self.dtype}")
        if not requires_grad and self._ctx is not None:
            raise RuntimeError("requires_grad_(False): you can only change requires_grad flags of leaf tensors; "
                               "use detach() to get a tensor that does not require grad")
        self._requires_grad = bool(requires_grad)
        return self

    # t.requires_grad = v is requires_grad_(v), checked (a plain attribute took "yes", an int tensor, a non-leaf)
    requires_grad = property(lambda self: self._requires_grad, lambda self, value: self.requires_grad_(value))

    def retain_grad(self) -> "Tensor":
        if not self.requires_grad:
            raise RuntimeError("retain_grad: can't retain_grad on Tensor that has requires_grad=False")
        if self._ctx is not None:
            self._retains_grad = True
        return self

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    _hooks: tuple = ()       # (handle, hook) pairs, autograd/hooks.py; class defaults: most tensors never get one
    _grad_hooks: tuple = ()

    def register_hook(self, hook) -> "H.RemovableHandle":
        """Call `hook(grad)` during backward with the gradient w.r.t. this tensor (leaf or not); a Tensor it returns
        replaces that gradient from there on (torch's register_hook, autograd/hooks.py). Returns a handle."""
        return H.register_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook) -> "H.RemovableHandle":
        """Call `hook(self)` during backward once this leaf's .grad is final for that backward (torch's hook
        of that name); a distributed step starts reducing the gradient there. Returns a handle with remove()."""
        return H.register_post_accumulate_grad_hook(self, hook)

    @property
    def grad(self) -> "Tensor | None":
        if self._ctx is not None and not self._retains_grad and self.requires_grad:
            warnings.warn("The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
                          "attribute won't be populated during backward(); use .retain_grad() on it if you want "
                          "its gradient.", UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value):   # checked: shape, dtype, type (protocols.assigned_grad)
        self._grad = None if value is None else P.assigned_grad(self, value)

    def detach(self) -> "Tensor":
        """A tensor on the same storage (and version counter) that is cut from the graph: gradients
        never flow back through it."""
        out = Tensor(self.data)
        out._version = self._version
        return out

    def detach_(self) -> "Tensor":
        """Cut this tensor from the graph in place: it becomes a leaf that does not require grad. Ops that
        already used it keep the graph they recorded (as torch's detach_)."""
        self._ctx = None
        self._requires_grad = False
        return self

    # --- backward -----------------------------------------------------------------------------------------
    def backward(self, gradient=None, retain_graph: bool = False):
        if not self.requires_grad:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        if gradient is None:
            if self.data.size != 1:
                raise RuntimeError(f"grad can be implicitly created only for scalar outputs (backward on shape "
                                   f"{self.shape}); pass gradient=")
            seed = np.ones(self.shape, dtype=self.dtype)
        else:
            seed = _to_array(gradient, self.dtype, ("backward", "gradient"))
            if seed.shape != self.shape:
                raise RuntimeError(f"backward: gradient has shape {seed.shape} but the output has shape {self.shape}")
        from .backward import run_backward  # the walk imports this module: imported when first needed
        run_backward(self, seed, retain_graph)

    # --- in-place updates: allowed on tensors outside the graph, each bumps the version ---------------------
    def _check_inplace(self, op: str):
        if self.requires_grad and is_grad_enabled():
            what = "a leaf Variable that requires grad" if self.is_leaf else "a tensor that requires grad"
            raise RuntimeError(f"{op}: {what} is being used in an in-place operation; wrap it in "
                               f"tinygrad_ssm.no_grad() or use the out-of-place op")

    def _bump(self):
        self._version[0] += 1

    def _inplace(self, op: str, update):
        self._check_inplace(op)
        if not self.data.flags.writeable:  # expand / broadcast_to, or a gradient a hook was given (hooks.py)
            raise RuntimeError(f"{op}: this tensor is read-only (a view from expand or broadcast_to, whose elements "
                               f"share memory, or the gradient a hook was given, which another tensor's gradient "
                               f"may share); write to a copy instead (t * 1), or return a new Tensor from the hook")
        try:
            update()
        except TypeError as e:  # NumPy's casting refused: e.g. int_tensor.add_(1.5)
            raise TypeError(f"{op}: the result cannot be stored in place in this {self.dtype} tensor ({e}); "
                            f"convert the tensor first (t.double()) or use the out-of-place op") from None
        self._bump()
        return self

    def _operand(self, other, op: str):
        """The right-hand side of an in-place op. A Python number or list takes this tensor's dtype (as in
        the out-of-place ops): as a new tensor it would be float32, so float64_tensor.mul_(0.1) multiplied
        by 0.10000000149 and t[0] = 0.1 stored 0.10000000149."""
        if isinstance(other, Tensor):
            if other.requires_grad and is_grad_enabled():
                # torch records such a write in the graph; this engine records no in-place op, so the value's
                # gradient would be dropped without a word
                raise RuntimeError(f"{op}: the value requires grad, and an in-place write is not recorded in the "
                                   f"graph: its gradient would be lost. Build the tensor out of place (F.cat, F.stack, "
                                   f"F.where, F.pad), or write value.detach() if no gradient should flow through it")
            return _args.written_as(op, other.data, self.dtype) if op in _args.WRITES else other.data
        if isinstance(other, np.ndarray):
            array = other
        elif isinstance(other, int) and not isinstance(other, bool) and self.dtype.kind in "iu":
            array = _args.integer_operand(op, other, self.dtype)
        elif isinstance(other, (bool, int, float, list, tuple, np.generic)):
            array = np.asarray(other)
            if array.dtype.kind in "biuf" and is_float(self.dtype) and not isinstance(other, np.generic):
                array = array.astype(self.dtype)
        else:
            array = np.asarray(other, dtype=object)
        _check_numeric(op, "the value", other, array)
        return _args.written_as(op, array, self.dtype) if op in _args.WRITES else array

    def _same_shape_operand(self, other, op: str):
        """The right-hand side of an elementwise in-place op: it must broadcast to this tensor's shape (the
        result is written in place, so it cannot grow)."""
        o = self._operand(other, op)
        try:
            result = np.broadcast_shapes(self.shape, np.shape(o))
        except ValueError:
            raise ValueError(f"{op}: shape {np.shape(o)} does not broadcast with the tensor's shape {self.shape}") \
                from None
        if result != self.shape:
            raise ValueError(f"{op}: shapes {np.shape(o)} and {self.shape} broadcast to {result}, but an in-place op "
                             f"keeps the tensor's shape {self.shape}")
        return o

    def _combine_(self, op: str, ufunc, other):
        """self = ufunc(self, other) in place; the result's dtype must be one torch stores here (args.can_store)."""
        o = self._same_shape_operand(other, op)
        result = ufunc.resolve_dtypes((self.dtype, np.asarray(o).dtype, None))[-1]
        if not _args.can_store(result, self.dtype):
            raise TypeError(f"{op}: the result cannot be stored in place in this {self.dtype} tensor (it is {result}); "
                            f"convert the tensor first (t.double()) or use the out-of-place op")
        return self._inplace(op, lambda: ufunc(self.data, o, out=self.data, casting="unsafe"))

    def add_(self, other, alpha=1.0):
        scaled = other if alpha == 1.0 else self._same_shape_operand(other, "add_") * alpha
        return self._combine_("add_", np.add, scaled)

    def sub_(self, other):
        return self._combine_("sub_", np.subtract, other)

    def mul_(self, other):
        return self._combine_("mul_", np.multiply, other)

    def div_(self, other):
        return self._combine_("div_", np.divide, other)

    def zero_(self):
        return self._inplace("zero_", lambda: self.data.fill(0))

    def fill_(self, value):
        value = self._operand(value, "fill_")
        return self._inplace("fill_", lambda: self.data.fill(value))

    def copy_(self, src):
        src = self._same_shape_operand(src, "copy_")  # broadcast to this tensor's shape, as torch's copy_
        return self._inplace("copy_", lambda: np.copyto(self.data, src, casting="unsafe"))   # args.written_as cast it

    def __setitem__(self, index, value):
        items = _indexing.index_items(index)
        index = items if isinstance(index, tuple) else items[0]
        stages = _indexing.torch_stages(items)  # integers before index arrays, as torch reads them
        value = self._operand(value, "__setitem__")

        def indexed():
            return self.data[stages[0]][stages[1]] if stages else self.data[index]

        def update():
            try:
                if stages:
                    self.data[index]  # NumPy's IndexError for the index as written, before anything is written
                    self.data[stages[0]][stages[1]] = value  # the first stage is a view of self.data
                else:
                    self.data[index] = value
            except IndexError as e:
                raise _args.index_error("__setitem__", e, self.shape, index) from None
            except ValueError:
                try:
                    target = indexed().shape
                except (IndexError, ValueError):
                    raise
                raise ValueError(f"__setitem__: a value of shape {np.shape(value)} does not broadcast to the indexed "
                                 f"shape {target} (tensor of shape {self.shape})") from None
        self._inplace("__setitem__", update)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    # --- ops, as methods (each defined once, in tinygrad_ssm.autograd.functional) -------------------------------
    def __add__(self, o): return F.add(self, o)
    def __radd__(self, o): return F.add(o, self)
    def __sub__(self, o): return F.sub(self, o)
    def __rsub__(self, o): return F.sub(o, self)
    def __mul__(self, o): return F.mul(self, o)
    def __rmul__(self, o): return F.mul(o, self)
    def __truediv__(self, o): return F.div(self, o)
    def __rtruediv__(self, o): return F.div(o, self)
    def __pow__(self, o): return F.pow(self, o)
    def __rpow__(self, o): return F.pow(o, self)
    def __neg__(self): return F.neg(self)
    def __pos__(self): return P.positive(self)
    def __matmul__(self, o): return F.matmul(self, o)
    def __rmatmul__(self, o): return F.matmul(o, self)
    def __getitem__(self, index): return F.getitem(self, index)
    # comparisons are elementwise and give bool tensors outside the graph (as torch); the hash stays the
    # tensor's identity, so tensors still work as dict keys and set members
    def __eq__(self, o): return P.compare("eq", np.equal, self, o)
    def __ne__(self, o): return P.compare("ne", np.not_equal, self, o)
    def __lt__(self, o): return P.compare("lt", np.less, self, o)
    def __le__(self, o): return P.compare("le", np.less_equal, self, o)
    def __gt__(self, o): return P.compare("gt", np.greater, self, o)
    def __ge__(self, o): return P.compare("ge", np.greater_equal, self, o)
    def __hash__(self): return id(self)

    def add(self, o): return F.add(self, o)
    def sub(self, o): return F.sub(self, o)
    def mul(self, o): return F.mul(self, o)
    def div(self, o): return F.div(self, o)
    def neg(self): return F.neg(self)
    def pow(self, o): return F.pow(self, o)
    def exp(self): return F.exp(self)
    def log(self): return F.log(self)
    def sqrt(self): return F.sqrt(self)
    def rsqrt(self): return F.rsqrt(self)
    def abs(self): return F.abs(self)
    __abs__ = abs
    def tanh(self): return F.tanh(self)
    def sigmoid(self): return F.sigmoid(self)
    def silu(self): return F.silu(self)
    def softplus(self, beta=1.0, threshold=20.0): return F.softplus(self, beta, threshold)
    def relu(self): return F.relu(self)
    def maximum(self, o): return F.maximum(self, o)
    def minimum(self, o): return F.minimum(self, o)
    def clip(self, min=None, max=None): return F.clip(self, min, max)
    clamp = clip

    # dtype= and out= are NumPy's: np.sum(t), np.mean(t) and np.max(t) call these methods with them
    def sum(self, axis=None, keepdims=False, dtype=None, out=None):
        total = F.sum(P.numpy_reduction_input("sum", self, dtype, out), axis, keepdims)   # (integers: int64)
        return total if dtype is None else F.cast(total, dtype)   # a narrower dtype asked for, as NumPy and torch

    def mean(self, axis=None, keepdims=False, dtype=None, out=None):
        return F.mean(P.numpy_reduction_input("mean", self, dtype, out), axis, keepdims)

    def max(self, axis=None, keepdims=False, out=None):
        """The largest values (NumPy's max, torch's amax): values only, never torch.max(dim)'s (values, indices)
        pair; the indices are argmax's."""
        return F.max(P.numpy_reduction_input("max", self, None, out), axis, keepdims)

    def min(self, axis=None, keepdims=False, out=None):
        """The smallest values (NumPy's min, torch's amin), as max."""
        return F.min(P.numpy_reduction_input("min", self, None, out), axis, keepdims)

    def amax(self, axis=None, keepdims=False): return F.amax(self, axis, keepdims)
    def amin(self, axis=None, keepdims=False): return F.amin(self, axis, keepdims)

    def argmax(self, axis=None, keepdims=False) -> "Tensor":
        """(int64) the index of the largest value along `axis` (of the flattened tensor when None), the first
        one on ties, as np.argmax and torch.argmax; an index has no gradient."""
        return Tensor(np.argmax(self.data, axis=axis, keepdims=keepdims).astype(np.int64))

    def argmin(self, axis=None, keepdims=False) -> "Tensor":
        """(int64) the index of the smallest value, as argmax."""
        return Tensor(np.argmin(self.data, axis=axis, keepdims=keepdims).astype(np.int64))

    def logsumexp(self, axis=None, keepdims=False): return F.logsumexp(self, axis, keepdims)
    def softmax(self, axis=-1): return F.softmax(self, axis)
    def log_softmax(self, axis=-1): return F.log_softmax(self, axis)
    def cumsum(self, axis): return F.cumsum(self, axis)

    def matmul(self, o): return F.matmul(self, o)
    def reshape(self, *shape): return F.reshape(self, _args.one_or_many(shape))

    def view(self, *shape):
        """reshape that must not copy (torch's view): NumPy copies when the strides cannot express the new shape
        (a transpose flattened), and a write to that copy would not reach this tensor."""
        out = self.reshape(*shape)
        if out.data.size and not np.may_share_memory(out.data, self.data):
            raise RuntimeError(f"view: shape {self.shape} with strides {self.data.strides} cannot be viewed as "
                               f"{out.shape} without a copy; use .reshape(...) instead")
        return out

    def flatten(self, start=0, end=-1): return F.flatten(self, start, end)
    def permute(self, *axes, dims=None):  # x.permute(1, 0), x.permute((1, 0)) or torch's x.permute(dims=(1, 0))
        return F.permute(self, dims if dims is not None else _args.one_or_many(axes))
    def transpose(self, axis0=-2, axis1=-1): return F.transpose(self, axis0, axis1)
    T = property(lambda self: F.permute(self, tuple(reversed(range(self.ndim)))))
    def expand(self, *shape): return F.expand(self, _args.one_or_many(shape))
    def broadcast_to(self, shape): return F.expand(self, shape)
    def unsqueeze(self, axis): return F.unsqueeze(self, axis)
    def squeeze(self, axis=None): return F.squeeze(self, axis)
    def flip(self, axis): return F.flip(self, axis)
    def split(self, split_size_or_sections, axis=0): return F.split(self, split_size_or_sections, axis)
    def tril(self, k=0): return F.tril(self, k)
    def triu(self, k=0): return F.triu(self, k)
    def pad(self, pad, value=0.0): return F.pad(self, pad, value)

    def astype(self, dtype): return F.cast(self, dtype)
    to = astype
    def float(self): return F.cast(self, np.float32)
    def double(self): return F.cast(self, np.float64)
    def long(self): return F.cast(self, np.int64)   # torch's names for the integer and bool casts
    def int(self): return F.cast(self, np.int32)
    def bool(self): return F.cast(self, np.bool_)


from . import functional as F  # noqa: E402  (the ops import Tensor from this module)
from . import protocols as P  # noqa: E402  (comparisons and NumPy's ufuncs on tensors, made of the ops)
from . import args as _args  # noqa: E402  (args imports Tensor from this module)
from . import hooks as H  # noqa: E402  (register_hook and its kind)
from . import indexing as _indexing  # noqa: E402  (indexing imports Tensor from this module)
from .torch_names import take_torch_names  # noqa: E402

take_torch_names(Tensor)  # every method with an axis argument takes torch's names for it too (dim=, keepdim=, ...)
