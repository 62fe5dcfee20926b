"""Text from a model folder: find the model and its tokenizer, stream the decoded text as it is generated.

Any folder from_pretrained reads is a model folder (a run folder: its newest checkpoint; a checkpoint; a
save_pretrained, mamba_ssm or transformers folder; a Hugging Face cache snapshot; a sharded checkpoint). Its
tokenizer is the folder's tokenizer.json, or bytes for the package's own byte-level runs (tokenizer.py).
Text is streamed through TextStream, which holds back the ids of a character still incomplete (and a
byte-fallback tokenizer's run of byte tokens until it ends): a stream never shows half a UTF-8 character,
joined it is the decode of all the ids, and invalid UTF-8 comes out as U+FFFD, never as an exception.
"""
from __future__ import annotations

import json
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.checkpoints import CHECKPOINTS_DIR, STATE_FILE, CheckpointNotFound, read_newest, resolve_checkpoint
from ..io.file_checks import require_regular_file
from ..models.mamba2 import Mamba2LMHeadModel
from ..io.hub_cache import hub_snapshot
from ..text_stream import TextStream
from ..tokenizer import BYTES, ByteTokenizer, TokenizerError, find_tokenizer
from .generation_config import read_generation_defaults
from .json_records import field_values, parsed_records, reads_records

DEFAULT_PROMPT_BATCH = 32  # --batch-file's prompts decoded together (8 of the 130M shape's: 138 tokens/s against 54)
EMPTY_PROMPT_BYTES = b"\n"  # a byte model needs at least one byte of context; a newline starts a fresh line


def resolve_model_folder(path: str | os.PathLike, flag: str = "--model") -> Path:
    """The folder from_pretrained reads: a run folder's newest checkpoint, the snapshot a Hugging Face cache's
    repository folder names in refs/main, or the folder itself."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointNotFound(f"{flag} {str(p)!r} does not exist")
    p = hub_snapshot(p) or p
    try:
        folder = resolve_checkpoint(p)
    except CheckpointNotFound:
        if (p / CHECKPOINTS_DIR).exists() and not (p / "config.json").is_file():
            raise  # a run folder whose checkpoints/LATEST is bad: resolve_checkpoint's message says how
        folder = p  # not a training checkpoint: let from_pretrained judge the folder
    if not (folder / "config.json").is_file():
        raise CheckpointNotFound(f"{flag} {str(p)!r} has no training checkpoint ({STATE_FILE}, checkpoints/LATEST) "
                                 f"and no config.json for from_pretrained")
    return folder


def _run_tokenizer(folder: Path) -> str | None:
    """What a checkpoint of ours says its run was trained with (`bytes` or a path), None for other folders."""
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = state.get("train_config") if isinstance(state, dict) else None
    return config.get("tokenizer", BYTES) if isinstance(config, dict) else None


def config_eos(folder: Path) -> int | None:
    """config.json's eos_token_id (the transformers layout states it)."""
    try:
        eos = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return None
    return eos if isinstance(eos, int) and not isinstance(eos, bool) else None


def load_tokenizer_for(folder: Path, vocab_size: int, override: str | None = None):
    """The tokenizer of a resolved model folder (see tokenizer.find_tokenizer), checked against vocab_size."""
    trained_with = _run_tokenizer(folder)
    if override is None and trained_with not in (None, BYTES) and not (folder / "tokenizer.json").is_file():
        raise TokenizerError(f"{str(folder)!r} was trained with the tokenizer {trained_with!r} but holds no "
                             f"tokenizer.json; pass --tokenizer PATH with that file")
    return find_tokenizer(folder, vocab_size, override=override, is_our_run=trained_with == BYTES,
                          eos_token_id=config_eos(folder))


