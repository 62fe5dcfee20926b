"""The differentiable ops, one `Function` class per op, forward beside backward:
elementwise, reduce (and softmax family), movement (shape), linalg (matmul, einsum), nn (fused layer ops)."""
