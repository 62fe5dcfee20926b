"""Hooks on tensors, as torch has them; the backward walk (autograd/backward.py) runs them.

- `t.register_hook(hook)`: `hook(grad)` is called with the gradient of the loss w.r.t. t (a Tensor of t's shape,
  every use of t summed in) once per backward, when that gradient is complete: for a non-leaf before the backward
  of the op that made t, for a leaf before the gradient is added to `.grad`. It may return a Tensor of the same
  shape and dtype, which replaces the gradient from there on (what the backward of the op that made t receives,
  what a leaf adds to `.grad`, a retained `.grad`), or None to keep it. Hooks run in the order they were
  registered, each on the previous one's result, under no_grad. A hook must not change its argument in place
  (torch's rule, which torch leaves to the user): its array may be another tensor's gradient too (Add hands one
  array to both inputs), or the caller's `gradient=`, so the hook gets a read-only view and an in-place op on it is
  an error; return a new Tensor instead.
- `t.register_post_accumulate_grad_hook(hook)` (leaves only): `hook(t)` once t's `.grad` is final for that
  backward; a distributed step starts reducing the gradient there.

Each registration returns a handle whose `remove()` undoes that one registration (a hook registered twice runs
twice, and one handle removes one of the two), as torch's RemovableHandle.
"""
from __future__ import annotations

import weakref

import numpy as np


class RemovableHandle:
    """The handle of one registration: remove() takes that registration out, a second remove() does nothing. It
    holds its tensor weakly: a handle kept after the tensor is gone keeps nothing alive."""

    def __init__(self, tensor, attribute: str):
        self._tensor, self._attribute = weakref.ref(tensor), attribute

    def remove(self):
        tensor = self._tensor()
        if tensor is not None:
            kept = tuple((h, f) for h, f in getattr(tensor, self._attribute) if h is not self)
            setattr(tensor, self._attribute, kept)


def add(tensor, attribute: str, hook, method: str) -> RemovableHandle:
    if not callable(hook):
        raise TypeError(f"{method}: hook must be callable, got {type(hook).__name__} {hook!r}")
    handle = RemovableHandle(tensor, attribute)
    setattr(tensor, attribute, (*getattr(tensor, attribute), (handle, hook)))
    return handle


def register_hook(tensor, hook) -> RemovableHandle:
    if not tensor.requires_grad:
        raise RuntimeError("register_hook: cannot register a hook on a tensor that doesn't require gradient")
    return add(tensor, "_hooks", hook, "register_hook")


def register_post_accumulate_grad_hook(tensor, hook) -> RemovableHandle:
    if not tensor.requires_grad:  # its .grad never changes: the hook would never run (torch refuses it too)
        raise RuntimeError("register_post_accumulate_grad_hook: cannot register a hook on a tensor that doesn't "
                           "require gradient")
    if tensor._ctx is not None:
        raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors get this hook")
    return add(tensor, "_grad_hooks", hook, "register_post_accumulate_grad_hook")


def run_hooks(tensor, grad: np.ndarray) -> np.ndarray:
    """`grad` (tensor's shape and dtype) through tensor's register_hook hooks: the gradient that flows on."""
    from .tensor import Tensor  # tensor.py imports this module
    for _, hook in tensor._hooks:
        seen = grad.view()                  # read-only: the array may be another tensor's gradient too (module doc)
        seen.flags.writeable = False
        result = hook(Tensor(seen))
        if result is None:
            continue
        name = getattr(hook, "__name__", type(hook).__name__)
        if not isinstance(result, Tensor):
            raise TypeError(f"register_hook: hook '{name}' returned {type(result).__name__}; return a Tensor (the "
                            f"new gradient, shape {tensor.shape}) or None")
        if result.shape != tensor.shape:
            raise RuntimeError(f"register_hook: hook '{name}' has changed the size of value: it returned shape "
                               f"{result.shape} for a tensor of shape {tensor.shape}")
        if result.dtype != grad.dtype:
            raise RuntimeError(f"register_hook: hook '{name}' has changed the type of value (was {grad.dtype} got "
                               f"{result.dtype}); return the gradient in {grad.dtype}")
        grad = result.data
    return grad


def run_post_accumulate_hooks(tensor) -> None:
    for _, hook in tensor._grad_hooks:
        hook(tensor)
