"""The op table of tests/support/op_specs.py is complete and is the one the op tests read, and the "adding an op"
steps of docs/autograd.md are true: the test below follows them (with the section's own code) to add
log1p, and checks that every file and name the section cites exists."""
from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import op_specs
from tests.support.gradcheck import gradcheck
from tests.support.op_specs import SPECS
from tinygrad_ssm import Function, Tensor
from tinygrad_ssm.autograd import args as A
from tinygrad_ssm.autograd import functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE_READERS = tuple(f"autograd/{name}" for name in ("test_ops_grad.py", "test_ops_forward.py", "test_torch_parity.py",
                                                       "test_tensor_semantics.py", "test_ops_errors.py", "test_views.py"))


def test_every_op_has_a_complete_spec():
    missing, unknown = sorted(set(F.OPS) - set(SPECS)), sorted(set(SPECS) - set(F.OPS))
    assert not missing, f"ops in functional.OPS without an entry in tests/support/op_specs.py: {missing}"
    assert not unknown, f"entries in tests/support/op_specs.py for names that are not in functional.OPS: {unknown}"
    for name, spec in SPECS.items():
        assert spec.grad and spec.forward and spec.torch, f"{name}: an empty part in its entry"
        assert all(callable(f) for f in (*spec.grad.values(), *spec.forward.values(), spec.float32, spec.example))
        arguments = spec.example()
        assert isinstance(arguments, tuple), f"{name}: example must give a tuple of positional arguments"
        assert isinstance(getattr(F, name)(*arguments), (Tensor, tuple)), name


def test_ops_are_registered_once_and_are_public_functions():
    assert len(F.OPS) == len(set(F.OPS))
    for name in F.OPS:
        assert callable(getattr(F, name)) and not name.startswith("_"), name


@pytest.mark.parametrize("filename", TABLE_READERS)
def test_every_op_test_file_reads_the_one_table(filename):
    tree = ast.parse((ROOT / "tests" / filename).read_text())
    imports = {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for alias in node.names}
    assert ("tests.support.op_specs", "SPECS") in imports, f"{filename} does not read tests/support/op_specs.py's SPECS"
    assert "op_coverage" not in {module for module, _ in imports}, f"{filename} keeps a table of its own"


# --- docs/autograd.md, "Adding an op" -------------------------------------------------------------------

def _section() -> str:
    text = (ROOT / "docs" / "autograd.md").read_text()
    start = text.index("## 7. Adding an op")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_adding_an_op_section_cites_files_and_names_that_exist():
    section = _section()
    paths = set(re.findall(r"`((?:tinygrad_ssm|tests|docs)/[\w/]*\w\.(?:py|md)|tinygrad_ssm/autograd/ops/)`", section))
    assert {"tinygrad_ssm/autograd/functional.py", "tinygrad_ssm/autograd/args.py", "tests/support/op_specs.py"} <= paths
    for path in paths:
        assert (ROOT / path).exists(), f"docs/autograd.md cites {path}, which does not exist"
    for test, path in re.findall(r"`(test_\w+)` in `(tests/[\w/]+\.py)`", section):
        assert f"def {test}(" in (ROOT / path).read_text(), f"{path} has no {test}"
    readers = re.findall(r"- `tests/(\w+/test_\w+\.py)`", section)  # the list of files that read the table
    assert sorted(readers) == sorted(TABLE_READERS)
    assert "`SPECS` in `tests/support/op_specs.py`" in section and "`@op`" in section and "`OPS`" in section
    assert F.op.__name__ == "op" and isinstance(F.OPS, list) and isinstance(op_specs.SPECS, dict)


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def _run_log1p_checks(data):
    fn, inputs = SPECS["log1p"].grad[""](data)
    gradcheck(fn, *inputs)
    SPECS["log1p"].forward[""](data)


def test_following_the_adding_an_op_steps_adds_a_tested_op():
    """Run the section's three code blocks (the Function, its functional wrapper, its table entry) and see
    the completeness test fail before the entry and pass after, and the new op pass its checks."""
    blocks = re.findall(r"```python\n(.*?)```", _section(), flags=re.S)
    function_code, wrapper_code, entry_code = (_dedent(b) for b in blocks)
    assert "class Log1p(Function)" in function_code and "@op" in wrapper_code and 'spec("log1p"' in entry_code
    ops_before = list(F.OPS)
    elementwise = {"Function": Function, "np": np}
    try:
        exec(function_code, elementwise)                                  # step 1: the Function
        wrapper = {"op": F.op, "E": type("E", (), {"Log1p": elementwise["Log1p"]}), "A": A}
        exec(wrapper_code, wrapper)                                       # step 2: @op registers it
        F.log1p = wrapper["log1p"]
        assert F.OPS == ops_before + ["log1p"]
        with pytest.raises(AssertionError, match="without an entry.*log1p"):
            test_every_op_has_a_complete_spec()
        exec(entry_code, vars(op_specs))                                  # step 3: one entry in the table
        test_every_op_has_a_complete_spec()
        _run_log1p_checks()
        out = SPECS["log1p"].float32()
        assert out.dtype == np.float32
        np.testing.assert_allclose(F.log1p(Tensor(np.array([0.5, 2.0]))).data, np.log1p([0.5, 2.0]), rtol=1e-12)
    finally:
        F.OPS[:] = ops_before
        SPECS.pop("log1p", None)
        if hasattr(F, "log1p"):
            del F.log1p


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"
