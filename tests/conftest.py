"""Hypothesis profiles: `ci` (derandomized, few examples, no deadline) when CI is set, else `dev` (thorough).
Choose one by hand with HYPOTHESIS_PROFILE=dev|ci. And the fixtures tests in several folders share (plain helper
functions are in tests/support/)."""
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=15, derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A text file to train on: 300 numbered lines (~16 KB), enough for a tiny model's batches and its validation
    split. Tests only read it."""
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_bytes(b"".join(b"line %d: the quick brown fox jumps over the lazy dog\n" % i for i in range(300)))
    return path
