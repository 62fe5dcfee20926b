"""Weight-only quantization for inference: the matrices a decoded token reads (every layer's in_proj and out_proj,
and the LM head: the embedding when tied, whose lookup then reads the quantized rows too) stored in 8 or 16 bits;
the scan, the norms, the conv, dt / A / D and the states stay in the model's dtype.

Formats (`dequantize` below is their spec, the slow twin of every kernel that reads them):
- "int8": a row of W (out, in) in blocks of `block` consecutive weights, each with one float32 scale:
  s = max|w| / 127 (float32; a block of zeros: s = 0), q = round(w / s) (halves to even) clipped to [-127, 127], int8.
  The weight is q * s (exact in float64). Stored: q (out, in) int8, scales (out, in / block) float32.
- "bfloat16": the upper 16 bits of the float32 weight, rounded to nearest even, stored as uint16; the weight
  is those bits << 16 read as float32.

    model.quantize("int8")          # in place (as torch's module.half()), returns the model; inference only

The model's forward (prefill, eval) multiplies through dequantized blocks of rows (QuantizedLinear,
QuantizedEmbedding: at most ROWS_PER_BLOCK rows in float at a time, never the whole LM head); decoding reads
the quantized arrays directly (fast/quantized_kernels.py).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ...autograd.function import Function
from ...autograd.tensor import Tensor
from ...fast.products import rows_product
from ...fast.quantized_kernels import bfloat16_dequantized, int8_dequantized
from ...io.finite import non_finite_problems
from ...io.safetensors import float_to_bf16

FORMATS = ("int8", "bfloat16")
DEFAULT_BLOCK = 32      # llama.cpp's Q8_0 block (smaller blocks: a closer scale per weight); other blocks'
                        # speed and quality not measured (bench_quantized.py --block N measures them)
ROWS_PER_BLOCK = 4096   # rows dequantized at once by the forward: 4096 x 768 float32 = 12 MB, not the head's 154 MB


def quantize_int8(w: np.ndarray, block: int = DEFAULT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """w (out, in) float -> (q (out, in) int8, scales (out, in / block) float32), the "int8" format. Works through
    slabs of rows, so its float64 temporaries stay a few MB whatever the matrix (whole, they were 6.3x the LM head's
    147 MiB at the 130M shape: loading with --weights int8 peaked at 3x a float32 load)."""
    out_features, in_features = w.shape
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:   # 0: ZeroDivisionError
        raise ValueError(f"quantize int8: block must be a positive int, got {block!r}")
    block = int(block)
    if in_features % block:
        raise ValueError(f"quantize int8: in_features {in_features} is not a multiple of block {block} (choose a "
                         f"block that divides it)")
    q = np.empty((out_features, in_features), np.int8)                                        # (out, in)
    scales = np.empty((out_features, in_features // block), np.float32)                       # (out, nb)
    for lo in range(0, out_features, _slab_rows(in_features)):
        rows = slice(lo, lo + _slab_rows(in_features))
        blocks = np.asarray(w[rows], np.float64).reshape(-1, in_features // block, block)     # (rows, nb, block)
        with np.errstate(over="ignore"):  # past float32's range: an inf scale, which QuantizedWeight refuses
            scales[rows] = np.abs(blocks).max(axis=2) / 127.0
        s = scales[rows].astype(np.float64)[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            slab = np.where(s > 0, np.rint(blocks / np.where(s > 0, s, 1.0)), 0.0)
        q[rows] = np.clip(slab, -127, 127).reshape(-1, in_features)
    return q, scales


def quantize_bfloat16(w: np.ndarray) -> np.ndarray:
    """w (out, in) float -> uint16 bits of bfloat16, round to nearest even (NaN stays a quiet NaN)."""
    return float_to_bf16(w)


SLAB_ELEMENTS = 1 << 18  # weights quantized at once: float64 temporaries of 2 MB each


def _slab_rows(in_features: int) -> int:
    return max(1, SLAB_ELEMENTS // in_features)


def dequantize(fmt: str, q: np.ndarray, scales: np.ndarray | None = None, dtype=np.float64) -> np.ndarray:
    """The spec: q (rows, in) of format `fmt` (and its scales (rows, in / block) for int8) -> weights (rows, in)."""
    if fmt == "bfloat16":
        return (q.astype(np.uint32) << 16).view(np.float32).astype(dtype)
    if fmt == "int8":
        rows, in_features = q.shape
        n_blocks = scales.shape[1]
        w = q.reshape(rows, n_blocks, in_features // n_blocks) * scales.astype(np.float64)[:, :, None]  # exact
        return w.reshape(rows, in_features).astype(dtype, copy=False)
    raise ValueError(f"dequantize: unknown format {fmt!r}; choose one of {FORMATS}")


def format_problem(fmt: str, data, scales) -> str | None:
    """What keeps (data, scales) from being format `fmt` as `quantize_int8` / `quantize_bfloat16` make it, in words;
    None when nothing does. Checked for every QuantizedWeight: a hand-made one, a file's, quantize's own output."""
    if fmt not in FORMATS:
        return f"unknown format {fmt!r}; choose one of {FORMATS}"
    want = np.int8 if fmt == "int8" else np.uint16
    if not (isinstance(data, np.ndarray) and data.ndim == 2 and data.dtype == want and data.flags.c_contiguous):
        return (f"{fmt} data must be a C-contiguous 2-D {np.dtype(want)} array, got "
                f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}")
    if fmt == "bfloat16":
        if scales is not None:
            return "bfloat16 weights have no scales"
        step = _slab_rows(max(data.shape[1], 1))                        # temporaries of slabs, not of the matrix
        if any(((data[lo:lo + step] & 0x7F80) == 0x7F80).any() for lo in range(0, data.shape[0], step)):
            return "bfloat16 data holds inf or NaN bits"                 # (exponent all ones)
        return None
    rows, in_features = data.shape
    if not (isinstance(scales, np.ndarray) and scales.ndim == 2 and scales.dtype == np.float32
            and scales.flags.c_contiguous and scales.shape[0] == rows and 0 < scales.shape[1] <= max(in_features, 1)
            and in_features % scales.shape[1] == 0):
        return (f"int8 scales must be a C-contiguous float32 array (rows {rows}, in / block) with in ({in_features}) "
                f"a multiple of its columns, got {getattr(scales, 'dtype', type(scales).__name__)} "
                f"{getattr(scales, 'shape', '')}")
    with np.errstate(over="ignore"):        # 127 steps of the scale must be a float32: the weight q * s dequantized
        widest = scales * np.float32(127)
    if not (np.isfinite(widest).all() and (scales >= 0).all() and not np.signbit(scales).any()):
        return ("int8 scales must be finite, >= 0 and at most float32's max / 127 (a weight past float32's range, or "
                "at its very edge, makes a scale whose 127 steps are inf: the weight would dequantize to inf)")
    if data.size and data.min() == -128:
        return "int8 data holds -128 (the format clips to [-127, 127])"
    blocks = data.reshape(rows, scales.shape[1], -1)                                      # (rows, nb, block)
    peak = np.maximum(blocks.max(axis=2, initial=0).astype(np.int16), -blocks.min(axis=2, initial=0).astype(np.int16))
    normal = scales >= np.finfo(np.float32).tiny                        # a subnormal scale may round its peak off
    if (normal & (peak != 127)).any() or ((scales == 0) & (peak != 0)).any():
        return "int8 blocks must each hold a weight of |q| = 127 when their scale is > 0, and only zeros when it is 0"
    return None


class QuantizedWeight:
    """A quantized (out, in) matrix: `data` (out, in) int8 or uint16, `scales` (out, in / block) float32 for
    int8 (None for bfloat16). Immutable once made (the decoder keeps references to its arrays)."""

    def __init__(self, fmt: str, data: np.ndarray, scales: np.ndarray | None = None):
        problem = format_problem(fmt, data, scales)
        if problem:  # the kernels index without bounds checks: a wrong shape read past the arrays, no error
            raise ValueError(f"QuantizedWeight: {problem}")
        self.format, self.data, self.scales = fmt, data, scales
        self.shape = data.shape
        self.block = None if scales is None else data.shape[1] // scales.shape[1]

    @classmethod
    def from_float(cls, w: np.ndarray, fmt: str, block: int = DEFAULT_BLOCK) -> QuantizedWeight:
        if fmt == "int8":
            return cls(fmt, *quantize_int8(w, block))
        if fmt == "bfloat16":
            return cls(fmt, quantize_bfloat16(w))
        raise ValueError(f"quantize: unknown format {fmt!r}; choose one of {FORMATS}")

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def rows(self, start: int, stop: int, dtype=np.float64) -> np.ndarray:
        """Rows start:stop dequantized (rows, in): `dequantize`'s bits, by its numba twin for float32 / float64."""
        data = self.data[start:stop]
        scales = None if self.scales is None else self.scales[start:stop]
        if np.dtype(dtype) not in (np.float32, np.float64):
            return dequantize(self.format, data, scales, dtype)
        out = np.empty(data.shape, dtype)                               # (rows, in)
        if scales is None:
            bfloat16_dequantized(data, out)
        else:
            int8_dequantized(data, scales, out)
        return out

    def take(self, ids: np.ndarray, dtype) -> np.ndarray:
        """Rows ids (...) dequantized: (..., in) (an embedding lookup). The ids as nn.Embedding takes them, integers in
        [0, rows): a -1 read the last padded row."""
        flat = np.asarray(ids).reshape(-1)
        if flat.dtype.kind not in "iu" or (flat.size and (flat.min() < 0 or flat.max() >= self.shape[0])):
            raise IndexError(f"QuantizedEmbedding: ids must be integers in [0, {self.shape[0]}), got dtype "
                             f"{flat.dtype}" + (f" min {flat.min()} max {flat.max()}" if flat.size else ""))
        scales = None if self.scales is None else self.scales[flat]
        return dequantize(self.format, self.data[flat], scales, dtype).reshape(*np.shape(ids), self.shape[1])

    def kernel_form(self):
        """What the numba decoder takes: (q, scales) for int8, the uint16 bits for bfloat16."""
        return self.data if self.scales is None else (self.data, self.scales)

    def product(self, x: np.ndarray) -> np.ndarray:
        """x (n, in) @ W^T -> (n, out) in x's dtype, through blocks of ROWS_PER_BLOCK dequantized rows, each
        product on the package's threads as the float model's (fast/products.py: np.matmul on OpenBLAS's own
        threads made a 512-token prompt at the 130M shape 1.1x slower than float32)."""
        if self.shape[0] <= ROWS_PER_BLOCK:
            return rows_product(x, self.rows(0, self.shape[0], x.dtype).T)
        out = np.empty((x.shape[0], self.shape[0]), x.dtype)
        for lo in range(0, self.shape[0], ROWS_PER_BLOCK):
            hi = min(lo + ROWS_PER_BLOCK, self.shape[0])
            out[:, lo:hi] = rows_product(x, self.rows(lo, hi, x.dtype).T)
        return out

    def __repr__(self):
        block = "" if self.block is None else f", block={self.block}"
        return f"QuantizedWeight({self.format}, {self.shape}{block})"


