"""The Tensor and its graph: what is recorded, and how backward walks it.

A Tensor wraps a NumPy array. When an op runs on a tensor that requires grad, the op's `Function` object
(forward and backward side by side, see `tinygrad_ssm/ops/`) is stored on the result as `_ctx`, together
with the input tensors. `backward()` sorts that graph topologically once and calls each backward in reverse,
summing the gradients that reach a tensor from several uses. Broadcasting is undone in one place,
`unbroadcast`, for every op.
"""
from __future__ import annotations

import warnings

import numpy as np

from .grad_mode import enable_grad, is_grad_enabled, no_grad  # noqa: F401 (re-exported)

# ----------------------------------------------------------------------------------------------------------
# dtypes

DEFAULT_FLOAT = np.dtype(np.float32)


def _as_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype in ("bfloat16",):
        raise TypeError("bfloat16 has no NumPy dtype; store it as float32")
    return np.dtype(dtype)


def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f"


def _to_array(data, dtype=None) -> np.ndarray:
    """Python data -> ndarray. Python floats become float32 (torch's default), ints int64, bools bool;
    an ndarray keeps its dtype and its memory (like torch.from_numpy) unless a dtype is asked for."""
    if isinstance(data, Tensor):
        data = data.data
    if dtype is not None:
        return np.asarray(data, dtype=_as_dtype(dtype))
    if isinstance(data, np.ndarray):
        return data
    array = np.asarray(data)
    if array.dtype == np.float64 and not isinstance(data, np.generic):
        array = array.astype(DEFAULT_FLOAT)
    return array


# ----------------------------------------------------------------------------------------------------------
# the graph

def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum `grad` back to `shape`: the one place where broadcasting is undone, for every op.
    Leading axes that broadcasting added are summed away; axes where the input had size 1 are summed
    with keepdims."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


class Function:
    """One differentiable op. Subclasses write `forward(ctx, *arrays, **kw) -> array` and
    `backward(ctx, grad) -> one gradient per tensor input (or None)`, next to each other.

    Inside forward, `ctx.save_for_backward(...)` keeps arrays for backward; if one of them is an input's
    or the output's own array, its tensor's version is checked at backward time, so an in-place change
    in between raises instead of giving a wrong gradient (PyTorch's version counter).
    `ctx.needs_input_grad[i]` says whether input i wants a gradient, so backward can skip work.
    Functions whose output is a view of their first input set `is_view = True` (they share its version)."""

    is_view = False

    def __init__(self):
        self.saved: tuple = ()
        self.inputs: tuple = ()
        self.needs_input_grad: tuple = ()
        self._checked_versions: list = []  # (version box, version at forward time, shape, dtype)
        self._freed = False

    def save_for_backward(self, *arrays):
        self.saved = arrays

    @property
    def name(self) -> str:
        return type(self).__name__

    @classmethod
    def apply(cls, *inputs, **kwargs) -> "Tensor":
        """Run forward on the inputs' arrays; record the op on the result when an input requires grad."""
        ctx = cls()
        arrays = [t.data if isinstance(t, Tensor) else t for t in inputs]
        out_data = ctx.forward(*arrays, **kwargs)
        record = is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in inputs)
        out = Tensor(out_data, requires_grad=record)
        if ctx.is_view and isinstance(inputs[0], Tensor):
            out._version = inputs[0]._version  # a view shares its base's version counter, as in torch
        if record:
            ctx.inputs = inputs
            ctx.needs_input_grad = tuple(isinstance(t, Tensor) and t.requires_grad for t in inputs)
            ctx._remember_versions(out)
            out._ctx = ctx
        else:
            ctx.saved = ()
        return out

    def _remember_versions(self, out: "Tensor"):
        saved_ids = {id(a) for a in self.saved if isinstance(a, np.ndarray)}
        for t in (*self.inputs, out):
            if isinstance(t, Tensor) and id(t.data) in saved_ids:
                # the version box, not the tensor: holding `out` here would make a reference cycle
                # (out -> _ctx -> out) that only the cyclic GC frees, so whole graphs would pile up
                self._checked_versions.append((t._version, t._version[0], t.shape, t.dtype))

    def _check_versions(self):
        for version, expected, shape, dtype in self._checked_versions:
            if version[0] != expected:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: [Tensor of shape {shape}, dtype {dtype}] used by {self.name} "
                    f"is at version {version[0]}; expected version {expected} instead.")

    def forward(self, *args, **kwargs):  # pragma: no cover - every op overrides it
        raise NotImplementedError

    def backward(self, grad):  # pragma: no cover
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------------------
# the Tensor

