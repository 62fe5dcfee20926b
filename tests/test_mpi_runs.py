"""Training runs under `mpiexec -n 2` as a user meets them: resuming, stopping, failing, saving (QA walk of the
MPI path). The helpers and the skip without mpi4py are tests/test_distributed.py's."""
import re
import shutil

import pytest

from tests.test_distributed import SCRIPTS, TINY, mpirun, needs_mpi  # noqa: F401 - mpirun's environment
from tinygrad_ssm import distributed as dist
from tinygrad_ssm.train.cli import EXIT_DIVERGED, EXIT_IO


@needs_mpi
def test_a_tokenized_run_resumes_on_two_ranks_without_the_tokenizer_file(corpus, bpe_tokenizer, tmp_path):
    """docs/distributed.md: rank 0 reads the checkpoint and sends it; the tokenizer too, so the file the run was
    given may be gone (rank 1 read it again and failed) or replaced (rank 1 tokenized with another one)."""
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    shutil.copy(bpe_tokenizer, tok)
    run = tmp_path / "run"
    first = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, "--data", corpus, "--tokenizer", tok, "--steps", "2",
                       "--stop-at", "1", "--out", run])
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"continue with: mpiexec -n 2 python -m tinygrad_ssm train --resume {run}" in first.stdout, first.stdout
    tok.unlink()
    gone = mpirun(2, ["-m", "tinygrad_ssm", "train", "--resume", run, "--no-progress", "--stop-at", "2"])
    assert gone.returncode == 0, gone.stderr[-3000:]
    assert "resumed from" in gone.stdout, gone.stdout
    tok.write_text('{"not": "a tokenizer"}')   # another file at the path: the checkpoint's copy is still the one
    replaced = mpirun(2, ["-m", "tinygrad_ssm", "train", "--resume", run, "--no-progress"])
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert "final validation" in replaced.stdout
    assert f"  mpiexec -n 2 python -m tinygrad_ssm train --resume {run} --steps 4" in replaced.stdout, replaced.stdout
    assert f"  python -m tinygrad_ssm generate --model {run}" in replaced.stdout   # one process (it refuses N)


@needs_mpi
@pytest.mark.parametrize("command", [["generate", "--max-new-tokens", "5", "--prompt", "a"], ["eval", "--json"]])
def test_generate_and_eval_under_mpiexec_are_refused_once(stopped_run, tmp_path, command):
    """They run in one process: under mpiexec -n 2 every rank ran the whole command (the output twice; two
    writers of one --json file, and a false error from the one that lost)."""
    if command[-1] == "--json":
        command = [*command, tmp_path / "report.json"]
    proc = mpirun(2, ["-m", "tinygrad_ssm", command[0], "--model", stopped_run, *command[1:]])
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = f"error: `{command[0]}` runs in one process, but mpiexec started 2"
    assert proc.stderr.count(message) == 1 and "without mpiexec" in proc.stderr, proc.stderr
    assert proc.stdout == "" and not (tmp_path / "report.json").exists()


@needs_mpi
@pytest.mark.parametrize("mode", ["corrupt-save", "corrupt-stop"])
def test_weights_that_differ_are_caught_before_every_save(corpus, tmp_path, mode):
    """Not only at validation steps: a checkpoint every step (validation every 10) and --stop-at's save compare
    the ranks' weights first, so the checkpoint of diverged ranks is never written."""
    proc = mpirun(2, [SCRIPTS / "faulty_run.py", mode, corpus, tmp_path / "run"], timeout=90)
    assert proc.returncode == EXIT_DIVERGED, proc.stderr[-3000:]
    assert "after step 2 the weights of rank(s) [1] differ from rank 0's" in proc.stderr, proc.stderr
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert saved == (["step-000001"] if mode == "corrupt-save" else []), saved   # step 1 was before the change


@needs_mpi
def test_a_diverged_run_names_the_last_checkpoint_once_and_alike_on_every_rank(corpus, tmp_path):
    run = tmp_path / "run"
    proc = mpirun(2, ["-m", "tinygrad_ssm", "train", *TINY, "--data", corpus, "--steps", "20", "--lr", "1e25",
                      "--weight-decay", "0",
                      "--min-lr", "1e24", "--warmup-steps", "3", "--checkpoint-every", "1", "--out", run])
    assert proc.returncode == EXIT_DIVERGED, proc.stderr[-3000:]
    assert proc.stderr.count("error: training diverged") == 1, proc.stderr          # rank 0 alone says it
    assert f"the last good checkpoint {run}/checkpoints/step-000001 was left untouched" in proc.stderr
    api = mpirun(2, [SCRIPTS / "faulty_run.py", "diverge", corpus, tmp_path / "api"], timeout=90)
    said = dict(re.findall(r"rank (\d): (training diverged: .*?--warmup-steps\.)", api.stderr))  # lines may interleave
    assert said.keys() == {"0", "1"} and said["0"] == said["1"], api.stderr   # rank 1 knows the checkpoint too
    assert "step-000001 was left untouched" in said["1"], said


