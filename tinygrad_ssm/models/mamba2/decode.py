"""Decoding without the engine: one numba call advances every layer of a Mamba-2 model by one token, in place on
the cache, and gives the logits; generation (decode_sampled, greedy or sampled) stays inside numba for many
tokens, and a short prompt (decode_prompt) is one step whose rows are its tokens. The engine's `step`
(model.py, fused=False) is the reference it is tested against (tests/models/test_decode.py,
test_decode_kernels.py: logits and states to 1e-10 in float64). The per-layer arrays travel in numba typed
Lists, so the compiled functions' types hold no model size: one compilation (cached on disk) per dtype.

Per layer and sequence (the equations of Mamba2Mixer.step, written out):
    u = rmsnorm(x) * norm.weight                                           (d_model,)
    z | xBC | dt = in_proj(u)                                              (d_inner,), (conv_dim,), (h,)
    conv state <- [conv state[:, 1:], xBC];  xBC = silu(sum_j conv state[:, j] w[:, j] + conv bias)
    x | B | C = xBC;  dt = clip(softplus(dt + dt_bias), dt_limit);  A = -exp(A_log)
    S <- exp(dt A) S + dt x B^T  (head i reads group i // (h / g));  y = S C + D x
    y = rmsnorm_per_group(y * silu(z)) * norm.weight;  x <- x + out_proj(y)
No BLAS: the math is numba loops (fast/decode_kernels.py). A step runs in phases (pre-norm, in_proj with the conv
and dt, the heads, the group norm, out_proj; then the LM head), each cut into chunks that the caller's thread
and one helper thread claim from atomic counters (fast/claims.py): decode_step.py. This module is the Python
side: the weights prepared once per model, a session (work rows, counters) per cache, and the helper thread,
which serves the session whose steps come and moves to the next session that steps.
"""
from __future__ import annotations

import _thread
import math
import operator
import os
import threading
import warnings
import weakref

import numba
import numpy as np

from ...autograd.tensor import Tensor
from ...fast.claims import sync_array
from ...fast.typed_lists import array_list as _array_list
from .decodable import check_decodable
from .decode_step import PROFILE_PHASES, _helper, _lead, _sampled
from .quantize import QuantizedWeight

_EMPTY_CACHE_HINT = "allocate it with model.allocate_cache(batch) or fill it with a prefill forward"


PROFILE = None  # an int64 array (len(PROFILE_PHASES),): sessions made while it is set add their cycles to it


# --- the helper thread: one session's steps, then the next session's (see _Session._start_helper) ------------

_SENT_HOME = 2          # control[1]: 0 run, 1 closed (the session is gone), 2 sent home for another session's step
_helpers = threading.Lock()   # held while a helper moves between sessions or a session looks for one
_last_stepped = None    # a weak reference to the session whose step came last
_helped = weakref.WeakSet()   # the _HelperWork of each session with control[2] = 1 (a helper on its way or at work)
_fork_hook = False


def _set_running(work: "_HelperWork", running: bool):
    """control[2], the helper-running flag, with _helped beside it (under _helpers)."""
    work.control[2] = running
    if running:
        _helped.add(work)
    else:
        _helped.discard(work)


def _after_fork_in_child():
    """A forked child has none of its parent's helper threads: none is running there, and the lock is free (a fork
    while a helper held it would have left the child's copy held for ever)."""
    global _helpers, _last_stepped
    _helpers, _last_stepped = threading.Lock(), None
    for work in list(_helped):
        _set_running(work, False)


class _HelperWork:
    """What a helper thread needs of a session (not the session itself: a cache dropped while its helper spins is
    freed, its session closed): the counters, the step's arguments, the compiled helper loop, and the session the
    helper goes to next when this one sends it home."""

    def __init__(self, control, args):
        self.control, self.args = control, args   # control: steps published, stop (0 / 1 / _SENT_HOME), helper
        self.entry, self.handed_to = None, None    # running (counted from its start to its thread's last look)


def _call_back(work: _HelperWork):
    """work's session steps again before its helper left: the helper stays. The sessions it was handed on to
    have none coming then (each was sent home before it arrived, and handed it on in turn): their next steps
    start their own."""
    promised, work.handed_to = work.handed_to, None
    while promised is not None:
        _set_running(promised, False)
        promised.handed_to, promised = None, promised.handed_to


