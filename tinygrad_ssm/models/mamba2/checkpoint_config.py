"""A Mamba-2 checkpoint's config.json, in either layout real weights come in (pretrained.py's docstring), read into
a Mamba2Config and written back in either (one mapping of names per layout, read both ways): every key is read,
checked, or known to change nothing; a key that looks like a misspelling of a known one is refused, any other
unknown key warned of; a setting we do not compute is refused by name."""
from __future__ import annotations

import difflib
import json
import math
import re
import warnings
from pathlib import Path

import numpy as np

from ...io.file_checks import broken_link, require_regular_file
from .config import Mamba2Config

CONFIG_NAME = "config.json"
DEFAULT_EPS = 1e-5

# ssm_cfg keys that map one to one onto Mamba2Config fields
_SSM_FIELDS = ("d_state", "d_conv", "expand", "headdim", "ngroups", "chunk_size", "dt_min", "dt_max",
               "dt_init_floor", "dt_limit", "A_init_range", "bias", "conv_bias")
# ssm_cfg keys that only steer initialisation or the CUDA kernels: no effect on the function computed
_SSM_IGNORED = ("conv_init", "use_mem_eff_path", "layer_idx", "process_group", "sequence_parallel", "device", "dtype")
# (ssm_cfg key, the only value we implement)
_SSM_FIXED = (("rmsnorm", True), ("norm_before_gate", False), ("D_has_hdim", False), ("activation", "silu"))

# transformers name -> (Mamba2Config field, transformers' default)
_HF_FIELDS = {
    "hidden_size": ("d_model", None), "num_hidden_layers": ("n_layer", None), "vocab_size": ("vocab_size", None),
    "state_size": ("d_state", 128), "head_dim": ("headdim", 64), "n_groups": ("ngroups", 8),
    "expand": ("expand", 2), "conv_kernel": ("d_conv", 4), "chunk_size": ("chunk_size", 256),
    "use_bias": ("bias", False), "use_conv_bias": ("conv_bias", True), "layer_norm_epsilon": ("rms_norm_eps", 1e-5),
    "time_step_min": ("dt_min", 0.001), "time_step_max": ("dt_max", 0.1), "time_step_floor": ("dt_init_floor", 1e-4),
    "time_step_limit": ("dt_limit", (0.0, math.inf)), "tie_word_embeddings": ("tie_embeddings", False),
}


# transformers' config states the padded vocabulary alone (its vocab_size counts the padding rows); save_pretrained
# writes the real size beside it under this key (transformers keeps an unknown key as an attribute), so that a folder
# read back samples the same ids: without it, generate from the reloaded model also drew the padding rows. With the
# padded size it was written for: after transformers' resize_token_embeddings (vocab_size changed, this key not) it
# no longer applies and is left aside
UNPADDED_VOCAB_KEY = "unpadded_vocab_size"   # {"vocab_size": real, "padded": the vocab_size it was written beside}

# top-level keys each layout may hold that we read, check, or know to have no effect on the function computed
_MAMBA_SSM_KEYS = ("d_model", "d_intermediate", "n_layer", "vocab_size", "ssm_cfg", "attn_layer_idx", "attn_cfg",
                   "rms_norm", "residual_in_fp32", "fused_add_norm", "pad_vocab_size_multiple", "tie_embeddings",
                   "norm_epsilon")
_HF_OTHER_KEYS = (  # transformers' Mamba2Config and PretrainedConfig keys that do not change its logits
    "num_heads", "hidden_act", "rms_norm", "norm_before_gate", "initializer_range", "residual_in_fp32",
    "rescale_prenorm_residual", "time_step_rank", "use_cache", "pad_token_id", "bos_token_id", "eos_token_id",
    "model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path",
    "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "num_labels", "problem_type",
    "output_attentions", "output_hidden_states", "return_dict", "use_return_dict", "tokenizer_class",
    "sep_token_id", "decoder_start_token_id", "task_specific_params", "finetuning_task", "prefix",
    "_attn_implementation", "_commit_hash", "torchscript", "add_cross_attention", "tie_encoder_decoder",
    "is_decoder", "cross_attention_hidden_size", "pruned_heads", "max_length", "min_length", UNPADDED_VOCAB_KEY,
    "_attn_implementation_autoset", "_attn_implementation_internal", "attn_implementation", "cache_implementation")
