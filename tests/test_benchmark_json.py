"""The benchmark scripts' --json (benchmarks/_common.py save_json) writes a new file, or over a result of their
own; a user's file or a symbolic link at that path is refused and left as it is."""
import json
import os
import subprocess
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


def test_json_dash_is_stdout_and_quick_runs_keep_the_record(tmp_path, capsys, monkeypatch):
    """--json - made a file named '-' in the scripts that write through write_result; and a --quick run without
    --json replaced benchmarks/results/NAME.json, the record run_all.py renders, with a smoke run's figures."""
    monkeypatch.chdir(tmp_path)
    _common.save_json("-", {"name": "x"})
    assert json.loads(capsys.readouterr().out)["name"] == "x" and not (tmp_path / "-").exists()
    assert _common.result_path(None, "bench_ssd") == str(_common.RESULTS / "bench_ssd.json")
    assert _common.result_path(None, "bench_ssd", quick=True) == str(_common.RESULTS / "bench_ssd_quick.json")
    assert _common.result_path("mine.json", "bench_ssd", quick=True) == "mine.json"

    import bench_engine_overhead                                        # a script's own choice, end to end
    written = []
    monkeypatch.setattr(bench_engine_overhead, "per_call", lambda fn, calls: 1.0)
    monkeypatch.setattr(_common, "save_json", lambda path, result, indent=1: written.append(str(path)))
    bench_engine_overhead.main(["--quick"])
    bench_engine_overhead.main([])
    assert written == [str(_common.RESULTS / "bench_engine_overhead_quick.json"),
                       str(_common.RESULTS / "bench_engine_overhead.json")]


_LOADED = """
import contextlib, io, os, runpy, sys
path = list(sys.path)
for script in sys.argv[1:]:
    sys.path[:] = [os.path.dirname(script)] + path                      # as running the script has it
    for name in [m for m in sys.modules if m.split(".")[0] in ("tinygrad_ssm", "_common") or m.startswith("bench")]:
        del sys.modules[name]
    sys.argv = [script, "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        pass
    module = sys.modules.get("tinygrad_ssm")
    print(os.path.basename(script), module and module.__file__)
"""