def _helper_thread(work: _HelperWork):
    """A helper thread's life: join work's steps (decode_step._helper) until idle, closed or sent home; sent home
    for a session that had no helper, go on with that one's."""
    while True:
        told_to_stop = work.entry(work.control, work.args)
        with _helpers:
            if work.handed_to is not None:
                _set_running(work, False)
                work.handed_to, work = None, work.handed_to
            elif not (told_to_stop and work.control[1] == 0):          # (0 again: called back before it left)
                _set_running(work, False)
                return


def _contiguous_state(state, name: str, expected: tuple, dtype):
    """The cache's array for in-place work: C-contiguous and writable (replaced once if not); of the model's shape
    and dtype, else refused (another model's cache: a float64 one was converted, and ran, silently)."""
    tensor = getattr(state, name)
    if tensor.shape != expected or tensor.dtype != dtype:
        raise ValueError(f"decode: cache {name} state has shape {tensor.shape} and dtype {tensor.dtype}, expected "
                         f"{expected} and {np.dtype(dtype)}; {_EMPTY_CACHE_HINT}")
    a = tensor.data
    if not (a.flags.c_contiguous and a.flags.writeable):
        a = np.array(a, dtype=dtype, order="C")
        setattr(state, name, Tensor(a))
    return a


# --- the Python side: weights prepared once, a session per cache -------------------------------------------

# Work per claimed chunk. A claim and its count cost ~1 us when the two threads contend for the counters' lines
# (measured: in_proj's phase took 1.6x as long in chunks of 16 KB as of 64 KB), and the last chunk of a phase
# leaves the other thread waiting. So a projection is claimed as two big chunks of BIG_SHARE of its rows each
# (one per thread when both run), then the rest in chunks of CHUNK_BYTES of weights, shared as they come.
# 128 KB against 16 KB (benchmarks/dev/decode_chunking.py, 24-40 rounds a run): 0.973-0.992x the step at the
# 130M shape, batch 1, 0.980-0.982x at batch 8; 0.987x and 0.997x on bench_generate's 1.8M-parameter model
CHUNK_BYTES = 128 << 10        # weights per small chunk of a projection's rows
BIG_SHARE = 0.48               # of the rows in each big chunk (b8 on 2 cores: 0.40 ~10% slower, 0.45 ~2% slower)
STATE_CHUNK_BYTES = 32 << 10   # SSM states per small chunk of the (row, head)s (big ones first, as above): two
                               # heads of 64 x 64 float32, updated together (decode_kernels._update_heads2)


