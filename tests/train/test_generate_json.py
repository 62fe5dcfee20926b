"""generate --batch-file ... --json FILE: each prompt's result as a line of JSON (index, line, prompt, text, new_tokens,
finish), written batch by batch to a new file (or to stdout with -, the texts then on stderr); never over a file
that exists."""
import json

import numpy as np
import pytest

from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import cli
from tinygrad_ssm.train import generate as gen

PROMPTS = ["line 1: the", "line 20", "a \"quoted\" prompt", "x", "line 299: the quick"]


@pytest.fixture
def batch_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": p}) for p in PROMPTS]
    path.write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")     # a blank line after the second: lines 1 2 4 5 6
    return path


def _generate(run, batch_file, *flags):
    return cli.main(["generate", "--model", str(run), "--batch-file", str(batch_file), "--max-new-tokens", "7",
                     "--temperature", "0", *flags])


def test_each_prompts_result_is_a_line_of_json_beside_the_printed_text(stopped_run, batch_file, tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    assert _generate(stopped_run, batch_file, "--json", str(out)) == cli.EXIT_OK
    printed = capsys.readouterr().out
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in records] == [1, 2, 3, 4, 5] and [r["line"] for r in records] == [1, 2, 4, 5, 6]
    assert [r["prompt"] for r in records] == PROMPTS
    shown = [gen.escape_controls(r["prompt"] + r["text"]) for r in records]  # the JSON's text as it is, unescaped
    assert printed == "".join(f"=== {r['index']}/5, line {r['line']} ===\n{s}\n" for r, s in zip(records, shown))
    assert all(r["new_tokens"] == 7 and r["finish"] == "length" for r in records)   # bytes: no EOS to stop at
    assert _generate(stopped_run, batch_file) == cli.EXIT_OK
    assert capsys.readouterr().out == printed                           # the same text without --json


def test_json_to_stdout_holds_the_json_alone(stopped_run, batch_file, tmp_path, capsys):
    assert _generate(stopped_run, batch_file, "--json", str(tmp_path / "r.jsonl")) == cli.EXIT_OK
    capsys.readouterr()
    assert _generate(stopped_run, batch_file, "--json", "-") == cli.EXIT_OK
    captured = capsys.readouterr()
    assert captured.out == (tmp_path / "r.jsonl").read_text(encoding="utf-8")
    assert captured.err.count("=== ") == 5


def test_results_are_written_batch_by_batch_into_a_file_made_at_the_first_batchs_end(stopped_run, batch_file,
                                                                                      tmp_path, monkeypatch):
    out, seen = tmp_path / "results.jsonl", []
    real = gen.generate_batch

    def spy(*args, **kwargs):
        seen.append(len(out.read_text().splitlines()) if out.exists() else None)   # lines written before the batch
        return real(*args, **kwargs)
    monkeypatch.setattr(gen, "generate_batch", spy)
    assert _generate(stopped_run, batch_file, "--json", str(out), "--batch-size", "2") == cli.EXIT_OK
    assert seen == [None, 2, 4] and len(out.read_text().splitlines()) == 5


def test_a_file_that_exists_is_never_written(stopped_run, batch_file, tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    out.write_text("the user's own file\n")
    assert _generate(stopped_run, batch_file, "--json", str(out)) == cli.EXIT_USAGE
    assert "--json '%s' exists and is not generate's to replace; give a new file name" % out in capsys.readouterr().err
    assert out.read_text() == "the user's own file\n"
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "nowhere.jsonl")                         # a dangling link: not followed either
    assert _generate(stopped_run, batch_file, "--json", str(link)) == cli.EXIT_USAGE
    assert not (tmp_path / "nowhere.jsonl").exists()
    assert _generate(stopped_run, batch_file, "--json", str(tmp_path / "no" / "r.jsonl")) == cli.EXIT_USAGE
    assert "the folder" in capsys.readouterr().err
    assert cli.main(["generate", "--model", str(stopped_run), "--prompt", "x", "--json", str(tmp_path / "r")]) == \
        cli.EXIT_USAGE
    assert "--json writes the results of --batch-file's prompts" in capsys.readouterr().err


def test_finish_says_whether_an_eos_ended_the_text(bpe_tokenizer):
    tok = FileTokenizer(bpe_tokenizer)
    eos = tok.eos_token_id
    rows = [[40, 41, eos], [40, 41, 42, 43]]                             # generate cuts a row after its first EOS

    class Fixed:                                                         # generate's output: each prompt, then its row
        def generate(self, prompts, n, **kw):
            return [np.concatenate([p, r]) for p, r in zip(prompts, rows)]

    ended, full = gen.generate_batch(Fixed(), ["a", "b"], 4, tok, temperature=0)
    assert (ended.new_tokens, ended.finish, full.new_tokens, full.finish) == (3, "eos", 4, "length")
    assert ended.text == tok.decode([40, 41])                            # the EOS ends it and is not in the text
    ignored = gen.generate_batch(Fixed(), ["a", "b"], 4, tok, stop_at_eos=False, temperature=0)[0]
    assert ignored.finish == "length" and ignored.text.endswith(tok.token_text(eos))
