"""``--engine auto`` never fails where eager works: when the static engine (its choice on CUDA) fails to
capture or its first replay computes something else, the pair loads on the eager engine with a warning
naming the error and ``--engine eager``; an engine the user chose says why it failed instead. Tested on
the CPU by making auto choose static here and injecting the failures."""
from __future__ import annotations

import logging

import pytest
import torch

from conftest import tiny_model
from csd.runtime import models
from csd.runtime.models import load_pair
from csd.runtime.pair import ModelLoadError


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, qwen_tokenizer):
    root = tmp_path_factory.mktemp("tiny-engine")
    out = []
    for seed, name in ((1, "draft"), (2, "target")):
        tiny_model(seed).save_pretrained(root / name)
        qwen_tokenizer.save_pretrained(root / name)
        out.append(str(root / name))
    return out


@pytest.fixture
def auto_is_static(monkeypatch):
    monkeypatch.setattr(models, "auto_engine", lambda dev, device_map=None: "static")


def load(dirs, engine="auto"):
    return load_pair(*dirs, dtype="float32", draft_weights="float32", engine=engine, static_capacity=128)


def test_auto_runs_the_static_engine_where_it_works(dirs, auto_is_static, one_thread):
    assert load(dirs).describe()["engine"] == "static"


def test_a_failed_capture_falls_back_to_eager_with_a_warning(dirs, auto_is_static, monkeypatch, caplog, one_thread):
    def broken(*_a, **_k):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
    monkeypatch.setattr(models, "make_static", broken)
    with caplog.at_level(logging.WARNING, logger="csd.runtime.models"):
        pair = load(dirs)
    assert pair.describe()["engine"] == "eager" and pair.target_lm.impl == "lean"
    assert "operation not permitted when stream is capturing" in caplog.text and "--engine eager" in caplog.text
    with pytest.raises(ModelLoadError, match=r"static engine failed on cpu .*not permitted.*use --engine eager"):
        load(dirs, engine="static")                 # chosen, not auto: refused with the reason


def test_a_replay_that_computes_something_else_falls_back(dirs, auto_is_static, monkeypatch, caplog, one_thread):
    from csd.runtime.static import StaticLM
    real = StaticLM.forward

    def wrong(self, cache, ids, keep):
        return real(self, cache, ids, keep) + 100.0     # a graph that replays garbage
    monkeypatch.setattr(StaticLM, "forward", wrong)
    with caplog.at_level(logging.WARNING, logger="csd.runtime.models"):
        pair = load(dirs)
    assert pair.describe()["engine"] == "eager"
    assert "first pass differs from the eager engine's" in caplog.text


def test_out_of_memory_while_capturing_falls_back_too(dirs, auto_is_static, monkeypatch, caplog, one_thread):
    def oom(*_a, **_k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(models, "make_static", oom)
    with caplog.at_level(logging.WARNING, logger="csd.runtime.models"):
        assert load(dirs).describe()["engine"] == "eager"
    assert "OutOfMemoryError" in caplog.text
