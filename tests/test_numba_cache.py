"""numba's on-disk cache of the package's kernels (`cache=True`) on a read-only install: numba finds it cannot
write `__pycache__` beside the source and falls back to its user-wide folder ($XDG_CACHE_HOME/numba, else
~/.cache/numba; NUMBA_CACHE_DIR overrides both), so a second process loads the kernel instead of compiling it,
with no error and nothing written into the package; and the package sets no numba setting or environment
variable for that (importing it must not change the user's process). docs/kernels.md, "Where numba's compiled
kernels are cached".

The package is copied to a temporary folder made read-only (chmod a-w); run as root, the child processes drop
CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH first (root ignores file modes otherwise), and the test is skipped only if
the folder still cannot be made read-only."""
import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

PACKAGE = Path(__file__).resolve().parents[1] / "tinygrad_ssm"

# One small cached kernel (compiles in about a second): fast_exp.exp, called from Python.
PROBE = textwrap.dedent("""
    import json, os, sys, tempfile
    package_dir = sys.argv[1]
    try:                                        # is the copy really read-only for this process?
        tempfile.TemporaryFile(dir=package_dir).close()
        writable = True
    except OSError:
        writable = False
    environment = dict(os.environ)
    import numba
    settings = {k: repr(v) for k, v in vars(numba.config).items() if k.isupper()}
    import tinygrad_ssm
    from tinygrad_ssm.fast import fast_exp
    changed = sorted(k for k, v in vars(numba.config).items() if k.isupper() and settings.get(k) != repr(v))
    changed += sorted(k for k in set(os.environ) | set(environment) if os.environ.get(k) != environment.get(k))
    value = fast_exp.exp(1.0)
    stats = fast_exp.exp.stats
    print(json.dumps({"writable": writable, "package": tinygrad_ssm.__file__, "value": value, "changed": changed,
                      "hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values()),
                      "cache_path": fast_exp.exp._cache._cache_path}))
""")

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


def drop_root_file_rights():
    """In the child, before exec: without these two capabilities root obeys file modes like anyone (a root
    process's capabilities after exec are its bounding set). A failure leaves the copy writable: skipped."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def make_read_only(root: Path):
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def files_under(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def read_only_install(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "tinygrad_ssm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    make_read_only(site)
    yield site
    for path in [site, *site.rglob("*")]:                               # let pytest delete it again
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def run_probe(site: Path, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    done = subprocess.run([sys.executable, "-c", PROBE, str(site / "tinygrad_ssm")], cwd=home, env=env,
                          capture_output=True, text=True, timeout=300, check=False,
                          preexec_fn=drop_root_file_rights if os.geteuid() == 0 else None)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NumbaWarning" not in done.stderr and "cannot cache" not in done.stderr.lower(), done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_read_only_install_caches_kernels_in_the_user_wide_folder(read_only_install, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    package_files = files_under(read_only_install)
    first = run_probe(read_only_install, home)
    if first["writable"]:
        pytest.skip("cannot make a folder read-only here (root whose file rights cannot be dropped)")
    assert first["package"].startswith(str(read_only_install))         # the copy, not the checkout, was imported
    assert first["value"] == pytest.approx(2.718281828459045, rel=1e-15)
    assert first["changed"] == [], "importing the package changed numba's settings or the environment"
    assert (first["misses"], first["hits"]) == (1, 0)                   # compiled, and saved ...
    cache = Path(first["cache_path"])
    assert cache.is_relative_to(home / ".cache" / "numba") and any(cache.glob("fast_exp.exp-*.nbi"))
    second = run_probe(read_only_install, home)
    assert (second["misses"], second["hits"]) == (0, 1)                 # ... then loaded by a new process
    assert second["cache_path"] == first["cache_path"] and second["changed"] == []
    assert files_under(read_only_install) == package_files              # nothing written into the package


def test_with_no_folder_to_cache_in_the_kernels_compile_without_the_cache(read_only_install, tmp_path):
    """A read-only install whose user has no writable cache folder either (a service account with a read-only
    home): numba refused the decorators themselves ("cannot cache function ...: no locator available"), so every
    model and the CLI failed at import. The kernels now compile without the cache, and one warning names the fix."""
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    make_read_only(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(read_only_install), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    probe = ("import tinygrad_ssm; from tinygrad_ssm.fast import fast_exp, claims; "
             "print(fast_exp.exp(1.0), tinygrad_ssm.__file__)")
    try:
        done = subprocess.run([sys.executable, "-c", probe], cwd=home, env=env, capture_output=True, text=True,
                              timeout=300, check=False,
                              preexec_fn=drop_root_file_rights if os.geteuid() == 0 else None)
    finally:
        for path in [home, *home.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    if "cannot cache" not in done.stderr and "KernelCacheUnavailableWarning" not in done.stderr:
        pytest.skip("the folders stayed writable here (root whose file rights cannot be dropped)")
    assert done.returncode == 0, done.stderr[-3000:]
    value, package = done.stdout.split()
    assert float(value) == pytest.approx(2.718281828459045, rel=1e-15) and package.startswith(str(read_only_install))
    assert done.stderr.count("KernelCacheUnavailableWarning") == 1 and "set NUMBA_CACHE_DIR" in done.stderr
    assert list((home / ".cache").iterdir()) == []
