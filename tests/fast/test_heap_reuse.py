"""tinygrad_ssm/fast/heap_reuse.py: once the package is imported, arrays allocated and freed step after step reuse
the same memory instead of faulting in fresh pages (what that saves a training step is measured by
benchmarks/profile_step.py, not asserted here)."""
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc's")

# A step's worth of arrays (a few MB each, like a training step's activations), made and freed five times;
# prints the page faults those five steps took, and whether the setting took effect.
SCRIPT = """
import resource, sys
{first}
import numpy as np
def step():
    arrays = [np.ones(n, np.float32) for n in (5_000_000, 1_000_000, 250_000, 3_000_000)]
    del arrays
    a = np.ones(4_000_000, np.float32); b = a * 2; del a, b
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
took_effect = sys.modules["tinygrad_ssm.fast.heap_reuse"].took_effect if "tinygrad_ssm" in sys.modules else None
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, took_effect)
"""


def _faults(first: str, **env) -> tuple:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(first=first)], env=environ, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), {"True": True, "False": False, "None": None}[out[1]]


def test_freed_arrays_are_reused_without_page_faults():
    faults, took_effect = _faults("import tinygrad_ssm")
    assert took_effect
    assert faults < 20, f"{faults} page faults in 5 steps of reused array sizes"


def test_without_it_the_steps_fault():
    """The baseline that makes the test above mean something: without the package (glibc's adaptive defaults)
    the same steps take fresh pages again and again."""
    faults, took_effect = _faults("")
    assert took_effect is None
    assert faults > 100


def test_the_environment_wins():
    _, took_effect = _faults("import tinygrad_ssm", MALLOC_TRIM_THRESHOLD_="134217728")
    assert took_effect is False
