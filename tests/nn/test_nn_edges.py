"""Layers and initialisers at torch's edges: a Linear with no inputs (torch allows it: its weight has no
entries to draw, its output is the bias), an RMS norm over an empty last axis, and calculate_gain's leaky_relu
slope of 0.01 when none is given."""
import math

import numpy as np
import pytest

from tinygrad_ssm import Tensor, VarBuilder, VarMap
from tinygrad_ssm.autograd import functional as F
from tinygrad_ssm.nn import CausalDepthwiseConv1d, Embedding, GatedRMSNorm, Linear, RMSNorm, init


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


@pytest.mark.parametrize("fused", [False, True])
def test_zero_width_embeddings_and_norms_run_both_ways_as_torch(fused):
    """An embedding of width 0 failed in backward (grad.reshape(-1, 0)), and RMSNorm(0, fused=True) refused the
    input the engine's path took (an audit of the layers against torch: torch gives empty results and gradients)."""
    vb = VarBuilder.from_varmap(VarMap())
    emb = Embedding(vb.pp("e"), 3, 0, fused=fused)
    emb(np.array([[1, 2, 1]])).sum().backward()
    assert emb.weight.grad.shape == (3, 0)
    w = Tensor(np.zeros((3, 0)), requires_grad=True)
    F.sum(F.embedding(np.array([1]), w)).backward()
    assert w.grad.shape == (3, 0)
    x = Tensor(np.zeros((2, 0)), requires_grad=True)
    y = RMSNorm(vb.pp("n"), 0, fused=fused)(x)
    y.sum().backward()
    assert y.shape == x.grad.shape == (2, 0)


def test_layers_name_an_input_that_is_not_a_tensor_and_a_group_size_that_is_not_an_int():
    """A list given to a norm or the conv failed with AttributeError 'shape' or 'ndim'; GatedRMSNorm took
    group_size 2.0 (and True) and failed at the first call in a reshape naming neither (an audit)."""
    vb = VarBuilder.from_varmap(VarMap())
    norm, gated, conv = RMSNorm(vb.pp("n"), 2), GatedRMSNorm(vb.pp("g"), 2, 2), CausalDepthwiseConv1d(vb.pp("c"), 2, 3)
    calls = [(lambda: norm([[1.0, 2.0]]), "RMSNorm 'n': input"), (lambda: gated([[1.0, 2.0]]), "GatedRMSNorm 'g': y"),
             (lambda: gated(Tensor(np.ones((1, 2))), [[1.0, 2.0]]), "GatedRMSNorm 'g': z"),
             (lambda: conv([[[1.0, 2.0]]]), "CausalDepthwiseConv1d 'c': x"),
             (lambda: conv.silu_of(Tensor(np.ones((1, 1, 2))), [[[0.0, 0.0]] * 2]), "CausalDepthwiseConv1d 'c': history"),
             (lambda: conv.step([[[0.0] * 3] * 2], Tensor(np.ones((1, 2)))), "CausalDepthwiseConv1d.step 'c': state")]
    for call, message in calls:
        with pytest.raises(TypeError, match=f"{message} must be a Tensor, got list"):
            call()
    for group_size in (2.0, True, "2"):
        with pytest.raises(TypeError, match=rf"GatedRMSNorm 'h': dim and group_size must be ints, got dim=4, "
                                            rf"group_size={group_size!r}"):
            GatedRMSNorm(vb.pp("h"), 4, group_size)


def test_inits_refuse_arguments_that_are_not_finite_numbers():
    """KaimingUniform(a="x") failed in a product, a = True was a slope of 1 (torch refuses a bool), and
    Uniform(0, inf) or a = nan failed in NumPy's sampler without naming the init or the argument (an audit)."""
    for a in ("x", True, float("nan")):
        with pytest.raises(ValueError, match=r"init.calculate_gain: a \(leaky_relu's negative slope\) must be a finite"):
            init.KaimingUniform(a=a)
    with pytest.raises(ValueError, match=r"init.Uniform: hi must be a finite number, got inf"):
        init.Uniform(0, float("inf"))
    with pytest.raises(ValueError, match=r"init.Randn: std must be a finite number, got nan"):
        init.Randn(0.0, float("nan"))
    assert init.KaimingUniform(a=np.float64(math.sqrt(5))).a == math.sqrt(5)   # NumPy numbers are numbers


def test_a_variable_name_utf8_cannot_store_is_refused_when_made():
    """'w\\ud800' (a lone surrogate) was taken, and the save failed with a bare UnicodeEncodeError (an audit)."""
    with pytest.raises(ValueError, match=r"the name must be .* in text UTF-8 can store .* got 'w\\ud800'"):
        VarMap().get((1,), "w\ud800", init=init.Const(0.0))
