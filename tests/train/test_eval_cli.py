"""eval's command line against score() in Python: --dtype float64 gives score()'s numbers on a float64 model (float32,
the default, rounds them); a tokenizer's U+FFFD for bytes that are not UTF-8 is said on stderr as training says it,
the numbers and the JSON on stdout unchanged; a folder's report lists each file's own figures, which add up to
the totals."""
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.support.checkpoints import write_checkpoint
from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.evaluation import evaluate, evaluate_pieces
from tinygrad_ssm.tokenizer import ByteTokenizer, FileTokenizer, invalid_utf8_bytes
from tinygrad_ssm.train import cli, generate, scoring
from tinygrad_ssm.train.data import load_corpus, non_utf8_note, tokenize

TEXT = b"".join(b"line %d: the quick brown fox jumps over the lazy dog\n" % i for i in range(12))   # ~650 bytes
CONFIG = dict(d_model=32, n_layer=1, d_state=16, headdim=16, chunk_size=16)


def _folder(tmp_path, dtype="float64", vocab_size=256, tokenizer_json=None, name="model"):
    model = Mamba2LMHeadModel(Mamba2Config(vocab_size=vocab_size, **CONFIG), VarMap(seed=1), dtype=dtype)
    return write_checkpoint("save_pretrained", tmp_path / name, model, tokenizer_json=tokenizer_json)


def _eval(capsys, folder, data, *extra) -> tuple[dict, str]:
    """(the JSON eval --json - prints, its stderr)."""
    assert cli.main(["eval", "--model", str(folder), "--data", str(data), "--json", "-", "--no-progress",
                     "--window", "40", *extra]) == cli.EXIT_OK
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_dtype_float64_gives_the_numbers_of_score_on_a_float64_model(tmp_path, capsys):
    folder, text = _folder(tmp_path), tmp_path / "text.txt"
    text.write_bytes(TEXT)
    model = Mamba2LMHeadModel.from_pretrained(folder, dtype="float64")
    expected = scoring.score(model, ByteTokenizer(), scoring.read_eval_text(str(text), folder, ByteTokenizer()),
                             window=40, progress=False)
    report, err = _eval(capsys, folder, text, "--dtype", "float64")
    assert report["tokens"] == expected["tokens"] == len(TEXT) - 1 and report["dtype"] == "float64"
    for key in ("mean_nats", "bits_per_byte"):
        assert abs(report[key] - expected[key]) <= 1e-12, key
    assert "note" not in err, err
    default, err = _eval(capsys, folder, text)                           # float32: the float64 weights rounded,
    assert f"note: {folder}'s weights are float64; scored in float32 (--dtype float64" in err, err   # and said
    given, err = _eval(capsys, folder, text, "--dtype", "float32")       # asked for: nothing to say
    assert default == given | {"seconds": default["seconds"], "tokens_per_s": default["tokens_per_s"]}
    assert "note" not in err, err
    _, err = _eval(capsys, _folder(tmp_path, dtype="float32", name="model32"), text)
    assert "note" not in err, err
    # float32 ran: score()'s numbers of a float32 model, not float64's (the two differ by rounding alone; on an
    # AMD EPYC by only 2.9e-10, so the test holds the float32 figure to score()'s rather than to a gap's size)
    model32 = Mamba2LMHeadModel.from_pretrained(folder)
    expected32 = scoring.score(model32, ByteTokenizer(), scoring.read_eval_text(str(text), folder, ByteTokenizer()),
                               window=40, progress=False)
    assert abs(default["mean_nats"] - expected32["mean_nats"]) <= 1e-12
    assert default["mean_nats"] != expected["mean_nats"] and abs(default["mean_nats"] - expected["mean_nats"]) < 1e-4


def test_generate_decodes_in_the_dtype_given(tmp_path, capsys, monkeypatch):
    folder, loaded = _folder(tmp_path), []

    def spy(*args, **kwargs):
        loaded.append(real(*args, **kwargs)[0])
        return loaded[-1], ByteTokenizer()

    real = generate.load_model
    monkeypatch.setattr(cli, "load_model", spy)
    for dtype in ("float64", "float32"):
        assert cli.main(["generate", "--model", str(folder), "--prompt", "line", "--max-new-tokens", "5",
                         "--temperature", "0", "--dtype", dtype]) == cli.EXIT_OK
        model = Mamba2LMHeadModel.from_pretrained(folder, dtype=dtype)
        assert loaded[-1].dtype == np.dtype(dtype)
        text = "".join(generate.stream_text(model, "line", 5, temperature=0))
        assert capsys.readouterr().out == "line" + generate.escape_controls(text) + "\n"


