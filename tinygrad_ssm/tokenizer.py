"""Text <-> token ids: raw bytes (the package's own models) or a `tokenizer.json` read by Hugging Face's
`tokenizers` library (GPT-NeoX's BPE of the real Mamba-2 checkpoints, or any other it reads).

    tok = find_tokenizer("path/to/mamba2-130m")          # the folder's tokenizer.json, or bytes for our runs
    ids = tok.encode("def main():")                      # (n,) int64, with the special tokens the file adds
    text = tok.decode(ids)                               # special tokens skipped; text_stream.py: ids as they come

A checkpoint folder may hold another file where its tokenizer.json should be (a Git LFS pointer, a vocab.json,
only a slow tokenizer's vocab.json + merges.txt or tokenizer.model): each is named with the fix.

Special tokens are added as transformers' tokenizer(text) adds them: by the tokenizer.json's own post_processor
(a Llama/Mistral `TemplateProcessing` "<s> $A" puts BOS first; GPT-NeoX's ByteLevel one adds nothing).
transformers 5.24 reads a folder's tokenizer.json that way whatever tokenizer_config.json's add_bos_token /
add_eos_token say (from_pretrained drops those flags when there is a tokenizer.json; tests/test_tokenizer.py
checks it against AutoTokenizer), so they change nothing here either.
"""
from __future__ import annotations

import json
import os
import re
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .io.file_checks import broken_link, require_regular_file
from .io.memory import available_memory
from .io.hub_cache import hub_snapshot
from .io.text_pieces import TooLongWithoutCut, cut_rule, special_tokens_around, text_pieces
from .tokenizer_files import (OTHER_TOKENIZER_FILES, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, configs_beside,  # noqa: F401
                              no_tokenizer_json, what_it_is, with_config_specials)

BYTES = "bytes"  # the name of the byte-level tokenizer wherever a tokenizer is named (flags, train config)
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")  # looked up when no file names the EOS token
# a long text is tokenized in pieces of about this many bytes (the library's Encoding of a text holds ~175 bytes of
# memory per byte of text: 3.5 GB for 20 MB, measured), cut where the pieces give the whole text's tokens
# (io/text_pieces.py)
PIECE_BYTES = 1 << 20
MAX_WHOLE_BYTES = 32 << 20   # a stretch with no cut longer than this is refused (tokenizing it whole: 6-11 GB)
# the least memory a text tokenized whole took per byte of it (16 MB of Python: a Llama-style BPE with no
# pre-tokenizer 90, a BERT WordPiece 178; GPT-NeoX's byte-level BPE 200-350): a text that needs more than the machine
# has at this rate is refused before the library runs it out of memory
WHOLE_TEXT_BYTES_PER_BYTE = 90


class TokenizerError(ValueError):
    """A tokenizer that cannot be read, or that does not fit the model's vocabulary."""


