"""Generation for Mamba2LMHeadModel (its generate_stream and generate): prefill the prompts, then decode.

Prompt processing: a prompt of at most prompt_step_tokens(d_model) tokens over the batch (512 up to d_model 256,
fewer for a wider model) goes through one numba step of all its tokens (decode.decode_prompt), a longer one
through the chunked scan, with the LM head on the last position only. A ragged batch (a list of prompts of
different lengths) is prefilled one prompt at a time, the same way, and the per-layer states are stacked into
one batch cache.
Decoding: with fused=True every sampling setting stays inside numba for blocks of TOKEN_BLOCK tokens
(decode.decode_sampled, whose sampler is sample_next's twin), drawing its uniform numbers up front from the
same generator in the order sample_next would, so the tokens are those of the per-token path (`step` and
sample_next: fused=False, or a model whose `step` was replaced) for the same seed.
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from ...autograd.tensor import Tensor, no_grad
from .decode import decode_prompt, decode_sampled
from .foreign_arguments import GENERATE, refuse_foreign
from .decode import release as release_decoder
from .sampling import NonFiniteLogits, check_sampling_args, sample_next

# generation takes a prompt of at most this many tokens over the batch (b l) in one decoder step (decode_prompt),
# a longer one through the chunked scan: at the benchmark's model (d_model 256) the one step took 1.8 / 3.0 / 5.1 ms
# for b = 1, l = 32 / 64 / 128 against the chunked forward's 6.1 / 7.5 / 9.8 ms, and 9.7 / 19.4 / 39.6 ms for b = 8
# against 17.1 / 25.5 / 35.7 ms. A wider model's products gain more from BLAS: at the 130M shape (d_model 768,
# b = 1) the one step won at l = 128 (0.36 against 0.43 s), tied at 256 (0.70-0.73 against 0.75 s) and lost at 512
# (0.88 against 0.74 s, bench_pretrained_shape.py): the limit shrinks as 1 / d_model above PROMPT_STEP_WIDTH
PROMPT_STEP_TOKENS = 512
PROMPT_STEP_WIDTH = 256


def prompt_step_tokens(d_model: int) -> int:
    """The most prompt tokens (over the batch) that one decoder step takes for a model of this width."""
    return PROMPT_STEP_TOKENS * PROMPT_STEP_WIDTH // max(d_model, PROMPT_STEP_WIDTH)


# a longer prompt is prefilled in windows of this many tokens over the batch (b w), the state carried: one forward
# over a whole prompt held its activations, ~15.5 KB a token at d_model 256 (6.3 GB for 400,000 tokens, measured)
PREFILL_WINDOW = 8192

TOKEN_BLOCK = 32  # tokens per numba call (decode_sampled): a streamed reader sees them in bursts of ~10 ms

def check_foreign_arguments(kwargs: dict, prompts) -> None:
    """Refuse, by name, another library's generate argument that would change the result (foreign_arguments.GENERATE);
    its neutral value is accepted. Any other unknown name is Python's TypeError, as before."""
    if "max_length" in kwargs and kwargs["max_length"] is None:   # transformers' neutral value: max_new_tokens decides
        kwargs = {k: v for k, v in kwargs.items() if k != "max_length"}
    if "max_length" in kwargs:  # mamba_ssm's (required) and transformers': the prompt included
        value = kwargs["max_length"]
        lengths = [len(p) for p in prompts] if isinstance(prompts, list) else [prompts.shape[1]]
        if min(lengths) != max(lengths):
            instead = f"max_new_tokens (the prompts have {min(lengths)} to {max(lengths)} tokens)"
        elif isinstance(value, (int, np.integer)):
            instead = f"max_new_tokens={value - lengths[0]} (the prompt has {lengths[0]} tokens)"
        else:
            instead = f"max_new_tokens (the prompt has {lengths[0]} tokens)"
        raise TypeError(f"generate: max_length={value!r} is not taken (in mamba_ssm and transformers it counts the "
                        f"prompt too); pass {instead}")
    refuse_foreign("generate", GENERATE, kwargs)


