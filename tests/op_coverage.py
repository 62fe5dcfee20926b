"""Which test checks which public op: a test file makes one `OpCoverage`, decorates its tests with
`@coverage.checks("name", ...)`, and a completeness test calls `coverage.assert_complete()`, which fails
when an op in tinygrad_ssm.functional.OPS has no check (or a check names an op that does not exist)."""
from tinygrad_ssm import functional as F


class OpCoverage:
    def __init__(self, kind: str):
        self.kind = kind                      # e.g. "gradient check", for the failure message
        self.checked: dict[str, str] = {}     # op name -> the test that checks it

    def checks(self, *names):
        """Register the decorated test as the `kind` of `names`."""
        def register(test):
            for name in names:
                self.checked[name] = test.__name__
            return test
        return register

    def assert_complete(self):
        missing = sorted(set(F.OPS) - set(self.checked))
        unknown = sorted(set(self.checked) - set(F.OPS))
        assert not missing, f"ops in functional.OPS without a {self.kind}: {missing}"
        assert not unknown, f"{self.kind}s for names that are not in functional.OPS: {unknown}"
