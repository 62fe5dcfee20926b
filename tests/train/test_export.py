"""`python -m tinygrad_ssm export`: a fine-tuned run folder, written as a new folder that transformers'
Mamba2ForCausalLM.from_pretrained loads as the same model (float64 logits to rounding) and AutoTokenizer reads as
the package's tokenizer (the same ids); a byte-level run gets a tokenizer.json that gives each byte its own id; the
mamba_ssm layout loads back bit for bit; --out is only ever a new or empty folder, and every refusal names the
path and the fix, leaving nothing behind.

transformers' CPU path casts its norms and scan to float32 inside a float64 model; float64_throughout
(benchmarks/parity_transformers.py) keeps those casts float64, so the bound is rounding (1e-10), not float32's."""
import errno
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_ssm as tg
from tests.support.checkpoints import write_checkpoint
from tests.support.tokenizers import train_byte_fallback
from tests.support.training import TINY, forget_digest, quiet
from tinygrad_ssm import VarMap
from tinygrad_ssm.io.safetensors import load_file, save_file
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.export import byte_level_tokenizer_json
from tinygrad_ssm.train.generate import load_model
from tinygrad_ssm.train.loop import TrainConfig, train

BOUND = 1e-10
TEXT = "héllo wörld, the state space model\ndef f(x):\n    return x * 2  # naïve café 日本語 🎉\n"


def _transformers():
    torch = pytest.importorskip("torch", reason="torch is an optional reference (pip install -e '.[bench]')")
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from parity_transformers import float64_throughout
    return torch, transformers, float64_throughout


@pytest.fixture(scope="module")
def finetuned_run(corpus, bpe_tokenizer, tmp_path_factory):
    """A run fine-tuned (--init-from, one float64 step) from a transformers folder with a byte-level BPE tokenizer."""
    start = tmp_path_factory.mktemp("start")
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=320, d_state=16, headdim=16, chunk_size=8)
    write_checkpoint("transformers", start, Mamba2LMHeadModel(config, VarMap(seed=2), dtype="float64"),
                     tokenizer_json=bpe_tokenizer)
    out = tmp_path_factory.mktemp("finetune") / "run"
    settings = dict(TINY, dtype="float64", steps=1)
    result = train(TrainConfig(**settings, data=str(corpus), out=str(out), init_from=str(start)),
                   overrides={"init_from": str(start)}, progress=False, say=quiet)
    assert result.status == "done"
    return out


