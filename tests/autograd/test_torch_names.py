"""torch's names for the axis arguments (dim=, keepdim=, dims=, dim0=/dim1=, start_dim=/end_dim=), taken by every op
and Tensor method that has an axis argument, mapped in one place (autograd/torch_names.py); both spellings at once, and
torch.max/min's dim form (a (values, indices) pair in torch), are refused by name."""
import inspect

import numpy as np
import pytest

from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F
from tinygrad_ssm.autograd import torch_names

torch = pytest.importorskip("torch")

# (ours, theirs): the same program written with torch's keywords on both sides; outputs flattened and joined
CASES = {
    "sum": (lambda x: F.sum(x, dim=1, keepdim=True), lambda x: torch.sum(x, dim=1, keepdim=True)),
    "Tensor.sum": (lambda x: x.sum(dim=(0, 2)), lambda x: x.sum(dim=(0, 2))),
    "mean": (lambda x: x.mean(dim=-1, keepdim=True), lambda x: x.mean(dim=-1, keepdim=True)),
    "amax": (lambda x: F.amax(x, dim=1, keepdim=True), lambda x: torch.amax(x, dim=1, keepdim=True)),
    "Tensor.amin": (lambda x: x.amin(dim=(0, 1)), lambda x: x.amin(dim=(0, 1))),
    "logsumexp": (lambda x: x.logsumexp(dim=0), lambda x: x.logsumexp(dim=0)),
    "softmax": (lambda x: F.softmax(x, dim=0), lambda x: torch.softmax(x, dim=0)),
    "log_softmax": (lambda x: x.log_softmax(dim=1), lambda x: x.log_softmax(dim=1)),
    "cumsum": (lambda x: F.cumsum(x, dim=2), lambda x: torch.cumsum(x, dim=2)),
    "cat": (lambda x: F.cat([x, x * 2], dim=1), lambda x: torch.cat([x, x * 2], dim=1)),
    "stack": (lambda x: F.stack([x, x * 2], dim=3), lambda x: torch.stack([x, x * 2], dim=3)),
    "unsqueeze": (lambda x: x.unsqueeze(dim=1), lambda x: x.unsqueeze(dim=1)),
    "squeeze": (lambda x: F.squeeze(x[:1], dim=0), lambda x: torch.squeeze(x[:1], dim=0)),
    "flatten": (lambda x: x.flatten(start_dim=1), lambda x: x.flatten(start_dim=1)),
    "flatten end": (lambda x: F.flatten(x, start_dim=0, end_dim=1), lambda x: torch.flatten(x, 0, end_dim=1)),
    "transpose": (lambda x: x.transpose(dim0=0, dim1=2), lambda x: x.transpose(dim0=0, dim1=2)),
    "flip": (lambda x: x.flip(dims=(0, 2)), lambda x: x.flip(dims=(0, 2))),
    "Tensor.permute": (lambda x: x.permute(dims=(2, 0, 1)), lambda x: x.permute(dims=(2, 0, 1))),
    "split": (lambda x: F.cat([p.flatten() for p in x.split(2, dim=2)], dim=0),
              lambda x: torch.cat([p.flatten() for p in x.split(2, dim=2)], dim=0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_torch_names_give_torchs_values_and_gradients(name):
    ours, theirs = CASES[name]
    data = np.random.default_rng(0).standard_normal((2, 3, 4))
    x, xt = Tensor(data.copy(), requires_grad=True), torch.tensor(data, requires_grad=True)
    out, expected = ours(x), theirs(xt)
    weight = np.random.default_rng(1).standard_normal(out.shape)
    (out * Tensor(weight)).sum().backward()
    (expected * torch.from_numpy(weight)).sum().backward()
    assert out.shape == tuple(expected.shape)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), atol=1e-12, rtol=1e-10)
    np.testing.assert_allclose(x.grad.data, xt.grad.numpy(), atol=1e-12, rtol=1e-10)


def test_argmax_and_argmin_take_dim_and_keepdim():
    data = np.random.default_rng(2).standard_normal((3, 4))
    x, xt = Tensor(data), torch.tensor(data)
    for ours, theirs in ((x.argmax(dim=1, keepdim=True), xt.argmax(dim=1, keepdim=True)),
                         (x.argmin(dim=0), xt.argmin(dim=0)), (x.argmin(), xt.argmin())):
        assert ours.tolist() == theirs.tolist()


def test_every_op_and_method_with_an_axis_argument_takes_torchs_names():
    """Structural: nothing with an `axis`/`keepdims`/`axis0`/`start` parameter is left without the mapping."""
    ours = {o for _, o in torch_names.TORCH_NAMES}
    functions = [(f"F.{n}", getattr(F, n)) for n in [*F.OPS, "amax", "amin"]]
    methods = [(f"Tensor.{n}", m) for n, m in vars(Tensor).items() if inspect.isfunction(m)]
    missing = [name for name, fn in functions + methods
               if ours & set(inspect.signature(fn).parameters) and not hasattr(fn, "__wrapped__")
               and name != "Tensor.permute"]                                  # permute(*axes): positional only
    assert not missing, missing
    assert "axis" in inspect.signature(F.sum).parameters                      # the signature is still the engine's


def test_both_spellings_at_once_are_refused_by_name():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    for call, op in ((lambda: F.sum(x, dim=1, axis=1), "sum"), (lambda: x.mean(axis=0, dim=0), "mean"),
                     (lambda: x.softmax(dim=0, axis=0), "softmax"),
                     (lambda: x.transpose(dim0=0, axis0=0), "transpose")):
        with pytest.raises(TypeError, match=rf"^{op}: got both (dim|keepdim|dim0)= and (axis|keepdims|axis0)=, "
                                            r"torch's and NumPy's names for one argument; give one"):
            call()


def test_max_and_min_refuse_torchs_dim_form_which_returns_values_and_indices():
    """x.max(dim=1) is (values, indices) in torch: taken as the values, `x.max(dim=1)[0]` would be the first row."""
    x = Tensor(np.array([[1.0, 5.0], [7.0, 2.0]]), requires_grad=True)
    for call, op in ((lambda: x.max(dim=1), "max"), (lambda: F.max(x, 1, keepdim=True), "max"),
                     (lambda: x.min(dim=0), "min"), (lambda: F.min(x, dim=0), "min")):
        with pytest.raises(TypeError, match=rf"^{op}: (dim|keepdim)= is torch's spelling, and torch.{op}\(x, dim\) "
                                            rf"returns \(values, indices\); {op} here is a{op} \(the values only\): "
                                            rf"write a{op}\(dim=...\) for the values, arg{op}\(dim=...\)"):
            call()
    assert x.max(1).tolist() == x.amax(dim=1).tolist() == [5.0, 7.0]         # NumPy's spelling: the values
    assert x.min(axis=0).tolist() == F.amin(x, dim=0).tolist() == [1.0, 2.0]
