"""csd.runtime.smoothing: SmoothQuant before dynamic int8 keeps the float function and brings int8 closer to it
where activations have outlier channels (the case it exists for)."""
import copy

import pytest
import torch

from conftest import tiny_model


def with_outliers(model, factor: float = 60.0, channels=(3, 17)):
    """The same float function with outlier activation channels: the RMSNorm weights of ``channels``
    scaled up and the consuming weight columns scaled down, in every layer (and a large channel on
    the down projection's input through the up projection's rows)."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for layer in m.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            for norm, lins in ((layer.input_layernorm, (a.q_proj, a.k_proj, a.v_proj)),
                               (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj))):
                for c in channels:
                    norm.weight[c] *= factor
                    for lin in lins:
                        lin.weight[:, c] /= factor
            for c in channels:
                mlp.up_proj.weight[c] *= factor
                mlp.down_proj.weight[:, c] /= factor
    return m


def logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def test_smoothing_keeps_the_float_function_and_brings_int8_closer():
    from csd.runtime.convert import ModuleSource, activation_maxima
    from csd.runtime.quant import to_repr
    from csd.runtime.smoothing import smooth, supported

    base = tiny_model(5, vocab=64, hidden=64)
    model = with_outliers(base)
    ids = [(7 * i + 3) % 64 for i in range(40)]
    ref = logits(model, ids)
    assert torch.allclose(ref, logits(base, ids), atol=1e-3)         # the outliers change nothing in float
    assert supported(model)
    maxima = activation_maxima(ModuleSource(model), model.config, [ids[:20], ids[10:]])
    assert set(maxima) == {f"{i}.{k}" for i in range(2) for k in ("qkv", "o", "gu", "down")}
    assert maxima["0.qkv"][3] > 10 * maxima["0.qkv"].median()        # the outlier is seen

    smoothed = copy.deepcopy(model)
    smooth(smoothed, maxima)
    assert torch.allclose(logits(smoothed, ids), ref, atol=1e-3)     # float function unchanged
    plain_err = (logits(to_repr(model, "int8", copy=True), ids) - ref).abs().mean()
    smooth_err = (logits(to_repr(model, "int8", copy=True, maxima=maxima), ids) - ref).abs().mean()
    assert smooth_err < 0.5 * plain_err, (float(smooth_err), float(plain_err))


def test_the_shipped_maxima_are_the_embedded_targets_on_todays_prompts():
    """csd/data/target_maxima.safetensors spares the first start 28 layers of float32 passes; it is used
    only for the model and the prompts it was measured on (change either, and this fails until it is
    measured again: docs/models.md says how)."""
    from transformers import AutoTokenizer

    from csd.runtime.convert import shipped_maxima
    from csd.runtime.embedded import prepare_embedded
    from csd.runtime.pair import EMBEDDED, encode_prompt
    from csd.runtime.smoothing import calibration_prompt_ids
    tok = AutoTokenizer.from_pretrained(prepare_embedded("target"))
    prompts = calibration_prompt_ids(lambda p: encode_prompt(tok, p))
    maxima = shipped_maxima(EMBEDDED["target"].sha256, prompts)
    assert maxima is not None and len(maxima) == 4 * 28 and maxima["27.down"].shape == (8960,)
    assert all(bool((v > 0).all()) for v in maxima.values())
    assert shipped_maxima(EMBEDDED["draft"].sha256, prompts) is None           # another model
    assert shipped_maxima(EMBEDDED["target"].sha256, prompts[:-1]) is None     # other prompts


def test_unsupported_models_are_left_alone():
    from csd.runtime.smoothing import supported
    assert not supported(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="the prompt is empty"):
        from csd.runtime.pair import encode_prompt
        encode_prompt(None, "  ")


def test_the_first_token_is_prefilled_alone_so_int8_rounds_the_prompt_finely():
    """A sequence's first token (an attention sink) carries activations far larger than any other:
    in one dynamic int8 pass with it, every other prompt token is rounded to its scale. The decode
    loop feeds it alone (``prefill_spans``): in float that changes nothing, in int8 the prompt's keys
    and values come out closer to float. (What that does to the answers of the real pair is measured,
    not asserted: README, "The first token alone".)
    """
    from csd.decode import PREFILL_CHUNK, prefill_spans
    from csd.runtime.lm import LeanLM
    from csd.runtime.quant import to_repr

    assert prefill_spans(0) == [] and prefill_spans(1) == [(0, 1)]
    spans = prefill_spans(2 * PREFILL_CHUNK + 5)
    assert spans[:2] == [(0, 1), (1, 1 + PREFILL_CHUNK)] and spans[-1][1] == 2 * PREFILL_CHUNK + 5
    assert all(a == b for (_, a), (b, _) in zip(spans, spans[1:]))      # contiguous, nothing fed twice

    sink, k, j = 1, 5, 9
    model = tiny_model(8, vocab=64, hidden=64)
    with torch.no_grad():                 # token `sink` alone drives one MLP channel of layer 0 to ~1e4
        emb = model.model.embed_tokens.weight
        emb[:, k] = 0
        emb[sink] = 0
        emb[sink, k] = 1.0
        model.model.layers[0].self_attn.o_proj.weight[k] = 0     # only the sink's own stream has channel k
        mlp = model.model.layers[0].mlp
        mlp.gate_proj.weight[j, k] = mlp.up_proj.weight[j, k] = 20.0
        mlp.down_proj.weight[:, j] /= 1000
    ids = [sink] + [(5 * i + 2) % 62 + 2 for i in range(40)]
    prompt, answer = ids[:30], ids[30:]
    acts = {}
    def keep_maxima(module, inp):
        acts["x"] = inp[0][0].abs().amax(-1)
    h = model.model.layers[0].mlp.down_proj.register_forward_pre_hook(keep_maxima)
    logits(model, ids)
    h.remove()
    assert acts["x"][0] > 100 * acts["x"][1:].max()   # the sink's activation dwarfs the others'

    def feed(lm, split: bool):
        """The prompt prefilled (the sink alone or in one pass), then the answer in one verify pass."""
        cache = lm.new_cache(64)
        body = prompt[:-1]
        for a, b in (prefill_spans(len(body)) if split else [(0, len(body))]):
            lm.forward(cache, body[a:b], 1)
        return lm.forward(cache, [prompt[-1]] + answer[:-1], len(answer)), cache

    fl = LeanLM(model)
    ref, ref_cache = feed(fl, True)
    assert torch.allclose(ref, feed(fl, False)[0], atol=1e-4)        # float: the same function
    q = LeanLM(to_repr(model, "int8", copy=True))
    err = {}
    for split in (False, True):       # the prompt's keys and values in layer 1, the first layer after the sink's MLP
        _, c = feed(q, split)
        err[split] = sum(float((getattr(c, kv)[1, :, 1:29] - getattr(ref_cache, kv)[1, :, 1:29]).abs().mean())
                         for kv in ("k", "v"))
    assert err[True] < 0.5 * err[False], err
