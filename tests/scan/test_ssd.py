"""The SSD scan: chunked (reference) == sequential (scan) == a plain NumPy loop written here, gradients
against finite differences, the tail padding, numerics that bite, and argument checking."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tests.support.gradcheck import gradcheck
from tests.support.scan_inputs import make_inputs, numpy_scan
from tinygrad_ssm.scan import available_backends, reference, ssd

Q = 8                                    # chunk length in these tests
LENGTHS = [1, Q - 1, Q, Q + 1, 3 * Q + 5]


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("l", LENGTHS)
def test_chunked_equals_sequential_equals_numpy(l, g, with_state):
    rng = np.random.default_rng(l * 10 + g)
    inputs = make_inputs(rng, l=l, g=g, initial_state=with_state)
    y_np, state_np = numpy_scan(**inputs)
    y_ref, state_ref = ssd(**inputs, chunk_size=Q, backend="reference")
    y_scan, state_scan = ssd(**inputs, backend="scan")
    assert y_ref.dtype == np.float64 and y_ref.shape == inputs["x"].shape and state_ref.shape == (2, 4, 3, 5)
    for y, state in ((y_ref, state_ref), (y_scan, state_scan)):
        assert np.abs(y.data - y_np).max() < 1e-10
        assert np.abs(state.data - state_np).max() < 1e-10


def test_segments_chain_through_the_state():
    """Scanning a sequence in two pieces, the second starting from the first's final state, is one scan."""
    rng = np.random.default_rng(1)
    inputs = make_inputs(rng, l=3 * Q + 5)
    y_all, state_all = ssd(**inputs, chunk_size=Q)
    cut = Q + 3
    first = {k: (v[:, :cut] if k in ("x", "dt", "B", "C") else v) for k, v in inputs.items()}
    second = {k: (v[:, cut:] if k in ("x", "dt", "B", "C") else v) for k, v in inputs.items()}
    y1, state1 = ssd(**first, chunk_size=Q)
    y2, state2 = ssd(**{**second, "initial_state": state1}, chunk_size=Q)
    assert np.abs(np.concatenate([y1.data, y2.data], axis=1) - y_all.data).max() < 1e-10
    assert np.abs(state2.data - state_all.data).max() < 1e-10


