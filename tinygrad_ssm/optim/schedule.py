"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""
from __future__ import annotations

import math

from ..autograd.args import is_integer, is_real_number


class WarmupCosine:
    """lr(step), steps counted from 0:
        step < warmup_steps:                  lr * (step + 1) / warmup_steps   (never 0; reaches lr at the end)
        warmup_steps <= step <= total_steps:  min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2,
                                              progress = (step - warmup_steps) / (total_steps - warmup_steps)
        step > total_steps:                   min_lr"""

    def __init__(self, lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0):
        for name, value in (("lr", lr), ("min_lr", min_lr)):          # a str compared with a float, an inf lr
            if not is_real_number(value) or not math.isfinite(value):
                raise ValueError(f"WarmupCosine: {name} must be a finite number, got {value!r}")
        for name, value in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
            if not is_integer(value):
                raise ValueError(f"WarmupCosine: {name} must be an int, got {value!r}")
        if not (0 <= warmup_steps <= total_steps):
            raise ValueError(f"WarmupCosine: need 0 <= warmup_steps <= total_steps, got {warmup_steps}, {total_steps}")
        if not (0 <= min_lr <= lr):
            raise ValueError(f"WarmupCosine: need 0 <= min_lr <= lr, got min_lr={min_lr}, lr={lr}")
        self.lr, self.warmup_steps, self.total_steps, self.min_lr = lr, warmup_steps, total_steps, min_lr

    def __call__(self, step: int) -> float:
        if not is_integer(step) or step < 0:                             # step NaN gave lr NaN
            raise ValueError(f"WarmupCosine: step must be an int >= 0, got {step!r}")
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if step >= self.total_steps:
            return self.min_lr
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def __repr__(self):
        return (f"WarmupCosine(lr={self.lr}, warmup_steps={self.warmup_steps}, total_steps={self.total_steps}, "
                f"min_lr={self.min_lr})")



