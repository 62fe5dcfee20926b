"""gradient_report: the stray detach(), the tensor created outside the registry, and a healthy model."""
import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import VarBuilder, VarMap, gradient_report, nn
from tinygrad_ssm.nn import init
from tinygrad_ssm.autograd import functional as F

IDS = np.array([[1, 2, 3, 4, 5, 6]])
TARGETS = np.array([[2, 3, 4, 5, 6, 7]])


class ToySSM:
    """embedding -> in_proj -> a decaying scan mixer (A = -exp(A_log)) -> norm -> head. Switches reproduce
    the bugs of the Rust model: `detach` cuts the graph after in_proj; `stray_A` uses a random tensor made
    outside the registry instead of the registered A_log."""

    def __init__(self, varmap, detach=False, stray_A=False):
        vb = VarBuilder.from_varmap(varmap)
        self.embedding = nn.Embedding(vb.pp("embedding"), 8, 4)
        self.in_proj = nn.Linear(vb.pp("mixer").pp("in_proj"), 4, 4, bias=False)
        self.A_log = vb.pp("mixer").get((4,), "A_log", init=lambda shape, rng, dtype: np.log(rng.uniform(1, 16, shape)))
        self.norm = nn.RMSNorm(vb.pp("norm_f"), 4)
        self.head = nn.Linear(vb.pp("lm_head"), 4, 8, bias=False)
        self.detach = detach
        self.stray = tg.Tensor(np.log(np.arange(1, 5, dtype=np.float32)), requires_grad=True) if stray_A else None

    def loss(self, ids, targets):
        h = self.in_proj(self.embedding(ids))                     # (b, l, d)
        if self.detach:
            h = h.detach()                                        # the bug: nothing before this trains
        A = -F.exp(self.stray if self.stray is not None else self.A_log)   # (d,)
        decay = F.exp(A * 0.1)                                    # (d,)
        states, s = [], None
        for t in range(h.shape[1]):                               # s_t = decay * s_{t-1} + h_t
            s = h[:, t] if s is None else decay * s + h[:, t]
            states.append(s)
        y = self.norm(F.stack(states, axis=1))                    # (b, l, d)
        logits = self.head(y)                                     # (b, l, V)
        return F.cross_entropy(logits.reshape(-1, 8), targets.reshape(-1))


def report_for(**kw):
    vm = VarMap(seed=0)
    model = ToySSM(vm, **kw)
    loss = model.loss(IDS, TARGETS)
    loss.backward()
    return gradient_report(loss, vm, model=model), vm


def test_a_healthy_model_reports_ok():
    report, vm = report_for()
    assert report.ok and bool(report)
    assert report.no_grad == report.zero_grad == report.non_finite == report.frozen == [] and report.strays == []
    text = str(report)
    assert "verdict: OK" in text
    for name in vm.names():
        assert name in text
    grads = {name: t.grad.data for name, t in vm.named_vars()}
    for row in report.rows:
        assert row.status == "ok" and row.reached and row.grad_norm > 0
        assert row.grad_norm == pytest.approx(np.linalg.norm(grads[row.name].astype(np.float64)), rel=1e-12)
        assert f"{row.grad_norm:.3e}" in text


def test_a_stray_detach_is_flagged_by_name():
    report, _ = report_for(detach=True)
    assert not report.ok
    assert report.no_grad == ["embedding.weight", "mixer.in_proj.weight"]
    text = str(report)
    assert "verdict: NOT OK (2 without gradient)" in text
    for name in report.no_grad:
        line = next(line for line in text.splitlines() if line.strip().startswith(name))
        assert "NO GRADIENT: not connected to the loss" in line
    assert not any(row.reached for row in report.rows if row.name in report.no_grad)


def test_a_stray_detach_is_flagged_when_an_earlier_backward_left_its_gradients():
    """Gradients accumulate: a healthy step, then the detached loss without zero_grad in between. The cut-off
    parameters still held the first step's .grad, and the report said OK."""
    vm = VarMap(seed=0)
    healthy, cut = ToySSM(vm), ToySSM(vm, detach=True)
    healthy.loss(IDS, TARGETS).backward()
    loss = cut.loss(IDS, TARGETS)
    loss.backward()
    report = gradient_report(loss, vm)
    assert not report.ok and report.not_reached == ["embedding.weight", "mixer.in_proj.weight"]
    assert "verdict: NOT OK (2 not reached by the loss)" in str(report)
    assert "NOT REACHED: has a .grad, but the loss does not reach it" in str(report)


def test_a_trainable_tensor_outside_the_registry_is_flagged():
    report, _ = report_for(stray_A=True)
    assert not report.ok
    (stray,) = report.strays
    assert stray.shape == (4,) and stray.names == ["model.stray"]
    assert stray.ops[:2] == ["Exp", "Neg"] and stray.ops[-1] == "CrossEntropy"
    assert report.no_grad == ["mixer.A_log"]  # the registered A_log is unused
    text = str(report)
    assert "NOT in the registry" in text and "model.stray: Tensor (4,) float32" in text
    assert "same shape as the unused registered mixer.A_log" in text


