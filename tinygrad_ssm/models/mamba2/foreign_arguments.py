"""Arguments that a call ported from transformers or mamba_ssm passes and this package does not take.

Each table maps a name to (the values that change nothing there, so are accepted here; what to do instead). Any
other value is refused by name with that fix: Python's own "unexpected keyword argument" said neither that the
setting would do nothing here nor what to pass instead, and an argument taken silently would mean something else.
"""
from __future__ import annotations

import numbers
import warnings

import numpy as np

_NOT_IMPLEMENTED = "is not implemented here; leave it out"

# Mamba2LMHeadModel.generate / generate_stream (max_length is generation.check_generate_arguments' own: its fix
# depends on the prompts' lengths)
GENERATE = {
    "no_repeat_ngram_size": ((0,), _NOT_IMPLEMENTED),
    "typical_p": ((1.0,), _NOT_IMPLEMENTED),
    "num_beams": ((1,), f"(beam search) {_NOT_IMPLEMENTED}"),
    "num_return_sequences": ((1,), "is not taken: repeat the prompt in the batch, e.g. [prompt] * n"),
    "do_sample": ((), "is not taken: temperature=0 is greedy (do_sample=False), temperature > 0 samples (for "
                      "transformers' do_sample=True pass top_k=50 too: its sampling keeps the 50 likeliest tokens "
                      "unless told otherwise)"),
    "min_new_tokens": ((0,), "is not taken: pass eos_token_id=None to generate max_new_tokens tokens"),
    "min_length": ((0,), "is not taken: pass eos_token_id=None to generate max_new_tokens tokens"),
    "output_scores": ((False,), "is not taken: no scores are returned; model.step(ids, cache) gives each step's "
                                "logits (docs/mamba2.md, section 4)"),
    "return_dict_in_generate": ((False,), "is not taken: generate returns the ids"),
    "pad_token_id": ((None,), "is not taken: a finished row holds the EOS id it produced (with a list of prompts "
                              "each row is cut after it)"),
    "attention_mask": ((None,), "is not taken: pass the prompts unpadded, as a list of 1-D id sequences of their "
                                "own lengths (a ragged batch), not padded ids and a mask"),
    "streamer": ((None,), "is not taken: model.generate_stream(...) yields each step's ids as they come"),
    "generator": ((None,), "is not taken: pass seed=<int> (the draws come from np.random.default_rng(seed))"),
    "use_cache": ((True,), "is not taken: generation always carries the states from step to step"),
    "cg": ((False, True), ""),                                   # mamba_ssm's CUDA graphs: nothing to do on a CPU
    "logits_processor": ((None,), "is not taken: temperature, top_k, top_p, min_p and repetition_penalty are "
                                  "the settings generate applies"),
    "stopping_criteria": ((None,), "is not taken: eos_token_id (an id or a list of ids) and max_new_tokens end "
                                   "a row"),
}

# Mamba2LMHeadModel.__call__ (the forward)
FORWARD = {
    "labels": ((None,), "is not taken: model.loss(input_ids[:, :-1], input_ids[:, 1:]) is transformers' "
                        "loss with labels=input_ids (it shifts them inside; ids of -100 are left out as there)"),
    "attention_mask": ((None,), "is not taken: run each sequence unpadded (a Mamba-2 state carries no mask), or "
                                "give generate a list of prompts of their own lengths"),
    "inputs_embeds": ((None,), _NOT_IMPLEMENTED),
    "position_ids": ((None,), "is not taken: a Mamba-2 model has no positions"),
    "cache_params": ((None,), "is not taken: pass cache=model.allocate_cache(batch) (docs/mamba2.md, section 4)"),
    "inference_params": ((None,), "is not taken: pass cache=model.allocate_cache(batch) (docs/mamba2.md, "
                                  "section 4)"),
    "use_cache": ((None, False), "is not taken: pass cache=model.allocate_cache(batch) to keep the states"),
    "output_hidden_states": ((None, False), _NOT_IMPLEMENTED),
    "return_dict": ((None,), "is not taken: the forward returns the logits Tensor itself (transformers' output.logits "
                             "or output[0]; [0] here would be the batch's first row)"),
    "past_key_values": ((None,), "is not taken: pass cache=model.allocate_cache(batch) (docs/mamba2.md, section 4)"),
    "num_last_tokens": ((0,), "is not taken: slice the logits, logits[:, -n:]"),
    "logits_to_keep": ((0,), "is not taken: slice the logits, logits[:, -n:]"),
}

