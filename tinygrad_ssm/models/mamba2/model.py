"""The Mamba-2 language model on the engine: mixer, residual block, LM head, decoding caches and generation.

Names, shapes, equations and initialisation follow docs/mamba2.md (mamba_ssm's Mamba2 and
mixer_seq_simple), so real checkpoints load (see pretrained.py) and give the official logits.

    embedding -> n_layer x [x = x + mixer(RMSNorm(x))] -> norm_f -> lm_head (tied to the embedding)
    mixer: in_proj -> z | xBC | dt;  xBC -> causal conv -> silu -> x | B | C;  y = SSD(x, dt, A, B, C) + D x;
           y = gated_rmsnorm(y, z);  out_proj(y)

Decoding: every layer keeps a conv state (b, conv_dim, d_conv) of raw pre-conv inputs and an SSM state
(b, h, p, n). A forward pass given a cache starts from it and leaves it at the end of the input (prefill,
chunked); `step` then advances one token with O(1) work and memory.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from ... import nn
from ...autograd import functional as F
from ...autograd.tensor import Tensor, no_grad
from ...fast import fused as fused_ops
from ...fast import heap_reuse, row_ops
from ...nn import init
from ...nn.module import Module
from ...registry import VarBuilder, VarMap
from ...scan import available_backends, ssd
from ...scan.sequential import ssd_step
from . import generation
from .config import Mamba2Config
from .decode import decode_step
from .foreign_arguments import FORWARD, FROM_PRETRAINED, loss_targets, refuse_foreign, warn_unshifted_targets
from .quantized_files import load_model_folder, save_model_folder
from .quantize import quantize_model

SUPPORTED_DTYPES = ("float32", "float64")


# --- the official initialisation of the mixer's own parameters ----------------------------------------------

class DtBiasInit(init.Init):
    """dt ~ exp(U(log dt_min, log dt_max)) floored at dt_init_floor; dt_bias = softplus^-1(dt), so that
    softplus(dt_bias) starts as that dt."""

    def __init__(self, dt_min: float, dt_max: float, floor: float):
        self.dt_min, self.dt_max, self.floor = dt_min, dt_max, floor

    def sample(self, shape, rng):
        dt = np.exp(rng.random(shape) * (math.log(self.dt_max) - math.log(self.dt_min)) + math.log(self.dt_min))
        dt = np.maximum(dt, self.floor)
        return dt + np.log(-np.expm1(-dt))                                # inverse softplus


class ALogInit(init.Init):
    """A_log = log(U(low, high)) per head (A = -exp(A_log) is then in [-high, -low])."""

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high

    def sample(self, shape, rng):
        return np.log(rng.uniform(self.low, self.high, shape))


class ScaledInit(init.Init):
    """Another init divided by a constant: out_proj's kaiming-uniform / sqrt(n_layer)
    (mamba_ssm's rescale_prenorm_residual, so the residual stream's variance does not grow with depth)."""

    def __init__(self, base: init.Init, divisor: float):
        self.base, self.divisor = base, divisor

    def sample(self, shape, rng):
        return self.base.sample(shape, rng) / self.divisor


# --- decoding caches ---------------------------------------------------------------------------------------

@dataclass
class LayerState:
    conv: Tensor   # (b, conv_dim, d_conv) the last d_conv raw (pre-conv) xBC inputs, oldest first
    ssm: Tensor    # (b, h, p, n)


_forks = [0]              # forks this process came out of (counted from the first advance on: _count_forks)
_replacing = threading.Lock()


def _count_forks():
    if _forks[0] == 0 and hasattr(os, "register_at_fork"):
        _forks[0] = 1
        os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


@dataclass
class Mamba2Cache:
    layers: list   # one LayerState per layer
    seqlen_offset: int = 0   # tokens seen so far

    def __post_init__(self):
        if not isinstance(self.layers, list):   # transformers 4's Mamba2Cache(config, batch_size) failed at first use
            raise TypeError(f"Mamba2Cache: layers must be a list of LayerState, got {type(self.layers).__name__}; "
                            f"make a cache with model.allocate_cache(batch_size)")
        self._in_use = threading.RLock()   # reentrant: see advancing

    def __getstate__(self):  # pickle, deepcopy: the fused decoder's session (numba's lists) is rebuilt when needed
        return {k: v for k, v in self.__dict__.items() if k not in ("_decode_session", "_in_use")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._in_use = threading.RLock()

    @contextlib.contextmanager
    def advancing(self, who: str):
        """Held while a call advances the cache: a second thread meanwhile is refused. Two threads stepping one
        cache hung the process in the fused decoder (its session's step counters crossed) and, unfused, left
        states matching no order of the steps; a cache is one batch of sequences, read and written in order.
        Reentrant, because a Ctrl-C can land between the acquire and the `try` (or inside `finally`) and leave a
        hold behind: a plain lock then refused every later call, of this thread too. No call advances a cache
        from inside another's advance, so every hold this thread has when its call ends is such a leftover (and
        only the main thread, where Ctrl-C lands, leaves one): the call's end drops them all. A hold taken before
        a fork (a thread of the parent was advancing the cache) belongs to no thread of the child: dropped there."""
        _count_forks()
        if not self._in_use.acquire(blocking=False):
            if self.__dict__.get("_held_at", _forks[0]) == _forks[0]:   # a thread of this process holds it
                self._refuse(who)
            lock = self._in_use
            with _replacing:                                            # one thread of the child replaces it
                if self._in_use is lock:
                    self._in_use = threading.RLock()
            if not self._in_use.acquire(blocking=False):
                self._refuse(who)
        self._held_at = _forks[0]
        try:
            yield
        finally:
            while True:                  # this call's hold, and any a Ctrl-C left behind in this thread
                try:
                    self._in_use.release()
                except RuntimeError:     # none left (or another thread took it after the last)
                    break

    @staticmethod
    def _refuse(who: str):
        raise RuntimeError(f"{who}: this cache is being advanced by another thread; a cache holds one batch's "
                           f"state and moves token by token: give each thread its own (model.allocate_cache)")

    @property
    def batch_size(self) -> int:
        return self.layers[0].ssm.shape[0]


# --- the mixer ---------------------------------------------------------------------------------------------

class Mamba2Mixer:
    """One Mamba-2 mixer, (b, l, d_model) -> (b, l, d_model). Parameters (under vb's prefix): in_proj.weight,
    conv1d.weight, conv1d.bias, dt_bias, A_log, D, norm.weight, out_proj.weight (created in this order).
    fused=True runs the hot chains as fused numba ops (fast/fused.py): the in_proj split, conv + SiLU,
    dt bias + softplus (+ clamp), the gated norm; fused=False composes engine ops (the reference path)."""

    def __init__(self, vb: VarBuilder, config: Mamba2Config, fused: bool = False):
        c = self.config = config
        self.fused = fused
        self.d_inner, self.nheads, self.conv_dim = c.d_inner, c.nheads, c.conv_dim
        zero = init.Const(0.0)
        self.in_proj = nn.Linear(vb.pp("in_proj"), c.d_model, c.d_in_proj, bias=c.bias, bias_init=zero, fused=fused)
        self.conv1d = nn.CausalDepthwiseConv1d(vb.pp("conv1d"), c.conv_dim, c.d_conv, bias=c.conv_bias, fused=fused)
        self.dt_bias = vb.get((c.nheads,), "dt_bias", init=DtBiasInit(c.dt_min, c.dt_max, c.dt_init_floor))  # (h,)
        self.A_log = vb.get((c.nheads,), "A_log", init=ALogInit(*c.A_init_range))                           # (h,)
        self.D = vb.get((c.nheads,), "D", init=init.Const(1.0))                                             # (h,)
        self.norm = nn.GatedRMSNorm(vb.pp("norm"), c.d_inner, group_size=c.d_inner // c.ngroups, eps=c.rms_norm_eps,
                                    fused=fused)
        out_init = ScaledInit(init.KaimingUniform(a=math.sqrt(5)), math.sqrt(c.n_layer))
        self.out_proj = nn.Linear(vb.pp("out_proj"), c.d_inner, c.d_model, bias=c.bias, weight_init=out_init,
                                  bias_init=zero, fused=fused)

    def _split_in_proj(self, zxbcdt: Tensor):
        """(..., d_in_proj) -> z (..., d_inner), xBC (..., conv_dim), dt (..., h): the official order."""
        if self.fused:
            return fused_ops.split_last(zxbcdt, [self.d_inner, self.conv_dim, self.nheads])
        return F.split(zxbcdt, [self.d_inner, self.conv_dim, self.nheads], axis=-1)

    def _dt_and_A(self, dt: Tensor):
        """dt (..., h) raw -> softplus(dt + dt_bias), clamped to dt_limit if one is set; A = -exp(A_log)."""
        low, high = self.config.dt_limit
        if self.fused:
            return fused_ops.dt_softplus(dt, self.dt_bias, low, high), -F.exp(self.A_log)
        dt = F.softplus(dt + self.dt_bias)
        if (low, high) != (0.0, math.inf):
            dt = F.clip(dt, low, high)
        return dt, -F.exp(self.A_log)                                   # (..., h), (h,)

    def _split_xBC(self, xBC: Tensor):
        c = self.config
        sizes = [c.d_inner, c.ngroups * c.d_state, c.ngroups * c.d_state]
        x, B, C = fused_ops.split_last(xBC, sizes) if self.fused else F.split(xBC, sizes, axis=-1)
        lead = xBC.shape[:-1]
        return (F.reshape(x, (*lead, c.nheads, c.headdim)),              # (..., h, p)
                F.reshape(B, (*lead, c.ngroups, c.d_state)),             # (..., g, n)
                F.reshape(C, (*lead, c.ngroups, c.d_state)))             # (..., g, n)

    def __call__(self, u: Tensor, state: LayerState | None = None, backend: str = "auto") -> Tensor:
        """u (b, l, d_model) -> (b, l, d_model). With `state`, the sequence continues from it (conv inputs
        and SSM state) and `state` is updated to the end of u, outside the graph."""
        b, l, _ = u.shape
        k = self.config.d_conv
        z, xBC, dt = self._split_in_proj(self.in_proj(u))                # (b, l, d_inner), (b, l, conv_dim), (b, l, h)
        # with a state, the conv sees the k - 1 inputs before this segment, not zeros
        before = None if state is None else F.transpose(Tensor(state.conv.data[:, :, 1:]), 1, 2)  # (b, k - 1, conv_dim)
        conv = self.conv1d.silu_of(xBC, before)                          # (b, l, conv_dim)
        x, B, C = self._split_xBC(conv)                                  # (b, l, h, p), (b, l, g, n) x2
        dt, A = self._dt_and_A(dt)                                       # (b, l, h), (h,)
        initial = None if state is None else Tensor(state.ssm.data)
        y, final_state = ssd(x, dt, A, B, C, D=self.D, initial_state=initial,
                             chunk_size=self.config.chunk_size, backend=backend)  # (b, l, h, p), (b, h, p, n)
        if state is not None:
            newest = np.swapaxes(xBC.data[:, -k:], 1, 2)                 # (b, conv_dim, min(l, k))
            raw = np.concatenate([state.conv.data, newest], axis=2)      # (b, conv_dim, k + min(l, k))
            state.conv = Tensor(np.ascontiguousarray(raw[:, :, -k:]))    # (b, conv_dim, k): the last k inputs
            state.ssm = Tensor(final_state.data.copy())                  # (b, h, p, n)
        y = self.norm(F.reshape(y, (b, l, self.d_inner)), z)             # (b, l, d_inner)
        return self.out_proj(y)                                          # (b, l, d_model)

    def step(self, u_t: Tensor, state: LayerState) -> Tensor:
        """One token: u_t (b, d_model) -> (b, d_model); `state` advances by one step. Call under no_grad."""
        b = u_t.shape[0]
        z, xBC, dt = self._split_in_proj(self.in_proj(u_t))             # (b, d_inner), (b, conv_dim), (b, h)
        conv, state.conv = self.conv1d.step(state.conv, xBC)            # (b, conv_dim), (b, conv_dim, k)
        x, B, C = self._split_xBC(F.silu(conv))                          # (b, h, p), (b, g, n) x2
        dt, A = self._dt_and_A(dt)                                       # (b, h), (h,)
        y, state.ssm = ssd_step(state.ssm, x, dt, A, B, C, self.D)       # (b, h, p), (b, h, p, n)
        y = self.norm(F.reshape(y, (b, self.d_inner)), z)                # (b, d_inner)
        return self.out_proj(y)                                          # (b, d_model)

    def allocate_state(self, batch: int, dtype) -> LayerState:
        c = self.config
        return LayerState(conv=Tensor(np.zeros((batch, c.conv_dim, c.d_conv), dtype=dtype)),
                          ssm=Tensor(np.zeros((batch, c.nheads, c.headdim, c.d_state), dtype=dtype)))


class Mamba2Block:
    """x + mixer(RMSNorm(x)): the pre-norm residual block ("norm.weight", "mixer.*")."""

    mixer_class = Mamba2Mixer   # for decodable.py, which cannot import model.py (model.py imports the decoder)

    def __init__(self, vb: VarBuilder, config: Mamba2Config, fused: bool = False):
        self.norm = nn.RMSNorm(vb.pp("norm"), config.d_model, eps=config.rms_norm_eps, fused=fused)
        self.mixer = self.mixer_class(vb.pp("mixer"), config, fused=fused)

    def __call__(self, x: Tensor, state: LayerState | None = None, backend: str = "auto") -> Tensor:
        return x + self.mixer(self.norm(x), state, backend)             # (b, l, d_model)

    def step(self, x_t: Tensor, state: LayerState) -> Tensor:
        return x_t + self.mixer.step(self.norm(x_t), state)             # (b, d_model)


# --- the language model ------------------------------------------------------------------------------------

class Mamba2LMHeadModel(Module):
    """Token ids (b, l) -> logits (b, l, padded vocab). Parameters live in `self.varmap` under the official
    mamba_ssm names (backbone.embedding.weight, backbone.layers.{i}...., backbone.norm_f.weight, and
    lm_head.weight only when the head is not tied to the embedding).

    fused=True (the default) runs the mixer's hot chains as fused numba ops and decodes (`step`, generation)
    without the engine: one numba call per token for every layer, no BLAS (decode.py); fused=False is the
    reference path of plain engine ops. Both give the same numbers (tests/fast/test_fused.py, test_decode.py).
    torch's module methods (parameters, state_dict, load_state_dict, zero_grad, train, eval): nn/module.py."""

    block_class = Mamba2Block

    def __init__(self, config: Mamba2Config, varmap: VarMap | None = None, dtype="float32", backend: str = "auto",
                 fused: bool = True):
        if not isinstance(config, Mamba2Config):
            raise TypeError(f"Mamba2LMHeadModel: config must be a Mamba2Config, got {type(config).__name__}")
        config.check()                      # again: a field may have been changed since the config was made
        if dtype is None:  # the default, as transformers' dtype=None (NumPy's np.dtype(None) would be float64)
            dtype = "float32"
        try:
            dtype_name = np.dtype(dtype).name
        except TypeError:  # e.g. "bfloat16": NumPy has no such dtype
            dtype_name = str(dtype)
        if dtype_name not in SUPPORTED_DTYPES:
            raise ValueError(f"Mamba2LMHeadModel: dtype must be one of {SUPPORTED_DTYPES} (the residual stream, dt "
                             f"and A stay float32 at least; half-precision weights are upcast), got {dtype!r}")
        if backend != "auto" and backend not in available_backends():
            raise ValueError(f"Mamba2LMHeadModel: unknown backend {backend!r}; choose 'auto' or one of "
                             f"{available_backends()}")
        if not isinstance(fused, bool):
            raise TypeError(f"Mamba2LMHeadModel: fused must be True or False, got {fused!r}")
        config = config.for_model()   # a copy: the caller's may change; its fields fixed, chunk_size aside
        self.config, self.backend, self.fused = config, backend, fused
        self.tied_weights = {"lm_head.weight": "backbone.embedding.weight"} if config.tie_embeddings else {}
        if fused:
            heap_reuse.keep_freed_memory()   # freed arrays' pages reused by the next step (see fast/heap_reuse.py)
        self.dtype = np.dtype(dtype)
        self.varmap = varmap if varmap is not None else VarMap(seed=0)
        vb = VarBuilder.from_varmap(self.varmap, dtype=self.dtype)
        backbone = vb.pp("backbone")
        if fused:  # the decoder streams these every token: each kind in one huge-page block (VarMap.reserve_block)
            c = config
            for proj, shape in (("in_proj", (c.d_in_proj, c.d_model)), ("out_proj", (c.d_model, c.d_inner))):
                self.varmap.reserve_block([backbone.pp("layers").pp(i).pp("mixer").pp(proj).path("weight")
                                           for i in range(c.n_layer)], shape, self.dtype)
        V = config.padded_vocab_size
        self.embedding = nn.Embedding(backbone.pp("embedding"), V, config.d_model, fused=fused)
        self.layers = [self.block_class(backbone.pp("layers").pp(i), config, fused) for i in range(config.n_layer)]
        self.norm_f = nn.RMSNorm(backbone.pp("norm_f"), config.d_model, eps=config.rms_norm_eps, fused=fused)
        self.lm_head = None if config.tie_embeddings else nn.Linear(vb.pp("lm_head"), config.d_model, V, bias=False,
                                                                       fused=fused)

    # --- full sequences ------------------------------------------------------------------------------------
    def __getstate__(self):  # pickle, deepcopy (a spawned process): the decoder's prepared weights are rebuilt
        return {k: v for k, v in self.__dict__.items() if k != "_decode_weights"}

    def _check_ids(self, input_ids, ndim: int, what: str) -> np.ndarray:
        ids = generation.as_id_array(input_ids, what)
        shape_text = "(b, l)" if ndim == 2 else "(b,)"
        if ids.ndim != ndim or not np.issubdtype(ids.dtype, np.integer) or 0 in ids.shape:
            sizes = "b >= 1 and l >= 1" if ndim == 2 else "b >= 1"
            raise ValueError(f"{what}: input_ids must be integers of shape {shape_text} with {sizes}, got dtype "
                             f"{ids.dtype} shape {ids.shape}")
        V = self.config.padded_vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"{what}: input_ids must be in [0, {V}), got min {ids.min()} max {ids.max()}")
        return ids

    def _head(self, x: Tensor) -> Tensor:
        return self._attend(self.norm_f(x))

    def _attend(self, x: Tensor) -> Tensor:
        """The output head on norm_f's output: logits over the (padded) vocabulary."""
        return self.embedding.attend(x) if self.lm_head is None else self.lm_head(x)

    def __call__(self, input_ids, cache: Mamba2Cache | None = None, **foreign) -> Tensor:
        """input_ids (b, l) ints -> logits (b, l, padded vocab). With `cache` (see allocate_cache), the input
        continues from the cached states and leaves them at its end (prefill). The cached states are arrays,
        not part of the graph: a loss on a later segment sends no gradient into the segments before it
        (truncated backpropagation through time; for the gradient of the whole text, one forward over it).
        transformers' and mamba_ssm's other arguments (labels, attention_mask, ...) are refused by name, with what
        to do instead (foreign_arguments.FORWARD)."""
        refuse_foreign("Mamba2LMHeadModel", FORWARD, foreign)
        ids = self._check_ids(input_ids, 2, "Mamba2LMHeadModel")
        if cache is None:
            return self._forward(ids, None)
        self._check_cache(cache, ids, "Mamba2LMHeadModel")
        with cache.advancing("Mamba2LMHeadModel"):
            return self._forward(ids, cache)

    def _forward(self, ids: np.ndarray, cache: Mamba2Cache | None) -> Tensor:
        x = self.embedding(ids)                                          # (b, l, d_model)
        states = [None] * len(self.layers) if cache is None else cache.layers
        if self.fused:
            x = self._fused_residual_stream(x, states)                   # (b, l, d_model) after norm_f
        else:
            for layer, state in zip(self.layers, states):
                x = layer(x, state, self.backend)
            x = self.norm_f(x)
        if cache is not None:
            cache.seqlen_offset += ids.shape[1]
        return self._attend(x)                                           # (b, l, V)

    def _fused_residual_stream(self, x: Tensor, states: list) -> Tensor:
        """The blocks as `Mamba2Block` computes them, x + mixer(norm(x)), but each residual add done together with
        the norm that reads its sum (one AddRMSNorm op: mamba_ssm's fused_add_norm): block i's sum and block i+1's
        norm, the last block's sum and norm_f. Returns norm_f's output. The same bits as the blocks one by one."""
        first = self.layers[0]
        mix = first.mixer(first.norm(x), states[0], self.backend)       # (b, l, d_model)
        for layer, state in zip(self.layers[1:], states[1:]):
            x, normed = fused_ops.add_rms_norm(x, mix, layer.norm.weight, layer.norm.eps)
            mix = layer.mixer(normed, state, self.backend)
        return fused_ops.add_rms_norm(x, mix, self.norm_f.weight, self.norm_f.eps, return_total=False)

    forward = __call__

    def loss(self, input_ids, targets=None, **foreign) -> Tensor:
        """Mean cross entropy of targets (b, l) under the logits of input_ids (b, l): the next tokens, so
        loss(ids[:, :-1], ids[:, 1:]) (transformers' labels=ids, which it shifts inside). Targets equal to the
        input ids (a port of labels=ids) are said in a warning: a causal model scores its next token."""
        warn_unshifted_targets(input_ids, targets := loss_targets(targets, foreign))   # (labels= refused with the fix)
        ids = self._check_ids(input_ids, 2, "Mamba2LMHeadModel.loss")
        logits = self(ids)                                               # (b, l, V)
        targets = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
        if targets.shape != logits.shape[:2]:
            raise ValueError(f"Mamba2LMHeadModel.loss: targets must have input_ids' shape {logits.shape[:2]}, "
                             f"got {targets.shape}")
        cross_entropy = row_ops.cross_entropy if self.fused else F.cross_entropy
        return cross_entropy(logits, targets)

    # --- decoding ----------------------------------------------------------------------------------------
    def allocate_cache(self, batch: int) -> Mamba2Cache:
        if not isinstance(batch, (int, np.integer)) or isinstance(batch, (bool, np.bool_)) or batch < 1:
            raise ValueError(f"allocate_cache: batch must be a positive int, got {batch!r}")
        return Mamba2Cache([layer.mixer.allocate_state(int(batch), self.dtype) for layer in self.layers])

    def _check_cache(self, cache, ids: np.ndarray, who: str, states: bool = True):
        """A cache this model allocated: one state per layer (zip would skip the layers past a shorter cache's
        end, and the logits would silently be another model's), for the batch of `ids`; with `states`, every
        layer's state arrays of this model's shapes and dtype (the fused step leaves that to the decoder, which
        checks them when its session is made: ~1 us a layer here was 7% of a small model's step)."""
        if not isinstance(cache, Mamba2Cache):
            raise TypeError(f"{who}: cache must be a Mamba2Cache (model.allocate_cache(batch)), got "
                            f"{type(cache).__name__}")
        if len(cache.layers) != len(self.layers):
            raise ValueError(f"{who}: cache holds {len(cache.layers)} layers' states, this model has "
                             f"{len(self.layers)} layers; allocate it with this model's allocate_cache")
        if cache.batch_size != ids.shape[0]:
            raise ValueError(f"{who}: cache is for batch {cache.batch_size}, input_ids has shape {ids.shape}")
        if not states:
            return
        c, b = self.config, ids.shape[0]
        conv, ssm = (b, c.conv_dim, c.d_conv), (b, c.nheads, c.headdim, c.d_state)
        for i, state in enumerate(cache.layers):  # another model's cache failed deep in a layer, or ran in its dtype
            if state.conv.shape != conv or state.ssm.shape != ssm or not state.conv.dtype == state.ssm.dtype == \
                    self.dtype:
                raise ValueError(f"{who}: cache layer {i} holds conv {state.conv.shape} and ssm {state.ssm.shape} "
                                 f"states of {state.ssm.dtype}, this model's are {conv} and {ssm} of {self.dtype} "
                                 f"(another model's cache?); allocate it with this model's allocate_cache")

    @no_grad()
    def step(self, input_ids, cache: Mamba2Cache) -> Tensor:
        """One token per sequence: input_ids (b,) -> logits (b, padded vocab); the cache advances by one."""
        ids = self._check_ids(input_ids, 1, "Mamba2LMHeadModel.step")
        self._check_cache(cache, ids, "step", states=not self.fused)
        with cache.advancing("step"):
            if self.fused:  # one numba call for every layer, in place on the cache (decode.py)
                logits = decode_step(self, ids, cache)
                cache.seqlen_offset += 1
                return Tensor(logits)                                    # (b, V)
            x = self.embedding(ids)                                      # (b, d_model)
            for layer, state in zip(self.layers, cache.layers):
                x = layer.step(x, state)
            cache.seqlen_offset += 1
            return self._head(x)                                         # (b, V)

    def generate_stream(self, input_ids, max_new_tokens: int | None = None, *, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                        eos_token_id=None, vocab_size: int | None = None, min_p: float | None = None,
                        repetition_penalty: float | None = None, **foreign):
        """Yield the next token ids (b,) one step at a time. input_ids: (b, l), (l,), or a list of prompts of
        any lengths; sampling only considers the real vocabulary (not the padding rows; vocab_size: only ids
        below it, e.g. the tokenizer's size); eos_token_id (an int, or a sequence of ints: any of them) ends a row
        (see generation.generate_stream). The defaults sample (temperature 1, unseeded): temperature=0 is the
        greedy decoding that mamba_ssm's (top_k=1) and transformers' generate do by default. min_p and
        repetition_penalty as in transformers (sampling.sample_next); mamba_ssm's and transformers' other
        arguments (max_length, num_beams, ...) are refused by name. Only input_ids and max_new_tokens may be given
        by position: mamba_ssm's generate(input_ids, max_length, top_k, top_p, ...) would otherwise run with other
        meanings (max_new_tokens counts the new tokens only)."""
        return generation.generate_stream(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                          top_p=top_p, seed=seed, eos_token_id=eos_token_id, vocab_size=vocab_size,
                                          min_p=min_p, repetition_penalty=repetition_penalty, **foreign)

    def generate(self, input_ids, max_new_tokens: int | None = None, *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None, eos_token_id=None,
                 vocab_size: int | None = None, min_p: float | None = None,
                 repetition_penalty: float | None = None, **foreign):
        """The prompts followed by their sampled ids: (b, l + max_new_tokens) int64 for an array, a list of 1-D
        int64 arrays for a list of prompts, cut after the first id of eos_token_id (an int or a sequence of ints;
        see generation.generate). Sampling settings and other libraries' arguments as in generate_stream."""
        return generation.generate(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p, seed=seed, eos_token_id=eos_token_id, vocab_size=vocab_size,
                                   min_p=min_p, repetition_penalty=repetition_penalty, **foreign)

    # --- weight-only quantization (quantize.py) -----------------------------------------------------------
    def quantize(self, weights: str, block: int | None = None) -> Mamba2LMHeadModel:
        """In place, like torch's module.half(): in_proj, out_proj and the head (the embedding when tied) become
        "int8" (a float32 scale per `block` weights of a row; None: 32, or the largest block below that divides
        d_model and d_inner) or "bfloat16", and their float arrays are dropped. Returns the model, now for
        inference only (no gradients through the quantized matrices)."""
        return quantize_model(self, weights, block)

    # --- checkpoints (pretrained.py) ---------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory, dtype="float32", backend: str = "auto",
                        fused: bool = True, **foreign) -> Mamba2LMHeadModel:
        refuse_foreign("Mamba2LMHeadModel.from_pretrained", FROM_PRETRAINED, foreign)   # torch_dtype, revision, ...
        return load_model_folder(cls, directory, dtype=dtype, backend=backend, fused=fused)

    def save_pretrained(self, directory, layout: str = "mamba_ssm", token_ids: dict | None = None,
                        dtype: str | None = None):
        """config.json + model.safetensors in mamba_ssm's layout, or transformers' (layout="transformers": what
        transformers.Mamba2ForCausalLM.from_pretrained reads; token_ids: its bos/eos/pad_token_id where known).
        The weights in the model's dtype (one loaded from bfloat16 is float32: dtype="bfloat16" writes it as it
        came, as export does), or each in `dtype`: float64, float32, float16 or bfloat16 (rounded once, to nearest)."""
        save_model_folder(self, directory, layout=layout, token_ids=token_ids, dtype=dtype)

    def __repr__(self):
        c = self.config
        quantized = getattr(self, "quantized", {})                      # name -> QuantizedWeight (quantize.py)
        n_quantized = sum(int(np.prod(w.shape)) for w in quantized.values())
        count = f"{self.varmap.num_parameters() + n_quantized:,} parameters"
        if quantized:
            count += f" ({n_quantized:,} of them {self.weights_format}, inference only)"
        return (f"Mamba2LMHeadModel(d_model={c.d_model}, n_layer={c.n_layer}, vocab={c.vocab_size} "
                f"(padded {c.padded_vocab_size}), {count}, {self.dtype})")
