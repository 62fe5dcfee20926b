"""Run under `mpiexec -n 2`: the Python API (init, GradientAllreducer, allreduce_gradients) in one's own loop.

Each rank takes its half of a fixed float64 batch; after the allreduce every gradient must equal the
full-batch gradient that one process computes (to 1e-12 relative), with several buckets (bucket_bytes tiny),
with and without overlap, and a parameter that got no gradient on any rank must stay None; what a bucket held when
its allreduce started is what is averaged (a bucket sent before its last gradient is in it shows only there: MPICH
reads the buffer late); a parameter that one rank has no gradient for averages that rank's as 0 (not its stale
last one); float32 and float64 parameters keep their dtypes; a .grad changed by a tensor op after backward() is
refused as a replaced one is. Exits non-zero (through MPI_Abort, so no rank waits) on any failure; rank 0 prints
"api ok".
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


class Recorder:
    """COMM_WORLD, with a copy of each buffer an Iallreduce was started on, taken when it was started."""

    def __init__(self, comm):
        self.comm, self.sent = comm, []

    def Iallreduce(self, send, buffer, op):  # noqa: N802 - mpi4py's name
        self.sent.append((buffer, buffer.copy()))
        return self.comm.Iallreduce(send, buffer, op=op)

    def __getattr__(self, name):
        return getattr(self.comm, name)


rng = np.random.default_rng(0)
x_all = rng.standard_normal((6, 8))  # the global batch: 3 rows per rank
try:
    for overlap in (True, False):
        vm, layers, unused = build()
        loss_of(layers, Tensor(x_all)).backward()  # one process, whole batch
        reference = {n: p.grad.data.copy() for n, p in vm.named_vars() if p.grad is not None}
        for _, p in vm.named_vars():
            p.grad = None
        recorder = Recorder(world.comm)
        reducer = dist.GradientAllreducer(vm, dist.World(world.rank, world.size, recorder), bucket_bytes=600,
                                          overlap=overlap)
        assert len(reducer.buckets) >= 3, len(reducer.buckets)
        for step in range(2):  # twice: the buckets are reset for the next step
            rows = x_all[3 * world.rank:3 * world.rank + 3]
            loss_of(layers, Tensor(rows)).backward()
            recorder.sent.clear()
            reducer.finish()
            assert len(recorder.sent) == len(reducer.buckets), (overlap, len(recorder.sent))
            for buffer, at_start in recorder.sent:  # the sum of what the ranks sent is what came back
                total = np.empty_like(at_start)
                world.comm.Allreduce(at_start, total)
                assert np.array_equal(total, buffer), (overlap, step, "a bucket was sent before it was complete")
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
    # a parameter used by rank 0 alone in the second step: rank 1's share is 0, not its gradient of the first step
    for overlap in (True, False):
        vm, layers, unused = build()
        reducer = dist.GradientAllreducer(vm, world, bucket_bytes=600, overlap=overlap)
        rows = Tensor(x_all[3 * world.rank:3 * world.rank + 3])
        ((unused(rows) ** 2).mean() + loss_of(layers, rows)).backward()  # both ranks use it in step 1
        reducer.finish()
        for _, p in vm.named_vars():
            p.grad = None
        alone = (unused(rows) ** 2).mean() if world.is_root else None
        (loss_of(layers, rows) + alone if world.is_root else loss_of(layers, rows)).backward()
        mine = unused.weight.grad.data.copy() if world.is_root else np.zeros(unused.weight.shape)
        reducer.finish()
        expected = world.comm.bcast(mine, root=0) / 2
        assert np.abs(unused.weight.grad.data - expected).max() <= 1e-15, (overlap, "a stale gradient was averaged")
        reducer.close()
    # float32 and float64 parameters in one model: each bucket holds one dtype, each .grad keeps its parameter's
    for overlap in (True, False):
        vm = VarMap(seed=4)
        wide = Linear(VarBuilder.from_varmap(vm, dtype=np.float64).pp("wide"), 8, 8)
        narrow = Linear(VarBuilder.from_varmap(vm, dtype=np.float32).pp("narrow"), 8, 8)
        reducer = dist.GradientAllreducer(vm, world, overlap=overlap)
        rows = x_all[3 * world.rank:3 * world.rank + 3]
        ((wide(Tensor(rows)) ** 2).mean() + (narrow(Tensor(rows.astype(np.float32))) ** 2).mean()).backward()
        reducer.finish()
        assert [p.grad.dtype for _, p in vm.named_vars()] == [p.dtype for _, p in vm.named_vars()], overlap
        reducer.close()
    # a .grad changed between backward() and finish(): kept without overlap (it is what is averaged); with overlap
    # it was already sent, so finish() says so instead of dropping it in silence, and the next step works; a
    # replaced .grad and one changed in place by a tensor op alike
    for overlap, change in [(False, "replace"), (True, "replace"), (False, "in place"), (True, "in place")]:
        vm, layers, unused = build()
        reducer = dist.GradientAllreducer(vm, world, bucket_bytes=600, overlap=overlap)
        loss_of(layers, Tensor(x_all[3 * world.rank:3 * world.rank + 3])).backward()
        first = vm.named_vars()[0][1]
        if change == "replace":
            first.grad = first.grad * 0.0
        else:
            first.grad.mul_(0.0)
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
    # every machine once, with its ranks and what its first rank measured (both ranks are on this one)
    import socket
    machines = world.machines(lambda: f"measured by rank {world.rank}")
    assert machines == [(socket.gethostname(), 2, "measured by rank 0")], machines
except BaseException as e:  # noqa: BLE001
    world.abort(e)
if world.is_root:
    print("api ok")
sys.exit(0)
