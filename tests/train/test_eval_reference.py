"""eval's figures against transformers' and training's own: score() (what `eval` runs) is the mean next-token loss
transformers' Mamba2ForCausalLM gives for model(ids, labels=ids) over one forward of the whole token stream
(float64, 1e-10), whatever the window (1, a partial last one, one past the text); a folder is scored as its joined
text; bits per byte are the total bits over the text's bytes after the first token (all of them after a BOS, as
lm-eval's bits_per_byte counts them); with no byte to divide by there is none; and --reset-state --window SEQ_LEN
scores a run's validation split as training did when training's windows are every window of it."""
import json
import math
import sys
from pathlib import Path

import pytest

from tests.support.checkpoints import write_transformers_dir
from tests.support.tokenizers import train_bpe, train_byte_fallback
from tests.support.training import TINY, quiet
from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import cli, scoring
from tinygrad_ssm.train.arguments import build_parser
from tinygrad_ssm.train.generate import load_tokenizer_for
from tinygrad_ssm.train.loop import TrainConfig, train

TRAINING_TEXTS = ["héllo wörld ça va? naïve café 日本語 the state space model decodes one token at a time " * 20,
                  "def main():\n    return [x * 2 for x in range(10)]  # a comment, with punctuation!\n" * 20]
TEXT = "héllo wörld, the state space model\n" + "def f(x):\n    return x * 2  # naïve café 日本語\n" * 4
# GPT-NeoX-style (byte-level, nothing added), Llama-style with <s> first, and one that appends </s>
KINDS = ("neox", "bos", "eos")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """kind -> a transformers-layout folder: the kind's tokenizer and random float64 weights (a padded
    vocabulary: transformers' softmax covers the padding rows, and so does ours)."""
    out = {}
    for kind in KINDS:
        folder = tmp_path_factory.mktemp(kind)
        if kind == "neox":
            train_bpe(TRAINING_TEXTS, folder / "tokenizer.json", byte_level_post_processor=True)
            (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                                      "bos_token": "<|endoftext|>"}))
        else:
            train_byte_fallback(TRAINING_TEXTS, folder, template=kind)
        vocab = FileTokenizer(folder / "tokenizer.json").vocab_size
        config = Mamba2Config(d_model=32, n_layer=2, vocab_size=vocab, d_state=8, headdim=8, chunk_size=8,
                              pad_vocab_size_multiple=16)
        write_transformers_dir(folder, Mamba2LMHeadModel(config, VarMap(seed=3), dtype="float64"))
        out[kind] = folder
    return out


def _theirs(folder):
    """transformers' model and tokenizer of the folder, and their float64 next-token losses of ids (n,): (n - 1,)."""
    torch = pytest.importorskip("torch", reason="torch is an optional reference")
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from parity_transformers import float64_throughout       # their CPU path's float32 casts kept float64

    model = transformers.Mamba2ForCausalLM.from_pretrained(str(folder), dtype=torch.float64).eval()

    def losses(ids):
        with torch.no_grad(), float64_throughout():
            t = torch.tensor([list(ids)])                                  # (1, n)
            out = model(t, labels=t)                                       # their loss: the mean of ids[1:]
            each = torch.nn.functional.cross_entropy(out.logits[0, :-1], t[0, 1:], reduction="none")
            assert abs(each.mean().item() - out.loss.item()) < 1e-12
            return each.numpy()

    return transformers.AutoTokenizer.from_pretrained(str(folder)), losses


def _score(folder, data: Path, window: int) -> dict:
    model = Mamba2LMHeadModel.from_pretrained(folder, dtype="float64")
    tok = FileTokenizer(folder / "tokenizer.json")
    return scoring.score(model, tok, scoring.read_eval_text(str(data), folder, tok), window=window, progress=False)


