"""torch's module methods on the model (nn/module.py): a training loop written for torch runs as written, and
load_state_dict checks everything before it changes anything, refusing a wrong shape even with strict=False."""
import numpy as np
import pytest

from tinygrad_ssm.autograd.tensor import Tensor
from tinygrad_ssm.io.safetensors import CheckpointError
from tinygrad_ssm.optim import Adam
from tests.support.models import IDS, small_model


def _logits(model, ids=IDS):
    return model(ids).data


def _snapshot(model):
    return {name: p.data.copy() for name, p in model.named_parameters()}


def _unchanged(model, before):
    return all(np.array_equal(p.data, before[name]) for name, p in model.named_parameters())


def test_state_dict_is_a_copy_under_the_official_names():
    model = small_model()
    state = model.state_dict()
    assert list(state) == [name for name, _ in model.named_parameters()]
    assert "backbone.layers.0.mixer.in_proj.weight" in state
    state["backbone.norm_f.weight"][:] = 7.0                      # a snapshot: the model's weight stays
    assert not np.any(model.varmap["backbone.norm_f.weight"].data == 7.0)


def test_load_state_dict_gives_the_other_models_logits_and_its_decoding():
    source, target = small_model(seed=1), small_model(seed=2)
    assert not np.allclose(_logits(source), _logits(target))
    cache = target.allocate_cache(IDS.shape[0])
    target.step(IDS[:, 0], cache)                                 # the decoder prepares its weights before the load
    result = target.load_state_dict(source.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(_logits(target), _logits(source))
    caches = [m.allocate_cache(IDS.shape[0]) for m in (source, target)]
    for t in range(4):                                            # the one-token step reads the loaded weights too
        np.testing.assert_array_equal(target.step(IDS[:, t], caches[1]).data, source.step(IDS[:, t], caches[0]).data)


def test_load_state_dict_takes_tensors_and_casts_to_the_parameters_dtype():
    source, target = small_model(seed=1, dtype="float64"), small_model(seed=2, dtype="float32")
    target.load_state_dict({name: Tensor(p.data) for name, p in source.named_parameters()})
    for name, p in target.named_parameters():
        assert p.dtype == np.float32
        np.testing.assert_array_equal(p.data, source.varmap[name].data.astype(np.float32))


def test_strict_load_refuses_missing_and_unexpected_names_and_changes_nothing():
    model, state = small_model(seed=2), small_model(seed=1).state_dict()
    del state["backbone.norm_f.weight"]
    state["backbone.extra.weight"] = np.zeros(3)
    before = _snapshot(model)
    with pytest.raises(CheckpointError, match=r"(?s)missing from the state dict \(1\): backbone\.norm_f\.weight.*"
                                              r"unexpected in the state dict \(1\): backbone\.extra\.weight"):
        model.load_state_dict(state)
    assert _unchanged(model, before)
    with pytest.raises(CheckpointError, match=r"unexpected in the state dict \(1\): backbone\.extra\.weight"):
        model.load_state_dict({**state, "backbone.norm_f.weight": before["backbone.norm_f.weight"]})  # that alone
    assert _unchanged(model, before)
    result = model.load_state_dict(state, strict=False)           # the names that match are loaded
    assert result.missing_keys == ["backbone.norm_f.weight"] and result.unexpected_keys == ["backbone.extra.weight"]
    np.testing.assert_array_equal(model.varmap["backbone.embedding.weight"].data, state["backbone.embedding.weight"])
    np.testing.assert_array_equal(model.varmap["backbone.norm_f.weight"].data, before["backbone.norm_f.weight"])


@pytest.mark.parametrize("strict", [True, False])
def test_a_wrong_shape_is_refused_even_without_strict_and_nothing_changes(strict):
    model, state = small_model(seed=2), small_model(seed=1).state_dict()
    state["backbone.norm_f.weight"] = np.ones(17)                 # torch raises on a size mismatch either way
    before = _snapshot(model)
    with pytest.raises(CheckpointError, match=r"backbone\.norm_f\.weight: state dict \(17,\) vs variable \(16,\)"):
        model.load_state_dict(state, strict=strict)
    assert _unchanged(model, before)


def test_values_the_dtype_cannot_hold_are_refused_before_anything_is_written():
    model, state = small_model(seed=2, dtype="float32"), small_model(seed=1).state_dict()
    state["backbone.norm_f.weight"] = np.full(16, 1e300)          # made infinite by the cast to float32
    before = _snapshot(model)
    with pytest.raises(ValueError, match=r"load_state_dict 'backbone\.norm_f\.weight'.*beyond the range"):
        model.load_state_dict(state)
    assert _unchanged(model, before)
    with pytest.raises(TypeError, match="mapping name -> array"):
        model.load_state_dict([1, 2])


def test_zero_grad_train_and_eval_as_torch():
    model = small_model()
    assert model.train() is model and model.training
    model.loss(IDS[:, :-1], IDS[:, 1:]).backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.data.any() for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError, match="set_to_none must be True or False"):
        model.zero_grad(set_to_none="no")
    with pytest.raises(ValueError, match="train: mode must be True or False, got 1"):   # torch's ValueError
        model.train(1)
    before = _logits(model)
    assert model.eval() is model and not model.training           # no dropout: the same logits, gradients still flow
    np.testing.assert_array_equal(_logits(model), before)
    model.loss(IDS[:, :-1], IDS[:, 1:]).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_torch_training_loop_runs_unchanged_and_learns():
    model = small_model(seed=3)
    optimizer = Adam(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(30):
        model.zero_grad()
        loss = model.loss(IDS[:, :-1], IDS[:, 1:])
        loss.backward()
        optimizer.step()
        losses.append(float(loss.data))
    assert losses[-1] < 0.5 * losses[0]


def test_a_quantized_model_has_no_state_dict_of_its_parameters_alone():
    model = small_model(dtype="float32").quantize("int8")
    for call in (model.state_dict, lambda: model.load_state_dict({})):
        with pytest.raises(TypeError, match=r"quantized \(int8\).*save_pretrained"):
            call()
