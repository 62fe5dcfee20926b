"""Matrix products: matmul (with batch broadcasting) and einsum (its subscripts are parsed and checked by
`tinygrad_ssm/autograd/args.py`, `parse_einsum`)."""
import numpy as np

from ..function import Function


class Matmul(Function):
    """a (..., m, k) @ b (..., k, n) -> (..., m, n); 1-d operands are reshaped to 2-d by `functional`.
    Backward: dA = dC @ B^T, dB = A^T @ dC, in the broadcast batch shape (the engine sums it back).
    A 2-d operand that is a transposed view (W.T in Linear) gets its gradient laid out the same way, as
    (dC^T A)^T, so that the transpose's backward hands the weight a C-contiguous gradient: the same product,
    and no copy of it later (AdamW's kernel takes C-contiguous arrays: it copied every weight's gradient).
    The layouts are noted in forward: backward keeps only the operand a wanted gradient reads (dA reads B, dB
    reads A), so a change to the other one in between (an optimizer's step on a frozen side) is no error, as torch."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        out = a @ b
        self.transposed = (is_transposed(a, out), is_transposed(b, out))
        return out

    def saved_needed(self):
        return self.needs_input_grad[1], self.needs_input_grad[0]

    def backward(self, grad):
        a, b = self.saved
        grad_a = grad_b = None
        if self.needs_input_grad[0]:
            grad_a = (b @ grad.T).T if self.transposed[0] else grad @ np.swapaxes(b, -1, -2)
        if self.needs_input_grad[1]:
            grad_b = (grad.T @ a).T if self.transposed[1] else np.swapaxes(a, -1, -2) @ grad
        return grad_a, grad_b


def is_transposed(operand: np.ndarray, out: np.ndarray) -> bool:
    """A 2-d product whose operand is laid out column-major (a transposed view), so its gradient (shaped like
    `out`'s) should be too."""
    return operand.ndim == out.ndim == 2 and operand.flags.f_contiguous and not operand.flags.c_contiguous


class Einsum(Function):
    """np.einsum with explicit letters (ellipses already spelled out by `functional`).

    The gradient of operand i is an einsum of the output gradient with all the other operands, back to
    operand i's letters. A letter that only operand i has (it was summed inside that operand alone) appears
    nowhere else, so it is computed without it and broadcast back: d(sum_j a_j)/da_j = 1."""

    def forward(self, *operands, input_specs=(), output_spec=""):
        self.save_for_backward(*operands)
        self.input_specs, self.output_spec = input_specs, output_spec
        self.shapes = tuple(o.shape for o in operands)
        out = np.einsum(",".join(input_specs) + "->" + output_spec, *operands, optimize=True)
        # a pure transposition ('ij->ji') comes back as a view of the operand: copy, so the output never
        # aliases an input whose in-place change the version counter would not see
        return out.copy() if any(np.may_share_memory(out, o) for o in operands) else out

    def saved_needed(self):
        """Operand j is read by the gradients of the others only (its own needs just its shape)."""
        wanted = self.needs_input_grad
        return tuple(any(w for i, w in enumerate(wanted) if i != j) for j in range(len(wanted)))

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
            grads.append(np.broadcast_to(g, np.broadcast_shapes(g.shape, self.shapes[i])))
        return tuple(grads)

