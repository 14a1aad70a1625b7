"""The target's lean path (``load_pair(target_impl=...)``): an int8 target run by ``LeanLM``
computes what the transformers int8 model computes, SD still equals AR with it, and ``auto`` picks it
for an int8 target only (the float32 reference keeps transformers' code). Tiny in-process models and
tiny model directories; no real weights."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from conftest import make_pair, perturbed, tiny_model
from csd.config import CSDConfig
from csd.decode import Decoder
from csd.memory import CorrectionMemory
from csd.runtime.lm import HFLM, LeanLM, _is_int8
from csd.runtime.models import load_pair
from csd.runtime.pair import ModelLoadError
from csd.runtime.quant import quantize_int8

PROMPT = [3, 7, 1, 4]


def tokens(pair, method: str, n: int = 30) -> list[int]:
    run = Decoder(pair).run(PROMPT, CSDConfig(method=method, gamma=4, max_new_tokens=n), CorrectionMemory(pair.pair_id))
    list(run)
    return run.token_ids


def test_lean_int8_target_is_the_transformers_int8_target(qwen_tokenizer, one_thread):
    target = tiny_model(2)
    draft = perturbed(target, 0.05)
    hf_int8 = quantize_int8(copy.deepcopy(target)).eval()
    hf = HFLM(hf_int8)
    for lean in (LeanLM(hf_int8), LeanLM(target, int8=True)):     # from the int8 model (load_pair), from float32
        same_logits(hf, lean)
    assert LeanLM(hf_int8).layers[0][2] is hf_int8.model.layers[0].self_attn.o_proj      # unfused int8 layers shared

    base = make_pair(qwen_tokenizer, hf_int8, draft)
    lean_pair = replace(base, target_lm=LeanLM(hf_int8))
    ar = tokens(lean_pair, "ar")
    assert ar == tokens(base, "ar")                  # the same greedy answer as the transformers int8 target
    # SD on it is SD on the transformers int8 target (SD == AR is exact in float only: in int8 a pass's
    # activation scale depends on the tokens in it, see quantize_int8)
    assert tokens(lean_pair, "sd") == tokens(base, "sd")
    # a pass that differs from AR would show here: the lean target must not be silently the draft
    assert tokens(replace(base, target_lm=HFLM(draft)), "ar") != ar


def test_quantising_block_by_block_gives_the_weights_of_one_pass(one_thread):
    """``quantize_int8`` quantises the decoder blocks on several threads: every int8 weight, scale and
    bias must be what torch's ``quantize_dynamic`` over the whole model gives."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    target = tiny_model(3)
    ours = quantize_int8(copy.deepcopy(target))
    ref = quantize_dynamic(copy.deepcopy(target), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    layers = {n: m for n, m in ref.named_modules() if _is_int8(m)}
    assert len(layers) == 7 * len(target.model.layers) + 1          # q k v o gate up down per block, and the head
    for name, m in ours.named_modules():
        if name in layers:
            (a, ab), (b, bb) = m._weight_bias(), layers.pop(name)._weight_bias()
            assert torch.equal(a.int_repr(), b.int_repr())
            assert torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales())
            assert (ab is None and bb is None) or torch.equal(ab, bb)
    assert not layers, f"not quantised: {sorted(layers)}"


def same_logits(hf, lean):
    with torch.inference_mode():
        c1, c2 = hf.new_cache(), lean.new_cache(capacity=4)
        torch.testing.assert_close(lean.forward(c2, PROMPT, 4), hf.forward(c1, PROMPT, 4), rtol=1e-5, atol=1e-5)
        for block in ([9, 2, 11], [5], [8, 9, 1, 2, 6, 7, 3]):          # passes of several lengths, as verify does
            torch.testing.assert_close(lean.forward(c2, block, len(block)), hf.forward(c1, block, len(block)),
                                       rtol=1e-5, atol=1e-5)
        hf.crop(c1, 6)
        lean.crop(c2, 6)
        torch.testing.assert_close(lean.forward(c2, [8, 9], 2), hf.forward(c1, [8, 9], 2), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, qwen_tokenizer):
    root = tmp_path_factory.mktemp("tiny-models")
    dirs = []
    for seed, name in ((1, "draft"), (2, "target")):
        d = root / name
        tiny_model(seed).save_pretrained(d)
        qwen_tokenizer.save_pretrained(d)
        dirs.append(str(d))
    return dirs


@pytest.mark.parametrize("dtype,impl,expected", [
    ("int8", "auto", "lean"),        # auto: lean for an int8 target
    ("float32", "auto", "hf"),       # the float32 reference runs transformers' own code
    ("int8", "hf", "hf"),
    ("int8", "lean", "lean"),
    ("float32", "lean", "lean"),
])
def test_load_pair_picks_the_target_path(tiny_dirs, dtype, impl, expected, one_thread):
    pair = load_pair(*tiny_dirs, dtype=dtype, target_impl=impl)
    assert pair.target_lm.impl == expected and pair.describe()["target_impl"] == expected
    assert pair.rep.target == dtype
    if dtype == "float32":
        assert tokens(pair, "sd") == tokens(pair, "ar")          # exact in float
    else:   # the two paths compute the same int8 function where both scale per pass (rows need the lean path)
        same = dict(dtype=dtype, activations="pass")
        this = load_pair(*tiny_dirs, target_impl=expected, **same)
        other = load_pair(*tiny_dirs, target_impl="hf" if expected == "lean" else "lean", **same)
        assert tokens(this, "sd") == tokens(other, "sd") and tokens(this, "ar") == tokens(other, "ar")


def test_an_int8_target_is_smoothed_unless_asked_not_to(tmp_path, qwen_tokenizer, tiny_dirs, monkeypatch, one_thread):
    """load_pair smooths an int8 target (csd.runtime.smoothing) with maxima measured on the shipped
    calibration prompts and says so in describe(); a model the prompts do not fit (32 token ids) is
    quantised as it is."""
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "wide"                   # a tiny model with the tokenizer's whole vocabulary
    tiny_model(4, vocab=len(qwen_tokenizer)).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    pair = load_pair(str(d), str(d), dtype="int8")
    assert pair.target_smoothing.startswith("SmoothQuant") and pair.describe()["target_smoothing"]
    assert list((tmp_path / "cache" / "int8").glob("*-target/maxima.safetensors"))    # kept with the conversion
    plain = load_pair(str(d), str(d), dtype="int8", int8_smoothing=False)      # converted again, said so
    assert plain.target_smoothing == ""
    norm = [p.target_lm.layers[0][0] for p in (pair, plain)]
    assert not torch.equal(*norm)                       # the factors were folded into the model
    hf = pair.hf_target()                               # transformers' model, built on demand, smoothed alike
    assert torch.equal(hf.model.layers[0].input_layernorm.weight, norm[0])
    assert len(tokens(pair, "sd", 12)) == 12            # and the smoothed lean int8 target decodes
    assert load_pair(*tiny_dirs, dtype="int8").target_smoothing == ""


def test_unknown_target_impl_is_a_clear_error(tiny_dirs):
    with pytest.raises(ModelLoadError, match="unknown target implementation 'fast'; choose auto, hf, lean"):
        load_pair(*tiny_dirs, dtype="int8", target_impl="fast")
