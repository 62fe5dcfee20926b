"""`eval`: perplexity and bits per byte of a model on a text file or folder (or, for a run of ours, on its own
validation split), streamed through models/mamba2/evaluation.py in windows with the state carried.

Bits per byte are the total bits over the text's bytes (less the first token's, which nothing predicts): the
measure that compares models with different tokenizers, and what training reports for a byte-level run.
"""
from __future__ import annotations

import codecs
import collections
import itertools
import json
import math
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..models.mamba2.evaluation import evaluate_pieces
from .config import TrainConfig
from ..tokenizer import invalid_utf8_bytes
from .batches import eval_window_starts
from .eval_report import REPORT_MARK, REPORT_MARK_VALUE, is_eval_report, report_text, write_report  # noqa: F401
from .data import (_BINARY_SNIFF_BYTES, Corpus, DataError, _count, _looks_binary, _records, document_ids, file_texts,
                   folder_files, json_as_text_note, left_out_note, load_corpus, non_utf8_note, require_eos_token,
                   split_ids, utf16_mark)
from .generate import _run_tokenizer, load_tokenizer_for, resolve_model_folder
from .json_records import NAMED_SUFFIX, TEXT_FIELD, check_text_field, is_json_lines, reads_records
from .loop import evaluate




EOS_AFTER_FILES = ", each followed by the EOS token"   # the data line's words for --document-end eos
READ_BLOCK = 1 << 20  # bytes read from a file at a time: eval holds a block and a tokenizer's piece, not the text


@dataclass
class TextRead:
    """What eval learns of a text as it reads it: the bytes a tokenizer.json reads as U+FFFD (not UTF-8) and the
    files holding them, said on stderr as training says it (data.non_utf8_note); nothing counted for bytes."""

    invalid_utf8_bytes: int = 0
    non_utf8_files: list[str] = field(default_factory=list)  # in reading order, " (UTF-16)" where it looks so
    file_names: tuple[str, ...] = ()  # a --data folder's text files, in reading order: the report's "files"
    file_ends: list[int] = field(default_factory=list)  # where each file read to its end ends in the joined text
    # where each document read to its end ends: a file's, or each record's of a .jsonl file (--document-end eos)
    document_ends: list[int] = field(default_factory=list)

    def count(self, name: str, invalid: int) -> None:
        self.invalid_utf8_bytes += invalid
        if not self.non_utf8_files or self.non_utf8_files[-1] != name:   # (read in order: a file's blocks follow)
            self.non_utf8_files.append(name)

    def non_utf8_note(self) -> str | None:
        return non_utf8_note(self.invalid_utf8_bytes, tuple(self.non_utf8_files)) if self.invalid_utf8_bytes else None


@dataclass(frozen=True)
class EvalText:
    """A text to score, read as it is scored (memory flat in its length)."""

    blocks: Callable[[], Iterator[bytes]]  # a fresh iterator over the text's bytes, READ_BLOCK at a time
    size: int | None  # its bytes (None: known once read, a .jsonl file's records' texts)
    source: str  # what the user is told was scored
    read: TextRead = field(default_factory=TextRead)  # filled in as `blocks` reads the text
    # (ids, ends) pieces of the text where they are not its tokenizer's encode_stream of `blocks`: a run's split
    # whose files each end with an EOS (--document-end eos)
    pieces: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]] | None = None

    @property
    def data(self) -> bytes:
        """The whole text (a test's or a small text's convenience: scoring reads `blocks`)."""
        return b"".join(self.blocks())


def _file_blocks(path: Path, text_field: str, records: bool) -> Iterator[bytes]:
    """The file's bytes, READ_BLOCK at a time; with `records`, its records' texts (json_records.py), each followed by
    b"" (where a document ends: a file's blocks are never empty)."""
    if records:                                                         # read as train reads it
        for _, text in _records(path, text_field, f"--data file {str(path)!r}"):
            if text:
                yield from (text[i:i + READ_BLOCK] for i in range(0, len(text), READ_BLOCK))
                yield b""
        return
    try:
        with open(path, "rb") as f:
            while block := f.read(READ_BLOCK):
                yield block
    except OSError as e:
        raise DataError(f"cannot read corpus file {str(path)!r}: {e.strerror or e}") from e


_ESCAPED = re.compile("[\udc80-\udcff]")  # an invalid byte, decoded with errors="surrogateescape"


