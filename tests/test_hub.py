"""Hugging Face hub ids as --draft / --target: read from the hub's cache, downloaded when the machine is
online, and a clear error when neither works. Nothing here reaches the network: the cache is a real one
written under tmp_path, and "online" points the hub client at a closed loopback port."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import tiny_model
from csd.runtime.models import load_pair
from csd.runtime.pair import ModelLoadError


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, qwen_tokenizer):
    """A hub cache holding org/tiny-draft and org/tiny-target (the layout huggingface_hub writes:
    models--org--name/refs/main names a snapshot directory)."""
    import huggingface_hub.constants as c
    cache = tmp_path / "hub"
    for seed, name in ((1, "tiny-draft"), (2, "tiny-target")):
        repo = cache / f"models--org--{name}"
        snap = repo / "snapshots" / ("0" * 39 + str(seed))
        tiny_model(seed, vocab=len(qwen_tokenizer)).save_pretrained(snap)
        qwen_tokenizer.save_pretrained(snap)
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 39 + str(seed))
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    return cache


def test_a_hub_id_in_the_cache_loads_offline(hub_cache):
    pair = load_pair("org/tiny-draft", "org/tiny-target", dtype="float32", draft_weights="float32")
    assert pair.describe()["target"] == "org/tiny-target" and pair.describe()["draft"] == "org/tiny-draft"
    assert pair.target.device.type == "cpu"


def test_online_a_failed_download_names_the_hub_and_the_reason(hub_cache, monkeypatch):
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(c, "ENDPOINT", "http://127.0.0.1:9")          # nothing listens there
    with pytest.raises(ModelLoadError, match="'org/not-cached': not a local directory, not in the hub cache, "
                                             "and the download failed"):
        load_pair("org/tiny-draft", "org/not-cached", dtype="float32", draft_weights="float32")


def test_the_command_line_no_longer_forces_offline_mode():
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out = subprocess.run([sys.executable, "-c", "import os, cli; print(os.environ.get('HF_HUB_OFFLINE'))"],
                         capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "None"          # a user with a network can download a hub id
