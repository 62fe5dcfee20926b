"""Grad mode: whether ops record themselves for backward. `no_grad()` / `enable_grad()` work as context
managers and as decorators (with or without parentheses); the flag is per thread, as in torch."""
import functools
import inspect
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
        if inspect.isgeneratorfunction(func):
            return self._generator(func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return func(*args, **kwargs)

        return wrapper

    def _generator(self, func):
        """A generator function's body runs in the mode at each resumption (as torch), and its caller's code
        between two of them in the caller's: wrapping only the call that makes the generator ran no line of it."""
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            gen = func(*args, **kwargs)
            resume, value = gen.send, None
            while True:
                try:
                    with self.__class__():
                        out = resume(value)
                except StopIteration as stop:
                    return stop.value
                try:
                    value, resume = (yield out), gen.send
                except GeneratorExit:
                    with self.__class__():
                        gen.close()
                    raise
                except BaseException as e:  # thrown in: into the body, in the mode
                    value, resume = e, gen.throw

        return wrapper


class no_grad(_GradMode):
    """Inside, ops record nothing and their results do not require grad."""

    enabled = False


class enable_grad(_GradMode):
    """Turns recording back on inside a no_grad region."""

    enabled = True
