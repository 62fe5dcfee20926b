"""THE table of the public ops' tests: one `spec(...)` entry per op in tinygrad_ssm.autograd.functional.OPS, read by
every op test file, so adding an op means its definition plus one entry here.

Per op:
- grad:    {variant: case(data) -> (fn, [float64 arrays])}: gradchecked on hypothesis-drawn inputs
           (tests/autograd/test_ops_grad.py);
- forward: {variant: check(data)}: the forward values against an independent reference
           (tests/autograd/test_ops_forward.py);
- torch:   [(inputs, ours, theirs)]: forward and gradients against PyTorch at float64 tolerances
           (tests/autograd/test_torch_parity.py; `theirs` is only called when torch is installed);
- float32: () -> the op's output on float32 tensors that require grad: float32 must stay float32, and so
           must the gradients (tests/autograd/test_tensor_semantics.py);
- example: () -> the positional arguments of one plain call of functional.<name> (float64 tensors that
           require grad): the sweeps over every op (bad argument types in tests/autograd/test_ops_errors.py, views and
           the version counter in tests/autograd/test_views.py) call it.
A variant is a pytest parameter of its own, so each keeps the full hypothesis budget. The strategies are in
tests/support/strategies.py, the gradient cases and forward checks in tests/support/op_checks.py (the shape ops'
in tests/support/shape_checks.py), the references in tests/support/op_references.py.
`test_every_op_has_a_complete_spec` (tests/autograd/test_op_specs.py) fails when an op of functional.OPS has no
entry, or an entry lacks a part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import op_checks as C
from . import shape_checks as S
from .op_references import (causal_conv1d_ref, cross_entropy_ref, cumsum_ref, einsum_ref, log_softmax_ref,
                           logsumexp_ref, matmul_ref, rms_norm_ref, sigmoid_ref, softmax_ref, softplus_ref)
from .strategies import EINSUM_SPECS, away_from_zero, positive, smooth
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F

try:
    import torch
    TF = torch.nn.functional
except ImportError:  # torch is an optional reference: the parity tests skip without it
    torch = TF = None


@dataclass(frozen=True)
class OpSpec:
    grad: dict
    forward: dict
    torch: list
    float32: Callable
    example: Callable


SPECS: dict[str, OpSpec] = {}


def spec(name: str, *, grad, forward, torch, float32, example):
    """One op's entry. grad and forward take one callable (variant "") or a dict of variants."""
    assert name not in SPECS, f"{name} has two entries"
    SPECS[name] = OpSpec(grad if isinstance(grad, dict) else {"": grad},
                         forward if isinstance(forward, dict) else {"": forward}, list(torch), float32, example)


# --- inputs for the torch cases, the float32 calls and the examples ---------------------------------------

_rng = np.random.default_rng(1234)


def randn(*shape, lo=None):
    """float64 normal values; with `lo`, magnitudes are at least lo (positive only)."""
    x = _rng.standard_normal(shape)
    return np.abs(x) + lo if lo is not None else x


def f32(*shape, positive=False):
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    return Tensor(np.abs(x) + 0.5 if positive else x, requires_grad=True)


def f64(*shape, positive=False):
    x = np.random.default_rng(len(shape) + 7).standard_normal(shape)
    return Tensor(np.abs(x) + 0.5 if positive else x, requires_grad=True)


# --- elementwise ----------------------------------------------------------------------------------------

