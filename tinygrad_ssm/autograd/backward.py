"""The backward walk: from a root tensor back to the leaves, each op's backward called once.

`Tensor.backward()` calls `run_backward`. The graph it walks is what `Function.apply` (autograd/function.py) recorded:
each output tensor's `_ctx` is the op that made it, and the op keeps its inputs in `ctx.inputs`.
Broadcasting is undone here, in `unbroadcast`, for every op, so no op's backward has to.
"""
from __future__ import annotations

import sys

import numpy as np

from .grad_mode import no_grad
from .function import Function
from .hooks import run_hooks, run_post_accumulate_hooks
from .tensor import Tensor


class GradientShapeError(RuntimeError):
    """An op's backward returned a gradient that no broadcasting of its input could have made."""


def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum `grad` back to `shape`: the one place where broadcasting is undone, for every op.
    Leading axes that broadcasting added are summed away; axes where the input had size 1 are summed
    with keepdims. A gradient of any other shape (transposed, flattened, smaller) is refused, as torch refuses
    it: reshaping it would silently scramble the gradient."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra < 0 or any(g != n and n != 1 for g, n in zip(grad.shape[extra:], shape)):
        raise GradientShapeError(f"got a gradient of shape {grad.shape} for an input of shape {shape}")
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


def _topological_order(root: Tensor) -> tuple[list[Function], dict[int, int]]:
    """Every recorded op that `root` depends on, each after all the ops that made its inputs; and for each leaf
    that requires grad, how many uses of it those ops make (its gradient is final once they have all run).
    Iterative, so a graph thousands of ops deep (a sequential scan) does not hit the recursion limit."""
    order, visited, leaf_uses = [], set(), {}
    stack = [(root._ctx, False)]
    while stack:
        ctx, inputs_done = stack.pop()
        if inputs_done:
            order.append(ctx)
            continue
        if id(ctx) in visited:
            continue
        visited.add(id(ctx))
        stack.append((ctx, True))
        # the graph as recorded at forward time (input_creators), whatever detach_() did to an input since
        for parent, creator, needs in zip(ctx.inputs, ctx.input_creators, ctx.needs_input_grad):
            if needs:
                if creator is None:
                    leaf_uses[id(parent)] = leaf_uses.get(id(parent), 0) + 1
                elif id(creator) not in visited:
                    stack.append((creator, False))
    return order, leaf_uses


# Allocators that hand out views of blocks they keep (fast/heap_reuse.py's pool) say here, per array, how many
# references they hold to it (0: not theirs), so that a gradient in such a block can count as the walk's own.
_block_keepers: list = []


def register_block_keeper(references_held):
    """references_held(block) -> the references the keeper holds to `block`, an array other arrays are views of;
    0 when the block is not one of the keeper's. The walk then treats the only view of a block that nothing
    but the keeper holds as an array it owns (sums into it in place, keeps it as .grad)."""
    _block_keepers.append(references_held)


def _only_the_walk_holds(a: np.ndarray, references: int) -> bool:
    """Whether nothing but the walk can see array `a`: no other array is a view of it (or of its memory), and
    nothing holds it but the `references` the caller counts (the walk's dict and local names, the caller's own
    argument). `a` owns its memory, or is the only view of a block of a registered keeper that nothing else
    holds. Any other view (of an array someone holds; one made by numba, whose base is its memory's keeper)
    never qualifies."""
    # getrefcount also counts this function's argument and its own
    if not a.flags.writeable or sys.getrefcount(a) != references + 2:
        return False
    base = a.base
    if base is None:
        return True
    held = sum(keeper(base) for keeper in _block_keepers)
    # the block's holders when `a` is its only view: the keeper, `a`, the name `base`, getrefcount's argument
    return held > 0 and sys.getrefcount(base) == held + 3


