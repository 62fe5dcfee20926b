"""Data-parallel training over MPI (mpi4py): ranks, gradient averaging in flat buckets, overlap with backward.

Horovod's recipe: every rank holds the whole model and computes the gradient of its own share of the global
batch; the gradients are averaged with MPI Allreduce, and every rank applies the same optimizer step, so the
weights stay identical without ever being sent. PyTorch DDP's refinements, both here:
- buckets: the gradients travel in a few flat buffers of about `bucket_bytes` (one MPI call per bucket, not
  one per parameter), in reverse registration order, roughly the order the backward walk finishes them;
- overlap: a bucket's non-blocking Iallreduce starts as soon as its last gradient is final during the
  backward walk (`Tensor.register_post_accumulate_grad_hook`), so communication runs beside the rest of
  the backward. Buckets are launched strictly in index order, so every rank issues the same collectives
  in the same order (MPI requires it), whatever order its hooks fire in;
- accumulation: several backwards a step (micro-batches), all but the last inside `reducer.no_sync()`, so that
  the sums travel once, during the last backward.

mpi4py is optional (`pip install -e ".[distributed]"` in a checkout, which also brings the mpich wheel and its
`mpiexec`). Nothing imports it unless `init()` is called; `launcher_world_size()` only reads the environment.

    from tinygrad_ssm import distributed as dist
    world = dist.init()                                   # World(rank, size, comm)
    reducer = dist.GradientAllreducer(model.varmap, world)
    for ...:
        opt.zero_grad(); model.loss(x[my_rows], y[my_rows]).backward()
        reducer.finish()                                  # every .grad is now the mean over ranks
        opt.step()
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
import weakref
import zlib
from dataclasses import dataclass

import numpy as np

# environment variables that MPI launchers set in every process they start: MPICH/Intel MPI (hydra), Open MPI
_WORLD_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
INSTALL_HINT = ('pip install -e ".[distributed]" in the package\'s checkout (mpi4py and the mpich wheel, which '
                'brings mpiexec)')


def _named_parameters(params, who: str):
    """optim's named_parameters, imported when first needed: this module loads without numba (the optimizers' kernels),
    so that `python -m tinygrad_ssm` under mpiexec starts MPI before the second or more the rest takes (__main__.py)."""
    from .optim.optimizer import named_parameters
    return named_parameters(params, who)


class DistributedError(RuntimeError):
    """MPI is needed but missing, or the ranks disagree (about the setup, or their weights)."""


class SetupFailedOnAnotherRank(ValueError):
    """Raised on the ranks whose setup succeeded when another rank's failed: every rank stops together."""


class RanksDisagree(ValueError):
    """The ranks built different things (another package version or model on one): refused on every rank before
    the first step, as a flag that differs between ranks is."""


class RanksDiverged(DistributedError):
    """The weights differ between ranks: data-parallel training would silently train several models."""


