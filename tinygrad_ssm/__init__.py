"""tinygrad_ssm: a reverse-mode autograd engine on NumPy, with a Mamba-2 language model built on it.

    autograd/   the engine (Tensor, Function, backward, the ops): NumPy only
    nn/ optim/ registry.py diagnostics.py   the library on it: layers, optimizers, VarMap / VarBuilder
    scan/       ssd(): the Mamba-2 scan, its engine-op reference beside its numba and CUDA kernels
    fast/       every other fast path (numba kernels, fused ops), each beside a pointer to its engine twin
    io/         safetensors, atomic writes, checkpoint folders
    models/     Mamba-2
    train/      the application: `python -m tinygrad_ssm train / generate / eval / export`; the library never imports it

The engine's names are imported here; the rest (which needs numba) is imported on first use, so that
`import tinygrad_ssm.autograd` works where numba is not installed.
"""
from .autograd import functional
from .autograd.creation import arange, full, new_tensor, ones, ones_like, rand, randn, zeros, zeros_like
from .autograd.function import Function
from .autograd.functional import cat, concatenate, einsum, matmul, maximum, minimum, stack, where
from .autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from .autograd.tensor import Tensor

tensor = new_tensor  # torch.tensor(data): a new tensor holding a copy of data

float32 = "float32"
float64 = "float64"

__version__ = "0.1.0"

# name -> (module, attribute or None for the module itself), imported on first use (PEP 562)
_LAZY = {
    "nn": ("tinygrad_ssm.nn", None),
    "init": ("tinygrad_ssm.nn.init", None),
    "optim": ("tinygrad_ssm.optim", None),
    "VarMap": ("tinygrad_ssm.registry", "VarMap"),
    "VarBuilder": ("tinygrad_ssm.registry", "VarBuilder"),
    "gradient_report": ("tinygrad_ssm.diagnostics", "gradient_report"),
    "ssd": ("tinygrad_ssm.scan", "ssd"),
    "Mamba2Config": ("tinygrad_ssm.models", "Mamba2Config"),
    "Mamba2LMHeadModel": ("tinygrad_ssm.models", "Mamba2LMHeadModel"),
}

__all__ = ["Tensor", "Function", "functional", "tensor", "new_tensor", "zeros", "zeros_like", "ones", "ones_like",
           "full", "rand", "randn", "arange", "cat", "concatenate", "einsum", "matmul", "maximum", "minimum", "stack",
           "where", "no_grad", "enable_grad", "is_grad_enabled", "float32", "float64", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tinygrad_ssm' has no attribute {name!r}")
    import importlib
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # found once: later lookups do not come here
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
