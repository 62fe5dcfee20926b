"""The scan is causal on every backend, non-finite values included (issue 24, class 6): a NaN in an input at
step t must not reach an output before t (y[:, :t] stays finite; y from t on and final_state may be NaN), and
the backward is causal the other way round: a NaN in the gradient of y at step t must not reach the gradients
of the inputs after t. The chunked form used to break both: its masked products multiply a masked 0 by the
NaN of a later step (0 * NaN = NaN), inside each chunk and between chunks. And a non-finite input at step t
reaches exactly the gradients that depend on it, as in the recurrence's own backward (`numpy_scan_gradients`):
the products C B^T inside a chunk (and, backwards, W B and W^T C) used to multiply the masked zeros of every
(l, s) pair by a NaN in B or C, making dC before t and dB after t NaN."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tests.support.scan_inputs import make_inputs, numpy_scan, numpy_scan_gradients
from tinygrad_ssm.autograd.tensor import Tensor
from tinygrad_ssm.scan import BACKENDS, ssd

# NaN and inf inputs are the point of these tests: NumPy says so at every product it meets them in
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")

Q = 4                                       # chunk length: l = 11 is three chunks, the last one padded
L = 11
STEPS = [0, 2, 3, 4, 9, 10]                 # first step, inside a chunk, a chunk's last and first step, the tail
GRADIENT_STEPS = [0, 2, 3, 4, 9]            # (a NaN in the gradient at the last step has no later input to reach)


def _backend(name):
    if not BACKENDS[name].available():
        pytest.skip(f"backend {name!r} is not available here ({BACKENDS[name].description})")
    return name


def _run(inputs, backend, dy=None, chunk_size=Q):
    tensors = {k: (Tensor(v, requires_grad=True) if v is not None else None) for k, v in inputs.items()}
    y, final_state = ssd(**tensors, chunk_size=chunk_size, backend=backend)
    if dy is not None:
        y.backward(dy)
    grads = {k: np.asarray(t.grad.data) for k, t in tensors.items() if t is not None and t.grad is not None}
    return y.data, final_state.data, grads


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("which", ["x", "dt", "B", "C"])
@pytest.mark.parametrize("t", STEPS)
def test_a_nan_input_at_step_t_does_not_reach_earlier_outputs(backend, which, t):
    inputs = make_inputs(np.random.default_rng(t), l=L)
    inputs[which][0, t, 1] = np.nan                 # batch 0, step t, one head (x, dt) or one group (B, C)
    y, _, _ = _run(inputs, _backend(backend))
    assert np.isfinite(y[:, :t]).all(), f"{backend}: a NaN in {which} at step {t} reached outputs before it"
    assert np.isfinite(y[1]).all()                  # nor another sequence of the batch
    y_def, _ = numpy_scan(**inputs)                 # the recurrence: exactly its outputs are non-finite
    assert np.array_equal(np.isfinite(y), np.isfinite(y_def))
    finite = np.isfinite(y_def)
    assert np.abs(y[finite] - y_def[finite]).max() < 1e-10


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("t", GRADIENT_STEPS)
def test_a_nan_gradient_at_step_t_does_not_reach_gradients_of_later_inputs(backend, t):
    inputs = make_inputs(np.random.default_rng(100 + t), l=L)
    dy = np.random.default_rng(t).standard_normal(inputs["x"].shape)
    dy[0, t, 1, 0] = np.nan
    _, _, grads = _run(inputs, _backend(backend), dy)
    for name in ("x", "dt", "B", "C"):
        assert np.isfinite(grads[name][:, t + 1:]).all(), \
            f"{backend}: a NaN in the gradient of y at step {t} reached d{name} after it"
        assert np.isfinite(grads[name][1]).all()
    _, _, clean = _run(inputs, backend, np.where(np.isnan(dy), 0.0, dy))
    for name in ("x", "dt", "B", "C"):                # and those gradients are the right ones
        assert np.abs(grads[name][:, t + 1:] - clean[name][:, t + 1:]).max() < 1e-10


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_finite_input_gives_finite_results(backend):
    inputs = make_inputs(np.random.default_rng(7), l=L)
    y, state, grads = _run(inputs, _backend(backend), np.ones(inputs["x"].shape))
    assert np.isfinite(y).all() and np.isfinite(state).all() and all(np.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("which", ["x", "dt", "B", "C"])
@pytest.mark.parametrize("t", STEPS)
@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("loss", ["every step", "steps before t"])
def test_a_non_finite_input_at_step_t_reaches_only_the_gradients_that_depend_on_it(backend, which, t, value, loss):
    inputs = make_inputs(np.random.default_rng(200 + t), l=L)
    inputs[which][0, t, 1] = value                  # batch 0, step t, one head (x, dt) or one group (B, C)
    dy = np.random.default_rng(t).standard_normal(inputs["x"].shape)
    if loss == "steps before t":                    # y[:, :t] is finite: its gradients are finite where they
        dy[:, t:] = 0.0                             # do not read the value (dC before t, say)
    _assert_gradients_as_the_recurrences(inputs, _backend(backend), dy, f"{value} in {which} at step {t}", Q)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@given(b=st.integers(1, 2), q=st.integers(1, 9), l=st.integers(1, 30), g=st.integers(1, 2), r=st.integers(1, 3),
       p=st.integers(1, 4), n=st.integers(1, 5), which=st.sampled_from(["x", "dt", "B", "C"]),
       value=st.sampled_from([np.nan, np.inf, -np.inf]), where=st.floats(0, 1, exclude_max=True),
       prefix_loss=st.booleans(), seed=st.integers(0, 2**16))
def test_non_finite_inputs_on_drawn_shapes(backend, b, q, l, g, r, p, n, which, value, where, prefix_loss, seed):
    """The same on drawn shapes and chunk sizes (the value in a random entry): every backend's gradients are the
    recurrence's, non-finite exactly where it is, equal to 1e-10 elsewhere."""
    inputs = make_inputs(np.random.default_rng(seed), b=b, l=l, h=g * r, p=p, g=g, n=n)
    flat = inputs[which].reshape(-1)
    index = int(where * flat.size)
    flat[index] = value
    t = np.unravel_index(index, inputs[which].shape)[1]
    dy = np.random.default_rng(seed + 1).standard_normal(inputs["x"].shape)
    if prefix_loss:
        dy[:, t:] = 0.0
    _assert_gradients_as_the_recurrences(inputs, _backend(backend), dy, f"{value} in {which} at step {t}", q)


def _assert_gradients_as_the_recurrences(inputs, backend, dy, what, chunk_size):
    _, _, grads = _run(inputs, backend, dy, chunk_size)
    exact = numpy_scan_gradients(**inputs, dy=dy)   # the recurrence's backward: NaN exactly where it depends
    for name, want in exact.items():
        got = grads[name]
        same_pattern = np.array_equal(np.isfinite(got), np.isfinite(want))
        assert same_pattern, \
            f"{backend}: {what}: d{name} is not finite where the recurrence's is " \
            f"(at {np.argwhere(np.isfinite(want) & ~np.isfinite(got))[:4].tolist()}), or the other way round"
        finite = np.isfinite(want)
        assert np.abs(got[finite] - want[finite]).max(initial=0.0) < 1e-10, f"{backend}: d{name}"
