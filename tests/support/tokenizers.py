"""A BPE tokenizer trained in the test (no download): Hugging Face tokenizers' BpeTrainer, byte-level like GPT-NeoX's,
with <|endoftext|> as its EOS token (id 0), saved as tokenizer.json."""
from pathlib import Path

EOS = "<|endoftext|>"


def train_bpe(texts, path: Path, vocab_size: int = 320) -> Path:
    """Train on `texts` (an iterable of str), write tokenizer.json at `path`, return the path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    tok.save(str(path))
    return Path(path)


def corpus_texts(*paths, limit: int = 200_000) -> list[str]:
    """The first `limit` characters of each text file (the bundled corpus's, or a test's own)."""
    return [Path(p).read_text(encoding="utf-8", errors="replace")[:limit] for p in paths]
