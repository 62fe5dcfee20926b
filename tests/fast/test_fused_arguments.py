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


# --- dt softplus, the norms ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt_shape,bias_shape", [((2, 3), (5,)), ((2, 3), (2, 3)), ((2, 3), (1,)), ((2, 3), ()),
                                                 ((), (1,)), ((4,), (4, 1))])
def test_dt_softplus_names_a_bias_that_is_not_one_per_head(dt_shape, bias_shape):
    """A bias (5,) for dt (2, 3) got NumPy's 'operands could not be broadcast together'; a bias that broadcasts
    (1,) or () gave a gradient of dt's shape for it. Now one bias per head, refused otherwise by name."""
    message = (rf"dt_softplus: need dt \(\.\.\., h\) and bias \(h,\), one per head, "
               rf"got dt {re_shape(dt_shape)} and bias {re_shape(bias_shape)}; pass a bias of shape")
    with pytest.raises(ValueError, match=message):
        fused.dt_softplus(T(dt_shape), T(bias_shape))


def test_dt_softplus_names_bounds_that_are_not_numbers():
    with pytest.raises(TypeError, match="dt_softplus: high must be a real number, got NoneType"):
        fused.dt_softplus(T((2, 3)), T(3), 0.0, None)


@pytest.mark.parametrize("y_shape,z_shape,w_shape,group", [((), None, (1,), 1), ((2, 6), (2, 5), (6,), 3),
                                                           ((2, 6), None, (6, 1), 6), ((2, 6), None, (6,), 4)])
def test_gated_rms_norm_names_every_shape(y_shape, z_shape, w_shape, group):
    z = None if z_shape is None else T(z_shape)
    z_text = None if z_shape is None else re_shape(z_shape)
    message = (rf"gated_rms_norm: need y .*; got y {re_shape(y_shape)}, z {z_text}, weight {re_shape(w_shape)}, "
               rf"group_size {group}$")
    with pytest.raises(ValueError, match=message):
        fused.gated_rms_norm(T(y_shape), z, T(w_shape), group)


def test_gated_rms_norm_refuses_a_group_size_that_is_not_an_int():
    with pytest.raises(TypeError, match="gated_rms_norm: group_size must be an int, got float"):
        fused.gated_rms_norm(T((2, 6)), None, T(6), 3.0)


@pytest.mark.parametrize("x_shape,m_shape,w_shape", [((), (), (1,)), ((2, 6), (2, 5), (6,)), ((2, 6), (2, 6), (5,)),
                                                     ((2, 6), (2, 6), ())])
def test_add_rms_norm_names_every_shape(x_shape, m_shape, w_shape):
    with pytest.raises(ValueError, match=rf"add_rms_norm: need .*; got x {re_shape(x_shape)}, m {re_shape(m_shape)}, "
                                         rf"weight {re_shape(w_shape)}$"):
        fused.add_rms_norm(T(x_shape), T(m_shape), T(w_shape))
