"""io/memory.py: the memory left to the process, from files made in the test in place of the kernel's."""
from tinygrad_ssm.io import memory


def _files(tmp_path, monkeypatch, meminfo=None, cgroup=None):
    """Point memory.py at a meminfo of `meminfo` text and a cgroup (limit, usage) pair of texts (None: absent)."""
    monkeypatch.setattr(memory, "_MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(memory, "_CGROUP_LIMITS", ((str(tmp_path / "max"), str(tmp_path / "current")),))
    if meminfo is not None:
        (tmp_path / "meminfo").write_text(meminfo)
    if cgroup is not None:
        (tmp_path / "max").write_text(cgroup[0])
        (tmp_path / "current").write_text(cgroup[1])


def test_meminfo_available_capped_by_a_container_limit(tmp_path, monkeypatch):
    _files(tmp_path, monkeypatch, "MemTotal:  8000 kB\nMemFree:  100 kB\nMemAvailable:  3000 kB\n", ("max\n", "5\n"))
    assert memory.available_memory() == 3000 * 1024                     # v2's "max": no limit
    (tmp_path / "max").write_text("1000000\n")
    (tmp_path / "current").write_text("400000\n")
    assert memory.available_memory() == 600000                          # the limit leaves less than the machine
    (tmp_path / "max").write_text(str(2**63 - 4096))                     # v1's "no limit"
    assert memory.available_memory() == 3000 * 1024
    (tmp_path / "current").write_text("2000000\n")
    (tmp_path / "max").write_text("1000000\n")
    assert memory.available_memory() == 0                               # over the limit already: none left


def test_unknown_where_nothing_can_be_read(tmp_path, monkeypatch):
    _files(tmp_path, monkeypatch)
    assert memory.available_memory() is None
    _files(tmp_path, monkeypatch, "MemTotal:  8000 kB\n", ("garbage", "1"))   # no MemAvailable line, no number
    assert memory.available_memory() is None
    _files(tmp_path, monkeypatch, cgroup=("1000000", "1000"))
    (tmp_path / "meminfo").unlink()
    assert memory.available_memory() == 999000
