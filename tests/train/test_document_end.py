"""train --document-end eos: each file of a --data folder tokenized alone and followed by the tokenizer's EOS token
(as Mamba's pretraining data marks where a document ends), in both splits; eval of the run's split (carried state
and --training-windows) reads the same ids; refused, with the fix, where there is no EOS token or no file ends."""
import json

import numpy as np
import pytest

from tests.support.tokenizers import corpus_texts, train_byte_fallback
from tests.support.training import TINY, quiet
from tinygrad_ssm.models.mamba2 import Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.evaluation import evaluate
from tinygrad_ssm.tokenizer import ByteTokenizer, FileTokenizer, load_tokenizer
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.data import DataError, document_ids, load_corpus, split_ids, tokenize
from tinygrad_ssm.train.loop import TrainConfig, train

SETTINGS = dict(TINY, dtype="float64", steps=2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Eight text files of different lengths: seven to train on, one to validate on."""
    root = tmp_path_factory.mktemp("documents")
    for k in range(8):
        lines = b"".join(b"doc %d line %d: the quick brown fox\n" % (k, i) for i in range(30 + 7 * k))
        (root / f"doc{k}.txt").write_bytes(lines)
    return root


def _each_file_then_eos(tok, names, root) -> np.ndarray:
    """The spec: each file's own encode_bytes (read from disk, in the split's order), then the EOS id."""
    ids = [np.append(tok.encode_bytes((root / name).read_bytes()), tok.eos_token_id) for name in names]   # (each n + 1,)
    return np.concatenate(ids)


def test_each_file_is_tokenized_alone_and_followed_by_eos(folder, bpe_tokenizer):
    tok = FileTokenizer(bpe_tokenizer)
    corpus = load_corpus(folder)
    assert len(corpus.val_files) == 1 and len(corpus.train_files) == 7
    ended = tokenize(corpus, tok, "eos")
    np.testing.assert_array_equal(ended.train, _each_file_then_eos(tok, corpus.train_files, folder))
    np.testing.assert_array_equal(ended.val, _each_file_then_eos(tok, corpus.val_files, folder))
    assert ended.document_end == "eos" and (ended.train == tok.eos_token_id).sum() == 7
    assert ended.describe().endswith("; each file followed by the tokenizer's EOS token (--document-end eos)")
    assert "EOS" not in tokenize(corpus, tok).describe()
    assert ended.val_tokens_per_byte == len(ended.val) / len(corpus.val)   # the EOS counted: bits per byte of the split
    joined = tokenize(corpus, tok)                                       # the default: the files as one text
    np.testing.assert_array_equal(joined.train, tok.encode_bytes(corpus.train.tobytes()))
    assert (joined.train == tok.eos_token_id).sum() == 0


def test_the_eos_ends_where_its_file_does_and_covers_no_byte(folder, bpe_tokenizer):
    tok = FileTokenizer(bpe_tokenizer)
    texts = [(folder / f"doc{k}.txt").read_bytes() for k in (2, 0, 5)]
    pieces = list(document_ids(tok, texts))
    ids = np.concatenate([i for i, _ in pieces])
    ends = np.concatenate([e for _, e in pieces])
    file_ends = np.cumsum([len(t) for t in texts])
    at_eos = np.flatnonzero(ids == tok.eos_token_id)
    np.testing.assert_array_equal(ends[at_eos], file_ends)              # each EOS ends with its file
    np.testing.assert_array_equal(ends[at_eos - 1], file_ends)          # the token before it too: no byte between
    assert (np.diff(ends) >= 0).all() and ends[-1] == file_ends[-1]


@pytest.mark.parametrize("template, first, appended", [("bos", 1, 0), ("eos", None, 1)])
def test_a_post_processors_tokens_are_each_files_and_its_eos_is_not_doubled(folder, tmp_path, template, first,
                                                                             appended):
    """A Llama-style tokenizer's <s> starts every file (each is encoded as transformers encodes a text); one whose
    post_processor appends </s> already ends each file with it, and no second one is added."""
    texts = corpus_texts(*sorted(folder.iterdir()))
    tok = load_tokenizer(train_byte_fallback(texts, tmp_path / "tok", template=template))
    corpus = load_corpus(folder)
    ids = split_ids(corpus.train, corpus.train_file_sizes, tok, "eos")
    eos = tok.eos_token_id
    assert eos == 2 and (ids == eos).sum() == 7 and ids[-1] == eos
    assert not np.any((ids[:-1] == eos) & (ids[1:] == eos))             # never two in a row
    starts = np.concatenate([[0], np.flatnonzero(ids == eos)[:-1] + 1])  # where each file's ids begin
    if first is not None:
        assert (ids[starts] == first).all()


def test_refused_without_an_eos_token_or_a_file_that_ends(folder, corpus, bpe_tokenizer, tmp_path):
    with pytest.raises(DataError, match="a byte-level run has no EOS token .* give --tokenizer PATH or --init-from"):
        tokenize(load_corpus(folder), ByteTokenizer(), "eos")
    tok = FileTokenizer(bpe_tokenizer)
    with pytest.raises(DataError, match=r"--document-end eos marks where each file of a --data folder \(each record of a "
                                        r"\.jsonl or \.json file\) ends; .* is "
                                        r"one text, split by bytes"):
        tokenize(load_corpus(corpus), tok, "eos")
    tok = load_tokenizer(_word_level_without_specials(tmp_path / "words.json"))
    assert tok.eos_token_id is None
    with pytest.raises(DataError, match=r"the tokenizer '.*words.json' has no EOS token .* leave --document-end out"):
        tokenize(load_corpus(folder), tok, "eos")
    with pytest.raises(DataError, match="--document-end must be one of none, eos, got 'eod'"):
        tokenize(load_corpus(folder), FileTokenizer(bpe_tokenizer), "eod")


def _word_level_without_specials(path):
    """A tokenizer.json with no special token at all: a word per id, anything else unknown."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"unknown": 0, "doc": 1, "line": 2, "the": 3}, unk_token="unknown"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def ended_run(folder, bpe_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("ended") / "run"
    result = train(TrainConfig(**SETTINGS, data=str(folder), out=str(out), tokenizer=str(bpe_tokenizer),
                               document_end="eos"),
                   overrides={"tokenizer": str(bpe_tokenizer), "document_end": "eos"}, progress=False, say=quiet)
    assert result.status == "done"
    return out


