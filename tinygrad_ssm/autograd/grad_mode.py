"""Grad mode: whether ops record themselves for backward. `no_grad()` / `enable_grad()` work as context
managers and as decorators (with or without parentheses); the flag is per thread, as in torch."""
import functools
import threading

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "grad_enabled", True)


class _GradMode:
    enabled: bool

    def __new__(cls, func=None):
        self = super().__new__(cls)
        return self if func is None else self(func)  # bare `@no_grad` decorates too, as in torch

    def __enter__(self):
        self._previous = is_grad_enabled()
        _state.grad_enabled = self.enabled
        return self

    def __exit__(self, *exc):
        _state.grad_enabled = self._previous
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return func(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Inside, ops record nothing and their results do not require grad."""

    enabled = False


class enable_grad(_GradMode):
    """Turns recording back on inside a no_grad region."""

    enabled = True
