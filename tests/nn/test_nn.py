"""Layers: parameter names and shapes, forward against NumPy (and torch when installed), and float64
gradients against finite differences for every parameter and input."""
import math

import numpy as np
import pytest
from tests.support.gradcheck import gradcheck
from tests.support.mamba2_numpy_reference import causal_depthwise_conv, rms_norm, silu

import tinygrad_ssm as tg
from tinygrad_ssm import VarBuilder, VarMap, nn


def builder(dtype="float64", seed=0):
    vm = VarMap(seed=seed)
    return vm, VarBuilder.from_varmap(vm, dtype)


def rng():
    return np.random.default_rng(123)


# --- Linear -----------------------------------------------------------------------------------------------

def test_linear_names_shapes_init_and_forward():
    vm, vb = builder("float32")
    lin = nn.Linear(vb.pp("in_proj"), 5, 3)
    assert vm.names() == ["in_proj.weight", "in_proj.bias"]
    assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
    bound = 1 / math.sqrt(5)
    assert np.abs(lin.weight.data).max() <= bound and np.abs(lin.bias.data).max() <= bound
    x = rng().standard_normal((2, 4, 5)).astype(np.float32)
    y = lin(tg.Tensor(x))
    assert y.shape == (2, 4, 3) and y.dtype == np.float32
    np.testing.assert_allclose(y.data, x @ lin.weight.data.T + lin.bias.data, rtol=1e-6, atol=1e-6)
    nobias = nn.Linear(vb.pp("out_proj"), 5, 3, bias=False)
    assert nobias.bias is None and "out_proj.bias" not in vm
    assert nn.Linear(vb.pp("in_proj"), 5, 3).weight is lin.weight  # the same variables when rebuilt


def test_linear_init_is_torchs_draw_for_draw():
    """weight then bias, each U(+-1/sqrt(in_features)) from the VarMap's one generator (torch.nn.Linear's
    reset_parameters): a bound from out_features, or the two drawn in the other order, gives other numbers. (The
    test above only bounds them from above: a narrower bias passes it.)"""
    vm, vb = builder("float64", seed=7)
    lin = nn.Linear(vb.pp("proj"), 5, 3)
    draws, bound = np.random.default_rng(7), 1 / math.sqrt(5)
    np.testing.assert_allclose(lin.weight.data, draws.uniform(-bound, bound, (3, 5)), rtol=1e-12, atol=0)
    np.testing.assert_allclose(lin.bias.data, draws.uniform(-bound, bound, 3), rtol=1e-12, atol=0)


def test_linear_rejects_wrong_input_naming_the_layer():
    _, vb = builder()
    lin = nn.Linear(vb.pp("layers").pp(2).pp("proj"), 5, 3)
    with pytest.raises(ValueError, match=r"Linear 'layers\.2\.proj': input must end with in_features=5, got shape \(2, 4\)"):
        lin(tg.Tensor(np.zeros((2, 4))))


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
def test_linear_gradients(shape):
    _, vb = builder()
    lin = nn.Linear(vb.pp("lin"), 4, 3)
    r = rng()

    def fn(x, w, b):
        lin.weight, lin.bias = w, b
        return lin(x)

    gradcheck(fn, r.standard_normal(shape), r.standard_normal((3, 4)), r.standard_normal(3))


# --- Embedding --------------------------------------------------------------------------------------------

def test_embedding_forward_init_and_gradient_with_repeated_ids():
    vm, vb = builder("float32")
    emb = nn.Embedding(vb.pp("embedding"), 1000, 16)
    assert vm.names() == ["embedding.weight"] and emb.weight.shape == (1000, 16)
    assert abs(emb.weight.data.std() - 0.02) < 0.001
    ids = np.array([[3, 1, 3], [0, 999, 3]])
    np.testing.assert_array_equal(emb(ids).data, emb.weight.data[ids])

    _, vb64 = builder()
    small = nn.Embedding(vb64.pp("e"), 5, 3)

    def fn(w):
        small.weight = w
        return small(ids % 5)

    gradcheck(fn, rng().standard_normal((5, 3)))


def test_embedding_attend_is_the_tied_head():
    _, vb = builder()
    emb = nn.Embedding(vb.pp("e"), 6, 4)
    r = rng()
    x = r.standard_normal((2, 3, 4))
    np.testing.assert_allclose(emb.attend(tg.Tensor(x)).data, x @ emb.weight.data.T, rtol=1e-12)

    def fn(x, w):
        emb.weight = w
        return emb.attend(x)

    gradcheck(fn, x, r.standard_normal((6, 4)))


# --- RMSNorm and GatedRMSNorm -----------------------------------------------------------------------------

