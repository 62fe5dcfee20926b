"""eval on a long text: read a block at a time and tokenized a piece at a time as it is scored (it read the whole
text and tokenized it at once: 3.5 GB of memory for a 200 MB file at --max-tokens 1000 on bytes, 3.5 GB for 20 MB
with a BPE tokenizer), with the numbers of the whole text; --max-tokens reads only what it scores."""
import builtins
import json

from tests.support.checkpoints import write_checkpoint
from tinygrad_ssm import VarMap
from tinygrad_ssm import tokenizer as tokenizer_module
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.evaluation import evaluate
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import cli, scoring

NUMBERS = ("tokens", "bytes", "mean_nats", "windows")
TEXT = b"".join(b"line %d: caf\xc3\xa9 \xff the quick brown fox\n\n  jumps\n" % i for i in range(60))   # ~3 KB


def _model_folder(tmp_path, vocab_size, tokenizer_json=None):
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=vocab_size, d_state=16, headdim=16, chunk_size=16)
    return write_checkpoint("transformers", tmp_path / "model", Mamba2LMHeadModel(config, VarMap(seed=1)),
                            tokenizer_json=tokenizer_json)


def _run(capsys, folder, data, *extra) -> dict:
    assert cli.main(["eval", "--model", str(folder), "--data", str(data), "--json", "-", "--no-progress",
                     "--window", "64", *extra]) == cli.EXIT_OK
    return json.loads(capsys.readouterr().out)


def test_max_tokens_reads_only_the_blocks_it_scores(tmp_path, capsys, monkeypatch):
    folder, text = _model_folder(tmp_path, 256), tmp_path / "long.txt"
    text.write_bytes(TEXT)
    whole = _run(capsys, folder, text)
    read = []

    def spy_open(*args, **kwargs):
        f = real_open(*args, **kwargs)
        real_read = f.read
        f.read = lambda n=-1: read.append(len(data := real_read(n))) or data
        return f

    real_open = builtins.open
    monkeypatch.setattr(scoring, "READ_BLOCK", 50)
    monkeypatch.setattr(scoring, "open", spy_open, raising=False)
    report = _run(capsys, folder, text, "--max-tokens", "60")
    assert sum(read) == 100 and max(read) == 50                          # two blocks of 50 bytes for 61 tokens
    assert report["tokens"] == 60 and report["bytes"] == 60
    read.clear()
    report = _run(capsys, folder, text, "--max-tokens", "99")           # 100 tokens: the second block's last byte
    assert sum(read) == 100 and report["tokens"] == 99                   # ends them, and no third block is read
    read.clear()
    report = _run(capsys, folder, text)
    assert [report[k] for k in NUMBERS] == [whole[k] for k in NUMBERS]   # as when read in blocks of 1 MiB
    assert sum(read) == len(TEXT) and max(read) == 50                    # the whole text, a block at a time


def test_a_tokenizer_reads_a_long_text_in_pieces_with_the_numbers_of_the_whole(bpe_tokenizer, tmp_path, capsys,
                                                                               monkeypatch):
    folder, text = _model_folder(tmp_path, 320, bpe_tokenizer), tmp_path / "long.txt"
    text.write_bytes(TEXT)
    tok = FileTokenizer(bpe_tokenizer)
    ids, ends = tok.encode_bytes_with_ends(TEXT)
    model = Mamba2LMHeadModel.from_pretrained(folder)
    expected = evaluate(model, ids, 64)
    sizes, real = [], FileTokenizer._ids_ends

    def spy(self, data, *args, **kwargs):
        sizes.append(len(data))
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(FileTokenizer, "_ids_ends", spy)
    monkeypatch.setattr(tokenizer_module, "PIECE_BYTES", 200)
    monkeypatch.setattr(scoring, "READ_BLOCK", 128)
    report = _run(capsys, folder, text)
    assert sum(sizes) == len(TEXT) and max(sizes) < 300 and len(sizes) > 5    # pieces, never the whole text
    assert report["tokens"] == expected.tokens == len(ids) - 1 and report["windows"] == expected.windows
    assert report["mean_nats"] == expected.mean_nats and report["bytes"] == ends[-1] - ends[0]
    sizes.clear()
    assert _run(capsys, folder, text, "--max-tokens", "40")["tokens"] == 40
    assert sum(sizes) < 300                                              # the first piece or two, not the text


def test_a_folder_is_read_file_by_file_as_its_join(tmp_path, capsys, monkeypatch):
    folder, data = _model_folder(tmp_path, 256), tmp_path / "texts"
    (data / "b dir").mkdir(parents=True)
    files = {"a é.txt": TEXT[:1000], "b dir/b.txt": TEXT[1000:2500], "c.bin": b"\x00binary" + TEXT[:100],
             "d.txt": b"", "e.txt": TEXT[2500:]}
    for name, body in files.items():
        (data / name).write_bytes(body)
    joined = tmp_path / "joined.txt"
    joined.write_bytes(TEXT)
    monkeypatch.setattr(scoring, "READ_BLOCK", 100)
    report, expected = _run(capsys, folder, data), _run(capsys, folder, joined)
    assert report["data"] == f"{data} (3 text files, 1 binary file skipped (c.bin))"   # d.txt is empty
    assert [report[k] for k in NUMBERS] == [expected[k] for k in NUMBERS]


def test_the_file_ends_array_follows_the_growing_list_and_a_fresh_read():
    """Eval's per-file figures made an array of every file end read so far at every window (8.6 s of a 54 s eval of
    50,000 files; found by an audit); the array now grows with the list, and starts again when the text is read
    again from its start (the list emptied in place)."""
    import numpy as np
    from tinygrad_ssm.train.scoring import _FileFigures
    ends = []
    figures = _FileFigures(tuple(f"f{i}" for i in range(40)), ends)
    for k in range(40):
        ends += [10 * (k + 1)] * (k % 2)                                 # none, then one, added between calls
        assert np.array_equal(figures._file_ends(), np.array(ends, np.int64))
    ends[:] = [5, 6]
    assert np.array_equal(figures._file_ends(), np.array([5, 6]))
