"""Run under `mpiexec -n 2`: `python ctrl_c.py MODE DATA OUT`: rank 1 alone gets Ctrl-C (SIGINT) after step 2.
MODE once: just that; every rank stops after step 3 and rank 0 says which rank asked.
MODE twice: and a second Ctrl-C on rank 1 as the run finishes (after the agreed stop): the job stops, exit 130.
MODE sigterm: rank 1 gets SIGTERM instead (a scheduler's time limit), which rank 0 names."""
import os
import signal
import sys

from tinygrad_ssm import distributed as dist
from tinygrad_ssm.train import loop
from tinygrad_ssm.train.cli import EXIT_INTERRUPTED

mode, data, out = sys.argv[1:4]
world = dist.init()
cfg = loop.TrainConfig(data=data, out=out, d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=4, seq_len=32,
                       eval_batches=1, sample_bytes=0, steps=50, eval_every=100)


def callback(info):
    if world.rank == 1 and info.step == 2:
        os.kill(os.getpid(), signal.SIGTERM if mode == "sigterm" else signal.SIGINT)


if mode == "twice" and world.rank == 1:
    real_finish = loop._finish

    def finish(*args):
        os.kill(os.getpid(), signal.SIGINT)
        return real_finish(*args)

    loop._finish = finish
result = loop.train(cfg, progress=False, world=world, callback=callback, say=print)
print(f"rank {world.rank}: {result.status} at step {result.step}", flush=True)
sys.exit(EXIT_INTERRUPTED if result.status == "interrupted" else 0)
