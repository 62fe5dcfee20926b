"""Gradient averaging over the ranks (PyTorch DDP's design, Horovod's recipe): the parameters' gradients in flat
buckets, each one non-blocking Iallreduce started during the backward as soon as its last gradient is final;
`finish()` waits and writes the means into .grad. See tinygrad_ssm/distributed/__init__.py and docs/distributed.md."""
from __future__ import annotations

import contextlib
import time
import weakref

import numpy as np

from .world import RanksDisagree, World, _named_parameters


class _Bucket:
    """Several parameters' gradients in one flat buffer: [values of each, then one 'has a gradient' flag per
    parameter]. After the allreduce a flag sum of 0 means no rank had a gradient: it stays None (as alone)."""

    def __init__(self, named: list, dtype):
        self.named = named
        self.sizes = [p.size for _, p in named]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        self.n_values = int(self.offsets[-1])
        self.buffer = np.zeros(self.n_values + len(named), dtype=dtype)
        self.pending, self.request = len(named), None

    def put(self, i: int, grad) -> None:
        lo, hi = self.offsets[i], self.offsets[i + 1]
        if grad is None:
            self.buffer[lo:hi] = 0
            self.buffer[self.n_values + i] = 0
        else:
            self.buffer[lo:hi] = grad.data.reshape(-1)
            self.buffer[self.n_values + i] = 1


