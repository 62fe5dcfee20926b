"""Data-parallel training over MPI, run through `mpiexec -n 2` in subprocesses (the `distributed` extra).

2 ranks equal 1 process at the same global batch (float64, 1e-12 relative), also resumed and resumed with
another world size; a failing rank ends the whole job; bad launches fail clearly.
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tinygrad_ssm.train import cli
from tinygrad_ssm import distributed as dist
from tinygrad_ssm.io.safetensors import load_file
from tinygrad_ssm.train.loop import TrainConfig
from tinygrad_ssm.train.loop import train

from tests.support.training import quiet

SCRIPTS = Path(__file__).parent / "mpi_scripts"
ROOT = Path(__file__).resolve().parent.parent
TINY = ["--d-model", "32", "--n-layer", "1", "--d-state", "16", "--headdim", "16", "--batch-size", "4",
        "--seq-len", "32", "--eval-batches", "2", "--sample-bytes", "8", "--lr", "1e-2", "--min-lr", "1e-3",
        "--warmup-steps", "2", "--no-progress"]


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _why_skip() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return 'mpi4py is not installed (pip install -e ".[distributed]")'
    try:
        import mpi4py.MPI  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an MPI library that does not load is a reason to skip too
        return f"mpi4py cannot import: {e}"
    if _mpiexec() is None:
        return "no mpiexec found (the mpich wheel brings one)"
    return None


needs_mpi = pytest.mark.skipif(_why_skip() is not None, reason=f"MPI tests: {_why_skip()}")


def mpirun(n: int, args: list, timeout: float = 120) -> subprocess.CompletedProcess:
    """`mpiexec -n n python ARGS` with one BLAS/numba thread per rank; the repository on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([_mpiexec(), "-n", str(n), sys.executable, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def weights(run_dir: Path) -> dict:
    from tinygrad_ssm.train import checkpoint as ckpt

    return load_file(ckpt.resolve_checkpoint(run_dir) / "model.safetensors")


def assert_close(a: dict, b: dict, rtol=1e-12):
    """Every parameter: max |a - b| <= rtol * max |b| (summation order is the only difference)."""
    assert a.keys() == b.keys()
    worst = max(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max() for k in a)
    assert worst <= rtol, f"worst relative difference {worst:.3g}"
    return worst


@needs_mpi
def test_two_ranks_equal_one_process_fresh_resumed_and_with_another_world_size(corpus, tmp_path):
    steps = ["--steps", "4", "--eval-every", "2", "--checkpoint-every", "2", "--dtype", "float64",
             "--data", corpus]
    # one process, in this process
    cfg = TrainConfig(data=str(corpus), out=str(tmp_path / "one"), d_model=32, n_layer=1, d_state=16, headdim=16,
                      batch_size=4, seq_len=32, eval_batches=2, sample_bytes=8, lr=1e-2, min_lr=1e-3,
                      warmup_steps=2, steps=4, eval_every=2, checkpoint_every=2, dtype="float64")
    train(cfg, progress=False, say=quiet)                              # its weights are read back from disk
    two = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, *steps, "--out", tmp_path / "two"])
    assert two.returncode == 0, two.stderr[-3000:]
    assert "over 2 MPI ranks" in two.stdout and two.stdout.count("final validation") == 1  # rank 0 alone prints
    assert two.stdout.count("step 2: validation") == 1, two.stdout
    fresh = assert_close(weights(tmp_path / "two"), weights(tmp_path / "one"))
    # the log alike: one record per step and per validation (rank 0's alone), the loss the mean over the ranks, the
    # validation summed over the ranks' shares of the batches, the tokens the whole global batch's
    logs = {name: [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
            for name in ("one", "two")}
    assert [sorted(set(r) - {"allreduce_s", "buckets_sent_in_backward"}) for r in logs["two"]] == \
        [sorted(r) for r in logs["one"]], logs
    for two_rec, one_rec in zip(logs["two"], logs["one"]):
        assert two_rec["step"] == one_rec["step"] and two_rec["tokens"] == one_rec["tokens"], (two_rec, one_rec)
        for key in ("train_loss", "val_bpb"):
            if key in one_rec:
                assert abs(two_rec[key] - one_rec[key]) <= 1e-12 * abs(one_rec[key]), (key, two_rec, one_rec)
    # without overlap: the same sums in the same buckets, so bit for bit the same weights
    flat = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, *steps, "--out", tmp_path / "flat", "--no-overlap"])
    assert flat.returncode == 0, flat.stderr[-3000:]
    assert all(np.array_equal(a, b) for a, b in zip(weights(tmp_path / "flat").values(),
                                                   weights(tmp_path / "two").values()))
    # with overlap the backward itself sent every bucket (the last one completes at the last leaf); without, none
    sent = {name: {r["buckets_sent_in_backward"] for r in map(json.loads, (tmp_path / name / "log.jsonl")
                                                               .read_text().splitlines()) if "train_loss" in r}
            for name in ("two", "flat")}
    (overlapped,), (flat_sent,) = sent["two"], sent["flat"]
    n_buckets = overlapped.split("/")[1]
    assert overlapped == f"{n_buckets}/{n_buckets}" and flat_sent == f"0/{n_buckets}", sent
    # stop at step 2 and resume, 2 ranks: bit-identical to the uninterrupted 2-rank run
    half = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, *steps, "--out", tmp_path / "split", "--stop-at", "2"])
    assert half.returncode == 0, half.stderr[-3000:]
    rest = mpirun(2, ["-m", "tinygrad_ssm", "train", "--resume", tmp_path / "split", "--no-progress"])
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert rest.stdout.count("run folder:") == rest.stdout.count("next:") == 1, rest.stdout   # rank 0's alone
    split, whole = weights(tmp_path / "split"), weights(tmp_path / "two")
    assert all(np.array_equal(split[k], whole[k]) for k in whole)
    resumed = assert_close(split, weights(tmp_path / "one"))
    # the 2-rank step-2 checkpoint resumed by one process: another world size works, equal up to rounding
    other = tmp_path / "split" / "checkpoints" / "step-000002"
    assert other.exists()  # --keep-checkpoints 2 keeps steps 2 and 4
    messages = []
    train(resume=str(other), overrides={"out": str(tmp_path / "other")}, progress=False, say=messages.append)
    assert any("saved with 2 MPI rank(s), resumed with 1" in m for m in messages), messages
    other_ranks = assert_close(weights(tmp_path / "other"), weights(tmp_path / "one"))
    # and the other way: one process's step-2 checkpoint continued by 2 ranks
    up = mpirun(2, ["-m", "tinygrad_ssm", "train", "--resume", tmp_path / "one" / "checkpoints" / "step-000002",
                    "--out", tmp_path / "up", "--no-progress"])
    assert up.returncode == 0 and "saved with 1 MPI rank(s), resumed with 2" in up.stdout, up.stderr[-3000:]
    assert_close(weights(tmp_path / "up"), weights(tmp_path / "one"))
    print(f"\nequivalence, worst max relative difference over the parameters: 2 ranks fresh {fresh:.2e}, "
          f"2 ranks resumed {resumed:.2e}, saved by 2 ranks and resumed by 1 process {other_ranks:.2e}")


