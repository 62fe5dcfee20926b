"""VarMap's safetensors checkpoints: save and load exact, every mismatch named and nothing changed, damaged or
failed files, float16/bfloat16 upcast, and an uninitialised map filled from a checkpoint in place."""
import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.registry import declare_small_layout, write_raw_safetensors
from tinygrad_ssm import VarBuilder, VarMap
from tinygrad_ssm.io.safetensors import CheckpointError, SafetensorsFile, bf16_to_float32, save_file
from tinygrad_ssm.nn import init


# --- checkpoints ------------------------------------------------------------------------------------------

def test_save_load_round_trip_is_exact_and_readable_by_the_safetensors_library(tmp_path):
    from safetensors import safe_open

    src = VarMap(seed=1)
    declare_small_layout(src)
    path = tmp_path / "model.safetensors"
    src.save(path, metadata={"step": "12"})
    with safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"step": "12"}
        assert sorted(f.keys()) == sorted(src.names())
        np.testing.assert_array_equal(f.get_tensor("layers.0.weight"), src["layers.0.weight"].data)
    dst = VarMap(seed=2)
    declare_small_layout(dst)
    before = {n: t for n, t in dst.named_vars()}
    assert dst.load(path) is None
    for name, t in src.named_vars():
        assert dst[name] is before[name]  # filled in place
        assert dst[name].data.tobytes() == t.data.tobytes()
    assert not list(tmp_path.glob("*.tmp"))


def test_mismatched_load_lists_every_key_with_shapes_and_changes_nothing(tmp_path):
    other = VarMap()
    vb = VarBuilder.from_varmap(other)
    vb.pp("embedding").get((12, 4), "weight", init=init.Randn(0, 1))  # another vocabulary size
    vb.pp("layers").pp(0).get((6, 4), "weight", init=init.Randn(0, 1))
    vb.pp("head").get((4,), "weight", init=init.Randn(0, 1))
    path = tmp_path / "other.safetensors"
    other.save(path)
    vm = VarMap()
    declare_small_layout(vm)
    before = vm.state_dict()
    with pytest.raises(CheckpointError) as err:
        vm.load(path)
    text = str(err.value)
    assert str(path) in text
    assert "embedding.weight: file (12, 4) vs variable (10, 4)" in text
    assert "missing from the file (2): layers.0.bias, norm.weight" in text
    assert "unexpected in the file (1): head.weight" in text
    for name, array in before.items():
        assert np.array_equal(vm[name].data, array)
    missing, unexpected, mismatched = vm.load(path, strict=False)
    assert missing == ["layers.0.bias", "norm.weight"] and unexpected == ["head.weight"]
    assert mismatched == [("embedding.weight", (12, 4), (10, 4), "shape")]
    assert np.array_equal(vm["layers.0.weight"].data, other["layers.0.weight"].data)  # the match was loaded
    assert np.array_equal(vm["embedding.weight"].data, before["embedding.weight"])


@pytest.mark.parametrize("damage", ["truncate_data", "truncate_header", "garbage_header", "huge_length",
                                    "empty", "bad_offsets", "bad_dtype"])
