"""The byte corpus: default files, split by file, bad paths, entropy, and a resumable batch sampler."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import data as D
from tinygrad_ssm.train.batches import BatchSampler, eval_batches, eval_window_starts
from tinygrad_ssm.train.data import DataError, bits_per_byte, load_corpus, unigram_entropy_bits


@pytest.fixture(scope="module")
def stdlib_corpus():
    return load_corpus(seed=0)


def _write(folder: Path, files: dict) -> Path:
    for name, content in files.items():
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    return folder


# ----------------------------------------------------------------------------------------------------------
# the default corpus


def test_default_corpus_is_the_stdlib_without_packages_or_test_suites(stdlib_corpus):
    c = stdlib_corpus
    names = c.train_files + c.val_files
    assert len(names) > 100 and all(n.endswith(".py") for n in names)
    assert any(n == "os.py" for n in names) and any(n.startswith("json/") for n in names)
    for n in names:
        parts = set(n.split("/")[:-1])
        assert not parts & D.EXCLUDED_DIRS, n
    assert len(c.train) > 1_000_000 and len(c.val) > 10_000
    assert c.train.dtype == np.uint8 and c.val.dtype == np.uint8


def test_default_split_is_by_file_disjoint_and_complete(stdlib_corpus):
    c = stdlib_corpus
    assert not set(c.train_files) & set(c.val_files)
    root = D.default_corpus_root()
    total = sum((root / n).stat().st_size for n in c.train_files + c.val_files)
    assert len(c.train) + len(c.val) == total
    # the validation stream is exactly its files' bytes, in order
    val_bytes = b"".join((root / n).read_bytes() for n in c.val_files)
    assert np.array_equal(c.val, np.frombuffer(val_bytes, dtype=np.uint8))  # not bytes ==: its diff is slow
    assert abs(len(c.val_files) - D.DEFAULT_VAL_FRACTION * len(names_of(c))) <= 1


def names_of(c):
    return c.train_files + c.val_files


def test_stdlib_sources_are_sorted_then_the_seed_decides_the_order(stdlib_corpus):
    files = D.stdlib_sources()
    rel = [p.relative_to(D.default_corpus_root()).as_posix() for p in files]
    assert rel == sorted(rel)
    again = load_corpus(seed=0)
    assert again.val_files == stdlib_corpus.val_files and again.train_files == stdlib_corpus.train_files
    other = load_corpus(seed=1)
    assert other.val_files != stdlib_corpus.val_files
    assert sorted(names_of(other)) == sorted(names_of(stdlib_corpus))


# ----------------------------------------------------------------------------------------------------------
# --data PATH


def test_folder_corpus_splits_by_file_and_skips_hidden_and_binary(tmp_path):
    files = {f"src/f{i:02d}.txt": f"file {i}\n".encode() * (i + 1) for i in range(20)}
    files[".git/config"] = b"hidden folder"
    files[".hidden.txt"] = b"hidden file"
    files["image.bin"] = b"\x89PNG\x00\x00binary"
    files["empty.txt"] = b""
    c = load_corpus(_write(tmp_path, files), seed=3, val_fraction=0.1)
    assert len(c.val_files) == 2 and len(c.train_files) == 18
    assert not set(c.train_files) & set(c.val_files)
    assert set(names_of(c)) == {n for n in files if n.startswith("src/")}
    assert c.skipped_files == ("image.bin",)
    assert c.train.tobytes() == b"".join(files[n] for n in c.train_files)
    assert c.val.tobytes() == b"".join(files[n] for n in c.val_files)


def test_single_file_is_split_by_bytes(tmp_path):
    text = bytes(range(256)) * 40
    p = tmp_path / "one.txt"
    p.write_bytes(text)
    c = load_corpus(p, val_fraction=0.25)
    assert np.array_equal(np.concatenate([c.train, c.val]), np.frombuffer(text, dtype=np.uint8))
    assert len(c.val) == len(text) // 4


@pytest.mark.parametrize("tail", ["", "x", "xy"])
def test_single_file_is_cut_where_a_character_starts(tmp_path, tail):
    """A UTF-8 file of 3-byte characters: the byte count puts the cut inside one (for two of the tails); the split
    moves back to the character's first byte, so both halves stay valid UTF-8 and the file reads as UTF-8."""
    text = ("日本語のテキスト。" * 100 + tail).encode("utf-8")
    p = tmp_path / "one.txt"
    p.write_bytes(text)
    c = load_corpus(p, val_fraction=0.05)
    assert np.array_equal(np.concatenate([c.train, c.val]), np.frombuffer(text, dtype=np.uint8))
    c.train.tobytes().decode("utf-8"), c.val.tobytes().decode("utf-8")          # neither raises
    assert int(len(text) * 0.05) <= len(c.val) <= int(len(text) * 0.05) + 3
    assert c.non_utf8_files == ()


