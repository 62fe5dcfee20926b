"""The decoder's step inside numba: every layer of a Mamba-2 model advanced by the rows of one step (one token
per sequence, or a short prompt's tokens), in phases (pre-norm, in_proj with the conv and dt, the heads, the
group norm, out_proj; then the LM head), each cut into chunks that the caller's thread and one helper thread
claim from atomic counters (fast/claims.py); and the loops around it: the caller's step (_lead), generation
that feeds each sampled token back (_sampled), the helper thread polling for steps (_helper). The arrays come
from decode.py, which prepares them once per model and cache; the per-token math is fast/decode_kernels.py.
"""
from __future__ import annotations

import numpy as np

from ...fast.claims import atomic_load, atomic_store, claim, cycles, finish, relax, wait_done
from ...fast.decode_kernels import _JIT, _group_norm, _head_update, _in_proj_rows, _residual_norm, weight_rows
from ...fast.jit import njit
from ...fast.sampling_kernels import sample_rows


@njit(**_JIT)
def _n_chunks(n_rows, big, small):
    """Chunks of a projection's n_rows: two of `big` rows (0 when the projection is small), then `small` ones."""
    return 2 * (big > 0) + (n_rows - 2 * big + small - 1) // small


@njit(**_JIT)
def _chunk(c, n_rows, big, small):
    """Chunk c's rows [lo, hi) (see _n_chunks)."""
    if big > 0 and c < 2:
        return c * big, (c + 1) * big
    lo = 2 * big + (c - 2 * (big > 0)) * small
    return lo, min(lo + small, n_rows)


@njit(**_JIT)
def _mark(prof, kind, since):
    """prof[kind] += the cycles since `since`; returns now."""
    now = cycles()
    prof[kind] += now - since
    return now


@njit(**_JIT)
def _product_phase(sync, phase, step, W, u, bias, zero, out, big, small):
    """Phase `phase` of a projection: claim its chunks of W's rows (_chunk) until none is left, each
    out[:, lo:hi] = u @ W[lo:hi]^T + bias[lo:hi]. Returns the phase's chunk count (for wait_done)."""
    n_chunks = _n_chunks(out.shape[1], big, small)
    while True:
        c = claim(sync, phase, step, n_chunks)
        if c < 0:
            return n_chunks
        lo, hi = _chunk(c, out.shape[1], big, small)
        weight_rows(W, lo, hi, u, bias, zero, out)
        finish(sync, phase)


PROFILE_PHASES = ("residual + norm", "in_proj + conv + dt", "state update + gate", "group norm", "out_proj",
                  "lm head")