def test_bytes_that_are_not_utf8_are_said_on_stderr_as_training_says_them(bpe_tokenizer, tmp_path, capsys,
                                                                           monkeypatch):
    """A latin-1 file and a UTF-16 one among UTF-8 files (characters cut between blocks of 7 bytes): eval names
    them on stderr in training's words (the count is tokenizer.invalid_utf8_bytes's of the text), and its JSON on
    stdout is the JSON alone, with the numbers of the text's ids; a byte model reads the bytes as they are."""
    folder = _folder(tmp_path, dtype="float32", vocab_size=320, tokenizer_json=bpe_tokenizer)
    data = tmp_path / "texts"
    data.mkdir()
    files = {"a.txt": "café 日本語 naïve\n".encode() * 3, "b.txt": "café à la crème\n".encode("latin-1"),
             "c.txt": "ok\n".encode(), "d.txt": "日本語の文".encode("utf-16")}    # no NUL: not binary
    for name, body in files.items():
        (data / name).write_bytes(body)
    monkeypatch.setattr(scoring, "READ_BLOCK", 7)
    report, err = _eval(capsys, folder, data, "--dtype", "float64")
    joined = b"".join(files.values())
    tok = FileTokenizer(bpe_tokenizer)
    note = non_utf8_note(invalid_utf8_bytes(joined), ("b.txt", "d.txt (UTF-16)"))
    assert f"{report['data']}: {note}\n" in err.splitlines(keepends=True) and note.startswith("9 bytes")
    assert note in tokenize(load_corpus(data), tok).describe()           # what training says of the folder
    ids, _ = tok.encode_bytes_with_ends(joined)
    expected = evaluate(Mamba2LMHeadModel.from_pretrained(folder, dtype="float64"), ids, 40)
    assert report["mean_nats"] == expected.mean_nats and report["tokens"] == expected.tokens
    _, err = _eval(capsys, folder, data / "b.txt")                          # a single file: named as training names it
    assert err.splitlines()[0] == f"{data / 'b.txt'}: {non_utf8_note(3, ('b.txt',))}"
    _, err = _eval(capsys, _folder(tmp_path, name="bytes"), data)        # bytes: nothing read as U+FFFD
    assert "UTF-8" not in err


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_a_folders_report_has_each_files_own_figures_which_add_up_to_the_totals(tokenizer, bpe_tokenizer, tmp_path,
                                                                                capsys, monkeypatch):
    """Each file's tokens (those that end in it: the tokenizer's byte ends against the files' sizes), their losses
    scored with the state the files before left (the per-token losses of one evaluate over the joined text), and
    the bytes they cover; the files' tokens, bytes, nats and bits add up to the totals. A single file has none."""
    tok_json = None if tokenizer == "bytes" else bpe_tokenizer
    folder, data = _folder(tmp_path, vocab_size=256 if tok_json is None else 320, tokenizer_json=tok_json), \
        tmp_path / "texts"
    (data / "sub").mkdir(parents=True)
    bodies = {"a.txt": TEXT[:300], "b.bin": b"\x00x", "sub/c.txt": TEXT[300:301], "sub/d.txt": TEXT[301:]}
    for name, body in bodies.items():
        (data / name).write_bytes(body)
    monkeypatch.setattr(scoring, "READ_BLOCK", 64)
    report, _ = _eval(capsys, folder, data, "--dtype", "float64")
    tok = ByteTokenizer() if tok_json is None else FileTokenizer(tok_json)
    ids, ends = tok.encode_bytes_with_ends(TEXT)                         # the joined text: a.txt, c.txt, d.txt
    losses = []
    whole = evaluate_pieces(Mamba2LMHeadModel.from_pretrained(folder, dtype="float64"), [ids], 40,
                            token_nats=losses.append)
    losses, in_file = np.concatenate(losses), np.searchsorted([300, 301, len(TEXT)], ends[1:])   # (n - 1,) each
    spans = np.diff(ends)
    files = report["files"]
    assert [f["path"] for f in files] == ["a.txt", "sub/c.txt", "sub/d.txt"]
    for i, f in enumerate(files):
        mine = in_file == i
        assert f["tokens"] == mine.sum() and f["bytes"] == spans[mine].sum()
        if f["tokens"]:
            assert f["mean_nats"] == pytest.approx(losses[mine].mean(), rel=1e-12, abs=0)
            assert f["bits_per_byte"] == pytest.approx(losses[mine].sum() / math.log(2) / f["bytes"], rel=1e-12)
    assert files[0]["tokens"] > 20 and files[2]["tokens"] > 20
    assert sum(f["tokens"] for f in files) == report["tokens"] == whole.tokens
    assert sum(f["bytes"] for f in files) == report["bytes"]
    nats = sum(f["mean_nats"] * f["tokens"] for f in files if f["tokens"])
    assert nats == pytest.approx(report["mean_nats"] * report["tokens"], rel=1e-12, abs=0)
    bits = sum(f["bits_per_byte"] * f["bytes"] for f in files if f["bytes"])
    assert bits == pytest.approx(report["bits_per_byte"] * report["bytes"], rel=1e-12, abs=0)
    cut, _ = _eval(capsys, folder, data, "--dtype", "float64", "--max-tokens", "50")   # only the files scored
    assert [f["path"] for f in cut["files"]] == ["a.txt"] and cut["files"][0]["tokens"] == 50
    assert "files" not in _eval(capsys, folder, data / "a.txt")[0]


