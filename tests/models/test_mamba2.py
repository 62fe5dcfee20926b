"""The Mamba-2 model: config checks, official names and init, logits == an independent NumPy reference of
the equations (mamba2_numpy_reference.py), full forward == sequential scan == prefill-then-step, gradients of a mixer and of a 2-layer LM, gradient flow to every parameter, long inputs,
and generation."""
import dataclasses
import gc
import math

import numpy as np
import pytest

import tinygrad_ssm as tg
from tests.support.gradcheck import gradcheck
from tests.support.mamba2_numpy_reference import lm_logits
from tests.support.models import small_config, small_model
from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarBuilder, VarMap
from tinygrad_ssm.models.mamba2.model import Mamba2Mixer
from tinygrad_ssm.models.mamba2.sampling import sample_next
from tinygrad_ssm.autograd.function import Function

Q = small_config().chunk_size   # 8


def bind(model, name, tensor):
    """Put `tensor` where the model keeps the parameter `name` (so gradcheck can vary it)."""
    parts = name.removeprefix("backbone.").split(".")
    obj = model
    for part in parts[:-1]:
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    setattr(obj, parts[-1], tensor)


# --- config ------------------------------------------------------------------------------------------------

def test_config_derived_sizes_and_round_trip():
    c = Mamba2Config(d_model=768, n_layer=24, vocab_size=50277, pad_vocab_size_multiple=16)
    assert (c.d_inner, c.nheads, c.conv_dim, c.d_in_proj, c.padded_vocab_size) == (1536, 24, 1792, 3352, 50288)
    official = (128, 4, 64, 1, 256, (0.0, math.inf))
    assert (c.d_state, c.d_conv, c.headdim, c.ngroups, c.chunk_size, c.dt_limit) == official
    assert Mamba2Config.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("kw,message", [
    (dict(headdim=7), "divisible by headdim"),
    (dict(ngroups=3), "divisible by ngroups"),
    (dict(d_state=0), "d_state must be a positive int"),
    (dict(dt_min=0.5, dt_max=0.1), "dt_min <= dt_max"),
    (dict(dt_init_floor=-1e-4), "dt_init_floor >= 0"),
    (dict(dt_limit=(1.0, 0.5)), "dt_limit"),
    (dict(tie_embeddings="yes"), "tie_embeddings must be a bool"),
    # 0 in float32: a row of zeros (a zeroed embedding row) normalized to NaN in the forward, while the decoder,
    # holding eps in float64, sampled from it (an audit of numerics at the extremes)
    (dict(rms_norm_eps=1e-50), r"rms_norm_eps 1e-50 is 0 in float32, .* give at least 1.5e-45"),
])
def test_config_is_validated(kw, message):
    with pytest.raises(ValueError, match=message):
        small_config(**kw)
    with pytest.raises(ValueError, match="unknown keys"):
        Mamba2Config.from_dict({**small_config().to_dict(), "d_modle": 3})



def test_a_config_changed_after_it_was_made_is_checked_by_the_model():
    """config.headdim = 5 after construction (d_inner 32 not divisible by it): the model built, its step and
    generate ran, its forward failed inside a reshape (found by an API audit)."""
    config = Mamba2Config(d_model=16, n_layer=1, vocab_size=20, d_state=8, headdim=8, chunk_size=4)
    config.headdim = 5
    for fused in (True, False):
        with pytest.raises(ValueError, match=r"d_inner = expand \* d_model = 32 must be divisible by headdim = 5"):
            Mamba2LMHeadModel(config, fused=fused)


