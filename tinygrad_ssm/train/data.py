"""The corpus: which files, in which order, split how (the batches drawn from it: train/batches.py).

Text is read as raw bytes (vocabulary 256), so any file works and nothing is downloaded; with --tokenizer (or
a fine-tuned checkpoint's tokenizer) each split's bytes are then tokenized as one text (`tokenize`).
The default corpus is the running interpreter's own standard library (`*.py` under
`sysconfig.get_paths()["stdlib"]`): real text that every Python installation carries.

Choices, and why:
- Test suites (`test/`, `tests/`, `idle_test/` folders) and `site-packages`/`dist-packages` are left out of
  the default. Installed packages differ between machines, and several distributions ship the stdlib without
  its test suite, so leaving both out keeps the default corpus (nearly) the same everywhere. The test suite
  is also full of deliberately odd files (bad encodings, generated data, huge literal tables) that are not
  representative Python.
- Files are sorted by relative path (independent of the file system's listing order), then shuffled with
  `seed`; the first `val_fraction` of them is the validation set. Splitting by file means no validation
  text is ever trained on. A single file is split by bytes instead: its last `val_fraction` is validation.
- A .jsonl file, and a .json file given as --data itself, are files of JSON records (train/json_records.py): each
  record's "text" (--text-field) is a document, split as the files are (a file's records in order among the other
  files' documents), since a fine-tuning set usually comes as one such file; its JSON is never trained on as text.
  A .json file in a --data folder is text (a code folder's package.json), and the corpus's line counts them.
- The batches drawn from the streams: train/batches.py.
"""
from __future__ import annotations

import codecs
import math
import os
import sysconfig
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from ..tokenizer import invalid_utf8_bytes
from .json_records import NAMED_SUFFIX, SUFFIX as JSON_LINES, TEXT_FIELD, check_text_field, reads_records, record_texts
from .folder_listing import DataError, _count, folder_files, left_out_note  # noqa: F401 (scoring.py takes them here)
from .folder_listing import file_identity

DEFAULT_VAL_FRACTION = 0.05
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
_BINARY_SNIFF_BYTES = 8192
# ids counted at a time for the unigram entropy: bincount copies what it counts as int64, 8 bytes an id (the whole
# 285 MB training split of a 300 MB folder took 2.3 GB at once)
HISTOGRAM_BLOCK = 1 << 22


# ----------------------------------------------------------------------------------------------------------
# which files


def default_corpus_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, without installed packages and test suites, sorted."""
    root = Path(root) if root is not None else default_corpus_root()
    if not root.is_dir():
        raise DataError(f"the standard library folder {str(root)!r} (sysconfig 'stdlib') does not exist; "
                        f"pass --data PATH with a text file or a folder of text files")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinked folders
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith(".")]
        found.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:  # PermissionError, IsADirectoryError, a broken symlink, ...
        raise DataError(f"cannot read corpus file {str(path)!r}: {e.strerror or e}") from e


def _records(path: Path, text_field: str, source: str) -> Iterator[tuple[int, bytes]]:
    """A file of records' (line number, text) records (json_records.record_texts): a .jsonl file read a line at a
    time, a .json file's array at once."""
    try:
        with open(path, "rb") as f:
            yield from record_texts(f, text_field, source, DataError, path.suffix.lower())
    except OSError as e:
        raise DataError(f"cannot read corpus file {str(path)!r}: {e.strerror or e}") from e


def _looks_binary(data: bytes) -> bool:
    # NUL bytes essentially never occur in text files; they are common in binaries (images, .pyc, archives)
    return b"\x00" in data[:_BINARY_SNIFF_BYTES]


# ----------------------------------------------------------------------------------------------------------
# the corpus