def load_model(path: str | os.PathLike, backend: str = "auto", tokenizer: str | None = None, flag: str = "--model",
               weights: str | None = None, dtype: str = "float32", for_generation: bool = True):
    """(model, tokenizer) of any model folder (module docstring); `tokenizer` (--tokenizer) overrides its own.
    weights (--weights): "int8" / "bfloat16" quantize a float folder's model at load (models/mamba2/quantize.py),
    "float32" keeps it float; None: as stored. dtype (--dtype): the float arrays', whatever the folder stores
    (float64: eval's numbers are those of score() on a float64 model). A quantized folder loads only as its own
    format. for_generation: the model's `generation_defaults` are the folder's stop ids and sampling settings
    (generation_config.py); eval leaves them unread, so that a generation_config.json it never uses cannot stop it.
    model.loaded_from: the folder the weights came from (a run folder's checkpoint as LATEST named it then)."""
    if weights == "float32" and dtype != "float32":                     # one flag said float32, the other not
        raise ValueError(f"--weights float32 with the model in {dtype} (--dtype, or with --training-windows the "
                         f"run's dtype): the two disagree; leave --weights out to keep the float weights in {dtype}, "
                         f"or pass --dtype float32")
    # a run folder's newest checkpoint, again if a save beside the load moved LATEST on (io/checkpoints.py)
    return read_newest(path, lambda p: _load_folder(resolve_model_folder(p, flag), backend, tokenizer, weights,
                                                    dtype, for_generation))


def _load_folder(folder: Path, backend, tokenizer, weights, dtype, for_generation):
    model = Mamba2LMHeadModel.from_pretrained(folder, dtype=dtype, backend=backend)
    model.loaded_from = folder
    if for_generation:
        model.generation_defaults = read_generation_defaults(folder, model.config.padded_vocab_size)
    stored = getattr(model, "weights_format", "float")
    if weights is not None and stored != ("float" if weights == "float32" else weights):
        if stored != "float":
            raise ValueError(f"--weights {weights}: {str(folder)!r} holds {stored} weights; load it as saved "
                             f"(leave --weights out) or give the float model's folder")
        model.quantize(weights)
    return model, load_tokenizer_for(folder, model.config.vocab_size, tokenizer)


def escape_controls(text: str) -> str:
    """Control characters (C0 but newline and tab, DEL, C1) as \\xNN / \\uNNNN, so that a sample cannot move the
    cursor, clear the screen or ring the bell of the terminal it is printed on; everything else unchanged."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) != "Cc" else
                   (f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}") for ch in text)


def not_utf8(flag: str, text: str) -> str | None:
    """A message when `text` (from argv) holds bytes that are not UTF-8 (Python keeps them as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        char = ord(text[e.start])
        byte = f"the byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
        return (f"{flag} holds {byte} (character {e.start}), which is not valid UTF-8; give {flag} as UTF-8 "
                f"text")
    return None


def prompt_ids(prompt: str | bytes, tokenizer=None) -> np.ndarray:
    """(l,) int64 ids of the prompt, as transformers' tokenizer(prompt) gives them (with the BOS a Llama-style
    tokenizer.json adds). An empty prompt: a newline for bytes, the tokenizer's own special tokens where it adds
    some ([BOS]), else the EOS token (a document's start) for a tokenizer that has one."""
    tokenizer = tokenizer or ByteTokenizer()
    if isinstance(tokenizer, ByteTokenizer):
        ids = tokenizer.encode(prompt)
        return ids if ids.size else tokenizer.encode(EMPTY_PROMPT_BYTES)
    ids = tokenizer.encode(prompt.decode("utf-8", errors="replace") if isinstance(prompt, bytes) else prompt)
    if ids.size:
        return ids
    if tokenizer.eos_token_id is None:
        raise TokenizerError(f"the prompt is empty and the tokenizer {tokenizer.name!r} has no EOS token to start "
                             f"a document with; give a --prompt")
    return np.array([tokenizer.eos_token_id], np.int64)


def _stops(tokenizer, eos_token_ids) -> tuple[int, ...]:
    """The ids that end a document: eos_token_ids as given, else the tokenizer's EOS (none for bytes)."""
    if eos_token_ids is not None:
        return tuple(int(i) for i in eos_token_ids)
    return () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)