@pytest.mark.parametrize("kind", KINDS)
def test_eval_is_transformers_loss_over_one_forward_whatever_the_window(folders, kind, tmp_path):
    """The state carried from window to window is one long forward: no stride recompute needed."""
    hf_tok, losses = _theirs(folders[kind])
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    ids = hf_tok(TEXT)["input_ids"]                                      # transformers' tokenizer(text)
    assert FileTokenizer(folders[kind] / "tokenizer.json").encode_bytes(text.read_bytes()).tolist() == ids
    theirs = losses(ids)                                                 # (n - 1,)
    n = len(ids)
    for window in (1, 5, n - 2, n - 1, n, 10_000):                       # n - 1 predictions in all
        report = _score(folders[kind], text, window)
        assert report["tokens"] == n - 1 and report["windows"] == -(-(n - 1) // window)
        assert abs(report["mean_nats"] - theirs.mean()) < 1e-10, window
    assert report["perplexity"] == pytest.approx(math.exp(theirs.mean()), rel=1e-12)
    # bits per byte: the total bits over the bytes after the first token ("h"; "eos": the "▁" its normalizer
    # prepends, which has the offsets of the "h" after it but covers no byte: the "h" was left out though scored),
    # every byte of the text after a BOS
    assert report["bytes"] == len(TEXT.encode()) - (len(hf_tok.decode(ids[:1]).encode()) if kind == "neox" else 0)
    assert report["bits_per_byte"] == pytest.approx(theirs.sum() / math.log(2) / report["bytes"], rel=1e-12)


@pytest.mark.parametrize("kind", ["neox", "bos"])
def test_a_folder_is_scored_as_transformers_scores_its_joined_text(folders, kind, tmp_path):
    """Sorted by relative path, joined as they are (no separator, one BOS, the state carried from file to file);
    hidden, empty and binary files left out, a file that is not UTF-8 read as transformers reads its U+FFFD."""
    hf_tok, losses = _theirs(folders[kind])
    data = tmp_path / "texts"
    (data / "sub").mkdir(parents=True)
    files = {"b.txt": "second file ça\n".encode(), "a.txt": "first file, naïve\n".encode(),
             "sub/c.txt": "in a sub folder 日本\n".encode(), ".hidden.txt": b"hidden\n", "empty.txt": b"",
             "bin.dat": b"\x00\x01binary", "latin1.txt": "café latin-1\n".encode("latin-1")}
    for name, body in files.items():
        (data / name).write_bytes(body)
    joined = b"".join(files[name] for name in ("a.txt", "b.txt", "latin1.txt", "sub/c.txt"))
    ids = hf_tok(joined.decode("utf-8", errors="replace"))["input_ids"]
    theirs = losses(ids)
    for window in (1, 7, 10_000):
        report = _score(folders[kind], data, window)
        assert report["data"] == f"{data} (4 text files, 1 binary file skipped (bin.dat))"
        assert report["tokens"] == len(ids) - 1 and abs(report["mean_nats"] - theirs.mean()) < 1e-10
    assert report["bytes"] == len(joined) - (0 if kind == "bos" else len(hf_tok.decode(ids[:1]).encode()))


def test_no_bits_per_byte_when_the_scored_tokens_cover_no_byte(folders, tmp_path, capsys):
    """" " with a tokenizer that appends </s>: "▁" (the whole text) predicts </s>, which covers no byte. The bits
    over one byte were reported as bits per byte; now there are none (JSON null), and the report says why."""
    text = tmp_path / "space.txt"
    text.write_text(" ", encoding="utf-8")
    assert cli.main(["eval", "--model", str(folders["eos"]), "--data", str(text), "--json", "-",
                     "--no-progress"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["tokens"] == 1 and report["bytes"] == 0 and report["bits_per_byte"] is None
    assert "no bits per byte (the scored tokens cover none of the text's bytes)" in captured.err
    assert "tokens scored: 1 (0 bytes;" in captured.err


def test_a_text_of_one_byte_is_one_byte(folders, tmp_path, capsys):
    text = tmp_path / "two.txt"
    text.write_text("ab", encoding="utf-8")
    assert cli.main(["eval", "--model", str(folders["neox"]), "--data", str(text), "--no-progress"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "tokens scored: 1 (1 byte;" in out                            # not "1 bytes"


def test_help_says_which_tokens_and_bytes_are_scored():
    """eval --help said "Score every token of a text", but the first token of a text without a BOS has nothing to
    be predicted from, and it said nothing of what bits per byte divide by, nor of a folder's files."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["eval"]
    text = " ".join(sub.description.split())
    for claim in ("Every token after the first is scored, as transformers' model(ids, labels=ids) scores it",
                  "bits per byte are their total bits over the text's bytes after the first token",
                  "joined in sorted order as they are", "with no separator and the state carried across them",
                  "the numbers do not depend on --window"):
        assert claim in text


def test_reset_state_in_windows_of_seq_len_is_trainings_validation(tmp_path, capsys):
    """A validation split of 1 + 2 x seq_len bytes: training's fixed windows (eval_batches x batch_size = 2) are
    every window of it, so eval --reset-state --window SEQ_LEN gives the bits per byte training reported."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"".join(b"line %d: the quick brown fox\n" % i for i in range(60))[:1300])
    seq_len = TINY["seq_len"]
    settings = dict(TINY, dtype="float64", steps=2, data=str(corpus), out=str(tmp_path / "run"), val_fraction=0.05)
    result = train(TrainConfig(**settings), progress=False, say=quiet)
    assert result.status == "done" and TINY["eval_batches"] * TINY["batch_size"] == 2
    folder = result.checkpoint
    model, tok = Mamba2LMHeadModel.from_pretrained(folder, dtype="float64"), load_tokenizer_for(folder, 256)
    text = scoring.read_eval_text(None, folder, tok)
    assert text.size == 1 + 2 * seq_len == int(1300 * 0.05)
    report = scoring.score(model, tok, text, window=seq_len, carry_state=False, progress=False)
    assert report["windows"] == 2 and abs(report["bits_per_byte"] - result.val_bpb) < 1e-10
    carried = scoring.score(model, tok, text, window=seq_len, progress=False)
    assert abs(carried["bits_per_byte"] - result.val_bpb) > 1e-6          # the second window remembers the first
    assert cli.main(["eval", "--model", str(tmp_path / "run"), "--reset-state", "--window", str(seq_len),
                     "--json", "-", "--no-progress"]) == cli.EXIT_OK   # float32, as the CLI loads a model
    assert json.loads(capsys.readouterr().out)["bits_per_byte"] == pytest.approx(result.val_bpb, rel=1e-5)
