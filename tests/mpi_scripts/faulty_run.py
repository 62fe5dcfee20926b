"""Run under `mpiexec -n 2`: `python faulty_run.py MODE DATA OUT`.

MODE raise: rank 1's third loss computation raises (mid-step: rank 0 is then inside an allreduce).
MODE corrupt: after step 1 rank 1 nudges one weight; the checksum at the step-2 validation must catch it.
MODE corrupt-save: as corrupt, but validation only every 10 steps, a checkpoint every step: caught before the save.
MODE corrupt-stop: as corrupt, but no validation nor checkpoint before --stop-at 2's save: caught before it.
MODE diverge: lr 1e25, a checkpoint every step; each rank prints its TrainingDiverged message.
MODE rows: each rank saves the input rows of its first training batch to OUT/rows-rank<r>.npy.
"""
import sys

from tinygrad_ssm import distributed as dist
from tinygrad_ssm.train.cli import EXIT_DIVERGED
from tinygrad_ssm.models.mamba2.model import Mamba2LMHeadModel
from tinygrad_ssm.train.loop import TrainConfig
from tinygrad_ssm.train.loop import TrainingDiverged, train

mode, data, out = sys.argv[1:4]
world = dist.init()
cfg = TrainConfig(data=data, out=out, d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=4, seq_len=32,
                  eval_batches=1, sample_bytes=8, steps=6, eval_every=2)
callback = None
if mode == "raise" and world.rank == 1:
    real_loss, calls = Mamba2LMHeadModel.loss, []

    def loss(self, x, y):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected failure on rank 1 in step 3")
        return real_loss(self, x, y)

    Mamba2LMHeadModel.loss = loss
if mode == "rows":
    import numpy as np

    real_loss, calls = Mamba2LMHeadModel.loss, []

    def loss(self, x, y):
        if not calls:
            np.save(f"{out}-rows-rank{world.rank}.npy", np.asarray(x))
        calls.append(1)
        return real_loss(self, x, y)

    Mamba2LMHeadModel.loss = loss
    cfg.steps = 1
if mode == "corrupt-save":
    cfg.eval_every, cfg.checkpoint_every = 10, 1
if mode == "corrupt-stop":
    cfg.eval_every, cfg.checkpoint_every = 10, 10
if mode == "diverge":
    cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.checkpoint_every = 1e25, 1e24, 3, 1
    cfg.weight_decay = 0.0  # (lr x weight decay over 2 is refused before any work: the lr alone diverges here)
if mode.startswith("corrupt") and world.rank == 1:
    def callback(info):
        if info.step == 1:
            name, weight = info.model.varmap.named_vars()[0]
            weight.data.flat[0] += 0.01  # as a bit flip or a non-deterministic kernel would

try:
    train(cfg, progress=False, world=world, callback=callback, stop_at=2 if mode == "corrupt-stop" else None,
          say=print)
except TrainingDiverged as e:
    print(f"rank {world.rank}: {e}", file=sys.stderr)
    sys.exit(EXIT_DIVERGED)
except dist.RanksDiverged as e:
    if world.is_root:
        print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_DIVERGED)