# the keys a misspelling would lose something by (the others are ignored, by transformers too)
_HF_MEANINGFUL = (*_HF_FIELDS, "num_heads", "hidden_act", UNPADDED_VOCAB_KEY, "model_type")
MISSPELLING_CUTOFF = 0.8  # difflib ratio above which an unknown key is taken for a typo of a known one


class PretrainedError(ValueError):
    """A checkpoint directory whose config or weights do not describe a Mamba-2 model we can build."""


class IgnoredConfigKeysWarning(UserWarning):
    """config.json holds keys this loader does not know; they were ignored."""


class NotMambaSsmLoadableWarning(UserWarning):
    """save_pretrained wrote a mamba_ssm-layout config.json that mamba_ssm itself cannot load (a key only this
    package reads)."""


def check_config_keys(raw: dict, known, where: str, meaningful=None) -> None:
    """Refuse an unknown key that looks like a misspelling of a known one that changes the model (`meaningful`,
    default all of `known`: tie_embedding for tie_embeddings would silently load an untied checkpoint as tied);
    warn, naming every other unknown key (a key like one that is ignored anyway changes nothing either way)."""
    unknown = sorted(k for k in raw if k not in known)
    meaningful = tuple(known if meaningful is None else meaningful)
    typos = {k: difflib.get_close_matches(k, meaningful, n=1, cutoff=MISSPELLING_CUTOFF) for k in unknown}
    typos = {k: m[0] for k, m in typos.items() if m}
    if typos:
        raise PretrainedError(f"from_pretrained: {where}: " + "; ".join(
            f"unknown key {k!r} looks like a misspelling of {m!r}" for k, m in typos.items()) +
            " (fix the spelling: as written it would be ignored and the default used)")
    if unknown:
        hints = "".join(f"; {k!r} is {OTHER_NAMES[k][0]}'s name, this layout's is {OTHER_NAMES[k][1]!r}"
                        for k in unknown if k in OTHER_NAMES and OTHER_NAMES[k][1] in known)
        warnings.warn(f"from_pretrained: {where}: ignoring unknown keys {unknown} (they do not change the model "
                      f"that is built{hints})", IgnoredConfigKeysWarning, stacklevel=4)


# a key of another library's config -> (that library, the key this package reads for it), named where it is ignored
OTHER_NAMES = {"rms_norm_eps": ("Llama's and NemotronH's config", "layer_norm_epsilon")}


# --- config.json --------------------------------------------------------------------------------------------

def _decode_floats(obj: dict):
    """json object_hook: {"__float__": "Infinity"} (how some writers spell a non-finite float) -> float."""
    if set(obj) == {"__float__"}:
        return float(obj["__float__"])
    return obj


