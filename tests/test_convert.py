"""Convert once, then map (``csd.runtime.convert``): the int8 model mapped from the cache computes what the
whole-model path computes (the same int8 rows, scales and smoothing), a cache that does not fit is
rebuilt with a message, a failed conversion leaves nothing a later start would read, and two
converters at once write one cache. Tiny in-process models; the GGUF reader on the real draft file."""
from __future__ import annotations

import copy
import logging
import threading

import pytest
import torch

from conftest import tiny_model
from csd.runtime import convert
from csd.runtime.convert import CacheError, ModuleSource, activation_maxima, cached_lean, check
from csd.runtime.lm import LeanLM
from csd.runtime.quant import quantize_int8, to_repr

PROMPTS = [[3, 7, 1, 4, 9, 2], [5, 5, 8, 1, 0, 30, 12, 6, 2]]


def key(**k):
    return {"format": convert.FORMAT, "source": "tiny", **k}


def build(model, path, k, prompts=PROMPTS, vocab_ids=None, rows=True):
    from contextlib import nullcontext
    return cached_lean(path, k, lambda: nullcontext(ModuleSource(model)), model.config, rows=rows, name="tiny",
                       smooth_prompts=prompts, vocab_ids=vocab_ids)


def logits(lm, ids=(3, 7, 1, 4, 9, 2, 11, 6)):
    cache = lm.new_cache()
    first = lm.forward(cache, list(ids[:5]), 5)
    return torch.cat([first, lm.forward(cache, list(ids[5:]), len(ids) - 5)])


def test_the_mapped_target_is_the_whole_model_int8_target_bit_for_bit(tmp_path, one_thread):
    model = tiny_model(2)
    mapped = build(model, tmp_path / "t", key(role="target"))
    maxima = activation_maxima(ModuleSource(model), model.config, PROMPTS)
    ref = LeanLM(to_repr(copy.deepcopy(model), "int8", maxima=maxima))    # the path load_pair took before
    ref.int8_per_row()
    mapped.int8_per_row()
    assert torch.equal(logits(mapped), logits(ref))                      # exact int8: the same bits
    ref.int8_rows(False)
    mapped.int8_rows(False)
    assert torch.allclose(logits(mapped), logits(ref), atol=1e-4)        # per pass: the bias added after the product
    assert not torch.equal(logits(mapped), logits(LeanLM(quantize_int8(copy.deepcopy(model)))))   # smoothing applied


def test_the_mapped_draft_keeps_its_reduced_vocabulary(tmp_path, one_thread):
    model = tiny_model(1)
    vocab = torch.tensor([0, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31])
    mapped = build(model, tmp_path / "d", key(role="draft"), prompts=None, vocab_ids=vocab, rows=False)
    ref = LeanLM(model, vocab_ids=vocab, int8=True)
    assert torch.equal(mapped.vocab_ids, vocab) and mapped.vocab_size == 12
    assert torch.equal(logits(mapped), logits(ref))


def test_smoothing_maxima_measured_a_layer_at_a_time_match_the_model(one_thread):
    """The streamed measurement runs the float layers one by one: its maxima are those of the whole float
    model's inputs to each projection (hooks on transformers' own forward)."""
    model = tiny_model(4)
    found = {}

    def hook(name):
        def record(_m, inp):
            x = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0)
            found[name] = torch.maximum(found[name], x) if name in found else x
        return record
    hs = [mod.register_forward_pre_hook(hook(f"{i}.{n}")) for i, layer in enumerate(model.model.layers)
          for n, mod in (("qkv", layer.self_attn.q_proj), ("o", layer.self_attn.o_proj),
                         ("gu", layer.mlp.gate_proj), ("down", layer.mlp.down_proj))]
    with torch.no_grad():
        for ids in PROMPTS:
            model(torch.tensor([ids]))
    for h in hs:
        h.remove()
    streamed = activation_maxima(ModuleSource(model), model.config, PROMPTS)
    assert streamed.keys() == found.keys()
    for k in found:
        assert torch.allclose(streamed[k], found[k], rtol=1e-4, atol=1e-6), k


def test_a_cache_that_does_not_fit_is_rebuilt_with_a_message(tmp_path, caplog, one_thread):
    model = tiny_model(2)
    path = tmp_path / "t"
    first = logits(build(model, path, key(role="target")))
    made = (path / "manifest.json").stat().st_mtime_ns
    build(model, path, key(role="target"))                   # fits: mapped, not converted again
    assert (path / "manifest.json").stat().st_mtime_ns == made
    layer = path / "layer-001.safetensors"
    layer.write_bytes(layer.read_bytes()[:-100])             # truncated
    with pytest.raises(CacheError, match="truncated"):
        check(path, key(role="target"))
    with caplog.at_level(logging.WARNING, logger="csd.runtime.convert"):
        again = build(model, path, key(role="target"))
    assert "truncated" in caplog.text and "converting it again" in caplog.text
    assert torch.equal(logits(again), first)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="csd.runtime.convert"):
        build(model, path, {**key(role="target"), "format": convert.FORMAT + 1})     # another version of the code
    assert "made for another format" in caplog.text
    with pytest.raises(CacheError, match="another smoothing"):
        check(path, {**key(role="target"), "format": convert.FORMAT + 1, "smoothing": "other"})


