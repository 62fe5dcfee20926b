"""VarMap / VarBuilder / init schemes and safetensors checkpoints."""
import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ssm import VarBuilder, VarMap

from tinygrad_ssm.nn import init
from tinygrad_ssm.io.safetensors import CheckpointError, SafetensorsFile, bf16_to_float32, save_file


def declare_small_layout(varmap, dtype="float32"):
    """Declares four variables the way a model's layers do: embedding.weight, layers.0.{weight,bias}, norm.weight."""
    vb = VarBuilder.from_varmap(varmap, dtype)
    vb.pp("embedding").get((10, 4), "weight", init=init.Randn(0, 0.02))
    layer = vb.pp("layers").pp(0)
    layer.get((6, 4), "weight", init=init.KaimingUniform(a=math.sqrt(5)))
    layer.get((6,), "bias", init=init.Const(0.0))
    vb.pp("norm").get((4,), "weight", init=init.Const(1.0))
    return vb


def write_raw_safetensors(path, entries, metadata=None):
    """entries: name -> (tag, shape, raw bytes); written by hand so tests control every byte."""
    header, data, offset = {}, b"", 0
    for name, (tag, shape, raw) in entries.items():
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + data)


# --- the map ----------------------------------------------------------------------------------------------

def test_varmap_records_names_in_creation_order_with_leaf_tensors():
    vm = VarMap()
    declare_small_layout(vm)
    assert vm.names() == ["embedding.weight", "layers.0.weight", "layers.0.bias", "norm.weight"]
    assert [n for n, _ in vm.named_vars()] == vm.names()
    assert len(vm) == 4 and "layers.0.bias" in vm and "layers.0" not in vm
    assert vm.num_parameters() == 40 + 24 + 6 + 4
    for t in vm.all_vars():
        assert t.is_leaf and t.requires_grad and t.dtype == np.float32
    assert vm["norm.weight"] is vm.all_vars()[3]


def test_get_returns_the_same_tensor_and_rejects_another_shape_naming_path_and_shapes():
    vm = VarMap()
    vb = VarBuilder.from_varmap(vm).pp("mixer")
    a = vb.get((3, 2), "w", init=init.Randn(0, 1))
    assert vb.get((3, 2), "w") is a  # no init needed once it exists
    with pytest.raises(ValueError, match=r"shape mismatch on mixer\.w: requested \(2, 3\) <> existing \(3, 2\)"):
        vb.get((2, 3), "w", init=init.Randn(0, 1))
    with pytest.raises(TypeError, match=r"dtype mismatch on mixer\.w"):
        vb.get((3, 2), "w", dtype="float64")
    assert len(vm) == 1


def test_get_without_init_for_a_new_variable_is_an_error_not_silent_zeros():
    vb = VarBuilder.from_varmap(VarMap())
    with pytest.raises(ValueError, match=r"'a\.b' does not exist yet and no init was given"):
        vb.pp("a").get((2,), "b")


def test_custom_init_callable_and_its_shape_is_checked():
    vm = VarMap(seed=3)
    vb = VarBuilder.from_varmap(vm)

    def dt_bias_init(shape, rng, dtype):  # Mamba-2's: inverse softplus of a log-uniform dt
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), size=shape))
        return (dt + np.log(-np.expm1(-dt))).astype(dtype)

    t = vb.get((8,), "dt_bias", init=dt_bias_init)
    dt = np.log1p(np.exp(t.data.astype(np.float64)))  # softplus undoes it
    assert np.all((dt > 1e-3 * 0.999) & (dt < 1e-1 * 1.001))
    with pytest.raises(ValueError, match=r"'bad': init .* returned shape \(3,\), expected \(4,\)"):
        vb.get((4,), "bad", init=lambda shape, rng, dtype: np.zeros(3))
    with pytest.raises(TypeError, match="init must be callable"):
        vb.get((4,), "bad2", init=0.5)