def _accumulate(tensor: Tensor, grad: np.ndarray):
    """A leaf's (or a retain_grad tensor's) .grad += grad, in the tensor's own dtype. The first gradient is
    kept as it is when only the walk holds it, else copied (torch's AccumulateGrad steals an incoming
    gradient nobody else uses): copying the 154 MB gradient of a 50k-vocabulary embedding into fresh pages took
    0.33 s of a 10.5 s step at Mamba-2 130M's shape. Later ones are added into a leaf's .grad in place, as torch's
    AccumulateGrad does: a handle on .grad (g = x.grad, or one zeroed with zero_()) sees the sum; a retain_grad
    tensor's .grad becomes a new sum, as torch's (a handle on the old one keeps its value)."""
    # references: the walk's local name for it, this function's argument
    if tensor._grad is None and grad.dtype == tensor.dtype and _only_the_walk_holds(grad, 2):
        tensor._grad = Tensor(grad)
        return
    held = tensor._grad
    if held is None:
        tensor._grad = Tensor(grad.astype(tensor.dtype, copy=True))
    elif held.data.flags.writeable and held.shape == grad.shape and tensor._ctx is None:
        np.add(held.data, grad, out=held.data, casting="same_kind")
        held._bump()                                                     # an in-place change, like any other
    elif held.shape != grad.shape:                            # .data replaced by another shape since: torch too
        raise RuntimeError(f"backward: the tensor's .grad has shape {held.shape} and its new gradient {grad.shape} "
                           f"(its .data was given another shape?); set .grad = None first")
    else:                                                     # a read-only .grad someone assigned, a non-leaf
        tensor._grad = Tensor(held.data + grad.astype(tensor.dtype))


def run_backward(root: Tensor, seed: np.ndarray, retain_graph: bool = False):
    """Call every op's backward once, from the root back to the leaves.

    Gradients are summed per tensor in `grads` until the op that made the tensor runs: the reverse topological
    order guarantees that every use of a tensor has passed its gradient back by then. An op with several
    outputs gets one gradient per output (zeros for an output that did not reach the root). A leaf's
    gradient is final once every op that used it has run: it is written to `.grad` at that moment. Each
    tensor's register_hook hooks run on its gradient once it is complete, before it flows on (hooks.py)."""
    grads: dict[int, np.ndarray] = {id(root): seed}
    if root._ctx is None:  # backward() on a leaf: its gradient is the seed
        with no_grad():
            _accumulate(root, run_hooks(root, seed) if root._hooks else seed)
            run_post_accumulate_hooks(root)
        return
    order, uses_left = _topological_order(root)  # uses_left: leaf id -> ops that still owe it a gradient
    with no_grad():  # backward formulas compute on arrays; nothing in the walk is recorded
        _walk(order, grads, uses_left, retain_graph)