def test_rmsnorm_forward_and_gradients():
    vm, vb = builder()
    norm = nn.RMSNorm(vb.pp("norm_f"), 6)
    assert vm.names() == ["norm_f.weight"] and np.array_equal(norm.weight.data, np.ones(6))
    r = rng()
    x, w = r.standard_normal((2, 3, 6)), r.standard_normal(6)
    norm.weight = tg.Tensor(w)
    np.testing.assert_allclose(norm(tg.Tensor(x)).data, rms_norm(x, w, 1e-5), rtol=1e-12)

    def fn(x, w):
        norm.weight = w
        return norm(x)

    gradcheck(fn, x, w)
    with pytest.raises(ValueError, match=r"RMSNorm 'norm_f': input must end with dim=6"):
        norm(tg.Tensor(np.zeros((2, 5))))


def test_rmsnorm_matches_torch():
    torch = pytest.importorskip("torch")
    _, vb = builder()
    norm = nn.RMSNorm(vb.pp("n"), 8)
    r = rng()
    x, w = r.standard_normal((3, 8)), r.standard_normal(8)
    norm.weight = tg.Tensor(w)
    expected = torch.nn.functional.rms_norm(torch.tensor(x), (8,), torch.tensor(w), eps=1e-5).numpy()
    np.testing.assert_allclose(norm(tg.Tensor(x)).data, expected, rtol=1e-12, atol=1e-12)


def gated_ref(y, z, weight, group_size, eps=1e-5):
    g = y * silu(z)
    return rms_norm(g.reshape(*g.shape[:-1], -1, group_size), None, eps).reshape(g.shape) * weight


@pytest.mark.parametrize("group_size", [8, 4, 2])
def test_gated_rmsnorm_forward_and_gradients(group_size):
    vm, vb = builder()
    norm = nn.GatedRMSNorm(vb.pp("mixer").pp("norm"), 8, group_size)
    assert vm.names() == ["mixer.norm.weight"]
    r = rng()
    y, z, w = r.standard_normal((2, 3, 8)), r.standard_normal((2, 3, 8)), r.standard_normal(8)
    norm.weight = tg.Tensor(w)
    np.testing.assert_allclose(norm(tg.Tensor(y), tg.Tensor(z)).data, gated_ref(y, z, w, group_size), rtol=1e-12)

    def fn(y, z, w):
        norm.weight = w
        return norm(y, z)

    gradcheck(fn, y, z, w)


def test_gated_rmsnorm_groups_matter_and_bad_sizes_are_rejected():
    _, vb = builder()
    r = rng()
    y, z = tg.Tensor(r.standard_normal((4, 8))), tg.Tensor(r.standard_normal((4, 8)))
    whole = nn.GatedRMSNorm(vb.pp("a"), 8, 8)(y, z).data
    plain = nn.RMSNorm(vb.pp("b"), 8)(y * tg.functional.silu(z)).data
    np.testing.assert_allclose(whole, plain, rtol=1e-12)  # one group is a plain RMSNorm of the gated input
    assert not np.allclose(nn.GatedRMSNorm(vb.pp("c"), 8, 4)(y, z).data, whole)
    with pytest.raises(ValueError, match="dim=8 must be a multiple of group_size=3"):
        nn.GatedRMSNorm(vb.pp("d"), 8, 3)
    with pytest.raises(ValueError, match=r"z must have y's shape \(4, 8\)"):
        nn.GatedRMSNorm(vb.pp("a"), 8, 8)(y, tg.Tensor(np.zeros((4, 4))))


# --- CausalDepthwiseConv1d --------------------------------------------------------------------------------

def test_conv_names_shapes_forward_and_causality():
    vm, vb = builder()
    conv = nn.CausalDepthwiseConv1d(vb.pp("conv1d"), 5, 4)
    assert vm.names() == ["conv1d.weight", "conv1d.bias"]
    assert conv.weight.shape == (5, 1, 4) and conv.bias.shape == (5,)
    assert np.abs(conv.weight.data).max() <= 0.5 and np.abs(conv.bias.data).max() <= 0.5  # 1/sqrt(k)
    x = rng().standard_normal((2, 7, 5))
    y = conv(tg.Tensor(x)).data
    np.testing.assert_allclose(y, causal_depthwise_conv(x, conv.weight.data, conv.bias.data), rtol=1e-12, atol=1e-12)
    x2 = x.copy()
    x2[:, 4:] += 1.0  # changing the future does not change the past
    np.testing.assert_array_equal(conv(tg.Tensor(x2)).data[:, :4], y[:, :4])
    with pytest.raises(ValueError, match=r"CausalDepthwiseConv1d 'conv1d': x must be \(b, l, 5\), got \(2, 7, 4\)"):
        conv(tg.Tensor(np.zeros((2, 7, 4))))


def test_conv_init_is_torchs_draw_for_draw():
    """weight (c, 1, k) then bias (c,), each U(+-1/sqrt(k)) (Conv1d(groups=c): fan_in = 1 * k) from the VarMap's
    one generator; the test above only bounds them from above, which a narrower bias (1/k) passes."""
    vm, vb = builder("float64", seed=11)
    conv = nn.CausalDepthwiseConv1d(vb.pp("conv1d"), 5, 4)
    draws, bound = np.random.default_rng(11), 1 / math.sqrt(4)
    np.testing.assert_allclose(conv.weight.data, draws.uniform(-bound, bound, (5, 1, 4)), rtol=1e-12, atol=0)
    np.testing.assert_allclose(conv.bias.data, draws.uniform(-bound, bound, 5), rtol=1e-12, atol=0)


