"""Run under `mpiexec -n 2`: rank() / world_size() before init() raise (they returned 0 / 1 on every rank, as if
alone); after init() they are the rank's. Rank 0 prints "before init ok"."""
import sys

from tinygrad_ssm import distributed as dist

for ask in (dist.rank, dist.world_size):
    try:
        ask()
        sys.exit(f"{ask.__name__}() before init() under mpiexec -n 2 did not raise")
    except dist.DistributedError as e:
        assert "has not been initialized" in str(e) and "init()" in str(e), e
world = dist.init()
assert (dist.rank(), dist.world_size()) == (world.rank, 2), (dist.rank(), dist.world_size())
if world.is_root:
    print("before init ok")