def _read_files(files: list[tuple[Path, str]], read: TextRead, count_utf8: bool,
                text_field: str = TEXT_FIELD, named: bool = False) -> Iterator[bytes]:
    """The (path, name) files' bytes (a .jsonl file's records' texts), joined, READ_BLOCK at a time; with count_utf8
    (a tokenizer.json reads the text), `read` counts the bytes that are not UTF-8 as they go by
    (tokenizer.invalid_utf8_bytes's count, a block at a time: the incremental decoder keeps a character cut between
    two blocks whole)."""
    read.invalid_utf8_bytes, read.non_utf8_files[:], read.file_ends[:], read.document_ends[:] = 0, [], [], []
    offset = 0
    for path, name in files:
        decoder, head = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape"), b""
        blocks = _file_blocks(path, text_field, reads_records(path, named))
        for block in itertools.chain(blocks, [None]):                    # None: the file's end
            offset += len(block or b"")
            if not block and offset > (read.document_ends[-1] if read.document_ends else 0):
                read.document_ends.append(offset)                        # a record's end, or the file's
            if block == b"":
                continue
            if block is None:      # (before the next file's first block is handed on: see _FileFigures)
                read.file_ends.append(offset)
            if count_utf8:
                head = head or (block or b"")[:2]
                text = decoder.decode(block or b"", final=block is None)
                if not text.isascii() and (invalid := len(_ESCAPED.findall(text))):
                    read.count(name + utf16_mark(head), invalid)     # as read: --max-tokens may stop inside a file
            if block is not None:
                yield block


