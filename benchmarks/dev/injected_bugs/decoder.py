"""Bugs in the fast decoding path that the other lists leave out: the decoder's Python side (models/mamba2/decode.py:
weights taken and rebuilt, sessions made, matched, released and closed, decode_prompt's rows and seqlen_offset),
its numba step (decode_step.py: chunks, prompt rows, the generation loop, the profile), the atomic claims
(fast/claims.py), the pool of large arrays (fast/heap_reuse.py), the row blocks' threads (fast/row_blocks.py),
BLAS's thread limit (fast/blas_threads.py), the 8-bit products and dequantization (fast/quantized_kernels.py) and
quantized folders (models/mamba2/quantized_files.py). Each should fail a test of tests/fast or tests/models.
Last full run: 54 of 54 caught (bugs 1-54; again on main on 2026-12-06), 11 min 1 s of tests on the shared 2-core
machine (the decode.py and decode_step.py bugs pay numba's compilation, 15-70 s each); 55 and 56 caught when added; 57-59 (quantizing in slabs) 3 of 3 on 2026-12-07,
60-64 (threads and forks, the API audit) 5 of 5 after them; 2 and 3 again after fresh() took the model."""
# ruff: noqa: E501 (each bug quotes lines of code whole, so that it names one place)
from inject_bugs import Bug

DEC = "tinygrad_ssm/models/mamba2/decode.py"
STEP = "tinygrad_ssm/models/mamba2/decode_step.py"
CLAIMS = "tinygrad_ssm/fast/claims.py"
HEAP = "tinygrad_ssm/fast/heap_reuse.py"
ROWS = "tinygrad_ssm/fast/row_blocks.py"
BLAS = "tinygrad_ssm/fast/blas_threads.py"
QK = "tinygrad_ssm/fast/quantized_kernels.py"
QF = "tinygrad_ssm/models/mamba2/quantized_files.py"
TD = "tests/models/test_decode.py"
TK = "tests/fast/test_decode_kernels.py"
TQ = "tests/models/test_quantize.py"
HEAP_TESTS = ("tests/fast/test_heap_reuse.py", "-k", "pool or block or zeros or release or live or tied")

