"""--threads N for the benchmarks: the same thread count for every library on both sides (OpenBLAS under
NumPy, numba's pool, torch's intra-op pool). Read from sys.argv before NumPy loads, since OpenBLAS fixes its
pool when it starts. On a machine shared with other work, --threads 1 keeps spinning thread pools (torch's
OpenMP pool above all) from measuring the load instead of the code."""
import os
import sys


def threads_from_argv(default: int | None = None) -> int | None:
    n = default
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            n = int(sys.argv[i + 1])
        elif arg.startswith("--threads="):
            n = int(arg.split("=", 1)[1])
    if n is not None:
        if n < 1:
            raise SystemExit(f"--threads must be >= 1, got {n}")
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            os.environ[var] = str(n)
    import tinygrad_ssm  # noqa: F401  (after the counts, before the script's NumPy: tinygrad_ssm/fast/blas_threads.py)
    return n


def apply_to_torch(n: int | None):
    if n is not None:
        import torch
        torch.set_num_threads(n)
