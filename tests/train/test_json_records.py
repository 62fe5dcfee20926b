"""A .jsonl file of --data is JSON Lines: each record's "text" (--text-field) is a document, split into training
and validation as a folder's files are, each followed by the EOS token with --document-end eos; eval reads the
records' texts in order. Its JSON is never read as text, and a line that is not a record with that field is
named with the fix. generate --batch-file reads its .jsonl prompts through the same reader."""
import json

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tests.support.training import TINY, quiet
from tinygrad_ssm.models.mamba2 import Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.evaluation import evaluate
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.data import DataError, load_corpus, tokenize
from tinygrad_ssm.train.generate import read_batch_file
from tinygrad_ssm.train.json_records import record_texts
from tinygrad_ssm.train.loop import TrainConfig, train

# texts a JSON string holds as they are and str.splitlines would cut (U+2028, U+0085), quotes, newlines, non-ASCII
TEXTS = ["first record: the quick brown fox\n", 'a "quoted" line\u2028and the next', "caf\u00e9 \u0085 na\u00efve",
         "", "line %d of a longer record, with\ttabs and \\ backslashes\n" * 12, "short", "\U0001f600 emoji",
         "the last record"]


def _write(path, records, field="text", ensure_ascii=False, newline="\n"):
    path.write_text(newline.join(json.dumps({"id": i, field: t}, ensure_ascii=ensure_ascii)
                                 for i, t in enumerate(records)) + newline, encoding="utf-8", newline="")
    return path


@given(texts=st.lists(st.text(max_size=40), max_size=8), ensure_ascii=st.booleans(), crlf=st.booleans(),
       blank_lines=st.lists(st.integers(0, 8), max_size=3), bom=st.booleans())
def test_each_records_text_is_read_whole_in_order(texts, ensure_ascii, crlf, blank_lines, bom):
    newline = "\r\n" if crlf else "\n"
    lines = [json.dumps({"text": t, "n": i}, ensure_ascii=ensure_ascii) for i, t in enumerate(texts)]
    for at in sorted(blank_lines, reverse=True):
        lines.insert(min(at, len(lines)), "  ")
    data = (b"\xef\xbb\xbf" if bom else b"") + newline.join(lines).encode("utf-8")
    got = list(record_texts(data.splitlines(keepends=True), "text", "f.jsonl"))
    assert [text for _, text in got] == [t.encode("utf-8") for t in texts]
    assert [lines[number - 1] for number, _ in got] == [ln for ln in lines if ln.strip()]   # each at its own line


def test_records_are_split_as_a_folders_files(tmp_path):
    """The records of one .jsonl file give the streams a folder of the same texts as files (in the same order) gives:
    the seeded shuffle and the validation share count documents; an empty record is left out as an empty file is."""
    data = _write(tmp_path / "data.jsonl", TEXTS)
    folder = tmp_path / "folder"
    folder.mkdir()
    for i, text in enumerate(TEXTS):
        (folder / f"{i:03d}.txt").write_bytes(text.encode())
    for seed in (0, 1, 2):
        records, files = load_corpus(data, seed=seed, val_fraction=0.25), load_corpus(folder, seed=seed,
                                                                                       val_fraction=0.25)
        np.testing.assert_array_equal(records.train, files.train)
        np.testing.assert_array_equal(records.val, files.val)
        assert records.train_file_sizes == files.train_file_sizes and records.val_file_sizes == files.val_file_sizes
        lines = [int(name.split(":")[1]) for name in records.val_files]  # a record is named by its line
        assert [f"{n - 1:03d}.txt" for n in lines] == list(files.val_files)
    assert records.unit == "record"
    assert records.describe().endswith("5 train records (%s bytes), 2 validation records (%s bytes)" % (
        f"{len(records.train):,}", f"{len(records.val):,}"))
    assert b'"text"' not in records.train.tobytes() + records.val.tobytes()   # no JSON read as text