@dataclass(frozen=True)
class Corpus:
    """Train and validation streams and the files they came from, in stream order: bytes (uint8), or token ids
    (int32) after `tokenize`, which also records how many tokens a byte of each split became."""

    source: str  # what the user is told was read: --data's path, or the standard library's
    train: np.ndarray  # (n_train,) uint8 bytes, or int32 token ids
    val: np.ndarray  # (n_val,)
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    skipped_files: tuple[str, ...] = field(default=())  # binary files left out of a --data folder (" (UTF-16)": so)
    run_folders: tuple[str, ...] = field(default=())  # this package's run folders left out of a --data folder
    eval_reports: tuple[str, ...] = field(default=())  # eval --json reports left out of a --data folder
    json_as_text: tuple[str, ...] = field(default=())  # a --data folder's .json files, read as text (json_records.py)
    invalid_utf8_bytes: int = 0  # bytes a tokenizer.json read as U+FFFD (not UTF-8), said in describe()
    non_utf8_files: tuple[str, ...] = field(default=())  # the files holding them (" (UTF-16)" where it looks so)
    train_tokens_per_byte: float = 1.0  # bits per token x this = bits per byte
    val_tokens_per_byte: float = 1.0
    val_text: bytes | None = None  # the validation bytes of a tokenized corpus (its sample prompt)
    # each document's bytes in `train`, in stream order (a corpus of several: a file's, or a .jsonl record's)
    train_file_sizes: tuple[int, ...] = ()
    val_file_sizes: tuple[int, ...] = ()
    unit: str = "file"  # what train_files and val_files name: "file", "record" (of JSON records) or "document" (both)
    document_end: str = "none"  # "eos": the tokenizer's EOS after each file's tokens (tokenize; DOCUMENT_ENDS)
    val_source: str | None = None  # --val-data's path: `val` is all of it, `train` all of `source`

    def describe(self) -> str:
        skipped = left_out_note(self.skipped_files, self.run_folders, self.eval_reports)
        if self.json_as_text:
            skipped += "; " + json_as_text_note(self.json_as_text)
        if self.invalid_utf8_bytes:
            skipped += "; " + non_utf8_note(self.invalid_utf8_bytes, self.non_utf8_files)
        if self.document_end == "eos":
            skipped += f"; each {self.unit} followed by the tokenizer's EOS token (--document-end eos)"
        train, val = self._size(self.train, self.train_tokens_per_byte), self._size(self.val, self.val_tokens_per_byte)
        validation = f"; {self.val_source}:" if self.val_source else ","
        return (f"{self.source}: {_count(len(self.train_files), 'train ' + self.unit)} ({train}){validation} "
                f"{_count(len(self.val_files), 'validation ' + self.unit)} ({val}){skipped}")

    def _size(self, stream: np.ndarray, tokens_per_byte: float) -> str:
        if stream.dtype == np.uint8:                                     # bytes: not tokenized
            return f"{len(stream):,} bytes"
        return f"{round(len(stream) / tokens_per_byte):,} bytes, {len(stream):,} tokens"


