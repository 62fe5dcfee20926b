"""config.json values that used to load silently wrong or fail late: a misspelt key (refused), an unknown key
(warned, by name), wrong-typed or non-finite values (named by the key the file spells), sizes that disagree
with the weights (refused before anything is allocated); from_pretrained also takes a training run folder."""
import json
import os
import threading
import tracemalloc
import warnings

import numpy as np
import pytest

from tinygrad_ssm import Mamba2LMHeadModel
from tinygrad_ssm.io.safetensors import save_file
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.models.mamba2.checkpoint_config import IgnoredConfigKeysWarning, PretrainedError

from tests.support.checkpoints import write_transformers_dir
from tests.support.models import IDS, small_model


def edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def saved(tmp_path, layout="mamba_ssm", **kw):
    model = small_model(**kw)
    if layout == "mamba_ssm":
        model.save_pretrained(tmp_path)
    else:
        write_transformers_dir(tmp_path, model)
    return model


@pytest.mark.parametrize("layout,right,wrong", [("mamba_ssm", "tie_embeddings", "tie_embedding"),
                                                ("mamba_ssm", "norm_epsilon", "norm_epsilom"),
                                                ("transformers", "tie_word_embeddings", "tie_word_embedding"),
                                                ("transformers", "layer_norm_epsilon", "layer_norm_eps1lon")])
