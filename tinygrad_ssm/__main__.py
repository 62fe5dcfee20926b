"""python -m tinygrad_ssm: see train/cli.py."""
import sys

from . import distributed  # NumPy and the standard library: mpi4py only in init()

if distributed.launcher_world_size() > 1:
    # Under mpiexec, MPI starts first (a tenth of a second): a rank that ended while the ranks still load (a Ctrl-C, a
    # broken numba on one machine) left the others waiting in MPI_Init for ever; once MPI is up it ends the job. A
    # launcher that does not match mpi4py's MPI is said by the command's own init() below.
    try:
        distributed.init(required=False)
    except distributed.DistributedError:
        pass
try:
    from .train.cli import main  # numba and the kernels load here: a second or more
except BaseException as error:   # noqa: BLE001 (a Ctrl-C, a failed import: under MPI the whole job ends with it)
    world = distributed._world
    code = 130 if isinstance(error, KeyboardInterrupt) else 1   # train/output_errors.py's 130 for a Ctrl-C
    if world is not None and world.size > 1:
        world.abort(error, code)
    if isinstance(error, KeyboardInterrupt):  # alone: exit 130, as later, no traceback
        sys.exit(130)
    raise
sys.exit(main())