def test_the_reports_keys_are_the_ones_docs_mamba2_lists(tmp_path, capsys):
    """docs/mamba2.md's table of eval's JSON keys is the report's keys, a folder's file entries included."""
    import re
    from pathlib import Path
    doc = (Path(__file__).parents[2] / "docs" / "mamba2.md").read_text(encoding="utf-8")
    table = doc[doc.index("| key | what |"):].split("\n\n", 1)[0]
    documented = {key for row in table.splitlines()[2:] for key in re.findall(r"`(\w+)`", row.split("|")[1])}
    folder, data = _folder(tmp_path), tmp_path / "texts"
    data.mkdir()
    (data / "a.txt").write_bytes(TEXT[:200])
    (data / "b.txt").write_bytes(TEXT[200:])
    report, _ = _eval(capsys, folder, data)
    assert set(report) == documented
    file_keys = re.search(r"each file's (.*) \|", table).group(1)
    assert set(report["files"][0]) == set(re.findall(r"`(\w+)`", file_keys))


# --- the --json file and the --data folder, found by an audit of eval (2026-12-06) ---------------------------

def _run_eval(folder, data, *extra) -> int:
    return cli.main(["eval", "--model", str(folder), "--data", str(data), "--no-progress", "--window", "40", *extra])


def test_a_report_inside_the_data_folder_is_left_out_of_the_next_evals_text(tmp_path, capsys):
    """eval --data D --json D/report.json scored its own last report on every run after the first: the same
    command gave 59, then 819, then 1,040 tokens."""
    folder, data = _folder(tmp_path), tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_bytes(TEXT)
    reports = []
    for _ in range(3):
        assert _run_eval(folder, data, "--json", str(data / "report.json")) == cli.EXIT_OK
        reports.append(json.loads((data / "report.json").read_text()))
    assert [r["tokens"] for r in reports] == [len(TEXT) - 1] * 3
    assert reports[-1]["data"] == f"{data} (1 text file, 1 eval report left out (report.json))"
    assert capsys.readouterr().out.count("1 eval report left out (report.json)") == 2
    corpus = load_corpus(data)                                           # train leaves it out too
    assert corpus.eval_reports == ("report.json",) and "1 eval report left out (report.json)" in corpus.describe()


def test_a_report_of_any_size_is_replaced_by_the_next_eval(tmp_path, capsys, monkeypatch):
    """A report over 1 MiB (a folder of thousands of files) was not recognised as eval's: the same command then
    refused to replace it ("exists and is not a report eval wrote")."""
    folder, data, out = _folder(tmp_path), tmp_path / "t.txt", tmp_path / "r.json"
    data.write_bytes(TEXT)
    assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_OK
    report = json.loads(out.read_text())
    out.write_text(scoring.report_text({**report, "padding": "x" * (2 << 20)}))   # as large as such a report
    assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_OK and "padding" not in json.loads(out.read_text())
    older = {k: v for k, v in report.items() if k != scoring.REPORT_MARK} | {scoring.REPORT_MARK: "tinygrad_ssm eval"}
    out.write_text(json.dumps(older, indent=1))                          # an earlier version's: its mark last
    assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_OK
    out.write_text(json.dumps({"mine": 1, "written_by": "someone"}))     # not a report: left as it is
    assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_USAGE
    assert json.loads(out.read_text()) == {"mine": 1, "written_by": "someone"}
    capsys.readouterr()


