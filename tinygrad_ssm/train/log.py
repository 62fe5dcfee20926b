"""The run's log (JSON lines, one record per training step or evaluation) and its PNG of the curves."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..io.atomic_write import keep_mode_of, new_temporary_file, write_atomic

LOG_FILE = "log.jsonl"
PLOT_FILE = "loss.png"


class RunLogError(ValueError):
    """log.jsonl holds a line that is not a record (other than a torn last line)."""


class RunLog:
    """Append-only JSONL: {"step", "train_loss", "train_bpb", "lr", "grad_norm", "tokens", "tokens_per_s"}
    for a training step, {"step", "val_bpb", "tokens"} for an evaluation."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOG_FILE
        self.branch_step: int | None = None  # resumed from an older checkpoint than the run's newest: see resume_at
        self.held: list[dict] = []  # this run's records while branch_step is set

    def resume_at(self, step: int, newest_saved_step: int | None) -> None:
        """A resumed run redoes the steps after `step`, so their records go. Those past the run's newest checkpoint
        (`newest_saved_step`) describe steps no checkpoint holds: they go now. Those up to it (a resume from an
        older checkpoint than the newest) still describe the checkpoint LATEST names: they go only when this run
        saves a checkpoint of its own (`saved`), which becomes LATEST; until then this run's records are held, so
        that a run killed before that leaves the log whole, as its newest checkpoint's."""
        newest = step if newest_saved_step is None else max(step, newest_saved_step)
        self.truncate_after(newest)
        if newest > step and any(r["step"] > step for r in self.records()):
            self.branch_step = step

    def saved(self) -> None:
        """A checkpoint of this run was written (and is LATEST): a branch's records replace the older ones."""
        if self.branch_step is not None:
            kept = [r for r in self.records() if r["step"] <= self.branch_step] + self.held
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
            self.branch_step, self.held = None, []

    def append(self, record: dict) -> None:
        if self.branch_step is not None:
            self.held.append(record)
            return
        # O_NOFOLLOW: a log.jsonl that is a symbolic link is never written through (it could lead out of the run)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError:
            if os.path.islink(self.path):
                raise RunLogError(f"{str(self.path)!r} is a symbolic link; the run's log is never written through "
                                  f"a link: remove it, or choose another --out") from None
            raise
        if os.fstat(fd).st_nlink != 1:  # a second name of someone's file (a hard link made since): as run.lock
            os.close(fd)
            raise RunLogError(f"{str(self.path)!r} has another name (a hard link to a file outside the run, made "
                              f"after the run started); the run's log is never appended to a file it does not "
                              f"own: it was left as it is: remove {LOG_FILE} (the run writes a new one), or "
                              f"choose another --out")
        try:
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a write's error names no file: the message names the log
            raise OSError(e.errno, e.strerror, str(self.path)) from e

    def records(self) -> list[dict]:
        """Every record. A last line cut short (no newline: the process died while appending it) is left
        out, as if never written: the step it logged is after the last checkpoint, so a resume redoes it.
        Any other line that is not a record raises RunLogError naming the file and line."""
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if not (isinstance(record, dict) and isinstance(record.get("step"), int)):
                if number == len(lines):  # the torn tail: not followed by a newline
                    continue
                raise RunLogError(f"{str(self.path)!r} line {number} is not a log record ({line[:60]!r}); "
                                  f"delete that line to continue the run")
            records.append(record)
        return records

    def truncate_after(self, step: int) -> None:
        """Drop records past `step`: a resumed run redoes those steps and logs them again."""
        kept = [r for r in self.records() if r["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))


def plot_unavailable_reason() -> str:
    """Why plot_curves drew nothing (it returns None without matplotlib, or with no records)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib, or reinstall this package: it requires it)"
    return "no step was logged"


def plot_curves(records: list[dict], path: str | os.PathLike, unigram_bits: float | None = None) -> Path | None:
    """Train and validation bits per byte against the step, as a PNG; None when matplotlib is missing."""
    try:  # the object API, not pyplot: no global state, no GUI backend, safe inside any program
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    train = [(r["step"], r["train_bpb"]) for r in records if "train_bpb" in r]
    val = [(r["step"], r["val_bpb"]) for r in records if "val_bpb" in r]
    if not train and not val:
        return None
    fig = Figure(figsize=(7, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if train:
        steps, bpb = zip(*train)
        ax.plot(steps, bpb, color="tab:blue", alpha=0.3, lw=0.8, label="train (per step)")
        window = max(1, len(bpb) // 30)
        if window > 1:  # a moving average shows the trend through the batch-to-batch noise
            smooth = [sum(bpb[max(0, i - window + 1):i + 1]) / len(bpb[max(0, i - window + 1):i + 1])
                      for i in range(len(bpb))]
            ax.plot(steps, smooth, color="tab:blue", lw=1.6, label=f"train (mean of {window})")
    if val:
        steps, bpb = zip(*val)
        ax.plot(steps, bpb, "o-", color="tab:orange", lw=1.6, ms=4, label="validation")
    if unigram_bits is not None and math.isfinite(unigram_bits):
        ax.axhline(unigram_bits, color="gray", ls="--", lw=1, label=f"unigram entropy {unigram_bits:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_title("byte-level Mamba-2")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    # a unique temporary file created here (O_EXCL: never a link someone left at a fixed name), then renamed over
    # the plot (os.replace replaces a link itself, never its target)
    fd, tmp = new_temporary_file(path.parent, path.name)
    try:
        keep_mode_of(fd, path)
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return path


def progress_bar(**kwargs):
    """The training bar: tqdm whose rate and ETA leave out the first step this process runs (numba compiling
    its kernels, cold caches: many times slower than the rest); '?' until a second step is done. disable=True: a
    bar that shows nothing and starts nothing (tqdm starts its monitor thread for a disabled bar too, and it stayed
    in the user's process after train() returned)."""
    if kwargs.get("disable"):
        return _NoBar()
    from tqdm import tqdm

    class SteadyEtaBar(tqdm):
        def __init__(self, **kw):
            self._warm_n = self._warm_t = None  # (steps, time) when the first step of this process ended
            super().__init__(smoothing=0, **kw)

        def update(self, n=1):
            shown = super().update(n)
            if self._warm_t is None and not self.disable:
                self._warm_n, self._warm_t = self.n, self._time()
            return shown

        @property
        def format_dict(self):
            d = super().format_dict
            if self.disable:
                return d
            elapsed = self._time() - self._warm_t if self._warm_t is not None else 0.0
            done = self.n - self._warm_n if self._warm_n is not None else 0
            d["rate"] = done / elapsed if done > 0 and elapsed > 0 else 0  # 0: tqdm shows "?"
            return d

    return SteadyEtaBar(**kwargs)


class _NoBar:
    """progress_bar(disable=True): the calls the loop makes, doing nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    def set_postfix(self, *args, **kwargs):
        pass