def _export(capsys, *flags) -> tuple[int, str, str]:
    code = cli.main(["export", *map(str, flags)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _leftovers(folder: Path) -> list[str]:
    """Temporary folders export left beside --out (none, whatever happened)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_finetuned_run_loads_in_transformers_with_its_tokenizer(finetuned_run, tmp_path, capsys):
    torch, transformers, float64_throughout = _transformers()
    out = tmp_path / "exported"
    code, printed, _ = _export(capsys, "--model", finetuned_run, "--out", out)
    assert code == cli.EXIT_OK
    assert f"Mamba2ForCausalLM.from_pretrained({str(out)!r})" in printed and _leftovers(tmp_path) == []
    tok = load_model(finetuned_run)[1]                                  # the tokenizer generate and eval use
    ours = Mamba2LMHeadModel.from_pretrained(finetuned_run / "checkpoints" / "step-000001", dtype="float64")
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(out)).eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = tok.encode(TEXT)
    assert their_tok(TEXT)["input_ids"] == ids.tolist()
    assert their_tok.decode(ids.tolist()) == tok.decode(ids) == TEXT
    assert theirs.dtype == torch.float64 and theirs.config.eos_token_id == tok.eos_token_id == 0
    with torch.no_grad(), float64_throughout():
        their_logits = theirs(torch.from_numpy(ids[None])).logits.numpy()
    with tg.no_grad():
        assert np.abs(ours(ids[None]).data - their_logits).max() < BOUND


def test_the_mamba_ssm_layout_is_the_checkpoint_bit_for_bit(finetuned_run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert _export(capsys, "--model", finetuned_run, "--out", out, "--layout", "mamba_ssm")[0] == cli.EXIT_OK
    checkpoint = finetuned_run / "checkpoints" / "step-000001"
    assert json.loads((out / "config.json").read_text())["d_model"] == 32
    stored, written = load_file(checkpoint / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(stored) == sorted(written)
    for name in stored:
        assert written[name].dtype == stored[name].dtype and written[name].tobytes() == stored[name].tobytes()
    assert (out / "tokenizer.json").read_bytes() == (checkpoint / "tokenizer.json").read_bytes()


BYTE_TOKENIZER_JSON = byte_level_tokenizer_json()


@given(st.text(max_size=40) | st.sampled_from([TEXT, "🎉🎉 日本語\x00\x7f\u0100", " leading and  double  spaces "]))
def test_the_byte_level_tokenizer_gives_each_byte_its_own_id(text):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(BYTE_TOKENIZER_JSON)
    assert tok.get_vocab_size() == 256
    ids = tok.encode(text).ids
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_a_byte_level_run_gets_a_tokenizer_autotokenizer_reads_as_bytes(stopped_run, tmp_path, capsys):
    _, transformers, _ = _transformers()
    out = tmp_path / "exported"
    code, printed, _ = _export(capsys, "--model", stopped_run, "--out", out)
    assert code == cli.EXIT_OK and "ids = list(text.encode('utf-8'))" in printed
    their_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert their_tok(TEXT)["input_ids"] == list(TEXT.encode("utf-8"))
    assert their_tok.decode(list(TEXT.encode("utf-8"))) == TEXT
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 256 and config["eos_token_id"] is None and config["dtype"] == "float32"
    back = Mamba2LMHeadModel.from_pretrained(out)
    checkpoint = load_file(stopped_run / "checkpoints" / "step-000002" / "model.safetensors")
    for name, t in back.varmap.named_vars():
        assert t.data.tobytes() == checkpoint[name].tobytes(), name


def test_a_llama_style_tokenizer_keeps_its_bos(tmp_path, capsys):
    """A tokenizer.json that puts <s> first, its tokenizer_config.json's bos/eos names: AutoTokenizer adds the <s>
    the package adds, and config.json gets their ids."""
    _, transformers, _ = _transformers()
    source = train_byte_fallback([TEXT * 20], tmp_path / "source", template="bos")
    vocab = FileTokenizer(source / "tokenizer.json").vocab_size
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=vocab, d_state=16, headdim=16, chunk_size=8)
    Mamba2LMHeadModel(config, VarMap(seed=2)).save_pretrained(source)
    (source / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "temperature": 0.7}))
    code, _, err = _export(capsys, "--model", source, "--out", tmp_path / "out")
    assert code == cli.EXIT_OK, err
    ids = load_model(source)[1].encode(TEXT)
    assert ids[0] == 1 and transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))(TEXT)["input_ids"] == \
        ids.tolist()
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (1, 2, None)
    assert (tmp_path / "out" / "generation_config.json").read_text() == \
        (source / "generation_config.json").read_text()


def test_the_tokenizers_other_settings_survive_fine_tuning_and_export(corpus, tmp_path, capsys):
    """A checkpoint's tokenizer_config.json kept only bos/eos/add_bos_token: after fine-tuning and export,
    AutoTokenizer had no pad_token ("Asking to pad but the tokenizer does not have a padding token"), no unk_token,
    model_max_length 1e30 and right padding. Every other key is kept now (special_tokens_map.json's tokens over the
    config's, as transformers reads them), but paths and code of the machine it came from."""
    _, transformers, _ = _transformers()
    source = train_byte_fallback([TEXT * 20], tmp_path / "source", template="bos")
    settings = {"pad_token": "<unk>", "unk_token": "<unk>", "model_max_length": 2048, "padding_side": "left",
                "name_or_path": "/elsewhere/llama", "tokenizer_file": "/elsewhere/llama/tokenizer.json"}
    stated = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**stated, **settings}))
    (source / "special_tokens_map.json").write_text(json.dumps({"mask_token": "<unk>", "pad_token": "<s>"}))
    vocab = FileTokenizer(source / "tokenizer.json").vocab_size
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=vocab, d_state=16, headdim=16, chunk_size=8)
    Mamba2LMHeadModel(config, VarMap(seed=2)).save_pretrained(source)
    theirs = transformers.AutoTokenizer.from_pretrained(str(source))
    run = tmp_path / "run"
    flags = [part for k, v in {**TINY, "steps": 1}.items() if k not in ("d_model", "n_layer", "d_state", "headdim")
             for part in (f"--{k.replace('_', '-')}", str(v))]
    assert cli.main(["train", "--init-from", str(source), "--data", str(corpus), "--out", str(run), "--no-progress",
                     *flags]) == cli.EXIT_OK
    capsys.readouterr()
    kept = json.loads((run / "checkpoints" / "step-000001" / "tokenizer_config.json").read_text())
    assert {k: kept.get(k) for k in settings} == {**{k: settings[k] for k in list(settings)[:4]}, "pad_token": "<s>",
                                                   "name_or_path": None, "tokenizer_file": None}
    assert kept["mask_token"] == "<unk>"              # the map's tokens over the config's (it has no added_tokens_decoder)
    code, _, err = _export(capsys, "--model", run, "--out", tmp_path / "out")
    assert code == cli.EXIT_OK, err
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    for name in ("pad_token", "unk_token", "mask_token", "model_max_length", "padding_side", "bos_token", "eos_token"):
        assert getattr(exported, name) == getattr(theirs, name), name
    texts = ["a", "the state space model"]
    assert exported(texts, padding=True)["input_ids"] == theirs(texts, padding=True)["input_ids"]


