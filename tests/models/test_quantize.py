"""Weight-only quantization (models/mamba2/quantize.py): the formats against their definitions (and torch's
bfloat16), the quantized model's forward against the float64 forward of the dequantized weights, the memory
dropped, generation's tokens against the engine-op model on the dequantized weights."""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
from tinygrad_ssm.io import safetensors
from tinygrad_ssm.models.mamba2 import quantize as Q


def small_model(dtype="float64", seed=0, tied=True, **overrides):
    kw = {"d_model": 32, "n_layer": 2, "vocab_size": 50, "d_state": 8, "headdim": 8, "expand": 2, "chunk_size": 4,
          "ngroups": 2, "tie_embeddings": tied}
    kw.update(overrides)
    varmap = VarMap(seed=seed)
    model = Mamba2LMHeadModel(Mamba2Config(**kw), varmap, dtype=dtype)
    rng = np.random.default_rng(seed)
    for t in varmap.all_vars():  # off the init's constants so every term counts
        t.data[...] += rng.uniform(-0.3, 0.3, t.shape).astype(t.dtype)
    return model


def dequantized_twin(model, fused=False, dtype="float64"):
    """A float model holding the quantized model's weights dequantized (the spec), other parameters copied."""
    twin = Mamba2LMHeadModel(model.config, VarMap(seed=1), dtype=dtype, fused=fused)
    for name, t in twin.varmap.named_vars():
        w = model.quantized[name].rows(0, t.shape[0]) if name in model.quantized else model.varmap[name].data
        twin.varmap.set_one(name, w)
    return twin


@given(rows=st.integers(1, 5), blocks=st.integers(1, 4), block=st.sampled_from([1, 4, 32]),
       scale=st.floats(1e-6, 1e3), seed=st.integers(0, 2**16))
def test_int8_format_is_its_definition(rows, blocks, block, scale, seed):
    w = np.random.default_rng(seed).standard_normal((rows, blocks * block)) * scale
    w[0, :block] = 0.0                                                  # a zero block: s = 0, q = 0
    q, s = Q.quantize_int8(w, block)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (rows, blocks)
    assert s[0, 0] == 0 and not q[0, :block].any() and np.abs(q).max() <= 127
    expected_s = (np.abs(w.reshape(rows, blocks, block)).max(axis=2) / 127).astype(np.float32)
    np.testing.assert_array_equal(s, expected_s)
    back = Q.dequantize("int8", q, s)
    err = np.abs(back - w).reshape(rows, blocks, block)
    assert (err <= s.astype(np.float64)[:, :, None] * (0.5 + 1e-6) + 1e-300).all()   # round to nearest


def test_bfloat16_format_is_torchs():
    torch = pytest.importorskip("torch", reason="torch is an optional reference (pip install -e '.[bench]')")
    rng = np.random.default_rng(0)
    w = np.concatenate([rng.standard_normal(1000).astype(np.float32) * 10.0 ** rng.integers(-20, 20, 1000),
                        np.array([0.0, -0.0, np.inf, -np.inf, 3.3895314e38, 1.0000001, 1.0 + 2 ** -8], np.float32)])
    bits = Q.quantize_bfloat16(w)
    expected = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bits, expected)
    assert np.isnan(Q.dequantize("bfloat16", Q.quantize_bfloat16(np.array([np.nan], np.float32)))).all()


@pytest.mark.parametrize("slab", [1, 33, 10**9])
def test_quantizing_in_slabs_gives_the_whole_matrixs_arrays(slab, monkeypatch):
    w = np.random.default_rng(3).standard_normal((37, 64)) * 10.0 ** np.arange(37)[:, None] / 1e18
    whole_q, whole_s = Q.quantize_int8(w, 16)
    whole_b = Q.quantize_bfloat16(w)
    monkeypatch.setattr(Q, "SLAB_ELEMENTS", slab)
    monkeypatch.setattr(safetensors, "BF16_SLAB", slab)
    q, s = Q.quantize_int8(w, 16)
    np.testing.assert_array_equal(q, whole_q)
    np.testing.assert_array_equal(s, whole_s)
    np.testing.assert_array_equal(Q.quantize_bfloat16(w), whole_b)


