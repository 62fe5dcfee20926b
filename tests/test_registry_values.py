"""What the registry takes in, checked as candle's VarMap checks it: names of dot-separated parts (never the
safetensors header's own '__metadata__'), shapes of ints, initialisers and values of real numbers, no value made
infinite by a narrowing cast; `read_into` refuses what `load` refuses; `load(strict=False)` says why each
mismatched key was not loaded."""
import numpy as np
import pytest

from tinygrad_ssm import VarBuilder, VarMap
from tinygrad_ssm.io.safetensors import CheckpointError, SafetensorsFile, save_file
from tinygrad_ssm.nn import init


@pytest.mark.parametrize("name", ["", ".x", "x.", "a..b", "__metadata__"])
def test_names_with_empty_parts_or_the_reserved_key_are_refused(name):
    vm = VarMap()
    with pytest.raises(ValueError, match="dot-separated parts"):
        vm.get((2,), name, init=init.Const(0.0))
    with pytest.raises(ValueError, match="dot-separated parts"):
        VarBuilder.from_varmap(vm).get((2,), name, init=init.Const(0.0))
    assert len(vm) == 0


@pytest.mark.parametrize("prefix, error", [(None, TypeError), (1.5, TypeError), (True, TypeError), (-1, TypeError),
                                           ("a..b", ValueError), ("", ValueError)])
def test_pp_takes_names_and_layer_indices_only(prefix, error):
    vb = VarBuilder.from_varmap(VarMap())
    with pytest.raises(error, match="VarBuilder.pp"):
        vb.pp(prefix)
    assert vb.pp(np.int64(3)).pp("mixer").path("D") == "3.mixer.D"


def test_a_bool_is_not_a_size():
    with pytest.raises(ValueError, match=r"shape must be non-negative ints, got \(True, 2\)"):
        VarMap().get((True, 2), "w", init=init.Const(0.0))


@pytest.mark.parametrize("drawn", [np.array([1 + 2j, 3]), np.array(["1.5", "2"])])
def test_an_init_that_returns_no_real_numbers_is_refused(drawn):
    vm = VarMap()
    with pytest.raises(TypeError, match=rf"VarMap.get 'w': init .* returned an array of dtype {drawn.dtype}"):
        vm.get((2,), "w", init=lambda shape, rng, dtype: drawn)
    assert "w" not in vm


@pytest.mark.parametrize("value, error, message", [
    (np.array(["1.5", "nan"]), TypeError, "need real numbers, got an array of dtype <U3"),
    (np.array([1 + 1j, 0]), TypeError, "need real numbers, got an array of dtype complex128"),
    (None, TypeError, r"need an array or Tensor of shape \(2,\), got None"),
    (np.array([1e300, 0.0]), ValueError, "the value 1e\\+300 is beyond the range of float32"),
    (np.array([1, 70000]), ValueError, "the value 70000 is beyond the range of float16"),      # an int: was inf
])
def test_set_one_takes_real_values_within_the_dtypes_range(value, error, message):
    vm = VarMap()
    w = vm.get((2,), "w", init=init.Const(0.5), dtype="float16" if value is not None and value.dtype.kind == "i"
               else "float32")
    with pytest.raises(error, match=message):
        vm.set_one("w", value)
    assert w.data.tolist() == [0.5, 0.5]
    vm.set_one("w", np.array([np.inf, 1.0]))  # an infinity given is a value, not an overflow
    assert w.data.tolist() == [np.inf, 1.0]


def test_read_into_refuses_an_integer_tensor_as_load_does(tmp_path):
    path = tmp_path / "ints.safetensors"
    save_file(path, {"w": np.array([3, -1, 7])})
    vm = VarMap()
    w = vm.get((3,), "w", init=init.Const(0.0))
    with pytest.raises(CheckpointError, match=r"read_into 'w'.*stored dtype I64 is not floating point"):
        vm.read_into("w", SafetensorsFile(path))
    assert w.data.tolist() == [0, 0, 0]
    assert vm.load(path, strict=False).mismatched == [("w", (3,), (3,), "stored dtype I64 is not floating point")]


def test_load_refuses_a_value_past_the_variables_range_and_changes_nothing(tmp_path):
    path = tmp_path / "wide.safetensors"
    save_file(path, {"a": np.array([1.0, 2.0]), "b": np.array([1.0, 1e300])})
    vm = VarMap()
    a, b = vm.get((2,), "a", init=init.Const(0.0)), vm.get((2,), "b", init=init.Const(0.0))
    version = a._version
    with pytest.raises(CheckpointError, match=r"wide\.safetensors.*'b' holds 1e\+300, beyond the range of float32"):
        vm.load(path)
    assert a.data.tolist() == b.data.tolist() == [0, 0] and a._version == version
    save_file(path, {"a": np.array([1.0, 1 + 1e-12]), "b": np.array([0.5, 0.25])})
    vm.load(path)  # F64 into float32 rounds, as torch's load_state_dict
    assert a.data.tolist() == [1.0, 1.0] and b.data.tolist() == [0.5, 0.25]


def declare_two_variables(varmap):
    vb = VarBuilder.from_varmap(varmap)
    vb.pp("layers").pp(0).get((6, 4), "weight", init=init.Randn(0, 1))
    vb.pp("norm").get((4,), "weight", init=init.Randn(0, 1))


