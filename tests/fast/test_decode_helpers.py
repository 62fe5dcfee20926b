"""The decoder's helper thread (models/mamba2/decode.py): one per session while its steps come, sent home when
another session steps, and handed to that session when it has none, so that a server stepping many caches in
turn keeps one helper at work (not one spinning for every recent cache), and starts no thread per step."""
import os
import threading
import time
import types

import numpy as np
import pytest

from tests.support.decode import twin_models
from tinygrad_ssm.models.mamba2 import decode


def step_both(fast, slow, cache_f, cache_s, token):
    np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10,
                               atol=1e-10)


def threads_started_but_never_run(monkeypatch) -> list:
    """Each helper thread's start recorded (its _HelperWork), none run: a started helper seems to run for ever,
    so every step's work is the caller's and the hand-offs stay as the steps left them."""
    monkeypatch.setattr(decode, "helper_threads", lambda: 1)
    started = []
    monkeypatch.setattr(decode, "_thread", types.SimpleNamespace(
        start_new_thread=lambda f, args: started.append(args[0])))
    return started


def test_a_session_starts_one_helper_and_a_released_cache_a_new_one(monkeypatch):
    """A helper runs until it is idle or told to stop, and control[2] says it runs: a step meanwhile starts no
    other. release tells it to stop (control[1]); the cache's next step starts one that is not told to stop."""
    started = threads_started_but_never_run(monkeypatch)
    fast, slow = twin_models(seed=3)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    for t in range(3):
        step_both(fast, slow, cache_f, cache_s, np.array([t, t + 1]))
    assert len(started) == 1 and started[0].control[1] == 0 and started[0].control[2] == 1
    decode.release(cache_f)
    assert started[0].control[1] == 1                                   # told to stop
    step_both(fast, slow, cache_f, cache_s, np.array([5, 6]))
    assert len(started) == 2 and started[1].control[1] == 0 and started[1].control[2] == 1


def test_another_cache_step_sends_the_helper_home_and_takes_it(monkeypatch):
    """Cache b's step sends a's helper home and makes it b's (no second thread); a's next step, before that
    helper has left, calls it back, and b (promised it) starts its own at its next step."""
    started = threads_started_but_never_run(monkeypatch)
    fast, slow = twin_models(seed=4)
    a_f, a_s, b_f, b_s = fast.allocate_cache(1), slow.allocate_cache(1), fast.allocate_cache(1), slow.allocate_cache(1)
    step_both(fast, slow, a_f, a_s, np.array([1]))
    a, = started
    step_both(fast, slow, b_f, b_s, np.array([2]))
    b = b_f._decode_session.work
    assert len(started) == 1 and a.control[1] == decode._SENT_HOME and a.handed_to is b and b.control[2] == 1
    step_both(fast, slow, a_f, a_s, np.array([3]))                     # a again: its helper never left
    assert a.control[1] == 0 and a.handed_to is None and b.control[2] == 0 and len(started) == 1
    step_both(fast, slow, b_f, b_s, np.array([4]))                     # a's helper handed to b once more
    assert len(started) == 1 and a.handed_to is b and b.control[2] == 1

    # the helper's thread, run here: sent home from a, it joins b's steps until idle, then leaves
    decode._helper_thread(a)
    assert a.control[2] == 0 and b.control[2] == 0 and a.handed_to is None and b.handed_to is None


def test_no_helper_is_handed_on_or_started_where_one_thread_is_asked_for(monkeypatch):
    """numba.set_num_threads(1) between steps: the running helper is sent home and given to no one."""
    started = threads_started_but_never_run(monkeypatch)
    fast, slow = twin_models(seed=6)
    a_f, a_s, b_f, b_s = fast.allocate_cache(1), slow.allocate_cache(1), fast.allocate_cache(1), slow.allocate_cache(1)
    step_both(fast, slow, a_f, a_s, np.array([1]))
    monkeypatch.setattr(decode, "helper_threads", lambda: 0)
    step_both(fast, slow, b_f, b_s, np.array([2]))
    a, b = a_f._decode_session.work, b_f._decode_session.work
    assert len(started) == 1 and a.control[1] == decode._SENT_HOME and a.handed_to is None and b.control[2] == 0


