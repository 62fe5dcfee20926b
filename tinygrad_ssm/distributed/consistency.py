"""The ranks stay identical: rank 0's weights and optimizer states sent to the others, the weights' checksums
compared, and before either, every rank's parameters and optimizers compared with rank 0's (RanksDisagree on
every rank at the first difference)."""
from __future__ import annotations

import zlib

import numpy as np

from .world import RanksDisagree, RanksDiverged, World, _named_parameters


def _same_layout(world: World, who: str, named, optimizers: dict | None = None) -> None:
    """Every rank holds the parameters of rank 0 (names, shapes, dtypes, in order) and the same optimizers over
    them; else RanksDisagree on every rank, naming the first difference. Checked before the collectives that read
    them: a rank with a parameter more failed alone (the others hung), another shape or dtype was broadcast into
    silently, another count made MPI abort the job."""
    if world.size == 1:
        return
    mine = [[name, list(p.shape), str(p.dtype)] for name, p in named]
    kinds = {g: [type(o).__name__, [n for n, _ in o.params]] for g, o in (optimizers or {}).items()}
    layouts = world.comm.allgather([mine, kinds])
    differ = [r for r, layout in enumerate(layouts) if layout != layouts[0]]
    if differ:
        (root, root_kinds), (other, other_kinds) = layouts[0], layouts[differ[0]]
        if other != root:
            first = next((f"parameter {_spec(*a)} there, {_spec(*b)} on rank 0" for a, b in zip(other, root) if a != b),
                         f"{len(other)} parameters there, {len(root)} on rank 0")
        else:
            first = _first_optimizer_difference(other_kinds, root_kinds)
        error = RanksDisagree(f"{who}: rank(s) {differ} hold other parameters or optimizers than rank 0 ({first}): "
                              f"every rank must build the same model and optimizers")
        error.raised_on_every_rank = True
        raise error


def _spec(name: str, shape: list, dtype: str) -> str:
    return f"{name!r} {tuple(shape)} {dtype}"


def _first_optimizer_difference(other: dict, root: dict) -> str:
    """The first optimizer ({group: [class, parameter names]}) of another rank that is not rank 0's, in words."""
    group = next(g for g in sorted({*other, *root}) if other.get(g) != root.get(g))
    if group not in other or group not in root:
        return f"optimizer {group!r} {'missing there' if group in root else 'there, not on rank 0'}"
    (kind, names), (root_kind, root_names) = other[group], root[group]
    if kind != root_kind or len(names) != len(root_names):
        return (f"optimizer {group!r}: {kind} of {len(names)} parameters there, {root_kind} of {len(root_names)} on "
                f"rank 0")
    name, root_name = next((a, b) for a, b in zip(names, root_names) if a != b)
    return f"optimizer {group!r}: parameter {name!r} there, {root_name!r} on rank 0"


def broadcast_weights_and_optimizers(varmap, optimizers: dict, world: World) -> None:
    """Rank 0's weights and optimizer states (e.g. just loaded from a checkpoint) to every other rank, once every
    rank is found to hold the same parameters and optimizers; a state one rank refuses is raised on every rank."""
    named = varmap.named_vars()
    _same_layout(world, "broadcast_weights_and_optimizers", named, optimizers)
    weights = world.broadcast_arrays({n: p.data for n, p in named} if world.is_root else None)
    if not world.is_root:
        for name, p in named:
            p.data[...] = weights[name]
            p._bump()  # written in place: a graph that saved the old value must not backward
    for group in sorted(optimizers):
        state = world.broadcast_arrays(optimizers[group].state_dict() if world.is_root else None)
        world.agree(lambda: None if world.is_root else optimizers[group].load_state_dict(state))  # noqa: B023


def weight_checksums(params) -> np.ndarray:
    """CRC-32 of each parameter's bytes, in registration order (int64): cheap, and any bit flip shows."""

    return np.array([zlib.crc32(np.ascontiguousarray(p.data).tobytes())
                     for _, p in _named_parameters(params, "weight_checksums")], dtype=np.int64)


def check_same_weights(params, world: World, step: int) -> None:
    """Compare every rank's weights (checksums) with rank 0's; raise RanksDiverged on every rank if any differ.
    (Whether a checkpoint is left to resume from is the caller's to say: train() adds it to the message.)"""
    if world.size == 1:
        return
    _same_layout(world, "check_same_weights", _named_parameters(params, "check_same_weights"))
    mine = weight_checksums(params)
    every = np.empty((world.size, mine.size), dtype=np.int64)
    world.comm.Allgather(mine, every)
    differ = every != every[0]
    if differ.any():
        names = [n for n, _ in _named_parameters(params, "check_same_weights")]
        bad = sorted({names[j] for j in np.nonzero(differ.any(axis=0))[0]})
        ranks = [r for r in range(world.size) if differ[r].any()]
        raise RanksDiverged(f"after step {step} the weights of rank(s) {ranks} differ from rank 0's in "
                            f"{len(bad)} parameters ({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); "
                            f"data-parallel ranks must stay identical, so the run stops here")
