"""Layers and initialisers at torch's edges: a Linear with no inputs (torch allows it: its weight has no
entries to draw, its output is the bias), an RMS norm over an empty last axis, and calculate_gain's leaky_relu
slope of 0.01 when none is given."""
import math

import numpy as np
import pytest

from tinygrad_ssm import Tensor, VarBuilder, VarMap
from tinygrad_ssm.nn import Embedding, Linear, init


@pytest.mark.parametrize("fused", [False, True])
def test_a_linear_with_no_inputs_gives_its_bias(fused):
    layer = Linear(VarBuilder.from_varmap(VarMap()), 0, 3, fused=fused, bias_init=init.Const(0.5))
    x = Tensor(np.zeros((2, 5, 0), np.float32), requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == (2, 5, 3) and np.all(y.data == 0.5)
    assert layer.weight.grad.shape == (3, 0) and x.grad.shape == (2, 5, 0) and layer.bias.grad.tolist() == [10] * 3


def test_kaiming_of_a_zero_element_shape_draws_nothing():
    rng = np.random.default_rng(0)
    for scheme in (init.KaimingUniform(a=math.sqrt(5)), init.KaimingNormal()):
        assert scheme((3, 0), rng, np.float32).shape == (3, 0)
    assert rng.random() == np.random.default_rng(0).random()       # no number was drawn
    with pytest.raises(ValueError, match="at least 2 dimensions"):  # the shape is still checked
        init.KaimingUniform()((0,), rng, np.float32)


def test_calculate_gain_takes_torchs_leaky_relu_slope():
    torch = pytest.importorskip("torch")
    for nonlinearity, a in [("leaky_relu", None), ("leaky_relu", 0.2), ("leaky_relu", 0.0), ("relu", None),
                            ("tanh", None), ("linear", None)]:
        assert init.calculate_gain(nonlinearity, a) == pytest.approx(torch.nn.init.calculate_gain(nonlinearity, a),
                                                                     rel=1e-15)


def test_rms_norm_over_an_empty_last_axis_is_empty_as_torch():
    """The engine's backward reshaped its weight gradient to (-1, 0), which NumPy cannot."""
    from tinygrad_ssm.autograd import functional as F
    x, weight = Tensor(np.zeros((2, 0)), requires_grad=True), Tensor(np.ones(0), requires_grad=True)
    y = F.rms_norm(x, weight)
    y.sum().backward()
    assert y.shape == x.grad.shape == (2, 0) and weight.grad.shape == (0,)


def test_a_linear_names_a_size_that_is_not_an_int_and_an_input_that_is_not_a_tensor():
    """Linear(vb, "4", 3) failed comparing a str with 0, a Linear called on a list with AttributeError 'shape'
    (found by an API fuzz)."""
    vb = VarBuilder.from_varmap(VarMap())
    with pytest.raises(ValueError, match=r"'a.weight': shape must be non-negative ints, got \(3, '4'\)"):
        Linear(vb.pp("a"), "4", 3)
    layer = Linear(vb.pp("b"), 2, 3)
    with pytest.raises(TypeError, match=r"Linear 'b': input must be a Tensor, got list"):
        layer([1.0, 2.0])
    with pytest.raises(TypeError, match=r"Embedding.attend 'e': input must be a Tensor, got tuple"):
        Embedding(vb.pp("e"), 5, 2).attend((1.0, 2.0))