def _rows_per_chunk(in_features: int, itemsize: int, chunk_bytes: int | None = None) -> int:
    return max(1, (CHUNK_BYTES if chunk_bytes is None else chunk_bytes) // (in_features * itemsize))


def _chunking(n_rows: int, in_features: int, weights) -> tuple:
    """(rows in each big chunk, rows in a small one): the big ones a multiple of the small (0: none). Chunks
    hold CHUNK_BYTES of weights as stored (int8 weights, a tuple (q, scales): 1 byte each)."""
    small = _rows_per_chunk(in_features, 1 if isinstance(weights, tuple) else weights.itemsize)
    return int(n_rows * BIG_SHARE) // small * small, small


class _Weights:
    """The arrays a step reads, in the kernel's layout. A parameter already C-contiguous in the model's dtype
    is used as is (the same array: in-place updates, like an optimizer step, are seen at once); any other is
    copied, and then taken again at every step (said once: _weights), unless nothing can write it; `fresh` tells
    whether every module still holds a parameter whose array is the one taken here (a parameter replaced on its
    module, `lin.weight = Tensor(...)`, or its .data rebound: rebuild, cheap, a few views)."""

    def __init__(self, model):
        check_decodable(model)                                          # an adapter's call is not skipped
        c, dtype = model.config, model.dtype
        self.sources, self.copied = [], False                           # (module, attribute name, array taken)
        self.copies = []                                                # the parameters copied (see _take)
        layers = [layer.mixer for layer in model.layers]
        take = lambda module, name, *shape: self._take(module, name, dtype, shape)   # the shape its place wants
        zeros = lambda size: np.zeros(size, dtype)
        d, inner, h, V = c.d_model, c.d_inner, (c.nheads,), c.padded_vocab_size
        in_proj = [take(m.in_proj, "weight", c.d_in_proj, d) for m in layers]
        out_proj = [take(m.out_proj, "weight", d, inner) for m in layers]
        self.mats = (_array_list(in_proj), _array_list(out_proj),
                     _array_list(take(m.conv1d, "weight", c.conv_dim, 1, c.d_conv).reshape(c.conv_dim, c.d_conv)
                                 for m in layers))
        self.vecs = (_array_list(take(layer.norm, "weight", d) for layer in model.layers),
                     _array_list(zeros(c.d_in_proj) if m.in_proj.bias is None else take(m.in_proj, "bias", c.d_in_proj)
                                 for m in layers),
                     _array_list(zeros(c.conv_dim) if m.conv1d.bias is None else take(m.conv1d, "bias", c.conv_dim)
                                 for m in layers),
                     _array_list(take(m, "dt_bias", *h) for m in layers),
                     _array_list(take(m, "A_log", *h) for m in layers),
                     _array_list(take(m, "D", *h) for m in layers),
                     _array_list(take(m.norm, "weight", inner) for m in layers),
                     _array_list(zeros(d) if m.out_proj.bias is None else take(m.out_proj, "bias", d)
                                 for m in layers),
                     zeros(V))                                          # the head has no bias
        self.emb = take(model.embedding, "weight", V, d)
        self.head = self.emb if model.lm_head is None else take(model.lm_head, "weight", V, d)
        self.norm_f = take(model.norm_f, "weight", d)
        # (from the Python lists: indexing a typed List from Python compiles numba's getitem in each new process,
        # 0.3 s, and a Ctrl-C inside that compile broke every later generate of the process)
        self.rows = (_chunking(c.d_in_proj, c.d_model, in_proj[0]), _chunking(c.d_model, c.d_inner, out_proj[0]),
                     _chunking(c.padded_vocab_size, c.d_model, self.head),
                     _rows_per_chunk(c.headdim * c.d_state, dtype.itemsize, STATE_CHUNK_BYTES))  # heads
        self._modules, self._names, self._arrays = (list(column) for column in zip(*self.sources))
        self._tree = _module_tree(model)
        self.entry_points = {}                                          # {numba function: entry point}, _Session.call

    def _take(self, module, name: str, dtype, want: tuple):
        tensor = getattr(module, name)
        if tuple(tensor.shape) != want:  # the kernels index without bounds checks: one of another shape was read
            where = getattr(module, "name", None) or type(module).__name__  # past its end, no error
            raise ValueError(f"decoding: {where}.{name} has shape {tuple(tensor.shape)}, the model's config wants "
                             f"{want}: a parameter replaced on its module must keep its shape")
        self.sources.append((module, name, tensor.data))
        if isinstance(tensor, QuantizedWeight):                         # read as stored: fast/quantized_kernels.py
            return tensor.kernel_form()
        data = tensor.data
        if data.dtype == dtype and data.flags.c_contiguous and data.flags.writeable:
            return data   # (np.ascontiguousarray copies where dtype is an equal copy: a deep-copied model's)
        a = np.ascontiguousarray(data, dtype=dtype)
        if not a.flags.writeable:                                       # a read-only array is another numba type
            a = a.copy()
        if a is not tensor.data and not _unwritable(tensor.data):      # a change in place would miss the copy
            self.copied = True
            self.copies.append(tensor)
        return a

    def fresh(self, model) -> bool:
        current = map(_DATA, map(getattr, self._modules, self._names))  # each module's parameter as it is now
        return (not self.copied and all(map(operator.is_, current, self._arrays))
                and _same_objects(_module_tree(model), self._tree))


_DATA = operator.attrgetter("data")


def _module_tree(model) -> list:
    """The modules whose parameters a step reads, as the model holds them now: a module replaced on its parent
    (mixer.out_proj = Linear(...)) kept its old parameters' arrays, so `fresh` compared those with themselves and
    the decoder went on with the old weights (one of another class is refused: decodable.py)."""
    tree = [model.embedding, model.lm_head, model.norm_f]
    for layer in model.layers:
        mixer = layer.mixer
        tree += [layer, layer.norm, mixer, mixer.in_proj, mixer.conv1d, mixer.norm, mixer.out_proj]
    return tree


def _same_objects(a: list, b: list) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _unwritable(a: np.ndarray) -> bool:
    """Nothing can write a's memory: read-only down to a buffer that cannot be made writable (a file mapped
    read-only, bytes). A copy of it stays right; a read-only array that owns its memory can be made writable again."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return a is not None


def _weights(model) -> _Weights:
    w = model.__dict__.get("_decode_weights")
    if w is None or not w.fresh(model):
        w = model._decode_weights = _Weights(model)
        names = {id(t): n for n, t in model.varmap.named_vars()} if w.copies else {}
        copied = sorted(names.get(id(t), "?") for t in w.copies)
        if copied and model.__dict__.get("_decode_copies_said") != copied:   # once for the same parameters
            model._decode_copies_said = copied
            said = ", ".join(f"{names.get(id(t), '?')} ({t.dtype}{'' if t.data.flags.c_contiguous else ', strided'}"
                             f"{'' if t.data.flags.writeable else ', read-only'})" for t in w.copies)
            warnings.warn(f"decoding copies {said} at every step, since the model reads its parameters as "
                          f"writable C-contiguous {model.dtype} arrays and must see changes made in place: the "
                          f"steps run several times slower. Give them that form: "
                          f"param.data = np.array(param.data, dtype={str(model.dtype)!r}, order='C')",
                          RuntimeWarning, stacklevel=5)
    return w


def helper_threads() -> int:
    """Threads that join the caller's: numba's thread count (NUMBA_NUM_THREADS, numba.set_num_threads), at
    most the cores this process may use, less the caller's own."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(0, min(numba.get_num_threads(), cores) - 1)


class _Session:
    """One cache's decoding: the work rows, the counters and the helper threads, for as long as the cache
    keeps its state arrays and the model its weights (decode_step checks both each step)."""

    def __init__(self, model, cache, batch: int, weights: _Weights, tokens: int = 1):
        """tokens > 1: a prompt's session, whose one step takes `tokens` tokens of each sequence (see _step)."""
        self.control = np.zeros(3, np.int64)                           # steps published, stop, helper running
        self.work = _HelperWork(self.control, None)
        c, dtype = model.config, model.dtype
        self.weights, self.batch = weights, batch
        convs, ssms = [], []
        for state in cache.layers:
            convs.append(_contiguous_state(state, "conv", (batch, c.conv_dim, c.d_conv), dtype))
            ssms.append(_contiguous_state(state, "ssm", (batch, c.nheads, c.headdim, c.d_state), dtype))
        self.arrays = [a for pair in zip(convs, ssms) for a in pair]
        self.ids = np.zeros(tokens * batch, np.int64)                  # token-major: row t b + bi
        rows = lambda n: np.zeros((tokens * batch, n), dtype)
        self.logits = np.zeros((batch, c.padded_vocab_size), dtype)    # the last token's
        bufs = (rows(c.d_model), rows(c.d_model), rows(c.d_in_proj), rows(c.conv_dim), rows(c.d_inner),
                rows(c.d_model), self.logits)                          # x, u, proj, xbc, y, delta, logits
        low, high = (float(v) for v in c.dt_limit)
        n_phases = 5 * c.n_layer + 2
        w = weights
        self.args = (sync_array(n_phases), self.ids, w.emb, w.head, w.norm_f, w.mats, w.vecs,
                     _array_list(convs), _array_list(ssms), bufs,
                     np.zeros((tokens * batch, c.nheads)), np.zeros((tokens * batch, c.nheads)),
                     float(c.rms_norm_eps), c.ngroups, low, high, (low, high) != (0.0, math.inf), dtype.type(0),
                     w.rows, BIG_SHARE, np.zeros(0, np.int64) if PROFILE is None else _profile_array(PROFILE))
        self.work.args = self.args
        self.step_count = 0

    def matches(self, cache, batch: int, weights: _Weights) -> bool:
        return (self.weights is weights and self.batch == batch and self.control[1] != 1 and
                all(map(operator.is_, map(_DATA, self._cache_tensors(cache)), self.arrays)))

    @staticmethod
    def _cache_tensors(cache):
        for state in cache.layers:
            yield state.conv
            yield state.ssm

    def _start_helper(self):
        """Before a step: a helper for this session, and none left spinning for another. A helper spins ~10 ms
        after its session's last step (decode_step._IDLE_SPINS), so that the next token finds it awake; a
        server stepping many caches in turn had every recent cache's helper spinning beside the one at work
        (64 caches stepped once kept both cores busy ~0.6 s). So the last session's helper is sent home, and
        handed to this session if it has none: starting a thread costs the caller ~0.1 ms, a small model's step."""
        global _last_stepped, _fork_hook
        work = self.work
        if not _fork_hook and hasattr(os, "register_at_fork"):          # at the first step, not at import
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook = True
        with _helpers:
            if work.control[1] == _SENT_HOME:                           # back before its helper left
                work.control[1] = 0
                _call_back(work)
            previous = _last_stepped and _last_stepped()
            _last_stepped = weakref.ref(self)
            if previous is not None and previous is not self and previous.work.control[1] == 0 \
                    and previous.work.control[2] == 1:                  # a helper there, its loop or on its way out
                previous.work.control[1] = _SENT_HOME
                if work.control[2] == 0 and previous.work.handed_to is None and self._helper_wanted():
                    previous.work.handed_to = work
                    _set_running(work, True)
            if work.control[2] == 0 and self._helper_wanted():
                _set_running(work, True)
                # not threading.Thread: its start() waits until the new thread has run (ms on a busy machine), and
                # the step needs no helper to finish; like a daemon thread, it does not hold the interpreter's exit
                _thread.start_new_thread(_helper_thread, (work,))

    def _helper_wanted(self) -> bool:
        """Whether a helper should join this session's steps (helper_threads()); its loop's entry point ready."""
        if not helper_threads():
            return False
        if self.work.entry is None:
            if _helper not in self.weights.entry_points:                # compiled (or loaded) here, once
                self.call(_helper, (np.array([0, 1, 0], np.int64), self.args))  # told to stop: returns at once
            self.work.entry = self.weights.entry_points[_helper]
        return True

    def step(self, ids: np.ndarray) -> np.ndarray:
        self.ids[:] = ids
        self._start_helper()
        try:
            self.call(_lead, (self.control, self.step_count, self.args))
        finally:  # the steps published (control[0]) are the steps run: no signal stops a compiled kernel, a Ctrl-C
            # lands before it starts (numba reading its arguments: no step ran, none counted; counted, the next
            # step's number had no claims left and it waited for ever) or as it returns (its claims are spent)
            self.step_count = int(self.control[0])
        return self.logits.copy()

    def sampled(self, ids: np.ndarray, vocab: int, temperature, top_k, top_p, min_p, penalty, seen: np.ndarray,
                uniforms: np.ndarray):
        """Up to n steps from ids (b,), uniforms (n, b), seen (b, vocab or 0) bool marked in place: (tokens (m, b)
        int64, m <= n, steps run: m or m + 1)."""
        self.ids[:] = ids
        self._start_helper()
        n = uniforms.shape[0]
        tokens = np.empty((n, self.batch), np.int64)
        ran = np.zeros(1, np.int64)                                     # (1,) the steps run, written as they run
        try:
            m = self.call(_sampled, (self.control, self.step_count, self.args, int(vocab), float(temperature),
                                     0 if top_k is None else int(top_k), 1.0 if top_p is None else float(top_p),
                                     float(min_p or 0.0), 1.0 if penalty is None else float(penalty), seen,
                                     uniforms, tokens, ran))
        finally:  # a Ctrl-C as the call returns loses m: the step numbers the block used are counted (see step;
            steps = int(ran[0])  # n after a block that stopped early left the claims behind the step number)
            self.step_count += steps
        return tokens[:m], steps

    def call(self, dispatcher, args):
        """dispatcher(*args) through its compiled entry point, without numba's dispatch: that types every
        argument at each call, ~240 us for a step's tuple of typed lists (against ~5 us for the entry point), a
        step's worth of a small model's time at every prompt and every block of tokens. Any session on these
        weights passes the same types: its arrays are made here, C-contiguous and writable, in the model's dtype
        (the cache's states as _contiguous_state makes them, PROFILE as _profile_array checks it), the scalars
        as Python ints, floats and bools. The first call of each function goes through the dispatcher."""
        entry = self.weights.entry_points.get(dispatcher)
        if entry is not None:
            return entry(*args)
        result = dispatcher(*args)                                      # compiles or loads; then its entry point
        self.weights.entry_points[dispatcher] = _compiled(dispatcher, args)
        return result

    def close(self):
        control = self.__dict__.get("control")                          # (None: __init__ stopped before it)
        if control is not None:
            control[1] = 1                                              # its helper leaves at its next look

    __del__ = close


def _profile_array(profile):
    """PROFILE, checked: the step adds its cycles to it in place, and its type is the step's (see _Session.call)."""
    if not (isinstance(profile, np.ndarray) and profile.dtype == np.int64 and profile.shape == (len(PROFILE_PHASES),)
            and profile.flags.c_contiguous and profile.flags.writeable):
        raise ValueError(f"decode.PROFILE must be None or a writable np.zeros({len(PROFILE_PHASES)}, np.int64) "
                         f"(one count per PROFILE_PHASES), got {type(profile).__name__} "
                         f"{getattr(profile, 'dtype', '')} {getattr(profile, 'shape', '')}")
    return profile


def _compiled(dispatcher, args):
    """The function numba compiled for these argument types, to call without its type dispatch (see
    _Session.call); the dispatcher itself where numba does not expose it (NUMBA_DISABLE_JIT=1)."""
    try:
        return dispatcher.overloads[tuple(numba.typeof(a) for a in args)].entry_point
    except (KeyError, AttributeError, TypeError):
        return dispatcher


def decode_step(model, ids: np.ndarray, cache) -> np.ndarray:
    """ids (b,) ints -> logits (b, padded vocab) in the model's dtype; every layer's cache advances in place.
    Checks are the caller's (Mamba2LMHeadModel.step)."""
    session = _session(model, cache, ids.shape[0])
    logits = session.step(ids)
    for t in session._cache_tensors(cache):
        t._bump()                                                       # written in place
    return logits


def _session(model, cache, b: int) -> _Session:
    weights = _weights(model)
    session = cache.__dict__.get("_decode_session")
    if session is None or not session.matches(cache, b, weights):
        made = _Session(model, cache, b, weights)                       # (refused: the cache keeps its session)
        if session is not None:
            session.close()
        session = cache._decode_session = made
    return session


def decode_sampled(model, ids: np.ndarray, cache, vocab: int, temperature: float, top_k, top_p,
                   uniforms: np.ndarray, min_p=None, repetition_penalty=None, seen: np.ndarray | None = None):
    """Generation inside one numba call: feed ids (b,), then each step's token (sample_next's choice over the
    first `vocab` logits, by its numba twin; temperature 0 is greedy), for up to n = len(uniforms) steps;
    with a repetition_penalty other than None or 1, seen (b, vocab) bool marks the ids each row has seen (its
    prompt's, its tokens') and gets each drawn token marked;
    step i's row bi draws with uniforms (n, b)[i, bi], the numbers sample_next would take from its generator
    (rng.random((b, 1)) a step: draw them as rng.random((n, b))). Every layer's cache advances in place.
    Returns (tokens (m, b) int64, logits): m = n and logits None, or m < n when step m + 1's logits (b, padded
    vocab), returned, hold NaN, +inf or no finite value in a row (sample_next names it). cache.seqlen_offset
    advances by the steps run."""
    session = _session(model, cache, ids.shape[0])
    n = uniforms.shape[0]
    uniforms = np.ascontiguousarray(uniforms, np.float64)              # (n, b)
    if repetition_penalty is None or repetition_penalty == 1:
        seen = np.zeros((ids.shape[0], 0), np.bool_)                    # (b, 0): never read
    elif seen is None or seen.shape != (ids.shape[0], vocab) or seen.dtype != np.bool_ \
            or not seen.flags.c_contiguous or not seen.flags.writeable:    # numba checks no bounds: refused here
        raise ValueError(f"decode_sampled: seen must be a writable C-contiguous bool array of shape "
                         f"{(ids.shape[0], vocab)} (b, vocab) with a repetition_penalty, got "
                         f"{None if seen is None else (seen.shape, seen.dtype)}")
    tokens, steps = session.sampled(ids, vocab, temperature, top_k, top_p, min_p, repetition_penalty, seen,
                                    uniforms)
    for t in session._cache_tensors(cache):
        t._bump()                                                       # written in place
    cache.seqlen_offset += steps
    return tokens, (None if len(tokens) == n else session.logits.copy())


def decode_prompt(model, ids: np.ndarray, cache) -> np.ndarray:
    """ids (b, l) (a short prompt) in one numba step of l tokens per sequence: every weight is read once for
    all b l rows (the per-token step read them l times), the conv and the heads run each sequence's tokens in
    order. Returns the logits (b, padded vocab) after the last token; every layer's cache advances in place,
    cache.seqlen_offset by l."""
    b, l = ids.shape
    session = _Session(model, cache, b, _weights(model), tokens=l)    # its rows fit this prompt only
    session.ids[:] = ids.T.ravel()                                      # token-major (l b,)
    try:
        session._start_helper()
        session.call(_lead, (session.control, 0, session.args))
    finally:
        session.close()
    for t in session._cache_tensors(cache):
        t._bump()                                                       # written in place
    cache.seqlen_offset += l
    return session.logits.copy()


def release(cache) -> None:
    """Send this cache's helper threads home now (they would spin a few ms more, taking a core from what runs
    next); the next decode_step on it starts them again."""
    session = cache.__dict__.pop("_decode_session", None)
    if session is not None:
        session.close()