@pytest.mark.parametrize("fault", ["unexpected", "missing", "broadcastable shape"])
def test_a_strict_load_refuses_each_kind_of_mismatch_alone(tmp_path, fault):
    """test_registry.py's mismatched-load test has all three kinds at once, so it cannot tell whether each is checked
    on its own: a file with one extra tensor (another model's head), one tensor too few, or a (1,) tensor for a (4,)
    variable (copy_ would spread it over every entry) must each fail a strict load and leave the variables as they
    were."""
    source = VarMap(seed=1)
    declare_two_variables(source)
    tensors = source.state_dict()
    if fault == "unexpected":
        tensors["head.weight"] = np.ones(4, np.float32)
    elif fault == "missing":
        del tensors["norm.weight"]
    else:
        tensors["norm.weight"] = np.full(1, 3.0, np.float32)
    path = tmp_path / "model.safetensors"
    save_file(path, tensors)
    vm = VarMap(seed=2)
    declare_two_variables(vm)
    before = vm.state_dict()
    expected = {"unexpected": r"unexpected in the file \(1\): head\.weight",
                "missing": r"missing from the file \(1\): norm\.weight",
                "broadcastable shape": r"norm\.weight: file \(1,\) vs variable \(4,\)"}[fault]
    with pytest.raises(CheckpointError, match=expected):
        vm.load(path)
    assert all(np.array_equal(vm[name].data, array) for name, array in before.items())


def test_read_into_refuses_a_value_past_the_variables_range_and_changes_nothing(tmp_path):
    """read_into wrote the converted values before refusing an overflow: the variable held [0.5, inf, 0.25] (its
    old weights lost, its version unchanged) after the error."""
    path = tmp_path / "wide.safetensors"
    save_file(path, {"w": np.array([0.5, 1e300, 0.25]), "h": np.array([1.0, 70000.0], np.float32)})
    vm = VarMap()
    w, h = vm.get((3,), "w", init=init.Const(7.0)), vm.get((2,), "h", init=init.Const(7.0), dtype="float16")
    with pytest.raises(CheckpointError, match=r"'w' holds 1e\+300, beyond the range of float32"):
        vm.read_into("w", SafetensorsFile(path))
    assert w.data.tolist() == [7.0, 7.0, 7.0]
    with pytest.raises(CheckpointError, match=r"'h' holds 70000.0, beyond the range of float16"):
        vm.read_into("h", SafetensorsFile(path))
    assert h.data.tolist() == [7.0, 7.0]
    save_file(path, {"w": np.array([0.5, 1e30, 0.25])})
    vm.read_into("w", SafetensorsFile(path))                                          # within range: read
    assert w.data.tolist() == np.array([0.5, 1e30, 0.25], np.float32).tolist()


def test_save_refuses_a_rename_that_gives_two_variables_one_name(tmp_path):
    """Two names renamed to one were saved as one tensor, the other lost without a word."""
    vm = VarMap()
    vm.get((2,), "layer.0.w", init=init.Const(1.0))
    vm.get((2,), "layer.1.w", init=init.Const(2.0))
    with pytest.raises(ValueError, match=r"rename gives 'layer.0.w' and 'layer.1.w' the same stored name 'layer.w'"):
        vm.save(tmp_path / "m.safetensors", rename=lambda name: "layer.w")
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("replace", ["read_only", "integer"])
def test_load_checks_the_variables_too_before_writing_any(tmp_path, replace):
    """A variable whose .data was replaced by a read-only array (a read-only memory map) failed load half-way: the
    variables before it already the file's, the error naming none; an integer one (frozen) took the floats truncated."""
    vm = VarMap(seed=0)
    a, b = vm.get((3,), "a", init=init.Randn()), vm.get((3,), "b", init=init.Randn())
    path = tmp_path / "new.safetensors"
    save_file(path, {"a": np.full(3, 7.0, np.float32), "b": np.full(3, 0.5, np.float32)})
    if replace == "read_only":
        b.data = b.data.copy()
        b.data.flags.writeable = False
    else:
        b.requires_grad_(False)
        b.data = np.zeros(3, np.int64)
    before = a.data.copy()
    fix = (r"a read-only array .*nothing was loaded: .* varmap\['b'\]\.data = varmap\['b'\]\.data\.copy\(\)$"
           if replace == "read_only" else r"dtype int64, not floating point .*nothing was loaded: .* np\.zeros\(\(3,\)")
    with pytest.raises(CheckpointError, match=rf"variable 'b' holds {fix}"):
        vm.load(path)
    np.testing.assert_array_equal(a.data, before)


def test_an_init_beyond_the_dtypes_range_is_refused_by_name():
    """Const(1e6) in float16 gave [inf, inf] with NumPy's warning only; set_one and load refuse such values."""
    vm = VarMap(seed=0)
    with pytest.raises(ValueError, match=r"VarMap.get 'h': init .* not finite in float16"):
        vm.get((2,), "h", init=init.Const(1e6), dtype="float16")
    assert "h" not in vm.names()


def test_from_safetensors_refuses_an_integer_tensor_as_load_does(tmp_path):
    """An I64 2**24 + 1 came back as 16777216.0, a bool mask as 1.0 / 0.0."""
    path = tmp_path / "ints.safetensors"
    save_file(path, {"w": np.array([2**24 + 1, 0], np.int64), "m": np.array([True, False])})
    vb = VarBuilder.from_safetensors(path)
    for name in ("w", "m"):
        with pytest.raises(CheckpointError, match=rf"'{name}' .* is not floating point"):
            vb.get((2,), name)