class _InferenceOnly(Function):
    """A quantized product's place in the graph: forward passes its output through; backward refuses, naming the
    module. Without it the product cut the graph, and a loss.backward() after model.quantize() failed with the
    engine's "does not require grad" (the quantized matrices are the model's last op) or, with a float tensor
    upstream requiring grad, trained what was left without a word. Saves nothing; records only when its input
    requires grad (Function.apply), so no_grad and generation build no graph."""

    def forward(self, x, *, product, module, fmt):
        self.module, self.fmt = module, fmt
        return product

    def backward(self, grad):
        raise RuntimeError(f"backward through {self.module!r}: its weights are {self.fmt} (model.quantize), for "
                           f"inference only, and no gradient flows through a quantized matrix; train or fine-tune "
                           f"the float model, then quantize it (run inference under tinygrad_ssm.no_grad() to "
                           f"build no graph)")


def _inference_only(x: Tensor, product: np.ndarray, module, fmt: str) -> Tensor:
    """product as the output of x's quantized product: a Tensor whose backward refuses (_InferenceOnly)."""
    return _InferenceOnly.apply(x, product=product, module=module, fmt=fmt)


class QuantizedLinear:
    """nn.Linear's interface (y = x W^T + b, x (..., in) -> (..., out)) on a QuantizedWeight. No gradients:
    a quantized model is for inference (a backward through it raises, naming the module)."""

    def __init__(self, linear, weight: QuantizedWeight):
        self.name, self.in_features, self.out_features = linear.name, linear.in_features, linear.out_features
        self.weight, self.bias, self.fused = weight, linear.bias, getattr(linear, "fused", False)

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(f"QuantizedLinear {self.name!r}: input must end with in_features={self.in_features}, "
                             f"got shape {x.shape}")
        y = self.weight.product(x.data.reshape(-1, self.in_features))  # (n, out)
        if self.bias is not None:
            y += self.bias.data
        return _inference_only(x, y.reshape(*x.shape[:-1], self.out_features), self.name, self.weight.format)

    def __repr__(self):
        return f"QuantizedLinear({self.name!r}, {self.weight})"


