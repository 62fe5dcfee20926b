"""What building a model and training leave in the user's process, found by an audit (2026-12-06): building a fused
model ran /sbin/ldconfig in a subprocess (ctypes.util.find_library), and train(progress=False) left tqdm's monitor
thread running after it returned. Run in a fresh process: both happen once per process."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import json, subprocess, sys, threading
    spawned = []
    real_init = subprocess.Popen.__init__
    def spy(self, args, *rest, **kwargs):
        spawned.append(str(args))
        real_init(self, args, *rest, **kwargs)
    subprocess.Popen.__init__ = spy
    before = {t.name for t in threading.enumerate()}
    import tinygrad_ssm as tg
    from tinygrad_ssm.train.loop import TrainConfig, train
    tg.Mamba2LMHeadModel(tg.Mamba2Config(d_model=32, n_layer=1, vocab_size=64, d_state=16, headdim=16,
                                         chunk_size=16), fused=True)
    built = list(spawned)
    train(TrainConfig(data=sys.argv[1], out=sys.argv[2], d_model=32, n_layer=1, d_state=16, headdim=16,
                      batch_size=2, seq_len=32, eval_batches=1, sample_bytes=4, steps=1),
          progress=False, say=lambda message: None)
    threads = sorted(t.name for t in threading.enumerate() if t.name not in before)
    print(json.dumps({"spawned_by_the_model": built, "threads": threads}))
""")


def test_a_model_spawns_no_program_and_a_quiet_run_leaves_no_bar_thread(corpus, tmp_path):
    done = subprocess.run([sys.executable, "-c", PROBE, str(corpus), str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["spawned_by_the_model"] == []
    assert not [t for t in found["threads"] if "tqdm" in t], found["threads"]
