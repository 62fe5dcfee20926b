"""Tokenizers trained in the test (no download), with Hugging Face tokenizers' BpeTrainer:

- train_bpe: byte-level like GPT-NeoX's, <|endoftext|> its EOS token (id 0); byte_level_post_processor=True adds
  the ByteLevel post_processor GPT-NeoX's real tokenizer.json has (it adds no token);
- assert_pieces_equal_whole: a tokenizer's text in pieces against the whole text;
- train_byte_fallback: Llama/Mistral-style (▁ for spaces, byte_fallback <0xNN> tokens for what the merges lack,
  the ByteFallback decoder), <unk> <s> </s> = 0 1 2, a post_processor that adds <s> (or </s>, or nothing), and a
  tokenizer_config.json beside it.
"""
import json
from pathlib import Path

import numpy as np

EOS = "<|endoftext|>"


def train_bpe(texts, path: Path, vocab_size: int = 320, byte_level_post_processor: bool = False) -> Path:
    """Train on `texts` (an iterable of str), write tokenizer.json at `path`, return the path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if byte_level_post_processor:
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    tok.save(str(path))
    return Path(path)


def corpus_texts(*paths, limit: int = 200_000) -> list[str]:
    """The first `limit` characters of each text file (the bundled corpus's, or a test's own)."""
    return [Path(p).read_text(encoding="utf-8", errors="replace")[:limit] for p in paths]


BYTE_FALLBACK_TEMPLATES = {"bos": ("<s> $A", ["<s>"]), "eos": ("$A </s>", ["</s>"]), "none": None}


def train_byte_fallback(texts, folder: Path, vocab_size: int = 300, template: str = "bos",
                        config: dict | None = None) -> Path:
    """A Llama-style tokenizer.json in `folder` (created), its post_processor one of BYTE_FALLBACK_TEMPLATES
    ("bos": TemplateProcessing "<s> $A" as Llama's and Mistral's), and a tokenizer_config.json of `config` (default:
    bos <s>, eos </s>, add_bos_token true). The 256 byte tokens <0x00>..<0xFF> come last. Returns the folder."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    if BYTE_FALLBACK_TEMPLATES[template] is not None:
        single, names = BYTE_FALLBACK_TEMPLATES[template]
        tok.post_processor = processors.TemplateProcessing(single=single, pair=f"{single} $B",
                                                           special_tokens=[(n, tok.token_to_id(n)) for n in names])
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    first = max(vocab.values()) + 1                                      # (the specials are in the vocab)
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = first + i
    (folder / "tokenizer.json").write_text(Tokenizer.from_str(json.dumps(spec)).to_str(), encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "add_bos_token": True} if config is None else config
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def assert_pieces_equal_whole(tok, text: bytes, piece_bytes: int, cut: int = 0) -> int:
    """encode_stream in pieces of piece_bytes (two blocks split at `cut`) and encode_bytes give the whole text's
    ids and byte ends (FileTokenizer `tok`); returns the number of pieces."""
    from tinygrad_ssm import tokenizer as tokenizer_module
    whole_ids, whole_ends = tok.encode_bytes_with_ends(text)
    saved = tokenizer_module.PIECE_BYTES
    tokenizer_module.PIECE_BYTES = piece_bytes
    try:
        streamed = list(tok.encode_stream([text[:cut], text[cut:]]))
        assert np.array_equal(tok.encode_bytes(text), whole_ids)
    finally:
        tokenizer_module.PIECE_BYTES = saved
    assert np.array_equal(np.concatenate([ids for ids, _ in streamed]), whole_ids)
    assert np.array_equal(np.concatenate([ends for _, ends in streamed]), whole_ends)
    return len(streamed)