@needs_mpi
def test_each_rank_trains_on_its_own_share_of_the_global_batch(corpus, tmp_path, monkeypatch):
    """Rank r gets rows [r b/2, (r+1) b/2) of the batch one process draws with the same seed."""
    from tinygrad_ssm.models.mamba2.model import Mamba2LMHeadModel

    proc = mpirun(2, [SCRIPTS / "faulty_run.py", "rows", corpus, tmp_path / "run"], timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen, real_loss = [], Mamba2LMHeadModel.loss
    monkeypatch.setattr(Mamba2LMHeadModel, "loss", lambda self, x, y: seen.append(x) or real_loss(self, x, y))
    train(TrainConfig(data=str(corpus), out=str(tmp_path / "one"), d_model=32, n_layer=1, d_state=16, headdim=16,
                      batch_size=4, seq_len=32, eval_batches=1, sample_bytes=0, steps=1), progress=False,
          say=quiet)
    batch = seen[0]  # (4, 32)
    np.testing.assert_array_equal(np.load(f"{tmp_path / 'run'}-rows-rank0.npy"), batch[:2])
    np.testing.assert_array_equal(np.load(f"{tmp_path / 'run'}-rows-rank1.npy"), batch[2:])


@needs_mpi
def test_python_api_in_ones_own_loop():
    proc = mpirun(2, [SCRIPTS / "api_loop.py"], timeout=90)
    assert proc.returncode == 0 and "api ok" in proc.stdout, proc.stderr[-3000:]


@needs_mpi
def test_a_rank_raising_mid_step_ends_the_whole_job_with_its_message(corpus, tmp_path):
    t0 = time.perf_counter()
    proc = mpirun(2, [SCRIPTS / "faulty_run.py", "raise", corpus, tmp_path / "run"], timeout=90)
    elapsed = time.perf_counter() - t0
    assert proc.returncode != 0
    assert "[rank 1 of 2] error: RuntimeError: injected failure on rank 1 in step 3" in proc.stderr, proc.stderr
    assert "aborting the whole MPI job" in proc.stderr
    assert elapsed < 60, elapsed  # not stuck: rank 0 was waiting in an allreduce when rank 1 failed


@needs_mpi
def test_weights_that_differ_between_ranks_stop_the_run(corpus, tmp_path):
    proc = mpirun(2, [SCRIPTS / "faulty_run.py", "corrupt", corpus, tmp_path / "run"], timeout=90)
    assert proc.returncode == cli.EXIT_DIVERGED, proc.stderr[-3000:]
    assert "after step 2 the weights of rank(s) [1] differ from rank 0's in 1 parameters" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was saved from the diverged ranks


@needs_mpi
def test_micro_batches_on_two_ranks_equal_one_process_and_send_once(corpus, tmp_path):
    """--grad-accum 2 on 2 ranks (each rank's 4 rows as 2 micro-batches of 2): one process's step of the whole
    batch, to rounding; the first backward sends nothing (no_sync), the last one sends every bucket; a rank's share
    that the micro-batches cannot split is named with the values that can."""
    steps = ["--steps", "3", "--eval-every", "2", "--dtype", "float64", "--data", corpus, "--batch-size", "8"]
    cfg = TrainConfig(data=str(corpus), out=str(tmp_path / "one"), d_model=32, n_layer=1, d_state=16, headdim=16,
                      batch_size=8, seq_len=32, eval_batches=2, sample_bytes=8, lr=1e-2, min_lr=1e-3,
                      warmup_steps=2, steps=3, eval_every=2, dtype="float64")
    train(cfg, progress=False, say=quiet)
    two = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, *steps, "--grad-accum", "2", "--out", tmp_path / "two"])
    assert two.returncode == 0, two.stderr[-3000:]
    assert "(in 2 micro-batches of 2 per rank)" in two.stdout, two.stdout
    assert_close(weights(tmp_path / "two"), weights(tmp_path / "one"))
    records = [json.loads(line) for line in (tmp_path / "two" / "log.jsonl").read_text().splitlines()]
    sent = {r["buckets_sent_in_backward"] for r in records if "train_loss" in r}
    (only,) = sent
    assert only.split("/")[0] == only.split("/")[1], sent
    bad = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, "--batch-size", "4", "--grad-accum", "4", "--data", corpus,
                     "--out", tmp_path / "bad"], timeout=90)
    assert bad.returncode == cli.EXIT_USAGE, bad.stderr[-3000:]
    message = ("--grad-accum 4 must divide each MPI rank's share of the batch (--batch-size 4 over 2 ranks: 2 "
               "sequences), the rank's micro-batches being equal; give --grad-accum one of 1, 2")
    assert bad.stderr.count(message) == 1, bad.stderr
    assert not (tmp_path / "bad").exists()


