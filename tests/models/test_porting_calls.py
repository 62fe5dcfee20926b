"""Calls ported from transformers and mamba_ssm: what they pass that this package does not take is refused by name
with what to pass instead (foreign_arguments.py), never taken with another meaning; a neutral value is accepted."""
import warnings

import numpy as np
import pytest

from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.model import Mamba2Cache

IDS = np.array([[1, 2, 3, 4]])


@pytest.fixture(scope="module")
def model():
    return Mamba2LMHeadModel(Mamba2Config(d_model=32, n_layer=1, vocab_size=40, d_state=8, headdim=8, chunk_size=8),
                             VarMap(seed=0), dtype="float64")


@pytest.mark.parametrize("kw, fix", [
    ({"labels": IDS}, r"labels=.* model.loss\(input_ids\[:, :-1\], input_ids\[:, 1:\]\)"),
    ({"attention_mask": np.ones((1, 4))}, r"attention_mask=.* run each sequence unpadded"),
    ({"use_cache": True}, r"use_cache=True .* cache=model.allocate_cache\(batch\)"),
    ({"cache_params": object()}, r"cache_params=.* cache=model.allocate_cache"),
    ({"inference_params": object()}, r"inference_params=.* cache=model.allocate_cache"),
    ({"num_last_tokens": 1}, r"num_last_tokens=1 .* logits\[:, -n:\]"),
    ({"inputs_embeds": np.zeros((1, 4, 32))}, r"inputs_embeds=.* is not implemented"),
    ({"output_hidden_states": True}, r"output_hidden_states=True"),
    # output[0] of transformers' output is the logits, [0] of ours the first row: True and False were taken as neutral
    ({"return_dict": True}, r"return_dict=True .* returns the logits Tensor itself .* output\.logits or output\[0\]"),
    ({"return_dict": False}, r"return_dict=False .* returns the logits Tensor itself"),
    ({"past_key_values": object()}, r"past_key_values=.* cache=model.allocate_cache"),
    ({"position_ids": IDS}, r"no positions"),
    ({"labelz": IDS}, r"got an unexpected keyword argument 'labelz'")])
def test_a_forward_argument_of_transformers_is_refused_by_name_with_the_fix(model, kw, fix):
    """Python's "unexpected keyword argument 'labels'" said nothing of the shifted loss transformers computes."""
    with pytest.raises(TypeError, match=fix):
        model(IDS, **kw)


def test_a_forwards_neutral_values_change_nothing(model):
    plain = model(IDS).data
    for kw in ({"labels": None}, {"attention_mask": None}, {"use_cache": False}, {"return_dict": None},
               {"past_key_values": None},
               {"output_hidden_states": False}, {"num_last_tokens": 0}, {"logits_to_keep": 0}):
        np.testing.assert_array_equal(model(IDS, **kw).data, plain)


def test_loss_with_targets_equal_to_the_input_ids_warns_of_the_shift(model):
    """model(ids, labels=ids) ported as model.loss(ids, ids) scored each position's own token, silently."""
    with pytest.warns(UserWarning, match=r"targets are input_ids.*loss\(ids\[:, :-1\], ids\[:, 1:\]\)"):
        model.loss(IDS, IDS)
    ids = IDS.tolist()                       # one list given twice: asarray made two arrays of it, and no warning
    with pytest.warns(UserWarning, match=r"targets are input_ids"):
        model.loss(ids, ids)
    with pytest.raises(TypeError, match=r"loss: labels=.* loss\(ids\[:, :-1\], ids\[:, 1:\]\) for transformers' "
                                        r"labels=ids"):
        model.loss(IDS, labels=IDS)                                     # was Python's bare unexpected keyword
    with pytest.raises(TypeError, match=r"loss: targets \(b, l\) are needed"):
        model.loss(IDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.loss(IDS[:, :-1], IDS[:, 1:])
        run = np.full((2, 9), 7)                                        # a run of one token: its shifted targets
        model.loss(run[:, :-1], run[:, 1:])                             # equal its ids, and that is no port


@pytest.mark.parametrize("kw, fix", [
    ({"torch_dtype": "float32"}, r"torch_dtype='float32' is dtype here"),
    ({"revision": "v2"}, r"nothing is downloaded"), ({"cache_dir": "/tmp"}, r"nothing is downloaded"),
    ({"device_map": "auto"}, r"runs on the CPU"), ({"config": object()}, r"config.json is read"),
    ({"revison": "main"}, r"unexpected keyword argument 'revison'")])
def test_a_from_pretrained_argument_of_transformers_is_refused_by_name(model, kw, fix, tmp_path):
    model.save_pretrained(tmp_path)
    with pytest.raises(TypeError, match=fix):
        Mamba2LMHeadModel.from_pretrained(tmp_path, **kw)
    back = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64", revision="main", local_files_only=True,
                                             device_map="cpu", trust_remote_code=False, low_cpu_mem_usage=True)
    np.testing.assert_array_equal(back(IDS).data, model(IDS).data)


@pytest.mark.parametrize("call", ["generate", "generate_stream"])
def test_only_the_ids_and_max_new_tokens_go_by_position(model, call):
    """mamba_ssm's generate(input_ids, max_length, top_k, top_p, ...): generate(ids, 10, 1) meant top_k=1 there and
    ran here as temperature=1 (sampled where mamba_ssm is greedy)."""
    with pytest.raises(TypeError, match="positional argument"):
        getattr(model, call)(IDS, 10, 1)


@pytest.mark.parametrize("kw, fix", [({"streamer": object()}, r"generate_stream"), ({"generator": object()}, r"seed="),
                                     ({"use_cache": False}, r"always carries the states"),
                                     ({"typical_p": 0.9}, r"not implemented"), ({"min_length": 3}, r"eos_token_id=None"),
                                     ({"logits_processor": [object()]}, r"temperature, top_k"),
                                     ({"do_sample": True}, r"top_k=50")])
def test_more_generate_arguments_of_transformers_are_refused_by_name(model, kw, fix):
    with pytest.raises(TypeError, match=fix):
        model.generate(IDS, 3, **kw)
    neutral = dict(pad_token_id=None, attention_mask=None, streamer=None, use_cache=True, cg=True, typical_p=1.0)
    np.testing.assert_array_equal(model.generate(IDS, 3, seed=1, **neutral), model.generate(IDS, 3, seed=1))


def test_a_transformers_4_style_cache_is_refused_when_made(model):
    """Mamba2Cache(config, batch_size) was built without complaint and failed at first use ("no len()")."""
    with pytest.raises(TypeError, match=r"model.allocate_cache\(batch_size\)"):
        Mamba2Cache(model.config, 2)


def test_parameters_and_named_parameters_as_torch_modules_have_them():
    """A loop ported from torch (AdamW(model.parameters()), clip_grad_norm_(model.parameters(), 1.0)) failed with
    an AttributeError (found by an audit): both are the VarMap's variables, a list each call (a generator would be
    used up by the optimizer before clipping read it)."""
    from tinygrad_ssm import optim
    model = Mamba2LMHeadModel(Mamba2Config(d_model=32, n_layer=1, vocab_size=40, d_state=8, headdim=8, chunk_size=8),
                              VarMap(seed=0), dtype="float64")          # its own: a step changes it
    params = model.parameters()
    assert isinstance(params, list) and [id(p) for p in params] == [id(p) for p in model.varmap.all_vars()]
    assert [n for n, _ in model.named_parameters()] == model.varmap.names()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    model.loss(IDS[:, :-1], IDS[:, 1:]).backward()
    assert optim.clip_grad_norm_(model.parameters(), 1e9) > 0
    opt.step()