@pytest.mark.parametrize("fmt", Q.FORMATS)
def test_quantizing_a_matrix_holds_slabs_not_copies_of_it(fmt):
    """Whole-matrix temporaries made loading with --weights peak at 3x a float32 load (6.3x the head's 147 MiB
    at the 130M shape for int8, 5x for bfloat16); slabs of rows keep them a few MB whatever the matrix."""
    w = np.random.default_rng(4).standard_normal((4096, 1024)).astype(np.float32)     # 16 MiB
    tracemalloc.start()
    try:
        made = Q.QuantizedWeight.from_float(w, fmt)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - made.nbytes < 10 << 20                                # a float64 copy of w alone is 32 MiB


def test_bad_arguments_are_refused():
    model = small_model()
    with pytest.raises(ValueError, match="format must be one of"):
        model.quantize("int4")
    with pytest.raises(ValueError, match=r"block 7 does not divide the input sizes of the quantized matrices \(d_model "
                                         r"32, d_inner 64\); leave block out to take 32"):
        model.quantize("int8", block=7)
    with pytest.raises(ValueError, match="block must be a positive int, got True"):  # a bool is no block
        model.quantize("int8", block=True)
    assert model.varmap["backbone.embedding.weight"].dtype == np.float64   # nothing changed before the error
    model.quantize("int8")
    with pytest.raises(ValueError, match="already quantized"):
        model.quantize("bfloat16")


@pytest.mark.parametrize("fmt", Q.FORMATS)
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_forward_equals_float64_forward_of_dequantized_weights(fmt, tied, fused, monkeypatch):
    monkeypatch.setattr(Q, "ROWS_PER_BLOCK", 7)                        # several blocks of rows, a partial one
    model = small_model(tied=tied)
    model.fused = fused
    for layer in model.layers:
        layer.mixer.fused = fused
    model.quantize(fmt, block=8 if fmt == "int8" else None)
    ids = np.random.default_rng(1).integers(0, 50, (2, 11))
    reference = dequantized_twin(model)(ids).data
    np.testing.assert_allclose(model(ids).data, reference, rtol=1e-10, atol=1e-10)
    assert float(model.loss(ids[:, :-1], ids[:, 1:]).data) == pytest.approx(
        float(dequantized_twin(model).loss(ids[:, :-1], ids[:, 1:]).data), rel=1e-10)


@pytest.mark.parametrize("fmt", Q.FORMATS)
def test_float32_forward_is_the_float64_one_to_float32_rounding(fmt):
    model = small_model(dtype="float32").quantize(fmt)
    ids = np.random.default_rng(2).integers(0, 50, (1, 13))
    logits = model(ids).data
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, dequantized_twin(model)(ids).data, rtol=1e-4, atol=1e-4)


def test_quantize_drops_the_float_copies():
    model = small_model(dtype="float32", d_model=64, n_layer=3, vocab_size=512)
    before = Q.resident_weight_bytes(model)
    names = Q.quantized_names(model)
    model.quantize("int8")
    assert not any(name in model.varmap for name in names)
    ratio = Q.resident_weight_bytes(model) / before
    assert ratio < 0.32                                                 # 0.28 + the float32 norms / conv / dt
    assert isinstance(model.embedding, Q.QuantizedEmbedding) and model.quantized[names[0]].data.dtype == np.int8


def test_repr_counts_the_quantized_parameters_and_says_so():
    model = small_model()
    before = model.varmap.num_parameters()
    assert f"{before:,} parameters, float64" in repr(model)
    model.quantize("int8")
    quantized = sum(int(np.prod(w.shape)) for w in model.quantized.values())
    assert f"{before:,} parameters ({quantized:,} of them int8, inference only)" in repr(model)


@pytest.mark.parametrize("fmt", Q.FORMATS)
@pytest.mark.parametrize("batch", [1, 3])
def test_generation_gives_the_engine_models_tokens_on_dequantized_weights(fmt, batch):
    model = small_model(seed=4, d_model=64, headdim=16).quantize(fmt)
    prompt = np.random.default_rng(4).integers(0, 50, (batch, 5))
    reference = dequantized_twin(model, fused=False).generate(prompt, 30, temperature=0)
    np.testing.assert_array_equal(model.generate(prompt, 30, temperature=0), reference)


