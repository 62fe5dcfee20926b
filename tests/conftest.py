"""Hypothesis profiles: `ci` (derandomized, few examples, no deadline) when CI is set, else `dev` (thorough).
Choose one by hand with HYPOTHESIS_PROFILE=dev|ci."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=15, derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
