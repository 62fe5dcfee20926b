"""The CUDA kernels type and lower for the real CUDA target, with no GPU and no CUDA toolkit; and a numba-cuda
that cannot compile here (a NumPy it does not support) makes the backend unavailable, by name, instead of failing
inside a forward.

The simulator (tests/scan/test_ssd_cuda.py) runs the kernels as Python, so it never type-checks them: a kernel that
mixes types, or calls what the CUDA target lacks, would pass there and fail on a GPU. Here numba-cuda's compiler
types every kernel and lowers it to LLVM IR for compute capability 9.0 (the step before NVVM, which needs the
toolkit), in float32 and float64, and the float32 kernels must hold no double-precision arithmetic. This needs
numba without the simulator, so it runs in the main pytest process.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[test]' installs it)", allow_module_level=True)

from tinygrad_ssm.scan import cuda as numba_cuda, cuda_availability  # noqa: E402

if numba_cuda.simulated():
    pytest.skip("compiling for the real CUDA target needs numba imported without NUMBA_ENABLE_CUDASIM",
                allow_module_level=True)

from numba import types  # noqa: E402
from numba.cuda.compiler import compile_cuda  # noqa: E402

# each kernel's arguments as forward_device / backward_device pass them: ("a", ndim) an array, "i" an int
SIGNATURES = {
    "chunk_states": [4, 3, 1, 4, "i", "i", 5, 3],                      # x dt A B r q local_states log_decay
    "pass_chunks": [4, 5, 3, "i", 5],                                  # start local log_decay reverse boundary
    "chunk_outputs": [4, 3, 1, 4, 4, 1, 5, "i", "i", 4],               # x dt A B C D boundary r q y
    "chunk_grad_states": [4, 3, 1, 4, "i", "i", 5],                    # dy dt A C r q local_grads
    "chunk_grad_rows": [4, 3, 1, 4, 4, 1, 4, 5, "i", "i", 4, 4],       # x dt A B C D dy grad_boundary r q dx dD
    "chunk_grad_columns": [4, 3, 1, 4, 4, 4, 5, 5, "i", "i", 4, 4, 4],  # x dt A B C dy boundary grad_b r q V W
                                                                         # end_dots
    "decay_grads": [4, 3, 1, 4, 4, 4, 4, 4, 4, 5, 5, "i", "i", 3, 3, 3],  # x dt A B C dy V W end_dots boundary
                                                                          # grad_b r q da ddt dA_partial
    "group_sums": [3, 4, 4, "i", 4, 4],                                # dt V W r dB dC
}


def test_every_kernel_has_a_signature_here():
    assert set(numba_cuda.kernels("float64", 2, 2)) == set(SIGNATURES)


@pytest.mark.parametrize("float_type", ["float32", "float64"])
def test_kernels_type_and_lower_for_the_cuda_target(float_type):
    kernels = numba_cuda.kernels(float_type, 5, 3)
    ft = getattr(types, float_type)
    for name, arguments in SIGNATURES.items():
        signature = tuple(types.int64 if a == "i" else types.Array(ft, a, "C") for a in arguments)
        llvm_ir = compile_cuda(kernels[name].py_func, types.void, signature, cc=(9, 0)).library.get_llvm_str()
        assert name in llvm_ir
        if float_type == "float32":
            assert " double " not in llvm_ir and "fadd double" not in llvm_ir, f"{name}: float64 in a float32 kernel"


def test_the_cuda_target_compiles_with_this_numpy():
    """The availability check's probe kernel types and lowers with the NumPy installed here."""
    assert cuda_availability._target_fails() is None


def test_a_numpy_numba_cuda_does_not_support_is_named_not_raised_mid_forward():
    """On an H200 image with NumPy 2.5.2, numba-cuda 0.30.4 raised "module 'numpy' has no attribute 'row_stack'"
    at its first kernel's compile (NumPy 2.5 removed it). The same NumPy, reproduced by removing the function
    before numba-cuda's target loads (in a fresh process: a target once loaded stays loaded): the check says so."""
    script = ("import numpy; numpy.__dict__.pop('row_stack', None)\n"
              "from tinygrad_ssm.scan import cuda_availability\n"
              "print(cuda_availability._target_fails())")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    run = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    if run.stdout.strip() == "None":
        pytest.skip("this numba-cuda no longer uses np.row_stack: the NumPy 2.5 failure cannot be reproduced here")
    assert "row_stack" in run.stdout and f"NumPy {np.__version__}" in run.stdout and "numpy<2.5" in run.stdout