def test_strays_are_found_without_a_model_object_and_plain_inputs_are_not_strays():
    vm = VarMap()
    w = VarBuilder.from_varmap(vm).get((3,), "w", init=init.Const(1.0))
    outside = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    data = tg.Tensor(np.arange(3.0, dtype=np.float32))  # an input: does not require grad
    unrelated = tg.Tensor(np.ones(3, np.float32), requires_grad=True) * 2  # requires grad, never meets the loss
    loss = (w * outside * data).sum()
    loss.backward()
    report = gradient_report(loss, vm)
    assert [s.tensor for s in report.strays] == [outside] and report.strays[0].names == []
    assert unrelated.requires_grad and len(report.strays) == 1


def test_zero_nonfinite_frozen_and_missing_backward():
    vm = VarMap()
    vb = VarBuilder.from_varmap(vm)
    a, b, c, d = (vb.get((2,), n, init=init.Const(1.0)) for n in "abcd")
    d.requires_grad_(False)
    loss = (a * 0).sum() + (F.sqrt(b - 1)).sum() + (c * c).sum() + (d * c).sum()
    early = gradient_report(loss, vm)  # before backward
    assert early.no_grad == ["a", "b", "c"]
    assert "was loss.backward() called?" in str(early)
    with np.errstate(divide="ignore", invalid="ignore"):  # sqrt'(0) = inf on purpose
        loss.backward()
    report = gradient_report(loss, vm)
    assert report.zero_grad == ["a"] and report.non_finite == ["b"] and report.frozen == ["d"]
    assert [r.name for r in report.rows if r.status == "ok"] == ["c"]
    text = str(report)
    assert "ZERO GRADIENT" in text and "NON-FINITE GRADIENT" in text and "FROZEN" in text
    assert "1 with zero gradient, 1 with non-finite gradient, 1 frozen" in text


def test_a_loss_computed_without_grad_is_not_ok():
    vm = VarMap()
    w = VarBuilder.from_varmap(vm).get((2,), "w", init=init.Const(1.0))
    with tg.no_grad():
        loss = (w * w).sum()
    report = gradient_report(loss, vm)
    assert not report.ok and "the loss does not require grad" in str(report)
    (w * w).sum().backward()  # w now holds a gradient (of another loss): the rows alone would look fine
    with tg.no_grad():
        loss = (w * w).sum()
    report = gradient_report(loss, vm)
    assert report.rows[0].status == "ok" and not report.ok and "verdict: NOT OK (loss is cut off)" in str(report)
    with pytest.raises(TypeError, match="loss must be a Tensor"):
        gradient_report(1.0, vm)


def test_an_empty_parameter_is_not_reported_as_a_zero_gradient():
    """A parameter with a 0 in its shape got its (empty) gradient and was flagged ZERO GRADIENT: verdict NOT OK."""
    vm = VarMap()
    vb = VarBuilder.from_varmap(vm)
    w, empty = vb.get((2,), "w", init=init.Const(1.0)), vb.get((0, 3), "empty", init=init.Const(1.0))
    loss = (w * w).sum() + empty.sum()
    loss.backward()
    report = gradient_report(loss, vm)
    assert report.zero_grad == [] and [r.status for r in report.rows] == ["ok", "ok"]


def test_parameters_frozen_on_purpose_are_named_and_the_verdict_is_ok():
    """Fine-tuning with the embedding frozen (requires_grad_(False)) had a verdict of NOT OK (1 frozen) and no way to
    say the freeze was meant (found by an audit): `frozen` names those; another frozen one is still a problem, and a
    name not in the registry is refused."""
    vm = VarMap()
    vb = VarBuilder.from_varmap(vm)
    emb, w, v = (vb.get((2,), n, init=init.Const(1.0)) for n in ("emb", "w", "v"))
    emb.requires_grad_(False)
    loss = (emb * w * w).sum()
    loss.backward()
    assert not gradient_report(loss, vm).ok                             # v unused, emb frozen: two problems
    v.requires_grad_(False)
    report = gradient_report(loss, vm, frozen=["emb"])
    assert report.frozen == ["v"] and not report.ok
    report = gradient_report(loss, vm, frozen=("emb", "v"))
    assert report.ok and report.frozen == [] and "verdict: OK" in str(report)
    assert "frozen, as asked" in str(report) and "FROZEN" not in str(report)
    with pytest.raises(ValueError, match=r"frozen names \['embedding'\], not in the registry .* varmap.names\(\)"):
        gradient_report(loss, vm, frozen=["embedding"])


@pytest.mark.parametrize("scale", [1e200, 1e-170, 1.0])
def test_float64_norms_past_the_range_of_their_squares_are_reported_as_they_are(scale):
    """A float64 gradient of 1e200 was reported with norm inf and one of 1e-170 with 0 (their squares overflow or
    underflow), both beside status ok, with an overflow warning."""
    vm = VarMap(seed=0)
    w = VarBuilder(vm, dtype="float64").get((4,), "w", init=lambda shape, rng, dtype: np.ones(shape, dtype))
    coefficients = np.array([3.0, -4.0, 12.0, 0.0]) * scale     # the gradient; its norm is 13 x scale
    loss = (w * tg.Tensor(coefficients)).sum()
    loss.backward()
    with np.errstate(all="raise"):
        report = gradient_report(loss, vm)
    (row,) = report.rows
    assert row.status == "ok" and row.grad_norm == pytest.approx(13.0 * scale, rel=1e-14)