UNARY = {  # name: (gradcheck values, forward reference, forward values, torch call, torch input's lo, float32)
    "neg": (smooth(), lambda x: -x, smooth(), lambda x: torch.neg(x), None, lambda: -f32(3)),
    "exp": (smooth(), math.exp, smooth(-5, 5), lambda x: torch.exp(x), None, lambda: F.exp(f32(3))),
    "log": (positive(), math.log, positive(1e-3, 50.0), lambda x: torch.log(x), 0.1,
            lambda: F.log(f32(3, positive=True))),
    "sqrt": (positive(), math.sqrt, positive(0.0, 50.0), lambda x: torch.sqrt(x), 0.1,
             lambda: F.sqrt(f32(3, positive=True))),
    "rsqrt": (positive(), lambda x: 1 / math.sqrt(x), positive(1e-3, 50.0), lambda x: torch.rsqrt(x), 0.1,
              lambda: F.rsqrt(f32(3, positive=True))),
    "abs": (away_from_zero(), math.fabs, smooth(), lambda x: torch.abs(x), None, lambda: F.abs(f32(3))),
    "tanh": (smooth(-4, 4), math.tanh, smooth(-10, 10), lambda x: torch.tanh(x), None, lambda: F.tanh(f32(3))),
    "sigmoid": (smooth(-6, 6), sigmoid_ref, smooth(-30, 30), lambda x: torch.sigmoid(x), None,
                lambda: F.sigmoid(f32(3))),
    "silu": (smooth(-6, 6), lambda x: x * sigmoid_ref(x), smooth(-30, 30), lambda x: TF.silu(x), None,
             lambda: F.silu(f32(3))),
    "relu": (away_from_zero(), lambda x: max(x, 0.0), smooth(), lambda x: torch.relu(x), None,
             lambda: F.relu(f32(3))),
}
for _name, (_values, _reference, _forward_values, _theirs, _lo, _float32) in UNARY.items():
    _op = getattr(F, _name)
    _extra = ([([np.array([-1.0, 0.0, 2.0])], _op, _theirs)] if _name in ("abs", "relu") else [])  # 0: subgradient 0
    spec(_name, grad=C.unary_grad(_op, _values), forward=C.unary_forward(_op, _reference, _forward_values),
         torch=[([randn(3, 4, lo=_lo)], _op, _theirs)] + _extra, float32=_float32,
         example=lambda: (f64(2, 3, positive=True),))

BINARY = {  # name: (gradcheck values of a, of b, forward reference, forward values of a, of b, float32)
    "add": (smooth(), smooth(), lambda a, b: a + b, smooth(), smooth(), lambda: F.add(f32(2, 3), 1.5)),
    "sub": (smooth(), smooth(), lambda a, b: a - b, smooth(), smooth(), lambda: F.sub(2.5, f32(3))),
    "mul": (smooth(), smooth(), lambda a, b: a * b, smooth(), smooth(), lambda: f32(3) * np.float64(2)),
    "div": (smooth(), away_from_zero(0.5, 2.0), lambda a, b: a / b, smooth(), away_from_zero(0.1, 3.0),
            lambda: 1.0 / f32(3, positive=True)),
}
for _name, (_va, _vb, _reference, _fa, _fb, _float32) in BINARY.items():
    _op = getattr(F, _name)
    _theirs = (lambda n: lambda a, b: getattr(torch, n)(a, b))(_name)
    _b = randn(4, 3, lo=0.5) if _name == "div" else randn(4, 3)
    spec(_name, grad=C.binary_grad(_op, _va, _vb), forward=C.binary_forward(_op, _reference, _fa, _fb),
         torch=[([randn(2, 1, 3), _b], _op, _theirs), ([randn(3), randn(2, 3)], _op, _theirs)],
         float32=_float32, example=lambda: (f64(2, 3), f64(3)))

spec("pow", grad=C.binary_grad(F.pow, positive(0.5, 2.0), smooth(-2.0, 2.0)),  # a > 0: d/db = a^b log a exists
     forward=C.binary_forward(F.pow, math.pow, positive(0.1, 3.0), smooth()),
     torch=[([randn(2, 3, lo=0.3), randn(3)], F.pow, lambda a, b: torch.pow(a, b)),
            ([randn(4, lo=0.3)], lambda x: x ** 3, lambda x: x ** 3)],
     float32=lambda: f32(3, positive=True) ** 0.5, example=lambda: (f64(2, 3, positive=True), f64(3)))
for _name, _reference, _float32 in (("maximum", max, lambda: F.maximum(f32(3), 0.0)),
                                    ("minimum", min, lambda: F.minimum(f32(3), 0.5))):
    _op = getattr(F, _name)
    _theirs = (lambda n: lambda a, b: getattr(torch, n)(a, b))(_name)
    _ties = [([np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 3.0])], _op, _theirs)]  # ties split the gradient
    spec(_name, grad=C.untied_grad(_op), forward=C.binary_forward(_op, _reference, smooth(), smooth()),
         torch=[([randn(2, 1, 3), randn(4, 3)], _op, _theirs), ([randn(3), randn(2, 3)], _op, _theirs)] + _ties,
         float32=_float32, example=lambda: (f64(2, 3), f64(3)))

