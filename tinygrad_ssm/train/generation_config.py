"""What a model folder says about generating from it, as transformers reads it: the ids that end a document and
the sampling settings of generation_config.json.

- Stop ids: generation_config.json's eos_token_id (an int or a list: transformers stops at any of them), else
  config.json's; `generate` stops at these and at the tokenizer's own EOS token.
- Length: the file's max_new_tokens, else its max_length (prompt and new tokens together: the new ones are
  max_length less the prompt's tokens, the longest prompt's in a batch, as transformers counts a padded batch),
  when --max-new-tokens is not given; else DEFAULT_NEW_TOKENS.
- Sampling: the settings generation_config.json states (do_sample false: greedy; do_sample true: transformers'
  temperature 1.0 and top_k 50 where the file states none; temperature, top_k, top_p, min_p, and
  repetition_penalty, which transformers applies to greedy decoding too) apply when none of the sampling flags
  (SAMPLING_FLAGS) is given; any one of them given, the CLI's own defaults (temperature DEFAULT_TEMPERATURE, no
  filter, no penalty) fill in the others, as for a folder without the file.
  Where the file's settings would apply, a setting transformers applies and generate does not (UNSUPPORTED:
  typical_p, num_beams, no_repeat_ngram_size, ...) is refused by name rather than silently left out, and so is a
  bad sampling value (a flag sets the file's sampling aside, its bad values with it).
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from ..models.mamba2.pretrained import GENERATION_CONFIG_NAME

GENERATION_CONFIG_FILE = GENERATION_CONFIG_NAME   # one name: save_pretrained writes the file too
DEFAULT_TEMPERATURE = 0.8  # generate's --temperature when neither the flags nor generation_config.json set one
DEFAULT_NEW_TOKENS = 300   # generate's --max-new-tokens when neither the flag nor generation_config.json sets one
SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
                  "min_p": "--min-p", "repetition_penalty": "--repetition-penalty"}
# transformers' defaults where do_sample is true and the file states no other value (GenerationConfig's
# _get_default_generation_params: temperature 1.0, top_k 50, top_p 1.0, i.e. no nucleus)
TRANSFORMERS_SAMPLING = {"temperature": 1.0, "top_k": 50, "top_p": None}


# generation_config.json settings that transformers applies and generate does not implement, with the values
# that change nothing (transformers' defaults): a file stating another value is not silently sampled without it
UNSUPPORTED = {"typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None, "no_repeat_ngram_size": 0,
               "encoder_repetition_penalty": 1.0, "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None,
               "num_return_sequences": 1, "bad_words_ids": None, "suppress_tokens": None,
               "begin_suppress_tokens": None, "sequence_bias": None, "forced_bos_token_id": None,
               "forced_eos_token_id": None, "min_length": 0, "min_new_tokens": 0, "stop_strings": None,
               "exponential_decay_length_penalty": None, "guidance_scale": None, "dola_layers": None,
               "watermarking_config": None}


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()                     # from generation_config.json, else config.json
    sampling: dict = field(default_factory=dict)            # the sampling keys generation_config.json states
    unsupported: tuple = ()                                 # "key value" of the UNSUPPORTED settings it states
    sampling_problem: str | None = None                     # a bad sampling value, named where the file applies
    length: dict = field(default_factory=dict)              # max_new_tokens and/or max_length, as the file states
    length_problem: str | None = None                       # a bad one, named where the file applies


def _read_json(path: Path) -> dict | None:
    """The file's object, None when there is no file; an unreadable one is refused, naming it."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{str(path)!r} is not a JSON file transformers can read ({e}); fix or delete it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(data).__name__}; fix or delete it")
    return data


def _eos_ids(value, where: str, vocab_size: int) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size for v in values):
        raise ValueError(f"{where} eos_token_id must be an id or a list of ids in [0, {vocab_size}) (the model's "
                         f"vocabulary), got {value!r}; fix it or remove the key")
    return tuple(dict.fromkeys(values))


def _sampling(config: dict, where: str) -> dict:
    """generate's keyword arguments for the sampling keys `config` states (transformers' meanings: top_k 0, top_p
    1.0 and min_p 0 filter nothing, repetition_penalty 1.0 penalises nothing; do_sample false is greedy whatever
    the warpers' settings say, with the repetition penalty still applied)."""
    def number(key, ok, want):
        value = config[key]
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not ok(value):
            raise ValueError(f"{where} {key} must be {want}, got {value!r}; fix it, or give "
                             f"{SAMPLING_FLAGS[key]} (the file's sampling settings then do not apply)")
        return value

    out = {}
    if "do_sample" in config and not isinstance(config["do_sample"], bool):
        raise ValueError(f"{where} do_sample must be true or false, got {config['do_sample']!r}; fix it, or give "
                         f"--temperature, --top-k or --top-p (the file's sampling settings then do not apply)")
    if "temperature" in config and config["temperature"] is not None:
        out["temperature"] = float(number("temperature", lambda v: math.isfinite(v) and v >= 0, "a number >= 0"))
    if "top_k" in config and config["top_k"] is not None:
        k = number("top_k", lambda v: math.isfinite(v) and v == int(v) and v >= 0, "an int >= 0 (0: no limit)")
        out["top_k"] = int(k) or None
    if "top_p" in config and config["top_p"] is not None:
        p = number("top_p", lambda v: 0 <= v <= 1, "in [0, 1] (1.0: no limit)")
        if p == 0:  # transformers keeps the likeliest token alone (its min_tokens_to_keep): greedy, penalty kept
            out["temperature"] = 0.0
        out["top_p"] = None if p in (0, 1) else float(p)
    if "min_p" in config and config["min_p"] is not None:
        m = number("min_p", lambda v: 0 <= v <= 1, "in [0, 1] (0: no filter)")
        out["min_p"] = float(m) or None
    if "repetition_penalty" in config and config["repetition_penalty"] is not None:
        r = number("repetition_penalty", lambda v: 0 < v < math.inf, "a finite number > 0 (1.0: none)")
        out["repetition_penalty"] = None if r == 1 else float(r)
    if config.get("do_sample") is False:                 # transformers' processors still apply, its warpers not
        out = {"temperature": 0.0, **{k: v for k, v in out.items() if k == "repetition_penalty"}}
    elif config.get("do_sample") is True:  # what the file leaves out, transformers' generate takes as these
        out = {**TRANSFORMERS_SAMPLING, **out}
    return out