@given(b=st.integers(1, 2), l=st.integers(1, 20), g=st.integers(1, 2), r=st.integers(1, 2), p=st.integers(1, 3),
       n=st.integers(1, 4), q=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_chunked_matches_numpy_for_any_sizes(b, l, g, r, p, n, q, seed):
    inputs = make_inputs(np.random.default_rng(seed), b=b, l=l, h=g * r, p=p, g=g, n=n)
    y_np, state_np = numpy_scan(**inputs)
    y, state = ssd(**inputs, chunk_size=q, backend="reference")
    assert np.abs(y.data - y_np).max() < 1e-10 and np.abs(state.data - state_np).max() < 1e-10


@pytest.mark.parametrize("backend,l", [("reference", Q + 3), ("scan", 5)])
def test_gradcheck_every_input(backend, l):
    """All seven inputs, initial_state included, with a padded tail (l not a multiple of the chunk)."""
    inputs = make_inputs(np.random.default_rng(2), b=2, l=l, h=4, p=2, g=2, n=3, initial_state=True)
    names = list(inputs)

    def fn(*tensors):
        y, state = ssd(**dict(zip(names, tensors)), chunk_size=Q, backend=backend)
        return tg.cat([tg.functional.flatten(y), tg.functional.flatten(state)])

    assert gradcheck(fn, *inputs.values())


@given(l=st.integers(1, 7), chunk=st.integers(1, 4), heads_per_group=st.integers(1, 2), g=st.integers(1, 2),
       p=st.integers(1, 2), n=st.integers(1, 2), with_state=st.booleans(), backend=st.sampled_from(["reference", "scan"]),
       seed=st.integers(0, 2**16))
def test_gradcheck_on_drawn_shapes(l, chunk, heads_per_group, g, p, n, with_state, backend, seed):
    """The spec's gradients at every chunk length against its sequence (a tail chunk, chunks of one step), in
    float64 against central differences; test_gradcheck_every_input holds one shape of each backend."""
    inputs = make_inputs(np.random.default_rng(seed), b=1, l=l, h=heads_per_group * g, p=p, g=g, n=n,
                         initial_state=with_state)
    if not with_state:
        del inputs["initial_state"]
    names = list(inputs)

    def fn(*tensors):
        y, state = ssd(**dict(zip(names, tensors)), chunk_size=chunk, backend=backend)
        return tg.cat([tg.functional.flatten(y), tg.functional.flatten(state)])

    assert gradcheck(fn, *inputs.values())


def test_gradient_without_optional_inputs():
    inputs = make_inputs(np.random.default_rng(3), l=Q + 1, initial_state=False)
    del inputs["D"], inputs["initial_state"]
    names = list(inputs)
    assert gradcheck(lambda *t: ssd(**dict(zip(names, t)), chunk_size=Q, backend="reference")[0], *inputs.values())


def test_strong_decay_and_padded_tail_stay_finite_in_float32():
    """exp of very negative sums underflows to 0; with l not a multiple of the chunk, neither the forward
    nor the backward may produce NaN or inf."""
    rng = np.random.default_rng(4)
    inputs = make_inputs(rng, l=3 * Q + 5, dtype=np.float32)
    inputs["A"] = np.full(4, -1e4, np.float32)
    inputs["dt"] = inputs["dt"] * 100
    tensors = {k: tg.Tensor(v, requires_grad=True) for k, v in inputs.items()}
    y, state = ssd(**tensors, chunk_size=Q, backend="reference")
    assert y.dtype == np.float32 and np.isfinite(y.data).all() and np.isfinite(state.data).all()
    (y.sum() + state.sum()).backward()
    for name, t in tensors.items():
        assert np.isfinite(t.grad.data).all(), name


@pytest.mark.parametrize("q", [64, 256])
def test_float32_long_chunk_has_no_cancellation(q):
    """One huge decay, then tiny ones: the running sum is large and its differences small. segsum by
    masking then summing keeps float32 accurate (~1e-6); cumsum[i] - cumsum[j] would be off by ~1e-3."""
    rng = np.random.default_rng(5)
    inputs = make_inputs(rng, b=1, l=q, h=2, p=4, g=1, n=4, initial_state=False)
    inputs["A"] = np.array([-10.0, -7.0])
    inputs["dt"] = np.full((1, q, 2), 0.001)
    inputs["dt"][:, 0] = 100.0
    inputs.pop("D")
    y64, _ = numpy_scan(**inputs)
    y32, _ = ssd(**{k: v.astype(np.float32) if v is not None else None for k, v in inputs.items()}, chunk_size=q,
                 backend="reference")
    assert np.abs(y32.data - y64).max() / np.abs(y64).max() < 1e-5


def test_segsum_masks_then_sums():
    a = tg.Tensor(-np.random.default_rng(9).uniform(0, 3, (2, 3, 10)))
    S = reference.segsum(a).data                                       # (2, 3, 10, 10)
    for i, j in [(7, 2), (9, 0), (4, 3), (5, 5)]:
        assert np.isclose(S[1, 2, i, j], a.data[1, 2, j + 1:i + 1].sum(), rtol=1e-14)
    L = reference.exp_segsum(a).data
    assert np.all(L[..., np.triu_indices(10, 1)[0], np.triu_indices(10, 1)[1]] == 0)
    assert np.allclose(np.diagonal(L, axis1=-2, axis2=-1), 1.0)


def test_many_chunks_chain_their_states():
    """chunk_size 1 and l = 150: 150 chunks of one step, passed on through a (151, 151) segsum."""
    inputs = make_inputs(np.random.default_rng(10), b=1, l=150, h=2, p=2, g=1, n=3)
    y_np, state_np = numpy_scan(**inputs)
    y, state = ssd(**inputs, chunk_size=1, backend="reference")
    assert np.abs(y.data - y_np).max() < 1e-10 and np.abs(state.data - state_np).max() < 1e-10


def test_dtypes_and_auto_backend():
    from tinygrad_ssm.scan import available_backends
    inputs = make_inputs(np.random.default_rng(6), l=Q + 2)
    y_auto, _ = ssd(**inputs, chunk_size=Q)
    y_first, _ = ssd(**inputs, chunk_size=Q, backend=available_backends()[0])
    y_ref, _ = ssd(**inputs, chunk_size=Q, backend="reference")
    assert np.array_equal(y_auto.data, y_first.data) and np.abs(y_auto.data - y_ref.data).max() < 1e-10
    y16, state16 = ssd(**{k: v.astype(np.float16) for k, v in inputs.items()}, chunk_size=Q)
    assert y16.dtype == np.float32 and state16.dtype == np.float32  # never computed below float32
    y32, _ = ssd(**{k: v.astype(np.float32) for k, v in inputs.items()}, chunk_size=Q)
    assert y32.dtype == np.float32 and np.abs(y32.data - y_ref.data).max() < 1e-4


@pytest.mark.parametrize("change,message", [
    (dict(x=np.zeros((2, 11, 4))), r"x must have shape \(b, l, h, p\)"),
    (dict(dt=np.zeros((2, 11, 3))), r"dt must have shape \(b, l, h\).*\(2, 11, 4\).*\(2, 11, 3\)"),
    (dict(A=np.zeros(3)), r"A must have shape \(h,\)"),
    (dict(B=np.zeros((2, 10, 2, 5))), r"B must have shape \(b, l, g, n\)"),
    (dict(B=np.zeros((2, 11, 3, 5)), C=np.zeros((2, 11, 3, 5))), r"h = 4 .* divisible by .* g = 3"),
    (dict(B=np.zeros((2, 11, 0, 5)), C=np.zeros((2, 11, 0, 5))), r"groups g \(B's axis 2, B \(2, 11, 0, 5\)\) must "
                                                                 r"be at least 1, got 0"),
    (dict(C=np.zeros((2, 11, 2, 4))), r"C must have shape"),
    # ssd_minimal_discrete's A is the per-step log decay dt * A (b, l, h): said as that, not as a bare shape
    (dict(A=np.zeros((2, 11, 4))), r"A must have shape \(h,\) = \(4,\), one per head, got \(2, 11, 4\), the shape "
                                   r"of ssd_minimal_discrete's A .* pass dt \(b, l, h\) and A \(h,\) apart"),
    (dict(D=np.zeros(5)), r"D must have shape"),
    (dict(initial_state=np.zeros((2, 4, 3, 4))), r"initial_state must have shape \(b, h, p, n\)"),
    (dict(x=np.zeros((2, 11, 4, 3), dtype=np.int64)), r"x must be a floating point"),
    (dict(dt=np.zeros((2, 11, 4), dtype=complex)), r"ssd: dt has dtype complex128: complex tensors are not"),
    # a raw numba TypingError before (longdouble passed the floating point check)
    (dict(B=np.zeros((2, 11, 2, 5), dtype=np.longdouble)), r"B has dtype float128; the scan takes float16, float32 "
                                                           r"or float64: cast it"),
])
def test_bad_arguments_name_the_argument_and_shape(change, message):
    inputs = {**make_inputs(np.random.default_rng(7)), **change}
    with pytest.raises((ValueError, TypeError), match=message):
        ssd(**inputs)


def test_mamba_ssms_positional_chunk_size_is_named_not_taken_for_D():
    """mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, ...) puts chunk_size 6th, where ssd has D:
    the error names the two orders instead of "D must be a floating point tensor, got dtype int64"."""
    inputs = make_inputs(np.random.default_rng(8))
    args = [inputs[k] for k in ("x", "dt", "A", "B", "C")]
    with pytest.raises(TypeError, match=r"D = 64 is an int.*mamba_chunk_scan_combined\(x, dt, A, B, C, chunk_size, "
                                        r"D=None, ...\); it is ssd\(x, dt, A, B, C, D=None, initial_state=None, "
                                        r"chunk_size=256, backend='auto'\): pass chunk_size=64 by name"):
        ssd(*args, 64)
    with pytest.raises(TypeError, match=r"D = 64 is an int"):
        ssd(*args, np.int64(64))


def test_bad_chunk_size_and_backend():
    inputs = make_inputs(np.random.default_rng(8))
    with pytest.raises(ValueError, match="chunk_size"):
        ssd(**inputs, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size must be a positive int, got True"):
        ssd(**inputs, chunk_size=True)
    with pytest.raises(ValueError, match="unknown backend 'cuda-please'"):
        ssd(**inputs, backend="cuda-please")


# --- the kernel interface: a kernel backend wrapped by the one SSD op ---------------------------------------

@pytest.fixture
def numpy_kernel_backend():
    """A test-only kernel backend (tests/support/ssd_numpy_kernel.py) registered for the duration of a test."""
    from tests.support import ssd_numpy_kernel
    from tinygrad_ssm.scan import BACKENDS, Backend, register_backend
    record = register_backend(Backend("numpy-test", priority=-10, available=lambda: True,
                                      forward=ssd_numpy_kernel.forward, backward=ssd_numpy_kernel.backward))
    yield record.name
    del BACKENDS[record.name]


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("with_D", [False, True], ids=["no-D", "D"])
def test_kernel_backend_through_the_ssd_op_matches_the_reference(numpy_kernel_backend, with_state, with_D):
    """Forward and every gradient of a kernel backend (through SSD.apply) equal the engine-op reference."""
    inputs = make_inputs(np.random.default_rng(9), l=2 * Q + 3, g=2, initial_state=with_state)
    if not with_D:
        inputs["D"] = None
    names = [k for k, v in inputs.items() if v is not None]
    weights = np.random.default_rng(10)
    w_y, w_state = weights.standard_normal(inputs["x"].shape), weights.standard_normal((2, 4, 3, 5))
    results = {}
    for backend in ("reference", numpy_kernel_backend):
        tensors = {k: tg.Tensor(inputs[k].copy(), requires_grad=True) for k in names}
        y, state = ssd(**tensors, chunk_size=Q, backend=backend)
        ((y * w_y).sum() + (state * w_state).sum()).backward()
        results[backend] = (y.data, state.data, {k: tensors[k].grad.data for k in names})
    (y_ref, s_ref, g_ref), (y_k, s_k, g_k) = results.values()
    assert np.abs(y_ref - y_k).max() < 1e-10 and np.abs(s_ref - s_k).max() < 1e-10
    for k in names:
        assert np.abs(g_ref[k] - g_k[k]).max() < 1e-10, k


def test_kernel_backend_gradcheck_and_unused_final_state(numpy_kernel_backend):
    inputs = make_inputs(np.random.default_rng(11), b=1, l=5, h=2, p=2, g=1, n=3)
    names = list(inputs)
    gradcheck(lambda *ts: ssd(**dict(zip(names, ts)), backend=numpy_kernel_backend)[0], *inputs.values())
    gradcheck(lambda *ts: ssd(**dict(zip(names, ts)), backend=numpy_kernel_backend)[1], *inputs.values())


def test_registry_auto_takes_the_available_backend_of_highest_priority():
    from tinygrad_ssm.scan import BACKENDS, Backend, available_backends, register_backend, resolve_backend
    names = available_backends()
    assert names and all(BACKENDS[n].available() for n in names)
    priorities = [BACKENDS[n].priority for n in names]
    assert priorities == sorted(priorities, reverse=True)
    assert resolve_backend("auto").name == names[0]
    register_backend(Backend("never-here", priority=10**6, available=lambda: False, ops=lambda *a: None))
    try:
        assert resolve_backend("auto").name == names[0]            # unavailable: never chosen by auto
        with pytest.raises(RuntimeError, match="'never-here' is not available here"):
            resolve_backend("never-here")
        with pytest.raises(ValueError, match="exists already"):
            register_backend(Backend("never-here", priority=0, available=lambda: True, ops=lambda *a: None))
        with pytest.raises(ValueError, match="'auto' exists already"):              # the name that means "choose"
            register_backend(Backend("auto", priority=0, available=lambda: True, ops=lambda *a: None))
        assert "auto" not in BACKENDS
        with pytest.raises(ValueError, match="give either ops, or forward and backward"):
            Backend("half", priority=0, available=lambda: True, forward=lambda *a: None)   # no backward
        with pytest.raises(ValueError, match="give either ops, or forward and backward"):
            Backend("both", priority=0, available=lambda: True, ops=lambda *a: None, forward=lambda *a: None,
                    backward=lambda *a: None)
    finally:
        del BACKENDS["never-here"]


def test_auto_takes_the_fastest_backend_that_takes_the_sizes():
    """On a GPU, "auto" took cuda for float64 at d_state 192, which its blocks' shared memory cannot hold, and the
    forward failed where numba_chunked runs it (an audit of the scan; shown here with a backend of highest
    priority that refuses every size, and with cuda's own rule)."""
    from tinygrad_ssm.scan import BACKENDS, Backend, cuda, register_backend

    def never(*arrays):
        raise AssertionError("a backend that refuses the sizes was run")
    register_backend(Backend("refuses-all", priority=10**6, available=lambda: True, forward=never, backward=never,
                             refuses=lambda b, h, p, n, dtype: "too big"))
    try:
        inputs = make_inputs(np.random.default_rng(12))
        y, state = ssd(**inputs, chunk_size=Q)
        y_ref, state_ref = ssd(**inputs, chunk_size=Q, backend="reference")
        assert np.abs(y.data - y_ref.data).max() < 1e-10 and np.abs(state.data - state_ref.data).max() < 1e-10
        with pytest.raises(AssertionError, match="was run"):        # named, it is run (and refuses there itself)
            ssd(**inputs, chunk_size=Q, backend="refuses-all")
    finally:
        del BACKENDS["refuses-all"]
    assert "static shared memory" in cuda.refuses(1, 1, 2, 192, np.float64)
    assert "must be at most" in cuda.refuses(1, 1, 300, 16, np.float32)
    assert cuda.refuses(1, 1, 64, 128, np.float32) is None and cuda.refuses(0, 1, 64, 128, np.float64) is None


def test_an_empty_batch_gives_empty_outputs_on_every_backend():
    """b = 0 raised ZeroDivisionError in the numba CPU backend (its blocks of heads divided by b g)."""
    inputs = make_inputs(np.random.default_rng(3), b=0, initial_state=False)
    del inputs["initial_state"]
    for backend in available_backends():
        y, final = ssd(**{k: tg.Tensor(v) for k, v in inputs.items()}, chunk_size=4, backend=backend)
        assert y.shape == inputs["x"].shape and final.shape[0] == 0, backend