@pytest.fixture
def a_gpu_found(monkeypatch):
    """numba-cuda reports a GPU (it has none here); the answer of why_unavailable is recomputed on either side."""
    monkeypatch.setattr(numba_cuda._cuda(), "is_available", lambda: True)
    numba_cuda.why_unavailable.cache_clear()
    yield
    numba_cuda.why_unavailable.cache_clear()


def test_under_the_simulator_the_backend_is_unavailable_even_with_a_gpu(a_gpu_found, monkeypatch):
    """The simulator runs the kernels as Python, thousands of times slower: "auto" must never take it."""
    from tinygrad_ssm.scan import available_backends
    monkeypatch.setattr(cuda_availability, "simulated", lambda: True)
    assert "CUDA simulator" in numba_cuda.why_unavailable() and not numba_cuda.available()
    assert "cuda" not in available_backends()


def test_with_a_gpu_a_target_that_cannot_compile_keeps_auto_off_the_backend(a_gpu_found, monkeypatch):
    from tinygrad_ssm.scan import available_backends, resolve_backend, ssd
    from tests.support.scan_inputs import make_inputs

    assert numba_cuda.available() and resolve_backend("auto").name == "cuda"   # the GPU alone would make it "auto"
    numba_cuda.why_unavailable.cache_clear()
    monkeypatch.setattr(cuda_availability, "_target_fails", lambda: "numba-cuda X cannot compile a kernel with NumPy Y")
    assert not numba_cuda.available() and "cuda" not in available_backends()
    assert resolve_backend("auto").name != "cuda"
    inputs = make_inputs(np.random.default_rng(0), b=1, l=2, h=1, p=1, g=1, n=1)
    with pytest.raises(RuntimeError, match=r"'cuda' is not available here \(.*cannot compile a kernel with NumPy Y"):
        ssd(**inputs, backend="cuda")


@pytest.mark.parametrize("float_type, n, p", [("float64", 5, 3), ("float64", 191, 7), ("float32", 9, 256)])
def test_static_shared_bytes_are_the_compiled_kernels(float_type, n, p):
    """cuda.static_shared_bytes, which _check_sizes holds to CUDA's 48 KiB, is what each compiled kernel declares
    (its addrspace(3) globals); kernels it leaves out declare none."""
    import re
    kernels, ft = numba_cuda.kernels(float_type, n, p), getattr(types, float_type)
    expected = numba_cuda.static_shared_bytes(np.dtype(float_type).itemsize, n, p)
    for name, arguments in SIGNATURES.items():
        signature = tuple(types.int64 if a == "i" else types.Array(ft, a, "C") for a in arguments)
        llvm_ir = compile_cuda(kernels[name].py_func, types.void, signature, cc=(9, 0)).library.get_llvm_str()
        size = {"double": 8, "float": 4}
        declared = sum(int(count) * size[t] for count, t in
                       re.findall(r"addrspace\(3\) global \[(\d+) x (double|float)\]", llvm_ir))
        assert declared == expected.get(name, 0), name


@pytest.mark.parametrize("dtype, p, n, kernel", [(np.float64, 64, 192, "chunk_outputs"),
                                                 (np.float64, 192, 64, "chunk_grad_columns")])
def test_sizes_over_48_kib_of_shared_memory_are_refused_by_name(dtype, p, n, kernel):
    """float64 n = 192: the row kernels' tiles take 49,408 bytes, over CUDA's 49,152 static limit (ptxas or the
    launch fails on a GPU); the size check refuses it first, naming p, n, the dtype, the limit and the ways out.
    float32 at p = n = 256 and float64 at 191 fit."""
    with pytest.raises(ValueError, match=rf"float64 with head dim p = {p} and state size n = {n} needs 49,408 bytes "
                                         rf"of static shared memory in kernel {kernel}, over CUDA's limit of 49,152 "
                                         r"bytes \(48 KiB\) a block; use float32 or backend 'numba_chunked'"):
        numba_cuda._check_sizes(1, 1, p, n, dtype)
    numba_cuda._check_sizes(1, 1, 256, 256, np.float32)
    numba_cuda._check_sizes(1, 1, 191, 191, np.float64)


def test_empty_sizes_are_refused_by_the_device_functions():
    with pytest.raises(ValueError, match=r"b, h, p and n must be at least 1 .* got b = 1, h = 2, p = 0, n = 3"):
        numba_cuda._check_sizes(1, 2, 0, 3, np.float32)
