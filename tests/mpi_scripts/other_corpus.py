"""`mpiexec -n 2 python other_corpus.py train ...`: the CLI, with rank 1 reading other bytes than rank 0 (as another
machine's file at the same path would be: its corpus fingerprint differs)."""
import sys

from tinygrad_ssm import distributed as dist
from tinygrad_ssm.train import cli, loop

if dist.init().rank == 1:
    real = loop._fingerprint
    loop._fingerprint = lambda corpus, tokenizer: {**real(corpus, tokenizer), "train_crc32": 12345}
sys.exit(cli.main(sys.argv[1:]))