class GradientAllreducer:
    """Average the gradients of `params` (a VarMap or (name, tensor) pairs) over the ranks of `world`.

    With overlap, hooks on the parameters copy each final gradient into its bucket during backward and
    start the bucket's Iallreduce when it is full; `finish()` then sends what is left, waits, and writes the
    means back into .grad. Without overlap everything happens in `finish()`. One backward per step with
    overlap (a second backward before `finish()` raises): to accumulate gradients over several backwards, run all
    but the last inside `no_sync()` (as torch's DistributedDataParallel.no_sync), or use overlap=False. With overlap a
    gradient is sent when backward() makes it final: the averaged gradients are in .grad only after `finish()`,
    so change them after it (as after Horovod's synchronize()); a .grad replaced (or changed by a tensor op) between
    backward() and finish() makes finish() raise instead of dropping the change. Without overlap, what .grad holds
    when finish() is called is what is averaged.
    `last_finish_s`: seconds `finish()` took, i.e. the communication the backward did not hide;
    `last_launched_early`: how many of the buckets the backward had already sent when `finish()` began."""

    def __init__(self, params, world: World, bucket_bytes: int = 1 << 20, overlap: bool = True):

        named = _named_parameters(params, "GradientAllreducer")
        if not named:
            raise ValueError("GradientAllreducer: no parameters to average (an empty VarMap or list); pass the model's "
                             "VarMap, e.g. GradientAllreducer(model.varmap, world), once its layers are built")
        # frozen parameters are left out, as torch's DDP leaves them: no hook goes on them and no zeros are sent for
        # them each step; finish() refuses one unfrozen since, whose gradient would not be averaged
        self._frozen = [(name, p) for name, p in named if not p.requires_grad]
        named = [(name, p) for name, p in named if p.requires_grad]
        if not named:
            raise ValueError("GradientAllreducer: every parameter is frozen (requires_grad False): nothing to average")
        self.world, self.overlap, self.buckets, self._where = world, overlap, [], {}
        current = []
        for name, p in reversed(named):  # the last layers' gradients are final first in the backward walk
            if current and (p.dtype != current[0][1].dtype or
                            sum(q.data.nbytes for _, q in current) + p.data.nbytes > bucket_bytes):
                self.buckets.append(_Bucket(current, current[0][1].dtype))
                current = []
            current.append((name, p))
        self.buckets.append(_Bucket(current, current[0][1].dtype))
        for b, bucket in enumerate(self.buckets):
            for i, (_, p) in enumerate(bucket.named):
                self._where[id(p)] = (b, i)
        self._check_same_buckets()
        # the hooks hold the reducer weakly: one dropped without close() (a new one built per epoch) was kept alive by
        # them, its hooks still sending every backward's gradients (Iallreduces no one waited for) and raising
        ready = weakref.WeakMethod(self._grad_ready)
        handles = [p.register_post_accumulate_grad_hook(lambda leaf: ready()(leaf))
                   for _, p in named] if overlap and world.size > 1 else []
        self._remove_hooks = weakref.finalize(self, _remove_all, handles)   # on close(), or when it is dropped
        self._next, self._seen, self.last_finish_s, self.last_launched_early = 0, {}, 0.0, 0
        self._held = False  # inside no_sync(): a backward's gradients stay in .grad, unsent

    def _check_same_buckets(self):
        """Every rank cut the same buckets (names, shapes, dtypes, in order): each bucket is one Iallreduce, matched
        with the other ranks' by its place, so a rank with another package version (another bucket size) or model
        summed unrelated numbers, "diverged" with a false diagnosis and then hung (found by an audit). Raised on
        every rank alike (no rank is left waiting)."""
        if self.world.size == 1:
            return
        layout = [[(name, list(p.shape), str(p.dtype)) for name, p in bucket.named] for bucket in self.buckets]
        layouts = self.world.comm.allgather(layout)
        differ = [r for r, other in enumerate(layouts) if other != layouts[0]]
        if differ:
            error = RanksDisagree(
                f"GradientAllreducer: the gradient buckets of rank(s) {differ} differ from rank 0's ({len(layouts[0])} "
                f"buckets on rank 0, {[len(layouts[r]) for r in differ]} there): every rank must run the same package "
                f"version and model (the same parameters, shapes, dtypes and bucket_bytes)")
            error.raised_on_every_rank = True
            raise error

    @contextlib.contextmanager
    def no_sync(self):
        """The backwards inside leave their gradients in .grad, summed there, and send nothing; the next backward
        outside sends the sums (each gradient once it is final, as always). Gradient accumulation over
        micro-batches: every micro-batch's backward but the last inside it, then the last one, then finish()."""
        if self._seen:
            raise RuntimeError("GradientAllreducer.no_sync(): a backward since the last finish() has already sent "
                               "gradients; hold back the backwards before the last one, not after it")
        self._held = True
        try:
            yield
        finally:
            self._held = False

    def _grad_ready(self, leaf) -> None:
        if self._held:
            return
        if id(leaf) in self._seen:
            raise RuntimeError("GradientAllreducer(overlap=True): a second backward before finish(); to accumulate "
                               "gradients over several backwards, run all but the last inside no_sync(), or use "
                               "overlap=False")
        self._seen[id(leaf)] = (leaf.grad, None if leaf.grad is None else leaf.grad._version[0])  # as sent
        b, i = self._where[id(leaf)]
        bucket = self.buckets[b]
        bucket.put(i, leaf.grad)
        bucket.pending -= 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        from mpi4py import MPI

        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            bucket = self.buckets[self._next]
            bucket.request = self.world.comm.Iallreduce(MPI.IN_PLACE, bucket.buffer, op=MPI.SUM)
            self._next += 1
        if self._next:  # MPICH progresses non-blocking collectives inside MPI calls: give it one
            MPI.Request.Testall([b.request for b in self.buckets[:self._next]])

    def finish(self) -> None:
        """Send the buckets not sent yet, wait for all, and set every .grad to the mean over the ranks."""
        if self.world.size == 1:
            return
        from mpi4py import MPI

        t0 = time.perf_counter()
        unfrozen = [name for name, p in self._frozen if p.grad is not None]
        if unfrozen:   # the ranks froze the same parameters (_check_same_buckets): all of them raise here
            raise RuntimeError(f"GradientAllreducer: {', '.join(unfrozen[:3])} had requires_grad False when the "
                               f"reducer was built, so it does not average their gradients; build a new one "
                               f"after unfreezing (or set their .grad to None)")
        self.last_launched_early = self._next  # buckets whose allreduce the backward already started
        for bucket in self.buckets:
            for i, (_, p) in enumerate(bucket.named):
                if id(p) not in self._seen:  # no hook fired (overlap off, or no gradient this step)
                    bucket.put(i, p.grad)
                    bucket.pending -= 1
        self._launch_ready()
        MPI.Request.Waitall([b.request for b in self.buckets])
        changed = self._changed_since_sent()
        if self.overlap:   # each rank's count: the error is raised on every rank, none goes on alone and waits
            counts = self.world.sum(np.eye(self.world.size)[self.world.rank] * len(changed))
        for bucket in self.buckets:
            values = bucket.buffer[:bucket.n_values] / self.world.size  # the mean over ranks, a fresh array
            for i, (_, p) in enumerate(bucket.named):
                has_grad = bucket.buffer[bucket.n_values + i] > 0
                p.grad = values[bucket.offsets[i]:bucket.offsets[i + 1]].reshape(p.shape) if has_grad else None
            bucket.pending, bucket.request = len(bucket.named), None
        self._next, self._seen = 0, {}
        self.last_finish_s = time.perf_counter() - t0
        if self.overlap and counts.any():
            where = (f"{', '.join(changed[:3])}{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}"
                     if changed else f"parameters on rank(s) {np.flatnonzero(counts).tolist()}")
            error = RuntimeError(
                f"GradientAllreducer(overlap=True): the .grad of {where} was replaced or changed after "
                f"backward() had sent it to the other ranks, before finish(): with overlap each gradient is sent "
                f"during backward(), so that change was not averaged (every .grad now holds the mean of the "
                f"gradients as backward() left them). Change the averaged gradients after finish() (as after "
                f"Horovod's synchronize()), or use overlap=False to change the local ones before they are averaged")
            error.raised_on_every_rank = True
            raise error

    def _changed_since_sent(self) -> list[str]:
        """The parameters whose .grad is another tensor, or a tensor changed in place by a tensor op, than the one
        their hook sent (free: identity and version counter; a write into .grad.data itself is not seen)."""
        out = []
        for bucket in self.buckets:
            for name, p in bucket.named:
                if id(p) in self._seen:
                    sent, version = self._seen[id(p)]
                    if p.grad is not sent or (sent is not None and sent._version[0] != version):
                        out.append(name)
        return out

    def close(self) -> None:
        """Remove the hooks (done too when the reducer is dropped)."""
        self._remove_hooks()


def _remove_all(handles: list) -> None:
    for handle in handles:
        handle.remove()