def test_a_quantized_weight_replaced_on_its_module_is_read_by_the_decoder():
    """The decoder takes a quantized matrix as stored and checks it each step, as a float parameter: a new
    QuantizedWeight on its module (here q negated) is what the next step reads, as the engine's forward does."""
    model = small_model().quantize("int8")
    ids = np.array([[3], [4]])
    model.step(ids[:, 0], model.allocate_cache(2))                      # the decoder takes the weights
    proj = model.layers[0].mixer.in_proj
    proj.weight = Q.QuantizedWeight("int8", -proj.weight.data, proj.weight.scales)
    np.testing.assert_allclose(model.step(ids[:, 0], model.allocate_cache(2)).data,
                               model(ids, model.allocate_cache(2)).data[:, -1], rtol=1e-10, atol=1e-10)

@pytest.mark.parametrize("fmt", Q.FORMATS)
def test_save_and_load_give_the_same_quantized_model(fmt, tmp_path):
    model = small_model(dtype="float32", tied=fmt == "int8").quantize(fmt)
    model.save_pretrained(tmp_path)
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path)
    assert loaded.weights_format == fmt and set(loaded.quantized) == set(model.quantized)
    for name, w in model.quantized.items():
        np.testing.assert_array_equal(loaded.quantized[name].data, w.data)
        if w.scales is not None:
            np.testing.assert_array_equal(loaded.quantized[name].scales, w.scales)
    ids = np.random.default_rng(0).integers(0, 50, (1, 7))
    np.testing.assert_array_equal(loaded(ids).data, model(ids).data)
    np.testing.assert_array_equal(loaded.generate(ids, 5, temperature=0), model.generate(ids, 5, temperature=0))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0])