class ByteTokenizer:
    """Token id = byte value (0..255): any text, no file, no unknown token; what `python -m tinygrad_ssm train`
    uses by default."""

    name = BYTES
    vocab_size = 256
    eos_token_id = None
    adds_special_tokens = False
    byte_fallback_ids = skipped_ids = frozenset()   # (FileTokenizer's, for TextStream)

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)       # (n,)

    def encode_bytes(self, data: bytes) -> np.ndarray:
        return self.encode(data)

    def encode_bytes_with_ends(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """encode_bytes, and where each token ends in `data` (bytes): here token i ends at byte i + 1."""
        return self.encode(data), np.arange(1, len(data) + 1)

    def encode_stream(self, blocks) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """encode_bytes_with_ends of the text the byte blocks join into, block by block, ends counted from its
        start (FileTokenizer.encode_stream): any cut gives the same bytes."""
        offset = 0
        for block in blocks:
            if block:
                yield self.encode(block), np.arange(offset + 1, offset + len(block) + 1)
                offset += len(block)

    def decode(self, ids) -> str:
        """Invalid UTF-8 and ids past 255 (a padded vocabulary's) become U+FFFD."""
        ids = [int(i) for i in ids]
        pieces, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
            else:
                pieces.append(run.decode("utf-8", errors="replace") + "\ufffd")
                run = bytearray()
        return "".join(pieces) + run.decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        return BYTES

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def __repr__(self):
        return "ByteTokenizer()"


class FileTokenizer:
    """A tokenizer.json through the `tokenizers` library. encode adds the special tokens its post_processor adds
    (a BOS for a Llama-style tokenizer, nothing for GPT-NeoX's), as transformers' tokenizer(text) does; decode
    skips them (a BOS or an EOS is no text)."""

    def __init__(self, path: str | Path, eos_token_id: int | None = None, text: str | None = None,
                 special_config: dict | None = None, other_config: dict | None = None):
        """`text`: the tokenizer.json's text, already read (e.g. sent by MPI rank 0); `path` then only names it,
        and `eos_token_id`, `special_config` (its tokenizer_config.json's special-token keys) and `other_config`
        (the rest) are taken as given (nothing is looked up beside the path)."""
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # a core dependency; only a broken install lacks it
            raise TokenizerError(f"reading {str(path)!r} needs the tokenizers library (pip install tokenizers): "
                                 f"{e}") from None
        self.path = Path(path)
        if text is None:
            require_regular_file(self.path, "tokenizer", TokenizerError)
        try:
            self._json = self.path.read_text(encoding="utf-8") if text is None else text   # a checkpoint copies it
            self._tok = Tokenizer.from_str(self._json)
        except UnicodeDecodeError as e:
            raise TokenizerError(f"{str(self.path)!r} is not UTF-8 text (byte {e.start}): not a tokenizer.json") \
                from None
        except OSError as e:   # unreadable (permissions, EIO): the parser's message below read an unset _json
            raise TokenizerError(f"cannot read the tokenizer {str(self.path)!r}: {e.strerror or e}") from None
        except Exception as e:  # noqa: BLE001  (tokenizers raises a bare Exception with the parser's message)
            raise TokenizerError(f"{str(self.path)!r} is not a tokenizer.json the tokenizers library can read: "
                                 f"{what_it_is(self._json, self.path) or e}") from None
        self.special_config, self.other_config = (configs_beside(self.path.parent) if text is None else
                                                  (dict(special_config or {}), dict(other_config or {})))
        self._as_used()
        # a file saved with truncation or padding set (a T5 or BERT fine-tune's max_length) would cut and pad every
        # text; transformers' tokenizer(text) does neither, nor does encode
        self._tok.no_truncation()
        self._tok.no_padding()
        self.name = str(self.path)
        # the ids a model needs rows for: the highest + 1 (a vocabulary with gaps in its ids has fewer entries)
        self.vocab_size = max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        if self.special_config.get("split_special_tokens") is True:
            self._tok.encode_special_tokens = True  # "<|endoftext|>" written in a text is its characters
        self.eos_token_id = eos_token_id if eos_token_id is not None or text is not None else self._find_eos()
        self.adds_special_tokens = int(self._tok.num_special_tokens_to_add(False)) > 0
        self.byte_fallback_ids, self.skipped_ids = self._stream_ids()
        self.cuts_in_pieces = self._cuts_in_pieces()
        from tokenizers import decoders
        self.byte_level = isinstance(self._tok.decoder, decoders.ByteLevel)  # a token's characters are its bytes
        if self.eos_token_id is not None and not 0 <= self.eos_token_id < self.vocab_size:
            raise TokenizerError(f"the EOS token id {self.eos_token_id} is outside {str(self.path)!r}'s vocabulary "
                                 f"of {self.vocab_size}")

    def _as_used(self) -> None:
        """`_spec`, the tokenizer.json as encode uses it, and `_tok` built from it. Offsets as the text has them: a
        ByteLevel post-processor (GPT-2's, GPT-NeoX's; inside a Sequence, Llama-3's) trims whitespace off them, so a
        token of spaces or a newline got an empty span at its start: a text's first token " " then covered no byte,
        and eval, which scores the bytes after the first token, counted one too many (the ids are the same either
        way). The tokens tokenizer_config.json names special (tokenizer_files.with_config_specials). The file a
        checkpoint copies is left as it was."""
        from tokenizers import Tokenizer

        try:
            stated = json.loads(self._json)
        except ValueError:
            stated = None
        self._spec = stated if isinstance(stated, dict) else {}
        post = self._spec.get("post_processor")
        steps = post.get("processors", []) if isinstance(post, dict) and post.get("type") == "Sequence" else [post]
        trimming = [s for s in steps if isinstance(s, dict) and s.get("type") == "ByteLevel" and s.get("trim_offsets")]
        for step in trimming:
            step["trim_offsets"] = False
        vocab = self._tok.get_vocab(with_added_tokens=True)
        if with_config_specials(self._spec, vocab, self.special_config, self.other_config) or trimming:
            self._tok = Tokenizer.from_str(json.dumps(self._spec))

    def _stream_ids(self) -> tuple[frozenset, frozenset]:
        """The ids of a byte-fallback BPE's byte tokens (<0x00>..<0xFF>), whose runs the ByteFallback decoder
        decodes together, and the special tokens' ids, which decode skips (TextStream reads both)."""
        model = self._spec.get("model") or {}
        byte_ids = frozenset()
        if isinstance(model, dict) and model.get("byte_fallback"):
            ids = (self._tok.token_to_id(f"<0x{b:02X}>") for b in range(256))        # None: no such token
            byte_ids = frozenset(i for i in ids if i is not None)
        skipped = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)
        return byte_ids, skipped

    def _cuts_in_pieces(self) -> bool:
        """Whether a long text is tokenized in pieces: where text_pieces.cut_rule proves a cut exact for this
        tokenizer.json (GPT-NeoX's ByteLevel, Llama-3's Split, Metaspace, Llama-2's and Mistral's one BPE word) and
        its post_processor only adds special tokens around a text (special_tokens_around: the first piece gets those
        before, the last those after). Any other tokenizer reads a text whole. Sets `_rule`, `_around` and `_added`,
        the added tokens' texts, which text_pieces cuts beside none of."""
        self._rule, self._around, self._added = None, ([], []), ()
        spec = self._spec
        if not spec:
            return False
        added = [t for t in spec.get("added_tokens") or [] if isinstance(t, dict)]
        self._added = tuple(str(t["content"]).encode("utf-8") for t in added if t.get("content"))
        rule = cut_rule({**spec, "truncation": None, "padding": None}, self._tok.token_to_id)  # (both off: __init__)
        around = special_tokens_around(spec)
        if rule is None or around is None:
            return False
        probe = "a b\n"                  # the special tokens parsed are those the library adds, or none is trusted
        if self._tok.encode(probe).ids != around[0] + self._tok.encode(probe, add_special_tokens=False).ids + around[1]:
            return False
        self._rule, self._around = rule, around
        return True

    def _find_eos(self) -> int | None:
        """The eos_token stated beside the file (_read_special_config; null: none, as transformers has it), else a
        usual EOS name: a special added token's first (Llama-3's <|end_of_text|>), then one in the vocabulary (a
        byte-level BPE may have learnt "</s>" from text as an ordinary token: Qwen2's has). A stated token the file
        lacks (a chat fine-tune's <|im_end|> beside its base model's tokenizer.json) is passed over for those names."""
        if "eos_token" in self.special_config:
            eos = self.special_config["eos_token"]
            eos = eos.get("content") if isinstance(eos, dict) else eos
            if eos is None:
                return None
            if isinstance(eos, str) and self._tok.token_to_id(eos) is not None:
                return int(self._tok.token_to_id(eos))
        specials = {t.content: int(i) for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        for name in EOS_NAMES:
            if name in specials:
                return specials[name]
        for name in EOS_NAMES:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        return None

    def encode(self, text: str) -> np.ndarray:
        """(n,) int64: transformers' tokenizer(text)["input_ids"] (the special tokens the post_processor adds)."""
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """A file's bytes: decoded as UTF-8 (each invalid byte becomes one U+FFFD, which the BPE encodes); a long
        text in pieces (encode_stream)."""
        if len(data) <= PIECE_BYTES or not self.cuts_in_pieces:
            self._check_fits_whole(len(data))
            return self.encode(_utf8_text(data))
        return np.concatenate([ids for ids, _ in self.encode_stream([data])])

    def encode_stream(self, blocks) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """encode_bytes_with_ends of the text the byte blocks join into, a piece at a time, ends counted from its
        start: joined, the arrays of the whole text's encode_bytes_with_ends. A tokenizer that `cuts_in_pieces`
        takes pieces of about PIECE_BYTES cut by its rule (memory flat in the text's length), any other the text
        whole."""
        if not self.cuts_in_pieces:
            text = b"".join(blocks)
            self._check_fits_whole(len(text))
            yield self.encode_bytes_with_ends(text)
            return
        (before, after), offset, last = self._around, 0, None
        for i, piece in enumerate(self._pieces(blocks)):
            ids, ends = self._piece_ids_ends(piece, first=i == 0)
            if i == 0:
                ids, ends = np.concatenate([before, ids]).astype(np.int64), np.concatenate([[0] * len(before), ends])
            if last is not None:
                yield last
            last = ids, (ends + offset).astype(np.int64)
            offset += len(piece)
            if not after:               # (held back only for the tokens after the text: a reader may stop early)
                yield last
                last = None
        if offset == 0:                       # an empty text: the special tokens alone, as the library gives them
            last = np.asarray(before, dtype=np.int64), np.zeros(len(before), dtype=np.int64)
        if last is not None and len(last[0]) + len(after):
            ids, ends = last
            end = ends[-1] if len(ends) else 0
            yield np.concatenate([ids, after]).astype(np.int64), \
                np.concatenate([ends, [end] * len(after)]).astype(np.int64)

    def _check_fits_whole(self, n_bytes: int) -> None:
        """A text this tokenizer reads whole (no cut proven exact for it) that would need more memory than the
        machine has left is refused, naming the fix, rather than run it out of memory."""
        available = available_memory() if n_bytes > PIECE_BYTES else None
        if available is not None and n_bytes * WHOLE_TEXT_BYTES_PER_BYTE > available:
            raise TokenizerError(
                f"a text of {n_bytes / 2**20:,.0f} MB to tokenize whole with {self.name!r}, which has no rule under "
                f"which cutting a text into pieces is sure to give the same tokens (io/text_pieces.py: cut_rule), so "
                f"the library reads it at once, at {WHOLE_TEXT_BYTES_PER_BYTE}-350 bytes of memory per byte "
                f"(~{n_bytes * WHOLE_TEXT_BYTES_PER_BYTE / 2**30:,.1f} GB or more), and this machine has "
                f"{available / 2**30:,.1f} GB available: split the text into files of a few MB each and give "
                f"--document-end eos (each file is then a text of its own, an EOS after it), or use a tokenizer "
                f"of a kind cut_rule cuts (a byte-level, Metaspace or one-word BPE)")

    def _pieces(self, blocks) -> Iterator[bytes]:
        """text_pieces by the tokenizer's rule; a stretch past MAX_WHOLE_BYTES with no cut is refused: the library
        would hold ~200-350 bytes of memory per byte of it (a 20 MB line: 4 GB; an audit's figures)."""
        try:
            yield from text_pieces(blocks, PIECE_BYTES, self._added, self._rule.cut, MAX_WHOLE_BYTES)
        except TooLongWithoutCut as e:
            raise TokenizerError(f"{e} (where this tokenizer never joins across, its {self._rule.name} rule of "
                                 f"io/text_pieces.py: line breaks, or spaces for a Metaspace one); the library would "
                                 f"hold ~200-350 bytes of memory per byte of it at once: break the text into lines "
                                 f"(e.g. fold -s -w 1000 FILE > FILE.txt), or convert it to UTF-8 if it is UTF-16") \
                from None

    def _piece_ids_ends(self, piece: bytes, first: bool) -> tuple[np.ndarray, np.ndarray]:
        """A piece's ids and ends without special tokens; a piece after the first of a one-word text without the
        tokens of the "▁" it gets at its start that the whole text has only once (CutRule.drop_to: the piece starts
        with a line break, whose token no merge joins to the "▁")."""
        ids, ends = self._ids_ends(piece, False, first)
        if self._rule.drop_to is not None and not first:
            at = np.flatnonzero(ids == self._rule.drop_to)
            if not len(at):   # (text_pieces cut before a line break: its token is there)
                raise RuntimeError(f"a piece of a text cut before a line break has no line break token: {piece[:40]!r}")
            ids, ends = ids[at[0]:], ends[at[0]:]
        return ids, ends

    def encode_bytes_with_ends(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """encode_bytes, and where each token ends in `data`, in bytes (bits per byte count a file's own bytes:
        not U+FFFD's three for an invalid one, nor an empty string for a special token written in the text). A
        token that ends inside a character (a byte-level BPE may split one) counts up to the character's end. A
        special token the post_processor adds (a BOS first, an EOS last) covers no bytes: it ends where the token
        before it does (0 for a BOS), though the library gives its offsets as (0, 0)."""
        return self._ids_ends(data, add_special_tokens=True)

    def _ids_ends(self, data: bytes, add_special_tokens: bool, first: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """encode_bytes_with_ends of `data`, a whole text or a piece of one (`first`: the text's first piece, where
        the text's first token is; a later piece's first character has a token before it in the whole text)."""
        text = _utf8_text(data)
        encoding = self._tok.encode(text, add_special_tokens=add_special_tokens)
        ends = [end for _, end in encoding.offsets]
        text_tokens = [i for i, special in enumerate(encoding.special_tokens_mask) if not special]
        shared = first and len(text_tokens) >= 2 and encoding.offsets[text_tokens[1]][0] < ends[text_tokens[0]]
        if shared:
            # the first token shares its character with the next: the "▁" a Llama-style normalizer prepends has
            # the offsets of the character after it, so it ends where that begins (eval left the first character
            # out of the bytes its scored tokens cover); a first character split into byte tokens ends there too
            # here, and below where its bytes end when the tokenizer is byte-level
            ends[text_tokens[0]] = encoding.offsets[text_tokens[1]][0]
        ends_in_chars = np.maximum.accumulate(np.asarray(ends or [0], dtype=np.int64))[:len(encoding.ids)]  # (n,)
        bytes_before = np.concatenate([[0], np.cumsum(_utf8_lengths(data, text))])         # (chars + 1,)
        byte_ends = bytes_before[ends_in_chars]                                              # (n,)
        if text_tokens:
            # every byte of the text is some token's: an NFC normalizer's offsets put a composed character at its
            # first character only ("café" with a combining accent ended a byte short), a BERT one drops trailing
            # spaces; the last text token (and the special tokens after it) ends at the text's end
            last = text_tokens[-1]
            byte_ends[last:] = np.maximum(byte_ends[last:], len(data))
        if shared and self.byte_level:  # "日" as "æĹ" + "¥": the first token is the character's first 2 bytes
            first = text_tokens[0]
            start, end = encoding.offsets[first]   # (an invalid byte read as U+FFFD is 3 token bytes but 1 of the text)
            byte_ends[first] = min(bytes_before[start] + len(encoding.tokens[first]), bytes_before[end])
        return np.asarray(encoding.ids, dtype=np.int64), byte_ends

    def decode(self, ids) -> str:
        """An id past the vocabulary (a padded vocabulary's) becomes U+FFFD where it stands."""
        pieces, run = [], []
        for i in (int(i) for i in ids):
            if 0 <= i < self.vocab_size:
                run.append(i)
            else:
                pieces.append(self._tok.decode(run, skip_special_tokens=True) + "\ufffd")
                run = []
        return "".join(pieces) + self._tok.decode(run, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary writes it, special tokens too (<|endoftext|>), which decode skips."""
        return self._tok.decode([int(token_id)], skip_special_tokens=False)

    def fingerprint(self) -> str:
        """Changes when the tokenizer does: a resumed run must tokenize its data as before. A tokenizer that adds
        special tokens is marked (its data gained them when encode began to add them); one that adds none keeps the
        fingerprint it had before, so its runs resume."""
        crc = f"crc32:{zlib.crc32(self._json.encode('utf-8')):08x}"
        return f"{crc}+special-tokens" if self.adds_special_tokens else crc

    def to_str(self) -> str:
        """The tokenizer.json's text, as read."""
        return self._json

    def __repr__(self):
        return f"FileTokenizer({self.name!r}, vocab {self.vocab_size}, eos {self.eos_token_id})"


def _utf8_text(data: bytes) -> str:
    """`data` as UTF-8 text, each byte that is not valid UTF-8 one U+FFFD (so characters map to bytes one by one)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return re.sub("[\udc80-\udcff]", "\ufffd", data.decode("utf-8", errors="surrogateescape"))


def invalid_utf8_bytes(data: bytes) -> int:
    """How many bytes of `data` are not valid UTF-8 (a tokenizer.json's BPE reads each as U+FFFD)."""
    try:
        data.decode("utf-8")
        return 0
    except UnicodeDecodeError:
        return len(re.findall("[\udc80-\udcff]", data.decode("utf-8", errors="surrogateescape")))


def _utf8_lengths(data: bytes, text: str) -> np.ndarray:
    """How many of `data`'s bytes each character of `_utf8_text(data)` stands for (an invalid byte's U+FFFD: 1)."""
    escaped = data.decode("utf-8", errors="surrogateescape")
    points = np.frombuffer(escaped.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)   # (chars,)
    invalid = (points >= 0xDC80) & (points <= 0xDCFF)
    return np.where(invalid, 1, 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000))


def load_tokenizer(spec: str | Path, eos_token_id: int | None = None):
    """`bytes`, a tokenizer.json, or a folder holding one."""
    if str(spec) == BYTES:
        return ByteTokenizer()
    path = Path(spec).expanduser()
    try:   # a Hugging Face cache's repository folder (EleutherAI/gpt-neox-20b's): the snapshot refs/main names
        path = (hub_snapshot(path) or path) if path.is_dir() and path.name != TOKENIZER_FILE else path
    except FileNotFoundError as e:
        raise TokenizerError(f"--tokenizer {str(spec)!r}: {e}") from None
    if path.is_dir() and path.name != TOKENIZER_FILE:
        path = path / TOKENIZER_FILE
        if not os.path.lexists(path):
            raise TokenizerError(f"--tokenizer {str(spec)!r}: {no_tokenizer_json(path.parent)}")
    if os.path.lexists(path) and not path.is_file():   # a dangling link (a pruned cache's blob), a folder: named
        raise TokenizerError(f"--tokenizer {str(spec)!r}: {broken_link(path) or repr(str(path)) + ' is not a file'}")
    if not path.exists():
        raise TokenizerError(f"--tokenizer {str(spec)!r}: no such file (give a tokenizer.json, a folder holding "
                             f"one, or {BYTES!r})")
    try:
        return FileTokenizer(path, eos_token_id)
    except TokenizerError as e:  # a file that is not a tokenizer.json: named with the flag that gave it
        raise TokenizerError(f"--tokenizer {str(spec)!r}: {e}") from None


def find_tokenizer(model_dir: str | Path, vocab_size: int, *, override: str | None = None, is_our_run: bool = False,
                   eos_token_id: int | None = None):
    """The tokenizer of the model in `model_dir`: `override` (--tokenizer) if given, else the folder's
    tokenizer.json (a checkpoint folder of ours: also its run folder's), else bytes for a model of 256 ids or
    one our training wrote (`is_our_run`). Checked against the model's vocabulary size. An override with another
    vocabulary than the folder's own tokenizer is used, with a warning naming both (a model of 300 ids trained on
    a BPE passed `--tokenizer bytes` fits the size check, and every text would come out wrong)."""
    folder = Path(model_dir)
    if override is None:
        tok = _own_tokenizer(folder, vocab_size, is_our_run, eos_token_id)
        check_fits(tok, vocab_size, folder)
    else:
        tok = load_tokenizer(override, eos_token_id)
        check_fits(tok, vocab_size, folder)
        try:
            own = _own_tokenizer(folder, vocab_size, is_our_run, eos_token_id)
        except TokenizerError:                                          # none of its own: nothing to compare
            own = None
        if own is not None and own.vocab_size != tok.vocab_size:
            warnings.warn(f"--tokenizer {str(override)!r} ({tok.vocab_size} tokens) replaces the tokenizer of the "
                          f"model in {str(folder)!r}, {own.name!r} ({own.vocab_size} tokens), which it was trained "
                          f"with: the same ids are other text in the two; leave --tokenizer out to use the model's "
                          f"own", stacklevel=2)
    return tok


def _own_tokenizer(folder: Path, vocab_size: int, is_our_run: bool, eos_token_id: int | None):
    """find_tokenizer without an override: the folder's tokenizer.json, else bytes where that is the model's."""
    own = folder / TOKENIZER_FILE
    if os.path.lexists(own) and not own.is_file():  # was read as "none": bytes for a small model, no word
        raise TokenizerError(f"{broken_link(own) or repr(str(own)) + ' is not a regular file'}; or give "
                             f"--tokenizer PATH")
    found = next((p for p in (folder / TOKENIZER_FILE, folder.parent.parent / TOKENIZER_FILE)
                  if p.is_file() and (p.parent == folder or folder.parent.name == "checkpoints")), None)
    if found is not None:
        return FileTokenizer(found, eos_token_id)
    if is_our_run or vocab_size <= 256:
        return ByteTokenizer()
    found = any((folder / name).is_file() for name in OTHER_TOKENIZER_FILES)
    raise TokenizerError(f"{no_tokenizer_json(folder)}" + ("" if found else
                         f" and its model has a vocabulary of {vocab_size} (not bytes): pass --tokenizer "
                         f"PATH with the tokenizer.json it was trained with (for state-spaces/mamba2-*: "
                         f"EleutherAI/gpt-neox-20b's)"))


PADDING_ROWS = 128  # the most rows a checkpoint's vocabulary has past its tokenizer's (padding to a multiple)


def check_fits(tok, vocab_size: int, where) -> None:
    """A tokenizer whose ids the model cannot embed, or one far smaller than the model's vocabulary (more of
    its ids than padding would have no text: `--tokenizer bytes` on a BPE model), is refused, naming both sizes."""
    if tok.vocab_size > vocab_size:
        raise TokenizerError(f"the tokenizer {tok.name!r} has {tok.vocab_size} tokens but the model in "
                             f"{str(where)!r} has a vocabulary of {vocab_size}: they were not trained together; "
                             f"pass the model's own tokenizer with --tokenizer")
    if vocab_size - tok.vocab_size > PADDING_ROWS:
        raise TokenizerError(f"the tokenizer {tok.name!r} has {tok.vocab_size} tokens but the model in "
                             f"{str(where)!r} has a vocabulary of {vocab_size}: {vocab_size - tok.vocab_size} of "
                             f"its ids would have no text (padding adds fewer than {PADDING_ROWS}), so they were "
                             f"not trained together; pass the model's own tokenizer with --tokenizer")
