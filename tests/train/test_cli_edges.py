"""The command line at edges an audit of generate, eval and export found: a Ctrl-C that numba's compiler drops,
one while a model folder loads, closed standard streams, a refused export that made folders, a named pipe where a
file is read, and control characters in the names a report prints."""
import argparse
import os
import signal
import sys
import threading

import pytest

from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.train import cli


@pytest.fixture
def model_folder(tmp_path):
    model = Mamba2LMHeadModel(Mamba2Config(d_model=16, n_layer=1, vocab_size=256, d_state=4, headdim=8),
                              VarMap(seed=0))
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_a_ctrl_c_a_callback_drops_still_ends_the_command_with_130(capsys):
    """A Ctrl-C while numba compiled was raised inside its ctypes callback, which printed 'Exception ignored' and
    went on: the command ran to its end and exited 0."""
    def dropped(args):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass                                                     # what the callback does with it
        return cli.EXIT_OK

    def raised(args):                                                # one the command does not take (a load)
        signal.raise_signal(signal.SIGINT)
        return cli.EXIT_OK

    assert cli._run_command(dropped, argparse.Namespace(command="eval")) == cli.EXIT_INTERRUPTED
    assert "error: Ctrl-C came while numba compiled, which lost it" in capsys.readouterr().err
    try:
        assert cli._run_command(raised, argparse.Namespace(command="generate")) == cli.EXIT_INTERRUPTED
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C the command does not take itself reached the caller: a traceback")
    assert capsys.readouterr().err.strip() == "stopped by Ctrl-C"
    assert cli._run_command(lambda args: cli.EXIT_OK, argparse.Namespace(command="eval")) == cli.EXIT_OK


def test_closed_standard_streams_are_said_not_tracebacks(model_folder, monkeypatch, capsys):
    """>&-, 2>&- and <&- leave Python's sys.stdout, sys.stderr or sys.stdin None: AttributeError tracebacks."""
    monkeypatch.setattr(sys, "stdout", None)
    assert cli.main(["generate", "--model", str(model_folder), "--prompt", "a"]) == cli.EXIT_IO
    assert "standard output is closed (>&-)" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(sys, "stdin", None)
    assert cli.main(["generate", "--model", str(model_folder), "--prompt-file", "-"]) == cli.EXIT_USAGE
    assert "--prompt-file -: standard input is closed" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stderr", None)
    assert cli.main(["generate", "--model", str(model_folder / "nope")]) == cli.EXIT_USAGE


def test_a_refused_export_leaves_no_folder_it_made_and_names_out(model_folder, tmp_path, capsys):
    """A float16 export of weights float16 cannot hold made new1/ and new1/a/ and left them, and its message named
    the temporary folder instead of --out."""
    big = Mamba2LMHeadModel.from_pretrained(model_folder)
    dict(big.varmap.named_vars())["backbone.norm_f.weight"].data[:] = 1e6
    big.save_pretrained(tmp_path / "big")
    out = tmp_path / "new1" / "a" / "b"
    assert cli.main(["export", "--model", str(tmp_path / "big"), "--out", str(out), "--dtype", "float16"]) \
        == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert not (tmp_path / "new1").exists() and ".tmp" not in err and str(out) in err, err
    assert cli.main(["export", "--model", str(model_folder), "--out", "/proc/x"]) == cli.EXIT_USAGE
    assert "--out '/proc/x': a folder cannot be made there" in capsys.readouterr().err


def test_a_named_pipe_is_not_read_as_a_folders_generation_config(model_folder):
    """from_pretrained read a FIFO named generation_config.json and waited for ever (generate, eval and export)."""
    fifo = model_folder / "generation_config.json"
    os.mkfifo(fifo)
    feeder = threading.Thread(target=lambda: fifo.write_text("{}"), daemon=True)   # so a read would end, not hang
    feeder.start()
    assert Mamba2LMHeadModel.from_pretrained(model_folder).generation_config is None
    unblock = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)                # lets the feeder's open finish
    feeder.join(10)
    os.close(unblock)


def test_a_pipe_as_prompt_file_points_to_dash(model_folder, tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe")
    assert cli.main(["generate", "--model", str(model_folder), "--prompt-file", str(tmp_path / "pipe")]) \
        == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "is a named pipe (FIFO)" in err and "(or --prompt-file - to read standard input" in err, err


def test_control_characters_in_names_a_report_prints_are_escaped(model_folder, tmp_path, capsys):
    """A file or --out name holding ESC was printed raw on eval's data line and export's first line."""
    text = tmp_path / "a\x1b[2Jb.txt"
    text.write_text("hello there, hello there\n" * 8)
    assert cli.main(["eval", "--model", str(model_folder), "--data", str(text), "--no-progress"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "\x1b" not in out and "a\\x1b[2Jb.txt" in out
    assert cli.main(["export", "--model", str(model_folder), "--out", str(tmp_path / "e\x1bx")]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "\x1b" not in out and "e\\x1bx" in out
    assert (tmp_path / "e\x1bx" / "config.json").is_file()
