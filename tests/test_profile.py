"""The cost profile's cache on tiny in-process models: measured once, read back, and measured
again when the engine's code changes (a faster draft must not be planned with its old cost)."""
from __future__ import annotations

import json

import pytest

from conftest import make_pair, tiny_model
from csd.runtime import profile


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path))
    return tmp_path / "profiles"


@pytest.fixture(scope="module")
def tiny_pair(qwen_tokenizer):
    """The profile times passes on token ids 100-1099, so these tiny models have a vocabulary of 1,200."""
    return make_pair(qwen_tokenizer, tiny_model(2, vocab=1200), tiny_model(1, vocab=1200), pair_id="tiny-profile")


def test_profile_is_cached_per_engine_revision(tiny_pair, cache, monkeypatch, one_thread):
    assert not profile.costs_cached(tiny_pair)
    first = profile.cached_costs(tiny_pair)
    files = list(cache.glob("costs-*.json"))
    assert len(files) == 1 and profile.costs_cached(tiny_pair)
    stored = json.loads(files[0].read_text())
    assert stored["key"]["engine"] == profile.engine_revision() and len(profile.engine_revision()) == 12
    assert set(first.verify_ms) == set(profile.PASS_LENGTHS) and first.draft_ms > 0
    # a second call reads the file: the same figures, not a new measurement
    again = profile.cached_costs(tiny_pair)
    assert again.verify_ms == first.verify_ms and again.measured_at == first.measured_at

    # the engine's code changed: the cached profile no longer answers, a new one is measured beside it
    monkeypatch.setattr(profile, "engine_revision", lambda: "0123456789ab")
    assert not profile.costs_cached(tiny_pair)
    profile.cached_costs(tiny_pair)
    keys = sorted(json.loads(f.read_text())["key"]["engine"] for f in cache.glob("costs-*.json"))
    assert keys == sorted(["0123456789ab", stored["key"]["engine"]])


def test_engine_revision_follows_the_engine_files(tmp_path, monkeypatch):
    """The digest is over the bytes of the files that make the forward passes."""
    for name in profile.ENGINE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)     # kernels/kquant.c sits in a folder
        (tmp_path / name).write_text(f"# {name}\n")
    monkeypatch.setattr(profile, "__file__", str(tmp_path / "profile.py"))
    profile.engine_revision.cache_clear()
    try:
        before = profile.engine_revision()
        profile.engine_revision.cache_clear()
        (tmp_path / profile.ENGINE_FILES[0]).write_text("# a faster forward\n")
        assert profile.engine_revision() != before
    finally:
        profile.engine_revision.cache_clear()


def test_auto_is_int8_on_the_cpu_without_timing_candidates(tmp_path, qwen_tokenizer, monkeypatch, one_thread):
    """``--dtype auto`` on the CPU is int8 until ``python -m csd prepare`` has timed the GGUF blocks against it
    (``choose_target_dtype``): loading a pair loads or times no candidate, and caches nothing about it."""
    from csd.runtime.models import load_pair
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "tiny"
    tiny_model(2).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    pair = load_pair(str(d), str(d))
    assert pair.rep.target == "int8" and pair.rep.draft == "int8" and pair.target_lm.impl == "lean"
    assert not (tmp_path / "cache" / "profiles").exists()


def test_a_second_draft_beside_the_same_target_takes_its_passes_and_times_its_own_step(tiny_pair, qwen_tokenizer,
                                                                                      cache, monkeypatch, one_thread):
    first = profile.cached_costs(tiny_pair)
    other = make_pair(qwen_tokenizer, tiny_pair.target, tiny_model(2, vocab=1200), pair_id="tiny-profile-2")
    timed = []
    real = profile.time_shapes
    monkeypatch.setattr(profile, "time_shapes", lambda shapes, *a, **k: timed.extend(lm for lm, _ in shapes)
                        or real(shapes, *a, **k))
    second = profile.cached_costs(other, target_of=first)
    assert other.target_lm not in timed and other.draft_lm in timed     # the draft's step timed, not the target
    assert second.verify_ms == first.verify_ms
    assert second.draft_ms > 0 and len(list(cache.glob("costs-*.json"))) == 2


def test_the_passes_of_a_profile_take_turns(tiny_pair, one_thread):
    """A slow spell of the host must fall on every shape alike, not on one: the shapes are timed in rounds, each
    round one pass of each (the target at every length, then the draft), and the first round is not counted."""
    calls = []
    target, draft = tiny_pair.target_lm, tiny_pair.draft_lm
    for name, lm in (("target", target), ("draft", draft)):
        real = lm.forward
        lm.forward = lambda cache, ids, n, real=real, name=name: calls.append((name, len(ids))) or real(cache, ids, n)
    try:
        ms = profile.time_shapes([(target, 1), (target, 3), (draft, 1)], reps=2, context=20)
    finally:
        del target.forward, draft.forward
    assert calls == [("target", 20), ("draft", 20)] + [("target", 1), ("target", 3), ("draft", 1)] * 3
    assert len(ms) == 3 and all(m > 0 for m in ms)
