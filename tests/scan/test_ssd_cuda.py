"""The CUDA kernels of backend "cuda" (tinygrad_ssm/scan/cuda.py): forward and every gradient equal
every other available backend (the engine-op reference and scan, and each kernel backend in the registry) in
float64 to 1e-10.

Without a GPU they run on numba-cuda's simulator, which must be switched on (NUMBA_ENABLE_CUDASIM=1) before
numba is first imported. Collected by a process with neither the simulator nor a GPU (any `pytest`, `.ci/run`'s
too), this file is one test that runs itself in such a subprocess. The simulator runs ~2 us per thread-step and ~25 ms per block, so the shapes are tiny.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[test]' installs it)", allow_module_level=True)

import tinygrad_ssm as tg  # noqa: E402
from tinygrad_ssm.scan import BACKENDS, SSD, available_backends, cuda as numba_cuda, ssd  # noqa: E402

RUNS_HERE = numba_cuda.simulated() or numba_cuda.available()


if not RUNS_HERE:
    def test_cuda_kernels_under_the_simulator_in_a_subprocess():
        """No GPU and numba imported without the simulator: run this file again with NUMBA_ENABLE_CUDASIM=1."""
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": os.pathsep.join(
            [str(root), os.environ.get("PYTHONPATH", "")])}
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                             env=env, cwd=root, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]

else:
    from tests.support.gradcheck import gradcheck
    from tests.support.scan_inputs import make_inputs

    Q = 4                                        # chunk length: l = 2 Q + 3 spans three chunks, the last short
    CUDA = BACKENDS["cuda"]
    # every other backend that runs here, the engine-op reference first (no names but our own hard-coded)
    OTHERS = [name for name in available_backends() if name != "cuda"]

    CASES = {  # name: (make_inputs arguments, D given, small tiles: several p and n tiles and STAGE-step tiles)
        "l1-g1-zero-state-no-D": (dict(b=1, l=1, h=2, p=2, g=1, n=3, initial_state=False), False, False),
        "l=Q-g2-state-D": (dict(b=1, l=Q, h=4, p=2, g=2, n=3), True, False),
        "3chunks-g2-state-D": (dict(b=2, l=2 * Q + 3, h=4, p=3, g=2, n=5), True, False),
        "3chunks-g1-zero-state-D": (dict(b=1, l=2 * Q + 3, h=4, p=3, g=1, n=4, initial_state=False), True, False),
        "3chunks-g2-state-no-D": (dict(b=1, l=2 * Q + 3, h=4, p=2, g=2, n=3), False, False),
        "small-tiles": (dict(b=1, l=2 * Q + 3, h=2, p=3, g=1, n=5), True, True),
    }

    @pytest.fixture
    def small_tiles(monkeypatch):
        """Blocks of 2 threads and shared tiles of 3 steps: p = 3 rows and n = 5 columns split over several
        blocks (with idle threads in the last), and a chunk of 4 steps staged in two tiles."""
        monkeypatch.setattr(numba_cuda, "MAX_TILE", 2)
        monkeypatch.setattr(numba_cuda, "STAGE", 3)

    def inputs_for(case: str) -> dict:
        arguments, with_D, _ = CASES[case]
        inputs = make_inputs(np.random.default_rng(len(case)), **arguments)
        if not with_D:
            inputs["D"] = None
        return inputs

    def forward_and_gradients(inputs: dict, backend: str, chunk_size: int = Q, dtype=np.float64):
        """(y, final_state, {input: gradient}) of a fixed random weighting of both outputs. "cuda" runs through
        the SSD op with its record: under the simulator it is not available(), so ssd(backend=) refuses it."""
        names = [k for k, v in inputs.items() if v is not None]
        tensors = {k: tg.Tensor(inputs[k].astype(dtype), requires_grad=True) for k in names}
        if backend == "cuda":
            y, state = SSD.apply(*(tensors.get(k) for k in inputs), kernel=CUDA, chunk_size=chunk_size)
        else:
            y, state = ssd(**tensors, chunk_size=chunk_size, backend=backend)
        weights = np.random.default_rng(99)
        w_y, w_state = weights.standard_normal(y.shape), weights.standard_normal(state.shape)
        ((y * w_y.astype(dtype)).sum() + (state * w_state.astype(dtype)).sum()).backward()
        return y.data, state.data, {k: None if tensors[k].grad is None else tensors[k].grad.data for k in names}

    _cuda_results = {}

    def cuda_result(case: str, request):
        """The cuda backend's results for a case, computed once and compared with every other backend."""
        if case not in _cuda_results:
            if CASES[case][2]:
                request.getfixturevalue("small_tiles")
            _cuda_results[case] = forward_and_gradients(inputs_for(case), "cuda")
        return _cuda_results[case]

    def assert_equal(expected, got, tol, label):
        (y_e, s_e, g_e), (y_g, s_g, g_g) = expected, got
        assert y_g.dtype == y_e.dtype and y_g.shape == y_e.shape and s_g.shape == s_e.shape
        assert np.abs(y_g - y_e).max() <= tol * max(1.0, np.abs(y_e).max()), f"{label}: y"
        assert np.abs(s_g - s_e).max() <= tol * max(1.0, np.abs(s_e).max()), f"{label}: final state"
        assert g_g.keys() == g_e.keys()
        for k in g_e:
            assert g_g[k].shape == g_e[k].shape, f"{label}: d{k} shape"
            assert np.abs(g_g[k] - g_e[k]).max() <= tol * max(1.0, np.abs(g_e[k]).max()), f"{label}: d{k}"

    @pytest.mark.parametrize("other", OTHERS)
    @pytest.mark.parametrize("case", list(CASES))
    def test_forward_and_every_gradient_equal_the_other_backends(case, other, request):
        """float64 to 1e-10: l within one chunk, at a chunk's length, and over three chunks with a short last one;
        g = 1 (all heads one group) and g = 2; with and without initial_state and D; several blocks per head."""
        got = cuda_result(case, request)
        expected = forward_and_gradients(inputs_for(case), other)
        assert_equal(expected, got, 1e-10, f"cuda vs {other} ({case})")

    @settings(max_examples=5)     # each example launches ~60 simulated blocks (~25 ms each)
    @given(b=st.integers(1, 2), l=st.integers(1, 8), g=st.integers(1, 2), r=st.integers(1, 2), p=st.integers(1, 3),
           n=st.integers(1, 3), q=st.integers(2, 5), with_state=st.booleans(), seed=st.integers(0, 2**16))
    def test_any_sizes_equal_every_other_backend(b, l, g, r, p, n, q, with_state, seed):
        inputs = make_inputs(np.random.default_rng(seed), b=b, l=l, h=g * r, p=p, g=g, n=n, initial_state=with_state)
        got = forward_and_gradients(inputs, "cuda", chunk_size=q)
        for other in OTHERS:
            assert_equal(forward_and_gradients(inputs, other, chunk_size=q), got, 1e-10, f"cuda vs {other}")

    def test_gradcheck_against_finite_differences():
        """Every input's gradient along a random direction (gradcheck's fast mode: two forwards per input), two
        chunks, both outputs."""
        inputs = make_inputs(np.random.default_rng(5), b=1, l=5, h=2, p=2, g=1, n=2)

        def both_outputs(*tensors):
            y, state = SSD.apply(*tensors, kernel=CUDA, chunk_size=3)
            return tg.cat([tg.functional.flatten(y), tg.functional.flatten(state)])

        assert gradcheck(both_outputs, *inputs.values(), fast=True)

    def test_float32_matches_the_reference():
        inputs = inputs_for("3chunks-g2-state-D")
        got = forward_and_gradients(inputs, "cuda", dtype=np.float32)
        expected = forward_and_gradients(inputs, "reference", dtype=np.float32)
        assert got[0].dtype == np.float32 and all(g.dtype == np.float32 for g in got[2].values())
        assert_equal(expected, got, 2e-5, "float32 cuda vs reference")

    def test_strong_decay_stays_finite_in_float32():
        """exp of very negative log decays underflows to 0: neither the forward nor any gradient may become NaN
        or inf (the gradient of the decay is a cumulative sum, never a quotient of decays)."""
        inputs = make_inputs(np.random.default_rng(6), b=1, l=2 * Q + 3, h=2, p=2, g=1, n=3, dtype=np.float32)
        inputs["A"] = np.full(2, -1e4, np.float32)
        inputs["dt"] = inputs["dt"] * 100
        y, state, grads = forward_and_gradients(inputs, "cuda", dtype=np.float32)
        assert np.isfinite(y).all() and np.isfinite(state).all()
        for name, grad in grads.items():
            assert np.isfinite(grad).all(), name
        expected = forward_and_gradients(inputs, "reference", dtype=np.float32)
        assert np.abs(y - expected[0]).max() <= 1e-5 * np.abs(expected[0]).max()

    @pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_every_gradient_under_strong_decay_equals_the_float64_reference(dtype, tol, seed):
        """dt in [1, 5] and A in [-16, -8] (dt A down to -80: a real checkpoint's A_log reaches log 16). The fast sum
        of cuda_decay.py cancelled there (its terms far larger than the da_t they make): dA was 1e-7 off in float64
        and 40-150x its size off, sign included, in float32 (found by an audit of the numerics, 2026-12-07). Each
        gradient relative to its largest value; numba_chunked's float32 is within ~7e-7 here."""
        inputs = make_inputs(np.random.default_rng(seed), b=1, l=2 * Q + 3, h=2, p=2, g=1, n=3)
        rng = np.random.default_rng(seed + 10)
        inputs["dt"], inputs["A"] = rng.uniform(1.0, 5.0, inputs["dt"].shape), -rng.uniform(8.0, 16.0, 2)
        _, _, expected = forward_and_gradients(inputs, "reference")
        _, _, got = forward_and_gradients(inputs, "cuda", dtype=dtype)
        for name, grad in expected.items():
            error = np.abs(got[name].astype(np.float64) - grad).max() / np.abs(grad).max()
            assert error <= tol, f"d{name}: {error:.1e} of its largest value"

    def test_a_chunk_longer_than_the_sequence_and_one_step_chunks():
        """chunk_size > l is one chunk; chunk_size 1 makes every step a chunk (the pass between chunks does all)."""
        inputs = make_inputs(np.random.default_rng(3), b=1, l=5, h=2, p=2, g=1, n=2)
        expected = forward_and_gradients(inputs, "reference", chunk_size=Q)
        for chunk_size in (64, 1):
            assert_equal(expected, forward_and_gradients(inputs, "cuda", chunk_size=chunk_size), 1e-10,
                         f"chunk_size {chunk_size}")

    def test_availability_and_auto():
        """Under the simulator the backend is not available, so "auto" never takes it; on a GPU it is, and
        "auto" prefers it to every other backend."""
        if numba_cuda.simulated():
            assert not numba_cuda.available() and "cuda" not in available_backends()
            with pytest.raises(RuntimeError, match="'cuda' is not available here"):
                ssd(**inputs_for("l=Q-g2-state-D"), backend="cuda")
        else:
            assert available_backends()[0] == "cuda"
        assert CUDA.priority > max(b.priority for b in BACKENDS.values() if b.name != "cuda")

    def test_saved_for_backward_holds_chunk_states_not_step_states():
        """tests/scan/test_ssd_kernels.py's contract for every kernel backend, which runs there only where "cuda"
        is available (a GPU), so it had never run for "cuda" and failed wherever it did (its allowance had no
        room for the c + 1 boundary states that the CUDA kernels keep): the simulator runs it here too."""
        from tests.scan.test_ssd_kernels import test_saved_for_backward_holds_chunk_states_not_step_states as check
        check("cuda")

    @pytest.mark.parametrize("p,n,dtype", [(numba_cuda.MAX_STATE + 1, 1, np.float64),
                                           (1, numba_cuda.MAX_STATE + 1, np.float32)])
    def test_state_too_large_for_a_thread_is_refused_by_name(p, n, dtype):
        """p or n past MAX_STATE (a thread's row or column); in float32 n = 257's shared tiles would still fit, so
        only the size check itself refuses it."""
        inputs = make_inputs(np.random.default_rng(4), b=1, l=2, h=1, p=p, g=1, n=n, dtype=dtype)
        with pytest.raises(ValueError, match=rf"head dim p = {p} and state size n = {n} must be at most 256"):
            CUDA.forward(*inputs.values(), Q)

    @pytest.mark.parametrize("sizes", [dict(b=0), dict(h=0, g=1), dict(p=0), dict(n=0)])
    def test_an_empty_state_gives_what_the_cpu_backends_give_without_a_launch(sizes, monkeypatch):
        """b, h, p or n = 0: no kernel launches (CUDA refuses a zero-size grid; p or n = 0 divided by zero);
        y = D x and the gradients (zeros but dx and dD) have the shapes and values of numba_chunked's."""
        monkeypatch.setattr(numba_cuda, "kernels", lambda *a: pytest.fail("a kernel was compiled or launched"))
        inputs = make_inputs(np.random.default_rng(8), **{**dict(b=1, l=5, h=2, p=2, g=1, n=3), **sizes})
        (y_e, s_e, g_e), (y_g, s_g, g_g) = forward_and_gradients(inputs, "numba_chunked"), forward_and_gradients(
            inputs, "cuda")
        assert y_g.shape == y_e.shape and s_g.shape == s_e.shape and np.array_equal(y_g, y_e)
        for name, grad in g_g.items():     # (numba_chunked gives dD None for h = 0, where D has no entry)
            expected = g_e[name] if g_e[name] is not None else np.zeros(inputs[name].shape)
            assert grad.shape == expected.shape and np.abs(grad - expected).max(initial=0.0) < 1e-12, name

    @pytest.mark.parametrize("case", ["3chunks-g2-state-D", "3chunks-g1-zero-state-D", "small-tiles"])
    def test_the_exact_decay_gradient_equals_the_fast_one(case, request, monkeypatch):
        """cuda_decay.py's exact form of da_t (the fallback for a chunk whose fast sum is not finite), taken for
        every chunk of finite inputs: every gradient equals numba_chunked's (and so the fast form's) to 1e-10."""
        if not numba_cuda.simulated():
            pytest.skip("a compiled kernel keeps EXACT_EVERYWHERE as it was; the simulator reads it at run time")
        from tinygrad_ssm.scan import cuda_decay
        if CASES[case][2]:
            request.getfixturevalue("small_tiles")
        monkeypatch.setattr(cuda_decay, "EXACT_EVERYWHERE", True)
        got = forward_and_gradients(inputs_for(case), "cuda")
        assert_equal(forward_and_gradients(inputs_for(case), "numba_chunked"), got, 1e-10, f"exact da ({case})")

    @settings(max_examples=5, deadline=None)
    @given(l=st.integers(1, 9), g=st.integers(1, 2), r=st.integers(1, 2), p=st.integers(1, 3), n=st.integers(1, 3),
           q=st.integers(1, 4), seed=st.integers(0, 2**16))
    def test_the_exact_decay_gradient_on_any_sizes(l, g, r, p, n, q, seed):
        if not numba_cuda.simulated():
            pytest.skip("a compiled kernel keeps EXACT_EVERYWHERE as it was; the simulator reads it at run time")
        from tinygrad_ssm.scan import cuda_decay
        inputs = make_inputs(np.random.default_rng(seed), b=1, l=l, h=g * r, p=p, g=g, n=n)
        cuda_decay.EXACT_EVERYWHERE = True
        try:
            got = forward_and_gradients(inputs, "cuda", chunk_size=q)
        finally:
            cuda_decay.EXACT_EVERYWHERE = False
        assert_equal(forward_and_gradients(inputs, "numba_chunked", chunk_size=q), got, 1e-10, "exact da")

    NON_FINITE = [(which, t, value, t % 2 == 0) for which in ("B", "C", "x", "dt") for value in (np.nan, np.inf)
                  for t in (0, 2, 3, 4, 6)]  # chunks of 3 over l = 7: a chunk's last step, the next one's first

    @pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                "ignore:overflow encountered:RuntimeWarning")
    @pytest.mark.parametrize("which, t, value, prefix_loss", NON_FINITE)
    def test_a_non_finite_input_reaches_only_the_gradients_that_depend_on_it(which, t, value, prefix_loss):
        """tests/scan/test_causality.py's check for the cuda kernels: every gradient, ddt and dA included, is
        non-finite exactly where the recurrence's is and equal to it to 1e-10 elsewhere. The gradient of the log
        decay (cuda_decay.py) sums the later steps of its chunk: a chunk whose sum is not finite is redone term
        by term, else a NaN in B or x at step t would make ddt NaN at every step before t too."""
        from tests.support.scan_inputs import numpy_scan_gradients
        inputs = make_inputs(np.random.default_rng(t), b=1, l=7, h=2, p=2, g=1, n=2)
        inputs[which][0, t, 0] = value
        dy = np.random.default_rng(1).standard_normal(inputs["x"].shape)
        if prefix_loss:
            dy[:, t:] = 0.0
        tensors = {k: tg.Tensor(v, requires_grad=True) for k, v in inputs.items()}
        y, _ = SSD.apply(*tensors.values(), kernel=CUDA, chunk_size=3)
        y.backward(dy)
        for name, want in numpy_scan_gradients(**inputs, dy=dy).items():
            got, finite = tensors[name].grad.data, np.isfinite(want)
            assert np.array_equal(np.isfinite(got), finite), f"{value} in {which} at {t}: d{name}"
            assert np.abs(got[finite] - want[finite]).max(initial=0.0) < 1e-10, f"d{name}"
