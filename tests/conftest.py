"""Shared fixtures: the real embedded pair (float32, loaded once per session) and tiny
randomly initialised Qwen2 models built in-process for fast, deterministic unit tests."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:     # the store tests' databases; a bare GPU image has torch and transformers only (bench/gpu.sh)
    from store_fixtures import db_url, pg_base_url, store  # noqa: E402,F401
except ImportError:
    if os.environ.get("CI"):
        raise


@pytest.fixture(scope="session")
def real_pair():
    """The embedded Qwen2.5-Coder 0.5B/1.5B pair in float32 (the exact reference dtype)."""
    from csd.runtime.models import load_pair
    return load_pair(dtype="float32")


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from transformers import AutoTokenizer

    from csd.runtime.embedded import prepare_embedded
    return AutoTokenizer.from_pretrained(prepare_embedded("draft"))


def tiny_model(seed: int, vocab: int = 32, hidden: int = 32, layers: int = 2):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # sharpen the output layer so the distributions are far from uniform
        m.lm_head.weight.mul_(40.0)
    return m


@pytest.fixture(scope="session")
def tiny_pair(qwen_tokenizer):
    """Two different tiny random models sharing a small vocabulary (ids < 32) and the Qwen tokenizer
    for display text. They disagree often, which exercises rejections and cache rollback."""
    import torch

    from csd.runtime.pair import ModelPair
    return ModelPair(draft=tiny_model(1), target=tiny_model(2), tokenizer=qwen_tokenizer,
                     pair_id="tiny-draft->tiny-target",
                     draft_name="tiny-draft", target_name="tiny-target", device=torch.device("cpu"),
                     dtype=torch.float32, eos_ids=(), context_limit=256)


def perturbed(model, scale: float, seed: int = 0):
    """A copy of ``model`` with Gaussian noise of relative size ``scale`` on every weight: a draft
    that agrees with its target most of the time."""
    import copy

    import torch
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(1e-3))
    return m


def make_pair(tokenizer, target, draft, eos=(), draft_lm=None, special=None, pair_id="tiny-copy"):
    """A ModelPair of in-process models (float32, CPU)."""
    import torch

    from csd.runtime.pair import ModelPair
    return ModelPair(draft=draft, target=target, tokenizer=tokenizer, pair_id=pair_id, draft_name="draft",
                     target_name="target", device=torch.device("cpu"), dtype=torch.float32, eos_ids=tuple(eos),
                     context_limit=256, draft_lm=draft_lm,
                     special_ids=frozenset(special if special is not None else eos))


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread (no OpenMP spin on a busy 2-core machine)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_collection_modifyitems(config, items):
    """Every test that loads the real 1.5B pair is slow (the quick loop is ``-m "not slow"``)."""
    for item in items:
        if "real_pair" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def no_models(monkeypatch):
    """Loading a model or opening the store fails the test: bad input must be refused before either."""
    import csd.cli.bench
    import csd.cli.engine

    def refuse(*a, **k):
        raise AssertionError("a model or the store was reached")
    for module in (csd.cli.engine, csd.cli.bench):
        monkeypatch.setattr(module, "load_from_args", refuse)
        monkeypatch.setattr(module, "open_store", refuse)


def tiny_bench_pair(tokenizer):
    """The benchmark's tiny pair: a tiny float32 target, its perturbed copy as the draft, prompts encoded
    into the 32 token ids the tiny models know, EOS 7."""
    from csd.runtime.pair import ModelPair

    class TinyPair(ModelPair):
        def encode_prompt(self, prompt, chat=True):
            return [ord(c) % 32 for c in prompt] or [1]

    target = tiny_model(2)
    return TinyPair(**vars(make_pair(tokenizer, target, perturbed(target, 0.05), eos=(7,))))
