"""Mamba-2 (Dao & Gu, 2024) with the official parameter names: its config, the mixer and the language model
(model.py), numba decoding (decode.py), sampling, and loading of mamba_ssm and transformers checkpoints
(pretrained.py)."""
from .config import Mamba2Config
from .model import Mamba2Block, Mamba2Cache, Mamba2LMHeadModel, Mamba2Mixer

__all__ = ["Mamba2Config", "Mamba2Mixer", "Mamba2Block", "Mamba2LMHeadModel", "Mamba2Cache"]