def test_a_folder_mixes_files_and_records_and_one_record_is_split_by_bytes(tmp_path):
    _write(tmp_path / "a.jsonl", TEXTS[:3])
    (tmp_path / "b.txt").write_text("a plain text file\n" * 5)
    corpus = load_corpus(tmp_path, val_fraction=0.3)
    assert corpus.unit == "document" and len(corpus.train_files) + len(corpus.val_files) == 4
    assert sorted(corpus.train_files + corpus.val_files) == ["a.jsonl:1", "a.jsonl:2", "a.jsonl:3", "b.txt"]
    one = load_corpus(_write(tmp_path / "one.jsonl", [TEXTS[4]]), val_fraction=0.1)
    text = TEXTS[4].encode()
    assert one.train.tobytes() + one.val.tobytes() == text and len(one.val) == int(len(text) * 0.1)
    assert one.train_files == one.val_files == ("one.jsonl:1",) and one.train_file_sizes == ()


def test_text_field_names_the_records_field(tmp_path):
    data = _write(tmp_path / "data.jsonl", TEXTS, field="content")
    with pytest.raises(DataError, match=r"data.jsonl' line 1 has no \"text\" field \(its fields: \"id\", "
                                        r"\"content\"\); give --text-field the name of the field that holds the text "
                                        r"\(or, to read the file as plain text, give it another suffix, e.g. .txt\)"):
        load_corpus(data)
    corpus = load_corpus(data, text_field="content")
    assert len(corpus.train) + len(corpus.val) == sum(len(t.encode()) for t in TEXTS)
    with pytest.raises(DataError, match=r"line 1 has no \"body\" field .* check --text-field"):
        load_corpus(data, text_field="body")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.txt").write_text("text")
    with pytest.raises(DataError, match=r"--text-field names the field of the records of a .jsonl file \(or of a "
                                        r".json file given as the path itself\) .* holds no such file; leave "
                                        r"--text-field out"):
        load_corpus(tmp_path / "plain", text_field="content")


@pytest.mark.parametrize("line, message", [
    (b'{"text": "ok"', r"line 2 is not JSON \(Expecting ',' delimiter\); a .jsonl file holds one JSON object a line "
                      r"\(to read the file as plain text, give it another suffix, e.g. .txt\)"),
    (b'["a", "b"]', r'line 2 is a JSON array, not an object \{"text": "..."\}'),
    (b'"just a string"', r'line 2 is a JSON string, not an object'),
    (b'{"text": null}', r'line 2: its "text" is a JSON null, not a string'),
    (b'{"text": ["a"]}', r'line 2: its "text" is a JSON array, not a string'),
    (b'{"text": "\\udc80 alone"}', r'line 2: its "text" holds an unpaired surrogate \(\\udc80\), which is no '
                                   r'character'),
    (b'{"text": "caf\xe9"}', r"line 2 is not UTF-8; convert the file to UTF-8"),
])
def test_a_bad_line_is_named_with_the_fix(tmp_path, line, message):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"text": "a good first record"}\n' + line + b'\n{"text": "never read"}\n')
    with pytest.raises(DataError, match=f"--data file '{path}' " + message):
        load_corpus(path)


