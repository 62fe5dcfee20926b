"""Layers built from a VarBuilder that is already prefixed with the layer's name; each creates its
parameters under the official names ("weight", "bias") and is called as `layer(x)`."""
from .conv import CausalDepthwiseConv1d
from .linear import Embedding, Linear
from .module import IncompatibleKeys, Module
from .norm import GatedRMSNorm, RMSNorm

__all__ = ["Linear", "Embedding", "RMSNorm", "GatedRMSNorm", "CausalDepthwiseConv1d", "Module", "IncompatibleKeys"]
