"""Continuing a run from its checkpoint (train --resume): the weights, moments, step, counters and sampler put
back, each file checked before anything is changed, and what a resumed run tells about itself where it cannot
continue bit for bit."""
from __future__ import annotations

from pathlib import Path

import numba

from . import checkpoint as ckpt
from .optimizers import load_flat_optimizer_state


def restore(run, state: dict, resume_dir: Path | None) -> None:
    """The checkpoint's step, counters and sampler on every rank of `run` (loop._Run); weights and moments from disk
    on rank 0 (the others receive them in share_training_state)."""
    if run.world.is_root:  # weights and moments checked finite before anything is written (the log)
        run.model.varmap.load(resume_dir / "model.safetensors")
        ckpt.check_loaded_state(resume_dir, "model.safetensors", run.model.varmap.named_vars())
        moments = ckpt.load_optimizer_state(resume_dir)
        ckpt.check_loaded_state(resume_dir, ckpt.OPTIMIZER_FILE, moments.items())
        ckpt.check_optimizer_steps(resume_dir, state["step"], moments)
        load_flat_optimizer_state(run.optimizers, moments, repr(str(resume_dir / ckpt.OPTIMIZER_FILE)))
        run.log.resume_at(state["step"], newest_saved_step(run.out))
    run.sampler.load_state_dict(state["sampler"])
    run.step, run.tokens, run.train_s = state["step"], state["tokens"], state["train_s"]
    run.val_bpb, run.val_step = state.get("val_bpb"), state.get("val_bpb_step")
    run.last_ckpt, run.saved_step = resume_dir, run.step


def newest_saved_step(out: Path) -> int | None:
    """The step of the checkpoint LATEST names in the run folder `out` (None: none, or none readable)."""
    try:
        return ckpt.step_of(ckpt.resolve_checkpoint(out).name)
    except (ckpt.CheckpointNotFound, OSError, ValueError):
        return None


def resume_notes(state: dict, world_size: int) -> list[str]:
    """What differs from the run that saved `state` so that the resumed one continues equal up to rounding only."""
    notes, threads = [], numba.get_num_threads()
    if state.get("world_size", 1) != world_size:
        notes.append(f"note: saved with {state.get('world_size', 1)} MPI rank(s), resumed with {world_size}: the "
                     f"same global batches, the gradients summed in another order (equal up to rounding, not bit "
                     f"for bit)")
    if state.get("threads", threads) != threads:  # the fused products cut their work by thread (fast/products.py)
        notes.append(f"note: saved with {state['threads']} thread(s), resumed with {threads}: the fused products "
                     f"cut their work into one BLAS call per thread, whose rounding can differ (equal up to "
                     f"rounding, not bit for bit; NUMBA_NUM_THREADS={state['threads']} continues bit for bit)")
    return notes
