"""Forward values and gradients of every op against PyTorch on the same float64 inputs, at float64
tolerances (atol 1e-12, rtol 1e-10): both sides compute the same formulas, so they differ only by rounding.
PyTorch is only a reference here (the `bench` extra): without it this file skips."""
from __future__ import annotations

import numpy as np
import pytest

from tinygrad_ssm import Tensor
from tinygrad_ssm import functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

FORWARD_ATOL, FORWARD_RTOL = 1e-12, 1e-10
GRAD_ATOL, GRAD_RTOL = 1e-12, 1e-10

_rng = np.random.default_rng(1234)


def randn(*shape, lo=None):
    """float64 normal values; with `lo`, magnitudes are at least lo (positive only)."""
    x = _rng.standard_normal(shape)
    return np.abs(x) + lo if lo is not None else x


CASES = []  # pytest.param(ours, theirs, inputs): one comparison each


def case(op: str, inputs, ours, theirs):
    """ours(*Tensors) and theirs(*torch tensors) compute the same op on the differentiable `inputs`."""
    CASES.append(pytest.param(ours, theirs, inputs, id=f"{op}-{sum(p.id.startswith(op + '-') for p in CASES)}"))


def covered_ops():
    return {p.id.rsplit("-", 1)[0] for p in CASES}


# --- elementwise ----------------------------------------------------------------------------------------

for name in ("add", "sub", "mul", "div", "maximum", "minimum"):
    b = randn(4, 3, lo=0.5) if name == "div" else randn(4, 3)
    case(name, [randn(2, 1, 3), b], getattr(F, name), getattr(torch, name))
    case(name, [randn(3), randn(2, 3)], getattr(F, name), getattr(torch, name))
case("pow", [randn(2, 3, lo=0.3), randn(3)], F.pow, torch.pow)
case("pow", [randn(4, lo=0.3)], lambda x: x ** 3, lambda x: x ** 3)
case("maximum", [np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 3.0])], F.maximum, torch.maximum)  # ties split

UNARY = {"neg": (torch.neg, None), "exp": (torch.exp, None), "log": (torch.log, 0.1), "sqrt": (torch.sqrt, 0.1),
         "rsqrt": (torch.rsqrt, 0.1), "abs": (torch.abs, None), "tanh": (torch.tanh, None),
         "sigmoid": (torch.sigmoid, None), "silu": (TF.silu, None), "relu": (torch.relu, None)}
for name, (torch_fn, lo) in UNARY.items():
    case(name, [randn(3, 4, lo=lo)], getattr(F, name), torch_fn)
case("abs", [np.array([-1.0, 0.0, 2.0])], F.abs, torch.abs)    # the subgradient at 0 is 0 in both
case("relu", [np.array([-1.0, 0.0, 2.0])], F.relu, torch.relu)

softplus_x = np.concatenate([randn(6) * 4, [12.0, 25.0, -30.0]])  # past the threshold: the identity
case("softplus", [softplus_x], F.softplus, TF.softplus)
case("softplus", [softplus_x], lambda x: F.softplus(x, beta=2.0, threshold=10.0),
     lambda x: TF.softplus(x, beta=2.0, threshold=10.0))
case("clip", [randn(3, 4)], lambda x: F.clip(x, -0.5, 0.7), lambda x: torch.clamp(x, -0.5, 0.7))
case("clip", [randn(5)], lambda x: F.clip(x, min=0.1), lambda x: torch.clamp(x, min=0.1))
condition = _rng.random((2, 1, 3)) > 0.5
case("where", [randn(4, 3), randn(3)], lambda x, y: F.where(condition, x, y),
     lambda x, y: torch.where(torch.from_numpy(condition), x, y))
case("cast", [randn(3, 2)], lambda x: F.cast(x, np.float32) * 1.0, lambda x: x.to(torch.float32) * 1.0)

# --- reductions -----------------------------------------------------------------------------------------

for axis, keepdims in ((None, False), (1, True), ((0, 2), False), (-1, False)):
    dim = tuple(range(3)) if axis is None else axis
    case("sum", [randn(2, 3, 4)], lambda x, a=axis, k=keepdims: F.sum(x, a, k),
         lambda x, d=dim, k=keepdims: torch.sum(x, d, keepdim=k))
    case("mean", [randn(2, 3, 4)], lambda x, a=axis, k=keepdims: F.mean(x, a, k),
         lambda x, d=dim, k=keepdims: torch.mean(x, d, keepdim=k))
    case("max", [randn(2, 3, 4)], lambda x, a=axis, k=keepdims: F.max(x, a, k),
         lambda x, d=dim, k=keepdims: torch.amax(x, d, keepdim=k))
    case("logsumexp", [randn(2, 3, 4)], lambda x, a=axis, k=keepdims: F.logsumexp(x, a, k),
         lambda x, d=dim, k=keepdims: torch.logsumexp(x, d, keepdim=k))
