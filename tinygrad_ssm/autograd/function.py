"""`Function`: one differentiable op, its forward beside its backward, and what `apply` records on the result
(the graph that backward.py walks)."""
from __future__ import annotations

import weakref

import numpy as np

from .dtypes import is_float
from .grad_mode import is_grad_enabled
from .tensor import Tensor


class Function:
    """One differentiable op. Subclasses write `forward(self, *arrays, **kw) -> array` and
    `backward(self, grad) -> one gradient per tensor input (or None)`, next to each other; `self` is the
    op's record in the graph (PyTorch's `ctx`), created by `apply` for each call.

    An op with several outputs returns a tuple of arrays from forward, and its backward takes one gradient
    per output, `backward(self, *grads)`, as PyTorch's do: an output that did not reach the loss gets zeros
    of its shape (torch's materialized grads), so backward never tests for None.

    Inside forward, `self.save_for_backward(...)` keeps arrays for backward; if one of them is an input's
    or the output's own array, its tensor's version is checked at backward time, so an in-place change
    in between raises instead of giving a wrong gradient (PyTorch's version counter).
    `self.needs_input_grad[i]` says whether input i wants a gradient, so backward can skip work.
    Functions whose outputs are views of their first input set `is_view = True` (they share its version).

    One optional hook, for ops that save a copy: `gradient_slot` (below)."""

    is_view = False

    def __init__(self):
        self.saved: tuple = ()
        self.inputs: tuple = ()
        self.needs_input_grad: tuple = ()
        self.input_creators: tuple = ()  # each input's _ctx when this op ran (None: a leaf)
        self._checked_versions: list = []  # (version box, version at forward time, shape, dtype)
        self._freed = False
        self.outputs: tuple = ()       # weak references to the output tensors
        self.output_specs: tuple = ()  # (shape, dtype) of each output, for the zeros of an unused one

    def save_for_backward(self, *arrays):
        self.saved = arrays

    def saved_needed(self) -> tuple | None:
        """Which saved arrays backward reads, given needs_input_grad (None: all). The others are let go: no
        version check on an array no gradient reads (torch saves only those), and no memory held for it."""
        return None

    @property
    def name(self) -> str:
        return type(self).__name__

    @classmethod
    def apply(cls, *inputs, **kwargs):
        """Run forward on the inputs' arrays; record the op on the result when an input requires grad.
        A forward that returns a tuple of arrays gives a tuple of tensors (one op, several outputs)."""
        ctx = cls()
        arrays = [t.data if isinstance(t, Tensor) else t for t in inputs]
        record = is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in inputs)
        # which inputs get a gradient, known to forward too (as torch's ctx.needs_input_grad; it was empty there)
        ctx.needs_input_grad = tuple(isinstance(t, Tensor) and t.requires_grad for t in inputs) if record else \
            (False,) * len(inputs)
        out_data = ctx.forward(*arrays, **kwargs)
        several = isinstance(out_data, tuple)
        # an output that is no float (a custom Function's mask) is not differentiable: it requires no grad, as torch
        outs = tuple(Tensor(a, requires_grad=record and _is_float(a)) for a in out_data) if several else \
            (Tensor(out_data, requires_grad=record and _is_float(out_data)),)
        if ctx.is_view and isinstance(inputs[0], Tensor):
            for o in outs:  # a view shares its base's version counter, as in torch; each piece of a split too
                o._version = inputs[0]._version
        if record:
            ctx.inputs = inputs
            needed = ctx.saved_needed()
            if needed is not None:
                ctx.saved = tuple(a if keep else None for a, keep in zip(ctx.saved, needed))
            # the op that made each input, as it is now: a later detach_() of an input leaves this graph whole
            ctx.input_creators = tuple(t._ctx if isinstance(t, Tensor) else None for t in inputs)
            ctx._remember_versions(outs)
            # weak references: strong ones would make a cycle (out -> _ctx -> out) that only the cyclic GC
            # frees, so whole graphs would pile up. An output nobody holds any more got no gradient.
            ctx.outputs = tuple(weakref.ref(o) for o in outs)
            if several:
                ctx.output_specs = tuple((o.shape, o.dtype) for o in outs)
            for o in outs:
                o._ctx = ctx if o.requires_grad else None
        else:
            ctx.saved = ()
        return outs if several else outs[0]

    def _remember_versions(self, outs: tuple):
        # a tensor whose array is a saved one, or a view of it (logsumexp saves its output with the reduced axes
        # kept and returns it squeezed: a change to that output in place went unnoticed, a wrong gradient)
        saved_ids = {id(a) for a in self.saved if isinstance(a, np.ndarray)}
        for t in (*self.inputs, *outs):
            if isinstance(t, Tensor) and (id(t.data) in saved_ids or id(t.data.base) in saved_ids):
                # the version box, not the tensor (see `outputs` in apply)
                self._checked_versions.append((t._version, t._version[0], t.shape, t.dtype))

    def _check_versions(self):
        for version, expected, shape, dtype in self._checked_versions:
            if version[0] != expected:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: [Tensor of shape {shape}, dtype {dtype}] used by {self.name} "
                    f"is at version {version[0]}; expected version {expected} instead.")

    def gradient_slot(self, output: Tensor, dtype) -> np.ndarray | None:
        """An array shaped like `output` (one of this op's outputs) into which the op that consumes `output` may
        write output's gradient, in `dtype`, and then return that same array from its backward: this op's
        backward then finds the gradient already in place and copies nothing. None (the default): nothing to
        lend. fast/fused.py's SplitLast lends a slice of its one gradient array; Reshape passes its input's slot
        on, reshaped. Ask through `gradient_slot(tensor, dtype)`, below."""
        return None

    def forward(self, *args, **kwargs):  # pragma: no cover - every op overrides it
        raise NotImplementedError

    def backward(self, grad):  # pragma: no cover
        raise NotImplementedError


def _is_float(array) -> bool:
    return is_float(np.asarray(array).dtype)


def gradient_slot(t: Tensor, dtype) -> np.ndarray | None:
    """Where the backward of an op that consumes t may write t's gradient in place (see
    Function.gradient_slot): an array shaped like t, or None when t's op lends nothing."""
    return None if t._ctx is None else t._ctx.gradient_slot(t, np.dtype(dtype))
