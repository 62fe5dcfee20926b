"""Whether the numba decoder (decode.py) may decode a model: it reads the weights of the package's own layers and
computes what their calls compute, so a module of another class in their place (a LoRA wrapper around in_proj, an
adapter around lm_head, a subclass with its own __call__) would be read for its `.weight` and skipped: tokens of
another model, no error. Such a model decodes through the layers' own calls (fused=False) instead."""
from __future__ import annotations

from ... import nn
from .quantize import QuantizedEmbedding, QuantizedLinear


def check_decodable(model) -> None:
    """Raise a ValueError naming the first module the decoder would read that is not of the class it computes
    (exact classes: a subclass may call otherwise), and the fix."""
    block_class = type(model).block_class                               # model.py's Mamba2Block, Mamba2Mixer
    mixer_class = block_class.mixer_class
    wanted = [("backbone.embedding", model.embedding, (nn.Embedding, QuantizedEmbedding)),
              ("lm_head", model.lm_head, (nn.Linear, QuantizedLinear, type(None))),
              ("backbone.norm_f", model.norm_f, (nn.RMSNorm,))]
    for i, layer in enumerate(model.layers):
        where, mixer = f"backbone.layers.{i}", getattr(layer, "mixer", None)
        wanted += [(where, layer, (block_class,)), (f"{where}.norm", getattr(layer, "norm", None), (nn.RMSNorm,)),
                   (f"{where}.mixer", mixer, (mixer_class,))]
        if type(mixer) is mixer_class:
            wanted += [(f"{where}.mixer.{name}", getattr(mixer, name), kinds) for name, kinds in
                       (("in_proj", (nn.Linear, QuantizedLinear)), ("conv1d", (nn.CausalDepthwiseConv1d,)),
                        ("norm", (nn.GatedRMSNorm,)), ("out_proj", (nn.Linear, QuantizedLinear)))]
    for where, module, kinds in wanted:
        if type(module) not in kinds:
            raise ValueError(f"decoding: {where} is a {type(module).__name__}, not a {kinds[0].__name__}: the fused "
                             f"decoder computes the package's own layers from their weights and would skip its "
                             f"call; decode through the layers' own calls with model.fused = False (or build the "
                             f"model with fused=False)")
