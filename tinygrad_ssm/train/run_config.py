"""The run's config, fresh or resumed: train's settings and flags (a fresh run), or the checkpoint's with the flags
a resume may change, every one checked (train/checks.py) against the run's vocabulary, the steps done and, under
MPI, the ranks in all and each machine's ranks and memory; resolved on rank 0 alone and sent to the others."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from ..distributed import World
from . import checkpoint as ckpt
from .checks import check_train_config, physical_memory_bytes, train_config_problems
from .config import TrainConfig, _resume_config
from .run_folder import MARKER_FILE
from .starting_point import paths_as_saved, resolve_starting_point, run_vocab_size


def resolve_config(cfg, resume, overrides, stop_at, say, ranks: tuple = (1, None)
                    ) -> tuple[TrainConfig, dict | None, Path | None]:
    """The run's config: the saved one (checked against `overrides`) with `resume`, else cfg + overrides;
    every flag checked (train/checks.py), `stop_at` against the steps done and to do. `ranks`: the MPI ranks in
    all, and (name, ranks, memory) of each machine of the job (World.machines; None: this machine alone)."""
    # a Path as out is a str, as data and init_from take one (out=Path(...) was refused as "not a string")
    overrides = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in (overrides or {}).items()}
    if cfg is not None and isinstance(cfg.out, os.PathLike):
        cfg = dataclasses.replace(cfg, out=os.fspath(cfg.out))
    if resume is None:
        cfg = dataclasses.replace(cfg or TrainConfig(), **overrides)
        cfg.init_from_sha256 = None   # the files --init-from reads, hashed when the run starts (a value given was kept)
        for field in ("data", "val_data"):  # absolute, so that --resume works from any folder
            if getattr(cfg, field) is not None:
                setattr(cfg, field, str(Path(getattr(cfg, field)).expanduser().absolute()))
        # a setting of `cfg` that differs from the default was given as much as a flag (train(TrainConfig(...)) from
        # Python): --init-from then neither replaces its tokenizer nor lets its shape pass unchecked
        default = TrainConfig()
        set_in_cfg = {k: v for k, v in dataclasses.asdict(cfg).items() if v != getattr(default, k)}
        # a field set in cfg was given as much as a flag: train(TrainConfig(warmup_steps=100, steps=4)) was shortened
        given = {**set_in_cfg, **overrides}
        try:
            resolve_starting_point(cfg, given, say)
        except (ValueError, ckpt.CheckpointNotFound) as e:  # said with the other flags' problems, not before them
            others = train_config_problems(cfg, tuple(given), stop_at, machine=False)
            if not others:
                raise
            raise ValueError("\n  " + "\n  ".join([str(e), *others])) from None
        check_train_config(cfg, tuple(given), stop_at, 0, vocab_size=run_vocab_size(cfg), ranks=ranks[0],
                           machines=ranks[1])
        return _plain(cfg), None, None
    if cfg is not None and cfg != TrainConfig():   # it was ignored: the run went on with its saved settings alone
        raise ValueError("train(cfg, resume=...): a resumed run takes its saved settings, and those it may change as "
                         "overrides={field: value} (the flags of `train --resume`); pass cfg=None")
    try:
        resume_dir = ckpt.resolve_checkpoint(resume)
    except ckpt.CheckpointNotFound as e:
        folder = Path(resume).expanduser()
        if (folder / MARKER_FILE).is_file() and not (folder / ckpt.CHECKPOINTS_DIR).exists():   # ours, unsaved
            raise ckpt.CheckpointNotFound(f"--resume {resume}: this run stopped before its first checkpoint "
                                          f"(one every --checkpoint-every steps), so there is nothing to resume; "
                                          f"start it again with --out {resume} and its flags") from None
        raise ckpt.CheckpointNotFound(f"--resume: {e}") from None               # the flag named, as every error
    state = ckpt.load_trainer_state(resume_dir)
    cfg = _resume_config(state["train_config"], paths_as_saved(overrides or {}, state["train_config"]))
    # the warmup the run had: a run of 6 steps warmed up over 6 of the default 10 (_setup's min); resumed with
    # --steps 12 it warmed up again from step 6 to 10, its lr falling and rising
    cfg.warmup_steps = min(cfg.warmup_steps, state["train_config"]["steps"])
    if cfg.steps != state["train_config"]["steps"]:
        say(f"note: --steps changed from {state['train_config']['steps']} to {cfg.steps}: the learning-rate "
            f"schedule now spans {cfg.steps} steps, so this run is not the one it would have been")
    if "out" not in (overrides or {}):
        cfg.out = str(ckpt.run_dir_of(resume_dir))
    check_train_config(cfg, tuple(overrides or {}), stop_at, state["step"], vocab_size=run_vocab_size(cfg, state),
                       ranks=ranks[0], machines=ranks[1])
    return _plain(cfg), state, resume_dir


def _plain(cfg: TrainConfig) -> TrainConfig:
    """NumPy numbers the checks took (np.int64(4) is an int) as Python's: the run's marker and log are JSON, where
    one failed after the folder was made (an audit of train() from Python)."""
    for field in dataclasses.fields(cfg):
        if isinstance(value := getattr(cfg, field.name), np.generic):
            setattr(cfg, field.name, value.item())
    return cfg


def resolve_on_root(cfg, resume, overrides, stop_at, say, world: World):
    """resolve_config on rank 0 alone (the checkpoint need only be readable there); the config and the
    saved trainer state are sent to the other ranks."""
    ranks = (world.size, world.machines(physical_memory_bytes))   # each machine's memory, checked on the root
    resolved = world.agree(lambda: resolve_config(cfg, resume, overrides, stop_at, say, ranks) if world.is_root
                           else None)
    if world.size == 1:
        return resolved
    cfg_dict, state, resume_dir = world.broadcast_json(
        [resolved[0].to_dict(), resolved[1], resolved[2] and str(resolved[2])] if world.is_root else None)
    return TrainConfig.from_dict(cfg_dict), state, resolved[2] if world.is_root else resume_dir and Path(resume_dir)
