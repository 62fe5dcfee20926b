"""Run under `mpiexec -n 2`: the Python API (init, GradientAllreducer, allreduce_gradients) in one's own loop.

Each rank takes its half of a fixed float64 batch; after the allreduce every gradient must equal the
full-batch gradient that one process computes (to 1e-12 relative), with several buckets (bucket_bytes tiny),
with and without overlap, and a parameter that got no gradient on any rank must stay None. Exits non-zero
(through MPI_Abort, so no rank waits) on any failure; rank 0 prints "api ok".
"""
import sys

import numpy as np

from tinygrad_ssm import Tensor
from tinygrad_ssm import distributed as dist
from tinygrad_ssm.nn import Linear
from tinygrad_ssm.registry import VarBuilder, VarMap

world = dist.init()
assert dist.rank() == world.rank and dist.world_size() == world.size == 2, (dist.rank(), dist.world_size())


def build():
    vm = VarMap(seed=3)
    vb = VarBuilder.from_varmap(vm, dtype=np.float64)
    layers = [Linear(vb.pp(f"l{i}"), 8, 8) for i in range(3)]
    unused = Linear(vb.pp("unused"), 8, 2)  # never called: no gradient anywhere
    return vm, layers, unused


def loss_of(layers, x):
    h = x
    for layer in layers:
        h = layer(h).tanh()
    return (h * h).mean()


rng = np.random.default_rng(0)
x_all = rng.standard_normal((6, 8))  # the global batch: 3 rows per rank
try:
    for overlap in (True, False):
        vm, layers, unused = build()
        loss_of(layers, Tensor(x_all)).backward()  # one process, whole batch
        reference = {n: p.grad.data.copy() for n, p in vm.named_vars() if p.grad is not None}
        for _, p in vm.named_vars():
            p.grad = None
        reducer = dist.GradientAllreducer(vm, world, bucket_bytes=600, overlap=overlap)
        assert len(reducer.buckets) >= 3, len(reducer.buckets)
        for step in range(2):  # twice: the buckets are reset for the next step
            rows = x_all[3 * world.rank:3 * world.rank + 3]
            loss_of(layers, Tensor(rows)).backward()
            reducer.finish()
            for name, p in vm.named_vars():
                if name.startswith("unused"):
                    assert p.grad is None, name
                    continue
                scale = np.abs(reference[name]).max()
                err = np.abs(p.grad.data - reference[name]).max() / scale
                assert err <= 1e-12, (overlap, step, name, err)
                p.grad = None
        reducer.close()
    # the blocking one-call form
    vm, layers, unused = build()
    loss_of(layers, Tensor(x_all[3 * world.rank:3 * world.rank + 3])).backward()
    dist.allreduce_gradients(vm, world)
    for name, p in vm.named_vars():
        if not name.startswith("unused"):
            assert np.abs(p.grad.data - reference[name]).max() <= 1e-12 * np.abs(reference[name]).max(), name
    # a .grad changed between backward() and finish(): kept without overlap (it is what is averaged); with overlap
    # it was already sent, so finish() says so instead of dropping it in silence, and the next step works
    for overlap in (False, True):
        vm, layers, unused = build()
        reducer = dist.GradientAllreducer(vm, world, bucket_bytes=600, overlap=overlap)
        loss_of(layers, Tensor(x_all[3 * world.rank:3 * world.rank + 3])).backward()
        first = vm.named_vars()[0][1]
        first.grad = first.grad * 0.0
        try:
            reducer.finish()
            assert not overlap, "overlap=True: a .grad replaced before finish() was dropped in silence"
            assert not first.grad.data.any(), "overlap=False: the changed .grad was not the one averaged"
        except RuntimeError as e:
            assert overlap and "was replaced or changed after backward() had sent it" in str(e), e
            assert vm.named_vars()[0][0] in str(e) and "after finish()" in str(e), e
        for _, p in vm.named_vars():
            p.grad = None
        loss_of(layers, Tensor(x_all[3 * world.rank:3 * world.rank + 3])).backward()
        reducer.finish()  # the state was reset: the next step is a normal one
        reducer.close()
    try:
        dist.GradientAllreducer([], world)
        raise AssertionError("GradientAllreducer([]) did not raise")
    except ValueError as e:
        assert "no parameters" in str(e), e
except BaseException as e:  # noqa: BLE001
    world.abort(e)
if world.is_root:
    print("api ok")
sys.exit(0)