@pytest.mark.parametrize("case", ["missing", "empty_file", "empty_folder", "only_empty_files", "only_binary"])
def test_bad_paths_give_clear_errors(tmp_path, case):
    if case == "missing":
        path = tmp_path / "nope"
    elif case == "empty_file":
        path = tmp_path / "empty.txt"
        path.write_bytes(b"")
    elif case == "empty_folder":
        path = tmp_path / "folder"
        path.mkdir()
    elif case == "only_empty_files":
        path = _write(tmp_path / "f", {"a.txt": b"", "b/c.txt": b""})
    else:
        path = _write(tmp_path / "f", {"a.bin": b"\x00\x01"})
    with pytest.raises(DataError) as e:
        load_corpus(path)
    message = str(e.value)
    assert str(path) in message
    expected = {"missing": "does not exist", "empty_file": "is empty", "empty_folder": "contains no files",
                "only_empty_files": "only empty files", "only_binary": "only binary files"}[case]
    assert expected in message


@pytest.mark.parametrize("as_folder", [True, False], ids=["in_a_folder", "single_file"])
def test_unreadable_file_is_named_in_the_error(tmp_path, monkeypatch, as_folder):
    # chmod 000 proves nothing when the tests run as root (CI does): root reads mode-000 files. So the
    # denial comes from a patched open() in tinygrad_ssm.train.data, for both ways a file is read
    folder = _write(tmp_path, {"ok.txt": b"fine\n", "secret.txt": b"locked\n"})
    real_open = open

    def guarded_open(path, *args, **kwargs):
        if Path(path).name == "secret.txt":
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(D, "open", guarded_open, raising=False)
    with pytest.raises(DataError, match=r"cannot read corpus file .*secret\.txt.*Permission denied"):
        load_corpus(folder if as_folder else folder / "secret.txt")


def test_split_too_short_for_the_sequence_length():
    with pytest.raises(DataError, match=r"validation split .* has 10 bytes; a sequence of --seq-len 64"):
        D.check_length(np.zeros(10, np.uint8), 64, "validation", "corpus.txt")
    with pytest.raises(DataError, match=r"has 1 byte; a sequence"):                  # not "1 bytes"
        D.check_length(np.zeros(1, np.uint8), 64, "validation", "corpus.txt")
    with pytest.raises(DataError, match=r"has 1 token; a sequence"):
        D.check_length(np.zeros(1, np.int64), 64, "validation", "corpus.txt")


# ----------------------------------------------------------------------------------------------------------
# entropy


def test_unigram_entropy_known_values():
    assert unigram_entropy_bits(bytes(range(256)) * 3) == pytest.approx(8.0)
    assert unigram_entropy_bits(b"aaaa") == 0.0
    assert unigram_entropy_bits(b"abab") == pytest.approx(1.0)
    p = np.array([0.5, 0.25, 0.25])
    assert unigram_entropy_bits(b"aabc" * 10) == pytest.approx(float(-(p * np.log2(p)).sum()))
    with pytest.raises(DataError):
        unigram_entropy_bits(b"")


