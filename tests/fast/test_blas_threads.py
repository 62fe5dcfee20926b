"""tinygrad_ssm/fast/blas_threads.py: BLAS on one thread inside `single_threaded_blas()`, whatever was imported
first, and the thread counts restored afterwards, also when calls from several threads overlap; importing the
package leaves BLAS and the environment alone (what that buys a step is measured by
benchmarks/bench_import_order.py, not asserted here)."""
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import textwrap

import pytest

from threadpoolctl import ThreadpoolController, threadpool_info

from tinygrad_ssm.fast.blas_threads import single_threaded_blas


def blas_threads() -> set:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def set_blas_threads(n: int):
    for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
        lib.set_num_threads(n)


def test_one_thread_inside_and_the_count_restored_after():
    set_blas_threads(2)
    with single_threaded_blas():
        assert blas_threads() == {1}
        with single_threaded_blas():                                     # nested: still one, restored once
            assert blas_threads() == {1}
        assert blas_threads() == {1}
    assert blas_threads() == {2}


def test_a_thread_that_enters_meanwhile_runs_under_the_limit_and_changes_nothing():
    """The first thread in owns the limit: another thread's call while it holds it neither sets nor restores,
    and the count comes back when the owner leaves, whichever leaves last."""
    set_blas_threads(2)
    entered, left, seen = threading.Event(), threading.Event(), []

    def other():
        entered.wait(10)
        with single_threaded_blas():
            seen.append(blas_threads())
        left.set()
    thread = threading.Thread(target=other)
    thread.start()
    with single_threaded_blas():
        entered.set()
        left.wait(10)
        seen.append(blas_threads())                                      # the other thread has left: still one
    thread.join()
    assert seen == [{1}, {1}] and blas_threads() == {2}
    # the owner leaves first: the count comes back then, and the other thread's leaving changes nothing
    entered, owner_left, seen = threading.Event(), threading.Event(), []

    def late():
        with single_threaded_blas():
            entered.set()
            owner_left.wait(10)
            seen.append(blas_threads())
    thread = threading.Thread(target=late)
    with single_threaded_blas():
        thread.start()
        entered.wait(10)
    owner_left.set()
    thread.join()
    assert seen == [{2}] and blas_threads() == {2}


PROBE = textwrap.dedent("""
    import json, os, sys
    {first}
    from threadpoolctl import threadpool_info, threadpool_limits
    env_before = dict(os.environ)
    import tinygrad_ssm as tg, tinygrad_ssm.models, tinygrad_ssm.nn
    import numpy as np
    info = lambda: sorted(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")
    after_import = info()
    from tinygrad_ssm.fast import products
    seen = []
    original = products.np.matmul
    def spying_matmul(*args, **kwargs):
        seen.append(info())
        return original(*args, **kwargs)
    with threadpool_limits(2, user_api="blas"):
        products.np.matmul = spying_matmul
        a, b = np.ones((512, 256)), np.ones((256, 512))
        products.rows_product(a, b)
        products.np.matmul = original
        restored = info()
    print(json.dumps(dict(env_changed=sorted(set(os.environ.items()) ^ set(env_before.items())),
                          after_import=after_import, inside=seen, restored=restored)))
""")


def _probe(first: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_whatever_the_import_order_a_product_runs_blas_on_one_thread_and_the_import_changes_nothing():
    torch = ["import torch"] if importlib.util.find_spec("torch") is not None else []   # the bench extra
    for first in ["", "import numpy", "import scipy.linalg", *torch]:
        result = _probe(first)
        assert result["env_changed"] == [], (first, result)
        assert result["inside"] and all(set(threads) == {1} for threads in result["inside"]), (first, result)
        assert set(result["restored"]) == {2}, (first, result)


def test_importing_the_scan_and_building_a_model_leave_the_environment_alone():
    """threadpoolctl's import sets KMP_DUPLICATE_LIB_OK in os.environ: `from tinygrad_ssm import ssd` imported it
    (through the CPU scan), before any fast path had run; now the first BLAS limit does, as the README says."""
    probe = textwrap.dedent("""
        import json, os
        import numpy as np
        before = dict(os.environ)
        import tinygrad_ssm as tg
        from tinygrad_ssm import ssd
        model = tg.Mamba2LMHeadModel(tg.Mamba2Config(d_model=32, n_layer=1, vocab_size=50, d_state=8, headdim=16))
        changed = sorted(set(os.environ.items()) ^ set(before.items()))
        from tinygrad_ssm.fast import products
        products.rows_product(np.ones((512, 256)), np.ones((256, 512)))
        print(json.dumps(dict(changed=changed, after_a_product=os.environ.get("KMP_DUPLICATE_LIB_OK"))))
    """)
    env = {k: v for k, v in os.environ.items() if k != "KMP_DUPLICATE_LIB_OK"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.splitlines()[-1])
    assert result == {"changed": [], "after_a_product": "True"}


@contextlib.contextmanager
def another_thread_inside_the_limit():
    """Inside the `with`, a thread of this process holds single_threaded_blas (a training thread, say)."""
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with single_threaded_blas():
            inside.set()
            leave.wait(30)
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(30)
        yield
    finally:
        leave.set()
        holder.join()


def test_a_child_forked_while_another_thread_holds_the_limit_can_take_it():
    """fork() while a thread of the parent was inside single_threaded_blas (a training thread, children made with
    multiprocessing's fork): the child inherited the held lock and no thread to release it, and its first fused
    product waited for ever (found by an audit: 3-4 of 30 children hung)."""
    from tinygrad_ssm.fast import blas_threads
    with single_threaded_blas():                                         # the fork hook is registered by first use
        pass
    with another_thread_inside_the_limit():
        with blas_threads._lock:                                         # at fork the lock is held, as at any moment
            pid = os.fork()                                              # of a parent's step might find it
            if pid == 0:                                                 # the child: take the limit, then leave
                done = threading.Event()
                threading.Thread(target=lambda: (single_threaded_blas().__enter__(), done.set()), daemon=True).start()
                os._exit(0 if done.wait(10) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0                    # 1: the child waited on the dead lock


def test_a_child_forked_while_another_thread_holds_the_limit_gets_its_blas_threads_back():
    """The child kept BLAS on one thread for good: the thread that would have restored the count is not in it."""
    before = blas_threads()
    if not before or max(before) == 1:
        pytest.skip("BLAS runs one thread here already: a limit of one changes nothing to see")
    with another_thread_inside_the_limit():
        assert max(blas_threads()) == 1
        pid = os.fork()
        if pid == 0:
            os._exit(0 if blas_threads() == before else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0                    # 1: the child's BLAS kept one thread
    assert blas_threads() == before                                      # the parent's put back as before


def test_a_thread_takes_the_limit_after_the_main_thread_has_had_it():
    """threadpoolctl lets the first thread that set OpenBLAS's count be the only one to set it while it lives: after
    one fused product on the main thread, the limit taken by any other thread changed nothing."""
    before = blas_threads()
    if not before or max(before) == 1:
        pytest.skip("BLAS runs one thread here already: a limit of one changes nothing to see")
    with single_threaded_blas():
        assert max(blas_threads()) == 1
    seen = []

    def limited():
        with single_threaded_blas():
            seen.append(blas_threads())
    thread = threading.Thread(target=limited)
    thread.start()
    thread.join()
    assert seen == [{1}] and blas_threads() == before