@needs_mpi
def test_global_batch_not_divisible_by_the_ranks(corpus, tmp_path):
    proc = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, "--batch-size", "3", "--data", corpus,
                      "--out", tmp_path / "run"], timeout=90)
    assert proc.returncode == cli.EXIT_USAGE, proc.stderr[-3000:]
    message = "--batch-size 3 (the global batch) must be divisible by the number of MPI ranks, 2"
    assert proc.stderr.count(message) == 1, proc.stderr  # said once, by rank 0
    assert not (tmp_path / "run").exists()


def test_distributed_flag_without_mpi4py_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py -> ImportError, as when not installed
    monkeypatch.setattr(dist, "_world", None)
    code = cli.main(["train", "--distributed", "--steps", "1", "--out", str(tmp_path / "run")])
    assert code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "distributed training needs mpi4py" in err and 'pip install -e ".[distributed]"' in err
    assert not (tmp_path / "run").exists()


def test_launched_by_mpiexec_without_mpi4py_is_a_clear_error(monkeypatch, capsys, tmp_path):
    """N copies started by mpiexec must not each train alone into one folder: no mpi4py -> a clear error."""
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setattr(dist, "_world", None)
    monkeypatch.setenv("PMI_SIZE", "2")
    assert dist.launcher_world_size() == 2
    assert cli.main(["train", "--steps", "1", "--out", str(tmp_path / "run")]) == cli.EXIT_USAGE
    assert "needs mpi4py" in capsys.readouterr().err


