"""The fast paths: numba kernels and the ops built on them. Each has a slow twin made of engine ops
(tinygrad_ssm/autograd/) that a test holds it equal to in float64; the module's docstring names that twin.

    fused.py (+ conv_kernels, norm_kernels)  the mixer's fused ops       twins: reference_* in fused.py
    row_ops.py (+ row_kernels)               cross entropy, embedding    twins: autograd/ops/reduce.py
                                                                                CrossEntropy, ops/nn.py Embedding
    products.py                              2-d products on the pool    twin: autograd/ops/linalg.py Matmul
    adam_kernel.py                           AdamW's update              twin: optim/adam.py's NumPy update
    decode_kernels.py                        one decoded token           twin: Mamba2Mixer.step (fused=False)
    quantized_kernels.py                     products on int8/bfloat16   twin: models/mamba2/quantize.py dequantize
    sampling_kernels.py                      the next token, sampled     twin: models/mamba2/sampling.py sample_next
    typed_lists.py, jit.py                   per-layer arrays as numba typed Lists; njit with its cache kept where
                                             numba can write it
    row_blocks.py, claims.py                 work split over threads (blocks of rows; atomic counters)
    fast_exp.py, vector_width.py             an exp that vectorises; a 512-bit vector hint for one function
    prefetch.py                              cache-line prefetch for the decoder's weight rows
    blas_threads.py, heap_reuse.py           BLAS on one thread during the pool's products; glibc's heap
                                             thresholds and a pool of arrays of 32 MiB and more, once a fused
                                             model is built (README: what changes)

The scan's kernels are in tinygrad_ssm/scan/, beside its engine-op reference."""
