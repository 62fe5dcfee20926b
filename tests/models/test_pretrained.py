"""from_pretrained / save_pretrained: our own round trip, a transformers-layout directory written here
(names and config fields of docs/mamba2.md), half-precision upcasting, and errors that name the key."""
import dataclasses
import json
import math
import os
import struct
import tracemalloc

import numpy as np
import pytest

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2 import pretrained
from tinygrad_ssm.models.mamba2.checkpoint_config import _HF_FIELDS, PretrainedError
from tinygrad_ssm.io.safetensors import save_file

from tests.support.checkpoints import LAYOUTS, write_checkpoint, write_transformers_dir
from tests.support.models import IDS, small_model


def test_save_and_load_round_trip(tmp_path):
    model = small_model(ngroups=2, dtype="float32")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["d_model"] == 16 and config["ssm_cfg"]["layer"] == "Mamba2" and config["ssm_cfg"]["ngroups"] == 2
    assert "Infinity" in (tmp_path / "config.json").read_text()          # dt_limit (0, inf), as mamba_ssm writes it
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path)
    assert loaded.config == model.config and loaded.varmap.names() == model.varmap.names()
    assert np.array_equal(loaded(IDS).data, model(IDS).data)
    loaded64 = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert loaded64.varmap["backbone.norm_f.weight"].dtype == np.float64
    reference = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64", fused=False)   # the engine-op path
    assert loaded64.fused and not reference.fused
    assert np.abs(reference(IDS).data - loaded64(IDS).data).max() < 1e-10


@pytest.mark.filterwarnings("ignore:save_pretrained.*RMSNorm epsilon")  # an epsilon of 1e-6 on purpose
def test_round_trip_untied_head_and_custom_eps(tmp_path):
    model = small_model(tie_embeddings=False, rms_norm_eps=1e-6, bias=True, dt_limit=(0.001, 1.0))
    model.save_pretrained(tmp_path)
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert loaded.config == model.config and "lm_head.weight" in loaded.varmap
    assert np.array_equal(loaded(IDS).data, model(IDS).data)


@pytest.mark.parametrize("infinity_style", ["token", "__float__"])
def test_transformers_layout_gives_the_same_logits(tmp_path, infinity_style):
    model = small_model(seed=1, ngroups=2, tie_embeddings=False)
    write_transformers_dir(tmp_path, model, infinity_style)
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert loaded.config.dt_limit == (0.0, math.inf) and loaded.config.ngroups == 2
    assert loaded.config.padded_vocab_size == model.config.padded_vocab_size
    assert np.array_equal(loaded(IDS).data, model(IDS).data)