def test_the_run_keeps_the_setting_and_eval_reads_the_split_as_training_did(ended_run, folder, bpe_tokenizer, capsys):
    state = json.loads((ended_run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert state["train_config"]["document_end"] == "eos"
    tok = FileTokenizer(bpe_tokenizer)
    corpus = load_corpus(folder)
    val = _each_file_then_eos(tok, corpus.val_files, folder)
    model = Mamba2LMHeadModel.from_pretrained(ended_run, dtype="float64")
    assert cli.main(["eval", "--model", str(ended_run), "--json", "-", "--no-progress", "--dtype", "float64"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    want = evaluate(model, val, 512)                                     # the split's ids with their EOS
    assert report["tokens"] == want.tokens == len(val) - 1
    assert report["mean_nats"] == pytest.approx(want.mean_nats, rel=1e-12)
    assert report["bytes"] == len(corpus.val) - len(tok.decode(val[:1]).encode())   # the EOS covers no byte
    assert "each followed by the EOS token" in report["data"]
    assert cli.main(["eval", "--model", str(ended_run), "--training-windows", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bits_per_byte"] == state["val_bpb"]                  # to the bit (float64)
    assert "(1 file, each followed by the EOS token, as the run split it)" in report["data"]


def test_resume_keeps_it_and_refuses_to_change_it(ended_run, tmp_path, capsys):
    code = cli.main(["train", "--resume", str(ended_run), "--document-end", "none", "--no-progress"])
    assert code != cli.EXIT_OK
    assert "--document-end (saved 'eos', given 'none')" in capsys.readouterr().err


def test_the_flag_without_a_tokenizer_is_refused_before_training(folder, tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["train", "--data", str(folder), "--document-end", "eos", "--out", str(out), "--steps", "1",
                     "--no-progress"])
    assert code != cli.EXIT_OK
    assert "a byte-level run has no EOS token" in capsys.readouterr().err
    assert not (out / "checkpoints").exists()


def test_eval_of_a_folder_with_eos_after_each_file(ended_run, folder, bpe_tokenizer, capsys):
    """eval --data FOLDER --document-end eos scores what training would read from the folder: each file's ids then
    the EOS (here all eight files, in sorted order), the state carried across; each file's figures hold its EOS."""
    tok = FileTokenizer(bpe_tokenizer)
    names = sorted(p.name for p in folder.iterdir())
    ids = _each_file_then_eos(tok, names, folder)
    model = Mamba2LMHeadModel.from_pretrained(ended_run, dtype="float64")
    want = evaluate(model, ids, 64)
    assert cli.main(["eval", "--model", str(ended_run), "--data", str(folder), "--document-end", "eos", "--json", "-",
                     "--no-progress", "--dtype", "float64", "--window", "64"]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == want.tokens and report["mean_nats"] == pytest.approx(want.mean_nats, rel=1e-12)
    assert "8 text files, each followed by the EOS token" in report["data"]
    files = report["files"]
    assert [f["path"] for f in files] == names
    ends = np.flatnonzero(ids == tok.eos_token_id)                       # (8,) where each file's EOS is
    counts = np.diff(np.concatenate([[0], ends + 1]))                    # each file's ids with its EOS
    counts[0] -= 1                                                       # the first token is predicted by nothing
    assert [f["tokens"] for f in files] == list(counts)
    assert sum(f["bytes"] for f in files) == report["bytes"]
    assert cli.main(["eval", "--model", str(ended_run), "--data", str(folder), "--json", "-", "--no-progress",
                     "--dtype", "float64", "--window", "64"]) == cli.EXIT_OK
    joined = json.loads(capsys.readouterr().out)                         # the default: one text, no EOS
    assert joined["tokens"] == len(tok.encode_bytes(b"".join((folder / n).read_bytes() for n in names))) - 1


def test_eval_of_one_file_with_eos_and_the_flags_misuse(ended_run, stopped_run, corpus, bpe_tokenizer, capsys):
    tok = FileTokenizer(bpe_tokenizer)
    ids = np.append(tok.encode_bytes(corpus.read_bytes()), tok.eos_token_id)
    model = Mamba2LMHeadModel.from_pretrained(ended_run, dtype="float64")
    assert cli.main(["eval", "--model", str(ended_run), "--data", str(corpus), "--document-end", "eos", "--json", "-",
                     "--no-progress", "--dtype", "float64"]) == cli.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == len(ids) - 1
    assert report["mean_nats"] == pytest.approx(evaluate(model, ids, 512).mean_nats, rel=1e-12)
    assert cli.main(["eval", "--model", str(ended_run), "--document-end", "eos"]) == cli.EXIT_USAGE
    assert "--document-end applies to --data" in capsys.readouterr().err
    assert cli.main(["eval", "--model", str(stopped_run), "--data", str(corpus), "--document-end", "eos"]) != 0
    assert "reads bytes, which have no EOS token; leave --document-end out" in capsys.readouterr().err
