"""A Hugging Face cache's folders (~/.cache/huggingface/hub/models--ORG--NAME/: snapshots/, refs/, blobs/), read
where a user gives one instead of the snapshot that holds the files: a model folder (--model, from_pretrained) or a
tokenizer's (--tokenizer). Nothing is downloaded."""
from __future__ import annotations

from pathlib import Path


def hub_snapshot(directory: Path) -> Path | None:
    """A Hugging Face cache's repository folder (models--<org>--<name>/: snapshots/ beside refs/ or blobs/) ->
    the snapshot refs/main names; None for any other folder. A repository folder whose refs/main is missing or
    names no snapshot here (a download pinned to a revision) is a FileNotFoundError listing its snapshots."""
    snapshots = directory / "snapshots"
    if (directory / "config.json").exists() or not snapshots.is_dir() or not any(
            (directory / name).is_dir() for name in ("refs", "blobs")):
        return None
    ref = directory / "refs" / "main"
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        commit = None
    snapshot = snapshots / commit if commit and "/" not in commit else None
    if snapshot is not None and snapshot.is_dir():
        return snapshot
    have = sorted(p.name for p in snapshots.iterdir() if p.is_dir())
    why = "has no refs/main" if commit is None else f"has refs/main {commit!r}, which is not in snapshots/"
    raise FileNotFoundError(f"{str(directory)!r} is a Hugging Face cache's repository folder that {why}; pass one "
                            f"of its snapshots instead: {', '.join(str(snapshots / h) for h in have) or '(none)'}")