def stream_text(model, prompt: str | bytes, max_new_tokens: int, tokenizer=None, *, stop_at_eos: bool = True,
                eos_token_ids=None, **sampling) -> Iterator[str]:
    """Yield decoded text pieces as tokens are generated (never half a character, never an exception for
    invalid UTF-8); stops at an EOS (eos_token_ids, by default the tokenizer's EOS; the CLI adds the model
    folder's, generation_config.stop_ids) unless stop_at_eos is False (then each EOS is written as its token,
    e.g. <|endoftext|>, between the documents). sampling: temperature, top_k, top_p, seed
    (Mamba2LMHeadModel.generate_stream)."""
    tokenizer = tokenizer or ByteTokenizer()
    ids = prompt_ids(prompt, tokenizer)
    stops = _stops(tokenizer, eos_token_ids)
    # only ids the tokenizer has: a transformers config states its vocabulary padded past the tokenizer's
    tokens = (int(np.asarray(t).reshape(-1)[0]) for t in
              model.generate_stream(ids[None], max_new_tokens, vocab_size=tokenizer.vocab_size, **sampling))
    yield from _text_of(tokenizer, ids, tokens, stop_at_eos, stops)


def _text_of(tokenizer, prompt: np.ndarray, tokens, stop_at_eos: bool, stops=None) -> Iterator[str]:
    """The text of generated ids after the prompt's, in pieces (TextStream): up to the first EOS (an id of
    `stops`, by default the tokenizer's EOS), or with each EOS as its token's text, the text after it decoded as
    a new document."""
    stops = frozenset(_stops(tokenizer, stops))
    stream = TextStream(tokenizer, prompt)
    for token in tokens:
        if token in stops:
            if stop_at_eos:
                break
            yield stream.finish() + tokenizer.token_text(token)
            stream = TextStream(tokenizer)
            continue
        piece = stream.push(token)
        if piece:
            yield piece
    tail = stream.finish()
    if tail:
        yield tail


def sample_text(model, prompt: str | bytes, max_new_tokens: int, on_piece: Callable[[str], None] | None = None,
                tokenizer=None, **sampling) -> str:
    pieces = []
    for piece in stream_text(model, prompt, max_new_tokens, tokenizer, **sampling):
        pieces.append(piece)
        if on_piece is not None:
            on_piece(piece)
    return "".join(pieces)


def generate_batches(model, prompts: list[str], max_new_tokens: int | Callable[[int], int], tokenizer=None, *,
                     batch_size: int = DEFAULT_PROMPT_BATCH, seed: int | None = None, **kwargs):
    """generate_batch over `prompts` batch_size at a time, yielding each batch's texts as it ends: memory bounded by
    batch_size sequences' states, however many prompts. The first batch samples with `seed` (so a file of up to
    batch_size prompts gives generate_batch's texts), batch k after it with a seed drawn from (seed, k): prompts at
    the same place in two batches do not share their draws. max_new_tokens may be a function of a batch's longest
    prompt in tokens (a generation_config.json's max_length counts the prompt: generation_config.new_token_count)."""
    tokenizer = tokenizer or ByteTokenizer()
    for k, start in enumerate(range(0, len(prompts), batch_size)):
        batch_seed = seed if k == 0 or seed is None else int(np.random.SeedSequence([seed, k]).generate_state(1)[0])
        batch = prompts[start:start + batch_size]
        count = max_new_tokens(max(len(prompt_ids(p, tokenizer)) for p in batch)) if callable(max_new_tokens) \
            else max_new_tokens
        yield generate_batch(model, batch, count, tokenizer, seed=batch_seed, **kwargs)


