"""Matrix products: matmul (with batch broadcasting) and einsum."""
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
        return np.einsum(",".join(input_specs) + "->" + output_spec, *operands, optimize=True)

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


def parse_einsum(subscripts: str, shapes):
    """'...ij,jk->...ik' and the operands' shapes -> (['Aij', 'jk'], 'Aik'): ellipses spelled out with
    spare letters, the implicit output (letters used once, alphabetical) made explicit."""
    text = subscripts.replace(" ", "")
    inputs, arrow, output = text.partition("->")
    input_specs = inputs.split(",")
    if len(input_specs) != len(shapes):
        raise ValueError(f"einsum: {subscripts!r} names {len(input_specs)} operands, got {len(shapes)}")
    used = set(c for c in text if c.isalpha())
    spare = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used)
    ellipsis_ndim = max([len(s) - (len(spec) - 3) for spec, s in zip(input_specs, shapes) if "..." in spec],
                        default=0)
    ellipsis_letters = "".join(next(spare) for _ in range(ellipsis_ndim))
    expanded = []
    for spec, shape in zip(input_specs, shapes):
        if "..." in spec:
            n = len(shape) - (len(spec) - 3)
            spec = spec.replace("...", ellipsis_letters[len(ellipsis_letters) - n:] if n else "")
        if len(spec) != len(shape) or not spec.isalpha():
            raise ValueError(f"einsum: subscripts {spec!r} don't fit an operand of shape {tuple(shape)}")
        if len(set(spec)) != len(spec):
            raise ValueError(f"einsum: repeated letter in {spec!r} (diagonals) is not supported")
        expanded.append(spec)
    if arrow:
        output = output.replace("...", ellipsis_letters)
    else:
        counts = {c: "".join(expanded).count(c) for c in set("".join(expanded))}
        output = ellipsis_letters + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ellipsis_letters))
    if not set(output) <= set("".join(expanded)) or len(set(output)) != len(output):
        raise ValueError(f"einsum: output {output!r} of {subscripts!r} must use each input letter at most once")
    return expanded, output