def read_config(directory) -> dict:
    path = Path(directory) / CONFIG_NAME
    if not path.exists():
        raise FileNotFoundError(f"from_pretrained: {broken_link(path) or repr(str(path)) + ' does not exist'}")
    require_regular_file(path, "from_pretrained: config", PretrainedError)  # a FIFO would block the read
    try:
        with open(path, encoding="utf-8") as f:  # the json module reads the bare tokens Infinity / NaN itself
            raw = json.load(f, object_hook=_decode_floats)
    except (ValueError, RecursionError) as e:  # (a nesting past Python's depth was a bare RecursionError)
        raise PretrainedError(f"from_pretrained: {str(path)!r} is not valid JSON ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None
    if not isinstance(raw, dict):
        raise PretrainedError(f"from_pretrained: {str(path)!r} must hold a JSON object")
    return raw


def _require(raw: dict, key: str, where: str):
    if key not in raw:
        raise PretrainedError(f"from_pretrained: {where} has no {key!r}")
    return raw[key]


def parse_config(raw: dict) -> tuple[Mamba2Config, str]:
    """A config.json's dict -> (Mamba2Config, layout), layout "mamba_ssm" or "transformers"."""
    if "d_model" in raw:
        return _parse_mamba_ssm(raw), "mamba_ssm"
    if "hidden_size" in raw:
        return _parse_transformers(raw), "transformers"
    if raw.get("model_type") == "mamba2":                               # transformers' layout, its size left out
        _require(raw, "hidden_size", "config.json (transformers layout: model_type 'mamba2')")
    if "ssm_cfg" in raw:                                                # mamba_ssm's
        _require(raw, "d_model", "config.json (mamba_ssm layout: it has 'ssm_cfg')")
    raise PretrainedError(f"from_pretrained: unknown config layout: neither 'd_model' (mamba_ssm) nor 'hidden_size' "
                          f"(transformers) in config.json (keys: {sorted(raw)})")


def _parse_mamba_ssm(raw: dict) -> Mamba2Config:
    where = "config.json (mamba_ssm layout)"
    misplaced = sorted(set(raw) & {*_SSM_FIELDS, *(k for k, _ in _SSM_FIXED), "layer", "d_ssm"})
    if misplaced:   # ignored with a warning before: a dt_limit there loaded a model without the clamp
        raise PretrainedError(f"from_pretrained: {where}: {misplaced} at the top level: mamba_ssm reads these "
                              f"settings of the mixer under 'ssm_cfg' only (its MambaConfig refuses them here); move "
                              f"them into 'ssm_cfg'")
    check_config_keys(raw, _MAMBA_SSM_KEYS, where)
    if raw.get("d_intermediate", 0) != 0:
        raise PretrainedError(f"from_pretrained: {where}: 'd_intermediate' = {raw['d_intermediate']} (MLP blocks) "
                              f"is not supported, only 0")
    if raw.get("attn_layer_idx"):
        raise PretrainedError(f"from_pretrained: {where}: 'attn_layer_idx' = {raw['attn_layer_idx']!r} (attention "
                              f"layers among the mixers) is not supported, only []")
    if raw.get("rms_norm", True) is not True:
        raise PretrainedError(f"from_pretrained: {where}: 'rms_norm' = false (LayerNorm) is not supported")
    if not isinstance(raw.get("ssm_cfg") or {}, dict):
        raise PretrainedError(f"from_pretrained: {where}: 'ssm_cfg' must be a JSON object, got {raw['ssm_cfg']!r}")
    ssm_cfg = dict(raw.get("ssm_cfg") or {})
    layer = ssm_cfg.pop("layer", "Mamba1")  # mamba_ssm's own default
    if layer != "Mamba2":
        raise PretrainedError(f"from_pretrained: {where}: 'ssm_cfg.layer' is {layer!r}; only 'Mamba2' is supported")
    for key, value in _SSM_FIXED:
        if key in ssm_cfg and ssm_cfg[key] != value:
            raise PretrainedError(f"from_pretrained: {where}: 'ssm_cfg.{key}' = {ssm_cfg[key]!r} is not supported "
                                  f"(only {value!r})")
    unknown = sorted(set(ssm_cfg) - set(_SSM_FIELDS) - set(_SSM_IGNORED) - {k for k, _ in _SSM_FIXED} - {"d_ssm"})
    if unknown:
        raise PretrainedError(f"from_pretrained: {where}: unknown 'ssm_cfg' keys {unknown}")
    kwargs = {key: ssm_cfg[key] for key in _SSM_FIELDS if key in ssm_cfg}
    for key in ("d_model", "n_layer", "vocab_size"):
        kwargs[key] = _require(raw, key, where)
    for key in ("pad_vocab_size_multiple", "tie_embeddings"):
        if key in raw:
            kwargs[key] = raw[key]
    kwargs["rms_norm_eps"] = raw.get("norm_epsilon", DEFAULT_EPS)
    names = ({key: f"ssm_cfg.{key}" for key in _SSM_FIELDS} | {"rms_norm_eps": "norm_epsilon"} |
             {key: key for key in ("d_model", "n_layer", "vocab_size", "pad_vocab_size_multiple", "tie_embeddings")})
    config = _build(kwargs, where, names)
    if ssm_cfg.get("d_ssm") not in (None, config.d_inner):
        raise PretrainedError(f"from_pretrained: {where}: 'ssm_cfg.d_ssm' = {ssm_cfg['d_ssm']} != d_inner "
                              f"{config.d_inner} is not supported")
    return config


def _parse_transformers(raw: dict) -> Mamba2Config:
    where = "config.json (transformers layout)"
    if raw.get("model_type", "mamba2") != "mamba2":  # Mamba-1 ("mamba"), a hybrid: other layers under these names
        architectures = raw.get("architectures")   # (before the keys: NemotronH's were named as misspellings)
        raise PretrainedError(f"from_pretrained: {where}: 'model_type' is {raw['model_type']!r}"
                              f"{f' (architectures {architectures})' if architectures else ''}, not 'mamba2': this "
                              f"package builds Mamba-2 (Mamba2ForCausalLM) only")
    check_config_keys(raw, tuple(_HF_FIELDS) + _HF_OTHER_KEYS, where, _HF_MEANINGFUL)
    # 'norm_before_gate' and 'rms_norm' are not read by transformers' Mamba2 (its gated norm is always gate first,
    # then RMSNorm: norm_before_gate=False is written into its code), so a value there does not change what it
    # computes: Mamba-Codestral's config.json says "norm_before_gate": true. They are ignored here too.
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        raise PretrainedError(f"from_pretrained: {where}: 'hidden_act' = {raw['hidden_act']!r} is not supported "
                              f"(only 'silu')")
    kwargs = {}
    for key, (field, default) in _HF_FIELDS.items():
        kwargs[field] = _require(raw, key, where) if default is None else raw.get(key, default)
    kwargs["pad_vocab_size_multiple"] = 1  # transformers stores the padded size itself
    entry, padded = raw.get(UNPADDED_VOCAB_KEY), kwargs["vocab_size"]
    if entry is not None:                         # ours: the real size, the padding to the stated vocab_size
        real, written_for = (entry.get("vocab_size"), entry.get("padded")) if isinstance(entry, dict) else (None, None)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (real, written_for, padded)) \
                or not 1 <= real <= written_for:
            raise PretrainedError(f"from_pretrained: {where}: '{UNPADDED_VOCAB_KEY}' = {entry!r} must be "
                                  f'{{"vocab_size": the real size, "padded": the vocab_size beside it}}; fix it or '
                                  f"remove the key")
        if written_for == padded:                 # else resized since: the stated vocab_size is the vocabulary
            kwargs["vocab_size"], kwargs["pad_vocab_size_multiple"] = real, padded
    config = _build(kwargs, where, {field: key for key, (field, _) in _HF_FIELDS.items()})
    num_heads = raw.get("num_heads", 128)
    if num_heads != config.nheads:
        raise PretrainedError(f"from_pretrained: {where}: 'num_heads' = {num_heads!r} but expand * hidden_size / "
                              f"head_dim = {config.nheads}")
    return config