_softplus_x = np.concatenate([randn(6) * 4, [12.0, 25.0, -30.0]])  # past the threshold: the identity
spec("softplus", grad=C.softplus_grad, forward=C.unary_forward(F.softplus, softplus_ref, smooth(-30, 30)),
     torch=[([_softplus_x], F.softplus, lambda x: TF.softplus(x)),
            ([_softplus_x], lambda x: F.softplus(x, beta=2.0, threshold=10.0),
             lambda x: TF.softplus(x, beta=2.0, threshold=10.0))],
     float32=lambda: F.softplus(f32(3) * 30.0), example=lambda: (f64(2, 3),))
spec("clip", grad=C.clip_grad, forward=C.clip_forward,
     torch=[([randn(3, 4)], lambda x: F.clip(x, -0.5, 0.7), lambda x: torch.clamp(x, -0.5, 0.7)),
            ([randn(5)], lambda x: F.clip(x, min=0.1), lambda x: torch.clamp(x, min=0.1))],
     float32=lambda: F.clip(f32(3), -0.5, 0.5), example=lambda: (f64(2, 3), -0.5, 0.5))
_condition = _rng.random((2, 1, 3)) > 0.5
spec("where", grad=C.where_grad, forward=C.where_forward,
     torch=[([randn(4, 3), randn(3)], lambda x, y: F.where(_condition, x, y),
             lambda x, y: torch.where(torch.from_numpy(_condition), x, y))],
     float32=lambda: F.where(np.array([True, False, True]), f32(3), 0.0),
     example=lambda: (np.array([True, False, True]), f64(2, 3), f64(3)))
spec("cast", grad=C.cast_grad, forward=C.cast_forward,
     torch=[([randn(3, 2)], lambda x: F.cast(x, np.float32) * 1.0, lambda x: x.to(torch.float32) * 1.0)],
     float32=lambda: F.cast(F.cast(f32(3), np.float64), np.float32), example=lambda: (f64(2, 3), np.float32))

# --- reductions -----------------------------------------------------------------------------------------

REDUCTIONS = {  # name: (forward reference, torch function, gradcheck values, float32 call)
    "sum": (math.fsum, lambda x, d, k: torch.sum(x, d, keepdim=k), None, lambda: F.sum(f32(2, 3), 1)),
    "mean": (lambda v: math.fsum(v) / len(v), lambda x, d, k: torch.mean(x, d, keepdim=k), None,
             lambda: F.mean(f32(2, 3), 0)),
    "max": (max, lambda x, d, k: torch.amax(x, d, keepdim=k), "distinct",  # no ties: the max is one entry
            lambda: F.max(f32(2, 3))),
    "min": (min, lambda x, d, k: torch.amin(x, d, keepdim=k), "distinct", lambda: F.min(f32(2, 3), 0)),
    "logsumexp": (logsumexp_ref, lambda x, d, k: torch.logsumexp(x, d, keepdim=k), None,
                  lambda: F.logsumexp(f32(2, 3), 1)),
}
for _name, (_reference, _theirs, _values, _float32) in REDUCTIONS.items():
    _op = getattr(F, _name)
    _cases = [([randn(2, 3, 4)], (lambda a, k, o=_op: lambda x: o(x, a, k))(axis, keepdims),
               (lambda d, k, f=_theirs: lambda x: f(x, d, k))(tuple(range(3)) if axis is None else axis, keepdims))
              for axis, keepdims in ((None, False), (1, True), ((0, 2), False), (-1, False))]
    spec(_name, grad=C.reduction_grad(_op, _values), forward=C.reduction_forward(_op, _reference), torch=_cases,
         float32=_float32, example=lambda: (f64(2, 3), 1))
SPECS["max"].torch.append(([np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])], lambda x: F.max(x, 1),
                           lambda x: torch.amax(x, 1)))  # ties split the gradient evenly
SPECS["min"].torch.append(([np.array([[1.0, 3.0, 1.0], [2.0, 2.0, 2.0]])], lambda x: F.min(x, 1),
                           lambda x: torch.amin(x, 1)))