def test_corrupt_or_truncated_files_raise_naming_the_file_and_change_nothing(tmp_path, damage):
    vm = VarMap()
    declare_small_layout(vm)
    path = tmp_path / "ckpt.safetensors"
    vm.save(path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    if damage == "truncate_data":
        raw = raw[:-5]
    elif damage == "truncate_header":
        raw = raw[:8 + n // 2]
    elif damage == "garbage_header":
        raw = raw[:8] + b"\xff" * n + raw[8 + n:]
    elif damage == "huge_length":
        raw = struct.pack("<Q", 2 ** 40) + raw[8:]
    elif damage == "empty":
        raw = b""
    else:
        key = "norm.weight"
        if damage == "bad_offsets":
            header[key]["data_offsets"][1] += 4
        else:
            header[key]["dtype"] = "F8_E4M3"
        blob = json.dumps(header).encode()
        raw = struct.pack("<Q", len(blob)) + blob + raw[8 + n:]
    path.write_bytes(raw)
    before = vm.state_dict()
    with pytest.raises(CheckpointError, match="ckpt.safetensors"):
        vm.load(path)
    with pytest.raises(CheckpointError, match="ckpt.safetensors"):
        VarBuilder.from_safetensors(path)
    for name, array in before.items():
        assert np.array_equal(vm[name].data, array)


@pytest.mark.parametrize("strict", [True, False])
def test_a_read_that_fails_after_earlier_tensors_were_read_changes_nothing(tmp_path, monkeypatch, strict):
    # The header is valid, so the failure comes while reading data: the file shrinks (another process
    # rewrites it) just before the second tensor is read. The first tensor has already been read by then.
    src = VarMap(seed=1)
    declare_small_layout(src)
    path = tmp_path / "ckpt.safetensors"
    src.save(path)
    data_start = SafetensorsFile(path)._data_start
    vm = VarMap(seed=2)
    declare_small_layout(vm)
    before = {name: t.data.tobytes() for name, t in vm.named_vars()}
    read, reads = SafetensorsFile.read, []

    def read_then_shrink(self, name, dtype=None):
        reads.append(name)
        if len(reads) == 2:
            with open(self.path, "r+b") as f:
                f.truncate(data_start)                                # header kept, every tensor's bytes gone
        return read(self, name, dtype)

    monkeypatch.setattr(SafetensorsFile, "read", read_then_shrink)
    with pytest.raises(CheckpointError) as err:
        vm.load(path, strict=strict)
    assert len(reads) == 2                                            # one tensor was read before the failure
    assert str(path) in str(err.value) and repr(reads[1]) in str(err.value)
    for name, t in vm.named_vars():
        assert t.data.tobytes() == before[name], f"{name} changed by a failed load"


def test_load_of_a_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        VarMap().load(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("fail_at", ["fsync", "replace"])
def test_a_failed_save_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch, fail_at):
    import tinygrad_ssm.io.safetensors as io

    vm = VarMap(seed=1)
    declare_small_layout(vm)
    path = tmp_path / "ckpt.safetensors"
    vm.save(path)
    good = path.read_bytes()
    vm.set_one("norm.weight", np.full(4, 9.0))

    def crash(*args):
        raise OSError(f"simulated crash in {fail_at}")

    monkeypatch.setattr(io.os, fail_at, crash)
    with pytest.raises(OSError, match="simulated crash"):
        vm.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]


def test_metadata_must_be_strings(tmp_path):
    vm = VarMap()
    declare_small_layout(vm)
    with pytest.raises(TypeError, match="metadata must map str -> str"):
        vm.save(tmp_path / "x.safetensors", metadata={"step": 3})
    assert not list(tmp_path.iterdir())


def test_float16_and_bfloat16_files_upcast_on_load(tmp_path):
    values = np.array([[1.5, -2.0, 0.15625], [0.00390625, 1024.0, -0.0]], dtype=np.float32)  # exact in bf16 and f16
    bf16_bits = (values.view(np.uint32) >> 16).astype("<u2")
    path = tmp_path / "half.safetensors"
    write_raw_safetensors(path, {
        "a.weight": ("BF16", values.shape, bf16_bits.tobytes()),
        "b.weight": ("F16", values.shape, values.astype("<f2").tobytes()),
    })
    vm = VarMap()
    vb = VarBuilder.from_varmap(vm, "float64")
    for name in ("a", "b"):
        vb.pp(name).get(values.shape, "weight", init=init.Const(0))
    vm.load(path)
    np.testing.assert_array_equal(vm["a.weight"].data, values.astype(np.float64))
    np.testing.assert_array_equal(vm["b.weight"].data, values.astype(np.float64))
    stored = VarBuilder.from_safetensors(path, dtype="float32")
    a = stored.pp("a").get(values.shape, "weight")
    assert a.dtype == np.float32 and np.array_equal(a.data, values)
    assert stored.pp("b").get(values.shape, "weight", dtype="float64").dtype == np.float64


def test_bfloat16_written_by_torch_matches_torch_upcast(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    t = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    save_file({"w": t}, str(path))
    np.testing.assert_array_equal(SafetensorsFile(path).read("w"), t.float().numpy())
    raw = t.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_to_float32(raw), t.float().numpy())


def test_from_safetensors_serves_stored_tensors_by_name(tmp_path):
    src = VarMap(seed=4)
    declare_small_layout(src)
    src.save(tmp_path / "a.safetensors")
    extra = VarMap()
    VarBuilder.from_varmap(extra).pp("head").get((3,), "bias", init=init.Const(0.5))
    extra.save(tmp_path / "b.safetensors")
    vb = VarBuilder.from_safetensors([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    w = vb.pp("layers").pp(0).get((6, 4), "weight")
    assert np.array_equal(w.data, src["layers.0.weight"].data) and not w.requires_grad
    assert vb.pp("layers").pp(0).get((6, 4), "weight") is w  # tied weights stay one tensor
    assert np.array_equal(vb.pp("head").get((3,), "bias").data, [0.5] * 3)
    assert vb.contains("norm.weight") and not vb.contains("norm.bias")
    with pytest.raises(KeyError, match=r"cannot find tensor 'norm\.bias' in .*a\.safetensors"):
        vb.pp("norm").get((4,), "bias")
    with pytest.raises(ValueError, match=r"shape mismatch for norm\.weight in .*a\.safetensors.*\(5,\) <> stored \(4,\)"):
        vb.pp("norm").get((5,), "weight")
    with pytest.raises(CheckpointError, match="stored in both"):
        VarBuilder.from_safetensors([tmp_path / "a.safetensors", tmp_path / "a.safetensors"])


@given(st.lists(st.tuples(st.sampled_from(["w", "b", "A_log", "norm"]),
                          st.lists(st.integers(0, 4), max_size=3)), min_size=1, max_size=5, unique_by=lambda t: t[0]),
       st.sampled_from(["float32", "float64", "float16"]))
def test_round_trip_property(tmp_path_factory, specs, dtype):
    path = tmp_path_factory.mktemp("rt") / "x.safetensors"
    src, dst = VarMap(seed=1), VarMap(seed=2)
    for vm in (src, dst):
        vb = VarBuilder.from_varmap(vm, dtype)
        for name, shape in specs:
            vb.pp("p").get(tuple(shape), name, init=init.Randn(0, 1))
    src.save(path)
    dst.load(path)
    for (name, a), (_, b) in zip(src.named_vars(), dst.named_vars()):
        assert a.dtype == b.dtype and a.data.tobytes() == b.data.tobytes(), name


def test_integer_tensor_under_a_variable_name_is_a_mismatch(tmp_path):
    path = tmp_path / "ints.safetensors"
    write_raw_safetensors(path, {"norm.weight": ("I64", (4,), np.arange(4, dtype="<i8").tobytes())})
    vm = VarMap()
    declare_small_layout(vm)
    with pytest.raises(CheckpointError, match=r"norm\.weight: file \(4,\) vs variable \(4,\) \(stored dtype I64 is not floating point\)"):
        vm.load(path)
    result = vm.load(path, strict=False)
    assert result.mismatched == [("norm.weight", (4,), (4,), "stored dtype I64 is not floating point")] and len(result.missing) == 3


# --- an uninitialised map, filled from a checkpoint in place --------------------------------------------------

def never_called(shape, rng, dtype):
    raise AssertionError("an uninitialised VarMap must not draw initial values")


def test_uninitialised_map_creates_without_init_and_names_what_is_unfilled(tmp_path):
    vm = VarMap.uninitialised()
    vb = VarBuilder.from_varmap(vm)
    for name in ("a", "b", "c"):
        vb.get((3, 2), name, init=never_called)
    with pytest.raises(ValueError, match="no init was given"):         # an init is still required: the same model code
        vb.get((3,), "d")
    assert vm.unfilled() == ["a", "b", "c"] and "3 unfilled" in repr(vm)
    with pytest.raises(ValueError, match=r"save .*x\.safetensors.*3 variable\(s\).*never written.*a, b, c"):
        vm.save(tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="state_dict: 3 variable"):
        vm.state_dict()
    assert not list(tmp_path.iterdir())
    vm.set_one("b", np.ones((3, 2)))
    assert vm.unfilled() == ["a", "c"]
    VarMap(seed=1).save(tmp_path / "empty.safetensors")                 # (an ordinary map is never "unfilled")
    assert VarMap().unfilled() == [] and "seed=0" in repr(VarMap())


def test_read_into_fills_the_same_tensor_in_place_and_bumps_its_version(tmp_path):
    src = VarMap(seed=3)
    declare_small_layout(src)
    src.save(tmp_path / "w.safetensors")
    stored = SafetensorsFile(tmp_path / "w.safetensors")
    vm = VarMap.uninitialised()
    declare_small_layout(vm, "float64")
    tensor, version = vm["layers.0.weight"], vm["layers.0.weight"]._version[0]
    vm.read_into("layers.0.weight", stored)                             # under grad mode: read_into takes care
    assert vm["layers.0.weight"] is tensor and tensor.requires_grad and tensor._version[0] == version + 1
    assert np.array_equal(tensor.data, src["layers.0.weight"].data.astype(np.float64))
    with pytest.raises(ValueError, match=r"read_into 'norm\.weight': .*w\.safetensors' stores 'layers\.0\.bias' "
                                         r"with shape \(6,\), the variable has shape \(4,\)"):
        vm.read_into("norm.weight", stored, key="layers.0.bias")
    tensors = {"flipped": np.arange(24, dtype=np.float32).reshape(4, 6)}  # as many elements as (6, 4), transposed
    save_file(tmp_path / "flipped.safetensors", tensors)
    before = vm["layers.0.weight"].data.copy()
    with pytest.raises(ValueError, match=r"stores 'flipped' with shape \(4, 6\), the variable has shape \(6, 4\)"):
        vm.read_into("layers.0.weight", SafetensorsFile(tmp_path / "flipped.safetensors"), key="flipped")
    assert np.array_equal(vm["layers.0.weight"].data, before)
    with pytest.raises(KeyError, match="cannot find nope in VarMap"):
        vm.read_into("nope", stored)
    assert vm.unfilled() == ["embedding.weight", "layers.0.bias", "norm.weight"]
    vm.load(tmp_path / "w.safetensors")                                 # load fills too
    assert vm.unfilled() == []
    vm.save(tmp_path / "again.safetensors")
