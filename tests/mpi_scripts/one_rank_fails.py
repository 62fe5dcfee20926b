"""`mpiexec -n N python one_rank_fails.py MODE RANK train ...`: the CLI, with rank RANK failing alone (found by an audit
of MPI failure modes, where each hung the job):
- data: its data check raises before the corpus fingerprints are compared (a machine without the --data file);
  with 4 ranks or more, the rank fed through it in the broadcast waited for ever;
- tqdm: `from tqdm import tqdm` fails at train()'s start (a package missing on one machine), before the code that
  ends the whole job on one rank's error;
- buckets: its gradient buckets are cut at 4 KB, not 1 MB (another package version): the allreduces summed
  unrelated numbers, the run "diverged" with a false diagnosis, then hung."""
import sys

from tinygrad_ssm import distributed as dist
from tinygrad_ssm.train import cli, loop

mode, rank = sys.argv[1], int(sys.argv[2])
if dist.init().rank == rank:
    if mode == "buckets":
        import functools
        loop.GradientAllreducer = functools.partial(dist.GradientAllreducer, bucket_bytes=1 << 12)
    elif mode == "data":
        def no_data(*args, **kwargs):
            raise ValueError("this rank has no data")
        loop.check_length = no_data
    else:
        sys.modules["tqdm"] = None          # import tqdm raises ImportError from here on
sys.exit(cli.main(sys.argv[3:]))