# --- refusals: each names the path and the fix, and leaves everything as it was -------------------------------

def _refused(capsys, tmp_path, model, out, *patterns) -> None:
    before = sorted(os.listdir(tmp_path))
    code, printed, err = _export(capsys, "--model", model, "--out", out)
    assert code == cli.EXIT_USAGE and printed == ""
    for pattern in patterns:
        assert pattern in err, err
    assert sorted(os.listdir(tmp_path)) == before                       # nothing made, no temporary folder left


def test_a_non_empty_out_is_refused(stopped_run, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _refused(capsys, tmp_path, stopped_run, out, f"--out {str(out)!r} is a non-empty folder (it holds notes.txt)",
             "give a new path for --out")
    assert (out / "notes.txt").read_text() == "mine"


def test_an_empty_out_folder_is_used(stopped_run, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert _export(capsys, "--model", stopped_run, "--out", tmp_path / "empty")[0] == cli.EXIT_OK
    assert (tmp_path / "empty" / "model.safetensors").is_file() and _leftovers(tmp_path) == []


def test_a_symlinked_or_file_out_is_refused(stopped_run, tmp_path, capsys):
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    _refused(capsys, tmp_path, stopped_run, tmp_path / "link", f"--out {str(tmp_path / 'link')!r} is a symbolic link",
             "give a new path for --out")
    assert os.listdir(tmp_path / "target") == []
    (tmp_path / "file").write_text("x")
    _refused(capsys, tmp_path, stopped_run, tmp_path / "file", f"--out {str(tmp_path / 'file')!r} is a file")
    _refused(capsys, tmp_path, stopped_run, tmp_path / "file" / "out", f"{str(tmp_path / 'file')!r} is a file, not a "
             f"folder; give another --out")


def test_non_finite_weights_are_refused(stopped_run, tmp_path, capsys):
    model_dir = tmp_path / "nan-model"
    shutil.copytree(stopped_run / "checkpoints" / "step-000002", model_dir)
    weights = load_file(model_dir / "model.safetensors")
    weights["backbone.norm_f.weight"][0] = np.inf
    save_file(model_dir / "model.safetensors", weights)
    forget_digest(model_dir, "model.safetensors")                       # its values checked, not its bytes
    _refused(capsys, tmp_path, model_dir, tmp_path / "out", f"from_pretrained: {str(model_dir)!r}",
             "'backbone.norm_f.weight' holds 1 non-finite", "the model would compute NaN", "RUN/checkpoints/step-N")


def test_quantized_weights_are_refused_for_transformers(stopped_run, tmp_path, capsys):
    model_dir = tmp_path / "int8"
    Mamba2LMHeadModel.from_pretrained(stopped_run).quantize("int8").save_pretrained(model_dir)
    _refused(capsys, tmp_path, model_dir, tmp_path / "out", "holds int8-quantized weights",
             "export the float model's folder", "--layout mamba_ssm")


def test_flags_are_checked_before_anything_is_loaded(tmp_path, capsys):
    code, _, err = _export(capsys, "--model", tmp_path, "--out", "")
    assert code == cli.EXIT_USAGE and "--out '' is an empty path" in err
    code, _, err = _export(capsys, "--model", tmp_path / "absent", "--out", tmp_path / "out")
    assert code == cli.EXIT_USAGE and f"{str(tmp_path / 'absent')!r} does not exist" in err
    assert not (tmp_path / "out").exists()


def test_a_failed_write_leaves_nothing_behind(stopped_run, tmp_path, capsys, monkeypatch):
    """A full disk while writing the tokenizer (after the weights): exit 74 naming the cause, no --out, no
    temporary folder left beside it."""
    from tinygrad_ssm.train import export as export_module

    def full_disk(path, data, replace=True):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(export_module, "write_atomic", full_disk)
    code, printed, err = _export(capsys, "--model", stopped_run, "--out", tmp_path / "out")
    assert code == cli.EXIT_IO and printed == "" and "the disk is full" in err and "nothing was exported" in err
    assert os.listdir(tmp_path) == []