def json_as_text_note(names: tuple[str, ...]) -> str:
    """What training's corpus line and eval say of a folder's .json files, which they read as text, not records."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{_count(len(names), NAMED_SUFFIX + ' file')} read as text, not as records ({shown}; give a file of "
            f"records as --data itself, or as {JSON_LINES})")


UTF16_SUFFIX = " (UTF-16)"   # a name's suffix in the notes: the text starts with a UTF-16 byte order mark


def non_utf8_note(invalid_bytes: int, files: tuple[str, ...]) -> str:
    """What training's corpus line and eval (train/scoring.py) say of the bytes a tokenizer.json reads as U+FFFD:
    how many, in which files (named: a folder's total alone left the user to find them), and the fix."""
    named = f" in {', '.join(files[:3])}{f' and {len(files) - 3} more' if len(files) > 3 else ''}" if files else ""
    one = len(files) == 1
    source = "utf-16" if files and all(name.endswith(UTF16_SUFFIX) for name in files) else "latin1"
    return (f"{_count(invalid_bytes, 'byte')} not UTF-8{named}, each read as U+FFFD by the tokenizer (convert "
            f"{'that file' if one else 'the files'} to UTF-8 to keep {'its' if one else 'their'} characters, e.g. "
            f"iconv -f {source} -t utf-8)")


def load_corpus(path: str | os.PathLike | None = None, *, seed: int = 0, val_fraction: float = DEFAULT_VAL_FRACTION,
                text_field: str = TEXT_FIELD, val_path: str | os.PathLike | None = None) -> Corpus:
    """Read the corpus at `path` (a text file or a folder of them; None = the standard library) and split it into
    training and validation; with `val_path` (--val-data) all of `path` is trained on and `val_path` is the
    validation text. A .jsonl file, or a .json file given as `path` itself (train/json_records.py), gives a
    document a record, the string in its `text_field`; any other file is one.

    Every file is read here, up front, so a missing, empty or unreadable path fails before any training
    work starts, with a DataError naming the path.
    """
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
    docs = _read_documents(path, text_field, "--data")
    val = None if val_path is None else _read_documents(val_path, text_field, "--val-data")
    check_text_field(text_field, docs.records > 0 or (val is not None and val.records > 0), docs.source, DataError)
    if val is not None:
        _refuse_overlap(docs, val)
        return Corpus(
            source=docs.source, val_source=val.source,
            train=_concat(docs.texts), val=_concat(val.texts),
            train_file_sizes=tuple(map(len, docs.texts)), val_file_sizes=tuple(map(len, val.texts)),
            train_files=tuple(docs.names), val_files=tuple(val.names),
            skipped_files=docs.skipped + val.skipped, run_folders=docs.run_folders + val.run_folders,
            eval_reports=docs.eval_reports + val.eval_reports,
            json_as_text=docs.json_as_text + val.json_as_text,
            non_utf8_files=_non_utf8(docs.names + val.names, docs.texts + val.texts),
            unit=_unit(docs.records + val.records, len(docs.texts) + len(val.texts)))
    texts, names = docs.texts, docs.names
    unit = _unit(docs.records, len(texts))
    if len(texts) == 1:
        split = _split_single_file(docs.source, names[0], texts[0], val_fraction)
        return replace(split, skipped_files=docs.skipped, run_folders=docs.run_folders, eval_reports=docs.eval_reports,
                       json_as_text=docs.json_as_text, unit=unit)

    # sorted above; now a seeded shuffle so that validation files are a fair sample of the whole tree
    order = np.random.default_rng(seed).permutation(len(texts))
    n_val = min(len(texts) - 1, max(1, round(val_fraction * len(texts))))
    val_idx, train_idx = order[:n_val], order[n_val:]
    return Corpus(
        source=docs.source,
        train=_concat(texts[i] for i in train_idx),
        val=_concat(texts[i] for i in val_idx),
        train_file_sizes=tuple(len(texts[i]) for i in train_idx),
        val_file_sizes=tuple(len(texts[i]) for i in val_idx),
        train_files=tuple(names[i] for i in train_idx),
        val_files=tuple(names[i] for i in val_idx),
        skipped_files=docs.skipped,
        run_folders=docs.run_folders,
        eval_reports=docs.eval_reports,
        json_as_text=docs.json_as_text,
        non_utf8_files=_non_utf8(names, texts),
        unit=unit,
    )


def _unit(records: int, documents: int) -> str:
    """Corpus.unit: what its documents are, when `records` of them are JSON records."""
    return "file" if not records else "record" if records == documents else "document"


@dataclass(frozen=True)
class _Documents:
    """What one path (--data's or --val-data's) holds: its documents' texts and names, in reading order."""

    source: str  # what the user is told was read
    root: Path
    texts: list[bytes]
    names: list[str]  # a file's path under the folder, or "FILE.jsonl:LINE" for a record (the line it starts on)
    skipped: tuple[str, ...]  # binary files left out of a folder
    run_folders: tuple[str, ...]  # this package's run folders left out of a folder
    eval_reports: tuple[str, ...]  # eval --json reports left out of a folder
    records: int  # how many of the documents are JSON records
    json_as_text: tuple[str, ...]  # a folder's .json files, read as text
    identities: dict = None  # (st_dev, st_ino) of each file read -> its path: --data and --val-data share none


def _read_documents(path: str | os.PathLike | None, text_field: str, flag: str) -> _Documents:
    """The documents of a text file or folder (None: the standard library), each file one and each record of a
    file of records one (json_records.reads_records; empty ones left out), named; a DataError naming `flag` and
    the path where there is none."""
    run_folders: list[str] = []
    eval_reports: list[str] = []
    if path is None:
        root = default_corpus_root()
        files = stdlib_sources(root)
        source = f"Python {'.'.join(map(str, __import__('sys').version_info[:2]))} standard library ({root})"
        if not files:
            raise DataError(f"no .py files found in the standard library folder {str(root)!r}; "
                            f"pass --data PATH")
    else:
        root = Path(path).expanduser()
        source = str(root)
        if not root.exists():
            raise DataError(f"{flag} path {str(root)!r} does not exist")
        if root.is_dir():
            files = folder_files(root, run_folders, eval_reports)
            if not files:
                raise DataError(f"{flag} folder {str(root)!r} contains no files")
        elif not root.is_file():
            raise DataError(f"{flag} path {str(root)!r} is neither a regular file nor a folder")
        else:
            files = [root]
    one_file = path is not None and root.is_file()

    texts, names, skipped, records = [], [], [], 0                     # the documents: a file's text or a record's
    json_as_text = []
    identities = {file_identity(p): p for p in files}
    for p in files:
        name = p.name if one_file else p.relative_to(root).as_posix()
        if path is not None and reads_records(p, named=one_file):
            for line, text in _records(p, text_field, f"{flag} file {str(p)!r}"):
                if text:
                    texts.append(text)
                    names.append(f"{name}:{line}")
                    records += 1
            continue
        data = _read(p)
        if path is not None and not one_file and _looks_binary(data):  # a file named by --data is read as it is
            skipped.append(name + utf16_mark(data))
        elif data:
            texts.append(data)
            names.append(name)
            if path is not None and p.suffix.lower() == NAMED_SUFFIX:
                json_as_text.append(name)
    if not texts and one_file:
        raise DataError(f"{flag} file {str(root)!r} " + (f"holds no record with text in its {text_field!r} field"
                                                         if reads_records(root, named=True) else "is empty"))
    if not texts:
        why = "only binary files" if skipped else "only empty files"
        raise DataError(f"{flag} {source!r} contains no text: {why}")
    return _Documents(source, root, texts, names, tuple(skipped), tuple(run_folders), tuple(eval_reports), records,
                      tuple(json_as_text), identities)


def _refuse_overlap(docs: _Documents, val_docs: _Documents) -> None:
    """--val-data must hold none of the text trained on: not --data itself, nor inside its folder, nor holding it,
    nor any file --data reads (through a link or a hard link: a folder's link to the other side's file was trained
    and validated on, found by an audit)."""
    data_root, val_root = docs.root, val_docs.root
    data, val = data_root.resolve(), val_root.resolve()
    if data == val or data in val.parents or val in data.parents:
        where = "is" if data == val else "lies inside" if data in val.parents else "holds"
        raise DataError(f"--val-data {str(val_root)!r} {where} --data {str(data_root)!r}: the validation text would be "
                        f"trained on; give a --val-data outside --data (or leave it out to validate on a "
                        f"--val-fraction of --data's files)")
    shared = sorted(set(docs.identities) & set(val_docs.identities))
    if shared:
        raise DataError(f"--val-data's file {str(val_docs.identities[shared[0]])!r} is --data's file "
                        f"{str(docs.identities[shared[0]])!r} (a link or a hard link to it; {len(shared)} such "
                        f"file(s)): the validation text would be trained on; remove it from one side")


def _non_utf8(names: list[str], texts: list[bytes]) -> tuple[str, ...]:
    """The names of the texts that are not UTF-8, in stream order of `names`; " (UTF-16)" added where the text
    starts with a UTF-16 byte order mark (its other bytes are mostly valid UTF-8: the count alone hid it)."""
    found = []
    for name, data in zip(names, texts):
        if not data.isascii() and not _is_utf8(data):
            found.append(name + utf16_mark(data))
    return tuple(found)


def utf16_mark(head: bytes) -> str:
    """" (UTF-16)" for a text that starts with a UTF-16 byte order mark, else "" (a name's suffix in the note)."""
    return UTF16_SUFFIX if head[:2] in (b"\xff\xfe", b"\xfe\xff") else ""


def _is_utf8(data: bytes, block: int = 1 << 22) -> bool:
    """Whether `data` decodes as UTF-8, read in blocks (one decode of a 1 GB file would hold up to 4 GB of str)."""
    decoder, view = codecs.getincrementaldecoder("utf-8")(), memoryview(data)
    try:
        for start in range(0, len(data), block):
            decoder.decode(view[start:start + block], final=start + block >= len(data))
    except UnicodeDecodeError:
        return False
    return True


def _split_single_file(source: str, name: str, data: bytes, val_fraction: float) -> Corpus:
    """One text (a file, or a .jsonl file's one record), split by bytes: its last val_fraction is validation, cut
    where a character starts (a cut inside a UTF-8 character would leave half of it, invalid, on each side)."""
    cut = len(data) - max(1, int(len(data) * val_fraction))
    steps = 0
    while cut > 1 and steps < 3 and data[cut] & 0xC0 == 0x80:   # a continuation byte 10xxxxxx: back to the lead
        cut, steps = cut - 1, steps + 1
    arr = np.frombuffer(data, dtype=np.uint8)
    return Corpus(source, arr[:cut].copy(), arr[cut:].copy(), (name,), (name,),
                  non_utf8_files=_non_utf8([name], [data]))


def tokenize(corpus: Corpus, tokenizer, document_end: str = "none") -> Corpus:
    """The corpus as token ids of `tokenizer` (tokenizer.py); a byte corpus stays as it is for bytes. Each split is
    one text, its files joined; with document_end "eos" each file is tokenized alone and followed by the
    tokenizer's EOS (split_ids)."""
    check_document_end(corpus, tokenizer, document_end)
    if tokenizer.name == "bytes":
        return corpus
    train = split_ids(corpus.train, corpus.train_file_sizes, tokenizer, document_end)
    val = split_ids(corpus.val, corpus.val_file_sizes, tokenizer, document_end)
    if max(int(train.max(initial=0)), int(val.max(initial=0))) >= np.iinfo(np.int32).max:
        raise DataError(f"the tokenizer {tokenizer.name!r} gave ids beyond int32")
    invalid = invalid_utf8_bytes(corpus.train.tobytes()) + invalid_utf8_bytes(corpus.val.tobytes())
    return replace(corpus, train=train.astype(np.int32), val=val.astype(np.int32),
                   train_tokens_per_byte=len(train) / max(len(corpus.train), 1),
                   val_tokens_per_byte=len(val) / max(len(corpus.val), 1), val_text=corpus.val.tobytes(),
                   invalid_utf8_bytes=invalid, document_end=document_end)


DOCUMENT_ENDS = ("none", "eos")   # train's --document-end


def check_document_end(corpus: Corpus, tokenizer, document_end: str) -> None:
    """--document-end eos needs an EOS token and files to end: a DataError naming what is missing and the fix."""
    if document_end not in DOCUMENT_ENDS:
        raise DataError(f"--document-end must be one of {', '.join(DOCUMENT_ENDS)}, got {document_end!r}")
    if document_end == "none":
        return
    require_eos_token(tokenizer, "a byte-level run has no EOS token (its ids are the bytes); give --tokenizer PATH "
                                 "or --init-from a model folder with a tokenizer.json, or leave --document-end out")
    if not corpus.train_file_sizes:                                     # one text, split by bytes
        raise DataError(f"--document-end eos marks where each file of a --data folder (each record of a {JSON_LINES} "
                        f"or {NAMED_SUFFIX} file) ends; {corpus.source!r} is one text, split by bytes into training and validation, "
                        f"so no file ends inside either: leave --document-end out (or give a folder of several files)")


def require_eos_token(tokenizer, byte_level: str) -> None:
    """--document-end eos needs the tokenizer's EOS token: a DataError ending in `byte_level` (the fix where the ids
    are bytes), or naming the tokenizer that has none."""
    if tokenizer.name == "bytes":
        raise DataError(f"--document-end eos puts the tokenizer's EOS token after each file, and {byte_level}")
    if tokenizer.eos_token_id is None:
        raise DataError(f"--document-end eos: the tokenizer {tokenizer.name!r} has no EOS token (none named in its "
                        f"tokenizer_config.json, no special token that reads as one); leave --document-end out")


def split_ids(data: np.ndarray, file_sizes: tuple[int, ...], tokenizer, document_end: str) -> np.ndarray:
    """One split's bytes (its files joined, file_sizes in order) as the ids training reads: the whole text's
    encode_bytes, or with document_end "eos" each file's own ids (its special tokens: a Llama-style tokenizer's
    BOS starts every file) followed by the EOS id, unless its ids end with it already (document_ids)."""
    if document_end == "none":
        return tokenizer.encode_bytes(data.tobytes())
    pieces = document_ids(tokenizer, file_texts(data, file_sizes))
    return np.concatenate([np.zeros(0, np.int64), *(ids for ids, _ in pieces)])


def file_texts(data: np.ndarray, file_sizes: tuple[int, ...]):
    """Each file's bytes of a split, in order."""
    ends = np.cumsum(file_sizes)
    for start, end in zip(ends - np.asarray(file_sizes), ends):
        yield data[start:end].tobytes()


def document_ids(tokenizer, documents) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, ends) pieces of the documents' joined text (encode_stream's, ends in bytes from its start): each
    document tokenized alone, then the tokenizer's EOS, which ends where the document does (it covers no byte),
    left out where the document's ids end with it already (a post_processor that appends one)."""
    offset, eos = 0, np.array([tokenizer.eos_token_id], np.int64)
    for document in documents:
        last = None
        for ids, ends in tokenizer.encode_stream([document]):
            if len(ids):
                last = int(ids[-1])
            yield ids, ends + offset
        offset += len(document)
        if last != tokenizer.eos_token_id:
            yield eos, np.array([offset], np.int64)


