"""Models built on the engine and the library: Mamba-2 (mamba2/)."""
from .mamba2 import Mamba2Block, Mamba2Cache, Mamba2Config, Mamba2LMHeadModel, Mamba2Mixer

__all__ = ["Mamba2Config", "Mamba2Mixer", "Mamba2Block", "Mamba2LMHeadModel", "Mamba2Cache"]