def test_a_transformers_config_without_tie_word_embeddings_is_untied(tmp_path):
    """transformers' Mamba2Config defaults tie_word_embeddings to False: a config.json that leaves the key out
    describes an untied model, loaded with the lm_head.weight it stores (not refused as a tied one whose stored
    head differs from the embedding)."""
    model = small_model(seed=2, tie_embeddings=False)
    config = write_transformers_dir(tmp_path, model)
    del config["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert not loaded.config.tie_embeddings and "lm_head.weight" in loaded.varmap
    assert np.array_equal(loaded(IDS).data, model(IDS).data)

# Every setting away from its default (transformers' and ours), so a parser that drops a field shows up.
NON_DEFAULT = dict(d_state=4, d_conv=3, expand=3, headdim=8, ngroups=2, chunk_size=8, rms_norm_eps=1e-6,
                   dt_min=0.002, dt_max=0.2, dt_init_floor=2e-4, dt_limit=(0.01, 0.05), bias=True, conv_bias=False)


@pytest.mark.parametrize("tied", [True, False])
def test_transformers_layout_reads_every_config_field(tmp_path, tied):
    model = small_model(seed=6, tie_embeddings=tied, **NON_DEFAULT)
    written = write_transformers_dir(tmp_path, model)
    for key, (field, hf_default) in _HF_FIELDS.items():                 # the test itself must not be vacuous
        if key not in ("tie_word_embeddings", "hidden_size", "num_hidden_layers", "vocab_size"):
            assert (tuple(written[key]) if isinstance(written[key], list) else written[key]) != hf_default, key
            assert getattr(model.config, field) != getattr(Mamba2Config(), field), field
    assert ("lm_head.weight" in model.varmap) == (not tied)            # tied: no lm_head key in the file
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    # transformers stores the padded vocabulary and no padding multiple; everything else is the same
    expected = dataclasses.replace(model.config, vocab_size=model.config.padded_vocab_size, pad_vocab_size_multiple=1)
    assert loaded.config.to_dict() == expected.to_dict()                # field by field, with a readable diff
    assert loaded.config == expected
    assert ("lm_head.weight" in loaded.varmap) == (not tied)
    assert np.array_equal(loaded(IDS).data, model(IDS).data)


@pytest.mark.filterwarnings("ignore:save_pretrained.*RMSNorm epsilon")  # an epsilon of 1e-6 on purpose
@pytest.mark.parametrize("tied", [True, False])
def test_mamba_ssm_layout_round_trips_every_config_field(tmp_path, tied):
    settings = {**NON_DEFAULT, "A_init_range": (2.0, 8.0), "pad_vocab_size_multiple": 16}
    model = small_model(seed=7, tie_embeddings=tied, **settings)
    for field, value in settings.items():                              # the test itself must not be vacuous
        assert value != getattr(Mamba2Config(), field), field
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    ssm_keys = {k: v for k, v in settings.items() if k not in ("rms_norm_eps", "pad_vocab_size_multiple")}
    assert written["ssm_cfg"] == {"layer": "Mamba2", **{k: list(v) if isinstance(v, tuple) else v
                                                        for k, v in ssm_keys.items()}}  # mamba_ssm's Mamba2 names
    assert written["norm_epsilon"] == 1e-6 and written["pad_vocab_size_multiple"] == 16
    assert written["tie_embeddings"] is tied and written["vocab_size"] == 50
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert loaded.config.to_dict() == model.config.to_dict()
    assert loaded.config == model.config
    assert loaded.varmap.names() == model.varmap.names()
    assert np.array_equal(loaded(IDS).data, model(IDS).data)


def test_float16_weights_are_upcast(tmp_path):
    model = small_model(seed=2, tie_embeddings=True, dtype="float32")
    for name, t in model.varmap.named_vars():                          # what float16 storage can hold
        model.varmap.set_one(name, t.data.astype(np.float16))
    write_transformers_dir(tmp_path, model, dtype=np.float16)
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path)
    assert loaded.varmap["backbone.embedding.weight"].dtype == np.float32
    assert np.array_equal(loaded(IDS).data, model(IDS).data)


def write_bf16(path, arrays):
    """A safetensors file with BF16 tensors, written byte by byte (NumPy has no bfloat16)."""
    header, blobs, offset = {}, [], 0
    for name, array in arrays.items():
        bits = (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [offset, offset + len(bits)]}
        blobs.append(bits)
        offset += len(bits)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_bfloat16_weights_are_upcast(tmp_path):
    model = small_model(seed=3, dtype="float32")
    for name, t in model.varmap.named_vars():                          # truncate to bfloat16's 8 mantissa bits
        model.varmap.set_one(name, (t.data.view(np.uint32) & 0xFFFF0000).view(np.float32))
    model.save_pretrained(tmp_path)
    write_bf16(tmp_path / "model.safetensors", {n: t.data for n, t in model.varmap.named_vars()})
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path)
    assert np.array_equal(loaded(IDS).data, model(IDS).data)


def stored_then_upcast(array: np.ndarray, stored: str) -> np.ndarray:
    """float32 values as a checkpoint stores them (`stored`) and as the old loader upcast them (astype, whole)."""
    if stored == "BF16":
        return ((array.view(np.uint32) >> 16).astype(np.uint32) << 16).view(np.float32)
    return array.astype({"F16": np.float16, "F32": np.float32}[stored]).astype(np.float32)