@pytest.mark.parametrize("size_var,rank_var", [("PMI_SIZE", "PMI_RANK"),
                                               ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
                                               ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK")])
def test_each_launchers_variables_are_read(monkeypatch, size_var, rank_var):
    """MPICH's hydra, Open MPI and MVAPICH name the world size and rank differently: each is seen alone, the
    rank from its rank variable (not the size's), and a value that is not a count is passed over."""
    for var in (*dist._WORLD_SIZE_VARS, *dist._RANK_VARS):
        monkeypatch.delenv(var, raising=False)
    assert (dist.launcher_world_size(), dist.launcher_rank()) == (1, 0)
    monkeypatch.setenv(size_var, "3")
    monkeypatch.setenv(rank_var, "2")
    assert (dist.launcher_world_size(), dist.launcher_rank()) == (3, 2)
    monkeypatch.setenv(size_var, "")
    assert dist.launcher_world_size() == 1


def test_without_mpi_nothing_imports_mpi4py():
    """Alone, a training run never imports mpi4py (the extra is optional)."""
    code = ("import sys; from tinygrad_ssm.train import cli, loop; from tinygrad_ssm import distributed; "
            "assert 'mpi4py' not in sys.modules, 'imported'; print('clean')")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.strip() == "clean", proc.stderr


@needs_mpi
def test_the_own_loop_example_of_docs_distributed_md_runs_on_two_ranks(tmp_path):
    """docs/distributed.md's "From one's own loop" block, as written, under mpiexec -n 2."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "distributed.md").read_text()
    block = page.split("<!-- run by: tests/test_distributed.py -->\n```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "own_loop.py").write_text(block)
    proc = mpirun(2, [tmp_path / "own_loop.py"], timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 of 2: ok" in proc.stdout and "rank 1 of 2: ok" in proc.stdout, proc.stdout


@needs_mpi
def test_a_launcher_size_that_mpi_does_not_see_is_refused(corpus, tmp_path):
    """PMI_SIZE=2 left in the environment (or another MPI's mpiexec): MPI sees one process, so two lone copies
    would each train into one folder; refused, naming the variable, before anything is written."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PMI_SIZE": "2"}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tinygrad_ssm", "train", *TINY, "--data", str(corpus), "--steps", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "PMI_SIZE=2 says a launcher started 2 processes, but MPI sees this one alone" in proc.stderr
    assert not out.exists()


@needs_mpi
def test_the_python_apis_edges_are_told_on_every_rank():
    """An audit's cases (tests/mpi_scripts/api_edges.py): a frozen parameter failed GradientAllreducer's
    construction; a reducer dropped without close() went on sending (its hooks kept it alive); a .grad changed on
    rank 0 alone raised there alone (rank 1 hung); ranks with other parameters or optimizers hung, were broadcast
    into silently, or made MPICH abort the job in check_same_weights (a (3, 2) against a (2, 3) passed)."""
    cases = ["frozen", "dropped", "changed", "extra", "shape", "optimizer", "count", "transposed"]
    proc = mpirun(2, [SCRIPTS / "api_edges.py", *cases], timeout=90)
    said = {}
    for rank, case, text in re.findall(r"rank (\d): (\w+): (.*?)(?=rank \d: \w+: |\n|$)", proc.stdout):
        said.setdefault(case, {}).setdefault(int(rank), []).append(text)
    assert proc.returncode == 0 and set(said) == set(cases), (proc.stdout[-3000:], proc.stderr[-3000:])
    for case in cases:
        assert said[case].keys() == {0, 1}, (case, said[case])              # told on both ranks
    for rank in (0, 1):
        assert said["frozen"][rank][0] == "frozen ok [1.5, 1.5, 1.5, 1.5] None"   # mean of 1 and 2, none for it
        assert "p0 had requires_grad False when the reducer was built" in said["frozen"][rank][1]
        assert said["dropped"][rank] == ["dropped ok [1.5, 1.5, 1.5]", "no error"]
        assert "was replaced or changed after backward()" in said["changed"][rank][0]
        assert f"the .grad of {'p0' if rank == 0 else 'parameters on rank(s) [0]'} was" in said["changed"][rank][0]
    expected = {"extra": "broadcast_weights_and_optimizers: rank(s) [1] hold other parameters or optimizers than "
                         "rank 0 (2 parameters there, 1 on rank 0)",
                "shape": "(parameter 'p0' (3,) float32 there, 'p0' (1,) float32 on rank 0)",
                "optimizer": "(optimizer 'all': SGD of 1 parameters there, AdamW of 1 on rank 0)",
                "count": "check_same_weights: rank(s) [1] hold other parameters or optimizers than rank 0 (2 "
                         "parameters there, 1 on rank 0)",
                "transposed": "(parameter 'p0' (3, 2) float32 there, 'p0' (2, 3) float32 on rank 0)"}
    for case, words in expected.items():
        for rank in (0, 1):
            assert said[case][rank][0].startswith("RanksDisagree: ") and words in said[case][rank][0], said[case]
