"""train --val-data PATH: validate on a text file or folder of the user's (transformers' run_clm --validation_file)
and train on all of --data; eval of such a run reads the same validation text; refused where it would hold text
that is trained on, beside --val-fraction, or changed on --resume."""
import json
import os
import shutil

import numpy as np
import pytest

from tests.support.training import TINY, quiet
from tinygrad_ssm.models.mamba2 import Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.evaluation import evaluate
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.data import DataError, load_corpus, tokenize
from tinygrad_ssm.train.loop import TrainConfig, train

SETTINGS = dict(TINY, dtype="float64", steps=2)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """A training folder of five files and a validation file beside it (not inside)."""
    root = tmp_path_factory.mktemp("val_data")
    (root / "train").mkdir()
    for k in range(5):
        (root / "train" / f"t{k}.txt").write_bytes(b"".join(b"train %d line %d: the quick brown fox\n" % (k, i)
                                                            for i in range(20 + 3 * k)))
    (root / "val.txt").write_bytes(b"".join(b"held out line %d: over the lazy dog\n" % i for i in range(40)))
    return root


def test_all_of_data_is_trained_on_and_val_data_validated_on(texts):
    corpus = load_corpus(texts / "train", val_path=texts / "val.txt", val_fraction=0.5, seed=3)  # neither used
    names = sorted(p.name for p in (texts / "train").iterdir())
    assert corpus.train_files == tuple(names) and corpus.val_files == ("val.txt",)
    assert corpus.train.tobytes() == b"".join((texts / "train" / n).read_bytes() for n in names)
    assert corpus.val.tobytes() == (texts / "val.txt").read_bytes()
    assert corpus.train_file_sizes == tuple((texts / "train" / n).stat().st_size for n in names)
    assert corpus.val_source == str(texts / "val.txt")
    assert corpus.describe() == (f"{texts / 'train'}: 5 train files ({len(corpus.train):,} bytes); "
                                 f"{texts / 'val.txt'}: 1 validation file ({len(corpus.val):,} bytes)")
    one = load_corpus(texts / "train" / "t0.txt", val_path=texts / "val.txt")   # one file: not split by bytes
    assert one.train.tobytes() == (texts / "train" / "t0.txt").read_bytes()
    assert one.train_file_sizes == (len(one.train),)


def test_eos_after_the_training_file_and_each_validation_document(texts, bpe_tokenizer):
    """One --data file and a --val-data file are documents of their own: --document-end eos ends each."""
    tok = FileTokenizer(bpe_tokenizer)
    corpus = tokenize(load_corpus(texts / "train" / "t1.txt", val_path=texts / "val.txt"), tok, "eos")
    np.testing.assert_array_equal(corpus.train, np.append(tok.encode_bytes((texts / "train" / "t1.txt").read_bytes()),
                                                          tok.eos_token_id))
    np.testing.assert_array_equal(corpus.val, np.append(tok.encode_bytes((texts / "val.txt").read_bytes()),
                                                        tok.eos_token_id))


@pytest.mark.parametrize("data, val, where", [("train", "train", "is"), ("train", "train/t2.txt", "lies inside"),
                                              ("train/t2.txt", "train", "holds"),
                                              ("train/t2.txt", "train/t2.txt", "is")])
def test_validation_text_that_would_be_trained_on_is_refused(texts, data, val, where):
    with pytest.raises(DataError, match=f"--val-data '{texts / val}' {where} --data '{texts / data}': the validation "
                                        f"text would be trained on; give a --val-data outside --data"):
        load_corpus(texts / data, val_path=texts / val)


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
@pytest.mark.parametrize("side", ["val", "data"])
def test_a_file_read_by_both_sides_through_a_link_is_refused(texts, tmp_path, side, kind):
    """A --val-data folder holding a link to a --data file (or the reverse, or a hard link) was trained and validated
    on: only the two top paths were compared (found by an audit)."""
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "own.txt").write_bytes(b"another text, its own lines\n" * 20)
    target = texts / "train" / "t1.txt" if side == "val" else texts / "val.txt"
    link = folder / "linked.txt"
    link.symlink_to(target) if kind == "symlink" else os.link(target, link)
    data, val = (texts / "train", folder) if side == "val" else (folder, texts / "val.txt")
    with pytest.raises(DataError, match=r"--val-data's file '.*' is --data's file '.*' \(a link or a hard link to "
                                        r"it; 1 such file\(s\)\): the validation text would be trained on"):
        load_corpus(data, val_path=val)


