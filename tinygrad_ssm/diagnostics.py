"""Gradient-flow report: does every registered parameter get a useful gradient, and does anything that
requires grad reach the loss from outside the registry?

The two bugs it exists for (both seen in the Rust model this project replaces): a stray `detach()` that
cuts parameters off the loss (they get no gradient), and trainable tensors created outside the VarMap (they
reach the loss and even get gradients, but no optimizer, checkpoint or report knows them).

    loss.backward()
    report = tinygrad_ssm.gradient_report(loss, varmap, model=model)   # model: optional, names strays
    assert report.ok, str(report)
"""
from __future__ import annotations

import types
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .autograd.tensor import Tensor

OK, NO_GRAD, ZERO_GRAD, NON_FINITE, FROZEN = "ok", "no gradient", "zero gradient", "non-finite gradient", "frozen"
NOT_REACHED = "not reached"
FROZEN_AS_ASKED = "frozen, as asked"   # named in gradient_report's `frozen`: no gradient wanted, no problem


@dataclass
class ParamRow:
    name: str
    shape: tuple
    status: str                 # one of OK, NO_GRAD, NOT_REACHED, ZERO_GRAD, NON_FINITE, FROZEN, FROZEN_AS_ASKED
    grad_norm: float | None     # 2-norm of .grad in float64, None without a gradient
    reached: bool               # the loss's graph contains this parameter

    @property
    def note(self) -> str:
        if self.status == NO_GRAD:
            return ("reached the loss but has no .grad: was loss.backward() called?" if self.reached else
                    "not connected to the loss (a detach() on the way, or an unused parameter)")
        if self.status == NOT_REACHED:
            return ("has a .grad, but the loss does not reach it: the .grad is an earlier backward's (zero_grad not "
                    "called?), and a detach() on the way or an unused parameter cuts it off this loss")
        if self.status == ZERO_GRAD:
            return "every entry of .grad is 0 (dead path, e.g. a mask or a saturated op)"
        if self.status == NON_FINITE:
            return ".grad holds NaN or inf"
        if self.status == FROZEN:
            return "registered but requires_grad is False: the optimizer cannot train it"
        return ""


@dataclass
class StrayTensor:
    """A leaf that requires grad and reached the loss, but is not in the registry."""
    shape: tuple
    dtype: str
    ops: list                   # op names from the stray up to the loss, e.g. ["Mul", "Add", "Mean"]
    names: list = field(default_factory=list)   # where it lives on the model object, when one was given
    tensor: Tensor | None = field(default=None, repr=False)

    def describe(self) -> str:
        where = f"{' / '.join(self.names)}: " if self.names else ""
        if not self.ops:
            return f"{where}Tensor {self.shape} {self.dtype}, which is the loss itself"
        ops = self.ops if len(self.ops) <= 8 else [*self.ops[:4], f"... {len(self.ops) - 7} ops ...", *self.ops[-3:]]
        return f"{where}Tensor {self.shape} {self.dtype}, flows through {' -> '.join(ops)} = loss"


@dataclass
class GradientReport:
    rows: list
    strays: list
    loss_requires_grad: bool

    def _names(self, status):
        return [r.name for r in self.rows if r.status == status]

    no_grad = property(lambda self: self._names(NO_GRAD))
    zero_grad = property(lambda self: self._names(ZERO_GRAD))
    non_finite = property(lambda self: self._names(NON_FINITE))
    frozen = property(lambda self: self._names(FROZEN))
    not_reached = property(lambda self: self._names(NOT_REACHED))

    @property
    def ok(self) -> bool:
        return self.loss_requires_grad and not self.strays and all(r.status in (OK, FROZEN_AS_ASKED) for r in self.rows)

    def __bool__(self):
        return self.ok

    def __str__(self) -> str:
        n_reached = sum(r.reached for r in self.rows)
        lines = [f"gradient report: {len(self.rows)} registered parameters, {n_reached} reached by the loss"]
        if not self.loss_requires_grad:
            lines.append("  the loss does not require grad: nothing trainable reaches it (computed under no_grad, "
                         "or detached)")
        header = ("parameter", "shape", "grad norm", "status")
        table = [(r.name, str(r.shape), "-" if r.grad_norm is None else f"{r.grad_norm:.3e}",
                  r.status if r.status in (OK, FROZEN_AS_ASKED) else f"{r.status.upper()}: {r.note}")
                 for r in self.rows]
        widths = [max(len(row[i]) for row in [header, *table]) for i in range(3)]
        fmt = lambda row: "  " + "  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]  # noqa: E731
        lines += [fmt(header), "  " + "-" * (sum(widths) + 6 + len(header[3]))]
        lines += [fmt(row) for row in table]
        if self.strays:
            lines.append(f"stray tensors: {len(self.strays)} leaf tensor(s) require grad and reach the loss but are "
                         f"NOT in the registry (no optimizer, checkpoint or report sees them; create them with "
                         f"vb.get):")
            unused = {r.shape: r.name for r in self.rows if r.status == NO_GRAD}
            for s in self.strays:
                hint = f"  (same shape as the unused registered {unused[s.shape]})" if s.shape in unused else ""
                lines.append(f"  {s.describe()}{hint}")
        counts = [("without gradient", self.no_grad), ("not reached by the loss", self.not_reached),
                  ("with zero gradient", self.zero_grad),
                  ("with non-finite gradient", self.non_finite), ("frozen", self.frozen),
                  ("stray tensor(s)", self.strays)]
        problems = [f"{len(v)} {k}" for k, v in counts if v]
        lines.append("verdict: OK" if self.ok else f"verdict: NOT OK ({', '.join(problems) or 'loss is cut off'})")
        return "\n".join(lines)

    __repr__ = __str__


