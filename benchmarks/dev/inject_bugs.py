"""Inject bugs by hand, one at a time, and check that the tests catch each: the check the standards ask for now
and then ("a test that cannot fail" shows up here as a bug that survives).

    python benchmarks/dev/inject_bugs.py engine                  # every bug of benchmarks/dev/injected_bugs/engine.py
    python benchmarks/dev/inject_bugs.py engine --only 3 7       # two of them (their numbers in --list)
    python benchmarks/dev/inject_bugs.py engine --list           # the list, nothing run
    python benchmarks/dev/inject_bugs.py kernels --json /tmp/kernels.json

A list is a module of `benchmarks/dev/injected_bugs/` whose BUGS is a list of `Bug(file, old, new, tests, what)`:
in `file` (relative to the repository root) the text `old`, which must occur exactly once, becomes `new`, and
`tests` (pytest arguments: files, `file::test`, `-k EXPR`) run against the changed tree. The bug is caught when
they fail (pytest exits 1), survives when they pass, and the run is marked broken when pytest exits otherwise
(2-5: the tests could not be collected, which says nothing of what they assert) or passes its --timeout. The file
is written back as it was whatever happens (its bytes and its modification time), before the next bug, and when
the run is stopped (Ctrl-C, or `kill`, which also stops the tests it started).

numba's cache checks only the source file of the function it compiled, so a bug in one kernel module would be
missed by a cached kernel of another module that inlines it: when the changed file compiles numba code
(COMPILES), every cached kernel of the package (`__pycache__/*.nbi`, `*.nbc`) is deleted before the tests and
again after the file is written back (--fresh-caches: around every bug, for a constant that a kernel reads from a
module that compiles nothing, which numba freezes into the kernel's cache as well). Such a run pays the
compilation of what its tests use. This runs in the tree it is in, uncommitted changes included; do not edit the
tree while it runs.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tinygrad_ssm"
# a file whose code numba compiles: it imports numba or decorates with a jit (cuda_decay.py's @cuda.jit); a file
# that only calls kernels, or names numba in a docstring, changes no cached kernel
COMPILES = re.compile(rb"^\s*(from|import) numba\b|^\s*@[\w.]*jit\b|\bnjit\(", re.MULTILINE)


@dataclass(frozen=True)
class Bug:
    file: str            # relative to the repository root
    old: str             # occurs exactly once in the file
    new: str             # what it becomes
    tests: tuple         # pytest arguments that should catch it
    what: str            # the bug in words: what a careless edit would have done


def load_bugs(area: str) -> list[Bug]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    bugs = importlib.import_module(f"injected_bugs.{area}").BUGS
    for number, bug in enumerate(bugs, 1):
        text = (ROOT / bug.file).read_text(encoding="utf-8")
        found = text.count(bug.old)
        if found != 1:
            raise SystemExit(f"{area} bug {number} ({bug.what}): its old text occurs {found} times in {bug.file}, "
                             f"not once: make it longer so that it names one place")
        if bug.new == bug.old:
            raise SystemExit(f"{area} bug {number} ({bug.what}): new equals old")
    return bugs


def delete_numba_caches() -> int:
    doomed = [p for suffix in ("*.nbi", "*.nbc") for p in PACKAGE.rglob(suffix)]
    for path in doomed:
        path.unlink(missing_ok=True)
    return len(doomed)


def run_one(bug: Bug, timeout: float, fresh_caches: bool = False) -> tuple[str, float, str]:
    """(verdict, seconds, the last lines pytest printed) for one bug, the file written back afterwards."""
    path = ROOT / bug.file
    original = path.read_bytes()
    stat = path.stat()
    uses_numba = fresh_caches or COMPILES.search(original) is not None
    try:
        path.write_bytes(original.decode("utf-8").replace(bug.old, bug.new, 1).encode("utf-8"))
        if uses_numba:
            delete_numba_caches()
        start = time.perf_counter()
        # pytest in a process group of its own, so that a timeout or an interrupt stops what it started too (the
        # CUDA tests rerun themselves on the simulator in a child process)
        tests = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *bug.tests],
                                 cwd=ROOT, env={**os.environ, "CI": "true"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = tests.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return "broken (timeout)", time.perf_counter() - start, ""
        finally:
            if tests.poll() is None:
                os.killpg(tests.pid, signal.SIGKILL)
                tests.wait()
        seconds = time.perf_counter() - start
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        if uses_numba:
            delete_numba_caches()
    tail = "\n".join(output.strip().splitlines()[-3:])
    verdict = {0: "SURVIVED", 1: "caught"}.get(tests.returncode, f"broken (pytest exit {tests.returncode})")
    return verdict, seconds, tail


def _interrupted(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("area", help="a module of benchmarks/dev/injected_bugs/ (engine, kernels, app, ...)")
    parser.add_argument("--only", type=int, nargs="+", metavar="N", help="these bugs (numbered from 1)")
    parser.add_argument("--list", action="store_true", help="print the bugs and run nothing")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a bug's tests may take (900)")
    parser.add_argument("--json", type=Path, help="write the verdicts here")
    parser.add_argument("--fresh-caches", action="store_true",
                        help="delete the numba caches around every bug (a constant a kernel reads from a module "
                             "that compiles nothing is frozen into the kernel's cache too)")
    args = parser.parse_args()
    # a kill (SIGTERM) unwinds as Ctrl-C does, so that run_one writes the changed file back (a background job
    # ignores Ctrl-C: kill it)
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    bugs = load_bugs(args.area)
    chosen = args.only or list(range(1, len(bugs) + 1))
    if any(not 1 <= n <= len(bugs) for n in chosen):
        parser.error(f"--only: the {args.area} list has bugs 1..{len(bugs)}")
    results = []
    for n in chosen:
        bug = bugs[n - 1]
        if args.list:
            print(f"{n:3d}  {bug.file}: {bug.what}  [{' '.join(bug.tests)}]")
            continue
        verdict, seconds, tail = run_one(bug, args.timeout, args.fresh_caches)
        print(f"{n:3d}  {verdict:<10} {seconds:6.1f} s  {bug.file}: {bug.what}", flush=True)
        if verdict != "caught":
            print("       " + tail.replace("\n", "\n       "), flush=True)
        results.append(dict(number=n, file=bug.file, what=bug.what, tests=list(bug.tests), verdict=verdict,
                            seconds=round(seconds, 1)))
    if results:
        caught = sum(r["verdict"] == "caught" for r in results)
        print(f"{caught} of {len(results)} caught; survived: "
              f"{[r['number'] for r in results if r['verdict'] == 'SURVIVED'] or 'none'}; "
              f"broken: {[r['number'] for r in results if r['verdict'].startswith('broken')] or 'none'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as stop:
        sys.exit(f"inject_bugs: stopped ({stop or 'SIGINT'}); the changed file was written back")
