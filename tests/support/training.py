"""Helpers of the tests that run training (tests/train/, tests/test_distributed.py)."""


def quiet(msg):
    """A `say=` for train() that prints nothing."""