def test_conv_matches_torch_conv1d():
    torch = pytest.importorskip("torch")
    _, vb = builder()
    conv = nn.CausalDepthwiseConv1d(vb.pp("c"), 6, 4)
    x = rng().standard_normal((2, 9, 6))
    ref = torch.nn.functional.conv1d(torch.tensor(x).transpose(1, 2), torch.tensor(conv.weight.data),
                                     torch.tensor(conv.bias.data), padding=3, groups=6)[..., :9]
    np.testing.assert_allclose(conv(tg.Tensor(x)).data, ref.transpose(1, 2).numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_gradients(bias):
    _, vb = builder()
    conv = nn.CausalDepthwiseConv1d(vb.pp("c"), 3, 4, bias=bias)
    r = rng()
    arrays = [r.standard_normal((2, 5, 3)), r.standard_normal((3, 1, 4))] + ([r.standard_normal(3)] if bias else [])

    def fn(x, w, b=None):
        conv.weight, conv.bias = w, b
        return conv(x)

    gradcheck(fn, *arrays)


def test_conv_step_equals_the_full_forward_and_is_differentiable():
    _, vb = builder()
    conv = nn.CausalDepthwiseConv1d(vb.pp("c"), 3, 4)
    r = rng()
    x = r.standard_normal((2, 6, 3))
    full = conv(tg.Tensor(x)).data
    state = tg.zeros(2, 3, 4, dtype=np.float64)
    for t in range(6):
        y_t, state = conv.step(state, tg.Tensor(x[:, t]))
        np.testing.assert_allclose(y_t.data, full[:, t], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(state.data, np.transpose(x[:, 2:], (0, 2, 1)))

    def fn(s, x_t, w, b):
        conv.weight, conv.bias = w, b
        y, new_state = conv.step(s, x_t)
        return y * 2 + new_state.sum(axis=2)

    gradcheck(fn, r.standard_normal((2, 3, 4)), r.standard_normal((2, 3)), r.standard_normal((3, 1, 4)),
              r.standard_normal(3))
    with pytest.raises(ValueError, match="need state"):
        conv.step(tg.zeros(2, 3, 3), tg.zeros(2, 3))


def test_layers_train_through_the_registry():
    """Every parameter the layers create is in the VarMap and receives a gradient from a loss."""
    vm, vb = builder()
    emb = nn.Embedding(vb.pp("embedding"), 7, 4)
    conv = nn.CausalDepthwiseConv1d(vb.pp("conv"), 4, 3)
    gnorm = nn.GatedRMSNorm(vb.pp("gnorm"), 4, 2)
    lin = nn.Linear(vb.pp("proj"), 4, 7)
    ids = np.array([[1, 2, 3, 4, 5]])
    h = emb(ids)
    h = gnorm(conv(h), h)
    loss = tg.functional.cross_entropy(lin(h).reshape(-1, 7), np.array([2, 3, 4, 5, 6]))
    loss.backward()
    for name, t in vm.named_vars():
        assert t.grad is not None and np.abs(t.grad.data).sum() > 0, name


def test_linear_weight_gradient_is_c_contiguous_like_the_weight():
    """x @ W.T hands W a gradient laid out like W (Matmul's transposed-operand case): the optimizer's kernel takes
    it without a copy, and it equals the textbook dW = dY^T X."""
    r = np.random.default_rng(0)
    _, vb = builder()
    lin = nn.Linear(vb.pp("proj"), 4, 3)
    x = r.standard_normal((2, 5, 4))
    w_out = r.standard_normal((2, 5, 3))
    (lin(tg.Tensor(x)) * tg.Tensor(w_out)).sum().backward()
    grad = lin.weight.grad.data
    assert grad.flags.c_contiguous
    np.testing.assert_allclose(grad, w_out.reshape(-1, 3).T @ x.reshape(-1, 4), rtol=1e-12)


@pytest.mark.parametrize("eps", [-1.0, 0.0, float("inf"), "1e-5", True])
def test_a_norm_with_an_eps_that_is_not_a_positive_number_is_refused(eps):
    """RMSNorm(eps=-1) made every output NaN; eps="x" failed at the first call (found by an API audit)."""
    _, vb = builder()
    with pytest.raises(ValueError, match=r"RMSNorm 'n': eps must be a positive finite number"):
        nn.RMSNorm(vb.pp("n"), 4, eps=eps)
    with pytest.raises(ValueError, match=r"GatedRMSNorm 'g': eps must be a positive finite number"):
        nn.GatedRMSNorm(vb.pp("g"), 4, 2, eps=eps)

