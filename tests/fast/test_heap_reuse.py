"""tinygrad_ssm/fast/heap_reuse.py: once a fused model is built, arrays allocated and freed step after step reuse
the same memory instead of faulting in fresh pages; importing the package alone changes nothing (what that saves
a training step is measured by benchmarks/profile_step.py, not asserted here)."""
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
{setup}
import numpy as np
def step():
    arrays = [np.ones(n, np.float32) for n in (5_000_000, 1_000_000, 250_000, 3_000_000)]
    del arrays
    a = np.ones(4_000_000, np.float32); b = a * 2; del a, b
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
module = sys.modules.get("tinygrad_ssm.fast.heap_reuse")
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, module.took_effect if module else None)
"""
FUSED_MODEL = ("import tinygrad_ssm as tg; tg.Mamba2LMHeadModel(tg.Mamba2Config(d_model=16, n_layer=1, "
               "vocab_size=16, d_state=4, headdim=8), fused=True)")


def _faults(setup: str, **env) -> tuple:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and
               k != "TINYGRAD_SSM_KEEP_FREED_MEMORY"} | env
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(setup=setup)], env=environ, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), {"True": True, "False": False, "None": None}[out[1]]


def test_a_fused_model_makes_freed_arrays_be_reused_without_page_faults():
    faults, took_effect = _faults(FUSED_MODEL)
    assert took_effect
    assert faults < 20, f"{faults} page faults in 5 steps of reused array sizes"


def test_importing_the_package_changes_nothing():
    """The baseline that makes the test above mean something, and the import's promise: with the package imported
    (even its models), glibc's adaptive defaults stay and the same steps take fresh pages again and again."""
    faults, took_effect = _faults("import tinygrad_ssm, tinygrad_ssm.models")
    assert took_effect is False
    assert faults > 100


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "134217728"}, {"TINYGRAD_SSM_KEEP_FREED_MEMORY": "0"}])
def test_the_environment_wins(env):
    faults, took_effect = _faults(FUSED_MODEL, **env)
    assert took_effect is False
