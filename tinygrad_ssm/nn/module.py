"""torch's nn.Module methods for a model whose parameters all live in one VarMap (`self.varmap`), so that a
training loop written for torch runs as written: parameters, named_parameters, zero_grad, state_dict,
load_state_dict, train / eval.

The VarMap stays the one place parameters are made and named (registry.py); these methods only read it."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..autograd.backward import zero_grads
from ..autograd.tensor import Tensor
from ..registry import CheckpointError


class IncompatibleKeys(NamedTuple):
    """What `load_state_dict(strict=False)` left alone, as torch's: names the model has and the dict lacks, and
    names the dict has and the model lacks."""
    missing_keys: list
    unexpected_keys: list


class Module:
    """Mixed into a model that sets `self.varmap`. `training` is torch's flag: Mamba-2 has no dropout and no
    batch statistics, so `train()` and `eval()` change no result; they are here so torch code runs unchanged
    (`eval()` does not stop gradients, in torch neither: use `no_grad()`)."""

    training = True

    def parameters(self) -> list[Tensor]:   # torch's; a list: an optimizer and clip_grad_norm_ may each read it
        return self.varmap.all_vars()

    def named_parameters(self) -> list[tuple[str, Tensor]]:            # (official name, parameter), as torch's
        return self.varmap.named_vars()

    tied_weights: dict = {}    # name a state dict may hold -> the parameter it is (the model sets it when tied)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every parameter's .grad set to None (or zeroed in place, set_to_none=False), as torch's."""
        zero_grads(self.varmap.named_vars(), set_to_none, "zero_grad")

    def train(self, mode: bool = True):
        if not isinstance(mode, bool):
            raise ValueError(f"train: mode must be True or False, got {mode!r}")   # torch's ValueError
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def state_dict(self) -> dict[str, np.ndarray]:
        """name -> a copy of each parameter's array, under the official names (safetensors' save_file takes it).
        Copies, where torch's share the parameters' memory: a state dict kept as the best weights stays so."""
        self._refuse_if_quantized("state_dict")
        return self.varmap.state_dict()

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy name -> array (or Tensor) into the parameters in place, as torch's: all checked before any is
        written (shapes, real numbers, values the parameter's dtype can hold); a wrong shape is refused even with
        strict=False, and strict=True refuses missing or unexpected names too (VarMap.load_state_dict)."""
        self._refuse_if_quantized("load_state_dict")
        missing, unexpected, _ = self.varmap.load_state_dict(self._without_tied_copies(state_dict), strict=strict)
        return IncompatibleKeys(missing, unexpected)

    def _without_tied_copies(self, state_dict):
        """The state dict less the copies of tied weights it holds (torch's state_dict of a tied model stores the
        head beside the embedding; strict refused it as unexpected): each must equal what it is a copy of."""
        copies = [n for n in self.tied_weights if hasattr(state_dict, "keys") and n in state_dict.keys()]
        for name in copies:
            source = self.tied_weights[name]
            if source in state_dict.keys():
                copy, value = (np.asarray(v.data if isinstance(v, Tensor) else v)
                               for v in (state_dict[name], state_dict[source]))
                if copy.shape != value.shape or not np.array_equal(copy, value, equal_nan=copy.dtype.kind == "f"):
                    raise CheckpointError(f"load_state_dict: {name!r} differs from {source!r}, but this model ties "
                                          f"them (the head is the embedding): these weights are an untied model's; "
                                          f"build the model with tie_embeddings=False, or leave {name!r} out")
        return {k: state_dict[k] for k in state_dict.keys() if k not in copies} if copies else state_dict

    def _refuse_if_quantized(self, what: str):
        quantized = getattr(self, "quantized", {})   # name -> QuantizedWeight, outside the VarMap (quantize.py)
        if quantized:
            raise TypeError(f"{what}: {len(quantized)} of this model's matrices are quantized "
                            f"({getattr(self, 'weights_format', '?')}) and live outside its parameters; "
                            f"save_pretrained(DIR) writes them all, from_pretrained(DIR) reads them back")
