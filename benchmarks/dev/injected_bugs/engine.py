"""Bugs in the engine a learner reads (tinygrad_ssm/autograd/): each should fail a test of tests/autograd/."""
from inject_bugs import Bug

BUGS = [
    Bug("tinygrad_ssm/autograd/ops/reduce.py", "* is_extreme / ties", "* is_extreme",
        ("tests/autograd",), "max's gradient not shared among ties"),
    Bug("tinygrad_ssm/autograd/ops/reduce.py", "return s * (grad - np.sum(grad * s, axis=self.axis, keepdims=True))",
        "return s * (grad - np.sum(grad * s, axis=self.axis, keepdims=True) * 0.999)",
        ("tests/autograd",), "softmax's backward off by 0.1% of its second term"),
]