def generate_stream(model, input_ids, max_new_tokens: int | None = None, *, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                    eos_token_id=None, vocab_size: int | None = None, min_p: float | None = None,
                    repetition_penalty: float | None = None, **foreign):
    """Mamba2LMHeadModel.generate_stream: yields the next token ids (b,) int64 one step at a time.

    input_ids: (b, l) or (l,) ints, or a list of 1-D int sequences of any lengths (a ragged batch: each row
    gives exactly the tokens its prompt gives alone, whenever its draws are the same: greedy, top_k=1, a batch
    of one). Sampling draws one uniform number per row and step from np.random.default_rng(seed), rows in
    order within a step (sample_next's rng.random((b, 1))): row i of a batch of b takes the step's i-th number.
    eos_token_id: an id or a sequence of ids (a transformers generation_config.json may list several); a row
    that has produced any of them is finished and holds the one it produced in every later yield; the stream ends
    after the step where every row is finished, or after max_new_tokens steps. vocab_size: sample only ids
    below it; by default config.vocab_size, which leaves out the padding rows of a mamba_ssm config
    (pad_vocab_size_multiple) but not those of a transformers one (it states the padded count: 50,288 rows for
    GPT-NeoX's 50,280 tokens), so pass the tokenizer's size there. min_p as transformers takes it (mamba_ssm's
    compares with the first token's logit: sample_next), repetition_penalty as both take it: the penalty applies
    to the ids of each row's own prompt and of its tokens so far. Arguments are checked at the call, not at the first next(). mamba_ssm's and transformers'
    other arguments (max_length, num_beams, ...) are refused by name, with what to pass instead, unless given
    their neutral value (foreign_arguments.GENERATE). With fused=True the tokens are computed TOKEN_BLOCK at a time and
    yielded one by one: weights changed between two yields take effect from the next block, and a stream left
    unfinished has computed up to TOKEN_BLOCK - 1 tokens no one reads."""
    prompts, _ = check_prompts(model, input_ids)
    check_foreign_arguments(foreign, prompts)
    if max_new_tokens is None:  # a default (transformers' 20 tokens) would hide a forgotten argument
        raise TypeError("generate: max_new_tokens (the number of tokens to generate after the prompt) is required")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    check_sampling_args(temperature, top_k, top_p, min_p, repetition_penalty)
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"generate: seed must be None or an int >= 0, got {seed!r}")
    eos = eos_ids(eos_token_id, model.config.padded_vocab_size)
    V = model.config.padded_vocab_size
    vocab = min(model.config.vocab_size, V)                              # the ids sampled: [0, vocab)
    if vocab_size is not None:
        if not isinstance(vocab_size, (int, np.integer)) or isinstance(vocab_size, bool) or vocab_size < 1:
            raise ValueError(f"generate: vocab_size must be None or an int >= 1, got {vocab_size!r}")
        vocab = min(vocab, int(vocab_size))
    # k >= vocab keeps every token, as None does (and a k of 10**20 would not fit the numba sampler's int64)
    top_k = None if top_k is not None and top_k >= vocab else top_k
    # as Python numbers (a Fraction or a NumPy scalar passed the checks, then failed in NumPy or numba)
    sampling = Sampling(float(temperature), None if top_k is None else int(top_k), None if top_p is None else
                        float(top_p), float(min_p) if min_p else None,
                        None if repetition_penalty in (None, 1) else float(repetition_penalty))
    return _stream(model, prompts, int(max_new_tokens), sampling, np.random.default_rng(seed), eos, vocab)


def eos_ids(eos_token_id, V: int) -> np.ndarray | None:
    """eos_token_id (None, an int, or a non-empty sequence of ints, each in [0, V)) as an int64 array, or None."""
    if eos_token_id is None:
        return None
    if isinstance(eos_token_id, np.ndarray) and eos_token_id.ndim == 0:  # np.array(2): one id (list() refused it)
        eos_token_id = eos_token_id.item()
    single = isinstance(eos_token_id, (int, np.integer))
    values = [eos_token_id] if single else list(eos_token_id) if isinstance(eos_token_id, (list, tuple, np.ndarray)) \
        else None
    if not values or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and 0 <= v < V
                             for v in values):
        raise ValueError(f"generate: eos_token_id must be None, an int in [0, {V}) or a non-empty sequence of "
                         f"them, got {eos_token_id!r}")
    return np.asarray(values, np.int64)