def test_caches_stepped_in_turn_keep_one_helper_and_agree_with_the_reference(monkeypatch):
    """Real helper threads: eight caches stepped in turn give the reference's logits, the helper is handed from
    one to the next (counted: without the hand-off each cache starts its own), they settle to one running, and it
    leaves when the steps stop."""
    fast, slow = twin_models(seed=5)
    if not decode.helper_threads():
        pytest.skip("one core: no helper threads")
    real, started = decode._thread, []
    monkeypatch.setattr(decode, "_thread", types.SimpleNamespace(
        start_new_thread=lambda f, args: (started.append(args[0]), real.start_new_thread(f, args))))
    caches = [(fast.allocate_cache(1), slow.allocate_cache(1)) for _ in range(8)]
    for t in range(6):
        for i, (cache_f, cache_s) in enumerate(caches):
            step_both(fast, slow, cache_f, cache_s, np.array([(t + i) % 40]))
    assert len(started) <= 4, len(started)   # 1 here; without the hand-off 8 (each cache's own, kept spinning)
    running = lambda: sum(int(c._decode_session.control[2]) for c, _ in caches)
    deadline = time.monotonic() + 5
    while running() > 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert running() <= 1          # at most the last cache's (an old session's helper moved on, or left)
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running() == 0          # idle: gone


def test_a_forked_child_starts_its_own_helper(monkeypatch):
    """fork() while a helper held the hand-off lock and another session's helper ran: the child has neither
    thread. Its steps must not wait on the held lock for ever, and the session gets a helper of its own."""
    started = threads_started_but_never_run(monkeypatch)
    fast, slow = twin_models(seed=7)
    a_f, a_s = fast.allocate_cache(1), slow.allocate_cache(1)
    step_both(fast, slow, a_f, a_s, np.array([1]))                     # the fork hook is registered by the first step
    assert len(started) == 1
    with decode._helpers:
        pid = os.fork()
        if pid == 0:                                                    # the child: step in a thread, then leave
            done = threading.Event()
            threading.Thread(target=lambda: (fast.step(np.array([2]), a_f), done.set()), daemon=True).start()
            os._exit(0 if done.wait(10) and len(started) == 2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0    # 1: waited on the dead lock, or counted the parent's helper


def test_a_helper_told_to_stop_goes_on_only_if_called_back():
    """The helper loop returns True when told to stop: its thread leaves if the session is still closed or sent
    home, and goes on if the session's step called it back (control[1] 0 again) before it took the lock."""
    for stop, calls_wanted in ((0, 2), (decode._SENT_HOME, 1), (1, 1)):
        calls = []
        work = decode._HelperWork(np.array([5, stop, 1], np.int64), None)
        work.entry = lambda control, args: (calls.append(1), len(calls) == 1)[1]   # told to stop, then idle
        decode._helper_thread(work)
        assert len(calls) == calls_wanted and work.control[2] == 0, stop


def test_a_session_calling_back_its_helper_cancels_every_hand_off_down_the_line(monkeypatch):
    """p's helper handed to s, then (s sent home before it arrived) on to t; p steps again before its helper
    left, so it stays: s and t have none coming and must start their own (found by an audit: t kept the flag of a
    helper that never came, and every session stepped after it was handed that nothing, for good)."""
    started = threads_started_but_never_run(monkeypatch)
    fast, slow = twin_models(seed=8)
    pairs = [(fast.allocate_cache(1), slow.allocate_cache(1)) for _ in range(3)]
    for i in (0, 1, 2, 0):                                              # p, s, t, p
        step_both(fast, slow, *pairs[i], np.array([i + 1]))
    p, s, t = (cache._decode_session.work for cache, _ in pairs)
    assert len(started) == 1 and p.handed_to is None and p.control[1] == 0
    assert s.control[2] == 0 and t.control[2] == 0 and s.handed_to is None and t.handed_to is None
    step_both(fast, slow, *pairs[2], np.array([4]))                     # t: p's helper goes to it, no new thread
    assert len(started) == 1 and p.handed_to is t and t.control[2] == 1
    step_both(fast, slow, *pairs[1], np.array([5]))                     # s: t's promise handed on to s
    assert len(started) == 1 and t.handed_to is s and s.control[2] == 1
    decode._helper_thread(p)       # the helper's walk: p sent home, t sent home, s served until idle
    assert [w.control[2] for w in (p, s, t)] == [0, 0, 0] and not {p, s, t} & set(decode._helped)


def test_a_step_refused_for_another_models_cache_leaves_the_cache_its_session(monkeypatch):
    """The refused step closed the cache's session before making the new one failed: the closed session stayed on
    the cache and was used again, its helper told to stop at every step (a thread started per step)."""
    started = threads_started_but_never_run(monkeypatch)
    fast, slow = twin_models(seed=9)
    other, _ = twin_models(dtype="float32", seed=9)
    cache_f, cache_s = fast.allocate_cache(1), slow.allocate_cache(1)
    step_both(fast, slow, cache_f, cache_s, np.array([1]))
    session = cache_f._decode_session
    with pytest.raises(ValueError, match="dtype"):
        other.step(np.array([2]), cache_f)
    step_both(fast, slow, cache_f, cache_s, np.array([3]))
    assert cache_f._decode_session is session and session.control[1] == 0 and len(started) == 1
    decode._Session.__new__(decode._Session).close()                    # __init__ never ran: no error either
