"""The benchmark scripts' --json (benchmarks/_common.py save_json) writes a new file, or over a result of their
own; a user's file or a symbolic link at that path is refused and left as it is."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _common  # noqa: E402


def test_save_json_replaces_only_its_own_results(tmp_path):
    """--json thesis.txt replaced the file, and --json link.json wrote through the link into its target."""
    thesis, victim, link = tmp_path / "thesis.txt", tmp_path / "victim.txt", tmp_path / "link.json"
    thesis.write_text("my thesis")
    victim.write_text("target")
    link.symlink_to(victim)
    for path in (thesis, link):
        with pytest.raises(SystemExit, match="exists and is not a result these scripts wrote"):
            _common.save_json(path, {"name": "x"})
    assert thesis.read_text() == "my thesis" and victim.read_text() == "target" and link.is_symlink()
    ours = tmp_path / "new.json"
    for run in (1, 2):  # the second run replaces the first one's result
        _common.save_json(ours, {"name": "x", "run": run})
        assert json.loads(ours.read_text())["run"] == run