@njit(**_JIT)
def _step(step, last_wait, args):
    """Step number `step` of one token per row: every phase's chunks claimed from `sync` (fast/claims.py), so
    any number of threads may run this at once and each chunk is computed once. last_wait: return only when
    the logits are done (the caller's thread); a helper leaves as soon as nothing is left to claim.
    The work rows may hold several tokens per sequence (a prompt: rows = tokens x b, token-major, row t b + bi
    of sequence bi): the projections and norms take every row at once (each weight read once for all of
    them), the conv and the heads take a sequence's tokens in order, and the logits are the last token's."""
    sync, ids, emb, head, norm_f, mats, vecs, conv_states, ssms, bufs, dtv, hsq, eps, ngroups, low, high, clamp, \
        zero, rows, big_share, prof = args
    profiling = last_wait and prof.shape[0] > 0                        # the caller's cycles by phase (PROFILE)
    t = cycles() if profiling else 0
    in_w, out_w, conv_w = mats
    norm_w, in_b, conv_b, dt_bias, A_log, D, gnorm_w, out_b, head_b = vecs
    x, u, proj, xbc, y, delta, logits = bufs                            # (b, .) work rows of the model's dtype
    (big_in, rows_in), (big_out, rows_out), (big_head, rows_head), heads_per_chunk = rows
    nb, n_layer = x.shape[0], len(in_w)
    nbs, h = ssms[0].shape[0], dtv.shape[1]                             # sequences, heads
    tokens = nb // nbs                                                  # per sequence: 1, or a prompt's
    big_heads = int(nbs * h * big_share) // heads_per_chunk * heads_per_chunk  # as decode._chunking does
    # the norms' rows in two halves: a row is less work than a claim when the threads contend (~1 us); measured
    # against 45% chunks and then single rows, both norm phases took 2-3 us less a token at batch 8
    big_rows, big_groups = nb // 2, nb * ngroups // 2
    coef = np.empty(4, ssms[0].dtype)
    phase = 0
    for layer in range(n_layer + 1):
        w_norm = norm_w[layer] if layer < n_layer else norm_f         # the block's pre-norm, or the final one
        n_chunks = _n_chunks(nb, big_rows, 1)
        while True:                                                     # residual (+ delta) and pre-norm: rows
            c = claim(sync, phase, step, n_chunks)
            if c < 0:
                break
            lo, hi = _chunk(c, nb, big_rows, 1)
            for bi in range(lo, hi):
                _residual_norm(layer == 0, x, delta, emb, ids, w_norm, eps, u, bi)
            finish(sync, phase)
        wait_done(sync, phase, step, n_chunks)
        if profiling:
            t = _mark(prof, 0, t)
        phase += 1
        if layer == n_layer:
            break
        # this layer's arrays, each taken from its list once (an item costs a call and a reference count)
        w_in, b_in, w_conv, b_conv, dt_b = in_w[layer], in_b[layer], conv_w[layer], conv_b[layer], dt_bias[layer]
        conv_state, ssm, a_log, d_skip = conv_states[layer], ssms[layer], A_log[layer], D[layer]
        w_gnorm, w_out, b_out = gnorm_w[layer], out_w[layer], out_b[layer]
        n_chunks = _n_chunks(proj.shape[1], big_in, rows_in)
        while True:                                                     # in_proj, conv, dt: blocks of rows
            c = claim(sync, phase, step, n_chunks)
            if c < 0:
                break
            lo, hi = _chunk(c, proj.shape[1], big_in, rows_in)
            _in_proj_rows(w_in, lo, hi, u, b_in, zero, w_conv, b_conv, conv_state, dt_b, low, high, clamp, proj,
                          xbc, dtv)
            finish(sync, phase)
        wait_done(sync, phase, step, n_chunks)
        if profiling:
            t = _mark(prof, 1, t)
        phase += 1
        n_chunks = _n_chunks(nbs * h, big_heads, heads_per_chunk)
        while True:                                                     # SSM update, readout, gate: (seq, head)s
            c = claim(sync, phase, step, n_chunks)
            if c < 0:
                break
            lo, hi = _chunk(c, nbs * h, big_heads, heads_per_chunk)
            i = lo
            while i < hi:                                               # sequence i // h, head i % h (and next)
                pair = i + 1 < hi and (i + 1) % h != 0                  # two heads of one row: streamed together
                for token in range(tokens):                             # the sequence's tokens in order
                    _head_update(token * nbs + i // h, i % h, pair, ngroups, proj, xbc, dtv, a_log, d_skip, ssm,
                                 coef, y, hsq)
                i += 2 if pair else 1
            finish(sync, phase)
        wait_done(sync, phase, step, n_chunks)
        if profiling:
            t = _mark(prof, 2, t)
        phase += 1
        n_chunks = _n_chunks(nb * ngroups, big_groups, 1)
        while True:                                                     # gated norm: (row, group)s
            c = claim(sync, phase, step, n_chunks)
            if c < 0:
                break
            lo, hi = _chunk(c, nb * ngroups, big_groups, 1)
            for i in range(lo, hi):                                     # row i // ngroups, group i % ngroups
                _group_norm(i // ngroups, i % ngroups, ngroups, hsq, w_gnorm, eps, y)
            finish(sync, phase)
        wait_done(sync, phase, step, n_chunks)
        if profiling:
            t = _mark(prof, 3, t)
        phase += 1
        n_chunks = _product_phase(sync, phase, step, w_out, y, b_out, zero, delta, big_out, rows_out)   # out_proj
        wait_done(sync, phase, step, n_chunks)
        if profiling:
            t = _mark(prof, 4, t)
        phase += 1
    u_last = u[nb - logits.shape[0]:]                                   # (b, d_model) the last token's rows
    n_chunks = _product_phase(sync, phase, step, head, u_last, head_b, zero, logits, big_head, rows_head)
    if last_wait:
        wait_done(sync, phase, step, n_chunks)
        if profiling:
            _mark(prof, 5, t)


@njit(**_JIT)
def _lead(control, step, args):
    """The caller's thread: publish step `step` to the helpers (control[0] = steps published), then work."""
    atomic_store(control, 0, step + 1)
    _step(step, True, args)


@njit(**_JIT)
def _sampled(control, first_step, args, vocab, temperature, top_k, top_p, min_p, penalty, seen, uniforms, tokens,
             ran):
    """Generation without leaving numba: from the ids in args, steps first_step, first_step + 1, ... each
    feeding its token (tokens[i] (b,), sample_next's choice made by its numba twin, fast/sampling_kernels.py:
    row bi draws with uniforms[i, bi]; temperature 0 is greedy; top_k 0 / top_p 1.0 / min_p 0.0: no filter;
    penalty 1.0: none, else each token is marked in seen (b, vocab) as it is drawn) to the next.
    Returns the tokens written: all of tokens' rows, or fewer when a step's logits hold a non-finite value
    (that step ran; its logits are left for the error). ran (1,): the steps run, for a caller whose Ctrl-C
    lands as this returns (the result is lost then, and the step numbers spent must still be counted)."""
    ids, logits = args[1], args[9][6]
    for i in range(tokens.shape[0]):
        _lead(control, first_step + i, args)
        ran[0] = i + 1
        if sample_rows(logits, vocab, temperature, top_k, top_p, min_p, penalty, seen, uniforms[i], ids) >= 0:
            return i
        tokens[i] = ids
        if penalty != 1.0:
            for bi in range(ids.shape[0]):
                seen[bi, ids[bi]] = True
    return tokens.shape[0]


_IDLE_SPINS = 30_000  # rounds of relax() (~2000 pauses, then sched_yield) before a helper goes home: ~10 ms


@njit(**_JIT)
def _helper(control, args):
    """A helper thread's loop: join every published step until told to stop (control[1] not 0: returns True) or
    idle for a while (returns False). decode.py's _helper_thread runs it and keeps control[2] (helper running)."""
    seen = max(atomic_load(control, 0) - 1, 0)
    spins = 0
    while atomic_load(control, 1) == 0:
        published = atomic_load(control, 0)
        if published > seen:
            _step(published - 1, False, args)
            seen, spins = published, 0
        elif spins > _IDLE_SPINS:
            return False
        else:
            relax(spins)
            spins += 1
    return True
