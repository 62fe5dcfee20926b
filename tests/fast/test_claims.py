"""fast/claims.py: threads claiming work items from atomic counters (decoding's phases, the scan's items)."""
from __future__ import annotations

import threading

import numpy as np
from numba import njit

from tinygrad_ssm.fast import claims


@njit
def claim_all(sync, phase, step, n, out):
    while True:
        c = claims.claim(sync, phase, step, n)
        if c < 0:
            break
        out[c] += 1
        claims.finish(sync, phase)
    claims.wait_done(sync, phase, step, n)


def test_claims_hand_out_each_chunk_once_per_step_and_never_a_later_steps():
    sync = claims.sync_array(2)
    counts = np.zeros((3, 38), np.int64)                                # a spare column: a chunk past the last
    for step in range(3):                                               # two threads at once, every step
        threads = [threading.Thread(target=claim_all, args=(sync, 1, step, 37, counts[step])) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    assert (counts[:, :37] == 1).all() and not counts[:, 37].any()
    assert claims.claim(sync, 1, 1, 37) == -1                       # an old step: nothing left to claim
    assert claims.claim(sync, 0, 0, 3) == 0                         # phases count apart
    assert claims.claim(sync, 1, 3, 37) == 0                        # the next step's first chunk


@njit(nogil=True)
def claim_from_end_in_rounds(counter, n, from_back, order, arrivals, threads, per_round):
    """Claims in rounds: up to per_round items (fewer once nothing is left), then waits until every thread has
    finished the round (arrivals[0] counts the arrivals), so the threads' claims interleave whatever the OS does;
    the first wait is the start. rounds * threads * per_round >= n: the last round finds nothing left.
    order[k] = the k-th item this thread got, -1 after its last."""
    rounds = (n + threads * per_round - 1) // (threads * per_round)
    k = 0
    for r in range(rounds + 1):
        claims.atomic_increment(arrivals, 0)
        while claims.atomic_load(arrivals, 0) < threads * (r + 1):
            claims.pause()
        if r == rounds:
            break
        for _ in range(per_round):
            c = claims.claim_from_end(counter, n, from_back)
            if c < 0:
                break
            order[k] = c
            k += 1


def test_claim_from_end_takes_the_front_and_the_back_in_turn():
    counter, n = claims.sync_array(1), 7
    got = [claims.claim_from_end(counter, n, from_back) for from_back in (False, True, True, False, True, False,
                                                                              False, True, False)]
    assert got == [0, 6, 5, 1, 4, 2, 3, -1, -1]


def test_claim_from_end_hands_out_each_item_once_to_threads_at_both_ends():
    n = 200_001
    for threads in (1, 2, 3):
        counter, arrivals = claims.sync_array(1), claims.sync_array(1)
        orders = np.full((threads, n), -1, np.int64)
        workers = [threading.Thread(target=claim_from_end_in_rounds,
                                    args=(counter, n, i > 0, orders[i], arrivals, threads, 5_000))
                   for i in range(threads)]
        [w.start() for w in workers]
        [w.join() for w in workers]
        got = [order[order >= 0] for order in orders]
        assert np.array_equal(np.sort(np.concatenate(got)), np.arange(n))           # each item exactly once
        assert np.array_equal(got[0], np.arange(len(got[0])))                       # the front: 0, 1, 2, ...
        if threads > 1:
            back = np.sort(np.concatenate(got[1:]))[::-1]
            assert np.array_equal(back, np.arange(n - 1, n - 1 - len(back), -1))    # the back: n - 1, n - 2, ...
        assert all(len(g) for g in got), [len(g) for g in got]                      # every thread took some
        assert claims.claim_from_end(counter, n, False) == -1                       # and nothing is left


@njit(nogil=True)
def wait_for(sync, phase, step, n):
    claims.wait_done(sync, phase, step, n)


def test_wait_done_returns_only_once_every_chunk_of_the_step_is_finished():
    """A thread waiting for a phase goes on only when its last chunk is done, not just claimed (the next phase
    reads what the chunks wrote), in any step."""
    sync, n = claims.sync_array(1), 3
    for step in range(2):
        assert [claims.claim(sync, 0, step, n) for _ in range(n + 1)] == [0, 1, 2, -1]
        for _ in range(n - 1):
            claims.finish(sync, 0)
        waiter = threading.Thread(target=wait_for, args=(sync, 0, step, n), daemon=True)
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()                                        # the last chunk is still being computed
        claims.finish(sync, 0)
        waiter.join(10)
        assert not waiter.is_alive()