class QuantizedEmbedding:
    """nn.Embedding's interface on a QuantizedWeight (V, d): the lookup dequantizes the rows it picks; `attend`
    (the tied head) multiplies through blocks of rows."""

    def __init__(self, embedding, weight: QuantizedWeight, dtype):
        self.name, self.num_embeddings, self.dim = embedding.name, embedding.num_embeddings, embedding.dim
        self.weight, self.dtype, self.fused = weight, np.dtype(dtype), getattr(embedding, "fused", False)

    def __call__(self, ids) -> Tensor:
        ids = np.asarray(ids.data if isinstance(ids, Tensor) else ids)
        return Tensor(self.weight.take(ids, self.dtype))               # (..., d)

    def attend(self, x: Tensor) -> Tensor:
        """x (..., d) -> logits (..., V)."""
        y = self.weight.product(x.data.reshape(-1, self.dim))           # (n, V)
        return _inference_only(x, y.reshape(*x.shape[:-1], self.num_embeddings), self.name, self.weight.format)

    def __repr__(self):
        return f"QuantizedEmbedding({self.name!r}, {self.weight})"


def quantized_names(model) -> list[str]:
    """The parameters quantization replaces: every in_proj / out_proj weight, and the head (the embedding when
    tied)."""
    names = []
    for i in range(model.config.n_layer):
        names += [f"backbone.layers.{i}.mixer.in_proj.weight", f"backbone.layers.{i}.mixer.out_proj.weight"]
    names.append("backbone.embedding.weight" if model.config.tie_embeddings else "lm_head.weight")
    return names


