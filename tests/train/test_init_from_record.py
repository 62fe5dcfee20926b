"""What `train --init-from` says and records of its start: a checkpoint stored in another dtype than the run trains
in is named in one line (a float64 one trained in float32 lost its precision without a word), and the run's
settings (trainer_state.json's train_config, the run folder's marker) hold the sha256 of every weight file and of
the tokenizer.json it read, kept by --resume, so a run can be traced to the exact checkpoint."""
import hashlib
import json

import pytest

from tests.support.checkpoints import write_checkpoint, write_transformers_dir
from tests.support.training import TINY, quiet
from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.config import TrainConfig
from tinygrad_ssm.train.loop import train
from tinygrad_ssm.train.run_folder import MARKER_FILE
from tinygrad_ssm.train.starting_point import resolve_starting_point

SHAPE = dict(d_model=32, n_layer=1, d_state=16, headdim=16, chunk_size=16)
SETTINGS = {k: v for k, v in TINY.items() if k not in ("d_model", "n_layer", "d_state", "headdim")}
FLOAT64_NOTE = "the checkpoint's weights are float64; training in float32 (--dtype float64 keeps them)"


def _model(dtype="float32", vocab_size=256):
    return Mamba2LMHeadModel(Mamba2Config(vocab_size=vocab_size, **SHAPE), VarMap(seed=2), dtype=dtype)


def _flags(settings: dict) -> list[str]:
    return [part for k, v in settings.items() for part in (f"--{k.replace('_', '-')}", str(v))]


def test_a_float64_checkpoint_trained_in_float32_is_said_in_one_line(corpus, tmp_path, capsys):
    folder = write_checkpoint("save_pretrained", tmp_path / "f64", _model("float64"))
    base = ["train", "--init-from", str(folder), "--data", str(corpus), "--steps", "1", "--no-progress",
            *_flags(SETTINGS)]
    assert cli.main([*base, "--out", str(tmp_path / "run")]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines.count(FLOAT64_NOTE) == 1 and lines.index(FLOAT64_NOTE) < 2, lines[:3]   # first, before the data
    assert cli.main([*base, "--out", str(tmp_path / "kept"), "--dtype", "float64"]) == cli.EXIT_OK
    assert "the checkpoint's weights" not in capsys.readouterr().out


def test_the_line_names_each_stored_dtype_and_only_when_dtype_was_left_out(tmp_path):
    f16, f32 = tmp_path / "f16", tmp_path / "f32"
    f16.mkdir()
    write_transformers_dir(f16, _model(), dtype="float16")
    write_checkpoint("save_pretrained", f32, _model())
    said = []
    for folder, overrides in ((f16, {}), (f32, {}), (f16, {"dtype": "float32"})):
        resolve_starting_point(TrainConfig(init_from=str(folder)), {"init_from": str(folder), **overrides},
                               said.append)
    assert said == ["the checkpoint's weights are float16; training in float32 (the run's checkpoints hold "
                    "float32; export --dtype float16 writes a fine-tuned folder in float16 again)"]


def test_the_run_records_the_sha256_of_each_file_it_started_from(bpe_tokenizer, corpus, tmp_path):
    """Two weight shards and the tokenizer.json: hashlib of each file; the record survives --resume."""
    folder = write_checkpoint("sharded", tmp_path / "start", _model(vocab_size=320), tokenizer_json=bpe_tokenizer)
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) == 2
    expected = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in [*shards, "tokenizer.json"]}
    run = tmp_path / "run"
    train(TrainConfig(**SETTINGS, steps=2, data=str(corpus), out=str(run), init_from=str(folder)), stop_at=1,
          progress=False, say=quiet)
    resumed = train(resume=str(run), progress=False, say=quiet)
    for checkpoint in ("step-000001", "step-000002"):
        state = json.loads((run / "checkpoints" / checkpoint / "trainer_state.json").read_text())
        assert state["train_config"]["init_from_sha256"] == expected, checkpoint
    assert resumed.step == 2
    assert json.loads((run / MARKER_FILE).read_text())["train_config"]["init_from_sha256"] == expected