def test_a_built_model_keeps_its_own_config_whose_fields_are_fixed_but_chunk_size():
    """The model kept the caller's config object and read it at every forward: cfg.dt_limit set to build a second
    model changed the first one's logits, and cfg.ngroups, cfg.d_state = 2, 2 (the same in_proj size) made it
    another model, its norm grouped the old way (an audit). Now the model holds a copy; the copy's fields are
    fixed, but chunk_size (the scan's speed setting: equal results up to rounding)."""
    config = Mamba2Config(d_model=8, n_layer=1, vocab_size=16, d_state=4, headdim=4, chunk_size=4)
    model = Mamba2LMHeadModel(config, dtype="float64")
    ids = np.array([[1, 2, 3, 4, 5]])
    before = model(ids).data
    config.dt_limit, config.ngroups, config.d_state = (0.0, 0.05), 2, 2
    np.testing.assert_array_equal(model(ids).data, before)
    assert model.config.dt_limit == (0.0, float("inf")) and model.config != config
    with pytest.raises(AttributeError, match=r"Mamba2Config\.ngroups: this is a built model's config.*"
                                             r"dataclasses\.replace\(model\.config, ngroups=\.\.\.\)"):
        model.config.ngroups = 2
    model.config.chunk_size = 2
    np.testing.assert_allclose(model(ids).data, before, rtol=1e-12, atol=1e-12)
    other = Mamba2LMHeadModel(dataclasses.replace(model.config, dt_limit=(0.0, 0.05)), dtype="float64")
    assert other.config.dt_limit == (0.0, 0.05) and Mamba2LMHeadModel(model.config).config == model.config


def test_saving_a_model_whose_varmap_holds_another_models_variables_is_refused(tmp_path):
    """A 2-layer model built on the VarMap of a 3-layer one saved layer 2 too, a folder from_pretrained refused;
    refused at the save now, naming the variables, before anything is written."""
    config = lambda n: Mamba2Config(d_model=16, n_layer=n, vocab_size=20, d_state=8, headdim=8, chunk_size=4)
    varmap = VarMap(seed=0)
    Mamba2LMHeadModel(config(3), varmap)
    model = Mamba2LMHeadModel(config(2), varmap)
    with pytest.raises(ValueError, match=r"VarMap also holds backbone\.layers\.2\..*variables the model does not "
                                         r"have"):
        model.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m").exists()
    own = Mamba2LMHeadModel(config(2), VarMap(seed=0))
    own.save_pretrained(tmp_path / "own")                                # its own VarMap: saved and loaded back
    np.testing.assert_array_equal(Mamba2LMHeadModel.from_pretrained(tmp_path / "own")(np.array([[1, 2]])).data,
                                  own(np.array([[1, 2]])).data)


def test_from_dict_needs_a_dict():
    with pytest.raises(TypeError, match=r"Mamba2Config.from_dict: need a dict of its fields, got NoneType"):
        Mamba2Config.from_dict(None)


@pytest.mark.parametrize("fused", [True, False])
def test_a_cache_of_another_dtype_or_width_is_refused_naming_its_layer(fused):
    """A float64 model's cache given to a float32 model ran in float64 (__call__'s logits float64, the fused step
    converting the cache silently); another width's failed deep in a layer (found by an API audit)."""
    config = Mamba2Config(d_model=16, n_layer=1, vocab_size=20, d_state=8, headdim=8, chunk_size=4)
    model = Mamba2LMHeadModel(config, VarMap(seed=0), fused=fused)
    other_dtype = Mamba2LMHeadModel(config, VarMap(seed=0), dtype="float64").allocate_cache(1)
    wider = Mamba2LMHeadModel(Mamba2Config(**{**config.to_dict(), "d_model": 32}), VarMap(seed=0)).allocate_cache(1)
    cases = ((other_dtype, r"cache layer 0 holds .*states of float64, this model's are .* of float32"),
             (wider, r"cache layer 0 holds conv \(1, 80, 4\)"))
    for cache, what in cases:
        with pytest.raises(ValueError, match=what):
            model(np.array([[1, 2]]), cache)
        step_says = r"decode: cache conv state has shape" if fused else r"step: cache layer 0 holds"
        with pytest.raises(ValueError, match=step_says):                 # the fused step: the decoder's check
            model.step(np.array([1]), cache)


def test_a_floor_of_zero_is_a_config_mamba_ssm_takes():
    """mamba_ssm clamps the initial dt at dt_init_floor, 0 included (it floors nothing); such a checkpoint's
    config was refused."""
    model = small_model(dt_init_floor=0.0)
    assert np.all(np.isfinite(model.varmap["backbone.layers.0.mixer.dt_bias"].data))

# --- names, shapes, init -----------------------------------------------------------------------------------