def test_a_folder_reads_a_hard_linked_file_once_and_no_folder_above_it(tmp_path):
    """A hard link beside its file put one text in both splits (files were told apart by their resolved path); a
    linked folder pointing above --data (.., /) read files outside --data."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for k in range(3):
        (root / f"f{k}.txt").write_bytes(b"text of file %d\n" % k * 30)
    os.link(root / "f0.txt", root / "sub" / "again.txt")
    (root / "sub" / "up").symlink_to(tmp_path)                          # tmp_path holds corpus/ and outside.txt
    (tmp_path / "outside.txt").write_bytes(b"not under --data\n" * 30)
    corpus = load_corpus(root, val_fraction=0.34, seed=0)
    assert sorted(corpus.train_files + corpus.val_files) == ["f0.txt", "f1.txt", "f2.txt"]


def test_a_missing_or_empty_val_data_is_named(texts, tmp_path):
    with pytest.raises(DataError, match=f"--val-data path '{tmp_path / 'none.txt'}' does not exist"):
        load_corpus(texts / "train", val_path=tmp_path / "none.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match=f"--val-data file '{tmp_path / 'empty.txt'}' is empty"):
        load_corpus(texts / "train", val_path=tmp_path / "empty.txt")


@pytest.fixture(scope="module")
def val_run(texts, tmp_path_factory):
    out = tmp_path_factory.mktemp("val_run") / "run"
    overrides = {"val_data": str(texts / "val.txt")}
    result = train(TrainConfig(**SETTINGS, data=str(texts / "train"), out=str(out), **overrides), overrides=overrides,
                   progress=False, say=quiet)
    assert result.status == "done"
    return out


def test_the_run_validates_on_it_and_eval_reads_it(val_run, texts, capsys):
    state = json.loads((val_run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert state["train_config"]["val_data"] == str(texts / "val.txt")
    val = np.frombuffer((texts / "val.txt").read_bytes(), np.uint8)
    model = Mamba2LMHeadModel.from_pretrained(val_run, dtype="float64")
    assert cli.main(["eval", "--model", str(val_run), "--json", "-", "--no-progress", "--dtype", "float64"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == len(val) - 1
    assert report["mean_nats"] == pytest.approx(evaluate(model, val, 512).mean_nats, rel=1e-12)
    assert report["data"].startswith(f"the validation data {texts / 'val.txt'} (1 file, as the run read it)")
    assert cli.main(["eval", "--model", str(val_run), "--training-windows", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["bits_per_byte"] == state["val_bpb"]   # to the bit (float64)


def test_resume_keeps_it_and_refuses_another(val_run, texts, tmp_path, capsys, monkeypatch):
    """Another validation text is refused, saying what differs; the same text at another place (moved, or a copy)
    is taken, as is the same file spelled otherwise."""
    run, moved_run = tmp_path / "run", tmp_path / "moved_run"
    shutil.copytree(val_run, run, symlinks=True)
    shutil.copytree(val_run, moved_run, symlinks=True)
    other = tmp_path / "other.txt"
    other.write_bytes((texts / "val.txt").read_bytes() + b"one more line\n")
    assert cli.main(["train", "--resume", str(run), "--val-data", str(other), "--steps", "3"]) == cli.EXIT_USAGE
    assert "is not the one this run was trained on: the validation split has" in capsys.readouterr().err
    other.write_bytes((texts / "val.txt").read_bytes())                 # the same text elsewhere
    assert cli.main(["train", "--resume", str(moved_run), "--val-data", str(other), "--steps", "3",
                     "--no-progress"]) == cli.EXIT_OK
    state = json.loads((moved_run / "checkpoints" / "step-000003" / "trainer_state.json").read_text())
    assert state["train_config"]["val_data"] == str(other)
    monkeypatch.chdir(texts)                                             # the same file, spelled relatively
    assert cli.main(["train", "--resume", str(run), "--val-data", "val.txt", "--steps", "3", "--no-progress"]) == \
        cli.EXIT_OK
    state = json.loads((run / "checkpoints" / "step-000003" / "trainer_state.json").read_text())
    assert state["train_config"]["val_data"] == str(texts / "val.txt")


def test_a_changed_validation_text_is_not_the_runs(val_run, texts, tmp_path, capsys):
    run = tmp_path / "run"
    os.symlink(val_run, run)                                             # (read only: eval writes nothing)
    before = (texts / "val.txt").read_bytes()
    try:
        (texts / "val.txt").write_bytes(before + b"one more line\n")
        assert cli.main(["eval", "--model", str(run), "--no-progress"]) != cli.EXIT_OK
        assert "has changed since" in capsys.readouterr().err
    finally:
        (texts / "val.txt").write_bytes(before)


TINY_FLAGS = ["--d-model", "32", "--n-layer", "1", "--d-state", "16", "--headdim", "16", "--batch-size", "2",
              "--seq-len", "32", "--eval-batches", "1", "--steps", "1", "--no-progress"]


def test_the_flags_misuse_is_refused_before_training(texts, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(texts / "train"), "--val-data", str(texts / "val.txt"), "--val-fraction",
                     "0.2", "--out", str(out), *TINY_FLAGS]) == cli.EXIT_USAGE
    assert "--val-fraction 0.2 splits --data into training and validation, and --val-data gives the validation " \
           "text: leave one of them out" in capsys.readouterr().err
    assert cli.main(["train", "--data", str(texts / "train"), "--val-data", "", "--out", str(out)]) == cli.EXIT_USAGE
    assert "--val-data '' is an empty path" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_bytes(b"too short")
    assert cli.main(["train", "--data", str(texts / "train"), "--val-data", str(short), "--out", str(out),
                     *TINY_FLAGS]) != cli.EXIT_OK
    assert (f"the --val-data text '{short}' (1 file: short.txt) has 9 bytes; a sequence of --seq-len 32 needs at "
            f"least 33 (use a longer --val-data text or a smaller --seq-len)") in capsys.readouterr().err
    assert not out.exists()


def test_a_relative_val_data_is_saved_absolute(texts, tmp_path, monkeypatch):
    """So that --resume and eval find it from any folder, as --data."""
    monkeypatch.chdir(texts)
    out = tmp_path / "run"
    code = cli.main(["train", "--data", "train", "--val-data", "val.txt", "--out", str(out), *TINY_FLAGS])
    assert code == cli.EXIT_OK
    saved = json.loads((out / "checkpoints" / "step-000001" / "trainer_state.json").read_text())["train_config"]
    assert (saved["data"], saved["val_data"]) == (str(texts / "train"), str(texts / "val.txt"))
