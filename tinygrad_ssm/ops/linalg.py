"""Matrix products: matmul (with batch broadcasting) and einsum (its subscripts are parsed and checked by
`tinygrad_ssm/args.py`, `parse_einsum`)."""
import numpy as np

from ..tensor import Function


class Matmul(Function):
    """a (..., m, k) @ b (..., k, n) -> (..., m, n); 1-d operands are reshaped to 2-d by `functional`.
    Backward: dA = dC @ B^T, dB = A^T @ dC, in the broadcast batch shape (the engine sums it back)."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a @ b

    def backward(self, grad):
        a, b = self.saved
        grad_a = grad @ np.swapaxes(b, -1, -2) if self.needs_input_grad[0] else None
        grad_b = np.swapaxes(a, -1, -2) @ grad if self.needs_input_grad[1] else None
        return grad_a, grad_b


class Einsum(Function):
    """np.einsum with explicit letters (ellipses already spelled out by `functional`).

    The gradient of operand i is an einsum of the output gradient with all the other operands, back to
    operand i's letters. A letter that only operand i has (it was summed inside that operand alone) appears
    nowhere else, so it is computed without it and broadcast back: d(sum_j a_j)/da_j = 1."""

    def forward(self, *operands, input_specs=(), output_spec=""):
        self.save_for_backward(*operands)
        self.input_specs, self.output_spec = input_specs, output_spec
        out = np.einsum(",".join(input_specs) + "->" + output_spec, *operands, optimize=True)
        # a pure transposition ('ij->ji') comes back as a view of the operand: copy, so the output never
        # aliases an input whose in-place change the version counter would not see
        return out.copy() if any(np.may_share_memory(out, o) for o in operands) else out

    def backward(self, grad):
        operands, specs = self.saved, self.input_specs
        grads = []
        for i, spec in enumerate(specs):
            if not self.needs_input_grad[i]:
                grads.append(None)
                continue
            other_specs = [s for j, s in enumerate(specs) if j != i]
            others = [o for j, o in enumerate(operands) if j != i]
            available = set(self.output_spec).union(*other_specs)
            target = "".join(c for c in spec if c in available)
            g = np.einsum(",".join([self.output_spec, *other_specs]) + "->" + target, grad, *others, optimize=True)
            for axis, letter in enumerate(spec):
                if letter not in available:
                    g = np.expand_dims(g, axis)
            grads.append(np.broadcast_to(g, np.broadcast_shapes(g.shape, operands[i].shape)))
        return tuple(grads)