def test_every_script_measures_this_clone_not_an_installed_package(tmp_path):
    """bench_ssd, bench_scaling, bench_engine_overhead, profile_step and gpu_check imported tinygrad_ssm before
    _common put the clone on sys.path: they measured whatever copy was installed (or failed without one)."""
    decoy = tmp_path / "site" / "tinygrad_ssm"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")                              # an installed copy, elsewhere
    here = Path(__file__).resolve().parents[1]
    scripts = sorted(str(p) for p in (here / "benchmarks").glob("*.py") if not p.name.startswith("_"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run([sys.executable, "-c", _LOADED, *scripts], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert set(loaded) == {Path(s).name for s in scripts}
    wrong = {name: where for name, where in loaded.items()
             if where != "None" and not where.startswith(str(here / "tinygrad_ssm"))}
    assert not wrong


def test_threads_must_be_a_number_and_tables_print_thousands_plainly(monkeypatch):
    """--threads abc ended in int()'s traceback; a float of 7,760 printed as 7.76e+03 (and as 5.09e+03 in
    docs/benchmarks.md, whose run_all.py had a formatter of its own)."""
    monkeypatch.setattr(sys, "argv", ["bench.py", "--threads", "abc"])
    with pytest.raises(SystemExit, match="--threads must be a whole number of threads, got 'abc'"):
        _common.threads_from_argv()
    assert _common.format_table(["a", "b"], [[7760.4, 0.01234]]).splitlines()[-1].split() == ["7,760", "0.0123"]
    import run_all                                                      # docs/benchmarks.md wrote 5.09e+03
    assert run_all.markdown_table(["a", "b", "c"], [[5088.4, 0.01234, "-"]]).splitlines()[-1] == \
        "| 5,088 | 0.0123 | - |"


def test_missing_references_stop_with_what_to_do(tmp_path, monkeypatch, capsys):
    """Without llama.cpp, bench_llama_cpp loaded two 130M models, warmed them up, then died in subprocess's
    FileNotFoundError (a folder without config.json: from_pretrained's traceback); parity_transformers without
    torch ended in an ImportError traceback; bench_engine_overhead without torch said 'torch runs with 1 thread'."""
    import bench_llama_cpp
    for name in ("f32.gguf", "q8_0.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SystemExit, match="holds no config.json: give the folder --export wrote"):
        bench_llama_cpp.main(["--model", str(tmp_path), "--llama-bench", str(tmp_path / "llama-bench")])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"--llama-bench '.*llama-bench' is not an executable file: build llama.cpp"):
        bench_llama_cpp.main(["--model", str(tmp_path), "--llama-bench", str(tmp_path / "llama-bench")])

    monkeypatch.setitem(sys.modules, "torch", None)                     # torch not installed
    monkeypatch.setitem(sys.modules, "transformers", None)
    import parity_transformers
    with pytest.raises(SystemExit, match=r"needs the bench extra \(pip install -e '.\[bench\]'\)"):
        parity_transformers.main(["--steps", "1", "--json", str(tmp_path / "p.json")])
    import bench_engine_overhead
    monkeypatch.setattr(bench_engine_overhead, "per_call", lambda fn, calls: 1.0)
    bench_engine_overhead.main(["--quick", "--json", str(tmp_path / "e.json")])
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["rows"][0][2] == "-" and "torch is not installed" in result["notes"][1]
    assert "set_num_threads" not in capsys.readouterr().out


_HEAP_REUSE = """
import numpy as np
import _common
_common.fixed_mmap_threshold()                                       # as the memory subprocesses run
def call():
    blocks = [np.ones(25_000, np.float32) for _ in range(400)]       # 40 MB in 100 kB blocks: glibc's heap
    return len(blocks)
held = [np.ones(25_000, np.float32) for _ in range(400)]             # a warm-up's arrays, then one more above
pin = np.ones(25_000, np.float32)                                    # them, so the heap's top cannot shrink
del held                                                             # freed, still resident
print(_common.peak_added_bytes(call))
"""


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_peak_memory_counts_arrays_placed_in_freed_heap():
    """bench_scaling read the process's lifetime peak (ru_maxrss) over its resident size: a warm-up's freed heap
    stayed resident and took the measured call's arrays, so generation read 0.0 MiB on both sides."""
    done = subprocess.run([sys.executable, "-c", _HEAP_REUSE], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1] / "benchmarks")
    assert done.returncode == 0, done.stderr[-2000:]
    assert 38e6 < int(done.stdout.split()[-1]) < 46e6


def test_count_flags_stop_at_parsing(monkeypatch, capsys):
    """--batches 0 failed inside generate, --repeats 0 in the median of no times, a negative --new-tokens further
    on: every count flag is _common.positive_int (or nonnegative_int), so argparse stops first, naming the flag."""
    import argparse
    assert _common.positive_int("3") == 3 and _common.nonnegative_int("0") == 0
    for parse, text, message in ((_common.positive_int, "0", "must be >= 1, got 0"),
                                 (_common.nonnegative_int, "-1", "must be >= 0, got -1"),
                                 (_common.positive_int, "2.5", "must be a whole number >= 1, got '2.5'")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)
    import bench_generate
    import bench_quantized
    import bench_ssd
    import bench_train_step
    cases = [(bench_generate.main, ["--batches", "1", "0"], "--batches: must be >= 1, got 0"),
             (bench_generate.main, ["--new-tokens", "-4"], "--new-tokens: must be >= 1, got -4"),
             (bench_train_step.main, ["--repeats", "0"], "--repeats: must be >= 1, got 0"),
             (bench_train_step.main, ["--warmup", "-1"], "--warmup: must be >= 0, got -1"),
             (bench_quantized.main, ["--new-tokens", "0"], "--new-tokens: must be >= 1, got 0"),
             (bench_ssd.main, ["--repeats", "x"], "--repeats: must be a whole number >= 1, got 'x'")]
    for main, argv, message in cases:
        with pytest.raises(SystemExit) as stopped:                      # argparse's exit, before any work
            main(argv)
        assert stopped.value.code == 2 and message in capsys.readouterr().err, argv
    import bench_distributed
    monkeypatch.setattr(sys, "argv", ["bench_distributed.py", "--steps", "2", "--skip", "2"])
    with pytest.raises(SystemExit):
        bench_distributed.main()
    assert "--skip 2 leaves none of --steps 2: give --skip below --steps" in capsys.readouterr().err


def test_the_grad_accum_benchmark_runs_trainings_own_step():
    """bench_grad_accum drives train/step.py's train_step through the parts of a run it reads; when train_step
    began to put back an unfinished step's draw (run.sampler.state_dict), the script died at its first step,
    unnoticed for a day (found by `run_all.py --quick`)."""
    import bench_grad_accum
    import numpy as np
    shape = bench_grad_accum.QUICK_SHAPE
    model = _common.ours(shape, 32)
    before = {name: t.data.copy() for name, t in model.varmap.named_vars()}
    ids = np.random.default_rng(0).integers(0, shape["vocab_size"], (4, 33))
    record = bench_grad_accum.step_of(model, ids, 2)()
    assert record["step"] == 1 and np.isfinite(record["train_loss"])
    assert all(not np.array_equal(t.data, before[name]) for name, t in model.varmap.named_vars())  # AdamW moved each
