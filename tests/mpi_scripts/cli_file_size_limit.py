"""`mpiexec -n 2 python cli_file_size_limit.py BYTES train ...`: the CLI, with rank 0's file size limit (ulimit -f) set
to BYTES after MPI started (the launcher's own files are not limited): rank 0's checkpoint write fails."""
import resource
import sys

from tinygrad_ssm import distributed as dist
from tinygrad_ssm.train import cli

if dist.init().rank == 0:
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
sys.exit(cli.main(sys.argv[2:]))