class Tensor:
    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected operators

    def __init__(self, data, dtype=None, requires_grad: bool = False):
        self.data: np.ndarray = _to_array(data, dtype)
        self._ctx: Function | None = None  # the op that produced this tensor, when recorded
        self._grad: Tensor | None = None
        self._retains_grad = False
        self._version = [0]  # a box, so detach() and views share it with their base
        if isinstance(data, Tensor) and self.data is data.data:
            self._version = data._version  # Tensor(t) wraps t's storage: an in-place change must count for both
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    # --- basic properties ---------------------------------------------------------------------------------
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    is_leaf = property(lambda self: self._ctx is None)
    grad_fn = property(lambda self: self._ctx)

    def __len__(self):
        return len(self.data)

    def numel(self) -> int:
        return int(self.data.size)

    def numpy(self) -> np.ndarray:
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self.data

    def item(self):
        if self.data.size != 1:
            raise ValueError(f"item: only one-element tensors can be converted to Python scalars, got shape {self.shape}")
        return self.data.item()

    def tolist(self):
        return self.data.tolist()

    def __repr__(self):
        extra = ""
        if self._ctx is not None:
            extra = f", grad_fn={self._ctx.name}"
        elif self.requires_grad:
            extra = ", requires_grad=True"
        body = np.array2string(self.data, precision=4, separator=", ", threshold=20)
        return f"Tensor({body}, dtype={self.dtype}{extra})"

    def __bool__(self):
        if self.data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with shape {self.shape} is ambiguous")
        return bool(self.data)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __hash__(self):
        return id(self)

    # --- autograd flags -----------------------------------------------------------------------------------
    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not is_float(self.dtype):
            raise TypeError(f"requires_grad: only floating point tensors can require gradients, got dtype {self.dtype}")
        if not requires_grad and self._ctx is not None:
            raise RuntimeError("requires_grad_(False): you can only change requires_grad flags of leaf tensors; "
                               "use detach() to get a tensor that does not require grad")
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self) -> "Tensor":
        if not self.requires_grad:
            raise RuntimeError("retain_grad: can't retain_grad on Tensor that has requires_grad=False")
        if self._ctx is not None:
            self._retains_grad = True
        return self

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    _grad_hooks: tuple = ()  # class default: most tensors never get one

    def register_post_accumulate_grad_hook(self, hook) -> "_HookHandle":
        """Call `hook(self)` during backward once this leaf's .grad is final for that backward (torch's hook
        of that name); a distributed step starts reducing the gradient there. Returns a handle with remove()."""
        if self._ctx is not None:
            raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors get this hook")
        self._grad_hooks = (*self._grad_hooks, hook)
        return _HookHandle(self, hook)

    @property
    def grad(self) -> "Tensor | None":
        if self._ctx is not None and not self._retains_grad and self.requires_grad:
            warnings.warn("The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
                          "attribute won't be populated during backward(); use .retain_grad() on it if you want "
                          "its gradient.", UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            value = value if isinstance(value, Tensor) else Tensor(value)
            if value.shape != self.shape:
                raise ValueError(f"grad: assigned grad has shape {value.shape} but the tensor has shape {self.shape}")
            value = value.detach()
        self._grad = value

    def detach(self) -> "Tensor":
        """A tensor on the same storage (and version counter) that is cut from the graph: gradients
        never flow back through it."""
        out = Tensor(self.data)
        out._version = self._version
        return out

    def detach_(self) -> "Tensor":
        self._ctx = None
        self.requires_grad = False
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
            seed = _to_array(gradient, self.dtype)
            if seed.shape != self.shape:
                raise RuntimeError(f"backward: gradient has shape {seed.shape} but the output has shape {self.shape}")
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
        update()
        self._bump()
        return self

    def _operand(self, other):
        # a Python number takes this tensor's dtype (as in the out-of-place ops): _to_array would round it
        # to float32, so float64_tensor.mul_(0.1) multiplied by 0.10000000149
        if isinstance(other, (bool, int, float)) and is_float(self.dtype):
            return np.asarray(other, dtype=self.dtype)
        return _to_array(other)

    def add_(self, other, alpha=1.0):
        o = self._operand(other)
        return self._inplace("add_", lambda: np.add(self.data, alpha * o if alpha != 1.0 else o, out=self.data,
                                                     casting="same_kind"))

    def sub_(self, other):
        return self._inplace("sub_", lambda: np.subtract(self.data, self._operand(other), out=self.data, casting="same_kind"))

    def mul_(self, other):
        return self._inplace("mul_", lambda: np.multiply(self.data, self._operand(other), out=self.data, casting="same_kind"))

    def div_(self, other):
        return self._inplace("div_", lambda: np.divide(self.data, self._operand(other), out=self.data, casting="same_kind"))

    def zero_(self):
        return self._inplace("zero_", lambda: self.data.fill(0))

    def fill_(self, value):
        return self._inplace("fill_", lambda: self.data.fill(value))

    def copy_(self, src):
        src = _to_array(src)
        if src.shape != self.shape:
            raise ValueError(f"copy_: source shape {src.shape} differs from destination shape {self.shape}")
        return self._inplace("copy_", lambda: np.copyto(self.data, src, casting="same_kind"))

    def __setitem__(self, index, value):
        index = _index_arrays(index)
        def update():
            self.data[index] = _to_array(value)
        self._inplace("__setitem__", update)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    # --- ops, as methods (each defined once, in tinygrad_ssm.functional) -------------------------------
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
    def __matmul__(self, o): return F.matmul(self, o)
    def __rmatmul__(self, o): return F.matmul(o, self)
    def __getitem__(self, index): return F.getitem(self, index)
    # comparisons give bool tensors outside the graph
    def __lt__(self, o): return Tensor(self.data < _to_array(o))
    def __le__(self, o): return Tensor(self.data <= _to_array(o))
    def __gt__(self, o): return Tensor(self.data > _to_array(o))
    def __ge__(self, o): return Tensor(self.data >= _to_array(o))

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
    def tanh(self): return F.tanh(self)
    def sigmoid(self): return F.sigmoid(self)
    def silu(self): return F.silu(self)
    def softplus(self, beta=1.0, threshold=20.0): return F.softplus(self, beta, threshold)
    def relu(self): return F.relu(self)
    def maximum(self, o): return F.maximum(self, o)
    def minimum(self, o): return F.minimum(self, o)
    def clip(self, min=None, max=None): return F.clip(self, min, max)
    clamp = clip

    def sum(self, axis=None, keepdims=False): return F.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return F.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return F.max(self, axis, keepdims)
    def logsumexp(self, axis=None, keepdims=False): return F.logsumexp(self, axis, keepdims)
    def softmax(self, axis=-1): return F.softmax(self, axis)
    def log_softmax(self, axis=-1): return F.log_softmax(self, axis)
    def cumsum(self, axis): return F.cumsum(self, axis)

    def matmul(self, o): return F.matmul(self, o)
    def reshape(self, *shape): return F.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
    view = reshape
    def flatten(self, start=0, end=-1): return F.flatten(self, start, end)
    def permute(self, *axes): return F.permute(self, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes)
    def transpose(self, axis0=-2, axis1=-1): return F.transpose(self, axis0, axis1)
    T = property(lambda self: F.permute(self, tuple(reversed(range(self.ndim)))))
    def expand(self, *shape): return F.expand(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
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


class _HookHandle:
    def __init__(self, tensor: Tensor, hook):
        self._tensor, self._hook = tensor, hook

    def remove(self):
        self._tensor._grad_hooks = tuple(h for h in self._tensor._grad_hooks if h is not self._hook)


def _index_arrays(index):
    """Tensors used as indices become their arrays."""
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index.data if isinstance(index, Tensor) else index


# ----------------------------------------------------------------------------------------------------------
# the backward walk

def _topological_order(root: Tensor) -> list[Tensor]:
    """Every recorded tensor that `root` depends on, each after all the tensors it was made from.
    Iterative, so a graph thousands of ops deep (a sequential scan) does not hit the recursion limit."""
    order, visited = [], set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        if node._ctx is not None:
            for parent in node._ctx.inputs:
                if isinstance(parent, Tensor) and parent.requires_grad and id(parent) not in visited:
                    stack.append((parent, False))
    return order


def run_backward(root: Tensor, seed: np.ndarray, retain_graph: bool = False):
    grads: dict[int, np.ndarray] = {id(root): seed}
    for node in reversed(_topological_order(root)):
        grad = grads.pop(id(node), None)
        if grad is None:
            continue
        if node._ctx is None or node._retains_grad:  # a leaf (or a non-leaf that asked) keeps its gradient
            g = Tensor(grad.astype(node.dtype, copy=True))
            if node._grad is None:
                node._grad = g
            else:
                node._grad = Tensor(node._grad.data + g.data)
        ctx = node._ctx
        if ctx is None:
            for hook in node._grad_hooks:  # every use of this leaf came earlier in the walk: its grad is final
                hook(node)
            continue
        if ctx._freed:
            raise RuntimeError("Trying to backward through the graph a second time (or directly access saved "
                               "tensors after they have already been freed). Saved intermediate values of the "
                               "graph are freed when you call .backward(). Specify retain_graph=True if you need "
                               "to backward through the graph a second time.")
        ctx._check_versions()
        with no_grad():
            input_grads = ctx.backward(grad)
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        for parent, g in zip(ctx.inputs, input_grads):
            if g is None or not (isinstance(parent, Tensor) and parent.requires_grad):
                continue
            g = unbroadcast(np.asarray(g), parent.shape)
            if g.dtype != parent.dtype:
                g = g.astype(parent.dtype)
            previous = grads.get(id(parent))
            grads[id(parent)] = g if previous is None else previous + g
        if not retain_graph and ctx.saved:  # as torch: only an op that saved arrays can't run twice
            ctx.saved = ()
            ctx._freed = True


from . import functional as F  # noqa: E402  (the ops import Tensor and Function from this module)
