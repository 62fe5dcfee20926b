"""Data-parallel training over MPI (mpi4py): ranks, gradient averaging in flat buckets, overlap with backward.

Horovod's recipe: every rank holds the whole model and computes the gradient of its own share of the global
batch; the gradients are averaged with MPI Allreduce, and every rank applies the same optimizer step, so the
weights stay identical without ever being sent. PyTorch DDP's refinements, both here:
- buckets: the gradients travel in a few flat buffers of about `bucket_bytes` (one MPI call per bucket, not
  one per parameter), in reverse registration order, roughly the order the backward walk finishes them;
- overlap: a bucket's non-blocking Iallreduce starts as soon as its last gradient is final during the
  backward walk (`Tensor.register_post_accumulate_grad_hook`), so communication runs beside the rest of
  the backward. Buckets are launched strictly in index order, so every rank issues the same collectives
  in the same order (MPI requires it), whatever order its hooks fire in;
- accumulation: several backwards a step (micro-batches), all but the last inside `reducer.no_sync()`, so that
  the sums travel once, during the last backward.

mpi4py is optional (`pip install -e ".[distributed]"` in a checkout, which also brings the mpich wheel and its
`mpiexec`). Nothing imports it unless `init()` is called; `launcher_world_size()` only reads the environment.

    from tinygrad_ssm import distributed as dist
    world = dist.init()                                   # World(rank, size, comm)
    reducer = dist.GradientAllreducer(model.varmap, world)
    for ...:
        opt.zero_grad(); model.loss(x[my_rows], y[my_rows]).backward()
        reducer.finish()                                  # every .grad is now the mean over ranks
        opt.step()
"""
from __future__ import annotations

import os

from .consistency import (broadcast_weights_and_optimizers, check_same_weights,  # noqa: F401 (the API)
                          weight_checksums)
from .gradients import GradientAllreducer
from .world import (_RANK_VARS, _WORLD_SIZE_VARS, INSTALL_HINT, SINGLE, DistributedError,  # noqa: F401
                    RanksDisagree, RanksDiverged, SetupFailedOnAnotherRank, World, launcher_rank,
                    launcher_world_size)

_world: World | None = None


def init(required: bool = True) -> World:
    """Import mpi4py (initialising MPI) and return this process's World. Without mpi4py: a DistributedError
    saying how to install it when `required`, else the single-process World."""
    global _world
    if _world is not None:
        return _world
    try:
        from mpi4py import MPI
    except ImportError as e:
        if required:
            raise DistributedError(f"distributed training needs mpi4py, which cannot be imported ({e}); "
                                   f"install it with: {INSTALL_HINT}") from e
        return SINGLE
    comm = MPI.COMM_WORLD
    launched = launcher_world_size()
    if launched > 1 and comm.Get_size() == 1:                           # N lone copies would clash in one folder
        var = next(v for v in _WORLD_SIZE_VARS if os.environ.get(v, "").isdigit())
        raise DistributedError(f"{var}={os.environ[var]} says a launcher started {launched} processes, but MPI "
                               f"sees this one alone: started by another MPI's mpiexec than mpi4py's, or {var} is "
                               f"left over in the environment; use the mpiexec of mpi4py's MPI (the mpich wheel's, "
                               f"beside this Python) or unset {var}")
    _world = World(comm.Get_rank(), comm.Get_size(), comm)
    return _world


def _current() -> World:
    """The World of init(); alone (no launcher, or a launcher of 1) the single-process World. Under a launcher of
    N > 1 before init() a DistributedError (as Horovod's "has not been initialized"): 0 / 1 would be wrong there."""
    if _world is not None:
        return _world
    launched = launcher_world_size()
    if launched > 1:
        raise DistributedError(f"tinygrad_ssm.distributed has not been initialized, but a launcher started {launched} "
                               f"processes: call world = tinygrad_ssm.distributed.init() first (then rank() and "
                               f"world_size() are this process's), or pass world.rank / world.size on")
    return SINGLE


def rank() -> int:
    """This process's rank (0 alone); under mpiexec -n N (N > 1) only after init()."""
    return _current().rank


def world_size() -> int:
    """The number of ranks (1 alone); under mpiexec -n N (N > 1) only after init()."""
    return _current().size


def allreduce_gradients(params, world: World | None = None, bucket_bytes: int = 1 << 20) -> None:
    """Blocking: set every .grad of `params` (a VarMap or (name, tensor) pairs) to its mean over the ranks."""
    reducer = GradientAllreducer(params, world or init(), bucket_bytes, overlap=False)
    reducer.finish()