_scalar = np.array(0.7)  # a 0-d tensor takes axis 0 or -1 (torch's dim rules)
SPECS["sum"].torch.append(([_scalar], lambda x: F.sum(x, -1), lambda x: torch.sum(x, -1)))
SPECS["max"].torch.append(([_scalar], lambda x: F.max(x, 0, keepdims=True), lambda x: torch.amax(x, 0, keepdim=True)))

ALONG_AXIS = {"softmax": (softmax_ref, lambda x, a: torch.softmax(x, a)),
              "log_softmax": (log_softmax_ref, lambda x, a: torch.log_softmax(x, a)),
              "cumsum": (cumsum_ref, lambda x, a: torch.cumsum(x, a))}
for _name, (_reference, _theirs) in ALONG_AXIS.items():
    _op = getattr(F, _name)
    _cases = [([randn(3, 5) * 3], (lambda a, o=_op: lambda x: o(x, a))(axis),
               (lambda a, f=_theirs: lambda x: f(x, a))(axis)) for axis in (0, -1)]
    spec(_name, grad=C.along_axis_grad(_op), forward=C.along_axis_forward(_op, _reference), torch=_cases,
         float32=(lambda o: lambda: o(f32(2, 3), 1))(_op), example=lambda: (f64(2, 3), -1))
SPECS["softmax"].torch.append(([_scalar], lambda x: F.softmax(x, -1), lambda x: torch.softmax(x, -1)))
SPECS["cumsum"].torch.append(([_scalar], lambda x: F.cumsum(x, 0), lambda x: torch.cumsum(x, 0)))

_targets = np.array([0, 4, -100, 2, 2, 1])
spec("cross_entropy", grad=C.cross_entropy_grad, forward=C.cross_entropy_forward(cross_entropy_ref),
     torch=[([randn(6, 5) * 2], (lambda r: lambda x: F.cross_entropy(x, _targets, reduction=r))(reduction),
             (lambda r: lambda x: TF.cross_entropy(x, torch.from_numpy(_targets), reduction=r))(reduction))
            for reduction in ("mean", "sum", "none")]
     + [([randn(2, 3, 5)], lambda x: F.cross_entropy(x, _targets.reshape(2, 3) % 5),
         lambda x: TF.cross_entropy(x.reshape(-1, 5), torch.from_numpy(_targets % 5)))],
     float32=lambda: F.cross_entropy(f32(2, 3), np.array([0, 2])), example=lambda: (f64(2, 3), np.array([0, 2])))

# --- linear algebra -------------------------------------------------------------------------------------

spec("matmul", grad={"": C.matmul_grad, "transposed": C.matmul_transposed_grad}, forward=C.matmul_forward(matmul_ref),
     torch=[([randn(*a), randn(*b)], F.matmul, lambda x, y: torch.matmul(x, y))
            for a, b in (((3, 4), (4, 2)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)),
                         ((4,), (4,)))],
     float32=lambda: F.matmul(f32(2, 3), f32(3, 2)), example=lambda: (f64(2, 3), f64(3, 2)))
_b, _c, _l, _h, _n, _p = 2, 2, 3, 2, 3, 2
spec("einsum", grad={s: C.einsum_grad(s) for s in EINSUM_SPECS},
     forward={s: C.einsum_forward(s, einsum_ref) for s in EINSUM_SPECS},
     torch=[([randn(*s) for s in shapes], (lambda e: lambda *xs: F.einsum(e, *xs))(subscripts),
             (lambda e: lambda *xs: torch.einsum(e, *xs))(subscripts))
            for subscripts, shapes in (
                ("ij,jk->ik", ((3, 4), (4, 2))), ("ij->", ((3, 4),)), ("i,j->ij", ((3,), (2,))),
                ("bclhn,bcshn->bclhs", ((_b, _c, _l, _h, _n), (_b, _c, _l, _h, _n))),
                ("bclhn,bcshn,bhcls,bcshp->bclhp", ((_b, _c, _l, _h, _n), (_b, _c, _l, _h, _n), (_b, _h, _c, _l, _l),
                                                    (_b, _c, _l, _h, _p))),
                ("...ij,...jk->...ik", ((2, 3, 4), (2, 4, 1))))],
     float32=lambda: F.einsum("ij,jk->ik", f32(2, 3), f32(3, 2)), example=lambda: ("ij,jk->ik", f64(2, 3), f64(3, 2)))

# --- shape ----------------------------------------------------------------------------------------------