def test_a_corrupt_scale_is_refused_naming_file_and_tensor(bad, tmp_path):
    from tinygrad_ssm.io.safetensors import load_file, save_file
    small_model(dtype="float32").quantize("int8").save_pretrained(tmp_path)
    arrays = load_file(tmp_path / "model.safetensors")
    key = "backbone.layers.1.mixer.out_proj.weight.scales"
    arrays[key][0, 0] = bad
    save_file(tmp_path / "model.safetensors", arrays)
    with pytest.raises(ValueError, match=rf"model.safetensors.*{key}.*NaN, infinite or negative"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_a_q_array_of_the_wrong_dtype_or_shape_is_refused(tmp_path):
    from tinygrad_ssm.io.safetensors import load_file, save_file
    small_model(dtype="float32").quantize("int8").save_pretrained(tmp_path)
    arrays = load_file(tmp_path / "model.safetensors")
    key = "backbone.layers.0.mixer.in_proj.weight"
    for wrong in (arrays[key].astype(np.int16), arrays[key][:-1]):
        save_file(tmp_path / "model.safetensors", {**arrays, key: wrong})
        with pytest.raises(ValueError, match=rf"model.safetensors.*{key}.*expected I8"):
            Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_a_float_parameter_stored_as_integers_or_an_extra_tensor_is_refused(tmp_path):
    """Beside the quantized matrices, a quantized folder holds float parameters (read as floats) and nothing
    else: integers where a float is expected, or a tensor no parameter names, is a corrupt file."""
    from tinygrad_ssm.io.safetensors import load_file, save_file
    small_model(dtype="float32").quantize("int8").save_pretrained(tmp_path)
    arrays = load_file(tmp_path / "model.safetensors")
    key = "backbone.norm_f.weight"
    save_file(tmp_path / "model.safetensors", {**arrays, key: arrays[key].astype(np.int32)})
    with pytest.raises(ValueError, match=rf"model.safetensors.*{key}.*has dtype I32.*expected a float dtype"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)
    save_file(tmp_path / "model.safetensors", {**arrays, "backbone.extra": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"model.safetensors.*unexpected \['backbone.extra'\]"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("block", [0, -8, True, "8"])
def test_a_quantization_entry_without_a_positive_int_block_is_refused(block, tmp_path):
    """config.json's int8 block must be a positive int (not a bool): 0 divided by zero, a negative one and True
    were refused, if at all, for their scales' shapes."""
    import json
    small_model(dtype="float32").quantize("int8", block=8).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization"]["block"] = block
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: 'quantization' must be .*a positive int for int8"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_a_block_that_does_not_divide_the_inputs_is_refused_naming_the_file(tmp_path):
    """Block 7 with scales of in // 7 columns (the shapes a floor division would expect): refused as a corrupt
    file, naming it, before any weight is read."""
    import json

    from tinygrad_ssm.io.safetensors import load_file, save_file
    small_model(dtype="float32").quantize("int8", block=8).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization"]["block"] = 7
    (tmp_path / "config.json").write_text(json.dumps(config))
    arrays = load_file(tmp_path / "model.safetensors")
    for key in [k for k in arrays if k.endswith(".scales")]:
        rows, cols = arrays[key.removesuffix(".scales")].shape
        arrays[key] = np.ones((rows, cols // 7), np.float32)
    save_file(tmp_path / "model.safetensors", arrays)
    with pytest.raises(ValueError, match=r"model.safetensors.*scales.*expected F32 \(\d+, \d+ / block 7\)"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_cli_eval_and_generate_take_weights(tmp_path, capsys):
    import json

    from tinygrad_ssm.train import cli
    small_model(dtype="float32", vocab_size=256, d_model=64, headdim=16).save_pretrained(tmp_path / "m")
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 20)
    ppl = {}
    for weights in ("float32", "bfloat16", "int8"):
        assert cli.main(["eval", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "text.txt"),
                         "--weights", weights, "--json", str(tmp_path / f"{weights}.json"), "--no-progress"]) == 0
        report = json.loads((tmp_path / f"{weights}.json").read_text())
        ppl[weights] = report["perplexity"]
        assert report["weights"] == ("float" if weights == "float32" else weights)
        printed = capsys.readouterr().out                               # the text says which weights it scored
        assert ("weights:" not in printed) if weights == "float32" else (f"\nweights: {weights} (in_proj" in printed)
    assert ppl["int8"] != ppl["float32"] and abs(ppl["int8"] / ppl["float32"] - 1) < 0.05
    capsys.readouterr()
    assert cli.main(["generate", "--model", str(tmp_path / "m"), "--prompt", "the", "--max-new-tokens", "5",
                     "--temperature", "0", "--weights", "int8"]) == 0
    assert capsys.readouterr().out


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_weights_float32_with_another_dtype_is_refused(command, tmp_path, capsys):
    """--weights float32 --dtype float64 scored a float64 model and said nothing."""
    from tinygrad_ssm.train import cli
    small_model(dtype="float32", vocab_size=256, d_model=64, headdim=16).save_pretrained(tmp_path / "m")
    (tmp_path / "text.txt").write_text("the quick brown fox. " * 20)
    rest = ["--data", str(tmp_path / "text.txt"), "--no-progress"] if command == "eval" else ["--prompt", "the"]
    assert cli.main([command, "--model", str(tmp_path / "m"), "--weights", "float32", "--dtype", "float64",
                     *rest]) == cli.EXIT_USAGE
    assert "--weights float32 with the model in float64" in capsys.readouterr().err


def test_int8_takes_a_block_that_fits_any_model_and_the_cli_too(tmp_path, capsys):
    """d_model 48: the default block 32 did not divide it, and --weights int8 told the user to choose a block,
    which the CLI has no flag for."""
    from tinygrad_ssm.train import cli
    small_model(dtype="float32", vocab_size=256, d_model=48, headdim=8).save_pretrained(tmp_path / "m")
    chosen = Mamba2LMHeadModel.from_pretrained(tmp_path / "m").quantize("int8")
    assert Q.default_block(chosen.config) == 24 and {w.block for w in chosen.quantized.values()} == {24}
    given = Mamba2LMHeadModel.from_pretrained(tmp_path / "m").quantize("int8", block=24)
    ids = np.array([[3, 1, 4]])
    np.testing.assert_array_equal(chosen(ids).data, given(ids).data)
    assert cli.main(["generate", "--model", str(tmp_path / "m"), "--weights", "int8", "--prompt", "hi",
                     "--max-new-tokens", "3", "--temperature", "0"]) == cli.EXIT_OK
    assert capsys.readouterr().out.startswith("hi")


def test_saving_a_model_whose_varmap_another_model_quantized_is_refused(tmp_path):
    """Quantizing drops float arrays from the VarMap: a second model on it saved a folder without them, and the
    error came only when loading."""
    varmap = VarMap(seed=0)
    config = small_model().config
    a, b = Mamba2LMHeadModel(config, varmap), Mamba2LMHeadModel(config, varmap, fused=False)
    a.quantize("int8")
    with pytest.raises(ValueError, match="the model's VarMap lacks backbone.layers.0.mixer.in_proj.weight.*another "
                                         "model on the same VarMap was quantized"):
        b.save_pretrained(tmp_path / "b")
    assert not (tmp_path / "b").exists()
    a.save_pretrained(tmp_path / "a")  # the quantized one saves its own format


@pytest.mark.parametrize("fmt", Q.FORMATS)
@pytest.mark.parametrize("tied", [True, False])
def test_backward_through_quantized_weights_is_refused_naming_the_module(fmt, tied):
    """A loss.backward() after quantize failed with the engine's 'does not require grad' (the graph was cut at
    every quantized product): now it names the module and says what to do; no gradient is left anywhere."""
    model = small_model(tied=tied).quantize(fmt)
    ids = np.array([[1, 2, 3, 4]])
    loss = model.loss(ids[:, :-1], ids[:, 1:])
    head = "backbone.embedding" if tied else "lm_head"
    with pytest.raises(RuntimeError, match=rf"backward through '{head}': its weights are {fmt} \(model.quantize\), "
                                           rf"for inference only.*train or fine-tune the float model, then quantize"):
        loss.backward()
    assert all(t.grad is None for t in model.varmap.all_vars())
    from tinygrad_ssm import no_grad
    with no_grad():                                                     # inference builds no graph
        assert model(ids).grad_fn is None and not model(ids).requires_grad


@pytest.mark.parametrize("fmt", Q.FORMATS)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_weight_is_refused_naming_it_and_nothing_changes(fmt, bad):
    """int8 made that block's scale NaN and its 32 weights 0, and saved a folder from_pretrained called corrupt;
    bfloat16 saved the NaN. A float model's save refuses non-finite weights: so does quantize."""
    model = small_model(dtype="float32")
    name = "backbone.layers.1.mixer.out_proj.weight"
    model.varmap[name].data[2, 3] = bad
    with pytest.raises(ValueError, match=rf"quantize: tensor '{name}' holds 1 non-finite value\(s\).*nothing was "
                                         rf"changed"):
        model.quantize(fmt)
    assert getattr(model, "weights_format", "float") == "float" and name in model.varmap


@pytest.mark.parametrize("fmt", Q.FORMATS)
def test_a_quantized_save_is_checked_as_a_float_save_is(fmt, tmp_path):
    """save_pretrained of a quantized model wrote through nothing's checks: it replaced a link and another
    program's config.json, wrote a non-finite float parameter, and failed on a file path with FileExistsError."""
    from tinygrad_ssm.models.mamba2.pretrained import PretrainedError
    model = small_model(dtype="float32").quantize(fmt)
    link = tmp_path / "link"
    link.mkdir()
    (tmp_path / "target").write_bytes(b"theirs")
    (link / "model.safetensors").symlink_to(tmp_path / "target")
    with pytest.raises(PretrainedError, match=r"model.safetensors' is a symbolic link; nothing is written"):
        model.save_pretrained(link)
    assert (link / "model.safetensors").is_symlink() and not (link / "config.json").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"my": "settings"}')
    with pytest.raises(PretrainedError, match="holds config.json of something other than a Mamba-2 model"):
        model.save_pretrained(other)
    assert (other / "config.json").read_text() == '{"my": "settings"}' and not (other / "model.safetensors").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(PretrainedError, match="is a file; give a folder"):
        model.save_pretrained(tmp_path / "file")
    model.varmap["backbone.norm_f.weight"].data[0] = np.nan
    with pytest.raises(PretrainedError, match="tensor 'backbone.norm_f.weight' holds 1 non-finite.*nothing was "
                                              "written"):
        model.save_pretrained(tmp_path / "nan")
    assert not (tmp_path / "nan").exists()


def test_a_block_for_bfloat16_is_refused():
    """quantize("bfloat16", block=3) ignored the block without a word (found by an API audit)."""
    model = small_model(dtype="float32")
    with pytest.raises(ValueError, match=r"block applies to int8 .* bfloat16 has none"):
        model.quantize("bfloat16", block=3)
    assert getattr(model, "weights_format", "float") == "float"