def test_a_utf16_file_is_named(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes('{"text": "a"}\n{"text": "b"}\n'.encode("utf-16"))
    with pytest.raises(DataError, match=r"data.jsonl' is UTF-16 .* convert it to UTF-8"):
        load_corpus(path)


def test_a_file_of_empty_records_holds_no_text(tmp_path):
    with pytest.raises(DataError, match=r"data.jsonl' holds no record with text in its 'text' field"):
        load_corpus(_write(tmp_path / "data.jsonl", ["", ""]))


def test_eos_after_each_record(tmp_path, bpe_tokenizer):
    tok = FileTokenizer(bpe_tokenizer)
    corpus = load_corpus(_write(tmp_path / "data.jsonl", TEXTS), val_fraction=0.25)
    ended = tokenize(corpus, tok, "eos")
    by_line = {i + 1: t.encode() for i, t in enumerate(TEXTS)}

    def spec(names):                                                     # each record's ids, then the EOS
        return np.concatenate([np.append(tok.encode_bytes(by_line[int(n.split(":")[1])]), tok.eos_token_id)
                               for n in names])
    np.testing.assert_array_equal(ended.train, spec(corpus.train_files))
    np.testing.assert_array_equal(ended.val, spec(corpus.val_files))
    assert "each record followed by the tokenizer's EOS token" in ended.describe()


SETTINGS = dict(TINY, dtype="float64", steps=2)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """A fine-tuning set as one .jsonl file: 40 records, their text in "content"."""
    root = tmp_path_factory.mktemp("records")
    texts = [f"record {k}: " + "the quick brown fox jumps\n" * (3 + k % 5) for k in range(40)]
    return _write(root / "set.jsonl", texts, field="content"), texts


@pytest.fixture(scope="module")
def record_run(records, bpe_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("record_run") / "run"
    overrides = {"tokenizer": str(bpe_tokenizer), "document_end": "eos", "text_field": "content"}
    result = train(TrainConfig(**SETTINGS, data=str(records[0]), out=str(out), **overrides), overrides=overrides,
                   progress=False, say=quiet)
    assert result.status == "done"
    return out


def test_a_run_on_records_and_eval_of_its_split(record_run, records, bpe_tokenizer, capsys):
    state = json.loads((record_run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert state["train_config"]["text_field"] == "content"
    tok = FileTokenizer(bpe_tokenizer)
    corpus = load_corpus(records[0], text_field="content")
    assert len(corpus.val_files) == 2
    val = np.concatenate([np.append(tok.encode_bytes(records[1][int(n.split(":")[1]) - 1].encode()),
                                    tok.eos_token_id) for n in corpus.val_files])
    model = Mamba2LMHeadModel.from_pretrained(record_run, dtype="float64")
    assert cli.main(["eval", "--model", str(record_run), "--json", "-", "--no-progress", "--dtype", "float64"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == len(val) - 1
    assert report["mean_nats"] == pytest.approx(evaluate(model, val, 512).mean_nats, rel=1e-12)
    assert "(2 records, each followed by the EOS token, as the run split it)" in report["data"]
    assert cli.main(["eval", "--model", str(record_run), "--training-windows", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["bits_per_byte"] == state["val_bpb"]   # to the bit (float64)
    code = cli.main(["train", "--resume", str(record_run), "--text-field", "text", "--no-progress"])
    assert code != cli.EXIT_OK
    assert "--text-field (saved 'content', given 'text')" in capsys.readouterr().err


def test_eval_of_a_jsonl_file_reads_its_records_in_order(record_run, records, bpe_tokenizer, tmp_path, capsys):
    """eval --data FILE.jsonl scores the records' texts joined (the default) or each followed by the EOS; a folder
    holding it gives it one entry of "files"."""
    path, texts = records
    tok = FileTokenizer(bpe_tokenizer)
    model = Mamba2LMHeadModel.from_pretrained(record_run, dtype="float64")
    common = ["--json", "-", "--no-progress", "--dtype", "float64", "--window", "64", "--text-field", "content"]
    joined = tok.encode_bytes("".join(texts).encode())
    assert cli.main(["eval", "--model", str(record_run), "--data", str(path), *common]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == len(joined) - 1
    assert report["mean_nats"] == pytest.approx(evaluate(model, joined, 64).mean_nats, rel=1e-12)
    ended = np.concatenate([np.append(tok.encode_bytes(t.encode()), tok.eos_token_id) for t in texts])
    assert cli.main(["eval", "--model", str(record_run), "--data", str(path), "--document-end", "eos",
                     *common]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == len(ended) - 1 and report["data"].endswith("(each record followed by the EOS token)")
    assert report["mean_nats"] == pytest.approx(evaluate(model, ended, 64).mean_nats, rel=1e-12)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "set.jsonl").write_bytes(path.read_bytes())
    (folder / "z.txt").write_text("a plain file at the end\n")
    assert cli.main(["eval", "--model", str(record_run), "--data", str(folder), "--document-end", "eos",
                     *common]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    both = np.concatenate([ended, tok.encode_bytes(b"a plain file at the end\n"), [tok.eos_token_id]])
    assert report["tokens"] == len(both) - 1 and [f["path"] for f in report["files"]] == ["set.jsonl", "z.txt"]
    assert sum(f["tokens"] for f in report["files"]) == report["tokens"]
    assert "each file and .jsonl record followed by the EOS token" in report["data"]


def test_eval_refuses_text_field_where_it_means_nothing(record_run, corpus, capsys):
    assert cli.main(["eval", "--model", str(record_run), "--text-field", "content"]) == cli.EXIT_USAGE
    assert "--text-field applies to --data" in capsys.readouterr().err
    assert cli.main(["eval", "--model", str(record_run), "--data", str(corpus), "--text-field", "content"]) != 0
    assert "holds no such file; leave --text-field out" in capsys.readouterr().err


def test_a_text_batch_file_is_cut_at_newlines_alone(tmp_path):
    """splitlines cut a plain-text --batch-file at U+2028, form feeds and \\x1c-\\x1e too: 3 lines (wc -l) gave 5
    prompts, numbered with lines the file does not have."""
    path = tmp_path / "prompts.txt"
    path.write_bytes("first\r\nsecond\u2028half of second\n\nthird \x0c page\n".encode())
    assert read_batch_file(str(path)) == (["first", "second\u2028half of second", "third \x0c page"], [1, 2, 4])


def test_batch_file_records_keep_a_line_separator_inside_a_prompt(tmp_path):
    path = _write(tmp_path / "prompts.jsonl", ["one\u2028prompt", "two\u0085still two"], field="prompt")
    assert read_batch_file(str(path)) == (["one\u2028prompt", "two\u0085still two"], [1, 2])
    path.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match=r"line 2 has no \"prompt\" field \(its fields: \"text\"\); each record "
                                         r"must be an object \{\"prompt\": \"text\"\}"):
        read_batch_file(str(path))


def test_a_broken_jsonl_file_in_a_folder_is_named_by_train_and_eval_alike(record_run, tmp_path, capsys):
    """A NUL byte makes a text file binary (left out, and counted); in a .jsonl file it is a line that is not JSON,
    named by train and eval alike rather than skipped by one of them."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.txt").write_text("a plain text file\n" * 4)
    (folder / "b.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "a NUL \x00 inside"}\n')
    with pytest.raises(DataError, match=r"b.jsonl' line 2 is not JSON"):
        load_corpus(folder)
    assert cli.main(["eval", "--model", str(record_run), "--data", str(folder), "--no-progress"]) != cli.EXIT_OK
    assert "b.jsonl' line 2 is not JSON" in capsys.readouterr().err


# --- a .json file given as the path itself: a JSON array of records, or JSON Lines ------------------------------------

def _write_array(path, records, field="text", indent=2, before=""):
    path.write_text(before + json.dumps([{"id": i, field: t} for i, t in enumerate(records)], indent=indent,
                                        ensure_ascii=False), encoding="utf-8")
    return path


@given(texts=st.lists(st.text(max_size=40), max_size=8), indent=st.sampled_from([None, 0, 1, 4]),
       before=st.sampled_from(["", "\n\n", "  \n\t"]), bom=st.booleans())
def test_a_json_arrays_records_are_read_whole_in_order_each_at_its_line(texts, indent, before, bom):
    data = (b"\xef\xbb\xbf" if bom else b"") + (before + json.dumps([{"n": i, "text": t} for i, t in enumerate(texts)],
                                                                    indent=indent, ensure_ascii=False)).encode("utf-8")
    got = list(record_texts(data.splitlines(keepends=True), "text", "f.json", suffix=".json"))
    assert [text for _, text in got] == [t.encode("utf-8") for t in texts]
    lines = data.decode("utf-8-sig").split("\n")
    for k, (number, _) in enumerate(got):                                # each named by the line its object opens on
        opened = [i + 1 for i, line in enumerate(lines) if '{"n": ' in line or line.strip() == "{"]
        assert number == (opened[k] if indent is not None else len(before.split("\n")))


def test_a_json_file_gives_the_corpus_of_the_same_records_as_json_lines(tmp_path):
    """A JSON array and JSON Lines (what datasets' to_json writes, also under .json) give the split a .jsonl file of
    the same records gives, to the byte; an array's records are named by the line each opens on."""
    lines = load_corpus(_write(tmp_path / "set.jsonl", TEXTS), val_fraction=0.25)
    array = load_corpus(_write_array(tmp_path / "set.json", TEXTS, indent=None), val_fraction=0.25)
    also_lines = load_corpus(_write(tmp_path / "lines.json", TEXTS), val_fraction=0.25)
    for corpus in (array, also_lines):
        np.testing.assert_array_equal(corpus.train, lines.train)
        np.testing.assert_array_equal(corpus.val, lines.val)
        assert corpus.train_file_sizes == lines.train_file_sizes and corpus.unit == "record"
    assert also_lines.val_files == tuple(n.replace("set.jsonl", "lines.json") for n in lines.val_files)
    assert all(n.endswith(":1") for n in array.train_files + array.val_files)     # one line: every record on it
    pretty = load_corpus(_write_array(tmp_path / "pretty.json", TEXTS, indent=2), val_fraction=0.25)
    np.testing.assert_array_equal(pretty.train, lines.train)
    text = (tmp_path / "pretty.json").read_text().split("\n")
    for name in pretty.train_files + pretty.val_files:                  # the object that opens on that line holds it
        assert text[int(name.split(":")[1]) - 1].strip() == "{"
    assert b'"text"' not in pretty.train.tobytes() + pretty.val.tobytes()


@pytest.mark.parametrize("content, message", [
    ('{\n  "version": 1,\n  "data": [{"text": "a"}]\n}\n',
     r"is one JSON object \(its fields: \"version\", \"data\"\), not records: a .json file holds a JSON array of "
     r"objects, or one JSON object a line; where the records are a list in one field, write that list to the file"),
    ('[\n  {"text": "a"},\n  "b"\n]', r'line 3 is a JSON string, not an object \{"text": "..."\}'),
    ('[\n  {"text": "a"},\n  {"body": "b"}\n]',
     r'line 3 has no "text" field \(its fields: "body"\); give --text-field'),
    ('[\n  {"text": "a"},\n  {"text": 7}\n]', r'line 3: its "text" is a JSON number, not a string'),
    ('[\n  {"text": "a"},\n  {"text": "b"},\n]', r"line 4 is not JSON \(Expecting value\); a .json file holds a JSON "
                                               r"array of objects, or one JSON object a line"),
    ('[\n  {"text": "a"}\n  {"text": "b"}\n]', r"line 3: its array goes on without a ',' between two items, or ends "
                                              r"without a '\]'"),
    ('[\n  {"text": "a"},\n  {"text": "b"}\n', r"line 4: its array goes on without a ',' between two items, or ends "
                                              r"without a '\]'"),
    ('[{"text": "a"}]\n[{"text": "b"}]\n', r"line 2 holds more after the array's closing '\]'"),
    ('{"text": "a"}\n{"text": "b"\n', r"line 2 is not JSON \(Expecting ',' delimiter\); a .json file holds a JSON "
                                     r"array of objects, or one JSON object a line \(to read the file as plain text, "
                                     r"give it another suffix, e.g. .txt\)"),
])
def test_a_bad_json_file_is_named_with_the_line_and_the_fix(tmp_path, content, message):
    path = tmp_path / "data.json"
    path.write_text(content)
    with pytest.raises(DataError, match=f"--data file '{path}' " + message):
        load_corpus(path)


def test_a_json_file_not_utf8_and_an_empty_array(tmp_path):
    path = tmp_path / "data.json"
    path.write_bytes(b'[\n  {"text": "ok"},\n  {"text": "caf\xe9"}\n]\n')
    with pytest.raises(DataError, match=r"data.json' line 3 is not UTF-8; convert the file to UTF-8"):
        load_corpus(path)
    path.write_text("[]\n")
    with pytest.raises(DataError, match=r"data.json' holds no record with text in its 'text' field"):
        load_corpus(path)


def test_a_json_file_in_a_folder_is_text_and_said_so(tmp_path, record_run, capsys):
    """In a --data folder a .json file is a text file (a code folder's package.json), and train's corpus line and
    eval's description say it was read so."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "package.json").write_text('{\n  "name": "x",\n  "version": "1.0.0"\n}\n')
    (folder / "index.js").write_text("console.log('hello');\n" * 5)
    corpus = load_corpus(folder, val_fraction=0.5)
    assert corpus.unit == "file" and sorted(corpus.train_files + corpus.val_files) == ["index.js", "package.json"]
    assert b'"version": "1.0.0"' in corpus.train.tobytes() + corpus.val.tobytes()
    note = "1 .json file read as text, not as records (package.json; give a file of records as --data itself"
    assert note in corpus.describe()
    assert cli.main(["eval", "--model", str(record_run), "--data", str(folder), "--json", "-", "--no-progress"]) == 0
    assert note in json.loads(capsys.readouterr().out)["data"]


def test_eval_and_batch_file_read_a_json_array_as_its_records(record_run, records, tmp_path, capsys):
    path, texts = records
    array = _write_array(tmp_path / "set.json", texts, field="content")
    common = ["--json", "-", "--no-progress", "--dtype", "float64", "--window", "64", "--text-field", "content"]
    reports = []
    for data in (path, array):
        assert cli.main(["eval", "--model", str(record_run), "--data", str(data), "--document-end", "eos",
                         *common]) == cli.EXIT_OK
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[1]["tokens"] == reports[0]["tokens"] and reports[1]["mean_nats"] == reports[0]["mean_nats"]
    assert reports[1]["data"].endswith("(each record followed by the EOS token)")
    prompts = ["one\u2028prompt", "two\nlines", "three"]
    batch = _write_array(tmp_path / "prompts.json", prompts, field="prompt")
    assert read_batch_file(str(batch)) == (prompts, [2, 6, 10])       # each at the line its object opens on
    assert read_batch_file(str(_write(tmp_path / "lines.json", prompts, field="prompt"))) == (prompts, [1, 2, 3])
    batch.write_text('[{"prompt": "a"}, {"text": "b"}]')
    with pytest.raises(ValueError, match=r"prompts.json' line 1 has no \"prompt\" field \(its fields: "
                                         r"\"text\"\); each record must be an object \{\"prompt\": \"text\"\}"):
        read_batch_file(str(batch))


def test_records_in_a_list_field_are_named_with_the_fix(tmp_path):
    """A file that holds its records in one field's list (SQuAD's {"data": [...]}) is refused, and the error says
    where the records are; a list of strings is no such hint."""
    for suffix in (".json", ".jsonl"):
        path = tmp_path / ("data" + suffix)
        path.write_text('{"version": 2, "data": [{"text": "a"}, {"text": "b"}]}\n')
        with pytest.raises(DataError, match=r"line 1 has no \"text\" field \(its fields: \"version\", \"data\"; "
                                            r"\"data\" holds a list of objects: where those are the records, write "
                                            r"that list to the file\); give --text-field"):
            load_corpus(path)
    path.write_text('{"tags": ["a", "b"]}\n')
    with pytest.raises(DataError) as refused:
        load_corpus(path)
    assert "holds a list of objects" not in str(refused.value)