def test_official_names_shapes_and_initialisation():
    c = small_config(d_model=32, n_layer=3, d_state=6, headdim=8, ngroups=2)     # d_inner 64, 8 heads
    model = Mamba2LMHeadModel(c, VarMap(seed=3), dtype="float32")
    shapes = {name: t.shape for name, t in model.varmap.named_vars()}
    h, d_inner, conv_dim = 8, 64, 64 + 2 * 2 * 6
    expected = {"backbone.embedding.weight": (56, 32), "backbone.norm_f.weight": (32,)}
    for i in range(3):
        p = f"backbone.layers.{i}."
        expected.update({p + "norm.weight": (32,), p + "mixer.in_proj.weight": (2 * d_inner + 2 * 2 * 6 + h, 32),
                         p + "mixer.conv1d.weight": (conv_dim, 1, 4), p + "mixer.conv1d.bias": (conv_dim,),
                         p + "mixer.dt_bias": (h,), p + "mixer.A_log": (h,), p + "mixer.D": (h,),
                         p + "mixer.norm.weight": (d_inner,), p + "mixer.out_proj.weight": (32, d_inner)})
    assert shapes == expected                                           # tied: no lm_head.weight
    mixer = "backbone.layers.1.mixer."
    A = np.exp(model.varmap[mixer + "A_log"].data)
    assert ((A >= 1) & (A <= 16)).all() and np.all(model.varmap[mixer + "D"].data == 1)
    dt = np.log1p(np.exp(model.varmap[mixer + "dt_bias"].data.astype(np.float64)))
    assert ((dt >= 0.001 * (1 - 1e-5)) & (dt <= 0.1 * (1 + 1e-5))).all()
    bound = 1 / math.sqrt(d_inner) / math.sqrt(3)                        # kaiming-uniform(sqrt 5) / sqrt(n_layer)
    w = model.varmap[mixer + "out_proj.weight"].data
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert abs(model.varmap["backbone.embedding.weight"].data.std() - 0.02) < 0.002
    untied = Mamba2LMHeadModel(small_config(tie_embeddings=False, bias=True), VarMap(seed=0))
    assert untied.varmap["lm_head.weight"].shape == (56, 16)
    assert np.all(untied.varmap["backbone.layers.0.mixer.in_proj.bias"].data == 0)


# --- equality of the three ways to run a sequence ----------------------------------------------------------

@pytest.mark.parametrize("ngroups,extra", [(1, {}), (2, dict(dt_limit=(0.01, 0.5), bias=True))], ids=["g1", "g2"])
@pytest.mark.parametrize("l", [1, Q - 1, Q, Q + 1, 3 * Q + 5])
def test_full_forward_equals_scan_equals_prefill_then_step(l, ngroups, extra):
    model = small_model(seed=l, ngroups=ngroups, **extra)
    ids = np.random.default_rng(l).integers(0, 50, (2, l))
    full = model(ids).data                                              # (b, l, V) chunked
    model.backend = "scan"
    assert np.abs(model(ids).data - full).max() < 1e-10
    model.backend = "auto"
    split = l // 2 + 1 if l > 1 else 1
    cache = model.allocate_cache(2)
    with tg.no_grad():
        pieces = [model(ids[:, :split], cache).data]                    # prefill
    for t in range(split, l):
        pieces.append(model.step(ids[:, t], cache).data[:, None])       # then one token at a time
    assert cache.seqlen_offset == l
    assert np.abs(np.concatenate(pieces, axis=1) - full).max() < 1e-10
    cache = model.allocate_cache(2)                                     # prefill in two segments: the second
    with tg.no_grad():                                                  # starts from a non-zero state
        pieces = [model(ids[:, :split], cache).data] + ([model(ids[:, split:], cache).data] if split < l else [])
    assert np.abs(np.concatenate(pieces, axis=1) - full).max() < 1e-10