def generate(model, input_ids, max_new_tokens: int | None = None, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None, eos_token_id=None,
             vocab_size: int | None = None, min_p: float | None = None, repetition_penalty: float | None = None,
             **foreign):
    """Mamba2LMHeadModel.generate: the prompts followed by their new tokens. An array (b, l) or (l,) gives
    (b, l + steps) int64 (steps = max_new_tokens, fewer when every row met an id of eos_token_id, an int or a
    sequence of ints; a finished row holds the one it produced to the end); a list of prompts gives a list of
    1-D int64 arrays, each cut after its first EOS (kept)."""
    prompts, ragged = check_prompts(model, input_ids)
    new = list(generate_stream(model, input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                               seed=seed, eos_token_id=eos_token_id, vocab_size=vocab_size, min_p=min_p,
                               repetition_penalty=repetition_penalty, **foreign))
    new = np.stack(new) if new else np.zeros((0, len(prompts) if ragged else prompts.shape[0]), np.int64)
    if not ragged:                                                       # (steps, b)
        return np.concatenate([prompts.astype(np.int64), new.T], axis=1)
    rows = []
    eos = eos_ids(eos_token_id, model.config.padded_vocab_size)
    for prompt, row in zip(prompts, new.T):
        ended = np.isin(row, eos) if eos is not None else np.zeros(len(row), bool)
        if ended.any():
            row = row[:int(np.argmax(ended)) + 1]
        rows.append(np.concatenate([prompt, row]))
    return rows


def as_id_array(input_ids, what: str) -> np.ndarray:
    """input_ids (a Tensor, an array, nested lists) as an array; rows of different lengths are named as such (NumPy
    said only "inhomogeneous shape")."""
    try:
        return np.asarray(input_ids.data if isinstance(input_ids, Tensor) else input_ids)
    except ValueError as e:
        raise ValueError(f"{what}: input_ids must be integers of shape (b, l), but its rows differ in length or "
                         f"kind ({e}); pad them to one length, or give generate a list of prompts") from None


def check_prompts(model, input_ids):
    """(prompts, ragged): (b, l) ints checked by the model, or, for a list of sequences, a list of 1-D int64
    arrays, each checked and named by its row."""
    if not (isinstance(input_ids, (list, tuple)) and input_ids and all(
            not isinstance(p, (numbers.Number, np.generic)) for p in input_ids)):
        if isinstance(input_ids, (list, tuple)) and not input_ids:
            raise ValueError("generate: input_ids is an empty list; give (b, l) ids or a list of prompts")
        ids = as_id_array(input_ids, "generate")
        return model._check_ids(ids[None] if ids.ndim == 1 else ids, 2, "generate"), False
    V, prompts = model.config.padded_vocab_size, []
    for i, p in enumerate(input_ids):
        try:
            a = np.asarray(p.data if isinstance(p, Tensor) else p)
        except ValueError:                                              # itself ragged
            a = np.asarray(p, dtype=object)
        if a.size == 0:                                                 # (an empty list's dtype is float64)
            raise ValueError(f"generate: input_ids[{i}] is empty; every prompt needs at least one token")
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"generate: input_ids[{i}] must be a 1-D sequence of ints, got dtype {a.dtype} "
                             f"shape {a.shape}")
        if a.min() < 0 or a.max() >= V:
            raise ValueError(f"generate: input_ids[{i}] must be in [0, {V}), got min {a.min()} max {a.max()}")
        prompts.append(a.astype(np.int64))
    return prompts, True


def prompt_in_one_step(model, ids: np.ndarray) -> bool:
    """Whether prefill takes the prompt ids (b, l) as one decoder step (decode_prompt), not the chunked scan."""
    return model.fused and ids.size <= prompt_step_tokens(model.config.d_model)


