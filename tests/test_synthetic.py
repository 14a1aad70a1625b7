"""The synthetic benchmark (``csd.bench.synthetic``) on its tiny pair: the results it writes, greedy
SD == AR, acceptance as requested, one host transfer per block, the scripted draft, and the
command line. Random weights built in-process: seconds, no model files."""
from __future__ import annotations

import json
import math

import pytest
import torch

from csd.bench.synthetic import (
    ARCHS,
    PAIRS,
    ScriptedDraft,
    SyntheticConfig,
    build_model,
    make_pair,
    run_synthetic,
    scripted_run,
)
from csd.bench.synthetic.run import _coins, _script_of
from csd.config import CSDConfig
from csd.decode import Decoder
from csd.memory import CorrectionMemory

TOKENS = 64
PROMPTS = 3


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    cfg = SyntheticConfig(pair="tiny", acceptance=0.8, prompts=PROMPTS, max_new_tokens=TOKENS, gamma=4,
                          pass_lengths=(1, 3, 5), reps=1, device="cpu")
    return run_synthetic(cfg, out), out


@pytest.fixture(scope="module")
def module_pair():
    d, t = (ARCHS[a] for a in PAIRS["tiny"])
    dev = torch.device("cpu")
    return make_pair("tiny", build_model(d, dev, 0), build_model(t, dev, 1), dev, ("float32", "float32"), "auto")


@pytest.fixture
def tiny_pair(module_pair):
    """The module's pair (seconds to build), its scripted draft unscripted after each test, failed or not: a test
    scripts it, and the next must not find it on another test's path."""
    yield module_pair
    module_pair.draft_lm.script(None)


def run_to_end(pair, prompt, cfg, memory=None):
    run = Decoder(pair).run(prompt, cfg, memory or CorrectionMemory(pair.pair_id))
    list(run)
    return run


def test_results_structure_and_files(result):
    res, out = result
    assert res["status"] == "finished" and res["kind"] == "synthetic"
    m = res["meta"]["machine"]
    assert m["name"] and m["torch"] == torch.__version__ and m["device"] == "cpu"
    assert res["meta"]["archs"]["target"]["name"] == "tiny-target"
    stats = res["summary"]["synthetic-tiny"]              # the normal bench's contract: summary[dataset][method]
    assert set(stats) == {"ar", "sd", "csd"}
    for s in stats.values():
        assert s["tokens_per_s"] > 0 and s["n"] == PROMPTS
    assert res["peak_memory"]["bytes"] > 0 and "RSS" in res["peak_memory"]["kind"]
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(res))
    md = (out / "results.md").read_text()
    assert "| sd |" in md and "Greedy SD == AR (float32" in md and "PASSED" in md


def test_every_method_makes_the_requested_tokens(result):
    res, _ = result
    for item in res["items"]:
        assert item["new_tokens"] == TOKENS
    assert all(s["new_tokens"] == PROMPTS * TOKENS for s in res["summary"]["synthetic-tiny"].values())


def test_greedy_sd_equals_ar_in_float32(result):
    res, _ = result
    assert all(it["identical_to_ar"] for it in res["items"] if it["method"] == "sd")
    check = res["sd_equals_ar"]
    assert check["dtype"] == "float32" and check["passed"] and check["identical"] == PROMPTS


def test_acceptance_is_the_requested_one_and_runs_follow_their_script(result):
    res, _ = result
    sd = res["summary"]["synthetic-tiny"]["sd"]
    assert sd["decided"] > 100 and abs(sd["acceptance"] - 0.8) < 0.15
    assert sd["fixed_point"] == PROMPTS and sd["attempts"] == PROMPTS     # float32: AR's script is SD's own path
    assert sd["acceptance_rate"] < sd["acceptance"]                       # proposed-but-discarded drafts count there


def test_one_host_transfer_per_block_for_greedy_fixed_gamma(result):
    res, _ = result
    for s in res["summary"]["synthetic-tiny"].values():
        assert s["syncs_per_block"] == 1.0 and s["host_syncs"] == s["target_passes"]