def _concat(chunks) -> np.ndarray:
    """The chunks (bytes) joined into one writable uint8 array, written in place (a join, then a copy of it into
    an array, held the text three times)."""
    chunks = list(chunks)
    out, at = np.empty(sum(map(len, chunks)), np.uint8), 0               # (n,)
    for chunk in chunks:
        out[at:at + len(chunk)] = np.frombuffer(chunk, np.uint8)
        at += len(chunk)
    return out


def unigram_entropy_bits(data: np.ndarray | bytes) -> float:
    """Entropy of the byte (or token) histogram, in bits per byte (token): what a model that ignores context
    can reach."""
    arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else np.asarray(data)
    arr = arr.reshape(-1)
    if arr.size == 0:
        raise DataError("unigram entropy of an empty byte stream is undefined")
    counts = np.zeros(max(256, int(arr.max()) + 1), np.int64)           # (ids,)
    for start in range(0, arr.size, HISTOGRAM_BLOCK):
        counts += np.bincount(arr[start:start + HISTOGRAM_BLOCK], minlength=len(counts))
    p = counts[counts > 0] / arr.size
    return float(-(p * np.log2(p)).sum())


def sample_prompt_from(data: np.ndarray, max_bytes: int = 24) -> str:
    """A prompt in the data's own language: the first line of `data` that holds some text (a folder's
    validation text starts with a whole file), cut to `max_bytes` at a character boundary."""
    head = bytes(data[:4096])
    line = next((ln for ln in head.split(b"\n") if ln.strip()), head)
    return line[:max_bytes].decode("utf-8", errors="ignore") or "\n"