def test_unigram_entropy_counts_a_long_stream_in_blocks(monkeypatch):
    """bincount copies what it counts as int64: the whole 285 MB training split of a 300 MB folder took 2.3 GB."""
    stream = np.random.default_rng(0).integers(0, 300, 1000).astype(np.int32)   # token ids past 255 too
    expected = unigram_entropy_bits(stream)
    counted, real = [], np.bincount
    monkeypatch.setattr(D, "HISTOGRAM_BLOCK", 64)
    monkeypatch.setattr(np, "bincount", lambda a, **kw: counted.append(len(a)) or real(a, **kw))
    assert unigram_entropy_bits(stream) == pytest.approx(expected, abs=1e-12)
    assert max(counted) == 64 and sum(counted) == 1000
    _, counts = np.unique(stream, return_counts=True)
    assert expected == pytest.approx(float(-(counts / 1000 * np.log2(counts / 1000)).sum()), abs=1e-12)


def test_stdlib_entropy_is_in_the_range_of_source_code(stdlib_corpus):
    h = unigram_entropy_bits(stdlib_corpus.train)
    assert 4.0 < h < 5.5  # ASCII source code: far below 8 bits (uniform bytes), far above 0


def test_bits_per_byte():
    assert bits_per_byte(math.log(256)) == pytest.approx(8.0)


# ----------------------------------------------------------------------------------------------------------
# batches


def test_sampler_windows_are_next_byte_pairs_and_deterministic():
    data = np.arange(1000, dtype=np.int64).astype(np.uint8)
    a, b = BatchSampler(data, 4, 16, seed=5), BatchSampler(data, 4, 16, seed=5)
    for _ in range(20):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert xa.shape == ya.shape == (4, 16) and xa.dtype == np.int64
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa[:, 1:], ya[:, :-1])
        np.testing.assert_array_equal((xa + 1) % 256, ya)  # data[i + 1] = data[i] + 1 (mod 256)
    c = BatchSampler(data, 4, 16, seed=6)
    assert not np.array_equal(c.next_batch()[0], BatchSampler(data, 4, 16, seed=5).next_batch()[0])


def test_sampler_reaches_the_last_byte_and_never_overruns():
    data = np.arange(9, dtype=np.uint8)  # seq_len 8 -> exactly one window
    s = BatchSampler(data, 3, 8, seed=0)
    x, y = s.next_batch()
    np.testing.assert_array_equal(x, np.tile(np.arange(8), (3, 1)))
    np.testing.assert_array_equal(y, np.tile(np.arange(1, 9), (3, 1)))
    with pytest.raises(DataError):
        BatchSampler(data, 1, 9)


def test_sampler_state_round_trips_through_json():
    data = np.random.default_rng(0).integers(0, 256, 5000).astype(np.uint8)
    s = BatchSampler(data, 2, 32, seed=1)
    for _ in range(7):
        s.next_batch()
    saved = json.loads(json.dumps(s.state_dict()))
    expected = [s.next_batch() for _ in range(5)]
    resumed = BatchSampler(data, 2, 32, seed=999)
    resumed.load_state_dict(saved)
    assert resumed.batches_drawn == 7
    for (x, y), (rx, ry) in zip(expected, (resumed.next_batch() for _ in range(5))):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    with pytest.raises(ValueError, match="batch_size, seq_len"):
        BatchSampler(data, 3, 32).load_state_dict(saved)


def test_eval_batches_are_fixed_non_overlapping_windows():
    data = np.arange(1000, dtype=np.int64).astype(np.uint8)
    first = list(eval_batches(data, 4, 50, max_batches=3))
    again = list(eval_batches(data, 4, 50, max_batches=3))
    assert len(first) == 3 and all(x.shape == (4, 50) for x, _ in first)
    for (x, y), (x2, _) in zip(first, again):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal((x + 1) % 256, y)
    starts = eval_window_starts(1000, 4, 50, max_batches=3)
    np.testing.assert_array_equal(np.concatenate([x[:, 0] for x, _ in first]), data[starts])
    assert len(starts) == 12 and starts[0] == 0 and starts[-1] == 1000 - 51
    assert np.all(np.diff(starts) >= 50)  # no byte is counted twice
    short = list(eval_batches(data[:120], 4, 50, max_batches=3))  # room for 2 windows only
    assert len(short) == 1 and short[0][0].shape == (2, 50)