def test_the_host_alone_per_block_is_reported_apart_from_passes_and_transfers(result):
    """What capturing the rule too could save on a GPU: the time a run spends outside its passes, its
    prefill and its one transfer a block (the rule, events, policy), per target pass."""
    res, out = result
    for m, s in res["summary"]["synthetic-tiny"].items():
        assert 0 < s["host_ms_per_block"] < 1000 * s["wall_s"] / s["target_passes"], m
    assert "Host alone per target pass" in next(out.glob("*.md")).read_text()


def test_the_report_names_the_engine_that_made_it(result):
    res, out = result
    assert res["meta"]["models"]["engine"] == "eager"                     # auto on the CPU
    assert "; eager engine;" in next(out.glob("*.md")).read_text()


def test_verify_time_table_has_each_requested_length(result):
    res, _ = result
    assert set(res["verify_ms"]) == {"1", "3", "5"} and all(v > 0 for v in res["verify_ms"].values())
    assert res["draft_ms"] > 0 and res["bound"]["4"] > 0


def test_random_target_output_is_not_degenerate(result):
    o = result[0]["outputs"]
    assert o["distinct_share"] > 0.5 and o["longest_run"] < 10


def test_bfloat16_checks_in_float32_and_counts_only_runs_that_follow_their_script():
    cfg = SyntheticConfig(pair="tiny", dtype="bfloat16", acceptance=0.8, prompts=2, max_new_tokens=64, gamma=4,
                          pass_lengths=(1, 5), reps=1, warmup=False, check_tokens=24, device="cpu")
    res = run_synthetic(cfg, None)
    check = res["sd_equals_ar"]
    assert check["dtype"] == "float32" and check["passed"] and check["tokens"] == 24
    assert res["meta"]["models"]["representation"]["target"] == "bfloat16"
    sd = res["summary"]["synthetic-tiny"]["sd"]
    assert sd["fixed_point"] == 2 and abs(sd["acceptance"] - 0.8) < 0.15 and sd["syncs_per_block"] == 1.0


def test_same_seed_same_tokens():
    cfg = SyntheticConfig(pair="tiny", prompts=1, max_new_tokens=24, gamma=4, pass_lengths=(1, 2), reps=1,
                          warmup=False, device="cpu")
    a, b = run_synthetic(cfg, None), run_synthetic(cfg, None)
    key = [(it["method"], it["accepted"], it["decided"], it["target_passes"]) for it in a["items"]]
    assert key == [(it["method"], it["accepted"], it["decided"], it["target_passes"]) for it in b["items"]]
    assert a["outputs"]["sample"] == b["outputs"]["sample"]


@pytest.mark.parametrize("acceptance", [0.0, 1.0])
def test_acceptance_extremes(tiny_pair, acceptance):
    prompt = list(range(40, 72))
    ar = run_to_end(tiny_pair, prompt, CSDConfig(method="ar", max_new_tokens=40))
    tiny_pair.draft_lm.script(*_script_of(prompt, ar), _coins(200, acceptance, 0))
    try:
        sd = run_to_end(tiny_pair, prompt, CSDConfig(method="sd", gamma=4, max_new_tokens=40))
    finally:
        tiny_pair.draft_lm.script(None)
    m = sd.metrics
    assert sd.token_ids == ar.token_ids and m.host_syncs == m.target_forwards
    if acceptance == 1.0:
        assert m.accepted == m.drafted and m.target_forwards == math.ceil(40 / 5)
    else:
        assert m.accepted == 0 and m.target_forwards == 40


