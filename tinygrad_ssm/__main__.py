"""python -m tinygrad_ssm: see train/cli.py."""
import signal
import sys


def _terminated(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


# SIGTERM is a Ctrl-C for every command (exit 130, as --help says): until a command takes both signals over, from
# here on (while the package loads and a run is set up it killed the process, exit 143, without a word: a fuzz)
signal.signal(signal.SIGTERM, _terminated)

from . import distributed  # noqa: E402  NumPy and the standard library: mpi4py only in init()

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
