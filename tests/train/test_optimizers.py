"""A run's optimizers (tinygrad_ssm/train/optimizers.py): AdamW with the run's settings, weight decay on the
matrices only, and their state through a checkpoint's flat dict."""
import numpy as np
import pytest

from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.train.config import TrainConfig
from tinygrad_ssm.train.optimizers import build_optimizers, flat_optimizer_state, load_flat_optimizer_state


def _model():
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=256, d_state=16, headdim=16, chunk_size=16)
    return Mamba2LMHeadModel(config, VarMap(seed=0))


def test_matrices_are_decayed_and_vectors_not_with_the_runs_settings():
    model = _model()
    cfg = TrainConfig(lr=3e-3, beta1=0.8, beta2=0.97, weight_decay=0.25)
    optimizers = build_optimizers(model, cfg)
    named = dict(model.varmap.named_vars())
    decay, no_decay = optimizers["decay"], optimizers["no_decay"]
    assert {n for n, _ in decay.params} == {n for n, p in named.items() if p.ndim >= 2}
    assert {n for n, _ in no_decay.params} == {n for n, p in named.items() if p.ndim < 2}
    assert {"A_log", "D", "dt_bias"} <= {n.rsplit(".", 1)[-1] for n, _ in no_decay.params}   # mamba_ssm's no-decay
    assert decay.weight_decay == 0.25 and no_decay.weight_decay == 0.0
    for opt in optimizers.values():
        assert (opt.lr, opt.beta1, opt.beta2) == (3e-3, 0.8, 0.97)


def test_the_flat_state_restores_both_groups():
    model = _model()
    optimizers = build_optimizers(model, TrainConfig())
    for _, p in model.varmap.named_vars():
        p.grad = np.full(p.shape, 0.5, p.dtype)
    for opt in optimizers.values():
        opt.step()
    flat = flat_optimizer_state(optimizers)
    assert all(k.split("/", 1)[0] in ("decay", "no_decay") for k in flat)
    restored = build_optimizers(_model(), TrainConfig())
    load_flat_optimizer_state(restored, flat)
    again = flat_optimizer_state(restored)
    assert again.keys() == flat.keys() and all(np.array_equal(again[k], flat[k]) for k in flat)


def test_a_checkpoint_saved_before_parameter_groups_resumes():
    """optimizer.safetensors of runs saved before optimizers had parameter groups holds "decay/hparams/lr" (no
    group index); it loads, with every hyper-parameter and moment (a resumed old run continues bit for bit)."""
    model = _model()
    cfg = TrainConfig(lr=3e-3, weight_decay=0.25)
    optimizers = build_optimizers(model, cfg)
    for _, p in model.varmap.named_vars():
        p.grad = np.full(p.shape, 0.5, p.dtype)
    for opt in optimizers.values():
        opt.step()
        opt.lr = 1e-3  # as the schedule left it
    flat = flat_optimizer_state(optimizers)
    old = {k.replace("/hparams/0/", "/hparams/"): v for k, v in flat.items()}
    assert "decay/hparams/lr" in old and "no_decay/hparams/weight_decay" in old
    restored = build_optimizers(_model(), cfg)
    load_flat_optimizer_state(restored, old)
    again = flat_optimizer_state(restored)
    assert again.keys() == flat.keys() and all(np.array_equal(again[k], flat[k]) for k in flat)
    assert restored["decay"].lr == 1e-3 and restored["decay"].weight_decay == 0.25


def test_a_flat_state_with_a_stray_group_or_a_refused_key_names_the_source_and_prefix():
    """A key of no optimizer ("momentum/...") was skipped silently; one an optimizer refused was named without its
    group's prefix and without the file it came from."""
    optimizers = build_optimizers(_model(), TrainConfig())
    flat = flat_optimizer_state(optimizers)
    with pytest.raises(ValueError, match=r"'F' does not fit this run's optimizers \(decay, no_decay\): unexpected "
                                         r"key 'momentum/state/x/buf'"):
        load_flat_optimizer_state(optimizers, {**flat, "momentum/state/x/buf": np.zeros(1)}, "'F'")
    with pytest.raises(ValueError, match=r"(?s)'F' does not fit this run's optimizers: its keys 'no_decay/'...: .*"
                                         r"unexpected key 'state/nothing/exp_avg'"):
        load_flat_optimizer_state(optimizers, {**flat, "no_decay/state/nothing/exp_avg": np.zeros(1)}, "'F'")