def test_scripted_draft_moves_only_scripted_rows(tiny_pair):
    lm: ScriptedDraft = tiny_pair.draft_lm
    inner = lm.inner
    path = [5, 9, 11, 13, 17]
    want = [-1, -1, -1, 200, 201, 202]          # positions 3.. are scripted
    coins = torch.tensor([True, True, True, True, False, True])
    with torch.inference_mode():
        plain = inner.forward(inner.new_cache(), path[:3], 3)              # rows predict positions 1, 2, 3
        lm.script(None)
        torch.testing.assert_close(lm.forward(lm.new_cache(), path[:3], 3), plain)
        lm.script(path, want, coins)
        c = lm.new_cache()
        out = lm.forward(c, path[:3], 3)
        torch.testing.assert_close(out[:2], plain[:2])         # unscripted positions: the draft's own
        assert int(out[2].argmax()) == 200                     # position 3, coin: the target's token wins
        nxt = lm.forward(c, torch.tensor([path[3]]), 1)[0]     # position 4, no coin: the target's token is masked
        assert nxt[201] == -math.inf and int(nxt.argmax()) != 201
        off = lm.forward(c, torch.tensor([7]), 1)[0]           # 7 leaves the path: position 5 is the draft's own
        ref = inner.new_cache()
        torch.testing.assert_close(off, inner.forward(ref, path[:4] + [7], 1)[0])
        lm.crop(c, 4)                                          # a rollback puts it back on the path
        assert int(lm.forward(c, torch.tensor([path[4]]), 1)[0].argmax()) == 202
    lm.script(None)


def test_a_run_that_leaves_its_script_is_rerun_until_it_follows_it(tiny_pair):
    prompt = list(range(10, 42))
    decoder = Decoder(tiny_pair)
    ar = run_to_end(tiny_pair, prompt, CSDConfig(method="ar", max_new_tokens=30))
    path, want = _script_of(prompt, ar)
    p = len(prompt) + 5                          # a wrong script from position 5 on: the run must leave it there
    path = path[:p] + [(t + 1) % 384 for t in path[p:]]
    want = want[:p] + [(t + 1) % 384 for t in want[p:]]
    cfg = CSDConfig(method="sd", gamma=4, max_new_tokens=30)
    coins = _coins(200, 0.9, 3)
    *_, attempts, fixed, own = scripted_run(decoder, prompt, cfg, None, (path, want), coins, 0)
    assert attempts == 1 and not fixed
    run, _, _, _, attempts, fixed, own = scripted_run(decoder, prompt, cfg, None, (path, want), coins, 3)
    assert attempts == 2 and fixed and run.token_ids == ar.token_ids and own == _script_of(prompt, ar)
    tiny_pair.draft_lm.script(None)


def test_init_is_seeded_and_keeps_the_architecture():
    arch = ARCHS["tiny-draft"]
    a, b, c = (build_model(arch, torch.device("cpu"), s) for s in (0, 0, 1))
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), n
        if pa.dim() == 2:
            assert not torch.equal(pa, pc), n
    assert a.config.num_hidden_layers == arch["num_hidden_layers"]
    head_dim = arch["hidden_size"] // arch["num_attention_heads"]
    inv = a.model.rotary_emb.inv_freq
    torch.testing.assert_close(inv[1], torch.tensor(1e6 ** (-2 / head_dim)))
    assert a.model.norm.weight.eq(1).all() and a.model.layers[0].self_attn.q_proj.bias.eq(0).all()


def test_architectures_are_the_embedded_pairs():
    from csd.fileio import cache_dir
    from csd.runtime.pair import EMBEDDED

    for role, arch in (("draft", "qwen2.5-coder-0.5b-instruct"), ("target", "qwen2.5-coder-1.5b-instruct")):
        f = cache_dir() / "models" / EMBEDDED[role].name / "config.json"
        if not f.exists():
            pytest.skip("the embedded models are not prepared here (python -m csd prepare)")
        real = json.loads(f.read_text())
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "tie_word_embeddings", "hidden_act", "max_position_embeddings"):
            assert ARCHS[arch][key] == real[key], (arch, key)
        assert ARCHS[arch]["rope_parameters"]["rope_theta"] == real["rope_parameters"]["rope_theta"]
        assert math.isclose(ARCHS[arch]["rms_norm_eps"], real["rms_norm_eps"], rel_tol=1e-6)


