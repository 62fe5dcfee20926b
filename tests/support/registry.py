"""A small registry layout and a hand-written safetensors file, for the registry's tests (tests/test_registry.py,
tests/test_registry_checkpoints.py)."""
import json
import math
import struct

from tinygrad_ssm import VarBuilder
from tinygrad_ssm.nn import init


def declare_small_layout(varmap, dtype="float32"):
    """Declares four variables the way a model's layers do: embedding.weight, layers.0.{weight,bias}, norm.weight."""
    vb = VarBuilder.from_varmap(varmap, dtype)
    vb.pp("embedding").get((10, 4), "weight", init=init.Randn(0, 0.02))
    layer = vb.pp("layers").pp(0)
    layer.get((6, 4), "weight", init=init.KaimingUniform(a=math.sqrt(5)))
    layer.get((6,), "bias", init=init.Const(0.0))
    vb.pp("norm").get((4,), "weight", init=init.Const(1.0))
    return vb


def write_raw_safetensors(path, entries, metadata=None):
    """entries: name -> (tag, shape, raw bytes); written by hand so tests control every byte."""
    header, data, offset = {}, b"", 0
    for name, (tag, shape, raw) in entries.items():
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + data)
