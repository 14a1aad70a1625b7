"""HFLM.crop on transformers' DynamicCache: written out in our own code (``csd.runtime.lm.crop_dynamic_cache``)
rather than through ``DynamicCache.crop``, whose argument changed meaning across releases (5.24:
tokens to drop, negated; before: the length to keep, so that ``crop(-0)`` emptied the cache). A crop
to the current length removes nothing, and a crop removes exactly the tokens after the kept length,
so that feeding them again gives the logits of a cache that never held them. Tiny models; fast."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from csd.runtime.lm import HFLM, crop_dynamic_cache

PROMPT = [3, 7, 1, 4, 9, 2, 11, 5, 8, 6, 10, 12, 13]   # 13 tokens: past a sliding window of 6


def sliding_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(4)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                      use_sliding_window=True, sliding_window=6, max_window_layers=0)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["full", "sliding"])
def lm(request):
    model = tiny_model(2) if request.param == "full" else sliding_model()
    if request.param == "sliding":
        assert set(model.config.layer_types) == {"sliding_attention"}
    return HFLM(model)


def snapshot(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(k1, k2) and torch.equal(v1, v2) for (k1, v1), (k2, v2) in zip(a, b))


@torch.inference_mode()
def filled(lm, n=len(PROMPT)):
    cache = lm.new_cache()
    lm.forward(cache, PROMPT[:n], 1)
    lm.crop(cache, n)       # what the decode loop does after every block (a sliding window is trimmed here)
    return cache


@torch.inference_mode()
def test_a_crop_to_the_current_length_keeps_the_cache(lm):
    cache = filled(lm)
    before = snapshot(cache)
    lm.crop(cache, lm.length(cache))                      # through the LM, as the decode loop calls it
    assert lm.length(cache) == len(PROMPT) and same(snapshot(cache), before)
    crop_dynamic_cache(cache, cache.get_seq_length())    # zero tokens removed: not "crop to zero"
    assert lm.length(cache) == len(PROMPT) and same(snapshot(cache), before)


@torch.inference_mode()
@pytest.mark.parametrize("remove", [1, 3, 5])
def test_a_crop_removes_exactly_the_tokens_after_the_kept_length(lm, remove):
    cache = filled(lm)
    ref = lm.forward(cache, [14, 15, 16, 17, 18], 5)      # 18 tokens held now
    lm.crop(cache, 18 - remove)
    assert lm.length(cache) == 18 - remove
    window = getattr(lm.model.config, "sliding_window", None) if lm.model.config.use_sliding_window else None
    held = {layer.keys.shape[-2] for layer in cache.layers}
    assert held == {18 - remove if window is None else window - 1}   # a window is cut back to its last window - 1
    # the cache now holds exactly the first 18 - remove tokens: feeding the removed ones again gives
    # the logits they had, and a cache filled with the kept tokens alone holds the same keys and values
    again = lm.forward(cache, [14, 15, 16, 17, 18][5 - remove:], remove)
    torch.testing.assert_close(again, ref[5 - remove:], rtol=1e-5, atol=1e-5)
    lm.crop(cache, 18 - remove)
    fresh = lm.new_cache()
    lm.forward(fresh, (PROMPT + [14, 15, 16, 17, 18])[:18 - remove], 1)
    lm.crop(fresh, 18 - remove)
    for (k1, v1), (k2, v2) in zip(snapshot(cache), snapshot(fresh)):
        torch.testing.assert_close(k1, k2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v1, v2, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_crop_to_zero_empties_the_cache_and_past_the_end_is_refused(lm):
    cache = filled(lm)
    with pytest.raises(ValueError, match="cannot crop"):
        lm.crop(cache, len(PROMPT) + 1)
    with pytest.raises(ValueError, match="cannot crop"):
        lm.crop(cache, -1)
    lm.crop(cache, 0)
    assert lm.length(cache) == 0
    fresh = lm.new_cache()
    torch.testing.assert_close(lm.forward(cache, PROMPT[:4], 4), lm.forward(fresh, PROMPT[:4], 4), rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_sliding_window_that_did_not_record_its_past_is_refused():
    lm = HFLM(sliding_model())
    from transformers import DynamicCache
    cache = DynamicCache(config=lm.model.config)          # no activate_past_recording
    lm.forward(cache, PROMPT, 1)
    with pytest.raises(RuntimeError, match="did not record its past"):
        lm.crop(cache, len(PROMPT) - 2)