case("max", [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])], lambda x: F.max(x, 1), lambda x: torch.amax(x, 1))
for axis in (0, -1):
    for name in ("softmax", "log_softmax", "cumsum"):
        torch_fn = {"softmax": torch.softmax, "log_softmax": torch.log_softmax, "cumsum": torch.cumsum}[name]
        case(name, [randn(3, 5) * 3], lambda x, a=axis, n=name: getattr(F, n)(x, a),
             lambda x, a=axis, f=torch_fn: f(x, a))

scalar = np.array(0.7)  # a 0-d tensor takes axis 0 or -1 (torch's dim rules)
case("sum", [scalar], lambda x: F.sum(x, -1), lambda x: torch.sum(x, -1))
case("max", [scalar], lambda x: F.max(x, 0, keepdims=True), lambda x: torch.amax(x, 0, keepdim=True))
case("softmax", [scalar], lambda x: F.softmax(x, -1), lambda x: torch.softmax(x, -1))
case("cumsum", [scalar], lambda x: F.cumsum(x, 0), lambda x: torch.cumsum(x, 0))

targets = np.array([0, 4, -100, 2, 2, 1])
for reduction in ("mean", "sum", "none"):
    case("cross_entropy", [randn(6, 5) * 2], lambda x, r=reduction: F.cross_entropy(x, targets, reduction=r),
         lambda x, r=reduction: TF.cross_entropy(x, torch.from_numpy(targets), reduction=r))
case("cross_entropy", [randn(2, 3, 5)], lambda x: F.cross_entropy(x, targets.reshape(2, 3) % 5),
     lambda x: TF.cross_entropy(x.reshape(-1, 5), torch.from_numpy(targets % 5)))

# --- linear algebra -------------------------------------------------------------------------------------

for shape_a, shape_b in (((3, 4), (4, 2)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)),
                         ((4,), (4,))):
    case("matmul", [randn(*shape_a), randn(*shape_b)], F.matmul, torch.matmul)
b, c, l, h, n, p = 2, 2, 3, 2, 3, 2
for spec, shapes in (("ij,jk->ik", ((3, 4), (4, 2))), ("ij->", ((3, 4),)), ("i,j->ij", ((3,), (2,))),
                     ("bclhn,bcshn->bclhs", ((b, c, l, h, n), (b, c, l, h, n))),
                     ("bclhn,bcshn,bhcls,bcshp->bclhp", ((b, c, l, h, n), (b, c, l, h, n), (b, h, c, l, l),
                                                         (b, c, l, h, p))),
                     ("...ij,...jk->...ik", ((2, 3, 4), (2, 4, 1)))):
    case("einsum", [randn(*s) for s in shapes], lambda *xs, s=spec: F.einsum(s, *xs),
         lambda *xs, s=spec: torch.einsum(s, *xs))

# --- shape ----------------------------------------------------------------------------------------------

case("reshape", [randn(2, 3, 4)], lambda x: F.reshape(x, (4, -1)), lambda x: x.reshape(4, -1))
case("flatten", [randn(2, 3, 4)], lambda x: F.flatten(x, 1, 2), lambda x: torch.flatten(x, 1, 2))
case("permute", [randn(2, 3, 4)], lambda x: F.permute(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1))
case("transpose", [randn(2, 3, 4)], lambda x: F.transpose(x, 0, -1), lambda x: x.transpose(0, -1))
case("expand", [randn(3, 1)], lambda x: F.expand(x, (2, 3, 4)), lambda x: x.expand(2, 3, 4))
case("unsqueeze", [randn(2, 3)], lambda x: F.unsqueeze(x, -2), lambda x: x.unsqueeze(-2))
case("squeeze", [randn(2, 1, 3, 1)], lambda x: F.squeeze(x, (1, 3)), lambda x: x.squeeze((1, 3)))
case("squeeze", [randn(1, 3, 1)], F.squeeze, torch.squeeze)
rows = np.array([2, 0, 2, 2])  # repeats: the gradient scatter-adds
mask = _rng.random((4, 3)) > 0.4
for index, torch_index in (((1, slice(None, None, 2)), (1, slice(None, None, 2))),
                           ((Ellipsis, None, 1), (Ellipsis, None, 1)),
                           (rows, torch.from_numpy(rows)),
                           ((rows, slice(1, 3)), (torch.from_numpy(rows), slice(1, 3))),
                           ((rows, np.array([0, 1, 2, 1])), (torch.from_numpy(rows), torch.tensor([0, 1, 2, 1]))),
                           (mask, torch.from_numpy(mask))):
    case("getitem", [randn(4, 3)], lambda x, i=index: x[i], lambda x, i=torch_index: x[i])
