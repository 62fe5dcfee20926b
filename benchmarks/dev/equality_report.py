"""Float64 max differences between the scan's equivalent forms (the numbers behind tests/scan/test_ssd.py and
tests/models/test_mamba2.py, which assert each is below 1e-10): chunked vs sequential vs a plain NumPy loop, and the
LM's full forward vs prefill-then-step and vs a two-segment prefill, for l in {1, q-1, q, q+1, 3q+5}, g = 1 and
g = 2, with and without an initial state.

    python benchmarks/dev/equality_report.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: reuse the tests' inputs and oracle

import numpy as np
import tinygrad_ssm as tg
from tests.scan.test_ssd import numpy_scan, make_inputs, LENGTHS, Q
from tests.support.models import small_model as tiny_model
from tinygrad_ssm.scan import ssd
worst = {}
def note(k, v): worst[k] = max(worst.get(k, 0), v)
for l in LENGTHS:
    for g in (1, 2):
        for st in (False, True):
            inp = make_inputs(np.random.default_rng(l * 10 + g), l=l, g=g, initial_state=st)
            yn, sn = numpy_scan(**inp)
            yr, sr = ssd(**inp, chunk_size=Q, backend="reference"); ys, ss = ssd(**inp, backend="scan")
            note("ssd chunked vs numpy loop (y, state)", max(np.abs(yr.data-yn).max(), np.abs(sr.data-sn).max()))
            note("ssd scan vs numpy loop (y, state)", max(np.abs(ys.data-yn).max(), np.abs(ss.data-sn).max()))
            note("ssd chunked vs scan", max(np.abs(yr.data-ys.data).max(), np.abs(sr.data-ss.data).max()))
for g, extra in ((1, {}), (2, dict(dt_limit=(0.01, 0.5), bias=True))):
    for l in LENGTHS:
        m = tiny_model(seed=l, ngroups=g, **extra); ids = np.random.default_rng(l).integers(0, 50, (2, l))
        full = m(ids).data
        m.backend = "scan"; note("LM logits chunked vs scan", np.abs(m(ids).data - full).max()); m.backend = "auto"
        split = l // 2 + 1 if l > 1 else 1
        cache = m.allocate_cache(2)
        with tg.no_grad(): pieces = [m(ids[:, :split], cache).data]
        for t in range(split, l): pieces.append(m.step(ids[:, t], cache).data[:, None])
        note("LM logits chunked vs prefill-then-step", np.abs(np.concatenate(pieces, 1) - full).max())
        cache = m.allocate_cache(2)
        with tg.no_grad():
            pieces = [m(ids[:, :split], cache).data] + ([m(ids[:, split:], cache).data] if split < l else [])
        note("LM logits chunked vs two-segment prefill (initial state)", np.abs(np.concatenate(pieces, 1) - full).max())
for k, v in worst.items(): print(f"{v:.3e}  {k}")