def test_command_line(tmp_path, capsys):
    from csd.bench.synthetic import main as synthetic_main
    from csd.cli import main

    args = ["--synthetic-config", "tiny", "--limit", "1", "--max-new-tokens", "16", "--pass-lengths", "1,2",
            "--no-warmup", "--device", "cpu"]
    assert main(["bench", "--synthetic", *args, "--out", str(tmp_path / "a")]) == 0
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    assert res["summary"]["synthetic-tiny"]["sd"]["tokens_per_s"] > 0
    assert "| csd |" in capsys.readouterr().out
    assert synthetic_main([*args, "--repeats", "2", "--out", str(tmp_path / "b")]) == 0   # torch + transformers only
    assert (tmp_path / "b" / "results.md").exists()
    assert json.loads((tmp_path / "b" / "results.json").read_text())["meta"]["config"]["repeats"] == 2
    assert synthetic_main([*args, "--repeats", "0", "--out", str(tmp_path / "e")]) == 2
    assert "--repeats must be a whole number in 1..20" in capsys.readouterr().err
    assert main(["bench", "--synthetic", "--dataset", "gsm8k", "--out", str(tmp_path / "c")]) == 2
    assert "--dataset" in capsys.readouterr().err and not (tmp_path / "c").exists()
    assert synthetic_main(["--acceptance", "1.5", "--out", str(tmp_path / "d")]) == 2


def test_on_the_static_engine_the_scripted_block_follows_its_script():
    """The static engine drafts a block in one call (one graph on CUDA) with the script's coin inside it:
    on the CPU the same function runs eagerly, and the benchmark's contract holds (greedy SD == AR,
    the requested acceptance, every run at its script's fixed point, one transfer a block)."""
    cfg = SyntheticConfig(pair="tiny", acceptance=0.8, prompts=2, max_new_tokens=48, gamma=4, pass_lengths=(1, 5),
                          reps=1, device="cpu", engine="static")
    res = run_synthetic(cfg, None)
    sd = res["summary"]["synthetic-tiny"]["sd"]
    assert res["sd_equals_ar"]["passed"] and sd["fixed_point"] == 2
    assert sd["decided"] > 40 and abs(sd["acceptance"] - 0.8) < 0.2 and sd["syncs_per_block"] == 1.0


def test_a_scripted_block_proposes_what_the_scripted_steps_propose():
    """``ScriptedDraft.draft_block`` over a static draft (the coin on device positions, fixed buffers)
    against the same script over the eager lean draft, stepped one token at a time."""
    from csd.runtime.lm import LeanLM
    from csd.runtime.static import StaticLM
    model = build_model(ARCHS["tiny-draft"], torch.device("cpu"), 0)
    static, eager = ScriptedDraft(StaticLM(LeanLM(model), capacity=128)), ScriptedDraft(LeanLM(model))
    rng = torch.Generator().manual_seed(3)
    path = torch.randint(0, 384, (60,), generator=rng).tolist()
    want = [-1] * 10 + path[10:]
    coins = torch.rand(80, generator=rng) < 0.7
    for d in (static, eager):
        d.script(path, want, coins)
    cs, ce = static.new_cache(), eager.new_cache()
    static.forward(cs, path[:10], 1)
    eager.forward(ce, path[:10], 1)
    for t, g in ((1, 4), (2, 6), (1, 1), (2, 3)):
        feed = path[10:10 + t]
        got = static.draft_block(cs, feed, g).tolist()
        x, stepped = feed, []
        for _ in range(g):
            x = [int(eager.forward(ce, x, 1)[-1].argmax())]
            stepped += x
        assert got == stepped and static.length(cs) == eager.length(ce) == 10 + t + g - 1
        assert bool((cs.ok[:10 + t + g] == ce.ok[:10 + t + g]).all())
        static.crop(cs, 10)
        eager.crop(ce, 10)