# Mamba2LMHeadModel.from_pretrained
FROM_PRETRAINED = {
    "torch_dtype": ((), "is dtype here: dtype='float32' or 'float64' (a checkpoint in float16 or bfloat16 is read "
                        "into it)"),
    "revision": ((None, "main"), "is not taken: nothing is downloaded; pass the local folder of that revision (a "
                                 "Hugging Face cache snapshot folder is read as it is)"),
    "local_files_only": ((True, False), ""),                     # local files are all there is
    "cache_dir": ((None,), "is not taken: nothing is downloaded; pass the model's local folder"),
    "device_map": ((None, "cpu"), "is not taken: the model runs on the CPU"),
    "device": ((None, "cpu"), "is not taken: the model runs on the CPU"),
    "trust_remote_code": ((False, True), ""),                    # no code is ever run from a folder
    "config": ((None,), "is not taken: the folder's config.json is read; to change it, build "
                        "Mamba2LMHeadModel(config) and load the weights (docs/mamba2.md, section 5)"),
    "low_cpu_mem_usage": ((True, False), ""),                    # the weights are read in place either way
}


# Mamba2LMHeadModel.loss
LOSS = {"labels": ((), "is not taken: loss(input_ids, targets) takes the next tokens as targets, loss(ids[:, :-1], "
                       "ids[:, 1:]) for transformers' labels=ids (which it shifts inside; ids of -100 are left out as "
                       "there)")}


def loss_targets(targets, foreign: dict):
    """loss's targets, after its foreign arguments (labels=) are refused with the fix."""
    refuse_foreign("Mamba2LMHeadModel.loss", LOSS, foreign)
    if targets is None:
        raise TypeError("Mamba2LMHeadModel.loss: targets (b, l) are needed, the next tokens: loss(ids[:, :-1], "
                        "ids[:, 1:])")
    return targets


def refuse_foreign(who: str, table: dict, kwargs: dict) -> None:
    """Refuse each of kwargs by name with the table's fix unless it holds a neutral value; a name the table does not
    know is Python's TypeError as before."""
    for name, value in kwargs.items():
        if name not in table:
            raise TypeError(f"{who}() got an unexpected keyword argument {name!r}")
        neutral, fix = table[name]
        if not any(same_setting(value, v) for v in neutral):
            raise TypeError(f"{who}: {name}={_brief(value)} {fix}")


def _brief(value) -> str:
    """The value as the message names it: an array or tensor by its type and shape, not its every element."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (numbers.Number, np.generic)):
        return f"<{type(value).__name__} of shape {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def same_setting(value, neutral) -> bool:
    """Whether `value` is the setting `neutral`: None, a str, a bool or a number (min_p=0 is min_p=0.0, num_beams=True
    is no 1)."""
    if neutral is None or isinstance(neutral, str):
        return value is None if neutral is None else (isinstance(value, str) and value == neutral)
    is_bool = isinstance(value, (bool, np.bool_))
    if isinstance(neutral, bool):
        return is_bool and bool(value) is neutral
    return isinstance(value, numbers.Real) and not is_bool and value == neutral


def warn_unshifted_targets(input_ids, targets) -> None:
    """Mamba2LMHeadModel.loss(ids, ids), a port of transformers' labels=ids (which it shifts inside): each position
    would score the token it reads. Said when the same ids are passed twice, not when equal ones are (a run of one
    token, shifted, equals itself)."""
    a, b = (np.asarray(getattr(x, "data", x)) for x in (input_ids, targets))
    # one list given twice: asarray makes two arrays of it, so the objects are compared first
    same = input_ids is targets or a is b or (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
                                               and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])
    if same and a.ndim == 2 and a.shape[1] > 1:
        warnings.warn("Mamba2LMHeadModel.loss: targets are input_ids, so each position scores the token it reads; the "
                      "targets of a causal model are the next tokens: loss(ids[:, :-1], ids[:, 1:]) (transformers "
                      "shifts labels=ids so inside)", UserWarning, stacklevel=3)
