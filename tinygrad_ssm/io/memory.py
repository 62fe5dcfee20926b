"""How much memory this process may still take: what the kernel says is available, capped by the container's
(cgroup's) limit. For refusing early what would surely run the machine out of memory (a text tokenized whole), never
for sizing anything: None where it cannot be read (not Linux), and then nothing is refused."""
from __future__ import annotations

from pathlib import Path

_MEMINFO = "/proc/meminfo"
_CGROUP_LIMITS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),                      # cgroup v2
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
_NO_LIMIT = 1 << 60   # cgroup v1 writes "no limit" as a number near 2**63, v2 as "max"


def available_memory() -> int | None:
    """Bytes: /proc/meminfo's MemAvailable (free memory and the page cache the kernel can drop), or less where a
    cgroup's limit leaves less; None if neither can be read."""
    figures = []
    try:
        for line in Path(_MEMINFO).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                figures.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_path, usage_path in _CGROUP_LIMITS:
        try:
            limit, usage = Path(limit_path).read_text().strip(), Path(usage_path).read_text().strip()
            if limit != "max" and int(limit) < _NO_LIMIT:
                figures.append(max(int(limit) - int(usage), 0))
        except (OSError, ValueError):
            pass
    return min(figures) if figures else None