def launcher_world_size() -> int:
    """The number of processes an MPI launcher (mpiexec, mpirun) started, from its environment; 1 otherwise."""
    for var in _WORLD_SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def launcher_rank() -> int:
    """This process's rank as the MPI launcher's environment states it (before or without MPI); 0 otherwise."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


@dataclass(frozen=True)
class World:
    """This process's place in the job: `rank` in 0..size-1; `comm` is mpi4py's COMM_WORLD (None alone)."""

    rank: int = 0
    size: int = 1
    comm: object = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def sum(self, values) -> np.ndarray:
        """Blocking Allreduce (sum) of a small float64 vector, e.g. [loss, stop requested]."""
        values = np.ascontiguousarray(values, dtype=np.float64)
        if self.size == 1:
            return values
        from mpi4py import MPI

        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op=MPI.SUM)
        return out

    def machines(self, measure) -> list[tuple[str, int, object]]:
        """(host name, ranks on it, `measure()` as its first rank found it) for every machine of the job (MPI's
        shared-memory split): e.g. each machine's memory, which its ranks share. A collective, every rank calls it."""
        import socket
        if self.size == 1:
            return [(socket.gethostname(), 1, measure())]
        from mpi4py import MPI

        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            mine = (socket.gethostname(), local.Get_size(), measure()) if local.Get_rank() == 0 else None
            return [machine for machine in self.comm.allgather(mine) if machine is not None]
        finally:
            local.Free()

    def agree(self, fn, *args, **kwargs):
        """Run fn on every rank; if it raised on any rank, raise on every rank (this rank's own exception, or
        SetupFailedOnAnotherRank naming the rank and its message), so no rank goes on alone and waits."""
        try:
            result, error = fn(*args, **kwargs), None
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            result, error = None, e
        if self.size > 1:
            failures = self.comm.allgather(None if error is None else f"{type(error).__name__}: {error}")
            if error is None and any(failures):
                error = SetupFailedOnAnotherRank("; ".join(f"rank {r} of {self.size} failed: {m}"
                                                           for r, m in enumerate(failures) if m))
        if error is not None:
            error.raised_on_every_rank = True  # train() lets it end this rank normally: no rank is waiting
            raise error
        return result

    def on_root(self, fn, *args, **kwargs):
        """fn on rank 0 alone (e.g. writing a file), its JSON-serialisable result sent to every rank. If it raised an
        OSError or a ValueError, every other rank raises one alike (FileExistsError, OSError with the errno and
        file name, or ValueError, with rank 0's message), so all ranks stop together and the job ends as one
        process would; rank 0 re-raises its own. Anything else propagates on rank 0 alone (train() aborts the job)."""
        result, error = None, None
        if self.is_root:
            try:
                result = fn(*args, **kwargs)
            except (OSError, ValueError) as e:
                error = e
        if self.size > 1:
            about = None if error is None else [isinstance(error, FileExistsError), isinstance(error, OSError),
                                                error.errno if isinstance(error, OSError) else None,
                                                getattr(error, "strerror", None), getattr(error, "filename", None),
                                                str(error)]
            result, about = self.broadcast_json([result, about] if self.is_root else None)
            if about is not None and not self.is_root:
                exists, is_os, number, text, filename, message = about
                error = (FileExistsError(message) if exists else OSError(number, text, filename) if number is not None
                         else OSError(message) if is_os else ValueError(message))
        if error is not None:
            error.raised_on_every_rank = True  # train() lets it end this rank normally: no rank is waiting
            raise error
        return result

    def abort(self, error: BaseException, code: int = 1, message: str | None = None) -> None:
        """Print this rank's error and end the whole job (MPI_Abort): no rank is left waiting in a collective.
        `message`: the error in the caller's words, one line without a traceback (a file that cannot be written)."""
        who = f"[rank {self.rank} of {self.size}]"
        if threading.current_thread() is threading.main_thread():  # the job is ending: a Ctrl-C (the launcher
            signal.signal(signal.SIGINT, signal.SIG_IGN)            # passes one on) must not cut this short
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        parts = (f"{who} error: {type(error).__name__}: {error}\n", f"{who} aborting the whole MPI job\n",
                 f"{who} {text}")
        if message is not None:
            parts = (f"{who} error: {message}\n", f"{who} aborting the whole MPI job\n")
        elif isinstance(error, KeyboardInterrupt):  # the user's own stop: no traceback
            parts = (f"{who} stopped by Ctrl-C: aborting the whole MPI job now (checkpoints are written atomically: "
                     f"the last one is intact)\n",)
        for part in parts:  # the message first: a launcher may drop the tail when the job ends
            sys.stderr.write(part)
            sys.stderr.flush()
        time.sleep(1.0)  # let the launcher forward this text first: MPI_Abort tears the job down at once
        self.comm.Abort(code)
        os._exit(code)   # MPICH's Abort may return before the launcher's teardown reaches this process: never go on

    def broadcast_arrays(self, arrays: dict | None, root: int = 0) -> dict:
        """{name: array} on `root` -> the same dict on every rank (a JSON header, then one Bcast per array)."""
        if self.size == 1:
            return arrays
        header = None
        if self.rank == root:
            arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # 0-d stays 0-d
            header = json.dumps([[k, v.dtype.str, list(v.shape)] for k, v in arrays.items()])
        header = json.loads(self.comm.bcast(header, root=root))
        out = {}
        for name, dtype, shape in header:
            buf = arrays[name] if self.rank == root else np.empty(tuple(shape), dtype=np.dtype(dtype))
            self.comm.Bcast(buf, root=root)
            out[name] = buf
        return out

    def broadcast_json(self, value, root: int = 0):
        """A JSON-serialisable value from `root` to every rank (sent as JSON text: nothing is pickled but a str)."""
        if self.size == 1:
            return value
        return json.loads(self.comm.bcast(json.dumps(value) if self.rank == root else None, root=root))