def test_logits_match_a_torch_reference():
    """The same weights through the equations of docs/mamba2.md (section 3) written with torch's own ops
    (conv1d with groups and left padding, softplus, a sequential scan, grouped gated RMSNorm)."""
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    model = small_model(seed=12, ngroups=2)
    c, (b, l) = model.config, (2, Q + 5)
    ids = np.random.default_rng(12).integers(0, 50, (b, l))
    W = {name: torch.tensor(t.data) for name, t in model.varmap.named_vars()}

    def rms(v, weight):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * weight

    x = W["backbone.embedding.weight"][torch.tensor(ids)]
    for i in range(c.n_layer):
        p = f"backbone.layers.{i}."
        z, xBC, dt = torch.split(rms(x, W[p + "norm.weight"]) @ W[p + "mixer.in_proj.weight"].T,
                                 [c.d_inner, c.conv_dim, c.nheads], dim=-1)
        xBC = tf.conv1d(xBC.transpose(1, 2), W[p + "mixer.conv1d.weight"], W[p + "mixer.conv1d.bias"],
                        padding=c.d_conv - 1, groups=c.conv_dim)[..., :l].transpose(1, 2)
        xs, B, C = torch.split(tf.silu(xBC), [c.d_inner, c.ngroups * c.d_state, c.ngroups * c.d_state], dim=-1)
        xs = xs.reshape(b, l, c.nheads, c.headdim)
        r = c.nheads // c.ngroups
        B = B.reshape(b, l, c.ngroups, c.d_state).repeat_interleave(r, dim=2)   # (b, l, h, n)
        C = C.reshape(b, l, c.ngroups, c.d_state).repeat_interleave(r, dim=2)
        dt = tf.softplus(dt + W[p + "mixer.dt_bias"])
        A = -torch.exp(W[p + "mixer.A_log"])
        S, ys = torch.zeros(b, c.nheads, c.headdim, c.d_state, dtype=torch.float64), []
        for t in range(l):
            decay, inflow = torch.exp(dt[:, t] * A)[..., None, None], (dt[:, t, :, None] * xs[:, t])[..., None]
            S = decay * S + inflow * B[:, t, :, None]                   # (b, h, p, n)
            ys.append(torch.einsum("bhpn,bhn->bhp", S, C[:, t]))
        y = (torch.stack(ys, 1) + W[p + "mixer.D"][:, None] * xs).reshape(b, l, c.d_inner) * tf.silu(z)
        y = rms(y.reshape(b, l, c.ngroups, -1), 1.0).reshape(b, l, c.d_inner) * W[p + "mixer.norm.weight"]
        x = x + y @ W[p + "mixer.out_proj.weight"].T
    logits = rms(x, W["backbone.norm_f.weight"]) @ W["backbone.embedding.weight"].T
    assert np.abs(model(ids).data - logits.numpy()).max() < 1e-10


def randomise_parameters(model, seed):
    """Move every parameter off its init (norm weights 1, D 1, zero biases hide bugs) to typical values; dt_bias
    spans softplus values from ~0.007 to ~3 (both ends of a dt_limit clamp) and one head sits past the
    softplus threshold of 20."""
    rng = np.random.default_rng(seed)
    for name, t in model.varmap.named_vars():
        fan_in = t.shape[-1] if t.ndim > 1 else 1
        if name.endswith("dt_bias"):
            value = rng.uniform(-5.0, 3.0, t.shape)
            value[0] = 22.0
        elif name.endswith("A_log"):
            value = np.log(rng.uniform(0.3, 4.0, t.shape))
        elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            value = 1 + 0.5 * rng.standard_normal(t.shape)
        else:                                                           # D, biases, weights
            value = rng.standard_normal(t.shape) / math.sqrt(fan_in)
        model.varmap.set_one(name, value)


@pytest.mark.parametrize("kw", [dict(ngroups=1), dict(ngroups=2), dict(ngroups=1, dt_limit=(0.01, 0.5)),
                                dict(ngroups=2, dt_limit=(0.05, 1.0), tie_embeddings=False, bias=True)],
                         ids=["g1", "g2", "g1-dt_limit", "g2-dt_limit-untied-bias"])