def prefill(model, ids: np.ndarray):
    """ids (b, l) -> (a new cache at the prompt's end, logits (b, padded vocab) after its last token). A long prompt
    goes through the chunked scan in windows of PREFILL_WINDOW tokens over the batch, the state carried from one to
    the next (what one forward over the whole prompt computes, up to rounding), so memory is flat in its length."""
    cache = model.allocate_cache(ids.shape[0])
    if prompt_in_one_step(model, ids):
        return cache, decode_prompt(model, ids, cache)                  # (b, V) in one step, see PROMPT_STEP_...
    step = max(1, PREFILL_WINDOW // ids.shape[0])
    for start in range(0, ids.shape[1], step):
        x = model.embedding(ids[:, start:start + step])                 # (b, w, d_model)
        for layer, state in zip(model.layers, cache.layers):
            x = layer(x, state, model.backend)
        cache.seqlen_offset += x.shape[1]
    return cache, model._head(x[:, -1]).data                             # (b, V) the last position only


def prefill_ragged(model, prompts: list):
    """prefill of each prompt (l_i,) alone, the states stacked into one cache of b = len(prompts) rows; its
    seqlen_offset is the longest prompt's length."""
    caches, logits = zip(*(prefill(model, p[None]) for p in prompts))
    cache = model.allocate_cache(len(prompts))
    for i, state in enumerate(cache.layers):
        state.conv = Tensor(np.concatenate([c.layers[i].conv.data for c in caches]))   # (b, conv_dim, d_conv)
        state.ssm = Tensor(np.concatenate([c.layers[i].ssm.data for c in caches]))     # (b, h, p, n)
    cache.seqlen_offset = max(len(p) for p in prompts)
    return cache, np.concatenate(logits)                                 # (b, V)


class Sampling(NamedTuple):
    """generate's sampling settings, checked; min_p and repetition_penalty None when they change nothing."""
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    repetition_penalty: float | None


def seen_ids(prompts, vocab: int, penalised: bool) -> np.ndarray:
    """(b, vocab) bool: the ids of each row's own prompt (those below vocab), which a repetition penalty makes
    less likely; (b, 0) when there is no penalty (nothing is read)."""
    seen = np.zeros((len(prompts), vocab if penalised else 0), np.bool_)
    if penalised:
        for row, prompt in zip(seen, prompts):
            row[prompt[prompt < vocab]] = True
    return seen


def _stream(model, prompts, max_new_tokens: int, sampling: Sampling, rng, eos, vocab: int):
    if max_new_tokens == 0:
        return
    penalised = sampling.repetition_penalty is not None
    seen = seen_ids(prompts, vocab, penalised)                           # (b, vocab) or (b, 0)
    # no_grad only around the work: a generator must not leave grad mode off while it is suspended
    with no_grad():
        cache, logits = prefill_ragged(model, prompts) if isinstance(prompts, list) else prefill(model, prompts)
    finished = np.zeros(logits.shape[0], bool)                           # (b,) rows that produced an eos id
    held = np.zeros(logits.shape[0], np.int64)                           # (b,) the eos id each finished row made

    def emit(token):                                                     # the yield: finished rows hold their eos
        if eos is None:
            return token
        out = np.where(finished, held, token)
        ended = (out[:, None] == eos).any(axis=-1) & ~finished            # (b,) eos (k,): a (b, k) compare
        held[ended] = out[ended]
        finished[:] |= ended
        return out

    # inside numba for blocks of tokens, unless `step` was replaced on the model (a test's probe, a wrapper)
    in_numba = model.fused and "step" not in model.__dict__
    rows = np.arange(len(seen))
    token = _sample(logits[:, :vocab], rng, sampling, seen, 0, max_new_tokens)
    try:
        if penalised:
            seen[rows, token] = True
        yield emit(token)
        i = 1
        while i < max_new_tokens and not finished.all():
            if in_numba:
                n = min(TOKEN_BLOCK, max_new_tokens - i)
                # sample_next's draws for n steps, in its order; greedy draws none
                uniforms = np.zeros((n, len(token))) if sampling.temperature == 0 else rng.random((n, len(token)))
                tokens, bad = decode_sampled(model, token, cache, vocab, sampling.temperature, sampling.top_k,
                                             sampling.top_p, uniforms, sampling.min_p, sampling.repetition_penalty,
                                             seen)                       # marks its tokens in seen
                for token in tokens:                                     # (b,) each
                    yield emit(token)
                    i += 1
                    if finished.all():
                        return
                if bad is not None:                                      # raises, naming step i + 1
                    _sample(bad[:, :vocab], rng, sampling, seen, i, max_new_tokens)
            else:
                logits = model.step(token, cache).data
                token = _sample(logits[:, :vocab], rng, sampling, seen, i, max_new_tokens)
                if penalised:
                    seen[rows, token] = True
                yield emit(token)
                i += 1
    finally:
        if model.fused:
            release_decoder(cache)                                       # its helper thread stops now


def _sample(logits, rng, sampling: Sampling, seen, i: int, max_new_tokens: int) -> np.ndarray:
    """Token i + 1 (b,) from logits (b, vocab); non-finite logits stop generation, naming that step."""
    try:
        return sample_next(logits, rng, *sampling, seen=seen)
    except NonFiniteLogits as e:
        where = "after the prompt" if i == 0 else f"after {i} generated tokens"
        raise NonFiniteLogits(f"generate: step {i + 1} (token {i + 1} of {max_new_tokens}, {where}): {e}; "
                              f"check the checkpoint for NaN/inf weights") from None
