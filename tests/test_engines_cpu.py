"""tools.engines_cpu on a tiny model: the eager and static engines timed side by side, interleaved, on
the same weights, computing the same logits (the compiled engine is left to the benchmark: compiling
takes most of a minute)."""
from __future__ import annotations

import pytest

from conftest import tiny_model
from csd.lm import LeanLM
from csd.static import StaticLM
from tools.engines_cpu import build, time_engines


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def test_eager_and_static_are_timed_side_by_side_on_the_same_weights():
    lean = LeanLM(tiny_model(2))
    lms = {e: build(lean, e, 256) for e in ("eager", "static")}
    assert lms["eager"] is lean and isinstance(lms["static"], StaticLM) and lms["static"].lean is lean
    r = time_engines(lms, (1, 7), [1, 2, 3, 4, 5], rounds=2)
    for e in lms:
        for t in ("1", "7"):
            s = r[e][t]
            assert s["n"] == 6 and 0 < s["min_ms"] <= s["median_ms"] <= s["max_ms"]
    assert r["same_argmax_as_eager"] == {"eager": True, "static": True}
    assert r["max_abs_diff_vs_eager"]["eager"] == {"1": 0.0, "7": 0.0}
    assert max(r["max_abs_diff_vs_eager"]["static"].values()) < 1e-4
    assert lms["static"].length(lms["static"].new_cache()) == 0
