"""The cost profile's cache on tiny in-process models: measured once, read back, and measured
again when the engine's code changes (a faster draft must not be planned with its old cost)."""
from __future__ import annotations

import json

import pytest

from conftest import make_pair, tiny_model
from csd import profile


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


def test_target_representation_is_chosen_by_timing_the_path_it_will_run(cache, one_thread):
    """``auto``'s choice: every candidate timed (int8 on the lean path where load_pair will run it
    there), the most exact one within ``TIE`` of the fastest 7-token pass, cached per int8 path."""
    import torch

    model = tiny_model(2, vocab=1200)
    choice, timings = profile.choose_target_repr(model, "tiny-repr", torch.device("cpu"), int8_lean=True)
    assert set(timings) == set(profile.candidate_reprs(torch.device("cpu")))
    assert all(t["1"] > 0 and t["7"] > 0 for t in timings.values())
    fastest = min(t["7"] for t in timings.values())
    assert timings[choice]["7"] <= fastest * (1 + profile.TIE)
    assert not any(timings[r]["7"] <= fastest * (1 + profile.TIE)
                   for r in profile.EXACTNESS[:profile.EXACTNESS.index(choice)] if r in timings)
    files = list(cache.glob("repr-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"]["int8_impl"] == "lean"
    assert profile.choose_target_repr(model, "tiny-repr", torch.device("cpu"), int8_lean=True) == (choice, timings)
    profile.choose_target_repr(model, "tiny-repr", torch.device("cpu"))          # transformers' int8: another entry
    assert len(list(cache.glob("repr-*.json"))) == 2
    assert next(model.parameters()).dtype == torch.float32      # the candidates are copies


def test_with_a_loader_one_candidate_is_in_memory_at_a_time(cache, one_thread):
    """``load_pair`` hands the choice a loader, not the model: each candidate is loaded afresh and
    dropped before the next, so the first start never holds the float32 model beside a copy (it
    peaked at 17.5 GB that way on the embedded pair)."""
    import gc
    import weakref

    import torch

    made = []

    def load():
        gc.collect()
        assert all(r() is None for r in made), "the previous candidate is still in memory"
        m = tiny_model(3, vocab=1200)
        made.append(weakref.ref(m))
        return m

    choice, timings = profile.choose_target_repr(load, "tiny-loader", torch.device("cpu"), int8_lean=True)
    assert len(made) == len(profile.candidate_reprs(torch.device("cpu"))) == len(timings)
    assert choice in timings
