"""Counting a fast path's calls, so that a test comparing it with its twin can say the fast path ran: without it,
a fast path that silently fell back to its twin (an over-strict `takes`, a wrong dtype rule) left every equality
test comparing the twin with itself, green (found by an audit: the fused ops, the Adam kernel and RowSplitMatmul)."""
import collections
import contextlib

import pytest

from tinygrad_ssm.autograd.function import Function
from tinygrad_ssm.fast import fused


@contextlib.contextmanager
def counting(*targets):
    """Within: calls of each (owner, attribute name) in targets counted, under the attribute's name (a Function
    subclass's "forward" under the class's name)."""
    counts = collections.Counter()
    with pytest.MonkeyPatch.context() as patch:
        for owner, name in targets:
            label = owner.__name__ if isinstance(owner, type) else name

            def counted(*args, _original=getattr(owner, name), _label=label, **kwargs):
                counts[_label] += 1
                return _original(*args, **kwargs)
            patch.setattr(owner, name, counted)
        yield counts


FUSED_OPS = [(cls, "forward") for cls in vars(fused).values()
             if isinstance(cls, type) and issubclass(cls, Function) and cls.__module__ == fused.__name__]


def counting_fused_ops():
    """counting() of every fused op's forward (fast/fused.py's Function classes)."""
    return counting(*FUSED_OPS)
