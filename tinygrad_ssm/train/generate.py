"""Text from a byte-level model: load a checkpoint (or a from_pretrained folder), stream decoded text.

A byte model may emit a sequence that is not valid UTF-8 (a multi-byte character cut short, a stray
continuation byte). An incremental decoder with errors="replace" turns those into U+FFFD as they come,
and holds back the bytes of a character that is still incomplete, so streaming never crashes and never
prints half a character.
"""
from __future__ import annotations

import codecs
import os
import unicodedata
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..io.checkpoints import CHECKPOINTS_DIR, STATE_FILE, CheckpointNotFound, resolve_checkpoint
from ..models.mamba2 import Mamba2LMHeadModel

EMPTY_PROMPT_BYTES = b"\n"  # the model needs at least one byte of context; a newline starts a fresh line


def load_model(path: str | os.PathLike, backend: str = "auto"):
    """A training run folder, one of its checkpoints, or any save_pretrained/from_pretrained folder."""

    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointNotFound(f"--checkpoint {str(p)!r} does not exist")
    try:
        folder = resolve_checkpoint(p)
    except CheckpointNotFound:
        if (p / CHECKPOINTS_DIR).exists() and not (p / "config.json").is_file():
            raise  # a run folder whose checkpoints/LATEST is bad: resolve_checkpoint's message says how
        folder = p  # not a training checkpoint: let from_pretrained judge the folder
    if not (folder / "config.json").is_file():
        raise CheckpointNotFound(f"{str(p)!r} has no training checkpoint ({STATE_FILE}, checkpoints/LATEST) "
                                 f"and no config.json for from_pretrained")
    return Mamba2LMHeadModel.from_pretrained(folder, backend=backend)


def escape_controls(text: str) -> str:
    """Control characters (C0 but newline and tab, DEL, C1) as \\xNN / \\uNNNN, so that a sample cannot move the
    cursor, clear the screen or ring the bell of the terminal it is printed on; everything else unchanged."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) != "Cc" else
                   (f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}") for ch in text)


def prompt_ids(prompt: str | bytes) -> np.ndarray:
    """(1, l) int64 byte ids of the UTF-8 prompt (a newline for an empty prompt)."""
    data = prompt.encode("utf-8") if isinstance(prompt, str) else bytes(prompt)
    return np.frombuffer(data or EMPTY_PROMPT_BYTES, dtype=np.uint8).astype(np.int64)[None, :]


def stream_text(model, prompt: str | bytes, max_new_tokens: int, *, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None, seed: int | None = None) -> Iterator[str]:
    """Yield decoded text pieces as bytes are generated (invalid UTF-8 -> U+FFFD, never an exception)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for ids in model.generate_stream(prompt_ids(prompt), max_new_tokens, temperature=temperature,
                                     top_k=top_k, top_p=top_p, seed=seed):
        byte = int(np.asarray(ids).reshape(-1)[0])
        if not 0 <= byte < 256:  # a padded-vocabulary id: not a byte at all
            piece = "\ufffd"
        else:
            piece = decoder.decode(bytes([byte]))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def sample_text(model, prompt: str | bytes, max_new_tokens: int, on_piece: Callable[[str], None] | None = None,
                **sampling) -> str:
    pieces = []
    for piece in stream_text(model, prompt, max_new_tokens, **sampling):
        pieces.append(piece)
        if on_piece is not None:
            on_piece(piece)
    return "".join(pieces)