def test_json_with_a_tilde_is_written_where_it_was_checked(tmp_path, capsys, monkeypatch):
    """--json '~/r.json' was checked as $HOME/r.json and written to ./~/r.json (or failed after scoring)."""
    folder, data = _folder(tmp_path), tmp_path / "t.txt"
    data.write_bytes(TEXT)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "cwd" / "~").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert _run_eval(folder, data, "--json", "~/r.json") == cli.EXIT_OK
    assert json.loads((tmp_path / "home" / "r.json").read_text())["tokens"] == len(TEXT) - 1
    assert list((tmp_path / "cwd" / "~").iterdir()) == []
    capsys.readouterr()


def test_a_closed_stdout_does_not_lose_the_json_file(tmp_path, capsys, monkeypatch):
    """eval ... --json FILE | true: the broken pipe on stdout returned before FILE was written."""
    folder, data, out = _folder(tmp_path, dtype="float32"), tmp_path / "t.txt", tmp_path / "r.json"
    data.write_bytes(TEXT)

    def broken_pipe(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr("builtins.print", broken_pipe)
    monkeypatch.setattr(cli, "silence_stdout", lambda: None)
    monkeypatch.setattr(cli, "say_error", lambda message: said.append(message))
    said = []
    assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_IO
    assert json.loads(out.read_text())["tokens"] == len(TEXT) - 1
    assert said and f"the report was written to {out}" in said[0]


def test_a_folder_is_read_once_per_real_file_and_says_what_it_left_out(tmp_path, capsys):
    """A link to a file beside it was read twice (and train could put the two copies in training and validation);
    run folders were left out of eval's text without a word (train named them); a link to nothing was dropped."""
    from tinygrad_ssm.train.run_folder import claim_run_folder
    folder, data = _folder(tmp_path), tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_bytes(TEXT)
    (data / "b_link.txt").symlink_to(data / "a.txt")
    claim_run_folder(data / "run1").release()                            # a run folder of ours inside --data
    report, _ = _eval(capsys, folder, data)
    assert report["tokens"] == len(TEXT) - 1
    assert report["data"] == f"{data} (1 text file, 1 run folder left out (run1))"
    (data / "c.txt").write_bytes(TEXT[::-1])
    corpus = load_corpus(data, seed=0, val_fraction=0.5)
    assert sorted(corpus.train_files + corpus.val_files) == ["a.txt", "c.txt"]
    (data / "gone.txt").symlink_to(tmp_path / "missing.txt")
    assert _run_eval(folder, data) == cli.EXIT_USAGE
    assert "gone.txt': it is a symbolic link to" in capsys.readouterr().err
    with pytest.raises(Exception, match=r"gone.txt': it is a symbolic link to .*missing.txt', which does not exist; "
                                        r"remove the link or restore its file"):
        load_corpus(data)


def test_a_model_giving_nan_is_one_error_line_and_an_earlier_report_stays(tmp_path, capsys):
    """Weights holding NaN: eval exited 1 with no error line and wrote `"mean_nats": NaN` (not JSON) over the earlier
    report (found by a fuzz of the command line)."""
    from tinygrad_ssm.io.safetensors import load_file, save_file
    folder, data, out = _folder(tmp_path), tmp_path / "t.txt", tmp_path / "r.json"
    data.write_bytes(TEXT)
    assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_OK
    before = out.read_bytes()
    weights = load_file(folder / "model.safetensors")
    weights["backbone.norm_f.weight"][0] = np.nan                       # refused at load now, naming the tensor
    save_file(folder / "model.safetensors", weights)
    capsys.readouterr()
    assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_USAGE
    assert "tensor 'backbone.norm_f.weight' holds 1 non-finite value(s)" in capsys.readouterr().err
    assert out.read_bytes() == before
    weights["backbone.norm_f.weight"][:] = 3e38                         # finite weights whose logits overflow
    save_file(folder / "model.safetensors", weights)
    with warnings.catch_warnings(record=True) as said:                  # NumPy's, from the products' helper
        warnings.simplefilter("always")                                 # threads (np.errstate is per thread)
        assert _run_eval(folder, data, "--json", str(out)) == cli.EXIT_DIVERGED
    assert not [w for w in said if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in said]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "the model's loss on this text is nan" in lines[0] and "no report" in lines[0], lines
    assert out.read_bytes() == before
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        scoring.report_text({"mean_nats": math.nan})                     # never JSON that strict readers refuse


def test_the_report_names_the_checkpoint_it_scored_when_a_save_moves_latest_meanwhile(run, tmp_path, capsys,
                                                                                      monkeypatch):
    """eval resolved the run folder a second time after loading: a save meanwhile (a training writing to the run)
    named its newer checkpoint in the report, and compared the figure with that checkpoint's validation."""
    text = tmp_path / "text.txt"
    text.write_bytes(TEXT)
    latest = run / "checkpoints" / "LATEST"
    loaded = (run / "checkpoints" / latest.read_text().strip()).resolve()
    real_load = cli.load_model

    def load_then_latest_moves(*args, **kwargs):
        loaded_model = real_load(*args, **kwargs)
        latest.write_text("step-000001")                                # another checkpoint is LATEST now
        return loaded_model
    monkeypatch.setattr(cli, "load_model", load_then_latest_moves)
    report, _ = _eval(capsys, run, text)
    assert loaded.name == "step-000002" and Path(report["model"]).resolve() == loaded


@pytest.mark.parametrize("as_folder", [False, True], ids=["file", "folder"])
def test_a_bad_record_anywhere_stops_eval_before_it_scores(tmp_path, capsys, monkeypatch, as_folder):
    """eval read a .jsonl file's records as it scored them: a last record without "text" stopped a million-record
    eval after 146 s of scoring, no report (found by an audit; train reads them all first). Now every record is
    read before the first window is scored."""
    from tinygrad_ssm.train import scoring
    folder, data = _folder(tmp_path), tmp_path / "data"
    data.mkdir()
    records = data / "records.jsonl"
    records.write_text("".join(json.dumps({"text": f"line {i}: the quick brown fox"}) + "\n" for i in range(50)) +
                       json.dumps({"body": "no text"}) + "\n")
    scored = []
    monkeypatch.setattr(scoring, "evaluate_pieces", lambda *a, **k: scored.append(1) or (_ for _ in ()).throw(
        AssertionError("scored before the records were checked")))
    assert _run_eval(folder, data if as_folder else records) == cli.EXIT_USAGE
    assert 'line 51 has no "text" field' in capsys.readouterr().err and not scored


def test_a_text_the_tokenizer_cannot_take_in_pieces_is_one_error_line(bpe_tokenizer, tmp_path, capsys, monkeypatch):
    """A stretch with no place to cut past the limit (tokenizer.MAX_WHOLE_BYTES) ended eval with a traceback."""
    from tinygrad_ssm import tokenizer as tokenizer_module
    monkeypatch.setattr(tokenizer_module, "PIECE_BYTES", 64)
    monkeypatch.setattr(tokenizer_module, "MAX_WHOLE_BYTES", 1000)
    folder, text = _folder(tmp_path, vocab_size=320, tokenizer_json=bpe_tokenizer), tmp_path / "one_line.txt"
    text.write_bytes(b"word " * 400)
    assert _run_eval(folder, text) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--data {str(text)!r}: from byte 0 of the text on" in err and "Traceback" not in err, err


def test_a_text_too_big_to_read_whole_is_one_error_line_and_document_end_eos_reads_each_file(tmp_path, capsys,
                                                                                           monkeypatch):
    """A tokenizer with no cut rule reads a text whole: one past the memory available is refused in one line naming
    the fix (tokenizer.WHOLE_TEXT_BYTES_PER_BYTE), and the fix, each file a text of its own, is taken."""
    from tests.support.tokenizers import train_byte_fallback
    from tinygrad_ssm import tokenizer as tokenizer_module
    tokenizer_json = train_byte_fallback(["line one\nline two\n" * 20], tmp_path / "tok") / "tokenizer.json"
    folder, data = _folder(tmp_path, vocab_size=320, tokenizer_json=tokenizer_json), tmp_path / "data"
    data.mkdir()
    for name in ("a.txt", "b.txt"):
        (data / name).write_bytes(b"line one\n" * 70)                            # 630 bytes each
    monkeypatch.setattr(tokenizer_module, "PIECE_BYTES", 64)
    monkeypatch.setattr(tokenizer_module, "available_memory", lambda: 1000 * tokenizer_module.WHOLE_TEXT_BYTES_PER_BYTE)
    assert _run_eval(folder, data) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "a text of 0 MB to tokenize whole" in err and "--document-end eos" in err and "Traceback" not in err, err
    report, _ = _eval(capsys, folder, data, "--document-end", "eos")
    tok = FileTokenizer(tokenizer_json)
    assert report["tokens"] == 2 * (len(tok.encode_bytes(b"line one\n" * 70)) + 1) - 1     # each file, an EOS after
