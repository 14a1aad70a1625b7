"""The draft in 4 bits (``csd.runtime.quant.Int4Linear``, issue 52): weights on a group's 16 levels come back
exactly, others within half a level; a converted int4 draft maps back from its cache; greedy SD with it
still writes the target's own answer (the draft's representation changes only what it proposes); a draft
whose shapes cannot be packed falls back to int8 with a warning. Tiny in-process models."""
from __future__ import annotations

import logging
from contextlib import nullcontext

import pytest
import torch

from conftest import make_pair, perturbed, tiny_model
from csd.runtime import convert
from csd.runtime.convert import ModuleSource, cached_lean
from csd.runtime.quant import INT4_GROUP, Int4Linear, int4_missing, quantize_int4

pytestmark = pytest.mark.skipif(int4_missing() is not None, reason=f"no CPU int4 kernel: {int4_missing()}")


def weights_of(lin: Int4Linear) -> torch.Tensor:
    """The weights a layer computes with, read back through it: W = (I @ W^T + b - b)^T on bfloat16-exact inputs."""
    return (lin(torch.eye(lin.in_features)) - lin(torch.zeros(1, lin.in_features))).t()


def test_weights_on_a_groups_sixteen_levels_come_back_exactly():
    g = torch.Generator().manual_seed(0)
    w = (torch.randint(0, 16, (48, 96), generator=g) - 8) * 0.125
    w[:, ::INT4_GROUP], w[:, 1::INT4_GROUP] = -1.0, 0.875        # every group spans its 16 levels
    assert torch.equal(weights_of(Int4Linear.from_float(w, None)), w)


def test_other_weights_land_within_half_a_level():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(1))
    got = weights_of(Int4Linear.from_float(w, None))
    groups = w.view(32, -1, INT4_GROUP)
    step = (groups.amax(-1) - groups.amin(-1)) / 15                     # one level of each group
    err = (got - w).abs().view(32, -1, INT4_GROUP).amax(-1)
    assert bool((err <= 0.5 * step + 0.01 * groups.abs().amax(-1)).all())   # + the bfloat16 scales' rounding
    assert bool((err > 0).any())                                         # and it is a rounding: not the floats


def test_a_bias_and_leading_shapes_are_kept():
    g = torch.Generator().manual_seed(2)
    w, b, x = torch.randn(16, 64, generator=g), torch.randn(16, generator=g), torch.randn(2, 3, 64, generator=g)
    lin = Int4Linear.from_float(w, b)
    y = lin(x)
    assert y.shape == (2, 3, 16) and y.dtype == torch.float32
    product = x @ weights_of(lin).t()      # weights read back, activations and products in bfloat16: within 1%
    assert torch.allclose(y - b, product, atol=0.01 * float(product.abs().max()))
    assert not torch.allclose(y, product, atol=0.01 * float(product.abs().max()))     # the bias was added


def test_shapes_the_kernel_cannot_pack_are_refused_by_size():
    with pytest.raises(ValueError, match=r"33x64 weight cannot be packed in 4 bits"):
        quantize_int4(torch.randn(33, 64))
    with pytest.raises(ValueError, match=r"16x40 weight"):
        quantize_int4(torch.randn(16, 40))


def test_an_int4_draft_maps_back_and_greedy_sd_still_writes_ar(tmp_path, qwen_tokenizer, one_thread):
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from csd.memory import CorrectionMemory
    target = tiny_model(2)
    draft = perturbed(target, 0.05)
    key = {"format": convert.FORMAT, "source": "tiny", "role": "draft", "bits": 4}
    lm = cached_lean(tmp_path / "d", key, lambda: nullcontext(ModuleSource(draft)), draft.config, rows=False,
                     name="tiny", bits=4)
    assert all(isinstance(m, Int4Linear) for layer in lm.layers for m in (layer[1], layer[2], layer[4], layer[5]))
    pair = make_pair(qwen_tokenizer, target, draft, draft_lm=lm)
    out = {}
    for method in ("ar", "sd"):
        run = Decoder(pair).run([3, 7, 1, 4, 9, 2, 5], CSDConfig(method=method, gamma=4, lookup=0, max_new_tokens=40),
                                CorrectionMemory(pair.pair_id))
        list(run)
        out[method] = run
    assert out["sd"].token_ids == out["ar"].token_ids
    assert out["sd"].metrics.accepted > 0 and out["sd"].metrics.target_forwards < 40   # the int4 draft was kept


@pytest.mark.parametrize("weights", ["int4", "ort4"])
def test_a_draft_the_4_bit_layout_cannot_hold_runs_int8_with_a_warning(weights, tmp_path, qwen_tokenizer, monkeypatch,
                                                                       caplog, one_thread):
    from csd.runtime.models import load_pair
    from csd.runtime.ortlm import ort_missing
    if weights == "ort4" and ort_missing():
        pytest.skip(f"no ONNX Runtime: {ort_missing()}")
    monkeypatch.setenv("CSD_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "tiny40"
    tiny_model(2, hidden=40).save_pretrained(d)       # 40 input columns: not a multiple of the group of 32
    qwen_tokenizer.save_pretrained(d)
    with caplog.at_level(logging.WARNING):
        pair = load_pair(str(d), str(d), draft_weights=weights)
    assert pair.rep.draft == "int8"
    assert any(f"cannot run in {weights}" in r.getMessage() and "int8 runs instead" in r.getMessage()
               for r in caplog.records)


def test_the_page_names_a_4_bit_draft_in_plain_words():
    from csd.ui.app import plain_words
    d = {"target": "qwen2.5-coder-1.5b-instruct-q4_k_m", "draft": "qwen2.5-coder-0.5b-instruct-q4_k_m",
         "representation": {"target": "int8", "draft": "int4", "activations": "row"}}
    assert plain_words(d) == ("Qwen2.5-Coder 0.5B drafts for Qwen2.5-Coder 1.5B; the target's weights in 8-bit "
                              "integers, the draft's in 4-bit integers; exact: SD gives the target's own answer")