def test_reserve_block_places_variables_in_one_huge_page_aligned_block_with_the_same_values():
    """Variables created after reserve_block lie one after another in one block that starts on a huge page
    boundary, hold the same bits as without it (the same draws in the same order), and the block ends on a
    huge page; a path created before keeps its array, another shape or dtype gets a plain array, and a block
    under a huge page is not made."""
    from tinygrad_ssm.registry import HUGE_PAGE
    shape, paths = (700, 512), [f"layers.{i}.w" for i in range(4)]    # 4 x 1.4 MB: one block of 3 huge pages
    plain, placed = VarMap(seed=4), VarMap(seed=4)
    kept = placed.get(shape, paths[0], init=init.Randn(0.0, 1.0))
    plain.get(shape, paths[0], init=init.Randn(0.0, 1.0))
    placed.reserve_block(paths, shape)
    arrays = [placed.get(shape, p, init=init.Randn(0.0, 1.0)).data for p in paths[1:]]
    for p, a in zip(paths[1:], arrays):
        np.testing.assert_array_equal(a, plain.get(shape, p, init=init.Randn(0.0, 1.0)).data)
        assert a.flags.c_contiguous and a.flags.writeable and a.dtype == np.float32
    assert kept.data.base is None                                       # created before: its own array
    assert arrays[0].ctypes.data % HUGE_PAGE == 0
    assert all(b.ctypes.data - a.ctypes.data == a.nbytes for a, b in zip(arrays, arrays[1:]))
    block = arrays[0].base
    assert block.nbytes - (arrays[0].ctypes.data - block.ctypes.data) >= -(-3 * arrays[0].nbytes // HUGE_PAGE) * HUGE_PAGE
    other = VarMap(seed=4)
    other.reserve_block(["a", "b"], shape)
    assert other.get((512, 700), "a", init=init.Const(1.0)).data.base is None            # another shape
    assert other.get(shape, "b", init=init.Const(1.0), dtype="float64").data.base is None  # another dtype
    small = VarMap(seed=4)
    small.reserve_block(["a"], (8, 8))
    assert small.get((8, 8), "a", init=init.Const(1.0)).data.base is None


def test_reserved_variables_of_an_uninitialised_varmap_wait_to_be_written(tmp_path):
    """An uninitialised VarMap's reserved variables are unfilled until written, and loading writes their values
    into the block in place."""
    shape, paths = (700, 512), ["a", "b"]
    source = VarMap(seed=5)
    for p in paths:
        source.get(shape, p, init=init.Randn(0.0, 1.0))
    source.save(tmp_path / "w.safetensors")
    target = VarMap.uninitialised()
    target.reserve_block(paths, shape)
    tensors = [target.get(shape, p, init=init.Randn(0.0, 1.0)) for p in paths]
    assert target.unfilled() == paths
    target.load(tmp_path / "w.safetensors")
    assert target.unfilled() == []
    for p, t in zip(paths, tensors):
        assert t is target[p] and t.data.base is tensors[0].data.base   # still in the one block
        np.testing.assert_array_equal(t.data, source[p].data)


def test_pp_joins_with_dots_and_accepts_ints():
    vb = VarBuilder.from_varmap(VarMap())
    assert vb.prefix == "" and vb.pp("backbone").pp("layers").pp(3).prefix == "backbone.layers.3"
    assert vb.pp("a").path("b") == "a.b" and vb.path("b") == "b"
    for bad in ("", ".a", "a."):
        with pytest.raises(ValueError, match="prefix"):
            vb.pp(bad)


def test_builder_dtype_and_to_dtype():
    vm = VarMap()
    vb = VarBuilder.from_varmap(vm, dtype="float64")
    assert vb.dtype == np.float64 and vb.dtype == "float64"
    assert vb.get((2,), "a", init=init.Const(1)).dtype == np.float64
    assert vb.to_dtype("float32").get((2,), "b", init=init.Const(1)).dtype == np.float32
    with pytest.raises(TypeError, match="bfloat16"):
        VarBuilder.from_varmap(vm, dtype="bfloat16")
    with pytest.raises(TypeError, match="floating point"):
        VarBuilder.from_varmap(vm, dtype="int32")


def test_a_seed_gives_bit_identical_weights_and_another_seed_does_not():
    a, b, c = VarMap(seed=7), VarMap(seed=7), VarMap(seed=8)
    for vm in (a, b, c):
        declare_small_layout(vm)
    for (name, x), (_, y), (_, z) in zip(a.named_vars(), b.named_vars(), c.named_vars()):
        assert x.data.tobytes() == y.data.tobytes(), name
    assert not np.array_equal(a["embedding.weight"].data, c["embedding.weight"].data)


def test_set_one_copies_in_place_and_names_unknown_variables():
    vm = VarMap()
    declare_small_layout(vm)
    t = vm["norm.weight"]
    version = t._version[0]
    vm.set_one("norm.weight", np.arange(4.0))
    assert vm["norm.weight"] is t and np.array_equal(t.data, np.arange(4.0)) and t._version[0] == version + 1
    with pytest.raises(KeyError, match="cannot find nope in VarMap"):
        vm.set_one("nope", np.zeros(4))
    with pytest.raises(ValueError, match=r"value has shape \(3,\), variable has shape \(4,\)"):
        vm.set_one("norm.weight", np.zeros(3))
    with pytest.raises(KeyError, match=r"similar: embedding\.weight, layers\.0\.weight, norm\.weight"):
        vm["x.weight"]


# --- init schemes -----------------------------------------------------------------------------------------

def test_const_and_uniform_and_randn():
    rng = np.random.default_rng(0)
    assert np.array_equal(init.Const(2.5)((2, 3), rng, np.float32), np.full((2, 3), 2.5, np.float32))
    u = init.Uniform(-0.5, 2.0)((200_000,), rng, np.float64)
    assert u.min() >= -0.5 and u.max() < 2.0 and abs(u.mean() - 0.75) < 5 * 2.5 / math.sqrt(12 * 200_000)
    n = init.Randn(1.0, 0.5)((200_000,), rng, np.float64)
    assert abs(n.mean() - 1.0) < 5 * 0.5 / math.sqrt(200_000) and abs(n.std() - 0.5) < 0.005
    with pytest.raises(ValueError, match="lo <= hi"):
        init.Uniform(1, 0)


def test_kaiming_bounds_and_std_follow_pytorch_fans_and_gains():
    rng = np.random.default_rng(0)
    w = init.KaimingUniform(a=math.sqrt(5))((64, 256), rng, np.float64)
    bound = 1 / math.sqrt(256)  # PyTorch's Linear: a = sqrt(5) gives 1/sqrt(fan_in)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    conv = init.KaimingUniform(a=math.sqrt(5))((8, 1, 4), rng, np.float64)  # fan_in = 1 * 4
    assert np.abs(conv).max() <= 0.5
    w = init.KaimingNormal(fan="fan_out", nonlinearity="relu")((500, 400), rng, np.float64)
    assert abs(w.std() - math.sqrt(2 / 500)) < 0.01 * math.sqrt(2 / 500)
    assert init.fans((5, 3, 2, 2)) == (12, 20)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        init.KaimingUniform()((5,), rng, np.float32)
    with pytest.raises(ValueError, match="fan must be"):
        init.KaimingNormal(fan="fan_avg")


def test_gains_and_fans_match_torch():
    torch = pytest.importorskip("torch")
    for name, a in [("relu", 0), ("leaky_relu", math.sqrt(5)), ("tanh", 0), ("linear", 0)]:
        assert init.calculate_gain(name, a) == pytest.approx(torch.nn.init.calculate_gain(name, a))
    for shape in [(3, 4), (8, 1, 4), (5, 3, 2, 2)]:
        assert init.fans(shape) == torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))


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
