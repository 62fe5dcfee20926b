"""The lists of bugs injected by hand (benchmarks/dev/injected_bugs/, run by benchmarks/dev/inject_bugs.py) stay
runnable as the code changes: each bug's text occurs exactly once in its file (an edit of that line leaves the list
unable to run, found only when someone runs it), and the test files and tests it names exist."""
import re
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[1] / "benchmarks" / "dev"
AREAS = sorted(p.stem for p in (DEV / "injected_bugs").glob("*.py") if p.stem != "__init__")


def named_tests(arguments: tuple) -> list[str]:
    """The test paths among a bug's pytest arguments (a file, a folder or file::test; -k's expression left out)."""
    paths, skip = [], False
    for argument in arguments:
        if skip or argument.startswith("-"):
            skip = argument == "-k"
            continue
        paths.append(argument)
    return paths


@pytest.mark.parametrize("area", AREAS)
def test_every_bug_names_one_place_and_tests_that_exist(area, monkeypatch):
    monkeypatch.syspath_prepend(str(DEV))
    from inject_bugs import ROOT, load_bugs
    try:
        bugs = load_bugs(area)                    # refuses a bug whose text is not found exactly once
    except SystemExit as e:
        pytest.fail(str(e))
    assert bugs
    for number, bug in enumerate(bugs, 1):
        assert named_tests(bug.tests), f"{area} bug {number} names no test"
        for target in named_tests(bug.tests):
            path, _, test = target.partition("::")
            assert (ROOT / path).exists(), f"{area} bug {number}: {path} does not exist"
            if test:
                name = re.sub(r"\[.*\]$", "", test)
                assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), \
                    f"{area} bug {number}: {path} has no test {name}"