case("cat", [randn(2, 3), randn(2, 1), randn(2, 2)], lambda *xs: F.cat(xs, 1), lambda *xs: torch.cat(xs, 1))
case("stack", [randn(2, 3), randn(2, 3)], lambda *xs: F.stack(xs, -1), lambda *xs: torch.stack(xs, -1))
for sections in (2, [1, 3, 1]):
    case("split", [randn(5, 2)], lambda x, s=sections: F.cat([q * (i + 1.0) for i, q in enumerate(F.split(x, s))]),
         lambda x, s=sections: torch.cat([q * (i + 1.0) for i, q in enumerate(torch.split(x, s))]))
case("pad", [randn(2, 3, 4)], lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0),
     lambda x: TF.pad(x, (1, 2, 0, 1), value=-1.0))
case("flip", [randn(2, 3, 4)], lambda x: F.flip(x, (0, 2)), lambda x: torch.flip(x, (0, 2)))
for k in (-1, 0, 2):
    case("tril", [randn(2, 3, 4)], lambda x, k=k: F.tril(x, k), lambda x, k=k: torch.tril(x, k))
    case("triu", [randn(4, 3)], lambda x, k=k: F.triu(x, k), lambda x, k=k: torch.triu(x, k))

# --- layers' building blocks ----------------------------------------------------------------------------

ids = np.array([[1, 3, 1], [0, 3, 3]])
case("embedding", [randn(5, 4)], lambda w: F.embedding(ids, w), lambda w: TF.embedding(torch.from_numpy(ids), w))


def torch_causal_conv1d(x, weight, bias=None):  # x (b, l, c), weight (c, 1, k)
    k, l = weight.shape[-1], x.shape[1]
    y = TF.conv1d(x.transpose(1, 2), weight, bias, padding=k - 1, groups=x.shape[2])  # (b, c, l + k - 1)
    return y[..., :l].transpose(1, 2)


case("causal_conv1d", [randn(2, 6, 3), randn(3, 1, 4), randn(3)], F.causal_conv1d, torch_causal_conv1d)
case("causal_conv1d", [randn(1, 2, 3), randn(3, 1, 4)], F.causal_conv1d, torch_causal_conv1d)  # l < k
case("rms_norm", [randn(2, 3, 8), randn(8)], lambda x, w: F.rms_norm(x, w, 1e-5),
     lambda x, w: TF.rms_norm(x, (8,), w, 1e-5))
case("rms_norm", [randn(4, 6)], lambda x: F.rms_norm(x, eps=1e-6), lambda x: TF.rms_norm(x, (6,), eps=1e-6))


# --- the comparisons ------------------------------------------------------------------------------------

def test_every_public_op_is_compared_with_torch():
    missing = sorted(set(F.OPS) - covered_ops())
    assert not missing, f"ops in functional.OPS without a torch parity case: {missing}"


@pytest.mark.parametrize("ours, theirs, inputs", CASES)
def test_forward_and_gradients_match_torch(ours, theirs, inputs):
    mine = [Tensor(x.copy(), requires_grad=True) for x in inputs]
    out = ours(*mine)
    weight = np.random.default_rng(0).standard_normal(out.shape)  # a random upstream gradient
    (out * Tensor(weight)).sum().backward()

    reference = [torch.tensor(x, requires_grad=True) for x in inputs]
    expected = theirs(*reference)
    (expected * torch.from_numpy(weight)).sum().backward()

    assert out.shape == tuple(expected.shape)
    assert out.dtype == np.dtype(str(expected.dtype).removeprefix("torch."))
    np.testing.assert_allclose(out.data, expected.detach().numpy(), atol=FORWARD_ATOL, rtol=FORWARD_RTOL)
    for i, (x, r) in enumerate(zip(mine, reference)):
        np.testing.assert_allclose(x.grad.data, r.grad.numpy(), atol=GRAD_ATOL, rtol=GRAD_RTOL,
                                   err_msg=f"gradient of input {i}")