BUGS = [
    # --- decode.py: weights taken once, rebuilt when replaced --------------------------------------------------
    Bug(DEC, "        self.copied |= a is not tensor.data", "        self.copied = a is not tensor.data",
        (TD, "-k", "copied"), "only the last weight taken decides whether the prepared weights hold a copy (a copied one is never taken again)"),
    Bug(DEC, "        return (not self.copied and all(map(operator.is_, current, self._arrays))",
        "        return (not self.copied and any(map(operator.is_, current, self._arrays))",
        (TK, "-k", "weights_changed"), "the prepared weights count as fresh while any one parameter is still the array taken"),
    Bug(DEC, "    if w is None or not w.fresh(model):", "    if w is None:",
        (TK, "-k", "weights_changed"), "the prepared weights are never rebuilt after a parameter is replaced"),
    Bug(DEC, "        self.head = self.emb if model.lm_head is None else take(model.lm_head, \"weight\")",
        "        self.head = self.emb", (TD, "-k", "equals_engine"), "an untied model's logits read the embedding as the head"),
    Bug(DEC, "        self.sources.append((module, name, tensor.data))\n        if isinstance(tensor, QuantizedWeight):                         # read as stored: fast/quantized_kernels.py\n            return tensor.kernel_form()",
        "        if isinstance(tensor, QuantizedWeight):                         # read as stored: fast/quantized_kernels.py\n            return tensor.kernel_form()\n        self.sources.append((module, name, tensor.data))",
        (TQ, "-k", "replaced_on_its_module"), "a quantized weight is never checked for replacement (quantizing again keeps the decoder on the old weights)"),
    # --- decode.py: sessions --------------------------------------------------------------------------------------
    Bug(DEC, "        setattr(state, name, Tensor(a))\n", "",
        (TD, "-k", "non_contiguous"), "a non-contiguous cache state is copied but the cache keeps the old one (the decoder's writes are lost)"),
    Bug(DEC, "        low, high = (float(v) for v in c.dt_limit)", "        high, low = (float(v) for v in c.dt_limit)",
        (TD, "-k", "equals_engine"), "the dt limit's bounds swapped"),
    Bug(DEC, "        return (self.weights is weights and self.batch == batch and",
        "        return (self.batch == batch and", (TK, "-k", "weights_changed"),
        "a session outlives the weights it was made on (replaced weights never read)"),
    Bug(DEC, "                all(map(operator.is_, map(_DATA, self._cache_tensors(cache)), self.arrays)))",
        "                all(map(operator.is_, map(_DATA, list(self._cache_tensors(cache))[:2]), self.arrays)))",
        (TD, "-k", "replaced_in_one_layer"), "a session matches a cache whose first layer kept its states though a later layer's were replaced"),
    Bug(DEC, "        if self.control[2] == 0 and helper_threads():", "        if helper_threads():",
        (TK, "-k", "starts_one_helper"), "a new helper thread started at every step, beside the one still running"),
    Bug(DEC, "        return self.logits.copy()\n\n    def sampled", "        return self.logits\n\n    def sampled",
        (TD, "-k", "kept_after"), "a step's logits are the session's buffer, overwritten by the next step"),
    Bug(DEC, "    cache.seqlen_offset += steps\n", "    cache.seqlen_offset += len(tokens)\n",
        (TD, "-k", "finite"), "a token block stopped at non-finite logits advances seqlen_offset by the tokens only, not the step that found them"),
    Bug(DEC, "    cache.seqlen_offset += l\n", "    cache.seqlen_offset += 1\n",
        (TK, "-k", "prompt_in_one_step"), "decode_prompt counts one position for a prompt of l tokens"),
    Bug(DEC, "    session.ids[:] = ids.T.ravel()                                      # token-major (l b,)",
        "    session.ids[:] = ids.ravel()                                        # token-major (l b,)",
        (TK, "-k", "prompt_in_one_step"), "decode_prompt's rows sequence-major, not token-major"),
    Bug(DEC, "    session = cache.__dict__.pop(\"_decode_session\", None)", "    session = cache.__dict__.get(\"_decode_session\")",
        (TK, "-k", "starts_one_helper"), "release closes the session but leaves it on the cache: the next step reuses it and its helpers leave at once"),
    Bug(DEC, "    if not (isinstance(profile, np.ndarray) and profile.dtype == np.int64 and profile.shape == (len(PROFILE_PHASES),)",
        "    if not (isinstance(profile, np.ndarray) and profile.shape == (len(PROFILE_PHASES),)",
        (TD, "-k", "entry_points"), "a PROFILE of int32 accepted (the step writes int64 counts into it)"),
    # --- decode_step.py: the numba step ----------------------------------------------------------------------------
    Bug(STEP, "    return 2 * (big > 0) + (n_rows - 2 * big + small - 1) // small", "    return 2 * (big > 0) + (n_rows - 2 * big) // small",
        (TK + "::test_chunks_tile_the_rows_once",), "a projection's last partial chunk never claimed"),
    Bug(STEP, "    return lo, min(lo + small, n_rows)", "    return lo, lo + small",
        (TK + "::test_chunks_tile_the_rows_once",), "the last small chunk runs past the rows' end"),
    Bug(STEP, "    u_last = u[nb - logits.shape[0]:]", "    u_last = u[:logits.shape[0]]",
        (TK, "-k", "prompt_in_one_step"), "a prompt step's logits from its first token's rows, not its last"),
    Bug(STEP, "                pair = i + 1 < hi and (i + 1) % h != 0", "                pair = i + 1 < hi",
        (TK, "-k", "any_chunk"), "two heads streamed as a pair across two sequences"),
    Bug(STEP, "        if sample_rows(logits, vocab, temperature, top_k, top_p, min_p, penalty, seen, uniforms[i], ids) >= 0:",
        "        if sample_rows(logits, vocab, temperature, top_k, top_p, min_p, penalty, seen, uniforms[i], ids) > 0:",
        (TD, "-k", "finite"), "non-finite logits in the first row never stop the generation loop"),
    Bug(STEP, "        if profiling:\n            t = _mark(prof, 2, t)", "        if profiling:\n            _mark(prof, 2, t)",
        (TK, "-k", "single_steps"), "the profile's stamp not moved after the heads: the group norm counted from the phase before"),
    # --- claims.py -------------------------------------------------------------------------------------------------
    Bug(CLAIMS, "        if c >= end:\n            return -1", "        if c > end:\n            return -1",
        ("tests/fast/test_claims.py",), "one chunk past the step's last handed out (a later step's first)"),
    Bug(CLAIMS, "        if front + back >= n:", "        if front + back > n:",
        ("tests/fast/test_claims.py",), "claim_from_end hands the item where the two ends meet out twice"),
    Bug(CLAIMS, "            return n - 1 - back if from_back else front", "            return n - back if from_back else front",
        ("tests/fast/test_claims.py",), "claim_from_end's back starts one past the last item"),
    Bug(CLAIMS, "    while atomic_load(sync, phase * 2 * _LINE + _LINE) < end:", "    while atomic_load(sync, phase * 2 * _LINE + _LINE) < end - 1:",
        ("tests/fast/test_claims.py",), "wait_done returns while the phase's last chunk is still being computed"),
    # --- heap_reuse.py ---------------------------------------------------------------------------------------------
    Bug(HEAP, "    return sys.getrefcount(_blocks[i]) == 2", "    return sys.getrefcount(_blocks[i]) <= 3",
        HEAP_TESTS, "a block handed out again while one view of it lives"),
    Bug(HEAP, "        fits = [i for i in unused\n                if _blocks[i].dtype == dtype and ",
        "        fits = [i for i in unused\n                if ", HEAP_TESTS, "a block handed out to a request of another dtype"),
    Bug(HEAP, "count <= _blocks[i].size <= count + count // (SLACK - 1)]", "count <= _blocks[i].size]",
        HEAP_TESTS, "a small request takes a block of any larger size"),
    Bug(HEAP, "    if unpooled is np.zeros:\n        out.fill(0)\n", "",
        HEAP_TESTS, "zeros from a reused block hold the old values"),
    Bug(HEAP, "        _peak_in_use = max(_peak_in_use, in_use + need)", "        _peak_in_use = max(_peak_in_use, in_use)",
        HEAP_TESTS, "the peak in use leaves out the request being served (the pool drops blocks it will need)"),
    Bug(HEAP, "            _blocks.append(block)                                       # now the most recently handed out\n",
        "", HEAP_TESTS, "a reused block leaves the pool (it is not handed out again, and the backward walk no longer knows it)"),
    Bug(HEAP, "        for i in reversed(unused):\n            del _blocks[i]\n        return released",
        "        for i in unused:\n            del _blocks[i]\n        return released", HEAP_TESTS,
        "release_unused deletes by indices that shifted (a used block dropped, an unused one kept)"),
    Bug(HEAP, "    return 1 if any(b is block for b in _blocks) else 0", "    return 0",
        HEAP_TESTS, "the backward walk is never told a pooled gradient is the pool's (summed into a new array)"),
    Bug(HEAP, "or any(name in os.environ for name in ENVIRONMENT):", "or all(name in os.environ for name in ENVIRONMENT):",
        ("tests/fast/test_heap_reuse.py", "-k", "environment"), "one MALLOC_ variable in the environment no longer wins"),
    # --- row_blocks.py ----------------------------------------------------------------------------------------------
    Bug(ROWS, "    if state[\"errors\"]:\n        raise state[\"errors\"][0]", "",
        ("tests/fast/test_fused.py", "-k", "helper or caller or as_rows"), "an error in a helper thread is swallowed"),
    Bug(ROWS, "            if state[\"closed\"]:                                          # started too late: nothing to do\n                return\n",
        "", ("tests/fast/test_fused.py", "-k", "caller"), "a helper that starts after the op returned still runs its work"),
    Bug(ROWS, "        col = offset % width", "        col = offset % c", ("tests/fast/test_fused.py", "-k", "as_rows"),
        "a split view's column taken modulo its own width, not its rows'"),
    # --- blas_threads.py ---------------------------------------------------------------------------------------------
    Bug(BLAS, "                if _depth == 0:", "                if _depth <= 1:",
        ("tests/fast/test_blas_threads.py", "-k", "restored or meanwhile"), "a nested call restores BLAS's threads as it leaves, inside the outer one"),
    Bug(BLAS, "        owns = _owner is me", "        owns = True",
        ("tests/fast/test_blas_threads.py", "-k", "restored or meanwhile"), "another thread's call restores the limit that the owner still holds"),
    Bug(BLAS, "                    _owner = _limiter = None", "                    _limiter = None",
        ("tests/fast/test_blas_threads.py", "-k", "restored or meanwhile"), "the owner never gives the limit up: later calls set none"),
    # --- quantized_kernels.py ------------------------------------------------------------------------------------------
    Bug(QK, "    n_vectors = Q.shape[1] // VECTOR if block % VECTOR == 0 else 0", "    n_vectors = Q.shape[1] // VECTOR if block >= VECTOR else 0",
        ("tests/fast/test_quantized_kernels.py", "-k", "every_kind_of_block"), "an int8 block of 48 read in vectors of 32 (scales misassigned)"),
    Bug(QK, "    _rows(Q, S, lo, hi, u, bias, zero, out, n_vectors, max(block // VECTOR, 1))", "    _rows(Q, S, lo, hi, u, bias, zero, out, n_vectors, 1)",
        ("tests/fast/test_quantized_kernels.py", "-k", "equal_the_dequantized"), "an int8 block of 64 takes a scale per 32 weights"),
    Bug(QK, "                out[c, i] += _scalar_dot(W, S, i, u, c, start, zero)", "                out[c, i] = _scalar_dot(W, S, i, u, c, start, zero)",
        ("tests/fast/test_quantized_kernels.py", "-k", "equal_the_dequantized"), "the columns past the last vector replace the vectors' sum"),
    Bug(QK, "    return lambda W, S, i, j, zero: (zero + W[i, j]) * S[i, j // (W.shape[1] // S.shape[1])]",
        "    return lambda W, S, i, j, zero: (zero + W[i, j]) * S[i, j // VECTOR]",
        ("tests/fast/test_quantized_kernels.py", "-k", "equal_the_dequantized"), "a scalar int8 weight takes the scale of block j // 32 whatever the block"),
    Bug(QK, "                w[base + j] = np.float64(q[base + j]) * scale", "                w[base + j] = np.float32(q[base + j]) * np.float32(scale)",
        ("tests/fast/test_quantized_kernels.py", "-k", "bits_of_the_spec"), "int8 dequantized in float32 (rounded before a float64 output)"),
    Bug(QK, "        with cgutils.for_range(builder, builder.udiv(index(args[5], nt), per_scale)) as scale_loop:",
        "        with cgutils.for_range(builder, index(args[5], nt)) as scale_loop:",
        ("tests/fast/test_quantized_kernels.py", "-k", "equal_the_dequantized"), "the vector loop runs n_vectors scales, past the row for a block of 64"),
    # --- quantized_files.py --------------------------------------------------------------------------------------------
    Bug(QF, "            if not (np.isfinite(scales).all() and (scales >= 0).all()):", "            if not np.isfinite(scales).all():",
        (TQ, "-k", "corrupt"), "a negative int8 scale accepted from a file"),
    Bug(QF, "                                                     and block >= 1)):", "                                                     and block >= 0)):",
        (TQ, "-k", "positive_int_block"), "a quantized config's block of 0 accepted (divided by later)"),
    Bug(QF, "(isinstance(block, int) and not isinstance(block, bool)\n", "(isinstance(block, int)\n",
        (TQ, "-k", "positive_int_block"), "a quantized config's block of true read as 1"),
    Bug(QF, "            if s_info.dtype != \"F32\" or shape[1] % block or tuple(s_info.shape)", "            if s_info.dtype != \"F32\" or tuple(s_info.shape)",
        (TQ, "-k", "not_divide_the_inputs"), "a block that does not divide a matrix's input size accepted from a file"),
    Bug(QF, "(want is not None and info.dtype != want) or \\\n                (want is None and not info.is_float):",
        "(want is not None and info.dtype != want):", (TQ, "-k", "extra_tensor"),
        "a float parameter stored as integers accepted from a quantized folder"),
    Bug(QF, "    if set(f.tensors) != expected:", "    if not expected <= set(f.tensors):",
        (TQ, "-k", "extra_tensor"), "a quantized folder with tensors it should not hold accepted"),
    Bug(QF, "    missing = [name for name in quantized_names(model) if name not in model.varmap]\n    if missing:",
        "    missing = [name for name in quantized_names(model) if name not in model.varmap]\n    if False:",
        (TQ, "-k", "varmap"), "a float model whose VarMap another model quantized saves without its quantized matrices"),
    Bug(DEC, "            steps = int(ran[0])", "            steps = n",
        (TK, "-k", "stopped_early"), "a block stopped early and interrupted as it returned counts all n step numbers"),
    Bug(STEP, "        ran[0] = i + 1", "        ran[0] = i", (TK, "-k", "interrupted"),
        "the steps a block ran counted one short"),
    # --- quantizing in slabs (found by the quantized-memory audit, 2026-12-07) -----------------------------------------
    Bug("tinygrad_ssm/models/mamba2/quantize.py", "        rows = slice(lo, lo + _slab_rows(in_features))", "        rows = slice(lo, lo + _slab_rows(in_features) - 1)",
        (TQ, "-k", "slabs_gives"), "each slab of int8 rows leaves its last row unquantized (np.empty's bytes)"),
    Bug("tinygrad_ssm/models/mamba2/quantize.py", "    return max(1, SLAB_ELEMENTS // in_features)", "    return max(1, (1 << 30) // in_features)",
        (TQ, "-k", "holds_slabs"), "int8 quantized whole: float64 temporaries of 6x the matrix (--weights int8 peaked at 3x float32's load)"),
    Bug("tinygrad_ssm/io/safetensors.py", "    for lo in range(0, flat.size, BF16_SLAB):", "    for lo in range(0, flat.size - 1, BF16_SLAB):",
        (TQ, "-k", "slabs_gives"), "the last bfloat16 slab of one value left unconverted"),
    # --- threads and forks (found by an audit, 2026-12-07) -------------------------------------------------------------
    Bug('tinygrad_ssm/models/mamba2/decode.py', '\n                and _same_objects(_module_tree(model), self._tree))', ')',
        ('tests/models/test_decode.py', '-k', 'module_replaced'), "a module replaced on the model: the decoder goes on with the old module's weights"),
    Bug('tinygrad_ssm/models/mamba2/model.py', '        if not self._in_use.acquire(blocking=False):', '        if False:',
        ('tests/models/test_decode.py', '-k', 'another_thread'), 'two threads may advance one cache at once (the fused decoder hangs)'),
    Bug('tinygrad_ssm/fast/row_blocks.py', '        except RuntimeError:  # the interpreter is shutting down', '        except ValueError:  # the interpreter is shutting down',
        ('tests/fast/test_fused.py', '-k', 'shutdown'), 'a fused op at interpreter shutdown raises: the pool takes no new work'),
    Bug('tinygrad_ssm/fast/blas_threads.py', '        os.register_at_fork(after_in_child=_reset_after_fork)', '        pass',
        ('tests/fast/test_blas_threads.py', '-k', 'forked'), 'a child forked while a thread held the BLAS limit waits for ever'),
    Bug('tinygrad_ssm/models/mamba2/quantize.py', '    if fmt == "bfloat16" and block is not None:', '    if False:',
        ('tests/models/test_quantize.py', '-k', 'block_for_bfloat16'), "quantize('bfloat16', block=3) ignores the block"),
]
