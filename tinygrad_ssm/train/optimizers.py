"""A run's optimizers: AdamW in two groups (weight decay on the matrices only), and their state as one flat
dict of arrays for a checkpoint's optimizer.safetensors ("decay/state/NAME/exp_avg", "decay/hparams/0/lr", ...).

Two AdamW objects named "decay" and "no_decay", not one with two param_groups (which optim/ now takes): the
checkpoints of every run so far are keyed by those names, as are the MPI broadcast of the states and the files
the tests hold; one optimizer would need a translation of each old key to its group index, for no change in a
step (the same update, the same bits)."""
from __future__ import annotations

import numpy as np

from ..optim import AdamW
from .config import TrainConfig


def build_optimizers(model, cfg: TrainConfig) -> dict:
    """AdamW with weight decay on matrices (ndim >= 2) only; vectors (norm weights, biases, A_log, D, dt_bias)
    are not decayed (as mamba_ssm and nanoGPT do): pulling them to 0 has no regularising meaning."""

    named = model.varmap.named_vars()
    groups = {"decay": [(n, p) for n, p in named if p.ndim >= 2],
              "no_decay": [(n, p) for n, p in named if p.ndim < 2]}
    return {name: AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                        weight_decay=cfg.weight_decay if name == "decay" else 0.0)
            for name, params in groups.items() if params}


def flat_optimizer_state(optimizers: dict) -> dict:
    flat = {}
    for group, opt in optimizers.items():
        for key, value in opt.state_dict().items():
            flat[f"{group}/{key}"] = np.asarray(value)
    return flat


def load_flat_optimizer_state(optimizers: dict, flat: dict, source: str = "the optimizer state") -> None:
    """flat_optimizer_state's dict back into `optimizers`; a key of no optimizer, or a state one refuses, is a
    ValueError naming `source` (the file) and the key with its optimizer's prefix."""
    strays = sorted(k for k in flat if k.partition("/")[0] not in optimizers)
    if strays:
        raise ValueError(f"{source} does not fit this run's optimizers ({', '.join(optimizers)}): unexpected "
                         f"key{'s' * (len(strays) > 1)} {', '.join(map(repr, strays[:3]))}")
    for group, opt in optimizers.items():
        prefix = f"{group}/"
        try:
            opt.load_state_dict({k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)})
        except (TypeError, ValueError) as e:   # its message names the keys without the prefix
            raise ValueError(f"{source} does not fit this run's optimizers: its keys {prefix!r}...: {e}") from e