def _walk(order: list, grads: dict, uses_left: dict, retain_graph: bool):
    for ctx in reversed(order):
        outputs = [ref() for ref in ctx.outputs]
        out_grads = [None if o is None else grads.pop(id(o), None) for o in outputs]
        for i, (o, g) in enumerate(zip(outputs, out_grads)):
            if g is not None and o._hooks:  # o's gradient is complete: its hooks may replace it (hooks.py)
                out_grads[i] = g = run_hooks(o, g)
            if g is not None and o._retains_grad:  # after the hooks, as torch
                _accumulate(o, g)
        if out_grads[0] is not None or any(g is not None for g in out_grads):
            if ctx._freed:
                raise RuntimeError("Trying to backward through the graph a second time (or directly access saved "
                                   "tensors after they have already been freed). Saved intermediate values of the "
                                   "graph are freed when you call .backward(). Specify retain_graph=True if you need "
                                   "to backward through the graph a second time.")
            ctx._check_versions()
            if len(out_grads) > 1:  # materialise the gradients of outputs that did not reach the root
                out_grads = [np.zeros(shape, dtype) if g is None else g
                             for g, (shape, dtype) in zip(out_grads, ctx.output_specs)]
            input_grads = ctx.backward(*out_grads)
            if not isinstance(input_grads, tuple):
                input_grads = (input_grads,)                   # one input's gradient (a list too, as torch reads it)
            short = [i for i in range(len(input_grads), len(ctx.inputs)) if ctx.needs_input_grad[i]]
            if short:  # a custom Function's missing gradients were taken as None: its inputs silently got none
                raise RuntimeError(f"{type(ctx).__name__}.backward returned {len(input_grads)} gradient(s) for "
                                   f"{len(ctx.inputs)} input(s), none for input(s) {short}, which need one; return "
                                   f"a tuple of one per input of forward, None where there is none")
            if any(g is not None for g in input_grads[len(ctx.inputs):]):  # one per tensor input (None for none)
                raise RuntimeError(f"{type(ctx).__name__}.backward returned {len(input_grads)} gradients for "
                                   f"{len(ctx.inputs)} tensor input(s); return one per tensor input of forward, "
                                   f"None where there is none")
            if not retain_graph and any(a is not None for a in ctx.saved):  # as torch: only an op that holds
                # saved arrays can't run twice (saved_needed may have let all of them go)
                ctx.saved = ()
                ctx._freed = True
        else:  # no gradient reached this op's outputs (e.g. an integer index): its inputs get none from it
            input_grads = ()
        # from here the walk names each input's gradient once (pending[i], then g, then its entry in `grads`):
        # `_only_the_walk_holds` counts references, and a gradient the op still holds is never reused in place
        pending = list(input_grads) + [None] * (len(ctx.inputs) - len(input_grads))
        del input_grads, out_grads
        for i, parent in enumerate(ctx.inputs):
            g, pending[i] = pending[i], None
            if not ctx.needs_input_grad[i]:
                continue
            if g is not None:
                try:
                    g = unbroadcast(np.asarray(g), parent.shape)
                except GradientShapeError as e:
                    raise GradientShapeError(f"{type(ctx).__name__}.backward returned an invalid gradient for "
                                             f"input {i}: {e}; return the gradient in the input's shape (or in "
                                             f"a shape the input broadcasts to)") from None
                if g.dtype != parent.dtype:
                    g = g.astype(parent.dtype)
                previous = grads.get(id(parent))
                if previous is None:
                    grads[id(parent)] = g
                elif previous.shape == g.shape and _only_the_walk_holds(previous, 2):  # `grads`, `previous`
                    np.add(previous, g, out=previous)  # the same sum, in place: no fresh array of its size
                else:
                    grads[id(parent)] = previous + g
                g = previous = None
            if ctx.input_creators[i] is None:
                uses_left[id(parent)] -= 1
                if uses_left[id(parent)] == 0:  # every use has been walked: the leaf's gradient is final
                    final = grads.pop(id(parent), None)
                    if final is not None and parent.requires_grad:  # (requires_grad_(False) since: none, as torch)
                        _accumulate(parent, run_hooks(parent, final) if parent._hooks else final)
                        run_post_accumulate_hooks(parent)  # e.g. start this gradient's allreduce now


def zero_grads(named_params, set_to_none: bool, who: str) -> None:
    """torch's zero_grad over (name, parameter) pairs (an optimizer's, a module's): each .grad set to None, or
    zeroed in place; a read-only gradient (a broadcast view assigned as .grad) refused before any is zeroed."""
    if not isinstance(set_to_none, bool):                               # "no" is truthy: the grads were dropped
        raise TypeError(f"{who}: set_to_none must be True or False, got {set_to_none!r}")
    named_params = list(named_params)
    read_only = [name for name, p in named_params if p.grad is not None and not p.grad.data.flags.writeable]
    if read_only and not set_to_none:
        raise ValueError(f"{who}: the gradient of {', '.join(read_only)} is a read-only array (a broadcast view?); "
                         f"nothing was zeroed: give it a writable gradient, or use set_to_none=True")
    for _, p in named_params:
        if set_to_none:
            p.grad = None
        elif p.grad is not None:
            p.grad.zero_()
