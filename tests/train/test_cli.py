"""The command line: help text, a real `python -m tinygrad_ssm train` run, generation, and bad input."""
import argparse
import json
import os
import subprocess
import sys

import pytest

from tinygrad_ssm.train import cli
from tinygrad_ssm.train.generate import stream_text

TINY_FLAGS = ["--d-model", "32", "--n-layer", "1", "--d-state", "16", "--headdim", "16", "--batch-size", "2",
              "--seq-len", "32", "--eval-batches", "1", "--sample-bytes", "16", "--no-progress"]


def test_every_flag_has_help_text():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == {"train", "generate", "eval", "export"}
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help and len(action.help) > 10, (name, action.option_strings)
    train_flags = {s for a in subparsers.choices["train"]._actions for s in a.option_strings}
    for flag in ["--steps", "--batch-size", "--seq-len", "--d-model", "--n-layer", "--lr", "--seed", "--backend",
                 "--out", "--resume", "--data", "--init-from", "--tokenizer"]:
        assert flag in train_flags



def test_help_lists_every_exit_status():
    """--help's epilog names each status main() can return (74, a failed write, was missing from it)."""
    epilog = cli.build_parser().epilog
    for code in (cli.EXIT_OK, cli.EXIT_DIVERGED, cli.EXIT_USAGE, cli.EXIT_IO, cli.EXIT_INTERRUPTED):
        assert f" {code} " in epilog, (code, epilog)

@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`python -m tinygrad_ssm train --steps 3` on the default corpus, in a subprocess."""
    out = tmp_path_factory.mktemp("cli") / "run"
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([sys.executable, "-m", "tinygrad_ssm", "train", "--steps", "3", "--out", str(out),
                           *TINY_FLAGS], capture_output=True, text=True, timeout=300, env=env)
    return proc, out


def test_train_smoke_in_a_subprocess(smoke_run):
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stderr
    assert "standard library" in proc.stdout and "unigram entropy" in proc.stdout
    assert "final validation:" in proc.stdout and "bits per byte" in proc.stdout and "sample:" in proc.stdout
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train_loss" in r] == [1, 2, 3]
    assert any("val_bpb" in r for r in records)
    assert (out / "checkpoints" / "step-000003" / "model.safetensors").is_file()


def test_train_writes_the_loss_plot(smoke_run):
    pytest.importorskip("matplotlib", reason="loss.png is drawn with matplotlib, which is not installed")
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stderr
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"curves: {out / 'loss.png'}" in proc.stdout


def test_train_without_matplotlib_writes_no_plot(corpus, tmp_path, capsys, monkeypatch):
    """matplotlib is required by setup.cfg, but a run without it still succeeds, with no loss.png, saying why."""
    # None in sys.modules makes an import raise ImportError; submodules too, in case a test loaded them
    for name in ["matplotlib", *(m for m in list(sys.modules) if m.startswith("matplotlib."))]:
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(corpus), "--steps", "1", "--out", str(out), *TINY_FLAGS]) == cli.EXIT_OK
    stdout = capsys.readouterr().out
    assert "final validation:" in stdout and "curves:" not in stdout
    assert "no loss plot: matplotlib is not installed" in stdout  # says why, and how to get it
    assert (out / "log.jsonl").is_file() and not (out / "loss.png").exists()


def test_generate_streams_from_a_run_and_from_a_pretrained_folder(smoke_run, tmp_path, capsys):
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stderr
    assert cli.main(["generate", "--checkpoint", str(out), "--prompt", "def ", "--max-new-tokens", "40",
                     "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ")
    # 40 bytes, some as U+FFFD (3 bytes of UTF-8), control bytes escaped as \xNN (4)
    assert 4 + 1 <= len(text.encode("utf-8", "surrogatepass")) <= 4 + 4 * 40 + 1

    from tinygrad_ssm.train.generate import load_model

    model, tokenizer = load_model(out)
    assert tokenizer.name == "bytes"  # the run says so; its checkpoint holds no tokenizer.json
    model.save_pretrained(tmp_path / "pretrained")
    args = ["generate", "--checkpoint", str(tmp_path / "pretrained"), "--prompt", "def ", "--max-new-tokens", "40",
            "--seed", "1"]
    assert cli.main(args) == 0
    assert capsys.readouterr().out == text  # same weights, same seed: same text


def test_generate_bad_checkpoint(tmp_path, capsys):
    assert cli.main(["generate", "--checkpoint", str(tmp_path / "nope")]) == cli.EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["generate", "--checkpoint", str(tmp_path)]) == cli.EXIT_USAGE
    assert "no config.json" in capsys.readouterr().err
    assert cli.main(["generate", "--checkpoint", str(tmp_path), "--top-p", "2"]) == cli.EXIT_USAGE
    assert "--top-p must be in (0, 1]" in capsys.readouterr().err


def test_train_bad_data_exits_2_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(tmp_path / "missing"), "--out", str(out)]) == cli.EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["train", "--data", str(empty), "--out", str(out)]) == cli.EXIT_USAGE
    assert "contains no files" in capsys.readouterr().err
    assert not out.exists()


class _FixedBytes:
    """Emits given bytes through the model's streaming interface (the decoder is what is tested)."""

    def __init__(self, data: bytes):
        self.data = data

    def generate_stream(self, input_ids, max_new_tokens, **sampling):
        import numpy as np

        for b in self.data[:max_new_tokens]:
            yield np.array([b])


def test_stream_text_replaces_invalid_utf8_and_never_splits_a_character():
    euro = "€".encode()  # 3 bytes: nothing may be shown before the last one arrives
    pieces = list(stream_text(_FixedBytes(b"a" + euro + b"\xff" + euro[:2] + b"z"), "", 100))
    # the stray byte and the cut-short "€" are held back while they could still start a character; "z" shows
    # that they cannot, and they come out as U+FFFD with it
    assert pieces == ["a", "€", "\ufffd\ufffdz"]
    assert "".join(stream_text(_FixedBytes(euro[:2]), "", 100)) == "\ufffd"  # cut short at the end


def test_stop_at_then_resume_through_the_cli(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "--steps", "4", "--stop-at", "2", "--out", str(out), *TINY_FLAGS]) == cli.EXIT_OK
    assert "--resume" in capsys.readouterr().out
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "step-000002"
    assert cli.main(["train", "--resume", str(out), "--d-model", "64"]) == cli.EXIT_USAGE
    assert "--d-model (saved 32, given 64)" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == cli.EXIT_OK
    assert "final validation:" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train_loss" in r] == [1, 2, 3, 4]
    assert cli.main(["train", "--steps", "1", "--out", str(out), *TINY_FLAGS]) == cli.EXIT_USAGE
    assert "already holds a run" in capsys.readouterr().err
