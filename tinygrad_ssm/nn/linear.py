"""Linear and Embedding: the two layers that are a weight matrix."""
from __future__ import annotations

import math

from ..autograd import functional as F
from . import init
from .inputs import layer_input
from ..registry import VarBuilder
from ..autograd.tensor import Tensor
from ..fast import products, row_ops


class Linear:
    """y = x @ W^T + b, x (..., in) -> (..., out). Parameters "weight" (out, in) and, with bias, "bias" (out,).
    Default init is PyTorch's: weight KaimingUniform(a=sqrt(5)) = U(+-1/sqrt(in)), bias U(+-1/sqrt(in)).
    fused=True runs the product on the package's threads (fast/products.py), the twin of the engine's matmul."""

    def __init__(self, vb: VarBuilder, in_features: int, out_features: int, bias: bool = True,
                 weight_init=None, bias_init=None, fused: bool = False):
        self.name, self.in_features, self.out_features, self.fused = vb.prefix, in_features, out_features, fused
        self.weight = vb.get((out_features, in_features), "weight",      # checks the sizes are ints >= 0
                             init=weight_init or init.KaimingUniform(a=math.sqrt(5)))   # (out, in)
        bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
        self.bias = vb.get((out_features,), "bias", init=bias_init or init.Uniform(-bound, bound)) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        layer_input(f"Linear {self.name!r}", "input", x)
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(f"Linear {self.name!r}: input must end with in_features={self.in_features}, "
                             f"got shape {x.shape}")
        lead = x.shape[:-1]
        # one 2-d matmul over all leading axes: its weight gradient is a single (out, in) product, not a
        # per-batch stack summed afterwards
        matmul = products.matmul if self.fused else F.matmul
        y = matmul(F.reshape(x, (math.prod(lead), self.in_features)), self.weight.T)  # (n, out)
        if self.bias is not None:
            y = y + self.bias
        return F.reshape(y, (*lead, self.out_features))                 # (..., out)

    def __repr__(self):
        return f"Linear({self.name!r}, in={self.in_features}, out={self.out_features}, bias={self.bias is not None})"


class Embedding:
    """Rows of "weight" (V, d) picked by integer ids (...) -> (..., d). Init Normal(0, 0.02) (Mamba's).
    fused=True runs the fast twins of the engine's ops: the lookup's (fast/row_ops.py: the gradient's scatter-add
    in one loop) and, in `attend`, the product's (fast/products.py)."""

    def __init__(self, vb: VarBuilder, num_embeddings: int, dim: int, weight_init=None, fused: bool = False):
        self.name, self.num_embeddings, self.dim, self.fused = vb.prefix, num_embeddings, dim, fused
        self.weight = vb.get((num_embeddings, dim), "weight", init=weight_init or init.Randn(0.0, 0.02))  # (V, d)

    def __call__(self, ids) -> Tensor:
        embedding = row_ops.embedding if self.fused else F.embedding
        return embedding(ids, self.weight)                               # (..., d)

    def attend(self, x: Tensor) -> Tensor:
        """x (..., d) @ weight^T -> (..., V): the tied output head (logits over the vocabulary)."""
        layer_input(f"Embedding.attend {self.name!r}", "input", x)
        if x.shape[-1:] != (self.dim,):
            raise ValueError(f"Embedding.attend {self.name!r}: input must end with dim={self.dim}, got shape {x.shape}")
        lead = x.shape[:-1]
        matmul = products.matmul if self.fused else F.matmul
        y = matmul(F.reshape(x, (-1, self.dim)), self.weight.T)          # (n, V)
        return F.reshape(y, (*lead, self.num_embeddings))

    def __repr__(self):
        return f"Embedding({self.name!r}, {self.num_embeddings}, {self.dim})"