@pytest.mark.filterwarnings("ignore:save_pretrained.*RMSNorm epsilon")  # 1e-3, so that the key is written
def test_a_misspelt_key_is_refused_naming_the_key_it_resembles(tmp_path, layout, right, wrong):
    saved(tmp_path, layout, tie_embeddings=False, rms_norm_eps=1e-3)
    config = json.loads((tmp_path / "config.json").read_text())
    edit_config(tmp_path, **{wrong: config.get(right, 1e-3), right: ...})
    with pytest.raises(PretrainedError, match=f"'{wrong}' looks like a misspelling of '{right}'"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("layout", ["mamba_ssm", "transformers"])
def test_unknown_keys_are_ignored_with_a_warning_naming_each(tmp_path, layout):
    model = saved(tmp_path, layout)
    edit_config(tmp_path, my_notes="trained on a Tuesday", zzz_experiment_id=7)
    with pytest.warns(IgnoredConfigKeysWarning, match=r"\['my_notes', 'zzz_experiment_id'\]"):
        loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert np.array_equal(loaded(IDS).data, model(IDS).data)


def test_keys_like_ignored_ones_are_not_misspellings_and_another_model_type_is_refused(tmp_path):
    """transformers 4.48-4.50 wrote "_attn_implementation_autoset": true into configs that transformers loads; it
    was refused as a misspelling of '_attn_implementation' (itself ignored), and 'rms_norm_eps' as one of 'rms_norm'
    (ignored as well): a typo is looked for among the keys that change the model only. A Mamba-1 config
    (model_type "mamba") or a hybrid's was refused for its num_heads, or loaded when its weights fit."""
    model = saved(tmp_path, "transformers")
    edit_config(tmp_path, _attn_implementation_autoset=True, cache_implementation="static")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert np.array_equal(loaded(IDS).data, model(IDS).data)
    edit_config(tmp_path, rms_norm_eps=1e-3)
    with pytest.warns(IgnoredConfigKeysWarning, match=r"'rms_norm_eps' is Llama's .* this layout's is "
                                                      r"'layer_norm_epsilon'"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)
    edit_config(tmp_path, rms_norm_eps=..., model_typ="mamba2")
    with pytest.raises(PretrainedError, match="'model_typ' looks like a misspelling of 'model_type'"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)
    edit_config(tmp_path, model_typ=...)
    for model_type in ("mamba", "nemotron_h"):
        edit_config(tmp_path, model_type=model_type)
        with pytest.raises(PretrainedError, match=rf"'model_type' is '{model_type}' \(architectures "
                                                  rf"\['Mamba2ForCausalLM'\]\), not 'mamba2'"):
            Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_a_hybrids_config_is_refused_by_its_model_type_not_as_misspellings(tmp_path):
    """NemotronH's config.json (ssm_state_size, n_group, mlp_hidden_act) was refused as misspellings, "fix the
    spelling", where no spelling makes it load: the model_type is checked first (found by an audit)."""
    saved(tmp_path, "transformers")
    edit_config(tmp_path, model_type="nemotron_h", ssm_state_size=16, n_group=1, mlp_hidden_act="relu2")
    with pytest.raises(PretrainedError, match=r"'model_type' is 'nemotron_h' .* not 'mamba2'"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("key,value", [("dt_limit", [0.05, 0.3]), ("norm_before_gate", True), ("chunk_size", 8),
                                       ("layer", "Mamba2")])
def test_a_mixer_setting_at_the_top_of_a_mamba_ssm_config_is_refused(tmp_path, key, value):
    """A mamba_ssm config.json with dt_limit beside ssm_cfg, not in it, loaded with a warning that the key "does
    not change the model that is built": the model had no clamp (logits 1.08 away; mamba_ssm refuses the file)."""
    saved(tmp_path)
    edit_config(tmp_path, **{key: value})
    with pytest.raises(PretrainedError, match=rf"\['{key}'\] at the top level: mamba_ssm reads these settings of "
                                              rf"the mixer under 'ssm_cfg' only"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("layout", ["mamba_ssm", "transformers"])
def test_a_clean_config_loads_without_warnings(tmp_path, layout):
    saved(tmp_path, layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("layout,key,value,message", [
    ("mamba_ssm", "norm_epsilon", float("inf"), "'norm_epsilon' must be a finite number, got inf"),
    ("mamba_ssm", "norm_epsilon", float("nan"), "'norm_epsilon' must be a finite number, got nan"),
    ("mamba_ssm", "norm_epsilon", "1e-5", "'norm_epsilon' must be a finite number, got '1e-5'"),
    ("mamba_ssm", "d_model", 16.0, "'d_model' must be a positive int, got 16.0"),
    ("mamba_ssm", "tie_embeddings", "false", "'tie_embeddings' must be a bool"),
    ("mamba_ssm", "ssm_cfg", [1], "'ssm_cfg' must be a JSON object"),
    ("transformers", "layer_norm_epsilon", float("inf"), "'layer_norm_epsilon' must be a finite number"),
    ("transformers", "time_step_min", True, "'time_step_min' must be a finite number, got True"),
    ("transformers", "time_step_limit", [0.0, "inf"], "'time_step_limit' must be a pair of numbers"),
    ("transformers", "tie_word_embeddings", 0, "'tie_word_embeddings' must be a bool"),
    ("transformers", "hidden_size", "16", "'hidden_size' must be a positive int"),
    # rules between fields: they named d_inner's terms and headdim / ngroups as Mamba2Config spells them
    ("transformers", "head_dim", 7, "'hidden_size' = 32 must be divisible by 'head_dim' = 7"),
    ("transformers", "n_groups", 3, "must be divisible by 'n_groups' = 3"),
])
def test_wrong_typed_or_non_finite_values_are_named_by_the_files_key(tmp_path, layout, key, value, message):
    saved(tmp_path, layout)
    edit_config(tmp_path, **{key: value})  # json.dumps writes inf / nan as the tokens Infinity / NaN
    with pytest.raises(PretrainedError, match=message.replace("[", r"\[").replace("(", r"\(")):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_ssm_cfg_values_are_named_with_their_prefix(tmp_path):
    saved(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit_config(tmp_path, ssm_cfg={**config["ssm_cfg"], "dt_min": float("inf")})
    with pytest.raises(PretrainedError, match="'ssm_cfg.dt_min' must be a finite number"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("key,value,message", [
    ("d_model", 10 ** 9, r"'backbone.embedding.weight' has shape \(56, 16\) but the config gives \(56, 1000000000\)"),
    ("n_layer", 10 ** 9, r"gives 'n_layer' = 1000000000 but the weights in .* hold 2 layers"),
    ("vocab_size", 10 ** 12, r"'backbone.embedding.weight' has shape \(56, 16\) but the config gives"),
])
def test_absurd_sizes_fail_against_the_header_before_any_allocation(tmp_path, key, value, message):
    saved(tmp_path)
    edit_config(tmp_path, **{key: value})  # the old loader built the model first: ~10**9 x 50 floats and more
    tracemalloc.start()
    try:
        with pytest.raises(PretrainedError, match=message):
            Mamba2LMHeadModel.from_pretrained(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2 ** 20, f"{peak / 2 ** 20:.0f} MiB allocated before refusing the config"


@pytest.mark.parametrize("kw", [{}, dict(bias=True, conv_bias=False), dict(tie_embeddings=False, ngroups=2),
                                dict(d_conv=3, expand=1, n_layer=3, vocab_size=61)])
def test_param_shapes_are_the_built_models_shapes(kw):
    model = small_model(**kw)
    built = {name: tuple(t.shape) for name, t in model.varmap.named_vars()}
    assert list(model.config.param_shapes().items()) == list(built.items())


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need POSIX")
def test_a_fifo_config_fails_at_once(tmp_path):
    saved(tmp_path)
    (tmp_path / "config.json").unlink()
    os.mkfifo(tmp_path / "config.json")
    errors = []
    worker = threading.Thread(target=lambda: errors.append(_error_of(Mamba2LMHeadModel.from_pretrained, tmp_path)),
                              daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():
        with open(tmp_path / "config.json", "w"):
            pass
        pytest.fail("from_pretrained blocked on a FIFO config.json")
    assert isinstance(errors[0], PretrainedError) and "named pipe" in str(errors[0])


def _error_of(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 (the test inspects it)
        return e
    return None


def test_a_shard_index_cannot_point_outside_its_folder(tmp_path):
    saved(tmp_path / "outside")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text((tmp_path / "outside" / "config.json").read_text())
    index = {"weight_map": {"backbone.embedding.weight": "../outside/model.safetensors"}}
    (tmp_path / "model" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PretrainedError, match=r"names files outside its folder"):
        Mamba2LMHeadModel.from_pretrained(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors.index.json").write_text('{"weight_map": [1]}')
    with pytest.raises(PretrainedError, match="'weight_map' must map names to file names"):
        Mamba2LMHeadModel.from_pretrained(tmp_path / "model")


def test_from_pretrained_accepts_a_training_run_folder(tmp_path):
    model = small_model(dtype="float32")
    run = tmp_path / "run"
    for step in (1, 2):
        with_weights = small_model(seed=step, dtype="float32")
        ckpt.save_checkpoint(run, step, with_weights, {}, {"tokens": 0}, keep=2)
    loaded = Mamba2LMHeadModel.from_pretrained(run)  # the newest checkpoint, as the CLI's --checkpoint
    assert np.array_equal(loaded(IDS).data, small_model(seed=2, dtype="float32")(IDS).data)
    assert not np.array_equal(loaded(IDS).data, model(IDS).data)
    (run / "checkpoints" / "LATEST").write_text("step-000009\n")
    with pytest.raises(FileNotFoundError, match="step-000009"):
        Mamba2LMHeadModel.from_pretrained(run)


def _sharded(tmp_path):
    """A saved small model, its weights split into two shards with their index; (model, index dict, names)."""
    model = saved(tmp_path, dtype="float32")
    weights = {n: t.data for n, t in model.varmap.named_vars()}
    names = sorted(weights)
    (tmp_path / "model.safetensors").unlink()
    shard = {n: f"model-0000{1 + (i >= 5)}-of-00002.safetensors" for i, n in enumerate(names)}
    for file in sorted(set(shard.values())):
        save_file(tmp_path / file, {n: weights[n] for n in names if shard[n] == file})
    return model, shard, names


@pytest.mark.parametrize("edit, message", [
    (lambda m, names: m.update({names[0]: m[names[-1]]}), r"names the wrong shard for: .* \(in model-00001"),
    (lambda m, names: m.update({"backbone.layers.9.mixer.D": m[names[0]]}), "lists tensors no shard holds: "
                                                                             r"backbone\.layers\.9\.mixer\.D"),
    (lambda m, names: m.pop(names[2]), "leaves out tensors the shards hold"),
    (lambda m, names: m.clear(), r"'weight_map' is empty"),
])
def test_a_shard_index_that_does_not_describe_its_shards_is_refused(tmp_path, edit, message):
    """transformers reads each key from the file its index names, so a stale index fails there; it loaded here."""
    model, shard, names = _sharded(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": shard}))
    assert np.array_equal(Mamba2LMHeadModel.from_pretrained(tmp_path)(IDS).data, model(IDS).data)
    edit(shard, names)
    index.write_text(json.dumps({"weight_map": shard}))
    with pytest.raises(PretrainedError, match=r"model\.safetensors\.index\.json':? " + message):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_a_missing_shard_or_weight_map_names_the_index(tmp_path):
    _, shard, _ = _sharded(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(PretrainedError, match=r"index\.json' is not a JSON object with a 'weight_map'"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)
    index.write_text(json.dumps({"weight_map": shard}))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(PretrainedError, match=r"index\.json' names shard\(s\) missing from the folder: "
                                              r"model-00002-of-00002\.safetensors"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("key, value", [("norm_before_gate", True), ("rms_norm", False)])
def test_keys_transformers_does_not_read_are_ignored_as_it_ignores_them(tmp_path, key, value):
    """Mamba-Codestral's config.json says "norm_before_gate": true; transformers' Mamba2 computes gate-first
    whatever it says (and never reads rms_norm), so the same weights give the same logits with or without it."""
    model = saved(tmp_path, "transformers", dtype="float32")
    edit_config(tmp_path, **{key: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = Mamba2LMHeadModel.from_pretrained(tmp_path)
    assert np.array_equal(loaded(IDS).data, model(IDS).data)
    edit_config(tmp_path, hidden_act="gelu")
    with pytest.raises(PretrainedError, match=r"'hidden_act' = 'gelu' is not supported \(only 'silu'\)"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_saving_an_epsilon_mamba_ssm_cannot_hold_warns(tmp_path):
    model = small_model(dtype="float32")                                  # epsilon 1e-5: nothing to warn about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.save_pretrained(tmp_path / "default")
    (tmp_path / "hf").mkdir()
    write_transformers_dir(tmp_path / "hf", model)
    edit_config(tmp_path / "hf", layer_norm_epsilon=1e-3)
    with pytest.warns(UserWarning, match="RMSNorm epsilon is 0.001, not mamba_ssm's 1e-5") as caught:
        Mamba2LMHeadModel.from_pretrained(tmp_path / "hf").save_pretrained(tmp_path / "out")
    assert caught[0].filename == __file__  # it points at the caller's line
    assert json.loads((tmp_path / "out" / "config.json").read_text())["norm_epsilon"] == 1e-3


def test_a_mamba2model_checkpoint_without_the_backbone_prefix_is_named_as_such(tmp_path):
    """transformers' Mamba2Model saves the backbone alone (layers.0..., no 'backbone.' prefix): it was refused as
    "the weights hold 0 layers; the config does not describe these weights", blaming the config."""
    from tinygrad_ssm.io.safetensors import load_file
    saved(tmp_path, "transformers")
    weights = load_file(tmp_path / "model.safetensors")
    save_file(tmp_path / "model.safetensors",
              {k.removeprefix("backbone."): v for k, v in weights.items() if k != "lm_head.weight"})
    with pytest.raises(PretrainedError, match=r"are a Mamba2Model's \(the backbone alone: 'layers.0...' without the "
                                              r"'backbone.' prefix"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)