@needs_mpi
def test_a_failed_save_on_rank_0_ends_every_rank_as_one_process_does(corpus, tmp_path):
    """ulimit -f reached on rank 0: one line naming the file and exit 74, as alone (was MPI_Abort, exit 1)."""
    run = tmp_path / "run"
    proc = mpirun(2, [SCRIPTS / "cli_file_size_limit.py", 100 * 1024, "train", *TINY, "--data", corpus, "--steps", "4",
                      "--checkpoint-every", "2", "--out", run])
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cannot write" in lines[0] and "step-000002" in lines[0], proc.stderr
    assert "File too large" in lines[0] and "Traceback" not in proc.stderr and "abort" not in proc.stderr.lower()


@needs_mpi
def test_rank_0s_log_failing_ends_the_job_with_one_line_and_exit_74(corpus, tmp_path):
    """log.jsonl reaching ulimit -f on rank 0, outside any step the ranks agree on: the job ended with exit 1 and a
    traceback (an audit of MPI failure modes); now one line naming the log, and 74, as one process gives."""
    run = tmp_path / "run"
    proc = mpirun(2, [SCRIPTS / "cli_file_size_limit.py", 1500, "train", *TINY, "--data", corpus, "--steps", "30",
                      "--checkpoint-every", "100", "--out", run])
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and f"cannot write {run / 'log.jsonl'}: File too large" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@needs_mpi
def test_rank_and_world_size_before_init_under_a_launcher_raise(monkeypatch):
    proc = mpirun(2, [SCRIPTS / "before_init.py"], timeout=60)
    assert proc.returncode == 0 and "before init ok" in proc.stdout, proc.stderr[-3000:] + proc.stdout
    monkeypatch.setattr(dist, "_world", None)          # alone, without a launcher: 0 and 1, as before
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert (dist.rank(), dist.world_size()) == (0, 1)


@needs_mpi
def test_train_without_a_world_under_mpiexec_is_refused(corpus, tmp_path):
    proc = mpirun(2, [SCRIPTS / "train_without_world.py", corpus, tmp_path / "run"], timeout=60)
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = "DistributedError: train(): a launcher (mpiexec) started 2 processes, but world= is the single"
    assert proc.stdout.count(message) == 2 and "world=tinygrad_ssm.distributed.init()" in proc.stdout, proc.stdout
    assert not (tmp_path / "run").exists()


@needs_mpi
def test_ctrl_c_on_rank_1_is_said_by_rank_0_and_a_second_one_after_the_stop_ends_the_job(corpus, tmp_path):
    once = mpirun(2, [SCRIPTS / "ctrl_c.py", "once", corpus, tmp_path / "once"], timeout=90)
    assert once.returncode == 130, once.stderr[-3000:]
    assert "Ctrl-C on rank 1 of 2: every rank stops after step 3" in once.stdout, once.stdout
    assert "rank 0: interrupted at step 3" in once.stdout and "rank 1: interrupted at step 3" in once.stdout
    twice = mpirun(2, [SCRIPTS / "ctrl_c.py", "twice", corpus, tmp_path / "twice"], timeout=90)
    assert twice.returncode == 130, twice.stderr[-3000:]           # was 2, without a word
    said = twice.stderr.find("[rank 1 of 2] stopped by Ctrl-C: aborting the whole MPI job now")
    assert said >= 0, twice.stderr   # first: MPICH may still print the KeyboardInterrupt as the job is torn down
    assert "Traceback" not in twice.stderr[:said], twice.stderr


@needs_mpi
def test_sigterm_on_rank_1_is_named_by_rank_0(corpus, tmp_path):
    """Rank 0 said "Ctrl-C on rank 1" for a SIGTERM there too: the ranks shared only that some rank was stopped."""
    proc = mpirun(2, [SCRIPTS / "ctrl_c.py", "sigterm", corpus, tmp_path / "run"], timeout=90)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "SIGTERM on rank 1 of 2: every rank stops after step 3" in proc.stdout, proc.stdout


