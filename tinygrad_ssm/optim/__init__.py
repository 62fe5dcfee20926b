"""Optimizers keyed by parameter name (state saves beside the weights), gradient clipping, LR schedule."""
from .adam import Adam, AdamW
from .clip import clip_grad_norm_
from .optimizer import Optimizer
from .schedule import WarmupCosine
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm_", "WarmupCosine"]
