"""save_pretrained(layout="transformers"): a folder transformers' Mamba2ForCausalLM.from_pretrained loads as the same
model (float64 logits to rounding, tied and untied), whose config.json says what transformers' own save_pretrained
says of the same model, that this package loads back bit for bit, and that is written as safely as the default
layout's (no link written through, no other program's config.json replaced, no NaN saved, no quantized weights).

transformers' CPU path casts its norms and scan to float32 inside a float64 model; float64_throughout
(benchmarks/parity_transformers.py) keeps those casts float64, so the bound is rounding (1e-10), not float32's."""
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import VarMap
from tinygrad_ssm.io.safetensors import SafetensorsFile
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.checkpoint_config import PretrainedError

BOUND = 1e-10
IDS = np.random.default_rng(0).integers(0, 61, (2, 19))                 # l = 19: several chunks, a partial last one


def small_model(tie: bool, dtype="float64", **changes) -> Mamba2LMHeadModel:
    """61 ids padded to 64 rows, two groups, biases, a dt_limit clamp or none, every parameter off its init."""
    config = Mamba2Config(d_model=32, n_layer=2, vocab_size=61, d_state=8, headdim=8, ngroups=2, chunk_size=8,
                          pad_vocab_size_multiple=16, tie_embeddings=tie, **changes)
    model = Mamba2LMHeadModel(config, VarMap(seed=5), dtype=dtype)
    rng = np.random.default_rng(1)
    for name, t in model.varmap.named_vars():
        if t.data.ndim == 1:                                            # norms, D, biases: not 1 / 0 (hides bugs)
            t.data[...] = t.data + 0.3 * rng.standard_normal(t.data.shape)
    return model


def _transformers():
    torch = pytest.importorskip("torch", reason="torch is an optional reference (pip install -e '.[bench]')")
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from parity_transformers import float64_throughout
    return torch, transformers, float64_throughout


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("changes", [{}, dict(bias=True, conv_bias=False, dt_limit=(0.01, 0.5), rms_norm_eps=1e-3)],
                         ids=["defaults", "biases-limit-eps"])
def test_transformers_loads_the_same_model(tie, changes, tmp_path):
    torch, transformers, float64_throughout = _transformers()
    ours = small_model(tie, **changes)
    ours.save_pretrained(tmp_path, layout="transformers")
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert theirs.dtype == torch.float64                                # config.json's "dtype", read by "auto"
    # tied: transformers ties the head to the embedding itself (its own save of a tied model stores no head)
    assert (theirs.lm_head.weight.data_ptr() == theirs.backbone.embeddings.weight.data_ptr()) == tie
    with torch.no_grad(), float64_throughout():
        their_logits = theirs(torch.from_numpy(IDS)).logits.numpy()
    with tg.no_grad():
        assert np.abs(ours(IDS).data - their_logits).max() < BOUND
    their_names = set(theirs.state_dict()) - ({"lm_head.weight"} if tie else set())
    assert set(SafetensorsFile(tmp_path / "model.safetensors").tensors) == their_names


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_the_config_is_what_transformers_itself_writes(tie, tmp_path):
    """Every key transformers' own save_pretrained writes for the model that transformers read is written, with the
    same value (JSON as written: time_step_limit's inf as {"__float__": "Infinity"} on both sides), but the
    transformers_version it stamps and the init-only keys it adds; read back, the same config."""
    _, transformers, _ = _transformers()
    small_model(tie).save_pretrained(tmp_path / "ours", layout="transformers")
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(tmp_path / "ours"))
    theirs.save_pretrained(tmp_path / "theirs")
    ours_json, theirs_json = (json.loads((tmp_path / side / "config.json").read_text()) for side in ("ours", "theirs"))
    assert theirs_json["time_step_limit"] == [0.0, {"__float__": "Infinity"}] == ours_json["time_step_limit"]
    assert math.isinf(theirs.config.time_step_limit[1])
    init_only = {"transformers_version", "initializer_range", "rescale_prenorm_residual", "time_step_rank",
                 "use_cache"}
    assert {k: v for k, v in theirs_json.items() if k not in init_only} == \
        {k: v for k, v in ours_json.items() if k in theirs_json}
    assert set(ours_json) - set(theirs_json) <= {"rms_norm"}            # (its Mamba2Config no longer writes it)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):        # null, not transformers' defaults 0 / 2 / 1
        assert ours_json[key] is None and getattr(theirs.config, key) is None


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_this_package_loads_it_back_bit_for_bit(tie, dtype, tmp_path):
    ours = small_model(tie, dtype=dtype, dt_limit=(0.0, math.inf))
    ours.save_pretrained(tmp_path, layout="transformers", token_ids={"eos_token_id": 3})
    assert json.loads((tmp_path / "config.json").read_text())["eos_token_id"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                  # every key it wrote is one it knows
        back = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype=dtype)
    assert back.config.padded_vocab_size == 64 and back.config.dt_limit == (0.0, math.inf)
    assert back.config.vocab_size == 61           # transformers' vocab_size counts the padding: 64 read back, and
    assert back.config.tie_embeddings == tie      # generate then drew the padding rows 61-63 too (unpadded_vocab_size)
    sampled = [m.generate(IDS[:1, :5], 40, temperature=3.0, seed=2)[0, 5:] for m in (ours, back)]
    assert np.array_equal(*sampled) and sampled[0].max() < 61
    assert [n for n, _ in back.varmap.named_vars()] == [n for n, _ in ours.varmap.named_vars()]
    for name, t in ours.varmap.named_vars():
        assert back.varmap[name].data.dtype == t.data.dtype
        assert back.varmap[name].data.tobytes() == t.data.tobytes(), name


