"""Models built on the engine: Mamba-2 (mixer, language model, decoding, pretrained checkpoints)."""
from .config import Mamba2Config
from .mamba2 import Mamba2Block, Mamba2Cache, Mamba2LMHeadModel, Mamba2Mixer

__all__ = ["Mamba2Config", "Mamba2Mixer", "Mamba2Block", "Mamba2LMHeadModel", "Mamba2Cache"]
