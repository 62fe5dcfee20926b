"""Quantized models on disk (quantize.py gives the formats): `save_pretrained` of a quantized model writes
config.json with a "quantization" entry, the float parameters, each quantized matrix (int8, or the bfloat16 bits as
U16) and its scales; `from_pretrained` of such a folder checks every stored tensor before it builds the model.
model.py chooses between this and pretrained.py by the config's "quantization" key, so neither imports the other.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...io.atomic_write import write_atomic
from ...io.checkpoints import read_newest
from ...io.safetensors import STORED_DTYPES, SafetensorsFile, save_file
from ...registry import VarMap
from .checkpoint_config import (TOKEN_ID_KEYS, PretrainedError, token_id, mamba_ssm_config, parse_config, read_config)
from .pretrained import (GENERATION_CONFIG_NAME, LAYOUTS, WEIGHTS_NAME, load_pretrained, prepare_save_folder, read_finite,
                         resolve_pretrained_folder, save_config_and_weights, save_pretrained)
from .quantize import FORMATS, QuantizedWeight, quantize_model, quantized_names

QUANTIZATION_KEY = "quantization"   # config.json: {"weights": "int8" | "bfloat16", "block": int (int8)}
SCALES_SUFFIX = ".scales"           # name.scales (out, in / block) float32 next to name (out, in) int8
_STORED = {"int8": "I8", "bfloat16": "U16"}


def save_quantized(model, directory) -> None:
    """config.json (with "quantization") and model.safetensors: the float parameters, each quantized matrix
    under its own name (int8, or the bfloat16 bits as U16) and, for int8, its scales under name + ".scales".
    Checked as a float model's save is (pretrained.prepare_save_folder: no file written through a link or over
    another program's config.json, no non-finite float parameter or scale) before anything is written."""
    arrays = {name: t.data for name, t in model.varmap.named_vars()}
    for name, w in model.quantized.items():
        arrays[name] = w.data
        if w.scales is not None:
            arrays[name + SCALES_SUFFIX] = w.scales
    directory = prepare_save_folder(directory, arrays.items())
    first = next(iter(model.quantized.values()))
    config = mamba_ssm_config(model.config) | {QUANTIZATION_KEY: {"weights": model.weights_format,
                                                                  "block": first.block}}
    save_config_and_weights(directory, json.dumps(config, indent=2),
                            lambda: save_file(directory / WEIGHTS_NAME, arrays, metadata={"format": "pt"}))


def load_quantized(cls, directory, raw: dict, dtype, backend, fused):
    """from_pretrained of a folder save_quantized wrote: every stored tensor checked (names, shapes, dtypes,
    scales finite and >= 0) before the model is built, as pretrained.load_pretrained does."""
    opened = []  # the weight file, closed when the load ends, failed or not (a kept error kept it open)
    try:
        return _load_quantized(cls, directory, raw, dtype, backend, fused, opened)
    finally:
        for f in opened:
            f.close()