@pytest.mark.parametrize("l", [1, Q + 5, 3 * Q + 5])
def test_logits_match_an_independent_numpy_reference(l, kw):
    """The model's logits against mamba2_numpy_reference.py: the equations of docs/mamba2.md (section 3) in plain
    float64 NumPy with a sequential scan, reading the weights by their official names (no torch needed)."""
    model = small_model(seed=20 + l, **kw)
    randomise_parameters(model, seed=l)
    ids = np.random.default_rng(l).integers(0, 50, (2, l))
    weights = {name: t.data.copy() for name, t in model.varmap.named_vars()}
    expected = lm_logits(weights, ids, model.config)                    # (b, l, V)
    logits = model(ids).data
    assert logits.shape == expected.shape == (2, l, 56)
    assert np.abs(logits - expected).max() < 1e-10                      # logits are O(1..5) here


def test_step_is_constant_memory_and_builds_no_graph():
    model = small_model()
    cache = model.allocate_cache(3)
    shapes = [(s.conv.shape, s.ssm.shape) for s in cache.layers]
    for t in range(5):
        logits = model.step(np.array([1, 2, 3]), cache)
        assert not logits.requires_grad and logits.grad_fn is None
    assert [(s.conv.shape, s.ssm.shape) for s in cache.layers] == shapes == [((3, 32 + 2 * 4, 4), (3, 4, 8, 4))] * 2
    assert tg.is_grad_enabled()


# --- gradients ---------------------------------------------------------------------------------------------

def test_gradcheck_one_mixer_every_parameter():
    c = small_config(d_model=8, d_state=3, headdim=4, ngroups=2, chunk_size=4, bias=True)   # 4 heads, 2 groups
    varmap = VarMap(seed=5)
    mixer = Mamba2Mixer(VarBuilder.from_varmap(varmap, dtype="float64"), c)
    names = varmap.names()
    u = np.random.default_rng(5).standard_normal((2, 7, 8))  # l = 7: a padded tail

    def fn(u, *params):
        for name, p in zip(names, params):
            bind(mixer, name, p)
        return mixer(u)

    assert gradcheck(fn, u, *[varmap[name].data for name in names])


def test_gradcheck_two_layer_lm_loss_every_parameter():
    model = small_model(seed=6, ngroups=2, tie_embeddings=False)
    names = model.varmap.names()
    rng = np.random.default_rng(6)
    ids, targets = rng.integers(0, 50, (2, Q + 3)), rng.integers(0, 50, (2, Q + 3))

    values = {name: model.varmap[name].data.copy() for name in names}
    small = [name for name in names if values[name].size <= 64]        # D, A_log, dt_bias, norms, conv bias
    big = [name for name in names if values[name].size > 64]           # embedding, projections, lm_head
    assert len(small) == 6 * 2 + 1 and {"lm_head.weight", "backbone.embedding.weight"} <= set(big)

    def loss_of(varied):
        def fn(*params):
            for name in names:                                          # the others stay at their values
                bind(model, name, tg.Tensor(values[name]))
            for name, p in zip(varied, params):
                bind(model, name, p)
            return model.loss(ids, targets)
        return fn

    assert gradcheck(loss_of(small), *[values[name] for name in small])                 # every entry
    for seed in range(2):                                               # random directions, two draws
        assert gradcheck(loss_of(big), *[values[name] for name in big], fast=True, seed=seed)


@pytest.mark.parametrize("kw", [{}, dict(ngroups=2, tie_embeddings=False)])
def test_every_parameter_gets_a_gradient(kw):
    model = small_model(seed=7, dtype="float32", **kw)
    rng = np.random.default_rng(7)
    loss = model.loss(rng.integers(0, 50, (2, 13)), rng.integers(0, 50, (2, 13)))
    loss.backward()
    report = tg.gradient_report(loss, model.varmap, model=model)
    assert report.ok, str(report)
    assert all(np.abs(t.grad.data).max() > 0 for t in model.varmap.all_vars())


