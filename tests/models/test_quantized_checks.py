"""A quantized weight is checked wherever one is made (quantize, a folder, a hand-made QuantizedWeight): the numba
kernels index without bounds checks, so a wrong shape, dtype or layout read past the arrays, and values the format
cannot hold (an inf scale, bfloat16's inf/NaN bits, int8's -128) gave NaN or wrong logits, no error (found by an audit
of the quantized path, 2026-12-07)."""
import json
import warnings

import numpy as np
import pytest

from tinygrad_ssm import Mamba2LMHeadModel, Tensor, VarBuilder, VarMap, nn
from tinygrad_ssm.io.safetensors import SafetensorsFile, save_file
from tinygrad_ssm.models.mamba2 import quantize as Q
from tinygrad_ssm.models.mamba2.checkpoint_config import PretrainedError
from tests.models.test_quantize import small_model

OUT_PROJ = "backbone.layers.0.mixer.out_proj.weight"


def test_a_hand_made_quantized_weight_of_the_wrong_shape_or_layout_is_refused():
    model = small_model().quantize("int8")
    proj = model.layers[0].mixer.out_proj
    q, s = proj.weight.data, proj.weight.scales                        # (out, in) int8, (out, in / block) float32
    for data, scales, message in [
            (q, np.ones((q.shape[0], 3), np.float32), r"in \(\d+\) a multiple of its columns"),   # block 21.3
            (q, np.ones((5, s.shape[1]), np.float32), r"scales must be .* \(rows \d+"),
            (q, s.astype(np.float64), r"scales must be a C-contiguous float32"),
            (q.astype(np.int16), s, r"int8 data must be a C-contiguous 2-D int8"),
            (q, -s, r"finite, >= 0 and at most"), (q, s * np.float32(np.inf), r"finite, >= 0 and at most")]:
        with pytest.raises(ValueError, match=message):
            Q.QuantizedWeight("int8", data, scales)
    with pytest.raises(ValueError, match=r"holds -128"):
        Q.QuantizedWeight("int8", np.full_like(q, -128), s)
    zero_block = s.copy()
    zero_block[0, 0] = 0                                               # a block of nonzero codes with scale 0
    for data, scales in [(q // 2, s), (q, zero_block)]:                # a peak of 63 with its scale: reads halved
        with pytest.raises(ValueError, match=r"a weight of \|q\| = 127 when their scale is > 0, and only zeros"):
            Q.QuantizedWeight("int8", data, scales)
    with pytest.raises(ValueError, match=r"finite, >= 0 and at most"):
        Q.QuantizedWeight("int8", np.zeros_like(q), np.full_like(s, -0.0))   # -0.0 passes >= 0
    Q.QuantizedWeight("int8", np.zeros_like(q), np.zeros_like(s))          # all zeros with scale 0: a zero matrix
    bits = np.full((2, 4), 0x3F80, np.uint16)                              # 1.0 in bfloat16
    with pytest.raises(ValueError, match=r"bfloat16 weights have no scales"):
        Q.QuantizedWeight("bfloat16", bits, np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"bfloat16 data holds inf or NaN bits"):
        Q.QuantizedWeight("bfloat16", np.full((2, 4), 0x7FC0, np.uint16))


DECODER_PLACES = ["layers.0.mixer.in_proj.weight", "layers.1.mixer.out_proj.weight", "layers.0.mixer.conv1d.weight",
                  "layers.0.mixer.conv1d.bias", "layers.1.mixer.dt_bias", "layers.0.mixer.A_log", "layers.0.mixer.D",
                  "layers.0.mixer.norm.weight", "layers.1.norm.weight", "embedding.weight", "norm_f.weight"]


@pytest.mark.parametrize("place", DECODER_PLACES)
def test_every_parameter_the_decoder_reads_is_checked_for_its_shape(place):
    """Each parameter the decoder reads, replaced by one a row short: refused, naming it (only out_proj's was tested;
    the kernels read past the others' ends as well)."""
    model = small_model()
    *path, attr = place.split(".")
    module = model
    for part in path:
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    setattr(module, attr, Tensor(getattr(module, attr).data[:-1].copy()))
    with pytest.raises(ValueError, match=rf"\.{attr} has shape \(.*, the model's config wants"):
        model.step(np.array([3, 4]), model.allocate_cache(2))


def test_a_replaced_weight_of_another_shape_is_refused_by_the_decoder():
    """out_proj.weight = Tensor(w[:10]), or a Linear of another shape made under another name: the float decoder read
    past it and stepped on (logits off by 3). A module of another class (an adapter, whose call the decoder would
    skip: tests/models/test_decode.py) is refused by its class, and decodes with fused=False."""
    model = small_model()
    proj = model.layers[0].mixer.out_proj
    proj.weight = Tensor(proj.weight.data[:10].copy())
    with pytest.raises(ValueError, match=r"out_proj.weight has shape \(10, \d+\), the model's config wants"):
        model.step(np.array([3, 4]), model.allocate_cache(2))
    model = small_model()
    mixer, c = model.layers[0].mixer, model.config
    vb = VarBuilder.from_varmap(VarMap(seed=5), dtype=model.dtype)
    mixer.out_proj = nn.Linear(vb.pp("other"), 8, c.d_model, bias=False)
    with pytest.raises(ValueError, match=r"other.weight has shape \(\d+, 8\), the model's config wants"):
        model.step(np.array([3, 4]), model.allocate_cache(2))

    class Adapter:                                                      # no name: the shapes are what count
        def __init__(self, linear):
            self.linear, self.weight, self.bias = linear, linear.weight, linear.bias

        def __call__(self, x):
            return self.linear(x)

    model = small_model()
    want = model.generate(np.array([[3, 9, 27]]), 3, temperature=0)
    model.layers[0].mixer.out_proj = Adapter(model.layers[0].mixer.out_proj)
    with pytest.raises(ValueError, match=r"backbone.layers.0.mixer.out_proj is a Adapter, not a Linear"):
        model.generate(np.array([[3, 9, 27]]), 3, temperature=0)
    model.fused = False
    np.testing.assert_array_equal(model.generate(np.array([[3, 9, 27]]), 3, temperature=0), want)


@pytest.mark.parametrize("fmt", Q.FORMATS)
@pytest.mark.parametrize("weight", [1e41, float(np.finfo(np.float32).max)])
def test_quantizing_a_weight_past_the_formats_range_is_refused_by_name(fmt, weight):
    """A finite float64 weight of 1e41: int8's float32 scale was inf (every weight of the block 0 * inf = NaN),
    bfloat16's bits inf; quantize accepted it and the forward was NaN. float32's max itself: int8's scale is
    finite, but 127 of it is inf (an audit: the forward's dequantized weight inf, the decoder's 3.4e38)."""
    model = small_model()
    model.varmap[OUT_PROJ].data[0, 0] = weight
    with pytest.raises(ValueError, match=rf"quantize: {OUT_PROJ}: .*nothing was changed"):
        model.quantize(fmt)
    assert not getattr(model, "quantized", None)


@pytest.mark.parametrize("fmt, bad", [("int8", -128), ("bfloat16", 0x7FC0), ("bfloat16", 0x7F80)])
def test_a_folder_whose_weights_the_format_cannot_hold_is_refused_by_name(fmt, bad, tmp_path):
    small_model(dtype="float32").quantize(fmt).save_pretrained(tmp_path)
    with SafetensorsFile(tmp_path / "model.safetensors") as f:
        arrays = {name: np.array(f.read(name)) for name in f.tensors}
    arrays[OUT_PROJ][0, 0] = bad
    (tmp_path / "model.safetensors").unlink()
    save_file(tmp_path / "model.safetensors", arrays)
    with pytest.raises(PretrainedError, match=rf"tensor '{OUT_PROJ}': .*(-128|inf or NaN bits)"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("fmt, change", [("int8", {"bits": 4}), ("bfloat16", {"block": 7})])
def test_a_quantization_entry_with_another_key_is_refused_naming_config_json(fmt, change, tmp_path):
    """{"bits": 4} was ignored (another format read as this one); a bfloat16 folder's block failed with quantize()'s
    message, naming neither the folder nor config.json."""
    small_model(dtype="float32").quantize(fmt).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization"] |= change
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match=r"config.json: 'quantization' must be .*no other key"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_a_quantized_embeddings_lookup_refuses_ids_out_of_range_as_nn_embedding():
    """Called directly, it took -1 as the last padded row and float ids with NumPy's indexing message."""
    embedding = small_model().quantize("int8").embedding
    for ids in (np.array([[1, -1]]), np.array([[1.0, 2.0]]), np.array([[10**6]])):
        with pytest.raises(IndexError, match=r"QuantizedEmbedding: ids must be integers in \[0, \d+\)"):
            embedding(ids)
    assert embedding(np.array([[1, 2]])).shape == (1, 2, embedding.dim)


def test_a_non_finite_float_weight_in_a_quantized_folder_is_refused(tmp_path):
    """The norms, conv and dt parameters of a quantized folder are stored as floats: a NaN there loaded silently (the
    float folder's weights are checked as they are read; the quantized ones by format_problem)."""
    small_model().quantize("int8").save_pretrained(tmp_path)
    weights = SafetensorsFile(tmp_path / "model.safetensors")
    arrays = {name: weights.read(name) for name in weights.tensors}
    weights.close()
    name = next(n for n in arrays if n.endswith("norm_f.weight"))
    arrays[name][0] = np.nan
    save_file(tmp_path / "model.safetensors", arrays, metadata={"format": "pt"})
    with pytest.raises(PretrainedError, match=rf"tensor '{name}' holds 1 non-finite value\(s\).*would compute NaN"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


def test_int8_warns_when_no_block_of_8_to_32_divides_the_model():
    """d_model 36 takes blocks of 18: decoding them takes no vectors (docs/kernels.md: 8-14x float32's time) and
    under 8 the scales make int8 no smaller than bfloat16 (an audit: d_model 37's blocks of 1 took 1.25x float32's
    bytes), which the default chose without a word. d_model 48's blocks of 24 take vectors of 8: no warning."""
    with pytest.warns(RuntimeWarning, match=r"int8 in blocks of 18 weights .*d_model 36 .*several times slower"):
        small_model(d_model=36, headdim=9, dtype="float32").quantize("int8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small_model(d_model=48, headdim=8, dtype="float32").quantize("int8")
        small_model(d_model=36, headdim=9, dtype="float32").quantize("int8", block=4)   # asked for


def test_the_default_int8_block_is_a_multiple_of_8_wherever_one_divides_the_model():
    """d_model 360 took block 30, the largest divisor up to 32, which the decoder reads without vectors (0.44 s for
    200 tokens against 0.071 at block 24, one thread), and warned that no multiple of 8 divides it, which 24
    does; a block given as np.uint8 overflowed in NumPy 2's arithmetic; quantize_int8's block 0 was a
    ZeroDivisionError."""
    from tinygrad_ssm.models.mamba2 import quantize as Q
    from tinygrad_ssm.models.mamba2 import Mamba2Config
    for d_model, block in ((360, 24), (40, 8), (80, 16), (96, 32), (36, 18), (37, 1)):
        assert Q.default_block(Mamba2Config(d_model=d_model, n_layer=1, vocab_size=20, headdim=2)) == block, d_model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = small_model(d_model=40, headdim=8, dtype="float32").quantize("int8")
    assert {w.block for w in model.quantized.values()} == {8}
    wide = small_model(d_model=256, headdim=32, dtype="float32")
    assert {w.block for w in wide.quantize("int8", block=np.uint8(16)).quantized.values()} == {16}
    for block in (0, -8, 2.0, True):
        with pytest.raises(ValueError, match=rf"quantize int8: block must be a positive int, got {block!r}"):
            Q.quantize_int8(np.ones((2, 16)), block)