def default_block(config) -> int:
    """The largest of 32, 24, 16 and 8 (DEFAULT_BLOCK down in steps of 8) that divides every quantized matrix's
    input size (d_model, d_inner): the decoder's int8 kernel reads those in vectors of 8 (d_model 360: block 24,
    where the largest divisor, 30, decoded 6x slower: 0.44 s against 0.071 for 200 tokens, one thread); else the
    largest block up to DEFAULT_BLOCK that divides them (d_model 36: 18), so that --weights int8 works on any
    model."""
    sizes = math.gcd(config.d_model, config.d_inner)
    vectors = [b for b in range(DEFAULT_BLOCK, 0, -8) if sizes % b == 0]
    return vectors[0] if vectors else next(b for b in range(DEFAULT_BLOCK, 0, -1) if sizes % b == 0)


def quantize_model(model, fmt: str, block: int | None = None, weights: dict | None = None):
    """In place: replace the modules of quantized_names(model) by quantized ones and drop their float arrays
    from the model's VarMap (what makes the memory smaller). `weights`: name -> QuantizedWeight already made
    (a quantized checkpoint's); otherwise made from the float parameters, int8 in blocks of `block` weights
    (None: default_block). Returns the model."""
    if fmt not in FORMATS:
        raise ValueError(f"quantize: format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "bfloat16" and block is not None:  # it was ignored without a word
        raise ValueError(f"quantize: block applies to int8 (a scale per block of weights); bfloat16 has none: leave "
                         f"block out, got block={block!r}")
    if block is None:
        block = default_block(model.config)
        if fmt == "int8" and block % 8:   # no block of 8, 16, 24 or 32 divides the model's widths (d_model 36: 18)
            warnings.warn(f"quantize: int8 in blocks of {block} weights (d_model {model.config.d_model} and d_inner "
                          f"{model.config.d_inner} share no multiple of 8 up to {DEFAULT_BLOCK}): decoding them "
                          f"takes no vectors, several times slower than float32 (docs/kernels.md)"
                          f"{', and their scales make the weights no smaller than bfloat16' if block < 8 else ''}; "
                          f"bfloat16 has neither cost", RuntimeWarning, stacklevel=3)
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"quantize: block must be a positive int, got {block!r}")
    block = int(block)   # np.uint8(16): NumPy 2 kept its arithmetic in uint8, an OverflowError past 255
    if fmt == "int8" and (model.config.d_model % block or model.config.d_inner % block):
        raise ValueError(f"quantize: block {block} does not divide the input sizes of the quantized matrices "
                         f"(d_model {model.config.d_model}, d_inner {model.config.d_inner}); leave block out to "
                         f"take {default_block(model.config)}, the largest up to {DEFAULT_BLOCK} that does")
    if getattr(model, "weights_format", "float") != "float":
        raise ValueError(f"quantize: the model is already quantized ({model.weights_format}); load or build a float "
                         f"model to quantize it again")
    names = quantized_names(model)
    if weights is None:  # a NaN or inf would make its int8 block's scale NaN and every weight of it 0, and save a
        bad = non_finite_problems((name, model.varmap[name].data) for name in names)   # folder no load accepts
        if bad:
            raise ValueError(f"quantize: {'; '.join(bad[:3])}: a quantized matrix holds finite weights only; "
                             f"nothing was changed (find where the weights went non-finite, or load a good "
                             f"checkpoint)")
    made = {}
    for name in names:                                                   # check everything, then change anything
        try:
            made[name] = weights[name] if weights is not None else QuantizedWeight.from_float(
                model.varmap[name].data, fmt, block)
        except ValueError as e:  # finite weights past float32's range: an inf scale, bfloat16's inf bits
            raise ValueError(f"quantize: {name}: {str(e).removeprefix('QuantizedWeight: ')}; nothing was changed "
                             f"(a weight that large is beyond what {fmt} holds: keep the model in float)") from None
    for layer, i in zip(model.layers, range(model.config.n_layer)):
        mixer, prefix = layer.mixer, f"backbone.layers.{i}.mixer."
        mixer.in_proj = QuantizedLinear(mixer.in_proj, made[prefix + "in_proj.weight"])
        mixer.out_proj = QuantizedLinear(mixer.out_proj, made[prefix + "out_proj.weight"])
    if model.config.tie_embeddings:
        model.embedding = QuantizedEmbedding(model.embedding, made["backbone.embedding.weight"], model.dtype)
    else:
        model.lm_head = QuantizedLinear(model.lm_head, made["lm_head.weight"])
    for name in made:  # (VarMap has no public remove: its dict is the one place the float arrays are held)
        model.varmap._vars.pop(name)
    model.quantized, model.weights_format = made, fmt
    model.__dict__.pop("_decode_weights", None)                         # the decoder takes the new arrays
    return model


def resident_weight_bytes(model) -> int:
    """Bytes of the model's weights in memory: the float parameters left plus the quantized arrays."""
    quantized = getattr(model, "quantized", {})
    return sum(t.data.nbytes for t in model.varmap.all_vars()) + sum(w.nbytes for w in quantized.values())
