"""int8 with activations scaled per row (per token): what a verify pass computes for a token does not
depend on the other tokens in the pass, so greedy SD equals AR in int8 too. Tiny in-process models."""
from __future__ import annotations

import copy
import warnings
from dataclasses import replace

import pytest
import torch

from conftest import make_pair, perturbed, tiny_model
from csd.config import CSDConfig
from csd.decode import Decoder
from csd.memory import CorrectionMemory
from csd.representation import Representation
from csd.runtime.lm import LeanLM
from csd.runtime.quant import RowInt8Linear, quantize_int8, quantize_rows


def _int8_linear(k: int = 64, n: int = 48, bias: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    ref = copy.deepcopy(lin)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ref, quantize_int8(torch.nn.Sequential(lin))[0]


@pytest.mark.parametrize("bias", [True, False])
def test_a_row_is_computed_the_same_alone_or_in_a_pass(bias):
    ref, q = _int8_linear(bias=bias)
    row = RowInt8Linear.from_dynamic(q)
    x = torch.randn(7, 64) * torch.logspace(-1, 1, 7)[:, None]    # rows of very different sizes
    full = row(x)
    for i in range(7):                                           # bit for bit, not within a tolerance
        assert torch.equal(full[i:i + 1], row(x[i:i + 1]))
    # the per-pass op does not have that property: one large row changes the others' rounding
    assert not all(torch.equal(q(x)[i:i + 1], q(x[i:i + 1])) for i in range(7))
    # and it is the same function, to int8's precision: close to the float layer
    err = (full - ref(x)).abs().max() / ref(x).abs().max()
    assert err < 0.02
    assert row(x[None]).shape == (1, 7, 48)


@pytest.mark.parametrize("k,n", [(64, 48), (896, 1152), (1536, 2048)])    # tiny; the draft's and the target's q/k/v
def test_the_kernel_a_shape_gets_computes_fbgemms_bits(k, n):
    """oneDNN runs a shape only where its probe found fbgemm's bits (``csd.runtime.quant.onednn_exact``; on the
    Xeon the two larger shapes): whichever kernel a shape gets, its passes give fbgemm's bits per token and per
    pass, and a token's row is the same alone as in a pass."""
    torch.manual_seed(k)
    rows, scales = quantize_rows(torch.randn(n, k) * 0.05)
    bias = torch.randn(n)
    chosen, fbgemm = RowInt8Linear(rows, scales, bias), RowInt8Linear(rows, scales, bias, onednn=False)
    x = torch.randn(9, k) * torch.logspace(-1, 1, 9)[:, None]
    for per_row in (True, False):
        for m in (1, 2, 7, 9):
            assert torch.equal(chosen.rows_as(per_row)(x[:m]), fbgemm.rows_as(per_row)(x[:m])), (chosen.onednn, m)
    full = chosen.rows_as(True)(x)
    assert all(torch.equal(full[i:i + 1], chosen(x[i:i + 1])) for i in range(9))


def test_only_per_channel_weights_are_taken():
    _, q = _int8_linear()
    w, b = torch.ops.quantized.linear_unpack(q._packed_params._packed_params)
    per_tensor = torch.quantize_per_tensor(w.dequantize(), 0.01, 0, torch.qint8)
    q._packed_params._packed_params = torch.ops.quantized.linear_prepack(per_tensor, b)
    with pytest.raises(ValueError, match="per-channel"):
        RowInt8Linear.from_dynamic(q)


def _tokens(pair, method: str, n: int = 40) -> list[int]:
    run = Decoder(pair).run([3, 7, 1, 4], CSDConfig(method=method, gamma=5, max_new_tokens=n, lookup=0),
                            CorrectionMemory(pair.pair_id))
    list(run)
    return run.token_ids


def test_sd_equals_ar_on_an_int8_target_scaled_per_row(qwen_tokenizer, one_thread):
    target = tiny_model(2, hidden=64)
    int8 = quantize_int8(copy.deepcopy(target)).eval()
    lean = LeanLM(int8)
    assert lean.int8_per_row() == 4 * len(lean.layers) + 1 and lean.int8_per_row() == 0   # every layer, the head
    assert all(isinstance(m, RowInt8Linear) for m in lean.layers[0][1:3] + lean.layers[0][4:])
    pair = replace(make_pair(qwen_tokenizer, int8, perturbed(target, 0.3)), target_lm=lean)
    ar = _tokens(pair, "ar")
    sd = Decoder(pair).run([3, 7, 1, 4], CSDConfig(method="sd", gamma=5, max_new_tokens=40, lookup=0),
                           CorrectionMemory(pair.pair_id))
    list(sd)
    assert sd.token_ids == ar
    assert sd.metrics.accepted > 0 and sd.metrics.target_forwards < 40     # it did speculate, and reject
    assert any(e.status == "rejected" for e in sd.events)
    # a verify pass gives each position the logits a 1-token step gives it, bit for bit
    with torch.inference_mode():
        c1, c2 = lean.new_cache(), lean.new_cache()
        lean.forward(c1, [3, 7, 1, 4], 1)
        lean.forward(c2, [3, 7, 1, 4], 1)
        block = lean.forward(c1, [9, 2, 11], 3)
        steps = torch.cat([lean.forward(c2, [t], 1) for t in (9, 2, 11)])
    assert torch.equal(block, steps)


def test_load_pair_runs_the_exact_int8_where_asked_and_says_so(tmp_path, qwen_tokenizer, one_thread, monkeypatch):
    import csd.runtime.quant as quant
    from csd.runtime.models import load_pair
    from csd.runtime.pair import ModelLoadError
    d = tmp_path / "tiny"
    tiny_model(2).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    row = load_pair(str(d), str(d), dtype="int8", activations="row")
    assert row.rep.activations == "row" and row.describe()["representation"]["activations"] == "row"
    assert row.target_lm.per_row
    per_pass = load_pair(str(d), str(d), dtype="int8", activations="pass")
    assert per_pass.rep.activations == "pass" and not per_pass.target_lm.per_row
    auto = load_pair(str(d), str(d), dtype="int8")        # the default everywhere: exact rows
    assert auto.rep.activations == "row" and auto.target_lm.per_row
    monkeypatch.setattr(quant, "KERNEL", "fbgemm")                        # a CPU where no shape passes the probe
    monkeypatch.setattr(quant, "_EXACT", {})
    fbgemm = load_pair(str(d), str(d), dtype="int8")                      # rows there too, on fbgemm's products
    assert fbgemm.rep.activations == "row" and fbgemm.target_lm.per_row and quant.int8_kernels(fbgemm.target_lm)
    assert load_pair(str(d), str(d), dtype="int8", target_impl="hf").rep.activations == "pass"   # rows need lean
    assert load_pair(str(d), str(d), dtype="float32").rep.activations == ""      # not an int8 target
    with pytest.raises(ModelLoadError, match="choose auto or row or pass"):
        load_pair(str(d), str(d), dtype="int8", activations="token")
    with pytest.raises(ModelLoadError, match="need the lean target path"):
        load_pair(str(d), str(d), dtype="int8", target_impl="hf", activations="row")


def test_the_cost_cache_tells_a_targets_kernels_apart(tmp_path, qwen_tokenizer, one_thread):
    """One representation label ("int8, activations per pass") covers torch's packed layers on fbgemm and row
    layers on oneDNN fed per pass, whose passes cost differently: gamma auto's cached costs are kept apart."""
    from csd.runtime.models import load_pair
    from csd.runtime.profile import profile_key
    d = tmp_path / "tiny"
    tiny_model(2).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    pair = load_pair(str(d), str(d), dtype="int8", activations="row")
    before = profile_key(pair)
    pair.target_lm.head.onednn = not pair.target_lm.head.onednn      # as another CPU's probe would have chosen
    assert profile_key(pair) != before and profile_key(pair)["representation"] == before["representation"]


def test_the_app_runs_the_exact_int8_and_the_command_line_chooses_by_kernel():
    import csd.cli as cli
    import csd_app
    assert csd_app.parse_args([]).activations == "row"
    assert cli.build_parser().parse_args(["generate", "--prompt", "x"]).activations == "auto"


@pytest.mark.parametrize("bias", [True, False])
def test_a_row_layer_switched_to_per_pass_computes_the_dynamic_layer(bias):
    """Exact mode off: the same converted weights, one scale per pass, as torch's own dynamic layer."""
    _, q = _int8_linear(bias=bias)
    row = RowInt8Linear.from_dynamic(q)
    x = torch.randn(7, 64) * torch.logspace(-1, 1, 7)[:, None]
    row.per_row = False
    if bias:                         # the bias is added after the product here, inside it there
        torch.testing.assert_close(row(x), q(x), rtol=0, atol=1e-6)
    else:
        assert torch.equal(row(x), q(x))
    assert not all(torch.equal(row(x)[i:i + 1], row(x[i:i + 1])) for i in range(7))   # a pass's rounding again
    row.per_row = True
    assert all(torch.equal(row(x)[i:i + 1], row(x[i:i + 1])) for i in range(7))


def test_the_pair_switches_its_activation_scales_both_ways(qwen_tokenizer, one_thread):
    target = tiny_model(2, hidden=64)
    int8 = quantize_int8(copy.deepcopy(target)).eval()
    pair = replace(make_pair(qwen_tokenizer, int8, perturbed(target, 0.3)), target_lm=LeanLM(int8),
                   rep=Representation("int8", activations="pass"))
    per_pass = LeanLM(int8)                       # the loader's per-pass path, for reference
    with torch.inference_mode():
        ref = per_pass.forward(per_pass.new_cache(), [3, 7, 1, 4, 9, 2], 6)
    pair.set_activations("row")
    lean = pair.target_lm
    assert pair.rep.activations == "row" and lean.per_row and isinstance(lean.head, RowInt8Linear)
    ar = _tokens(pair, "ar")
    assert _tokens(pair, "sd") == ar
    pair.set_activations("pass")
    assert pair.rep.activations == "pass" and not lean.per_row
    assert not any(m.per_row for layer in lean.layers for m in layer if isinstance(m, RowInt8Linear))
    with torch.inference_mode():
        out = lean.forward(lean.new_cache(), [3, 7, 1, 4, 9, 2], 6)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)      # the per-pass function, to the bias's rounding
    pair.set_activations("row")
    assert lean.per_row and _tokens(pair, "sd") == ar           # back to exact: SD writes AR's tokens again
    with pytest.raises(ValueError, match="row or pass"):
        pair.set_activations("token")
    with pytest.raises(ValueError, match="int8 target on the lean path"):
        make_pair(qwen_tokenizer, target, target).set_activations("row")
    # a request's scales as data: views in either mode, the shared pair switched only by their passes
    per_pass_view, row_view = pair.with_activations("pass"), pair.with_activations("row")
    assert pair.rep.activations == "row" and per_pass_view.rep.activations == "pass"
    assert _tokens(per_pass_view, "ar") and pair.rep.activations == "pass" and not lean.per_row
    assert _tokens(row_view, "sd") == ar and pair.rep.activations == "row" and lean.per_row
    with pytest.raises(ValueError, match="row or pass"):
        pair.with_activations("token")