def test_a_tokenized_corpus_describes_its_bytes_and_its_tokens(corpus, bpe_tokenizer):
    from tinygrad_ssm.train.data import tokenize

    raw = load_corpus(corpus, val_fraction=0.25)
    tokens = tokenize(raw, FileTokenizer(bpe_tokenizer))
    assert f"({len(raw.train):,} bytes)" in raw.describe() and "tokens" not in raw.describe()
    described = tokens.describe()
    assert f"({len(raw.train):,} bytes, {len(tokens.train):,} tokens)" in described
    assert f"({len(raw.val):,} bytes, {len(tokens.val):,} tokens)" in described


def test_a_run_folder_inside_the_data_folder_is_left_out(tmp_path):
    """`--data .` with the default --out puts runs/ inside the data: its log, config and checkpoints became
    training text, and the run could not be resumed (its corpus had changed)."""
    files = {f"f{i}.txt": f"text {i}\n".encode() * 50 for i in range(6)}
    files["runs/r1/tinygrad_ssm_run.json"] = b'{"created_by": "tinygrad_ssm"}'
    files["runs/r1/log.jsonl"] = b'{"step": 1}\n'
    files["notes/runs.txt"] = b"a folder without the marker is data\n"
    c = load_corpus(_write(tmp_path, files), seed=0, val_fraction=0.2)
    assert set(names_of(c)) == {n for n in files if not n.startswith("runs/")}
    assert c.run_folders == ("runs/r1",) and "1 run folder left out (runs/r1)" in c.describe()


def test_linked_folders_are_read_once_and_a_link_back_up_does_not_loop(tmp_path):
    """A linked subfolder was skipped without a word (os.walk does not follow links) while linked files were read."""
    elsewhere = _write(tmp_path / "elsewhere", {"a.txt": b"linked text\n" * 20, "b.txt": b"more\n" * 20})
    data = _write(tmp_path / "data", {"own.txt": b"own text\n" * 20})
    (data / "linked").symlink_to(elsewhere, target_is_directory=True)
    (data / "again").symlink_to(elsewhere, target_is_directory=True)  # the same real folder: read once
    (elsewhere / "up").symlink_to(data, target_is_directory=True)     # a cycle
    c = load_corpus(data, seed=0, val_fraction=0.3)
    assert sorted(names_of(c)) == ["again/a.txt", "again/b.txt", "own.txt"]


def test_a_split_too_short_for_one_sequence_names_its_unit_files_and_fixes(tmp_path):
    """It said "bytes" of a tokenized split and offered only a bigger corpus or a smaller --seq-len, where a
    folder's validation split (whole files) is fixed by --val-fraction or --data-seed."""
    c = load_corpus(_write(tmp_path, {"big.txt": b"x" * 5000, "tiny.txt": b"y" * 5}), seed=3, val_fraction=0.5)
    assert c.val_files == ("tiny.txt",)
    with pytest.raises(DataError, match=r"the validation split of .* \(1 file: tiny.txt\) has 5 bytes; a sequence "
                                        r"of --seq-len 32 needs at least 33 \(use a larger --val-fraction, another "
                                        r"--data-seed"):
        D.check_length(c.val, 32, "validation", c.source, c.val_files)
    with pytest.raises(DataError, match=r"the training split of 'x' has 4 tokens; .* \(use a bigger corpus"):
        D.check_length(np.arange(4, dtype=np.int32), 32, "training", "x")


def test_bytes_that_are_not_utf8_are_counted_when_a_tokenizer_reads_them(tmp_path, bpe_tokenizer):
    """A Latin-1 file trained a BPE on U+FFFD in place of its accents without a word."""
    folder = _write(tmp_path, {"latin1.txt": "Le caf\u00e9 est tr\u00e8s bon.\n".encode("latin-1") * 200,
                               "utf8.txt": "d\u00e9j\u00e0 vu\n".encode() * 200})
    corpus = D.tokenize(load_corpus(folder, seed=0, val_fraction=0.5), FileTokenizer(bpe_tokenizer))
    assert corpus.invalid_utf8_bytes == 400
    assert "400 bytes not UTF-8 in latin1.txt, each read as U+FFFD by the tokenizer (convert that file to UTF-8" \
        in corpus.describe()                                             # the file named: a folder's count hid it


