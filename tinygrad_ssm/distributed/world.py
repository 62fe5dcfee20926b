"""This process's place in an MPI job (mpi4py): the launcher's environment, the World (rank, size, comm) and its
collectives that fail together (agree, on_root, abort), and the errors the ranks raise alike. Nothing imports
mpi4py until `tinygrad_ssm.distributed.init()` is called; this module loads without numba, so that `python -m
tinygrad_ssm` under mpiexec starts MPI before the rest of the package (__main__.py)."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np

# environment variables that MPI launchers set in every process they start: MPICH/Intel MPI (hydra), Open MPI
_WORLD_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
INSTALL_HINT = ('pip install -e ".[distributed]" in the package\'s checkout (mpi4py and the mpich wheel, which '
                'brings mpiexec)')


def _named_parameters(params, who: str):
    """optim's named_parameters, imported when first needed: this module loads without numba (the optimizers' kernels),
    so that `python -m tinygrad_ssm` under mpiexec starts MPI before the second or more the rest takes (__main__.py)."""
    from ..optim.optimizer import named_parameters
    return named_parameters(params, who)


class DistributedError(RuntimeError):
    """MPI is needed but missing, or the ranks disagree (about the setup, or their weights)."""


class SetupFailedOnAnotherRank(ValueError):
    """Raised on the ranks whose setup succeeded when another rank's failed: every rank stops together."""


class RanksDisagree(ValueError):
    """The ranks built different things (another package version or model on one): refused on every rank before
    the first step, as a flag that differs between ranks is."""


class RanksDiverged(DistributedError):
    """The weights differ between ranks: data-parallel training would silently train several models."""


def launcher_world_size() -> int:
    """The number of processes an MPI launcher (mpiexec, mpirun) started, from its environment; 1 otherwise."""
    for var in _WORLD_SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def launcher_rank() -> int:
    """This process's rank as the MPI launcher's environment states it (before or without MPI); 0 otherwise."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


@dataclass(frozen=True)
class World:
    """This process's place in the job: `rank` in 0..size-1; `comm` is mpi4py's COMM_WORLD (None alone)."""

    rank: int = 0
    size: int = 1
    comm: object = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def sum(self, values) -> np.ndarray:
        """Blocking Allreduce (sum) of a small float64 vector, e.g. [loss, stop requested]."""
        values = np.ascontiguousarray(values, dtype=np.float64)
        if self.size == 1:
            return values
        from mpi4py import MPI

        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op=MPI.SUM)
        return out

    def machines(self, measure) -> list[tuple[str, int, object]]:
        """(host name, ranks on it, `measure()` as its first rank found it) for every machine of the job (MPI's
        shared-memory split): e.g. each machine's memory, which its ranks share. A collective, every rank calls it."""
        import socket
        if self.size == 1:
            return [(socket.gethostname(), 1, measure())]
        from mpi4py import MPI

        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            mine = (socket.gethostname(), local.Get_size(), measure()) if local.Get_rank() == 0 else None
            return [machine for machine in self.comm.allgather(mine) if machine is not None]
        finally:
            local.Free()

    def agree(self, fn, *args, **kwargs):
        """Run fn on every rank; if it raised on any rank, raise on every rank (this rank's own exception, or
        SetupFailedOnAnotherRank naming the rank and its message), so no rank goes on alone and waits."""
        try:
            result, error = fn(*args, **kwargs), None
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            result, error = None, e
        if self.size > 1:
            failures = self.comm.allgather(None if error is None else f"{type(error).__name__}: {error}")
            if error is None and any(failures):
                error = SetupFailedOnAnotherRank("; ".join(f"rank {r} of {self.size} failed: {m}"
                                                           for r, m in enumerate(failures) if m))
        if error is not None:
            error.raised_on_every_rank = True  # train() lets it end this rank normally: no rank is waiting
            raise error
        return result

    def on_root(self, fn, *args, **kwargs):
        """fn on rank 0 alone (e.g. writing a file), its JSON-serialisable result sent to every rank. If it raised an
        OSError or a ValueError, every other rank raises one alike (FileExistsError, OSError with the errno and
        file name, or ValueError, with rank 0's message), so all ranks stop together and the job ends as one
        process would; rank 0 re-raises its own. Anything else propagates on rank 0 alone (train() aborts the job)."""
        result, error = None, None
        if self.is_root:
            try:
                result = fn(*args, **kwargs)
            except (OSError, ValueError) as e:
                error = e
        if self.size > 1:
            about = None if error is None else [isinstance(error, FileExistsError), isinstance(error, OSError),
                                                error.errno if isinstance(error, OSError) else None,
                                                getattr(error, "strerror", None), getattr(error, "filename", None),
                                                str(error)]
            result, about = self.broadcast_json([result, about] if self.is_root else None)
            if about is not None and not self.is_root:
                exists, is_os, number, text, filename, message = about
                error = (FileExistsError(message) if exists else OSError(number, text, filename) if number is not None
                         else OSError(message) if is_os else ValueError(message))
        if error is not None:
            error.raised_on_every_rank = True  # train() lets it end this rank normally: no rank is waiting
            raise error
        return result

    def abort(self, error: BaseException, code: int = 1, message: str | None = None) -> None:
        """Print this rank's error and end the whole job (MPI_Abort): no rank is left waiting in a collective.
        `message`: the error in the caller's words, one line without a traceback (a file that cannot be written)."""
        who = f"[rank {self.rank} of {self.size}]"
        if threading.current_thread() is threading.main_thread():  # the job is ending: a Ctrl-C (the launcher
            signal.signal(signal.SIGINT, signal.SIG_IGN)            # passes one on) must not cut this short
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        parts = (f"{who} error: {type(error).__name__}: {error}\n", f"{who} aborting the whole MPI job\n",
                 f"{who} {text}")
        if message is not None:
            parts = (f"{who} error: {message}\n", f"{who} aborting the whole MPI job\n")
        elif isinstance(error, KeyboardInterrupt):  # the user's own stop: no traceback
            parts = (f"{who} stopped by Ctrl-C: aborting the whole MPI job now (checkpoints are written atomically: "
                     f"the last one is intact)\n",)
        for part in parts:  # the message first: a launcher may drop the tail when the job ends
            sys.stderr.write(part)
            sys.stderr.flush()
        time.sleep(1.0)  # let the launcher forward this text first: MPI_Abort tears the job down at once
        self.comm.Abort(code)
        os._exit(code)   # MPICH's Abort may return before the launcher's teardown reaches this process: never go on

    def broadcast_arrays(self, arrays: dict | None, root: int = 0) -> dict:
        """{name: array} on `root` -> the same dict on every rank (a JSON header, then one Bcast per array)."""
        if self.size == 1:
            return arrays
        header = None
        if self.rank == root:
            arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # 0-d stays 0-d
            header = json.dumps([[k, v.dtype.str, list(v.shape)] for k, v in arrays.items()])
        header = json.loads(self.comm.bcast(header, root=root))
        out = {}
        for name, dtype, shape in header:
            buf = arrays[name] if self.rank == root else np.empty(tuple(shape), dtype=np.dtype(dtype))
            self.comm.Bcast(buf, root=root)
            out[name] = buf
        return out

    def broadcast_json(self, value, root: int = 0):
        """A JSON-serialisable value from `root` to every rank (sent as JSON text: nothing is pickled but a str)."""
        if self.size == 1:
            return value
        return json.loads(self.comm.bcast(json.dumps(value) if self.rank == root else None, root=root))


SINGLE = World()