def _text_file(path: Path) -> tuple[int, str | None]:
    """(the size of a folder's file that eval reads, 0 for an empty or a binary one; None for a text file, else the
    binary one's mark, " (UTF-16)" where it looks so: the first bytes decide, and a .jsonl file is never one: its
    lines are read as JSON, as train reads them)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_BINARY_SNIFF_BYTES)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise DataError(f"cannot read corpus file {str(path)!r}: {e.strerror or e}") from e
    binary = bool(head) and _looks_binary(head) and not is_json_lines(path)
    return (0 if not head or binary else max(size, len(head))), utf16_mark(head) if binary else None


def run_validation_split(folder: Path, tokenizer) -> tuple[Corpus, np.ndarray, TrainConfig]:
    """(corpus, validation tokens, the run's TrainConfig) of the run the checkpoint `folder` belongs to: its data
    read and split again as training split it, checked against the fingerprint the checkpoint saved (a changed
    data folder would split differently)."""
    state = _saved_trainer_state(folder)
    if state is None:
        raise DataError(f"eval: {str(folder)!r} is not a checkpoint of a tinygrad_ssm run, so it has no "
                        f"validation split of its own; give --data PATH (a text file or a folder)")
    trained = TrainConfig.from_dict(state["train_config"])
    where = ("the standard library" if trained.data is None else repr(trained.data)) + \
        ("" if trained.val_data is None else f", validated on {trained.val_data!r}")
    try:
        corpus = load_corpus(trained.data, seed=trained.data_seed, val_fraction=trained.val_fraction,
                             text_field=trained.text_field, val_path=trained.val_data)
    except DataError as e:
        raise DataError(f"eval: the data this run trained on ({where}) cannot be read now ({e}); give --data "
                        f"PATH to score another text") from None
    val = _validation_tokens(corpus, tokenizer, trained)
    saved = state["data_fingerprint"]
    if (saved.get("val_bytes"), saved.get("val_crc32")) != (len(val), zlib.crc32(val)):
        if _the_runs_tokenizer_fits(folder, state, corpus, trained):  # the data is as it was: --tokenizer is not
            raise DataError(f"eval: --tokenizer {tokenizer.name} is not the tokenizer this run trained with, so "
                            f"its validation split reads to other tokens than the run's; leave --tokenizer out to "
                            f"score the run's split with its own, or give --data PATH to score a text with this one")
        raise DataError(f"eval: the data this run trained on ({where}) has changed since (files added, removed "
                        f"or edited), so its validation split is not the run's any more; give --data PATH to "
                        f"score a text of your choice")
    return corpus, val, trained


def _validation_tokens(corpus: Corpus, tokenizer, trained: TrainConfig) -> np.ndarray:
    return corpus.val if tokenizer.name == "bytes" else \
        split_ids(corpus.val, corpus.val_file_sizes, tokenizer, trained.document_end).astype(np.int32)


def _the_runs_tokenizer_fits(folder: Path, state: dict, corpus: Corpus, trained: TrainConfig) -> bool:
    """Whether the checkpoint's own tokenizer reads the validation data to the tokens the run saved the fingerprint
    of (so a mismatch with another tokenizer is that tokenizer's, not the data's)."""
    try:
        own = load_tokenizer_for(folder, state["model_config"]["vocab_size"])
        val = _validation_tokens(corpus, own, trained)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    saved = state["data_fingerprint"]
    return (saved.get("val_bytes"), saved.get("val_crc32")) == (len(val), zlib.crc32(val))


def validation_text(corpus: Corpus) -> str:
    """What a run validated on, in eval's report: its --val-data, or the split of its --data."""
    return f"the validation data {corpus.val_source}" if corpus.val_source else \
        f"the validation split of {corpus.source}"


def read_eval_text(path: str | None, folder: Path, tokenizer, document_end: str = "none",
                   text_field: str = TEXT_FIELD) -> EvalText:
    """--data (a file, or a folder's text files in sorted order, binary ones skipped); without it, the
    validation split of the run the checkpoint `folder` belongs to (the same files training validated on,
    checked against the fingerprint the checkpoint saved: a changed data folder would split differently; with the
    EOS token after each file where the run put one). `document_end` "eos" (--document-end, for --data): each
    file tokenized alone and followed by the tokenizer's EOS token, as train --document-end eos reads them. A .jsonl
    file (or a .json file given as `path` itself) gives its records' `text_field` strings (json_records.py), each a
    document; a folder's .json files are text, as train reads them."""
    if path is not None and document_end != "none":
        require_eos_token(tokenizer, "the model reads bytes, which have no EOS token; leave --document-end out")
    if path is None:
        corpus, val, trained = run_validation_split(folder, tokenizer)
        files = _count(len(corpus.val_files), corpus.unit)
        ends = EOS_AFTER_FILES if trained.document_end == "eos" else ""
        pieces = None if trained.document_end == "none" else \
            lambda: document_ids(tokenizer, file_texts(corpus.val, corpus.val_file_sizes))
        blocks = lambda: (corpus.val[i:i + READ_BLOCK].tobytes() for i in range(0, len(corpus.val), READ_BLOCK))
        read = TextRead()
        if tokenizer.name != "bytes":  # the split's own bytes, and those of its files that load_corpus named
            read.invalid_utf8_bytes = invalid_utf8_bytes(corpus.val.tobytes())
            read.non_utf8_files = [name for name in corpus.non_utf8_files
                                   if name.removesuffix(" (UTF-16)") in corpus.val_files]
        return EvalText(blocks, len(corpus.val), f"{validation_text(corpus)} ({files}{ends}, as the run "
                                                 f"{'read' if corpus.val_source else 'split'} it)", read, pieces)
    root, count_utf8 = Path(path).expanduser(), tokenizer.name != "bytes"
    ends = EOS_AFTER_FILES if document_end == "eos" else ""
    if root.is_file():
        named, read = [(root, root.name)], TextRead()
        records = reads_records(root, named=True)
        check_text_field(text_field, records, str(root), DataError)
        _check_records(named, text_field, named=True)
        ended = " (each record followed by the EOS token)" if records else " (followed by the EOS token)"
        return EvalText(lambda: _read_files(named, read, count_utf8, text_field, named=True),
                        None if records else root.stat().st_size,
                        str(root) + (ended if ends else ""), read,
                        _documents_of(named, read, count_utf8, tokenizer, text_field, named=True) if ends else None)
    if not root.is_dir():
        raise DataError(f"--data path {str(root)!r} does not exist" if not root.exists() else
                        f"--data path {str(root)!r} is neither a regular file nor a folder")
    run_folders, eval_reports = [], []                                     # left out, as train leaves them out
    sizes = [(p, *_text_file(p)) for p in folder_files(root, run_folders, eval_reports)]  # (path, size, binary)
    texts = [p for p, size, _ in sizes if size]
    if not texts:
        raise DataError(f"--data folder {str(root)!r} holds no text files")
    binary = tuple(p.relative_to(root).as_posix() + mark for p, _, mark in sizes if mark is not None)  # skipped
    skipped = left_out_note(binary, tuple(run_folders), tuple(eval_reports))
    as_text = tuple(p.relative_to(root).as_posix() for p in texts if p.suffix.lower() == NAMED_SUFFIX)
    skipped += f"; {json_as_text_note(as_text)}" if as_text else ""
    named = [(p, p.relative_to(root).as_posix()) for p in texts]                       # named as training names them
    check_text_field(text_field, any(is_json_lines(p) for p, _ in named), str(root), DataError)
    if ends and any(is_json_lines(p) for p in texts):
        ends = ", each file and .jsonl record followed by the EOS token"
    _check_records(named, text_field)
    read = TextRead(file_names=tuple(name for _, name in named))
    size = None if any(is_json_lines(p) for p in texts) else sum(size for _, size, _ in sizes)  # None: known once read
    return EvalText(lambda: _read_files(named, read, count_utf8, text_field), size,
                    f"{root} ({_count(len(texts), 'text file')}{ends}{skipped})", read,
                    _documents_of(named, read, count_utf8, tokenizer, text_field) if ends else None)


def _check_records(files: list[tuple[Path, str]], text_field: str, named: bool = False) -> None:
    """Every record of the files read as records, parsed once before any is scored (as train reads them): a bad
    last record of a million stopped eval with its error after 146 s of scoring, no report written."""
    for path, _ in files:
        if reads_records(path, named):
            for _ in _records(path, text_field, f"--data file {str(path)!r}"):
                pass


def _documents_of(files: list[tuple[Path, str]], read: TextRead, count_utf8: bool, tokenizer, text_field: str,
                  named: bool = False):
    """EvalText.pieces for --document-end eos: data.document_ids of the documents (the files, a .jsonl file's
    records), each read whole (one at a time) and counted in `read` as _read_files counts it."""
    def documents():
        pending, ended = [], 0
        for block in _read_files(files, read, count_utf8, text_field, named):
            if len(read.document_ends) > ended:   # the document before this block has ended (its end recorded)
                yield b"".join(pending)
                pending, ended = [], len(read.document_ends)
            pending.append(block)
        if pending:
            yield b"".join(pending)
    return lambda: document_ids(tokenizer, documents())


def _saved_trainer_state(folder: Path) -> dict | None:
    if _run_tokenizer(folder) is None:
        return None
    return json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))