SINGLE = World()
_world: World | None = None


def init(required: bool = True) -> World:
    """Import mpi4py (initialising MPI) and return this process's World. Without mpi4py: a DistributedError
    saying how to install it when `required`, else the single-process World."""
    global _world
    if _world is not None:
        return _world
    try:
        from mpi4py import MPI
    except ImportError as e:
        if required:
            raise DistributedError(f"distributed training needs mpi4py, which cannot be imported ({e}); "
                                   f"install it with: {INSTALL_HINT}") from e
        return SINGLE
    comm = MPI.COMM_WORLD
    launched = launcher_world_size()
    if launched > 1 and comm.Get_size() == 1:                           # N lone copies would clash in one folder
        var = next(v for v in _WORLD_SIZE_VARS if os.environ.get(v, "").isdigit())
        raise DistributedError(f"{var}={os.environ[var]} says a launcher started {launched} processes, but MPI "
                               f"sees this one alone: started by another MPI's mpiexec than mpi4py's, or {var} is "
                               f"left over in the environment; use the mpiexec of mpi4py's MPI (the mpich wheel's, "
                               f"beside this Python) or unset {var}")
    _world = World(comm.Get_rank(), comm.Get_size(), comm)
    return _world


def _current() -> World:
    """The World of init(); alone (no launcher, or a launcher of 1) the single-process World. Under a launcher of
    N > 1 before init() a DistributedError (as Horovod's "has not been initialized"): 0 / 1 would be wrong there."""
    if _world is not None:
        return _world
    launched = launcher_world_size()
    if launched > 1:
        raise DistributedError(f"tinygrad_ssm.distributed has not been initialized, but a launcher started {launched} "
                               f"processes: call world = tinygrad_ssm.distributed.init() first (then rank() and "
                               f"world_size() are this process's), or pass world.rank / world.size on")
    return SINGLE


def rank() -> int:
    """This process's rank (0 alone); under mpiexec -n N (N > 1) only after init()."""
    return _current().rank


def world_size() -> int:
    """The number of ranks (1 alone); under mpiexec -n N (N > 1) only after init()."""
    return _current().size


# ----------------------------------------------------------------------------------------------------------
# gradient averaging

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


def allreduce_gradients(params, world: World | None = None, bucket_bytes: int = 1 << 20) -> None:
    """Blocking: set every .grad of `params` (a VarMap or (name, tensor) pairs) to its mean over the ranks."""
    reducer = GradientAllreducer(params, world or init(), bucket_bytes, overlap=False)
    reducer.finish()


# ----------------------------------------------------------------------------------------------------------
# ranks stay identical