def test_a_failed_conversion_leaves_nothing_to_read(tmp_path, monkeypatch, one_thread):
    from csd.runtime.pair import ModelLoadError
    model = tiny_model(2)
    path = tmp_path / "t"
    real = convert._convert_layer
    calls = []

    def full_disk(w, *how):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(w)
    monkeypatch.setattr(convert, "_convert_layer", full_disk)
    with pytest.raises(ModelLoadError, match="No space left on device.*nothing half-written"):
        build(model, path, key(role="target"))
    assert not path.exists() and not list(tmp_path.glob("t.tmp-*"))
    monkeypatch.setattr(convert, "_convert_layer", real)
    assert build(model, path, key(role="target")).n_layers == 2


def test_two_converters_at_once_write_one_cache(tmp_path, monkeypatch, one_thread):
    model = tiny_model(2)
    path = tmp_path / "t"
    conversions = []
    real = convert.convert
    monkeypatch.setattr(convert, "convert", lambda *a, **k: conversions.append(1) or real(*a, **k))
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, logits(build(model, path, key(role="target")))))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conversions) == 1 and torch.equal(out[0], out[1])


@pytest.mark.slow
def test_gguf_tensors_are_what_transformers_reads_from_the_file():
    """The shipped draft's GGUF tensors, under transformers' names, dequantised: bit for bit the weights
    of the transformers model loaded from the same file."""
    from csd.runtime.embedded import assembled, float_model
    model = float_model("draft", torch.float32)
    state = model.state_dict()
    with assembled("draft") as path:
        src = convert.GGUFSource(path)
        assert set(src.names) == set(state)              # the draft's file holds its output layer too
        for name in src.names:
            assert torch.equal(src.tensor(name), state[name]), name
        rows, qtype = src.quantised_rows("model.embed_tokens.weight")
        emb = convert.QuantisedRows(torch.from_numpy(rows), qtype, model.config.hidden_size)
        ids = torch.tensor([0, 17, 151643, 9])
        assert torch.equal(emb[ids], state["model.embed_tokens.weight"][ids])


@pytest.mark.slow
def test_the_gguf_tokenizer_built_from_its_class_is_transformers_own(tmp_path, monkeypatch):
    """``gguf_tokenizer`` names the model type, so that AutoTokenizer does not read the whole file with the gguf
    package's reader to learn it (that reader refuses here): the files it saves are byte for byte those of
    transformers' own route, on the shipped draft's file."""
    import gguf
    from transformers import AutoTokenizer

    from csd.runtime.embedded import assembled, gguf_tokenizer
    with assembled("draft") as path:
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp_path / "searched")

        def refuse(*a, **k):
            raise AssertionError("the whole file was read to learn its model type")
        monkeypatch.setattr(gguf, "GGUFReader", refuse)
        gguf_tokenizer(path, "qwen2").save_pretrained(tmp_path / "direct")
    names = sorted(p.name for p in (tmp_path / "searched").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "direct").iterdir()) and "tokenizer.json" in names
    for name in names:
        assert (tmp_path / "direct" / name).read_bytes() == (tmp_path / "searched" / name).read_bytes(), name


@pytest.mark.slow
def test_a_cache_of_an_earlier_version_is_emptied_and_leftovers_go(tmp_path, monkeypatch):
    """The first start of this version deletes what no path reads any more (the float32 weights of the
    earlier version, its maxima and representation choices) and the GGUF copy a killed process left."""
    from csd.runtime.embedded import MARKER, model_dir, prepare_embedded
    from csd.runtime.pair import EMBEDDED
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path))
    d = model_dir("draft")
    d.mkdir(parents=True)
    for name in ("model.safetensors", "csd-converted.json"):
        (d / name).write_bytes(b"old")
    (tmp_path / "smoothing").mkdir()
    (tmp_path / "smoothing" / "x.pt").write_bytes(b"old")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "repr-1.json").write_text("{}")
    (tmp_path / "profiles" / "costs-1.json").write_text("{}")
    stale = d.parent / f".{EMBEDDED['draft'].name}.gguf-999999999-abc"      # no such process
    stale.mkdir()
    assert prepare_embedded("draft") == d
    assert sorted(p.name for p in d.iterdir()) == sorted(
        ["chat_template.jinja", "config.json", "generation_config.json", MARKER, "tokenizer.json",
         "tokenizer_config.json"])
    assert not (tmp_path / "smoothing").exists() and not stale.exists()
    assert [p.name for p in (tmp_path / "profiles").iterdir()] == ["costs-1.json"]


@pytest.mark.slow
def test_the_mapped_embedded_pair_holds_only_what_runs_and_sd_writes_ar_exactly(one_thread):
    """The embedded pair as the app loads it (the target prepare chose: its GGUF blocks or int8 with activations per
    token, both exact rows): no transformers model is held, and greedy SD writes AR's answer token for token."""
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from csd.memory import CorrectionMemory
    from csd.runtime.models import load_pair
    pair = load_pair(activations="row")
    assert pair.target is None and pair.draft is None and pair.target_lm.per_row
    for prompt in ("Write a Python function that reverses a string.", "What is 17 * 23? Answer briefly."):
        ids = pair.encode_prompt(prompt)
        out = {}
        for method in ("ar", "sd"):
            run = Decoder(pair).run(ids, CSDConfig(method=method, gamma=4, lookup=0, max_new_tokens=40),
                                    CorrectionMemory(pair.pair_id))
            list(run)
            out[method] = run.token_ids
        assert out["sd"] == out["ar"]
        assert len(out["ar"]) >= 3          # an answer ("391" and the end of the turn is 4 tokens), not an empty turn
    assert pair.target is None            # nothing above built the transformers model