def score(model, tokenizer, text: EvalText, *, window: int = 512, carry_state: bool = True,
          max_tokens: int | None = None, progress: bool = True) -> dict:
    """Tokenize and score the text as it is read (--max-tokens: only as much of it as needed), and return the
    report (the JSON `eval --json` writes)."""
    from tqdm import tqdm

    pieces = _first_tokens(tokenizer.encode_stream(text.blocks()) if text.pieces is None else text.pieces(),
                           max_tokens)                                   # (ids, ends) pieces
    first = []                                                           # the pieces up to the second token
    for piece in pieces:
        first.append(piece)
        if sum(len(ids) for ids, _ in first) >= 2:
            break
    held = sum(len(ids) for ids, _ in first)
    if held < 2:
        raise DataError(f"eval: {text.source} holds {held} token(s); at least 2 are needed (one to predict "
                        f"from, one to predict)")
    ends = [None, None]                                                  # the first and the last token's end
    files = _FileFigures(text.read.file_names, text.read.file_ends) if text.read.file_names else None

    def ids_of(all_pieces):
        for ids, piece_ends in all_pieces:
            if len(ids):
                ends[0] = piece_ends[0] if ends[0] is None else ends[0]
                ends[1] = piece_ends[-1]
                if files is not None:
                    files.given(piece_ends)
                yield ids

    # the bar counts tokens: a byte text's are known, a tokenizer's only once the whole text is read
    total = min(text.size - 1, text.size if max_tokens is None else max_tokens) \
        if tokenizer.name == "bytes" and text.size is not None else None
    start = time.perf_counter()
    with tqdm(total=total, unit="tok", disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
        result = evaluate_pieces(model, ids_of(itertools.chain(first, pieces)), window, carry_state=carry_state,
                                 progress=bar.update, token_nats=None if files is None else files.scored)
    seconds = time.perf_counter() - start
    scored_bytes = int(ends[1] - ends[0])                                # the text's bytes after the first token
    # none when the scored tokens cover no byte (a one-token text and the EOS a post_processor appends): the bits
    # over one byte were reported, a number of no text
    bits_per_byte = result.bits_per_byte(scored_bytes) if scored_bytes else None
    return {"data": text.source, "tokenizer": tokenizer.name, "tokens": result.tokens,
            "bytes": int(scored_bytes), "mean_nats": result.mean_nats, "perplexity": result.perplexity,
            "bits_per_token": result.bits_per_token, "bits_per_byte": bits_per_byte,
            "window": window, "carry_state": carry_state, "windows": result.windows, "training_windows": False,
            "seconds": seconds, "tokens_per_s": result.tokens / seconds if seconds > 0 else None,
            **({} if files is None else {"files": files.report()})}


class _FileFigures:
    """A folder's figures file by file, in the report's "files": each scored token's loss and the bytes it covers
    (from the end of the token before it to its own) go to the file the token ends in, found from the byte ends
    the tokenizer gives and where each file ends in the joined text. The state is carried across the files, so a
    file's figures are those of its own tokens given all the text before them; added up, they are the totals
    (the first token, which nothing predicts, and its bytes are in no file's, as in no total)."""

    def __init__(self, names: tuple[str, ...], file_ends: list[int]):
        # file_ends grows as the text is read, ahead of the scoring: a token ending past the last recorded end is in
        # the file being read (its end is recorded before the next file's first byte is handed on)
        self.names, self.file_ends = names, file_ends
        self._ends, self._known = np.zeros(16, np.int64), 0               # file_ends[:_known] as an array
        self.waiting: collections.deque = collections.deque()          # (k,) byte ends of tokens not yet scored
        self.last_end = None                                             # the byte end of the last token seen
        self.nats, self.tokens, self.bytes = np.zeros(len(names)), np.zeros(len(names), np.int64), \
            np.zeros(len(names), np.int64)

    def given(self, ends: np.ndarray) -> None:
        self.waiting.append(np.asarray(ends, np.int64))

    def scored(self, nats: np.ndarray) -> None:                          # (w,): the next w predictions' losses
        if self.last_end is None:                                        # the first token: predicted by nothing
            self.last_end = int(self._take(1)[0])
        ends = self._take(len(nats))                                     # (w,)
        spans = np.diff(ends, prepend=self.last_end)                     # (w,) the bytes each token adds
        self.last_end = int(ends[-1])
        file = np.minimum(np.searchsorted(self._file_ends(), ends, side="left"), len(self.names) - 1)   # (w,)
        np.add.at(self.nats, file, nats)
        np.add.at(self.tokens, file, 1)
        np.add.at(self.bytes, file, spans)

    def _file_ends(self) -> np.ndarray:
        """file_ends as an array, the entries added since the last call copied in (its size doubled as needed):
        made anew from the list at every window, it cost 8.6 s of a 54 s eval of 50,000 files."""
        n = len(self.file_ends)
        if n < self._known:                                              # the text read again from its start
            self._known = 0
        if n > self._known:
            if n > len(self._ends):
                self._ends = np.concatenate([self._ends[:self._known], np.zeros(max(n, 2 * len(self._ends)) -
                                                                                self._known, np.int64)])
            self._ends[self._known:n] = self.file_ends[self._known:n]
            self._known = n
        return self._ends[:n]

    def _take(self, n: int) -> np.ndarray:
        parts = []
        while n:
            head = self.waiting.popleft()
            parts.append(head[:n])
            if len(head) > n:
                self.waiting.appendleft(head[n:])
            n -= len(parts[-1])
        return np.concatenate(parts)

    def report(self) -> list[dict]:
        """Each file up to the last with a scored token (--max-tokens may stop before the others); a file whose
        bytes all went into a token that ends in the next file has 0 tokens and no mean."""
        scored = np.flatnonzero(self.tokens)
        return [{"path": self.names[i], "bytes": int(self.bytes[i]), "tokens": int(self.tokens[i]),
                 "mean_nats": float(self.nats[i] / self.tokens[i]) if self.tokens[i] else None,
                 "bits_per_byte": float(self.nats[i] / math.log(2) / self.bytes[i]) if self.bytes[i] else None}
                for i in range(scored[-1] + 1 if len(scored) else 0)]


def _first_tokens(pieces, max_tokens: int | None):
    """The (ids, ends) pieces up to max_tokens + 1 ids (max_tokens predictions), the last one cut; no more of the
    text is read after it."""
    left = None if max_tokens is None else max_tokens + 1
    for ids, ends in pieces:
        if left is not None and len(ids) >= left:
            yield ids[:left], ends[:left]
            return
        yield ids, ends
        left = None if left is None else left - len(ids)


def score_training_windows(model, tokenizer, folder: Path) -> dict:
    """eval --training-windows: the run's validation split scored as training scores it (loop.evaluate: the fixed
    windows of its --seq-len, --batch-size x --eval-batches of them, each from a zero state, bits per byte through
    the split's tokens per byte), so the figure is the one training reported for this checkpoint, to rounding.
    A report with score()'s keys; "bytes" are the windows' share of the split's bytes."""
    corpus, val, trained = run_validation_split(folder, tokenizer)
    tokens_per_byte = len(val) / max(len(corpus.val), 1)
    windows = len(eval_window_starts(len(val), trained.batch_size, trained.seq_len, trained.eval_batches))
    start = time.perf_counter()
    bpb = evaluate(model, val, trained, tokens_per_byte=tokens_per_byte)
    seconds = time.perf_counter() - start
    tokens = windows * trained.seq_len                                   # each window's seq_len targets
    mean_nats = bpb * math.log(2) / tokens_per_byte
    files = _count(len(corpus.val_files), corpus.unit) + (EOS_AFTER_FILES if trained.document_end == "eos" else "")
    return {"data": f"{validation_text(corpus)} ({files}, as the run {'read' if corpus.val_source else 'split'} "
                    f"it), at the windows "
                    f"training scores", "tokenizer": tokenizer.name, "tokens": tokens,
            "bytes": round(tokens / tokens_per_byte), "mean_nats": mean_nats, "perplexity": math.exp(mean_nats),
            "bits_per_token": mean_nats / math.log(2), "bits_per_byte": bpb, "window": trained.seq_len,
            "carry_state": False, "windows": windows, "training_windows": True, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else None}


def describe(report: dict, trained_val_bpb: float | None = None) -> str:
    bpb = report["bits_per_byte"]
    lines = [f"data: {report['data']}",
             f"tokens scored: {report['tokens']:,} ({_count(report['bytes'], 'byte')}; tokenizer "
             f"{report['tokenizer']})",
             f"perplexity {report['perplexity']:.4g}, {report['mean_nats']:.4f} nats and "
             f"{report['bits_per_token']:.4f} bits per token, " + (f"{bpb:.4f} bits per byte" if bpb is not None else
                                                                    "no bits per byte (the scored tokens cover none "
                                                                    "of the text's bytes)"),
             f"windows of {report['window']} tokens, state "
             f"{'carried between them' if report['carry_state'] else 'reset at each'}; "
             f"{report['seconds']:.1f} s ({report['tokens_per_s'] or 0:,.0f} tokens/s)"]
    if report.get("weights", "float") != "float":  # two evals of one folder differ only here: say which was scored
        lines.insert(1, f"weights: {report['weights']} (in_proj, out_proj and the head; the rest in the model's "
                        f"dtype)")
    if report.get("files"):
        lines.append(f"each file's own figures (its tokens, given all the text before them): --json's \"files\" "
                     f"({_count(len(report['files']), 'file')})")
    if trained_val_bpb is not None and report.get("training_windows"):
        lines.append(f"training reported {trained_val_bpb:.4f} bits per byte for this checkpoint, on these windows")
    elif trained_val_bpb is not None:
        lines.append(f"training reported {trained_val_bpb:.4f} bits per byte on its fixed validation windows "
                     f"(a sample of windows of --seq-len, each from a zero state: --training-windows scores "
                     f"those)")
    return "\n".join(lines)


def training_dtype(model: str | os.PathLike) -> str | None:
    """The dtype the run of --model (a run folder or one of its checkpoints) trained in; None for any other
    folder, or one that cannot be read (loading it then says what is wrong)."""
    try:
        state = _saved_trainer_state(resolve_model_folder(model))
    except (OSError, ValueError):
        return None
    config = state.get("train_config") if isinstance(state, dict) else None
    dtype = config.get("dtype") if isinstance(config, dict) else None
    return dtype if dtype in ("float32", "float64") else None


def trained_val_bpb(folder: Path) -> float | None:
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = state.get("val_bpb") if isinstance(state, dict) else None
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None