def _walk(loss: Tensor):
    """Breadth-first from the loss over tensors that require grad (the ones a gradient flows through).
    Returns {id: tensor} of the leaves reached and, per tensor id, (consumer id, op name) for the path back."""
    leaves, came_from, seen = {}, {id(loss): None}, {id(loss)}
    queue = deque([loss])
    while queue:
        node = queue.popleft()
        ctx = node._ctx
        if ctx is None:
            leaves[id(node)] = node
            continue
        for parent in ctx.inputs:  # kept after backward (only the saved arrays are freed)
            if isinstance(parent, Tensor) and parent.requires_grad and id(parent) not in seen:
                seen.add(id(parent))
                came_from[id(parent)] = (id(node), ctx.name)
                queue.append(parent)
    return leaves, came_from


def _ops_to_loss(tensor_id, came_from) -> list:
    ops, step = [], came_from.get(tensor_id)
    while step is not None:
        consumer, op = step
        ops.append(op)
        step = came_from.get(consumer)
    return ops


def _attribute_names(root, wanted: set, root_name="model", max_depth=8) -> dict:
    """id -> ["model.layers[0].A", ...]: where the wanted tensors are reachable as attributes of `root`."""
    found, seen = {}, set()
    stack = [(root, root_name, 0)]
    while stack:
        obj, name, depth = stack.pop()
        if isinstance(obj, Tensor):
            if id(obj) in wanted:
                found.setdefault(id(obj), []).append(name)
            continue
        if id(obj) in seen or depth >= max_depth or isinstance(obj, (str, bytes, int, float, np.ndarray, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            children = [(v, f"{name}[{k!r}]") for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            children = [(v, f"{name}[{i}]") for i, v in enumerate(obj)]
        elif hasattr(obj, "__dict__") and not isinstance(obj, (types.ModuleType, types.FunctionType, types.MethodType)):
            children = [(v, f"{name}.{k}") for k, v in vars(obj).items()]
        else:
            continue
        stack.extend((v, n, depth + 1) for v, n in reversed(children))
    return found



def _norm(a: np.ndarray) -> float:
    """The 2-norm of `a` in float64, its entries divided by the largest |a| first: squared as they are, a float64
    gradient past ~1e154 gave inf and one below ~1e-162 gave 0 (status "ok" beside either). NaN and inf as they are."""
    largest = float(np.max(np.abs(a), initial=0.0))   # NaN if any entry is
    if not 0.0 < largest < np.inf:
        return largest
    return largest * float(np.sqrt(np.sum(np.square(a.astype(np.float64) / largest))))


def gradient_report(loss: Tensor, varmap, model=None, frozen=()) -> GradientReport:
    """Check gradient flow after `loss.backward()`.

    Flags registered parameters that got no gradient (with the reason: cut off from the loss, or backward
    not run), an all-zero or non-finite gradient, or requires_grad switched off; and every leaf tensor that
    requires grad and reached the loss without being in `varmap` (found by walking the graph from the loss).
    Pass `model` to name those strays by the attribute that holds them, and `frozen` (registry names) for the
    parameters frozen on purpose (requires_grad_(False) to fine-tune the rest): those are "frozen, as asked", not a
    problem; any other frozen one still is."""
    if not isinstance(loss, Tensor):
        raise TypeError(f"gradient_report: loss must be a Tensor, got {type(loss).__name__}")
    frozen = [frozen] if isinstance(frozen, str) else list(frozen)
    unknown = [name for name in frozen if name not in varmap]
    if unknown:
        raise ValueError(f"gradient_report: frozen names {unknown[:3]}, not in the registry ({len(varmap)} "
                         f"variables, e.g. {varmap.names()[:2]}); give registry names, as varmap.names() lists them")
    leaves, came_from = _walk(loss) if loss.requires_grad else ({}, {})
    registered = {id(t) for t in varmap.all_vars()}
    rows = []
    for name, t in varmap.named_vars():
        grad = t._grad  # a leaf's own gradient (the .grad property would warn on a non-leaf)
        norm = None if grad is None else _norm(grad.data)
        if not t.requires_grad:
            status = FROZEN_AS_ASKED if name in frozen else FROZEN
        elif grad is None:
            status = NO_GRAD
        elif loss.requires_grad and id(t) not in leaves:  # a stale .grad: the loss cannot have given it
            status = NOT_REACHED
        elif not np.all(np.isfinite(grad.data)):
            status = NON_FINITE
        elif grad.data.size and not np.any(grad.data):  # an empty parameter's empty gradient is all it can get
            status = ZERO_GRAD
        else:
            status = OK
        rows.append(ParamRow(name, tuple(t.shape), status, norm, id(t) in leaves))
    stray_ids = [i for i in leaves if i not in registered]
    names = _attribute_names(model, set(stray_ids)) if model is not None and stray_ids else {}
    strays = [StrayTensor(tuple(leaves[i].shape), str(leaves[i].dtype), _ops_to_loss(i, came_from),
                          names.get(i, []), leaves[i]) for i in stray_ids]
    return GradientReport(rows, strays, loss.requires_grad)