def test_a_utf16_file_is_named_as_such_when_a_tokenizer_reads_it(tmp_path, bpe_tokenizer):
    """UTF-16 text is valid UTF-8 but for its byte order mark (its NULs are U+0000): a --data file of it counted as
    2 bytes not UTF-8 while every character was read wrong. Named as UTF-16 (in a folder its NULs make it a binary
    file, skipped and counted as such); every other file that is not UTF-8 named too, the UTF-8 ones not."""
    text = "caf\u00e9 \u2713 ok\n" * 100
    folder = _write(tmp_path, {"a16.txt": text.encode("utf-16"), "b8.txt": text.encode(), "c1.txt": text.encode(
        "latin-1", errors="replace"), "d.txt": b"plain ascii\n" * 50})
    corpus = D.tokenize(load_corpus(folder, seed=0, val_fraction=0.25), FileTokenizer(bpe_tokenizer))
    assert corpus.skipped_files == ("a16.txt (UTF-16)",) and corpus.non_utf8_files == ("c1.txt",)
    assert ("1 binary file skipped (a16.txt (UTF-16); UTF-16 text is read only as UTF-8: convert it); 100 bytes not "
            "UTF-8 in c1.txt, each read") in corpus.describe()
    single = D.tokenize(load_corpus(folder / "a16.txt"), FileTokenizer(bpe_tokenizer))
    assert "2 bytes not UTF-8 in a16.txt (UTF-16), each read" in single.describe()
    assert "e.g. iconv -f utf-16 -t utf-8)" in single.describe()         # not latin1's advice (an audit found it)
    assert "e.g. iconv -f latin1 -t utf-8)" in corpus.describe()          # c1.txt's
    assert load_corpus(folder / "b8.txt").non_utf8_files == ()


def test_a_big_endian_utf16_file_is_named_as_such(tmp_path, bpe_tokenizer):
    """UTF-16 with either byte order mark (FF FE little-endian, FE FF big-endian) is named as UTF-16."""
    text = "caf\u00e9 ok\n" * 50
    path = tmp_path / "be.txt"
    path.write_bytes(b"\xfe\xff" + text.encode("utf-16-be"))
    single = D.tokenize(load_corpus(path), FileTokenizer(bpe_tokenizer))
    assert single.non_utf8_files == ("be.txt (UTF-16)",) and "in be.txt (UTF-16), each read" in single.describe()


def test_is_utf8_reads_in_blocks_and_ends_with_the_last_one():
    """A character split across two blocks is UTF-8; one cut at the end of the text is not, also when the text is a
    whole number of blocks (the last block must be decoded as final)."""
    assert D._is_utf8("a\u00e9b".encode(), block=2)                        # 61 C3 | A9 62
    assert not D._is_utf8(b"ab\xc3", block=3) and not D._is_utf8(b"ab\xc3", block=2)
    assert not D._is_utf8(b"abcd\xe6\xbc", block=3) and D._is_utf8("abcd\u6f22".encode(), block=3)


@pytest.mark.parametrize("n", [3, 4])
def test_the_files_not_utf8_are_named_three_at_most(tmp_path, bpe_tokenizer, n):
    names = [f"f{i}.txt" for i in range(n)]
    folder = _write(tmp_path, {name: "caf\u00e9 latin-1\n".encode("latin-1") * 20 for name in names})
    described = D.tokenize(load_corpus(folder, seed=0, val_fraction=0.25), FileTokenizer(bpe_tokenizer)).describe()
    shown = "f0.txt, f1.txt, f2.txt" + (" and 1 more" if n == 4 else "")
    assert f"not UTF-8 in {shown}, each read as U+FFFD by the tokenizer (convert the files to UTF-8" in described