@needs_mpi
def test_resuming_a_batch_the_ranks_cannot_share_names_the_rank_counts_that_can(corpus, tmp_path):
    from tests.support.training import TINY as SETTINGS, quiet
    from tinygrad_ssm.train.loop import TrainConfig, train

    run = tmp_path / "run"
    train(TrainConfig(**{**SETTINGS, "batch_size": 3}, steps=2, data=str(corpus), out=str(run)), stop_at=1,
          progress=False, say=quiet)
    proc = mpirun(2, ["-m", "tinygrad_ssm", "train", "--resume", run, "--no-progress"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("this run's global batch is 3 sequences (its --batch-size, kept in the checkpoint") == 1
    assert "resume it with a number of ranks that divides it: 1 or 3" in proc.stderr, proc.stderr


@needs_mpi
def test_another_corpus_on_rank_1_shows_both_fingerprints(corpus, tmp_path):
    proc = mpirun(2, [SCRIPTS / "other_corpus.py", "train", *TINY, "--data", corpus, "--steps", "2",
                      "--out", tmp_path / "run"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = re.search(r"rank 1 reads another corpus .*?\(rank 1: (\{.*?\}); rank 0: (\{.*?\})\)", proc.stderr)
    assert said and "'train_crc32': 12345" in said[1] and "'train_crc32': 12345" not in said[2], proc.stderr


@needs_mpi
def test_data_failing_on_an_inner_rank_of_four_ends_the_job_naming_it(corpus, tmp_path):
    """Rank 2 of 4 failed before the corpus fingerprints' broadcast, which sat inside the agreed data loading: it
    skipped the broadcast and rank 3, fed through it in MPICH's tree, waited for ever (the job hung)."""
    proc = mpirun(4, [SCRIPTS / "one_rank_fails.py", "data", "2", "train", *TINY, "--data", corpus, "--steps", "2",
                      "--out", tmp_path / "run"], timeout=150)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "rank 2 of 4 failed: ValueError: this rank has no data" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@needs_mpi
def test_an_import_failing_on_one_rank_ends_the_job(corpus, tmp_path):
    """tqdm missing on rank 1 only: its ImportError came before train()'s code that ends the job on one rank's error,
    so rank 1 sat in MPI_Finalize and rank 0 waited for it (the job hung)."""
    proc = mpirun(2, [SCRIPTS / "one_rank_fails.py", "tqdm", "1", "train", *TINY, "--data", corpus, "--steps", "2",
                      "--out", tmp_path / "run"], timeout=120)
    assert proc.returncode != 0 and "[rank 1 of 2] error" in proc.stderr, proc.stderr[-3000:]
    assert "tqdm" in proc.stderr


@needs_mpi
def test_ranks_cutting_other_gradient_buckets_are_refused_on_every_rank(corpus, tmp_path):
    """Another package version on rank 1 (buckets of 4 KB): each bucket's allreduce met another bucket of rank 0's,
    the summed numbers made a NaN gradient norm, "training diverged ... try a lower --lr", and then a hang."""
    proc = mpirun(2, [SCRIPTS / "one_rank_fails.py", "buckets", "1", "train", *TINY, "--data", corpus, "--steps", "2",
                      "--out", tmp_path / "run"], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]                    # as flags that differ between ranks
    assert proc.stderr.count("error: GradientAllreducer: the gradient buckets of rank(s) [1] differ from rank 0's") \
        == 1, proc.stderr[-3000:]
    assert "diverged" not in proc.stderr



@needs_mpi
def test_a_rank_that_fails_while_the_package_loads_ends_the_job_with_its_message(corpus, tmp_path):
    """A rank that ended before MPI started (a Ctrl-C, or numba broken on its machine, during the second or more the
    package takes to load) left the other waiting in MPI_Init for ever, with no word (an audit; killed after 10
    minutes). MPI starts first now (__main__.py), and the failing rank ends the whole job, saying why."""
    import os
    import subprocess
    import sys

    from tests.test_distributed import ROOT, _mpiexec
    broken = tmp_path / "broken" / "numba"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("numba is broken on this machine (a test)")\n')
    command = [sys.executable, "-m", "tinygrad_ssm", "train", *TINY, "--data", str(corpus), "--steps", "1",
               "--out", str(tmp_path / "run")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    # one rank as usual, the other with the broken numba first on its path (mpiexec's MPMD form: A : B)
    job = subprocess.run([_mpiexec(), "-n", "1", "-env", "PYTHONPATH", str(ROOT), *command, ":",
                          "-n", "1", "-env", "PYTHONPATH", os.pathsep.join([str(broken.parent), str(ROOT)]), *command],
                         capture_output=True, text=True, timeout=120, env=env)
    assert job.returncode != 0
    assert "[rank 1 of 2] error: ImportError: numba is broken on this machine (a test)" in job.stderr, job.stderr
    assert "aborting the whole MPI job" in job.stderr and not (tmp_path / "run").exists()