def _build(kwargs: dict, where: str, names: dict) -> Mamba2Config:
    """Mamba2Config(**kwargs); its errors name the key as the file spells it (`names`: field -> key)."""
    try:
        return Mamba2Config(**kwargs)
    except (TypeError, ValueError) as e:
        message = str(e).removeprefix("Mamba2Config: ")
        # every field the message names, in one pass (d_inner = expand * d_model ... by headdim = 7)
        fields = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
        message = fields.sub(lambda m: repr(names[m.group(1)]), message)
        raise PretrainedError(f"from_pretrained: {where}: {message}") from None


def mamba_ssm_config(config: Mamba2Config) -> dict:
    """The mamba_ssm config.json of a Mamba2Config (the keys MambaConfig / Mamba2 accept)."""
    ssm_cfg = {"layer": "Mamba2"}
    for key in _SSM_FIELDS:
        value = getattr(config, key)
        ssm_cfg[key] = list(value) if isinstance(value, tuple) else value
    out = {"d_model": config.d_model, "d_intermediate": 0, "n_layer": config.n_layer, "vocab_size": config.vocab_size,
           "ssm_cfg": ssm_cfg, "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True,
           "fused_add_norm": True, "pad_vocab_size_multiple": config.pad_vocab_size_multiple,
           "tie_embeddings": config.tie_embeddings}
    if config.rms_norm_eps != DEFAULT_EPS:  # mamba_ssm hard-codes 1e-5; only a different value is written
        out["norm_epsilon"] = config.rms_norm_eps
    return out


TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def token_id(value, vocab_size: int):
    """A config's token id as JSON keeps it: an int of the vocabulary (a NumPy int as its int), or a non-empty list
    of them (transformers' eos_token_id may list several: a list was dropped on a load and save); else None."""
    if isinstance(value, (list, tuple)):
        ids = [token_id(v, vocab_size) for v in value]
        return ids if ids and all(isinstance(i, int) for i in ids) else None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and 0 <= value < vocab_size:
        return int(value)
    return None
# json.dumps spells inf as the bare token Infinity, which strict JSON readers refuse; transformers 5.24's own
# save_pretrained writes this, and its from_pretrained (like read_config) reads both back as inf
JSON_INFINITY = {"__float__": "Infinity"}


def transformers_config(config: Mamba2Config, dtype: str, token_ids: dict | None = None) -> dict:
    """The transformers config.json of a Mamba2Config (the keys of transformers' Mamba2Config, as its own
    save_pretrained writes them): _HF_FIELDS read backwards, vocab_size the padded vocabulary (transformers has no
    padding multiple), "dtype" the weights' (transformers' from_pretrained loads in it). `token_ids`: bos / eos /
    pad ids where known; each one not given is written null, since transformers' Mamba2Config otherwise takes
    bos 0, eos 2, pad 1, and its generate would stop at id 2. A_init_range, which only draws the initial A, has
    no key there and is left out (a model read back gets the default)."""
    out = {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"]}
    for key, (field, _) in _HF_FIELDS.items():
        value = getattr(config, field)
        out[key] = list(value) if isinstance(value, tuple) else value
    out["vocab_size"] = config.padded_vocab_size
    if config.vocab_size != config.padded_vocab_size:
        out[UNPADDED_VOCAB_KEY] = {"vocab_size": config.vocab_size, "padded": config.padded_vocab_size}
    out["time_step_limit"] = [JSON_INFINITY if math.isinf(v) else v for v in config.dt_limit]
    out |= {"num_heads": config.nheads, "hidden_act": "silu", "rms_norm": True, "residual_in_fp32": True,
            "dtype": dtype}
    token_ids = dict(token_ids or {})
    unknown = sorted(set(token_ids) - set(TOKEN_ID_KEYS))
    if unknown:
        raise ValueError(f"save_pretrained: token_ids may hold {', '.join(TOKEN_ID_KEYS)}, not {unknown}")
    for key in TOKEN_ID_KEYS:
        value = token_ids.get(key)
        if value is not None and token_id(value, config.padded_vocab_size) is None:
            raise ValueError(f"save_pretrained: token_ids[{key!r}] must be an id of the vocabulary (0 to "
                             f"{config.padded_vocab_size - 1}), a list of them, or None, got {value!r}")
        out[key] = None if value is None else token_id(value, config.padded_vocab_size)
    return out