@dataclass(frozen=True)
class Generated:
    """One prompt's continuation (generate_batch): its text, how many ids were generated (the EOS that ended it
    included) and why it ended: "eos" (an end-of-text id) or "length" (max_new_tokens reached)."""

    text: str
    new_tokens: int
    finish: str


def generate_batch(model, prompts: list[str], max_new_tokens: int, tokenizer=None, *, stop_at_eos: bool = True,
                   eos_token_ids=None, **sampling) -> list[Generated]:
    """The continuations of many prompts (of any lengths), decoded together: one batch of b sequences, each
    prefilled from its own prompt (Mamba2LMHeadModel.generate on a list), each ended at an EOS as stream_text
    ends. Returns one Generated per prompt."""
    tokenizer = tokenizer or ByteTokenizer()
    ids = [prompt_ids(p, tokenizer) for p in prompts]
    stops = _stops(tokenizer, eos_token_ids)
    eos = list(stops) if stop_at_eos and stops else None
    rows = model.generate(ids, max_new_tokens, eos_token_id=eos, vocab_size=tokenizer.vocab_size, **sampling)
    results = []
    for prompt, row in zip(ids, rows):                                   # a row is cut after its first EOS
        new = [int(t) for t in row[len(prompt):]]
        ended = eos is not None and len(new) > 0 and new[-1] in stops
        results.append(Generated("".join(_text_of(tokenizer, prompt, iter(new), stop_at_eos, stops)), len(new),
                                 "eos" if ended else "length"))
    return results


def _prompt_text(data: bytes, what: str) -> str:
    """A prompt file's bytes as text (a byte order mark, Notepad's UTF-8, is no text); `what` names the file."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def read_prompt_file(path: str) -> str:
    """--prompt-file: the file's text, whole; "-" reads standard input's bytes."""
    if path == "-":
        if sys.stdin is None:                                           # <&-: Python has no sys.stdin then
            raise ValueError("--prompt-file -: standard input is closed; give the prompt on it, or a file's path")
        data, name = sys.stdin.buffer.read(), "- (standard input)"
    else:
        p = Path(path).expanduser()
        try:
            require_regular_file(p, "--prompt-file", ValueError)
        except ValueError as e:   # --prompt-file <(cmd) is a pipe: "-" reads one
            raise ValueError(f"{e} (or --prompt-file - to read standard input: cmd | ... --prompt-file -)") from None
        data, name = p.read_bytes(), repr(str(p))
    text = _prompt_text(data, f"--prompt-file {name}")
    if not text:
        raise ValueError(f"--prompt-file {name} is empty; leave --prompt-file out for the model to start on its own, "
                         f"or put the prompt into the file")
    return text


def read_batch_file(path: str) -> tuple[list[str], list[int]]:
    """--batch-file: one prompt per line (blank lines skipped), or records {"prompt": ...} for a .jsonl file (one
    a line) or a .json file (a JSON array of them, or one a line: json_records.py). Returns the prompts and the
    line each came from (1-based)."""
    p = Path(path).expanduser()
    require_regular_file(p, "--batch-file", ValueError)
    source = f"--batch-file {str(p)!r}"
    text = _prompt_text(p.read_bytes(), source)
    if not reads_records(p, named=True):
        # cut at "\n" alone, as `wc -l` counts lines (splitlines also cuts at U+2028, form feeds, \x1c-\x1e, ...)
        numbered = [(n, line.removesuffix("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    else:  # cut at "\n" alone: a JSON string may hold U+2028 as it is, where splitlines would cut it
        records = parsed_records(enumerate(text.split("\n"), 1), source, ValueError, p.suffix.lower())
        numbered = list(field_values(records, "prompt", source, 'each record must be an object {"prompt": "text"}'))
    prompts, line_numbers = [line for _, line in numbered], [n for n, _ in numbered]
    if not prompts:
        raise ValueError(f"--batch-file {str(p)!r} holds no prompt")
    return prompts, line_numbers
