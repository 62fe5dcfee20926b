"""tinygrad_ssm/fast/blas_threads.py: importing the package first tells OpenBLAS to put its threads to sleep right
after a matmul (what that buys is measured by benchmarks/profile_step.py, not asserted here)."""
import os
import subprocess
import sys

SCRIPT = ("import {first}, os, tinygrad_ssm.fast.blas_threads as b; "
          "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), b.took_effect)")


def _run(first: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"} | env
    return subprocess.run([sys.executable, "-c", SCRIPT.format(first=first)], env=environ, capture_output=True,
                          text=True, check=True).stdout.split()


def test_set_before_numpy_loads():
    assert _run("tinygrad_ssm") == ["4", "True"]


def test_the_environment_wins():
    assert _run("tinygrad_ssm", OPENBLAS_THREAD_TIMEOUT="20") == ["20", "True"]


def test_numpy_first_is_reported():
    assert _run("numpy")[1] == "False"
