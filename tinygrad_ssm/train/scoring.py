"""`eval`: perplexity and bits per byte of a model on a text file or folder (or, for a run of ours, on its own
validation split), streamed through models/mamba2/evaluation.py in windows with the state carried.

Bits per byte are the total bits over the text's bytes (less the first token's, which nothing predicts): the
measure that compares models with different tokenizers, and what training reports for a byte-level run.
"""
from __future__ import annotations

import errno
import json
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.atomic_write import write_atomic
from ..models.mamba2.evaluation import evaluate
from .config import TrainConfig
from .data import DataError, _looks_binary, _read, folder_files, load_corpus
from .generate import _run_tokenizer


REPORT_MARK, REPORT_MARK_VALUE = "written_by", "tinygrad_ssm eval"  # a key of every report eval --json writes


def is_eval_report(path: Path) -> bool:
    """Whether `path` is a report eval --json wrote (a regular file, not a link, holding our mark): the only
    existing file eval may replace."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
            return False
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and report.get(REPORT_MARK) == REPORT_MARK_VALUE


def write_report(path: Path, text: str) -> None:
    """eval --json FILE: a new file, or over an earlier report, checked again here (a file may have appeared at
    that path while scoring: FileExistsError, and it is left as it is)."""
    existing = path.exists() or path.is_symlink()
    if existing and not is_eval_report(path):
        raise FileExistsError(errno.EEXIST, "exists", str(path))
    write_atomic(path, text, replace=existing)


@dataclass(frozen=True)
class EvalText:
    data: bytes
    source: str  # what the user is told was scored


def read_eval_text(path: str | None, folder: Path, tokenizer) -> EvalText:
    """--data (a file, or a folder's text files in sorted order, binary ones skipped); without it, the
    validation split of the run the checkpoint `folder` belongs to (the same files training validated on,
    checked against the fingerprint the checkpoint saved: a changed data folder would split differently)."""
    if path is None:
        state = _saved_trainer_state(folder)
        if state is None:
            raise DataError(f"eval: {str(folder)!r} is not a checkpoint of a tinygrad_ssm run, so it has no "
                            f"validation split of its own; give --data PATH (a text file or a folder)")
        trained = TrainConfig.from_dict(state["train_config"])
        where = "the standard library" if trained.data is None else repr(trained.data)
        try:
            corpus = load_corpus(trained.data, seed=trained.data_seed, val_fraction=trained.val_fraction)
        except DataError as e:
            raise DataError(f"eval: the data this run trained on ({where}) cannot be read now ({e}); give --data "
                            f"PATH to score another text") from None
        val = corpus.val if tokenizer.name == "bytes" else tokenizer.encode_bytes(corpus.val.tobytes()).astype(np.int32)
        saved = state["data_fingerprint"]
        if (saved.get("val_bytes"), saved.get("val_crc32")) != (len(val), zlib.crc32(val.tobytes())):
            raise DataError(f"eval: the data this run trained on ({where}) has changed since (files added, removed "
                            f"or edited), so its validation split is not the run's any more; give --data PATH to "
                            f"score a text of your choice")
        files = f"{len(corpus.val_files)} file{'s' * (len(corpus.val_files) != 1)}"
        return EvalText(corpus.val.tobytes(), f"the validation split of {corpus.source} ({files}, as the run split "
                                              f"it)")
    root = Path(path).expanduser()
    if root.is_file():
        return EvalText(_read(root), str(root))
    if not root.is_dir():
        raise DataError(f"--data path {str(root)!r} does not exist" if not root.exists() else
                        f"--data path {str(root)!r} is neither a regular file nor a folder")
    texts = [data for data in map(_read, folder_files(root)) if data and not _looks_binary(data)]
    if not texts:
        raise DataError(f"--data folder {str(root)!r} holds no text files")
    return EvalText(b"".join(texts), f"{root} ({len(texts)} text files)")


def _saved_trainer_state(folder: Path) -> dict | None:
    if _run_tokenizer(folder) is None:
        return None
    return json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))


def score(model, tokenizer, text: EvalText, *, window: int = 512, carry_state: bool = True,
          max_tokens: int | None = None, progress: bool = True) -> dict:
    """Tokenize, score, and return the report (the JSON `eval --json` writes)."""
    from tqdm import tqdm

    ids, ends = tokenizer.encode_bytes_with_ends(text.data)              # (n,), (n,): where each token ends
    if max_tokens is not None:
        ids = ids[:max_tokens + 1]
    if len(ids) < 2:
        raise DataError(f"eval: {text.source} holds {len(ids)} token(s); at least 2 are needed (one to predict "
                        f"from, one to predict)")
    scored_bytes = int(ends[len(ids) - 1] - ends[0])                     # the text's bytes after the first token
    start = time.perf_counter()
    with tqdm(total=len(ids) - 1, unit="tok", disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
        result = evaluate(model, ids, window, carry_state=carry_state, progress=bar.update)
    seconds = time.perf_counter() - start
    return {"data": text.source, "tokenizer": tokenizer.name, "tokens": result.tokens,
            "bytes": int(scored_bytes), "mean_nats": result.mean_nats, "perplexity": result.perplexity,
            "bits_per_token": result.bits_per_token, "bits_per_byte": result.bits_per_byte(max(scored_bytes, 1)),
            "window": window, "carry_state": carry_state, "windows": result.windows, "seconds": seconds,
            "tokens_per_s": result.tokens / seconds if seconds > 0 else None}


def describe(report: dict, trained_val_bpb: float | None = None) -> str:
    lines = [f"data: {report['data']}",
             f"tokens scored: {report['tokens']:,} ({report['bytes']:,} bytes; tokenizer {report['tokenizer']})",
             f"perplexity {report['perplexity']:.4g}, {report['mean_nats']:.4f} nats and "
             f"{report['bits_per_token']:.4f} bits per token, {report['bits_per_byte']:.4f} bits per byte",
             f"windows of {report['window']} tokens, state "
             f"{'carried between them' if report['carry_state'] else 'reset at each'}; "
             f"{report['seconds']:.1f} s ({report['tokens_per_s'] or 0:,.0f} tokens/s)"]
    if report.get("weights", "float") != "float":  # two evals of one folder differ only here: say which was scored
        lines.insert(1, f"weights: {report['weights']} (in_proj, out_proj and the head; the rest in the model's "
                        f"dtype)")
    if trained_val_bpb is not None:
        lines.append(f"training reported {trained_val_bpb:.4f} bits per byte on its fixed validation windows "
                     f"(a sample of windows of --seq-len, each from a zero state; --window SEQ_LEN --reset-state "
                     f"scores every window that way, so it comes close, not equal)")
    return "\n".join(lines)


def trained_val_bpb(folder: Path) -> float | None:
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = state.get("val_bpb") if isinstance(state, dict) else None
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None