def _load_quantized(cls, directory, raw: dict, dtype, backend, fused, opened: list):
    raw = dict(raw)
    spec = raw.pop(QUANTIZATION_KEY)
    fmt = spec.get("weights") if isinstance(spec, dict) else None
    block = spec.get("block") if isinstance(spec, dict) else None
    if fmt not in FORMATS or set(spec) - {"weights", "block"} or (  # another key: another format, not this one
            fmt == "int8" and not (isinstance(block, int) and not isinstance(block, bool) and block >= 1)) or (
            fmt == "bfloat16" and block is not None):
        raise PretrainedError(f"from_pretrained: {directory}/config.json: {QUANTIZATION_KEY!r} must be "
                              f'{{"weights": one of {FORMATS}, "block": a positive int for int8, null for bfloat16 '
                              f'(no other key)}}, '
                              f'got {spec!r}')
    config, _ = parse_config(raw)
    path = f"{directory}/{WEIGHTS_NAME}"
    f = SafetensorsFile(path)
    opened.append(f)
    shapes = config.param_shapes()
    probe = type("Probe", (), {"config": config})()
    names = set(quantized_names(probe))
    expected = set(shapes) | {n + SCALES_SUFFIX for n in names if fmt == "int8"}
    if set(f.tensors) != expected:
        stored = set(f.tensors)
        raise PretrainedError(f"from_pretrained: {path!r} ({fmt} weights): missing {sorted(expected - stored)[:5]}, "
                              f"unexpected {sorted(stored - expected)[:5]}")
    made = {}
    for name, shape in shapes.items():
        info = f.tensors[name]
        want = _STORED[fmt] if name in names else None
        if tuple(info.shape) != tuple(shape) or (want is not None and info.dtype != want) or \
                (want is None and not info.is_float):
            raise PretrainedError(f"from_pretrained: {path!r}: tensor {name!r} has dtype {info.dtype} shape "
                                  f"{tuple(info.shape)}, expected {want or 'a float dtype'} {tuple(shape)}")
        if name not in names:
            continue
        scales = None
        if fmt == "int8":
            key = name + SCALES_SUFFIX
            s_info = f.tensors[key]
            if s_info.dtype != "F32" or shape[1] % block or tuple(s_info.shape) != (shape[0], shape[1] // block):
                raise PretrainedError(f"from_pretrained: {path!r}: tensor {key!r} has dtype {s_info.dtype} shape "
                                      f"{tuple(s_info.shape)}, expected F32 ({shape[0]}, {shape[1]} / block {block})")
            scales = f.read(key)
            if not (np.isfinite(scales).all() and (scales >= 0).all()):
                raise PretrainedError(f"from_pretrained: {path!r}: tensor {key!r} holds a NaN, infinite or negative "
                                      f"scale (the file is corrupt: quantize the float model again)")
        made[name] = (name, scales)
    model = cls(config, VarMap.uninitialised(), dtype=dtype, backend=backend, fused=fused)
    weights = {}
    for name, (_, scales) in made.items():  # the format's invariants too: bfloat16 inf / NaN bits, int8 q = -128
        try:
            weights[name] = QuantizedWeight(fmt, f.read(name), scales)
        except ValueError as e:
            why = str(e).removeprefix("QuantizedWeight: ")
            raise PretrainedError(f"from_pretrained: {path!r}: tensor {name!r}: {why} (the file is corrupt or was not "
                                  f"written by save_pretrained: quantize the float model again)") from None
    for name in shapes:
        if name not in names:
            read_finite(model.varmap, name, f, name, directory)
    return quantize_model(model, fmt, block, weights=weights)


def load_model_folder(cls, directory, dtype="float32", backend: str = "auto", fused: bool = True):
    """Mamba2LMHeadModel.from_pretrained: a quantized folder (its config.json has "quantization") or any other; a
    run folder's newest checkpoint, again if a save beside the load moved LATEST on (io/checkpoints.py)."""
    return read_newest(directory, lambda path: _load_model_folder(cls, path, dtype, backend, fused))


def _load_model_folder(cls, directory, dtype, backend, fused):
    folder = resolve_pretrained_folder(directory)
    raw = read_config(folder)
    if QUANTIZATION_KEY in raw:
        model = load_quantized(cls, folder, raw, dtype, backend, fused)
    else:
        model = load_pretrained(cls, folder, dtype=dtype, backend=backend, fused=fused)
    # what save_pretrained writes again, as transformers' load and save keep them: a transformers config.json's
    # token ids (ids of the vocabulary only) and the folder's generation_config.json
    V = model.config.padded_vocab_size
    model.token_ids = {k: v for k in TOKEN_ID_KEYS if (v := token_id(raw.get(k), V)) is not None}
    try:   # (one that is no JSON object is left out: generate names it, reading it as its defaults; a named pipe
        generation = folder / GENERATION_CONFIG_NAME          # there, read, waited for ever: a regular file only)
        stated = json.loads(generation.read_text(encoding="utf-8")) if generation.is_file() else None
    except (OSError, ValueError):
        stated = None
    model.generation_config = stated if isinstance(stated, dict) else None
    return model


def save_model_folder(model, directory, layout: str = "mamba_ssm", token_ids: dict | None = None,
                      dtype: str | None = None) -> None:
    """Mamba2LMHeadModel.save_pretrained: the quantized format for a quantized model (mamba_ssm's layout with a
    "quantization" entry, which only this package reads), else pretrained.py's in `layout` and `dtype`."""
    if layout not in LAYOUTS:
        raise ValueError(f"save_pretrained: layout must be one of {LAYOUTS}, got {layout!r}")
    if dtype is not None and dtype not in STORED_DTYPES:
        raise ValueError(f"save_pretrained: dtype must be one of {', '.join(STORED_DTYPES)} or None (each weight "
                         f"in its own dtype), got {dtype!r}")
    if token_ids and layout != "transformers":   # a quantized model's folder (mamba_ssm's layout) dropped them
        raise ValueError("save_pretrained: token_ids go into transformers' config.json only (mamba_ssm's "
                         "MambaConfig has no such keys); pass layout='transformers' or leave token_ids out")
    extra = [name for name in model.varmap.names() if name not in model.config.param_shapes()]
    if extra:  # from_pretrained refuses a weight its config does not describe: the folder would never load
        raise ValueError(f"save_pretrained: the model's VarMap also holds {', '.join(extra[:3])}"
                         f"{', ...' if len(extra) > 3 else ''} ({len(extra)} variables the model does not have: "
                         f"another model's built on the same VarMap, or parameters of your own such as an adapter's); "
                         f"a folder with them would not load, so nothing was written: keep them in a VarMap of their "
                         f"own (VarBuilder.from_varmap(VarMap(), ...); its save() writes them), or build the model on "
                         f"a VarMap of its own")
    if getattr(model, "quantized", None):
        if dtype is not None:
            raise ValueError(f"save_pretrained: the model's matrices are quantized ({model.weights_format}) and are "
                             f"stored in that format; dtype={dtype!r} applies to a float model: leave it out, or "
                             f"save the float model it was quantized from")
        if layout != "mamba_ssm":  # transformers' Mamba2 reads float weights only: no int8 + scales, no U16 bits
            raise PretrainedError(f"save_pretrained: the model's weights are quantized ({model.weights_format}), "
                                  f"which transformers' Mamba2ForCausalLM cannot read; nothing was written to "
                                  f"{str(directory)!r}: save the float model it was quantized from (load its folder "
                                  f"without quantizing) with layout={layout!r}")
        save_quantized(model, directory)
        _write_generation_config(model, directory)
        return
    # a float model writes its VarMap: quantizing another model on the same VarMap dropped float arrays from it
    missing = [name for name in quantized_names(model) if name not in model.varmap]
    if missing:
        raise ValueError(f"save_pretrained: the model's VarMap lacks {', '.join(missing[:3])}"
                         f"{', ...' if len(missing) > 3 else ''} ({len(missing)} weights): another model on the same "
                         f"VarMap was quantized, which drops their float arrays from it; nothing was written")
    if token_ids is None and layout == "transformers":
        token_ids = getattr(model, "token_ids", None)                   # those of the folder it was loaded from
    save_pretrained(model, directory, layout=layout, token_ids=token_ids, dtype=dtype)
    _write_generation_config(model, directory)


def _write_generation_config(model, directory) -> None:
    """model.generation_config (a dict: the loaded folder's generation_config.json, or one set by hand) into the
    saved folder, as transformers' save_pretrained writes its model's; None writes none."""
    stated = getattr(model, "generation_config", None)
    if stated is not None:
        if not isinstance(stated, dict):
            raise ValueError(f"save_pretrained: model.generation_config must be a dict (the keys of "
                             f"{GENERATION_CONFIG_NAME}) or None, got {type(stated).__name__}")
        write_atomic(Path(directory) / GENERATION_CONFIG_NAME, json.dumps(stated, indent=2) + "\n")