def test_a_fine_tuning_run_keeps_its_starting_folders_generation_config(bpe_tokenizer, corpus, tmp_path):
    """--init-from's generation_config.json (greedy, 3 new tokens, two stop ids) was left behind: the run's
    checkpoints and their export sampled at 0.8 for 300 tokens and stopped at the tokenizer's EOS alone.
    Every checkpoint holds it now, --resume keeps it, export copies it (as transformers' Trainer saves the model's
    generation_config); with --tokenizer replacing the folder's own tokenizer it is left out with a warning (its ids
    are that one's), but kept for a copy of the folder's own (it was dropped for a copy, without a word)."""
    from tinygrad_ssm.train.export import export
    from tinygrad_ssm.train.generation_config import read_generation_defaults
    folder = write_checkpoint("save_pretrained", tmp_path / "start", _model(vocab_size=320), tokenizer_json=bpe_tokenizer)
    text = json.dumps({"do_sample": False, "max_new_tokens": 3, "eos_token_id": [0, 5]}, indent=1) + "\n"
    (folder / "generation_config.json").write_text(text)
    run = tmp_path / "run"
    train(TrainConfig(**SETTINGS, steps=2, data=str(corpus), out=str(run), init_from=str(folder)), stop_at=1,
          progress=False, say=quiet)
    train(resume=str(run), progress=False, say=quiet)
    for checkpoint in ("step-000001", "step-000002"):
        assert (run / "checkpoints" / checkpoint / "generation_config.json").read_text() == text, checkpoint
    defaults = read_generation_defaults(run / "checkpoints" / "step-000002", 320)
    assert defaults == read_generation_defaults(folder, 320) and defaults.eos_token_ids == (0, 5)
    export(run, tmp_path / "exported")
    assert (tmp_path / "exported" / "generation_config.json").is_file()
    copy = tmp_path / "tokenizer_copy.json"                         # the folder's own, kept elsewhere: the same ids
    copy.write_bytes(bpe_tokenizer.read_bytes())
    same = tmp_path / "same"
    train(TrainConfig(**SETTINGS, steps=1, data=str(corpus), out=str(same), init_from=str(folder), tokenizer=str(copy)),
          progress=False, say=quiet)
    assert (same / "checkpoints" / "step-000001" / "generation_config.json").read_text() == text
    elsewhere = tmp_path / "tokenizer_elsewhere.json"               # another tokenizer of the same size: two ids swapped
    spec = json.loads(bpe_tokenizer.read_text())
    vocab = spec["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[100:102]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    elsewhere.write_text(json.dumps(spec))
    other = tmp_path / "other"
    with pytest.warns(UserWarning, match=r"its generation_config.json is not kept in the run's checkpoints: .* which "
                                         r"--tokenizer '.*tokenizer_elsewhere.json' replaces"):
        train(TrainConfig(**SETTINGS, steps=1, data=str(corpus), out=str(other), init_from=str(folder),
                          tokenizer=str(elsewhere)), progress=False, say=quiet)
    assert not (other / "checkpoints" / "step-000001" / "generation_config.json").exists()
    state = json.loads((other / "checkpoints" / "step-000001" / "trainer_state.json").read_text())
    assert state["train_config"]["tokenizer"] == str(elsewhere)     # a TrainConfig's tokenizer is not replaced
    on_bytes = tmp_path / "on_bytes"                                  # bytes for a BPE model: its stop ids kept before
    with pytest.warns(UserWarning) as caught:
        assert cli.main(["train", "--init-from", str(folder), "--data", str(corpus), "--out", str(on_bytes),
                         "--tokenizer", "bytes", "--no-progress", *_flags({**SETTINGS, "steps": 1})]) == cli.EXIT_OK
    said = [str(w.message) for w in caught]
    assert any("its generation_config.json is not kept" in m for m in said), said
    assert any("--tokenizer 'bytes' (256 tokens) replaces the tokenizer" in m for m in said), said
    assert not (on_bytes / "checkpoints" / "step-000001" / "generation_config.json").exists()


def test_a_train_config_spelling_out_another_shape_than_the_checkpoints_is_refused(corpus, tmp_path):
    """From Python, train(TrainConfig(d_model=..., init_from=...)) trained the checkpoint's shape without a word
    (only flags were checked); a shape equal to the checkpoint's is accepted, one that differs is refused."""
    folder = write_checkpoint("save_pretrained", tmp_path / "start", _model())
    base = dict(SETTINGS, steps=1, data=str(corpus), init_from=str(folder))
    assert train(TrainConfig(**base, **SHAPE, out=str(tmp_path / "same")), progress=False, say=quiet).step == 1
    with pytest.raises(ValueError, match=r"leave out --d-model, --headdim \(the checkpoint has d_model 32, headdim 16\)"):
        train(TrainConfig(**base, **dict(SHAPE, d_model=64, headdim=8), out=str(tmp_path / "x")), progress=False,
              say=quiet)
    assert not (tmp_path / "x").exists()


def test_a_starting_folder_without_safetensors_weights_is_a_usage_error(corpus, tmp_path, capsys):
    """state-spaces/mamba2-*'s folders ship pytorch_model.bin only: --init-from said "cannot write a file in the run
    folder" and exited 74 (a failed write), where generate and eval give from_pretrained's message and 2."""
    folder = write_checkpoint("save_pretrained", tmp_path / "start", _model())
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    code = cli.main(["train", "--init-from", str(folder), "--data", str(corpus), "--steps", "1", "--no-progress",
                     "--out", str(tmp_path / "run"), *_flags(SETTINGS)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE, err
    assert "holds pytorch_model.bin, PyTorch's pickle format" in err and "cannot write" not in err
    assert not (tmp_path / "run").exists()


def test_a_starting_folder_with_a_nan_weight_is_refused_naming_it(corpus, tmp_path, capsys):
    """Refused by the load itself (from_pretrained checks every weight as it reads it), before any run folder."""
    from tinygrad_ssm.io.safetensors import load_file, save_file
    folder = write_checkpoint("save_pretrained", tmp_path / "start", _model())
    weights = load_file(folder / "model.safetensors")
    weights["backbone.norm_f.weight"][1] = float("inf")
    save_file(folder / "model.safetensors", weights)
    code = cli.main(["train", "--init-from", str(folder), "--data", str(corpus), "--steps", "1", "--no-progress",
                     "--out", str(tmp_path / "run"), *_flags(SETTINGS)])
    assert code == cli.EXIT_USAGE
    assert "tensor 'backbone.norm_f.weight' holds 1 non-finite value(s)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_init_from_keeps_the_checkpoints_chunk_size_unless_given(corpus, tmp_path):
    """The run took TrainConfig's default chunk (64) over the checkpoint's, so fine-tuning mamba2-130m (chunk 256)
    and exporting wrote chunk 64 without a word: the checkpoint's is kept now, --chunk-size still overrides it."""
    folder = write_checkpoint("transformers", tmp_path / "start", _model())        # chunk_size 16 (SHAPE)
    kept, given = tmp_path / "kept", tmp_path / "given"
    train(TrainConfig(**SETTINGS, steps=1, data=str(corpus), out=str(kept), init_from=str(folder)), progress=False,
          say=quiet)
    assert Mamba2LMHeadModel.from_pretrained(kept).config.chunk_size == 16
    assert cli.main(["train", "--init-from", str(folder), "--data", str(corpus), "--out", str(given), "--chunk-size",
                     "8", "--no-progress", *_flags({**SETTINGS, "steps": 1})]) == cli.EXIT_OK
    assert Mamba2LMHeadModel.from_pretrained(given).config.chunk_size == 8