def test_a_training_step_leaves_no_reference_cycles():
    """The graph is freed by reference counting as soon as the loss goes: nothing waits for the cyclic
    GC (a cycle through the graph once made every step's activations pile up until a gen-2 collection)."""
    model = small_model(seed=11, dtype="float32", ngroups=2)
    ids = np.random.default_rng(11).integers(0, 50, (2, Q + 3))
    model.loss(ids, np.roll(ids, -1, 1)).backward()  # warm-up: numba's one-time compilation (fused ops) leaves cyclic garbage
    model.generate(ids[:, :3], 3)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)                                      # keep what the collector finds, to look at
    try:
        loss = model.loss(ids, np.roll(ids, -1, 1))
        loss.backward()
        del loss
        model.generate(ids[:, :3], 3)
        gc.collect()
        # only numba's own cycles may turn up (ctypes types of its code library, freed at odd times): none of
        # the graph's tensors, ops or arrays
        ours = [o for o in gc.garbage if isinstance(o, (tg.Tensor, Function, np.ndarray))
                or type(o).__module__.startswith("tinygrad_ssm")]
        assert not ours, [type(o) for o in ours[:10]]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


# --- long inputs -------------------------------------------------------------------------------------------

def test_65536_tokens_forward_is_finite():
    config = Mamba2Config(d_model=16, n_layer=1, vocab_size=256, d_state=8, headdim=8, chunk_size=64)
    model = Mamba2LMHeadModel(config, VarMap(seed=8))
    ids = np.random.default_rng(8).integers(0, 256, (1, 65536))
    with tg.no_grad():
        logits = model(ids)
    assert logits.shape == (1, 65536, 256) and logits.dtype == np.float32 and np.isfinite(logits.data).all()


# --- generation --------------------------------------------------------------------------------------------

def test_greedy_generation_matches_the_full_forward():
    model = small_model(seed=9)
    prompt = np.random.default_rng(9).integers(0, 50, (2, 5))
    out = model.generate(prompt, 6, temperature=0)
    assert out.shape == (2, 11) and out.dtype == np.int64 and np.array_equal(out[:, :5], prompt)
    for t in range(5, 11):                                              # each token is the argmax given the past
        logits = model(out[:, :t]).data[:, -1, :50]
        assert np.array_equal(out[:, t], logits.argmax(-1))
    assert np.array_equal(model.generate(prompt, 6, top_k=1, seed=3), out)


def test_sampling_is_seeded_stays_in_vocab_and_streams():
    model = small_model(seed=10)
    prompt = np.array([[1, 2, 3]])
    a = model.generate(prompt, 40, temperature=1.5, seed=0)
    assert np.array_equal(a, model.generate(prompt, 40, temperature=1.5, seed=0))
    assert not np.array_equal(a, model.generate(prompt, 40, temperature=1.5, seed=1))
    assert a[:, 3:].max() < 50                                          # never a padding row (50..55)
    stream = model.generate_stream(prompt, 4, seed=0)
    first = next(stream)
    assert first.shape == (1,) and tg.is_grad_enabled()                 # grad mode intact while suspended
    assert len(list(stream)) == 3
    assert model.generate(prompt[0], 0).shape == (1, 3)                 # a 1-d prompt is one sequence


def test_top_k_and_top_p_filter():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.05, 0.5, 0.15, 0.3]] * 2000))
    assert set(sample_next(logits, rng, top_p=0.7)) == {1, 3}           # 0.5 + 0.3 reaches 0.7
    assert set(sample_next(logits, rng, top_k=3)) == {1, 2, 3}
    assert set(sample_next(logits, rng, temperature=0)) == {1}
    assert set(sample_next(logits, rng)) == {0, 1, 2, 3}