spec("reshape", grad=S.reshape_grad, forward=S.reshape_forward,
     torch=[([randn(2, 3, 4)], lambda x: F.reshape(x, (4, -1)), lambda x: x.reshape(4, -1))],
     float32=lambda: F.reshape(f32(2, 3), (3, 2)), example=lambda: (f64(2, 3), (3, 2)))
spec("flatten", grad=S.flatten_grad, forward=S.flatten_forward,
     torch=[([randn(2, 3, 4)], lambda x: F.flatten(x, 1, 2), lambda x: torch.flatten(x, 1, 2))],
     float32=lambda: F.flatten(f32(2, 3)), example=lambda: (f64(2, 3),))
spec("permute", grad=S.permute_grad, forward=S.permute_forward,
     torch=[([randn(2, 3, 4)], lambda x: F.permute(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1))],
     float32=lambda: F.permute(f32(2, 3), (1, 0)), example=lambda: (f64(2, 3), (1, 0)))
spec("transpose", grad=S.transpose_grad, forward=S.transpose_forward,
     torch=[([randn(2, 3, 4)], lambda x: F.transpose(x, 0, -1), lambda x: x.transpose(0, -1))],
     float32=lambda: F.transpose(f32(2, 3)), example=lambda: (f64(2, 3),))
spec("expand", grad=S.expand_grad, forward=S.expand_forward,
     torch=[([randn(3, 1)], lambda x: F.expand(x, (2, 3, 4)), lambda x: x.expand(2, 3, 4))],
     float32=lambda: F.expand(f32(1, 3), (2, 3)), example=lambda: (f64(1, 3), (2, 3)))
spec("unsqueeze", grad=S.unsqueeze_grad, forward=S.unsqueeze_forward,
     torch=[([randn(2, 3)], lambda x: F.unsqueeze(x, -2), lambda x: x.unsqueeze(-2))],
     float32=lambda: F.unsqueeze(f32(3), 0), example=lambda: (f64(2, 3), 1))
spec("squeeze", grad=S.squeeze_grad, forward=S.squeeze_forward,
     torch=[([randn(2, 1, 3, 1)], lambda x: F.squeeze(x, (1, 3)), lambda x: x.squeeze((1, 3))),
            ([randn(1, 3, 1)], F.squeeze, lambda x: torch.squeeze(x))],
     float32=lambda: F.squeeze(f32(1, 3)), example=lambda: (f64(1, 3),))
_rows = np.array([2, 0, 2, 2])  # repeats: the gradient scatter-adds
_mask = _rng.random((4, 3)) > 0.4
spec("getitem", grad=S.getitem_grad,
     forward={**{name: S.getitem_forward(name) for name in S.GETITEM_CASES}, "basic indices": S.getitem_basic_forward},
     torch=[([randn(4, 3)], (lambda i: lambda x: x[i])(index), (lambda i: lambda x: x[to_torch(i)])(index))
            for index in ((1, slice(None, None, 2)), (Ellipsis, None, 1), _rows, (_rows, slice(1, 3)),
                          (_rows, np.array([0, 1, 2, 1])), _mask)]
          + [([randn(2, 3, 4)], (lambda i: lambda x: x[i])(index), (lambda i: lambda x: x[to_torch(i)])(index))
             for index in ((0, slice(None), [1, 3, 1]), (slice(None), -1, np.array([[0], [2]])), (slice(None), (0, 0)),
                           (Ellipsis, 1, [2, 0]), (1, None, slice(None), np.array([True, False, True, True])),
                           ([], slice(None)))],
     float32=lambda: f32(3)[np.array([0, 0])], example=lambda: (f64(2, 3), (0, slice(None))))
spec("cat", grad=S.cat_grad, forward=S.cat_forward,
     torch=[([randn(2, 3), randn(2, 1), randn(2, 2)], lambda *xs: F.cat(xs, 1), lambda *xs: torch.cat(xs, 1))],
     float32=lambda: F.cat([f32(2), f32(3)]), example=lambda: ([f64(2, 3), f64(1, 3)], 0))
spec("stack", grad=S.stack_grad, forward=S.stack_forward,
     torch=[([randn(2, 3), randn(2, 3)], lambda *xs: F.stack(xs, -1), lambda *xs: torch.stack(xs, -1))],
     float32=lambda: F.stack([f32(2), f32(2)]), example=lambda: ([f64(2, 3), f64(2, 3)], 0))