def read_generation_defaults(folder: Path, vocab_size: int) -> GenerationDefaults:
    """The stop ids and sampling settings of a model folder (module docstring); vocab_size: the model's rows."""
    folder = Path(folder)
    generation = _read_json(folder / GENERATION_CONFIG_FILE) or {}
    where = f"{str(folder / GENERATION_CONFIG_FILE)!r}:"
    eos = ()
    if generation.get("eos_token_id") is not None:
        eos = _eos_ids(generation["eos_token_id"], where, vocab_size)
    else:
        try:
            model_config = _read_json(folder / "config.json") or {}
        except ValueError:
            model_config = {}                                  # from_pretrained names a bad config.json itself
        if model_config.get("eos_token_id") is not None:
            eos = _eos_ids(model_config["eos_token_id"], f"{str(folder / 'config.json')!r}:", vocab_size)
    unsupported = tuple(f"{k} {generation[k]!r}" for k, neutral in UNSUPPORTED.items()
                        if generation.get(k) is not None and generation[k] != neutral and generation[k] != [])
    try:
        sampling, problem = _sampling(generation, where), None
    except ValueError as e:  # refused only where the file's settings apply: a sampling flag sets them aside
        sampling, problem = {}, str(e)
    length, length_problem = {}, None
    for key, least in (("max_new_tokens", 0), ("max_length", 1)):
        value = generation.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= least:
            length[key] = value
        else:
            length_problem = (f"{where} {key} must be an int >= {least}, got {value!r}; fix it, or give "
                              f"--max-new-tokens (the file's length then does not apply)")
    return GenerationDefaults(eos, sampling, unsupported, problem, length, length_problem)


def stop_ids(tokenizer, defaults: GenerationDefaults | None) -> tuple[int, ...]:
    """The ids that end a document: the tokenizer's EOS token, then the folder's (GenerationDefaults)."""
    own = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
    return tuple(dict.fromkeys(own + (defaults.eos_token_ids if defaults is not None else ())))


def new_token_count(given: int | None, defaults: GenerationDefaults | None, prompt: str = "the prompt"):
    """How many tokens to generate: --max-new-tokens when given, else the folder's generation_config.json (module
    docstring), else DEFAULT_NEW_TOKENS; an int, or where a max_length counts the prompt, a function of the prompt's
    tokens (a batch's longest; `prompt` names it in the error when nothing is left to generate)."""
    if given is not None:
        return given
    if defaults is None or not (defaults.length or defaults.length_problem):
        return DEFAULT_NEW_TOKENS
    if defaults.length_problem:
        raise ValueError(defaults.length_problem)
    if "max_new_tokens" in defaults.length:                 # transformers: max_new_tokens over max_length
        return defaults.length["max_new_tokens"]
    total = defaults.length["max_length"]

    def after(prompt_tokens: int) -> int:
        if total <= prompt_tokens:                          # transformers refuses this too
            raise ValueError(f"{GENERATION_CONFIG_FILE} of the model folder states max_length {total} (prompt and "
                             f"new tokens together), and {prompt} has {prompt_tokens} tokens: nothing is left to "
                             f"generate; give --max-new-tokens")
        return total - prompt_tokens
    return after


def sampling_settings(given: dict, defaults: GenerationDefaults | None) -> dict:
    """temperature, top_k, top_p, min_p, repetition_penalty for generate: `given` (the flags, None where left out)
    when any is given, the CLI's defaults filling in; else the folder's generation_config.json settings over the
    CLI's defaults."""
    base = {"temperature": DEFAULT_TEMPERATURE, "top_k": None, "top_p": None, "min_p": None,
            "repetition_penalty": None}
    if any(v is not None for v in given.values()):
        return {k: given.get(k) if given.get(k) is not None else v for k, v in base.items()}
    if defaults is not None and defaults.sampling_problem:
        raise ValueError(defaults.sampling_problem)
    if defaults is not None and defaults.unsupported:  # the file's settings would apply without these
        raise ValueError(f"{GENERATION_CONFIG_FILE} of the model folder states {', '.join(defaults.unsupported)}, "
                         f"which generate does not implement; give a sampling flag "
                         f"({', '.join(SAMPLING_FLAGS.values())}) to sample with the CLI's settings instead of the "
                         f"file's, or remove the key from the file")
    return {**base, **(defaults.sampling if defaults is not None else {})}
