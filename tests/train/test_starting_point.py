"""What a run starts from (tinygrad_ssm/train/starting_point.py), piece by piece: the vocabulary the memory estimate
counts, --resume's paths compared as places, and what a checkpoint keeps of the tokenizer."""
import json

from tests.support.tokenizers import EOS, corpus_texts, train_bpe
from tinygrad_ssm.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, ByteTokenizer, FileTokenizer, load_tokenizer
from tinygrad_ssm.train.config import TrainConfig
from tinygrad_ssm.train.starting_point import build_model, paths_as_saved, run_vocab_size, tokenizer_files

SHAPE = dict(d_model=32, n_layer=1, d_state=16, headdim=16, chunk_size=16)


def test_the_memory_estimate_counts_the_padded_rows_the_run_trains(corpus, tmp_path):
    """A tokenizer of 300 tokens trains 304 embedding rows (padded to a multiple of 16, as build_model pads)."""
    path = train_bpe(corpus_texts(corpus), tmp_path / TOKENIZER_FILE, vocab_size=300)
    tok = load_tokenizer(path)
    assert tok.vocab_size % 16, tok.vocab_size                         # a size that padding changes
    cfg = TrainConfig(tokenizer=str(path), **SHAPE)
    assert run_vocab_size(cfg) == build_model(cfg, tok).config.padded_vocab_size == -(-tok.vocab_size // 16) * 16
    assert run_vocab_size(TrainConfig(**SHAPE)) == build_model(TrainConfig(**SHAPE), ByteTokenizer()).config \
        .padded_vocab_size == 256


def test_resumes_paths_are_compared_as_places_not_spellings(bpe_tokenizer, corpus, tmp_path, monkeypatch):
    """Each flag spelled another way than the saved run (relative, through a link) becomes the saved spelling, so
    that it is not taken for a change; a flag naming another place is left as given."""
    monkeypatch.chdir(bpe_tokenizer.parent)
    (tmp_path / "link").symlink_to(corpus.parent)
    saved = {"tokenizer": str(bpe_tokenizer), "data": str(corpus)}
    given = {"tokenizer": TOKENIZER_FILE, "data": str(tmp_path / "link" / corpus.name), "steps": 5}
    assert paths_as_saved(given, saved) == {**saved, "steps": 5}
    other = tmp_path / "other.json"
    other.write_bytes(bpe_tokenizer.read_bytes())
    assert paths_as_saved({"tokenizer": str(other)}, saved) == {"tokenizer": str(other)}
    assert paths_as_saved({"tokenizer": "bytes"}, saved) == {"tokenizer": "bytes"}


def test_a_checkpoint_keeps_the_tokenizer_and_its_eos_token(bpe_tokenizer):
    tok = FileTokenizer(bpe_tokenizer, eos_token_id=0)
    files = tokenizer_files(tok)
    assert files[TOKENIZER_FILE] == bpe_tokenizer.read_text(encoding="utf-8")
    assert json.loads(files[TOKENIZER_CONFIG_FILE])["eos_token"] == EOS
    assert tokenizer_files(ByteTokenizer()) == {}
