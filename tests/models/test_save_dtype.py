"""save_pretrained(dtype=...): every weight stored in bfloat16, float16, float32 or float64, rounded to nearest as
torch's .to(dtype); the model itself unchanged; transformers loads the bfloat16 folder in bfloat16 with the same
values and this package loads it back as those values; a weight float16 cannot hold refused before anything is
written; a quantized model's dtype refused by name."""
import json

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import VarMap
from tinygrad_ssm.io.safetensors import SafetensorsFile, bf16_to_float32, float_to_bf16
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.checkpoint_config import PretrainedError

CONFIG = dict(d_model=32, n_layer=2, vocab_size=61, d_state=8, headdim=8, chunk_size=8, pad_vocab_size_multiple=16)
TAGS = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _model(dtype="float32", seed=3) -> Mamba2LMHeadModel:
    return Mamba2LMHeadModel(Mamba2Config(**CONFIG), VarMap(seed=seed), dtype=dtype)


def _rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    """The spec of a stored value, widened back: NumPy's astype, or bfloat16's nearest through its bits."""
    return bf16_to_float32(float_to_bf16(array)) if dtype == "bfloat16" else array.astype(dtype)


@pytest.mark.parametrize("layout", ["mamba_ssm", "transformers"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
@pytest.mark.parametrize("source", ["float32", "float64"])
def test_every_weight_is_stored_rounded_and_loads_back_as_stored(tmp_path, layout, dtype, source):
    model = _model(source)
    before = {name: t.data.copy() for name, t in model.varmap.named_vars()}
    model.save_pretrained(tmp_path, layout=layout, dtype=dtype)
    for name, t in model.varmap.named_vars():                          # the model itself is not changed
        assert t.data.dtype == np.dtype(source) and t.data.tobytes() == before[name].tobytes(), name
    with SafetensorsFile(tmp_path / "model.safetensors") as f:
        assert {info.dtype for info in f.tensors.values()} == {TAGS[dtype]}
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    for name, t in loaded.varmap.named_vars():
        np.testing.assert_array_equal(t.data, _rounded(before[name], dtype).astype(np.float64), err_msg=name)
    config = json.loads((tmp_path / "config.json").read_text())
    if layout == "transformers":
        assert config["dtype"] == dtype


def test_without_dtype_the_weights_are_stored_bit_for_bit(tmp_path):
    model = _model("float64")
    model.save_pretrained(tmp_path, layout="transformers")
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float64"
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    for (name, a), (_, b) in zip(model.varmap.named_vars(), loaded.varmap.named_vars()):
        assert a.data.tobytes() == b.data.tobytes(), name


def test_transformers_reads_the_bfloat16_folder_as_bfloat16_with_the_same_values(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is an optional reference (pip install -e '.[bench]')")
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    model = _model("float32")
    model.save_pretrained(tmp_path, layout="transformers", dtype="bfloat16")
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(tmp_path))
    assert theirs.dtype == torch.bfloat16                               # config.json's "dtype", read by "auto"
    their_embedding = theirs.backbone.embeddings.weight.detach()
    ours = model.varmap["backbone.embedding.weight"].data
    want = torch.from_numpy(ours).to(torch.bfloat16)                    # torch's own rounding of our weights
    assert torch.equal(their_embedding, want)
    their_in_proj = theirs.backbone.layers[1].mixer.in_proj.weight.detach()
    assert torch.equal(their_in_proj, torch.from_numpy(model.varmap["backbone.layers.1.mixer.in_proj.weight"].data)
                       .to(torch.bfloat16))


def test_a_weight_float16_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    model = _model()
    model.varmap["backbone.layers.0.mixer.D"].data[3] = 70000.0
    with pytest.raises(PretrainedError, match=r"store 'backbone.layers.0.mixer.D': its values reach 70000 in magnitude, "
                                              r"past the largest "
                                              r"float16, .* store it as float32 or bfloat16; nothing was written"):
        model.save_pretrained(tmp_path / "out", dtype="float16")
    assert not (tmp_path / "out" / "config.json").exists() and not (tmp_path / "out" / "model.safetensors").exists()
    model.save_pretrained(tmp_path / "out", dtype="bfloat16")          # bfloat16 has float32's range
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path / "out")
    assert loaded.varmap["backbone.layers.0.mixer.D"].data[3] == 70144.0   # 70000's nearest bfloat16


def test_a_bad_dtype_and_a_quantized_models_dtype_are_named(tmp_path):
    model = _model()
    with pytest.raises(ValueError, match="dtype must be one of float64, float32, float16, bfloat16 or None"):
        model.save_pretrained(tmp_path, dtype="int8")
    model.quantize("int8")
    with pytest.raises(ValueError, match=r"quantized \(int8\) and are stored in that format; dtype='bfloat16'"):
        model.save_pretrained(tmp_path, dtype="bfloat16")
    assert not list(tmp_path.iterdir())


def test_logits_of_the_stored_bfloat16_model_are_those_of_its_rounded_weights(tmp_path):
    """What a user of the folder runs: the loaded model is the float32 model with each weight rounded."""
    model = _model("float64")
    model.save_pretrained(tmp_path, dtype="bfloat16")
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    for name, t in model.varmap.named_vars():
        t.data[...] = _rounded(t.data, "bfloat16")
    ids = np.random.default_rng(0).integers(0, 61, (2, 11))
    with tg.no_grad():
        np.testing.assert_allclose(loaded(ids).data, model(ids).data, rtol=1e-12, atol=1e-12)