def write_stored_as(directory, model, stored: str):
    model.save_pretrained(directory)
    weights = {n: t.data for n, t in model.varmap.named_vars()}
    if stored == "BF16":
        write_bf16(directory / "model.safetensors", weights)
    elif stored == "F32 + tied head":                                  # as torch's state_dict of a tied model
        save_file(directory / "model.safetensors", {**weights, "lm_head.weight": weights["backbone.embedding.weight"]})
    elif stored == "F16":
        save_file(directory / "model.safetensors", {n: a.astype(np.float16) for n, a in weights.items()})


@pytest.mark.parametrize("stored", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_loaded_weights_are_the_stored_ones_to_the_bit(tmp_path, stored, dtype):
    model = small_model(seed=8, dtype="float32", tie_embeddings=False)
    write_stored_as(tmp_path, model, stored)
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype=dtype)
    assert loaded.varmap.names() == model.varmap.names() and loaded.varmap.unfilled() == []
    for name, t in model.varmap.named_vars():
        want = stored_then_upcast(t.data, stored).astype(dtype)
        assert loaded.varmap[name].data.tobytes() == want.tobytes(), name


# embedding (16384, 128): 8 MiB of the ~9.6 MiB of weights, so a second copy of it cannot hide in the allowance
MEMORY_SHAPE = {"d_model": 128, "n_layer": 2, "vocab_size": 16384, "d_state": 16, "headdim": 32, "chunk_size": 64}
LOAD_ALLOWANCE = 1 << 20  # buffers of READ_PIECE_BYTES (1 MiB), the model's Python objects