spec("split", grad=S.split_grad, forward=S.split_forward,
     torch=[([randn(5, 2)], (lambda s: lambda x: F.cat([q * (i + 1.0) for i, q in enumerate(F.split(x, s))]))(sections),
             (lambda s: lambda x: torch.cat([q * (i + 1.0) for i, q in enumerate(torch.split(x, s))]))(sections))
            for sections in (2, [1, 3, 1])],
     float32=lambda: F.split(f32(4), 2)[1], example=lambda: (f64(4, 3), 2))
spec("pad", grad=S.pad_grad, forward=S.pad_forward,
     torch=[([randn(2, 3, 4)], lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0),
             lambda x: TF.pad(x, (1, 2, 0, 1), value=-1.0))],
     float32=lambda: F.pad(f32(3), (1, 1), value=2.0), example=lambda: (f64(2, 3), (1, 1)))
spec("flip", grad=S.flip_grad, forward=S.flip_forward,
     torch=[([randn(2, 3, 4)], lambda x: F.flip(x, (0, 2)), lambda x: torch.flip(x, (0, 2)))],
     float32=lambda: F.flip(f32(3), 0), example=lambda: (f64(2, 3), 0))
for _name, _lower, _shape in (("tril", True, (2, 3, 4)), ("triu", False, (4, 3))):
    _op = getattr(F, _name)
    spec(_name, grad=C.triangle_grad(_op), forward=C.triangle_forward(_op, _lower),
         torch=[([randn(*_shape)], (lambda k, o=_op: lambda x: o(x, k))(k),
                 (lambda k, n=_name: lambda x: getattr(torch, n)(x, k))(k)) for k in (-1, 0, 2)],
         float32=(lambda o: lambda: o(f32(3, 3)))(_op), example=lambda: (f64(3, 3),))

# --- layers' building blocks ----------------------------------------------------------------------------

_ids = np.array([[1, 3, 1], [0, 3, 3]])
spec("embedding", grad=C.embedding_grad, forward=C.embedding_forward,
     torch=[([randn(5, 4)], lambda w: F.embedding(_ids, w), lambda w: TF.embedding(torch.from_numpy(_ids), w))],
     float32=lambda: F.embedding(np.array([0, 1]), f32(3, 2)), example=lambda: (np.array([0, 2]), f64(3, 2)))


def torch_causal_conv1d(x, weight, bias=None):  # x (b, l, c), weight (c, 1, k)
    k, l = weight.shape[-1], x.shape[1]
    y = TF.conv1d(x.transpose(1, 2), weight, bias, padding=k - 1, groups=x.shape[2])  # (b, c, l + k - 1)
    return y[..., :l].transpose(1, 2)


spec("causal_conv1d", grad=C.causal_conv1d_grad, forward=C.causal_conv1d_forward(causal_conv1d_ref),
     torch=[([randn(2, 6, 3), randn(3, 1, 4), randn(3)], F.causal_conv1d, torch_causal_conv1d),
            ([randn(1, 2, 3), randn(3, 1, 4)], F.causal_conv1d, torch_causal_conv1d)],  # l < k
     float32=lambda: F.causal_conv1d(f32(1, 4, 2), f32(2, 1, 3), f32(2)),
     example=lambda: (f64(1, 4, 2), f64(2, 1, 3), f64(2)))
spec("rms_norm", grad=C.rms_norm_grad, forward=C.rms_norm_forward(rms_norm_ref),
     torch=[([randn(2, 3, 8), randn(8)], lambda x, w: F.rms_norm(x, w, 1e-5),
             lambda x, w: TF.rms_norm(x, (8,), w, 1e-5)),
            ([randn(4, 6)], lambda x: F.rms_norm(x, eps=1e-6), lambda x: TF.rms_norm(x, (6,), eps=1e-6))],
     float32=lambda: F.rms_norm(f32(2, 3), f32(3), eps=1e-5), example=lambda: (f64(2, 3), f64(3)))


def to_torch(index):
    """A NumPy index (arrays inside) as a torch index."""
    if isinstance(index, tuple):
        return tuple(to_torch(i) for i in index)
    return torch.from_numpy(index) if isinstance(index, np.ndarray) else index
