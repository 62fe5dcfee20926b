"""Fused ops (tinygrad_ssm/fast/fused.py), their arguments: every shape checked before a kernel runs (the numba
kernels index their arrays unchecked: a short bias was read past its end), with messages that name the op, the
argument and the shapes as given."""
import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm.autograd import functional as F
from tinygrad_ssm.fast import fused


def T(shape, dtype=np.float64):
    return tg.Tensor(np.ones(shape, dtype))


# --- conv1d + silu ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias_shape", [(2,), (6,), (4, 1), (1, 4), ()])
def test_conv1d_silu_refuses_a_bias_that_is_not_one_per_channel(bias_shape):
    """A bias (2,) for 4 channels was read past its end (garbage in the output), (6,) cut to 4, (4, 1) and ()
    a TypingError inside numba; the engine op refuses them, and so does the fused one, naming both shapes."""
    x, w = T((1, 3, 4)), T((4, 1, 2))
    with pytest.raises(ValueError, match=r"causal_conv1d: bias must have shape \(4,\)"):
        F.causal_conv1d(x, w, T(bias_shape))
    message = rf"conv1d_silu: bias must have shape \(4,\), .* x \(1, 3, 4\) .* got {re_shape(bias_shape)}"
    for history in (None, T((1, 1, 4))):
        with pytest.raises(ValueError, match=message):
            fused.conv1d_silu(x, w, T(bias_shape), history)
        with tg.no_grad(), pytest.raises(ValueError, match=message):
            fused.conv1d_silu(x, w, T(bias_shape), history)


def re_shape(shape):
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize("weight_shape", [(3, 2, 2), (4, 1, 4), (3, 1, 0), (3, 0), (3,), (3, 1, 1, 2)])
def test_conv1d_silu_names_the_weight_as_given(weight_shape):
    """A 3-d weight whose middle axis is not 1 got reshape's message (no op name); a (c, 1, k) weight of the
    wrong c was shown reshaped to (c, k); k = 0 (no tap) reached the kernels."""
    with pytest.raises(ValueError, match=rf"conv1d_silu: need x \(b, l, c\) .* and weight {re_shape(weight_shape)}$"):
        fused.conv1d_silu(T((1, 4, 3)), T(weight_shape))


def test_conv1d_silu_refuses_a_history_of_the_wrong_shape_naming_the_weight_as_given():
    with pytest.raises(ValueError, match=r"history must be \(b, k - 1, c\) = \(1, 2, 3\) for x \(1, 4, 3\) and weight "
                                         r"\(3, 1, 3\), got \(1, 3, 3\)"):
        fused.conv1d_silu(T((1, 4, 3)), T((3, 1, 3)), None, T((1, 3, 3)))


def test_conv1d_silu_takes_arrays_and_refuses_what_a_tensor_cannot_hold():
    r = np.random.default_rng(0)
    x, w, b = r.standard_normal((2, 5, 3)), r.standard_normal((3, 1, 2)), r.standard_normal(3)
    np.testing.assert_array_equal(fused.conv1d_silu(x, w, b).data,
                                  fused.conv1d_silu(tg.Tensor(x), tg.Tensor(w), tg.Tensor(b)).data)
    with pytest.raises(TypeError, match="conv1d_silu: bias must be a Tensor, an array or a number, got str"):
        fused.conv1d_silu(x, w, "zeros")
