"""VarMap / VarBuilder and the init schemes; their checkpoints are tests/test_registry_checkpoints.py."""
import math

import numpy as np
import pytest

from tests.support.registry import declare_small_layout
from tinygrad_ssm import VarBuilder, VarMap
from tinygrad_ssm.nn import init


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


def test_dtype_none_is_the_packages_float32_as_the_models():
    """VarMap.get and VarBuilder took dtype=None as NumPy does (float64), the model as float32 (found by an API
    audit): None is float32 everywhere."""
    vm = VarMap(seed=0)
    assert vm.get((2,), "a", init.Const(0.0), dtype=None).dtype == np.float32
    assert VarBuilder.from_varmap(vm, dtype=None).get((2,), "b", init.Const(0.0)).dtype == np.float32


def test_a_dtype_numpy_cannot_read_is_named():
    """NumPy's own "data type 'foo' not understood" named neither the call nor the variable (API fuzz)."""
    with pytest.raises(TypeError, match=r"VarMap.get 'w': dtype 'foo' is not a dtype; use float32 or float64"):
        VarMap(seed=0).get((2,), "w", init.Const(0.0), dtype="foo")
    with pytest.raises(TypeError, match=r"VarBuilder: dtype 'foo' is not a dtype"):
        VarBuilder.from_varmap(VarMap(seed=0), dtype="foo")


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_a_bad_seed_is_named(seed):
    with pytest.raises(ValueError, match=r"VarMap: seed must be an int >= 0"):
        VarMap(seed=seed)

