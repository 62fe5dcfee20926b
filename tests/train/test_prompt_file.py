"""generate --prompt-file FILE: a prompt too long, or of too many lines, for the command line (llama.cpp's -f),
taken whole from a UTF-8 file or standard input (-); the same text as --prompt with the same characters."""
import io
import sys

import pytest

from tinygrad_ssm.train import cli

from tests.train.test_tokenized_runs import bpe_run  # noqa: F401 (the fixture: a run with a BPE tokenizer)

PROMPT = 'line 250: the quick "brown" café\nline 251: the quick\n'   # lines, quotes, UTF-8, a trailing newline


def generated(model, *flags, capsys) -> str:
    assert cli.main(["generate", "--model", str(model), "--max-new-tokens", "9", "--temperature", "0",
                     *flags]) == cli.EXIT_OK
    return capsys.readouterr().out


def test_a_prompt_file_continues_its_text_as_prompt_does(bpe_run, tmp_path, capsys, monkeypatch):  # noqa: F811
    expected = generated(bpe_run, "--prompt", PROMPT, capsys=capsys)
    assert expected.startswith(PROMPT)
    path = tmp_path / "prompt.txt"
    path.write_bytes(PROMPT.encode())
    assert generated(bpe_run, "--prompt-file", str(path), capsys=capsys) == expected
    path.write_bytes(b"\xef\xbb\xbf" + PROMPT.encode())                # a byte order mark (Notepad's UTF-8) is no text
    assert generated(bpe_run, "--prompt-file", str(path), capsys=capsys) == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(PROMPT.encode()), encoding="latin-1"))
    assert generated(bpe_run, "--prompt-file", "-", capsys=capsys) == expected     # read as bytes, not as latin-1


@pytest.mark.parametrize("content, flags, message", [
    (None, [], "--prompt-file {path} does not exist"),
    (b"caf\xe9", [], "--prompt-file {path} is not UTF-8 text (byte 3); save it as UTF-8"),
    (b"", [], "--prompt-file {path} is empty; leave --prompt-file out for the model to start on its own, or put "
              "the prompt into the file"),
    (b"text", ["--prompt", "p"], "--prompt and --prompt-file exclude each other"),
    (b"text", ["--batch-file", "prompts.txt"], "--prompt-file and --batch-file exclude each other"),
])
def test_a_prompt_file_that_cannot_be_read_is_named_before_the_model_loads(tmp_path, capsys, monkeypatch, content,
                                                                           flags, message):
    path = tmp_path / "prompt.txt"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.setattr(cli, "_load", lambda args: pytest.fail("the model was loaded before the prompt was read"))
    assert cli.main(["generate", "--model", str(tmp_path / "model"), "--prompt-file", str(path), *flags]) == \
        cli.EXIT_USAGE
    assert message.format(path=repr(str(path))) in capsys.readouterr().err


def test_a_folder_given_as_prompt_file_is_named(tmp_path, capsys):
    assert cli.main(["generate", "--model", str(tmp_path), "--prompt-file", str(tmp_path)]) == cli.EXIT_USAGE
    assert f"--prompt-file {str(tmp_path)!r} is a folder, not a regular file" in capsys.readouterr().err
