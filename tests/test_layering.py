"""The package's layering, read from its source (AST, nothing imported, no timing): which folder may import
which, no import circle beyond the engine's own tensor <-> ops one, the engine on NumPy alone; and, in a
process where numba cannot be imported, the engine imports and runs its tests."""
import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tinygrad_ssm"

# layer -> the layers it may import (itself included). A layer is a folder or a module at the top of the package.
ALLOWED = {
    "autograd": {"autograd"},
    "io": {"io"},
    "tokenizer_files": {"tokenizer_files", "io"},
    "tokenizer": {"tokenizer", "tokenizer_files", "io"},
    "text_stream": {"text_stream"},
    "fast": {"fast", "autograd"},
    "registry": {"registry", "autograd", "io"},
    "diagnostics": {"diagnostics", "autograd"},
    "nn": {"nn", "autograd", "fast", "registry"},
    "optim": {"optim", "autograd", "fast"},
    "scan": {"scan", "autograd", "fast"},
    "distributed": {"distributed", "autograd", "optim"},
    "models": {"models", "autograd", "fast", "io", "nn", "optim", "registry", "scan"},
    "train": {"train", "autograd", "fast", "io", "nn", "optim", "registry", "diagnostics", "scan", "models",
              "distributed", "tokenizer", "tokenizer_files", "text_stream"},
    "__init__": {"__init__", "autograd", "fast", "nn", "optim", "registry", "diagnostics", "scan", "models"},
    "__main__": {"train", "distributed"},   # MPI first under mpiexec (__main__.py)
}


def modules() -> dict:
    """Dotted module name -> (path, whether it is a package's __init__)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = modules()


def layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def imports(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement of the module, inside functions too: the package's
    modules resolved to the deepest module named, other packages as their top-level name."""
    path, is_package = MODULES[module]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target and target.startswith("tinygrad_ssm"):
                target = target.rsplit(".", 1)[0]
            found.append((target if target.startswith("tinygrad_ssm") else target.split(".")[0], node.lineno))
    return found


def internal_graph() -> dict:
    return {m: {t for t, _ in imports(m) if t in MODULES and t != m} for m in MODULES}


def test_every_layer_imports_only_the_layers_below_it():
    wrong = [f"{m} (line {line}) imports {t}: {layer(m)}/ may import {sorted(ALLOWED[layer(m)])}"
             for m in MODULES for t, line in imports(m)
             if t in MODULES and layer(t) not in ALLOWED[layer(m)]]
    assert not wrong, "\n".join(wrong)


def test_every_module_is_in_a_known_layer():
    assert {layer(m) for m in MODULES} <= set(ALLOWED), sorted({layer(m) for m in MODULES} - set(ALLOWED))


def test_the_engine_imports_numpy_and_the_standard_library_only():
    wrong = [f"{m} (line {line}) imports {t}" for m in MODULES if layer(m) == "autograd"
             for t, line in imports(m)
             if not t.startswith("tinygrad_ssm") and t not in sys.stdlib_module_names and t not in ("numpy",)]
    assert not wrong, "\n".join(wrong)


def strongly_connected(graph: dict) -> list[set]:
    """Tarjan's strongly connected components with more than one module: the import circles."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_but_the_engines_tensor_and_ops():
    """The Tensor's methods call the ops, and the ops make Tensors: that circle is the engine's own (tensor.py
    imports functional at its end). Any other circle is a layering mistake."""
    circles = strongly_connected(internal_graph())
    assert all({layer(m) for m in circle} == {"autograd"} for circle in circles), circles
    assert len(circles) <= 1, circles


def test_the_circle_finder_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


BLOCK_NUMBA = textwrap.dedent("""
    import importlib.abc, sys
    class NoNumba(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("numba", "llvmlite", "scipy"):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None
    sys.meta_path.insert(0, NoNumba())
""")


def run_without_numba(code: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", BLOCK_NUMBA + textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_engine_imports_and_runs_where_numba_is_missing():
    result = run_without_numba("""
        import numpy as np
        import tinygrad_ssm.autograd as ag
        import tinygrad_ssm as tg
        x = tg.Tensor(np.array([[1.0, -2.0, 3.0]]), requires_grad=True)
        loss = tg.functional.cross_entropy(x * 2, np.array([2])) + (x.tanh() * x).sum()
        loss.backward()
        assert x.grad.shape == (1, 3) and ag.Tensor is tg.Tensor
        assert "numba" not in sys.modules
        try:
            tg.Mamba2LMHeadModel
        except ImportError as e:
            print("model:", e)
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout
    assert "model: No module named 'numba'" in result.stdout           # the rest of the package needs numba


def test_the_engines_tests_pass_where_numba_is_missing():
    """tests/autograd/ is the engine's whole suite; run in a process that cannot import numba, it passes."""
    result = run_without_numba("""
        import pytest
        sys.exit(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "tests/autograd"]))
    """)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
