"""Run under `mpiexec -n 2`: `python train_without_world.py DATA OUT`: train() without world= (each rank trained
alone into one folder, one died with 'in use by another training'); each rank prints its error."""
import sys

from tinygrad_ssm.distributed import DistributedError
from tinygrad_ssm.train.loop import TrainConfig, train

cfg = TrainConfig(data=sys.argv[1], out=sys.argv[2], d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=4,
                  seq_len=32, eval_batches=1, sample_bytes=0, steps=2)
try:
    train(cfg, progress=False, say=print)
except DistributedError as e:
    print(f"DistributedError: {e}", flush=True)
    sys.exit(2)
