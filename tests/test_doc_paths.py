"""Every path a docstring, comment or page cites (a name with a slash ending in .py or .md, in tinygrad_ssm/,
tests/, benchmarks/, docs/ and README.md) names a file of this repository, so a reader who follows a
reference finds it. A path counts as found when it exists from the repository root, from the citing file's
folder, or as the tail of a repository file (`autograd/ops/reduce.py` is tinygrad_ssm/autograd/ops/reduce.py). Addresses
(http://...) are other sites and are not checked."""
from __future__ import annotations

import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCANNED = ("tinygrad_ssm", "tests", "benchmarks", "docs", "README.md")
PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md))(?![\w/])")
URL = re.compile(r"\w+://\S+")


@functools.lru_cache(maxsize=1)
def repository_files() -> tuple[str, ...]:
    skip = {".git", "__pycache__", ".pytest_cache", ".hypothesis", "runs", "build", "dist"}
    return tuple(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts) and not p.name.endswith(".pyc"))


def scanned_files() -> list[pathlib.Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in (".py", ".md")
                                                      and "__pycache__" not in p.parts)
    return files


def missing_references(text: str, folder: pathlib.Path, files: list[str]) -> list[str]:
    missing = []
    for reference in PATH.findall(URL.sub(" ", text)):
        found = ((ROOT / reference).exists() or (folder / reference).exists()
                 or any(f == reference or f.endswith("/" + reference) for f in files))
        if not found:
            missing.append(reference)
    return missing


def test_the_scanner_finds_paths_and_misses():
    files = ["tinygrad_ssm/autograd/ops/reduce.py", "docs/mamba2.md"]
    absent = "/".join(["reference", "mamba2.md"])  # joined, so that this file itself cites no missing path
    text = (f"see `autograd/ops/reduce.py`, docs/mamba2.md and {absent} (and https://github.com/x/y/blob/z.py); "
            "not a path: a/b, 1.5/2.0, e.g. not a file")
    assert PATH.findall(URL.sub(" ", text)) == ["autograd/ops/reduce.py", "docs/mamba2.md", absent]
    assert missing_references(text, ROOT, files) == [absent]


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cited_path_exists(path):
    missing = missing_references(path.read_text(encoding="utf-8"), path.parent, repository_files())
    assert not missing, f"{path.relative_to(ROOT)} cites files that do not exist: {sorted(set(missing))}"


# A bare file name (no slash) must be some repository file's name, or one of these: other projects' files, files a
# test writes, and scripts of the past that a history section names (the reader is told they are gone).
BARE = re.compile(r"(?<![\w/.-])([\w-]+\.(?:py|md))(?![\w/])")
NOT_OURS = {"convert_hf_to_gguf.py",                                   # llama.cpp's
            "ssd_minimal.py",                                          # mamba_ssm's
            "os.py", "slice.py", "this.py", "bench.py", "own_loop.py", "fused_baseline.py",  # written or named by tests
            "bench_ssd_ab.py", "bench_step_ab.py", "blas_chunked.py", "json_lines.py"}       # gone, in history sections


def missing_bare_names(text: str, names: set[str]) -> list[str]:
    return [name for name in BARE.findall(URL.sub(" ", text)) if name not in names and name not in NOT_OURS]


def test_the_bare_name_scanner():
    gone = "mamba2" + ".py"                                            # joined: this file cites no missing name
    text = f"decode.py, `{gone}` (renamed), ssd_minimal.py (not ours), and so on."
    assert missing_bare_names(text, {"decode.py"}) == [gone]


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cited_file_name_exists(path):
    """A module named without its folder is a file of this repository: a docstring named one long renamed, which
    the path scanner above could not see (found by a docs audit)."""
    names = {pathlib.PurePosixPath(f).name for f in repository_files()}
    missing = missing_bare_names(path.read_text(encoding="utf-8"), names)
    assert not missing, f"{path.relative_to(ROOT)} names files that do not exist: {sorted(set(missing))}"