def test_a_benchmark_column_names_its_activation_scales(qwen_tokenizer, one_thread, tmp_path, monkeypatch):
    """``--sweep "method=sd,activations=pass"``: one run, the same items, each column in its own
    representation (the end-to-end cost of exactness); the run's own comes back at the end."""
    import json

    import csd.bench.harness as harness
    from conftest import tiny_bench_pair

    base = tiny_bench_pair(qwen_tokenizer)
    target = tiny_model(2, hidden=64)
    int8 = quantize_int8(copy.deepcopy(target)).eval()
    pair = type(base)(**{**vars(base), "target": int8, "target_lm": LeanLM(int8),
                         "rep": Representation("int8", activations="pass"), "draft": perturbed(target, 0.3)})
    pair.draft_lm = LeanLM(pair.draft)
    pair.set_activations("row")
    seen, real = [], harness.measure

    def observed(p, decoder, m, ids, memory):          # the real measure; which scales each column ran in
        seen.append((m.name, p.rep.activations, p.target_lm.per_row))
        return real(p, decoder, m, ids, memory)

    monkeypatch.setattr(harness, "measure", observed)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": "4"}) for i in range(2)))
    cfg = harness.BenchConfig(str(prompts), None, "ar,sd", 16, tmp_path / "out", show_bar=False,
                              sweep="method=ar,activations=pass;method=sd,activations=pass")
    res = harness.run_bench(pair, cfg)
    assert {(n, a, r) for n, a, r in seen} == {("ar", "row", True), ("sd", "row", True),
                                               ("ar[activations=pass]", "pass", False),
                                               ("sd[activations=pass]", "pass", False)}
    assert pair.rep.activations == "row" and pair.target_lm.per_row         # the run's representation again
    s = res["summary"]["p"]
    assert s["sd"]["identical_to_ar"] == 2                                    # exact in rows
    assert res["meta"]["config"]["settings"]["sd[activations=pass]"]["activations"] == "pass"
    assert "activations" not in res["meta"]["config"]["settings"]["sd"]
    float_pair = tiny_bench_pair(qwen_tokenizer)                              # no int8 target: refused
    with pytest.raises(ValueError, match="int8 target on the lean path"):
        harness.run_bench(float_pair, cfg)
