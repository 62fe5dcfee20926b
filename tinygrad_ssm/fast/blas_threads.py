"""OpenBLAS's worker threads should go to sleep as soon as a matmul ends. Imported first by the package, before
NumPy loads OpenBLAS (it reads the setting once, when it starts).

After each product OpenBLAS's threads spin, by default for 2^28 cycles (about a tenth of a second), waiting for
the next one. In a training step a numba kernel follows nearly every matmul, and on 2 cores the spinning thread
takes one of the two from it: a b=8 x 512 step took 0.67-0.88 s with the default and 0.48-0.51 s with 2^4
(`benchmarks/profile_step.py`, runs interleaved; the wake-up a product then pays is microseconds).

OPENBLAS_THREAD_TIMEOUT already in the environment wins. If NumPy was imported before tinygrad_ssm, OpenBLAS
has started with its default: set OPENBLAS_THREAD_TIMEOUT=4 in the environment instead (`took_effect` says).
"""
from __future__ import annotations

import os
import sys

SPIN_EXPONENT = "4"   # OpenBLAS spins 2^SPIN_EXPONENT rounds before sleeping (it accepts 4..30)

took_effect = "numpy" not in sys.modules
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_EXPONENT)
