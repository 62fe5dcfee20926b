"""Run under `mpiexec -n 2 python api_edges.py CASE...`: the Python API's edges an audit found, each case in turn
(each prints "rank R: CASE: ..." on every rank, so the test sees that no rank was left waiting; a hang is the
test's timeout).

frozen     a frozen parameter (requires_grad False) is left out of the averaging (its hook failed at construction)
dropped    a reducer dropped without close() takes its hooks with it (they kept it alive and sending)
changed    a .grad replaced after backward on rank 0 alone is raised on both ranks (rank 1 went on and hung)
extra      broadcast_weights_and_optimizers with a parameter more on rank 1 (rank 1 failed alone, rank 0 hung)
shape      broadcast_weights_and_optimizers with another shape on rank 1 (broadcast into it silently)
optimizer  broadcast_weights_and_optimizers with another optimizer on rank 1
count      check_same_weights with a parameter more on rank 1 (MPICH aborted the job: message truncated)
transposed check_same_weights with (2, 3) against (3, 2) of equal bytes (passed)
"""
import sys

import numpy as np

from tinygrad_ssm import distributed as dist
from tinygrad_ssm.nn.init import Const
from tinygrad_ssm.optim import SGD, AdamW
from tinygrad_ssm.registry import VarMap

world = dist.init()
r = world.rank


def params(*shapes):
    vm = VarMap(seed=0)
    return vm, [vm.get(shape, f"p{i}", init=Const(1.0)) for i, shape in enumerate(shapes)]


def run(case):
    def say(text):
        print(f"rank {r}: {case}: {text}", flush=True)

    try:
        if case == "frozen":
            vm, (frozen, w) = params((4,), (4,))
            frozen.requires_grad_(False)
            reducer = dist.GradientAllreducer(vm, world)
            (frozen * w * (r + 1.0)).sum().backward()
            reducer.finish()
            say(f"frozen ok {w.grad.data.tolist()} {frozen.grad}")
            frozen.requires_grad_(True)
            frozen.grad = np.ones(4, np.float32)
            reducer.finish()
        elif case == "dropped":
            vm, (a,) = params((3,))
            for epoch in range(3):
                reducer = dist.GradientAllreducer(vm, world)    # the last one dropped, not closed
                a.grad = None
                (a * (r + 1.0)).sum().backward()
                reducer.finish()
            say(f"dropped ok {a.grad.data.tolist()}")
        elif case == "changed":
            vm, (a,) = params((3,))
            reducer = dist.GradientAllreducer(vm, world)
            (a * 2.0).sum().backward()
            if r == 0:
                a.grad = np.zeros(3, np.float32)
            reducer.finish()
        elif case in ("extra", "shape", "optimizer"):
            shapes = {"extra": [(2,), (2,)] if r else [(2,)], "shape": [(3,) if r else (1,)]}.get(case, [(2,)])
            vm, _ = params(*shapes)
            kind = SGD if case == "optimizer" and r else AdamW
            dist.broadcast_weights_and_optimizers(vm, {"all": kind(vm.named_vars(), lr=0.1)}, world)
        elif case in ("count", "transposed"):
            vm, _ = params(*({"count": [(2,), (2,)] if r else [(2,)]}.get(case) or [(3, 2) if r else (2, 3)]))
            dist.check_same_weights(vm, world, 1)
        say("no error")
    except Exception as e:  # noqa: BLE001 - what each rank was told is the test's
        say(f"{type(e).__name__}: {e}")


for case in sys.argv[1:]:
    run(case)
