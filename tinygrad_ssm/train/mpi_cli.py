"""The command line under an MPI launcher (`mpiexec -n N`, N > 1): what only `train` can do there, and the
commands a data-parallel run suggests, which must be started the same way."""
from __future__ import annotations

import sys

from .. import distributed

SINGLE_PROCESS_COMMANDS = ("generate", "eval", "export")


def this_rank() -> int:
    """The rank of this process: MPI's when initialised, else the launcher's environment's."""
    return distributed._world.rank if distributed._world is not None else distributed.launcher_rank()


def refuse_single_process_commands(args, code: int | None, exit_usage: int) -> tuple[object, int | None]:
    """(args, exit status) of the ranks' agreement on their arguments, passed on; but `generate` / `eval` / `export`
    under `mpiexec -n N` (every rank would run the whole command: the output N times, N writers of the same files)
    are refused on every rank at once, rank 0 alone saying so: (None, exit_usage)."""
    if code is not None or args.command not in SINGLE_PROCESS_COMMANDS:
        return args, code
    command = args.command
    if this_rank() == 0:
        n = distributed.launcher_world_size()
        print(f"error: `{command}` runs in one process, but mpiexec started {n}: every rank would run it (its "
              f"output {n} times, {n} processes writing the same files); only `train` is data-parallel. Run it "
              f"without mpiexec: python -m tinygrad_ssm {command} ...", file=sys.stderr)
    return None, exit_usage


def python_cmd(world_size: int | None = None) -> str:
    """How a command that continues a run of `world_size` ranks (None: this job's) starts: `mpiexec -n N python`
    under MPI, else `python`."""
    if world_size is None:
        world_size = distributed._world.size if distributed._world is not None else 1
    return f"mpiexec -n {world_size} python" if world_size > 1 else "python"
