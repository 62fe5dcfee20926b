"""The fast paths: numba kernels and the ops built on them. Each has a slow twin made of engine ops
(tinygrad_ssm/autograd/) that a test holds it equal to in float64; the module's docstring names that twin.

    fused.py (+ conv_kernels, norm_kernels)  the mixer's fused ops       twins: reference_* in fused.py
    row_kernels.py                           cross entropy, embedding    twins: autograd/ops/reduce.py
                                                                                CrossEntropy, ops/nn.py Embedding
    adam_kernel.py                           AdamW's update              twin: optim/adam.py's NumPy update
    decode_kernels.py                        one decoded token           twin: Mamba2Mixer.step (fused=False)
    row_blocks.py, claims.py                 work split over threads (blocks of rows; atomic counters)
    fast_exp.py, vector_width.py             an exp that vectorises; a 512-bit vector hint for one function
    blas_threads.py, heap_reuse.py           process tuning: OpenBLAS's thread wait, glibc's heap thresholds

The scan's kernels are in tinygrad_ssm/scan/, beside its engine-op reference."""