@pytest.mark.parametrize("kw,message", [
    (dict(temperature=-1), "temperature"), (dict(top_k=0), "top_k"), (dict(top_p=1.5), "top_p"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
])
def test_generate_rejects_bad_arguments(kw, message):
    model = small_model()
    with pytest.raises(ValueError, match=message):
        model.generate(np.array([[1, 2]]), **{"max_new_tokens": 3, **kw})
    with pytest.raises(ValueError, match=message):                      # at the call, not at the first next()
        model.generate_stream(np.array([[1, 2]]), **{"max_new_tokens": 3, **kw})


def test_bad_inputs_are_named():
    model = small_model()
    with pytest.raises(ValueError, match=r"input_ids must be integers of shape \(b, l\)"):
        model(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"with b >= 1 and l >= 1, got dtype int64 shape \(0, 3\)"):
        model(np.zeros((0, 3), np.int64))  # a ZeroDivisionError deep in the scan before
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 56\)"):
        model(np.array([[1, 56]]))
    with pytest.raises(ValueError, match="targets"):
        model.loss(np.array([[1, 2]]), np.array([[1, 2, 3]]))
    with pytest.raises(ValueError, match="cache is for batch 2"):
        model.step(np.array([1, 2, 3]), model.allocate_cache(2))
    # another model's cache with fewer layers: zip skipped the layers past its end, and the logits were wrong
    shallow = Mamba2LMHeadModel(small_config(n_layer=1), VarMap(seed=1))
    for fused in (True, False):
        deep = Mamba2LMHeadModel(small_config(), VarMap(seed=0), fused=fused)
        with pytest.raises(ValueError, match=rf"cache holds 1 layers' states, this model has {deep.config.n_layer} "
                                             r"layers; allocate it with this model's allocate_cache"):
            deep(np.array([[1, 2]]), shallow.allocate_cache(1))
        with pytest.raises(ValueError, match="cache holds 1 layers' states"):
            deep.step(np.array([1]), shallow.allocate_cache(1))
        with pytest.raises(TypeError, match=r"step: cache must be a Mamba2Cache \(model.allocate_cache\(batch\)\), "
                                            r"got NoneType"):
            deep.step(np.array([1]), None)
    for dtype in ("float16", "bfloat16"):
        with pytest.raises(ValueError, match="dtype must be one of"):
            Mamba2LMHeadModel(small_config(), dtype=dtype)
    # None is the default, as transformers' dtype=None (np.dtype(None) is float64: it gave a float64 model)
    assert Mamba2LMHeadModel(small_config(), VarMap(seed=0), dtype=None).dtype == np.float32
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        Mamba2LMHeadModel(small_config(), backend="fast")


def test_fused_model_packs_each_projection_kind_in_one_huge_page_block():
    """fused=True: every layer's in_proj weight lies in one block starting on a huge page boundary (out_proj's in
    another), so the decoder streams them from huge pages (VarMap.reserve_block); the weights are the same bits
    as fused=False's plain arrays from the same seed."""
    from tinygrad_ssm.registry import HUGE_PAGE
    config = Mamba2Config(d_model=256, n_layer=4, vocab_size=64, d_state=64, headdim=64, chunk_size=64)
    fused = Mamba2LMHeadModel(config, VarMap(seed=6), fused=True)
    plain = Mamba2LMHeadModel(config, VarMap(seed=6), fused=False)
    for proj in ("in_proj", "out_proj"):
        arrays = [getattr(layer.mixer, proj).weight.data for layer in fused.layers]
        assert arrays[0].ctypes.data % HUGE_PAGE == 0
        assert all(b.ctypes.data - a.ctypes.data == a.nbytes for a, b in zip(arrays, arrays[1:]))
        assert all(getattr(layer.mixer, proj).weight.data.base is None for layer in plain.layers)
    for (name, a), (other, b) in zip(fused.varmap.named_vars(), plain.varmap.named_vars()):
        assert name == other
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)


def test_a_model_and_a_cache_that_decoded_still_pickle_and_deepcopy():
    """The fused decoder kept numba's typed lists on the model and the cache: after one generate neither could be
    pickled or deep-copied (a spawned process could not take the model)."""
    import copy
    import pickle
    model = Mamba2LMHeadModel(small_config(), VarMap(seed=0))
    ids = np.array([[1, 2, 3]])
    tokens = model.generate(ids, 4, temperature=0)
    import warnings
    from tinygrad_ssm.models.mamba2 import decode
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # a deep copy's weights were copied at every step, 15x slower
            np.testing.assert_array_equal(twin.generate(ids, 4, temperature=0), tokens)
        assert not decode._weights(twin).copied                        # its own arrays, taken once
    cache = model.allocate_cache(1)
    model.step(np.array([1]), cache)
    copies = [pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)]
    expected = model.step(np.array([2]), cache).data
    for twin in copies:
        np.testing.assert_array_equal(model.step(np.array([2]), twin).data, expected)
