"""torch's names for the engine's axis arguments: `F.sum(x, dim=1, keepdim=True)` is `F.sum(x, axis=1,
keepdims=True)`, `x.transpose(dim0=0, dim1=1)` and `x.flatten(start_dim=1)` too. One map (TORCH_NAMES), taken by
every op (functional's `@op`) and, through `take_torch_names` at the end of tensor.py, by every Tensor method with an
axis argument, so that a program ported from PyTorch keeps its keywords. NumPy's names stay the engine's own."""
from __future__ import annotations

import functools
import inspect

# torch's keyword -> the engine's (NumPy's), where the op has the engine's parameter. dims is torch's for flip and
# permute only; here it names any axis= (F.sum(x, dims=1) works, where torch refuses it)
TORCH_NAMES = (("dim", "axis"), ("dims", "axis"), ("dims", "axes"), ("keepdim", "keepdims"), ("dim0", "axis0"),
               ("dim1", "axis1"), ("start_dim", "start"), ("end_dim", "end"))
# ops whose torch spelling asks for something else: torch.max(x, dim=1) is a (values, indices) pair. The keyword
# form is refused here; the positional x.max(1) cannot be told from NumPy's max(axis=1) and gives the values alone
# (so a ported x.max(1)[0] is the first row's max, silently): port it as x.amax(1)
TORCH_MEANS_OTHERWISE = {name: f"torch.{name}(x, dim) returns (values, indices); {name} here is a{name} (the values "
                               f"only): write a{name}(dim=...) for the values, arg{name}(dim=...) for the indices"
                         for name in ("max", "min")}


def torch_names(fn):
    """`fn`, taking torch's names for its axis arguments too (TORCH_NAMES): the one place that maps them, for every
    op (functional's `@op`) and Tensor method (`take_torch_names`). Both spellings at once is a TypeError naming
    the op, as is a torch spelling that means something else here (TORCH_MEANS_OTHERWISE)."""
    parameters = inspect.signature(fn).parameters
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)  # not *axes
    renames = {theirs: ours for theirs, ours in TORCH_NAMES if ours in parameters and parameters[ours].kind in named}
    if not renames:
        return fn

    @functools.wraps(fn)
    def taking_torch_names(*args, **kwargs):
        if kwargs and not renames.keys().isdisjoint(kwargs):
            kwargs = _engine_names(fn.__name__, kwargs, renames)
        return fn(*args, **kwargs)
    return taking_torch_names


def _engine_names(op: str, kwargs: dict, renames: dict) -> dict:
    if op in TORCH_MEANS_OTHERWISE:
        given = ", ".join(f"{k}=" for k in kwargs if k in renames)
        raise TypeError(f"{op}: {given} is torch's spelling, and {TORCH_MEANS_OTHERWISE[op]}")
    out = {}
    for key, value in kwargs.items():
        ours = renames.get(key, key)
        if ours in out or (ours != key and ours in kwargs):
            theirs = key if ours != key else next(k for k in kwargs if renames.get(k) == ours)
            raise TypeError(f"{op}: got both {theirs}= and {ours}=, torch's and NumPy's names for one argument; "
                            f"give one")
        out[ours] = value
    return out


def take_torch_names(cls) -> None:
    """Every method of `cls` with an axis argument takes torch's names for it too (torch_names)."""
    for name, method in list(vars(cls).items()):
        if inspect.isfunction(method) and torch_names(method) is not method:
            setattr(cls, name, torch_names(method))