def _same_layout(world: World, who: str, named, optimizers: dict | None = None) -> None:
    """Every rank holds the parameters of rank 0 (names, shapes, dtypes, in order) and the same optimizers over
    them; else RanksDisagree on every rank, naming the first difference. Checked before the collectives that read
    them: a rank with a parameter more failed alone (the others hung), another shape or dtype was broadcast into
    silently, another count made MPI abort the job."""
    if world.size == 1:
        return
    mine = [[name, list(p.shape), str(p.dtype)] for name, p in named]
    kinds = {g: [type(o).__name__, [n for n, _ in o.params]] for g, o in (optimizers or {}).items()}
    layouts = world.comm.allgather([mine, kinds])
    differ = [r for r, layout in enumerate(layouts) if layout != layouts[0]]
    if differ:
        (root, root_kinds), (other, other_kinds) = layouts[0], layouts[differ[0]]
        if other != root:
            first = next((f"parameter {_spec(*a)} there, {_spec(*b)} on rank 0" for a, b in zip(other, root) if a != b),
                         f"{len(other)} parameters there, {len(root)} on rank 0")
        else:
            first = _first_optimizer_difference(other_kinds, root_kinds)
        error = RanksDisagree(f"{who}: rank(s) {differ} hold other parameters or optimizers than rank 0 ({first}): "
                              f"every rank must build the same model and optimizers")
        error.raised_on_every_rank = True
        raise error


def _spec(name: str, shape: list, dtype: str) -> str:
    return f"{name!r} {tuple(shape)} {dtype}"


def _first_optimizer_difference(other: dict, root: dict) -> str:
    """The first optimizer ({group: [class, parameter names]}) of another rank that is not rank 0's, in words."""
    group = next(g for g in sorted({*other, *root}) if other.get(g) != root.get(g))
    if group not in other or group not in root:
        return f"optimizer {group!r} {'missing there' if group in root else 'there, not on rank 0'}"
    (kind, names), (root_kind, root_names) = other[group], root[group]
    if kind != root_kind or len(names) != len(root_names):
        return (f"optimizer {group!r}: {kind} of {len(names)} parameters there, {root_kind} of {len(root_names)} on "
                f"rank 0")
    name, root_name = next((a, b) for a, b in zip(names, root_names) if a != b)
    return f"optimizer {group!r}: parameter {name!r} there, {root_name!r} on rank 0"


def broadcast_weights_and_optimizers(varmap, optimizers: dict, world: World) -> None:
    """Rank 0's weights and optimizer states (e.g. just loaded from a checkpoint) to every other rank, once every
    rank is found to hold the same parameters and optimizers; a state one rank refuses is raised on every rank."""
    named = varmap.named_vars()
    _same_layout(world, "broadcast_weights_and_optimizers", named, optimizers)
    weights = world.broadcast_arrays({n: p.data for n, p in named} if world.is_root else None)
    if not world.is_root:
        for name, p in named:
            p.data[...] = weights[name]
            p._bump()  # written in place: a graph that saved the old value must not backward
    for group in sorted(optimizers):
        state = world.broadcast_arrays(optimizers[group].state_dict() if world.is_root else None)
        world.agree(lambda: None if world.is_root else optimizers[group].load_state_dict(state))  # noqa: B023


def weight_checksums(params) -> np.ndarray:
    """CRC-32 of each parameter's bytes, in registration order (int64): cheap, and any bit flip shows."""

    return np.array([zlib.crc32(np.ascontiguousarray(p.data).tobytes())
                     for _, p in _named_parameters(params, "weight_checksums")], dtype=np.int64)


def check_same_weights(params, world: World, step: int) -> None:
    """Compare every rank's weights (checksums) with rank 0's; raise RanksDiverged on every rank if any differ.
    (Whether a checkpoint is left to resume from is the caller's to say: train() adds it to the message.)"""
    if world.size == 1:
        return
    _same_layout(world, "check_same_weights", _named_parameters(params, "check_same_weights"))
    mine = weight_checksums(params)
    every = np.empty((world.size, mine.size), dtype=np.int64)
    world.comm.Allgather(mine, every)
    differ = every != every[0]
    if differ.any():
        names = [n for n, _ in _named_parameters(params, "check_same_weights")]
        bad = sorted({names[j] for j in np.nonzero(differ.any(axis=0))[0]})
        ranks = [r for r in range(world.size) if differ[r].any()]
        raise RanksDiverged(f"after step {step} the weights of rank(s) {ranks} differ from rank 0's in "
                            f"{len(bad)} parameters ({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); "
                            f"data-parallel ranks must stay identical, so the run stops here")