@pytest.mark.parametrize("stored", ["F32", "BF16", "F32 + tied head"])
def test_loading_holds_one_copy_of_the_weights(tmp_path, stored):
    model = small_model(seed=9, dtype="float32", **MEMORY_SHAPE)
    write_stored_as(tmp_path, model, stored)
    weight_bytes = sum(t.data.nbytes for t in model.varmap.all_vars())
    tracemalloc.start()                                                 # NumPy reports its allocations to it
    try:
        loaded = Mamba2LMHeadModel.from_pretrained(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(t.data.nbytes for t in loaded.varmap.all_vars()) == weight_bytes
    # before: a random model, then each tensor read whole and copied in: 2.8x (F32) to 3.3x (BF16) the weights
    # here; the tied head's check compared the head and the embedding whole, as float64
    assert peak <= 1.1 * weight_bytes + LOAD_ALLOWANCE, (peak / weight_bytes, stored)


def test_tied_copy_of_the_head_is_accepted_and_shards_are_read(tmp_path):
    model = small_model(seed=4, dtype="float32")
    model.save_pretrained(tmp_path)
    weights = {n: t.data for n, t in model.varmap.named_vars()}
    weights["lm_head.weight"] = weights["backbone.embedding.weight"]    # as torch's state_dict has it
    names = sorted(weights)
    (tmp_path / "model.safetensors").unlink()
    save_file(tmp_path / "model-00001-of-00002.safetensors", {n: weights[n] for n in names[:5]})
    save_file(tmp_path / "model-00002-of-00002.safetensors", {n: weights[n] for n in names[5:]})
    index = {"weight_map": {n: f"model-0000{1 + (i >= 5)}-of-00002.safetensors" for i, n in enumerate(names)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert np.array_equal(Mamba2LMHeadModel.from_pretrained(tmp_path)(IDS).data, model(IDS).data)


def _edit_weights(tmp_path, edit):
    model = small_model(seed=5, dtype="float32")
    model.save_pretrained(tmp_path)
    weights = {n: t.data for n, t in model.varmap.named_vars()}
    edit(weights)
    save_file(tmp_path / "model.safetensors", weights)


def test_missing_key_is_named(tmp_path):
    _edit_weights(tmp_path, lambda w: w.pop("backbone.layers.1.mixer.A_log"))
    with pytest.raises(PretrainedError, match=r"missing 1 weight\(s\): backbone.layers.1.mixer.A_log"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads Linux's /proc/self/fd")
def test_a_failed_load_leaves_no_open_files(tmp_path, quantized):
    """The weight files were closed only when the collector got to them: a server keeping its errors (for a
    report, or in a traceback) kept one open file per failed load (found by an audit of long-running use)."""
    model = small_model()
    if quantized:
        model.quantize("int8")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["n_layer"] += 1                                               # refused after the files are opened
    (tmp_path / "config.json").write_text(json.dumps(config))
    def open_here() -> int:  # the process's open files inside tmp_path (other threads' files do not count)
        fds = "/proc/self/fd"
        targets = []
        for fd in os.listdir(fds):
            try:
                targets.append(os.readlink(os.path.join(fds, fd)))
            except OSError:                                              # closed meanwhile
                pass
        return sum(t.startswith(str(tmp_path)) for t in targets)
    kept = []
    for _ in range(5):
        try:
            Mamba2LMHeadModel.from_pretrained(tmp_path)
        except PretrainedError as e:
            kept.append(e)
    assert len(kept) == 5 and open_here() == 0


def test_a_repository_folder_whose_ref_names_no_snapshot_lists_its_snapshots(tmp_path):
    """A download pinned to a revision leaves no refs/main, or one naming another commit."""
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "abc").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"repository folder that has no refs/main; pass one of its "
                                                r"snapshots instead: .*snapshots/abc"):
        Mamba2LMHeadModel.from_pretrained(repo)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("def\n")                       # a commit with no snapshot here
    with pytest.raises(FileNotFoundError, match=r"has refs/main 'def', which is not in snapshots/"):
        Mamba2LMHeadModel.from_pretrained(repo)


def test_a_file_a_missing_folder_and_a_file_to_save_onto_are_named(tmp_path):
    small_model().save_pretrained(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="config.json' is a file; give the folder that holds"):
        Mamba2LMHeadModel.from_pretrained(tmp_path / "m" / "config.json")
    with pytest.raises(FileNotFoundError, match="'org/name' does not exist; .* downloads nothing"):
        Mamba2LMHeadModel.from_pretrained("org/name")                  # a hub id is not fetched
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PretrainedError, match="notes.txt' is a file; give a folder"):
        small_model().save_pretrained(tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_shape_that_disagrees_with_the_config_is_named(tmp_path):
    _edit_weights(tmp_path, lambda w: w.update({"backbone.layers.0.mixer.D": np.ones(5, np.float32)}))
    message = r"'backbone.layers.0.mixer.D' has shape \(5,\) but the config gives \(4,\)"
    with pytest.raises(PretrainedError, match=message):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_unexpected_key_is_named(tmp_path):
    _edit_weights(tmp_path, lambda w: w.update({"backbone.layers.2.norm.weight": np.ones(16, np.float32)}))
    with pytest.raises(PretrainedError, match="backbone.layers.2.norm.weight"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("config,message", [
    ({"hidden": 3}, "unknown config layout"),
    ({"model_type": "mamba2", "num_hidden_layers": 1, "vocab_size": 56},
     r"config.json \(transformers layout: model_type 'mamba2'\) has no 'hidden_size'"),
    ({"n_layer": 1, "vocab_size": 50, "ssm_cfg": {"layer": "Mamba2"}},
     r"config.json \(mamba_ssm layout: it has 'ssm_cfg'\) has no 'd_model'"),
    ({"d_model": 16, "n_layer": 1, "vocab_size": 50, "ssm_cfg": {}}, "'ssm_cfg.layer' is 'Mamba1'"),
    ({"d_model": 16, "n_layer": 1, "ssm_cfg": {"layer": "Mamba2"}}, "has no 'vocab_size'"),
    ({"d_model": 16, "n_layer": 1, "vocab_size": 50, "ssm_cfg": {"layer": "Mamba2", "d_sate": 4}}, "d_sate"),
    ({"d_model": 16, "n_layer": 1, "vocab_size": 50, "ssm_cfg": {"layer": "Mamba2", "headdim": 7}}, "headdim"),
    ({"hidden_size": 16, "num_hidden_layers": 1, "vocab_size": 56, "head_dim": 8, "num_heads": 5, "n_groups": 1},
     "'num_heads' = 5"),
])
def test_bad_config_is_named(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match=message):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


MAMBA_SSM = {"d_model": 16, "n_layer": 1, "vocab_size": 50}


@pytest.mark.parametrize("top,ssm_cfg,message", [
    ({"d_intermediate": 64}, {}, r"'d_intermediate' = 64 \(MLP blocks\) is not supported, only 0"),
    ({"d_intermediate": None}, {}, r"'d_intermediate' = None"),          # mamba_ssm: an MLP of its default width
    ({"attn_layer_idx": [0], "attn_cfg": {"num_heads": 2}}, {},
     r"'attn_layer_idx' = \[0\] \(attention layers among the mixers\) is not supported, only \[\]"),
    ({"rms_norm": False}, {}, r"'rms_norm' = false \(LayerNorm\) is not supported"),
    ({}, {"rmsnorm": False}, r"'ssm_cfg.rmsnorm' = False is not supported \(only True\)"),
    ({}, {"norm_before_gate": True}, r"'ssm_cfg.norm_before_gate' = True is not supported \(only False\)"),
    ({}, {"D_has_hdim": True}, r"'ssm_cfg.D_has_hdim' = True is not supported \(only False\)"),
    ({}, {"d_ssm": 16}, r"'ssm_cfg.d_ssm' = 16 != d_inner 32 is not supported"),
    ({}, {"learnable_init_states": True}, r"unknown 'ssm_cfg' keys \['learnable_init_states'\]"),
    ({}, {"layer": "Mamba3"}, r"'ssm_cfg.layer' is 'Mamba3'; only 'Mamba2' is supported"),
])
def test_each_mamba_ssm_option_we_do_not_compute_is_refused_naming_key_and_value(tmp_path, top, ssm_cfg, message):
    """mamba_ssm options that change what the model computes (an MLP or attention between the mixers, LayerNorm,
    the gate before the norm or no norm, D per channel, a partial SSM) are refused, never loaded as plain Mamba-2."""
    config = {**MAMBA_SSM, **top, "ssm_cfg": {"layer": "Mamba2", "headdim": 8, **ssm_cfg}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match=message):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_a_shape_that_does_not_fit_names_the_sizes_as_the_layout_spells_them(tmp_path):
    """A transformers config without state_size takes transformers' default (128), which these weights do not
    have: the error gives the sizes under the file's own keys."""
    model = small_model()
    write_checkpoint("transformers", tmp_path / "t", model)
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    del config["state_size"]
    (tmp_path / "t" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match=r"it gives hidden_size 16, state_size 128, n_groups \d+, head_dim"):
        Mamba2LMHeadModel.from_pretrained(tmp_path / "t")


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)
    small_model().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no pickle"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def write_word_tokenizer(path):
    """A tokenizer.json of a few words (Hugging Face tokenizers' WordLevel): what a checkpoint folder carries."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "hello": 1, "world": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


@pytest.mark.parametrize(("layout", "shards"), [(layout, None) for layout in LAYOUTS] + [("hf_cache", 2)])
def test_every_layout_loads_to_the_logits_of_the_model_written(tmp_path, layout, shards):
    model = small_model(seed=11, tie_embeddings=False)
    tokenizer = write_word_tokenizer(tmp_path / "tok.json")
    path = write_checkpoint(layout, tmp_path / "out", model, tokenizer_json=tokenizer, shards=shards)
    loaded = Mamba2LMHeadModel.from_pretrained(path, dtype="float64")
    assert np.array_equal(loaded(IDS).data, model(IDS).data)
    assert (path / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    weight_files = sorted(p.name for p in path.glob("model*.safetensors"))
    sharded = layout == "sharded" or shards == 2
    assert weight_files == (["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] if sharded
                            else ["model.safetensors"])
    assert (path / "model.safetensors.index.json").exists() == sharded
    if layout == "hf_cache":                                           # every file a link into the repo's blobs/
        repo = path.parents[1]
        assert path.parent.name == "snapshots" and (repo / "refs" / "main").read_text() == path.name
        for file in path.iterdir():
            assert file.is_symlink() and file.resolve().parent == (repo / "blobs").resolve(), file
        # the repository folder itself (models--org--name): the snapshot its refs/main names
        assert np.array_equal(Mamba2LMHeadModel.from_pretrained(repo, dtype="float64")(IDS).data, model(IDS).data)


@pytest.mark.parametrize("row", [0, 23, -1])
def test_a_tied_head_is_compared_piece_by_piece_to_its_last_row(tmp_path, monkeypatch, row):
    monkeypatch.setattr(pretrained, "COMPARE_PIECE_BYTES", 3 * 16 * 8)  # 3 rows of d_model 16 per piece
    model = small_model(seed=12, dtype="float32")                      # tied; padded vocab 56 rows
    model.save_pretrained(tmp_path)
    weights = {n: t.data.copy() for n, t in model.varmap.named_vars()}
    weights["backbone.embedding.weight"][row, 3] = 1234.5               # a row unlike the others, in the copy too
    head = weights["backbone.embedding.weight"].copy()
    save_file(tmp_path / "model.safetensors", {**weights, "lm_head.weight": head})
    Mamba2LMHeadModel.from_pretrained(tmp_path)                         # an exact copy loads
    head[row, 0] += 1.0
    save_file(tmp_path / "model.safetensors", {**weights, "lm_head.weight": head})
    with pytest.raises(PretrainedError, match="differs from the embedding"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_save_pretrained_replaces_a_model_folder_only_and_never_saves_nan(tmp_path):
    """It replaced a user's config.json and model.safetensors (a folder of something else), and saved NaN weights
    that from_pretrained then loaded without a word."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": 1}')
    (mine / "model.safetensors").write_text("w")
    with pytest.raises(PretrainedError, match="holds config.json and model.safetensors of something other than a "
                                              "Mamba-2 model .*left as they are"):
        small_model().save_pretrained(mine)
    assert (mine / "config.json").read_text() == '{"mine": 1}' and (mine / "model.safetensors").read_text() == "w"
    link = tmp_path / "linked"
    link.mkdir()
    (link / "config.json").symlink_to(mine / "config.json")
    with pytest.raises(PretrainedError, match="config.json' is a symbolic link"):
        small_model().save_pretrained(link)
    model = small_model()
    model.save_pretrained(tmp_path / "m")
    model.save_pretrained(tmp_path / "m")  # a model folder is re-saved, as transformers does
    model.varmap["backbone.norm_f.weight"].data[0] = np.nan
    with pytest.raises(PretrainedError, match=r"tensor 'backbone.norm_f.weight' holds 1 non-finite value\(s\) \(NaN or "
                                              r"inf\) of 16; nothing was written"):
        model.save_pretrained(tmp_path / "nan")
    assert not (tmp_path / "nan").exists()


def test_save_pretrained_never_writes_through_a_linked_weights_file(tmp_path):
    """A model folder whose model.safetensors is a symbolic link (to a file of the user's) is refused, the link and
    the file it leads to left as they are: nothing is written through a link, config.json's or the weights'."""
    target = tmp_path / "users.safetensors"
    target.write_bytes(b"the user's")
    folder = tmp_path / "m"
    small_model().save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(target)
    with pytest.raises(PretrainedError, match="model.safetensors' is a symbolic link; nothing is written"):
        small_model().save_pretrained(folder)
    assert (folder / "model.safetensors").is_symlink() and target.read_bytes() == b"the user's"