def check_length(data: np.ndarray, seq_len: int, what: str, source: str, files: tuple = (),
                 noun: str = "file", of_val_data: bool = False) -> None:
    """At least one window of seq_len + 1 in `data` (bytes, or token ids), else a DataError with the fixes; `files`:
    the split's documents, each a `noun` (Corpus.unit); of_val_data: `data` is all of --val-data, not a split."""
    need = seq_len + 1  # one window = seq_len inputs + the next token as the last target
    if len(data) < need:
        unit = "byte" if data.dtype == np.uint8 else "token"
        held = f" ({_count(len(files), noun)}: {', '.join(files[:3])}{', ...' if len(files) > 3 else ''})" \
            if files else ""
        fixes = "a bigger corpus or a smaller --seq-len"
        if of_val_data:
            fixes = "a longer --val-data text or a smaller --seq-len"
        elif what == "validation":  # a folder's split is whole files, a single file's its last val_fraction
            fixes = f"a larger --val-fraction, another --data-seed (a folder's split is whole {noun}s), {fixes}"
        text = f"the --val-data text {source!r}" if of_val_data else f"the {what} split of {source!r}"
        raise DataError(f"{text}{held} has {_count(len(data), unit)}; a sequence of "
                        f"--seq-len {seq_len} needs at least {need:,} (use {fixes})")


def bits_per_byte(mean_nats: float, tokens_per_byte: float = 1.0) -> float:
    """Cross entropy in nats per token -> bits per byte (a byte-level run: one token is one byte)."""
    return mean_nats / math.log(2) * tokens_per_byte


def fingerprint_differences(saved: dict, now: dict) -> str:
    """Two runs' data fingerprints (train/loop.py's) told apart in words: their *_bytes keys count the splits' ids
    (bytes, or a tokenizer's tokens)."""
    said = []
    for split, name in (("train", "training"), ("val", "validation")):
        was, has = saved.get(f"{split}_bytes"), now.get(f"{split}_bytes")
        if was != has:
            said.append(f"the {name} split has {has} ids, not {was}")
        elif saved.get(f"{split}_crc32") != now.get(f"{split}_crc32"):
            said.append(f"the {name} split's ids differ (as many as before)")
    return ", ".join(said) or f"saved {saved}, now {now}"