def test_the_default_layout_is_unchanged(tmp_path):
    small_model(True).save_pretrained(tmp_path)
    assert "d_model" in json.loads((tmp_path / "config.json").read_text())
    assert "backbone.embedding.weight" in SafetensorsFile(tmp_path / "model.safetensors").tensors


def test_a_symlink_is_not_written_through(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").symlink_to(target)
    with pytest.raises(PretrainedError, match=r"config\.json' is a symbolic link.*remove it, or save into another"):
        small_model(True).save_pretrained(tmp_path / "out", layout="transformers")
    assert target.read_text() == "{}" and not (tmp_path / "out" / "model.safetensors").exists()


def test_another_programs_config_is_not_replaced(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(PretrainedError, match=r"something other than a Mamba-2 model.*save into another folder"):
        small_model(True).save_pretrained(tmp_path, layout="transformers")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "bert"


def test_non_finite_weights_are_refused(tmp_path):
    model = small_model(False)
    model.varmap["lm_head.weight"].data[3, 1] = np.nan
    with pytest.raises(PretrainedError, match=r"'lm_head.weight' holds 1 non-finite.*nothing was written to"):
        model.save_pretrained(tmp_path / "out", layout="transformers")
    assert not (tmp_path / "out").exists()


def test_a_quantized_model_is_refused_by_name(tmp_path):
    model = small_model(True, dtype="float32").quantize("int8")
    with pytest.raises(PretrainedError, match=r"quantized \(int8\).*save the float model"):
        model.save_pretrained(tmp_path / "out", layout="transformers")
    assert not (tmp_path / "out").exists()


def test_bad_layout_and_misplaced_token_ids_are_named(tmp_path):
    model = small_model(True)
    with pytest.raises(ValueError, match=r"layout must be one of \('mamba_ssm', 'transformers'\), got 'hf'"):
        model.save_pretrained(tmp_path, layout="hf")
    with pytest.raises(ValueError, match=r"token_ids go into transformers' config.json only"):
        model.save_pretrained(tmp_path, token_ids={"eos_token_id": 0})
    with pytest.raises(ValueError, match=r"token_ids\['eos_token_id'\] must be an id of the vocabulary \(0 to 63\)"):
        model.save_pretrained(tmp_path, layout="transformers", token_ids={"eos_token_id": 64})
    assert not (tmp_path / "config.json").exists()
    model.quantize("int8")                     # its folder is mamba_ssm's layout: the ids were dropped without a word
    with pytest.raises(ValueError, match=r"token_ids go into transformers' config.json only"):
        model.save_pretrained(tmp_path, token_ids={"eos_token_id": 0})
    assert not (tmp_path / "config.json").exists()


def test_a_folder_resized_by_transformers_leaves_the_unpadded_size_aside(tmp_path):
    """transformers keeps unpadded_vocab_size as an attribute but resize_token_embeddings changes only vocab_size:
    read back, the stale 61 would have cut sampling to ids the resized model no longer pads."""
    torch, transformers, _ = _transformers()
    small_model(True).save_pretrained(tmp_path, layout="transformers")
    assert json.loads((tmp_path / "config.json").read_text())["unpadded_vocab_size"] == {"vocab_size": 61, "padded": 64}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(tmp_path))
        theirs.resize_token_embeddings(80)
        theirs.save_pretrained(tmp_path / "resized")
    back = Mamba2LMHeadModel.from_pretrained(tmp_path / "resized")
    assert back.config.vocab_size == back.config.padded_vocab_size == 80


def test_a_loaded_folders_token_ids_and_generation_config_are_saved_again(tmp_path):
    """from_pretrained then save_pretrained wrote bos/eos/pad null and no generation_config.json (found by an audit):
    a fine-tuned model no longer stopped at its EOS in transformers, whose own load and save keep both. They are
    kept now; token_ids given to save_pretrained win, and model.generation_config = None writes none."""
    source = tmp_path / "source"
    small_model(True).save_pretrained(source, layout="transformers", token_ids={"bos_token_id": 0, "eos_token_id": 2,
                                                                                "pad_token_id": 1})
    generation = {"do_sample": False, "max_new_tokens": 7, "eos_token_id": [2, 5]}
    (source / "generation_config.json").write_text(json.dumps(generation))
    model = Mamba2LMHeadModel.from_pretrained(source, dtype="float64")
    ids = {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1}
    assert model.token_ids == ids and model.generation_config == generation
    model.save_pretrained(tmp_path / "again", layout="transformers")
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert {k: written[k] for k in ids} == ids
    assert json.loads((tmp_path / "again" / "generation_config.json").read_text()) == generation
    model.save_pretrained(tmp_path / "mamba_ssm")                      # its layout has no token ids; the file, yes
    assert json.loads((tmp_path / "mamba_ssm" / "generation_config.json").read_text()) == generation
    model.save_pretrained(tmp_path / "given", layout="transformers", token_ids={"eos_token_id": 3})
    written = json.loads((tmp_path / "given" / "config.json").read_text())
    assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (None, 3, None)
    model.generation_config = None
    model.save_pretrained(tmp_path / "none", layout="transformers")
    assert not (tmp_path / "none" / "generation_config.json").exists()
    assert Mamba2LMHeadModel.from_pretrained(tmp_path / "none").generation_config is None
    fresh = small_model(True)
    assert getattr(fresh, "generation_config", None) is None
    try:
        _, transformers, _ = _transformers()
    except pytest.skip.Exception:
        return
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(tmp_path / "again"))
    assert theirs.generation_config.eos_token_id == [2, 5] and theirs.config.pad_token_id == 1
