"""The rivals (csd.rule.Relax: lossy SD, TensorRT-LLM's top-k relaxation, vLLM/Medusa typical
acceptance, FLy), each on hand-made logits that make every branch certain (+10 / -inf style, as
transformers' tests do), then in the decode loop on tiny in-process models: at its strictest setting
each is token-identical to AR in float32, and the what-if replays the loop's decisions from the
logged values. Definitions and sources: docs/rivals.md."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from csd.config import ConfigError, CSDConfig
from csd.events import (
    ACCEPTED,
    REJECTED,
    RELAXED,
    RULE_MATCH,
    RULE_NOT_RELAXED,
    RULE_RELAXED,
    RULE_SPECIAL,
)
from csd.rule import (
    ALL_SCORES,
    ENTROPY,
    RANK,
    TOP3_ENTROPY,
    Relax,
    Rescue,
    fly_keeps,
    lossy_keeps,
    matches_after,
    topk_keeps,
    typical_keeps,
)
from csd.rule import decide as rule_decide
from csd.verify import score_block

V = 8
NEG = -math.inf


def logits(*rows, rest=-10.0):
    """rows: dicts {token: logit}; every other entry is ``rest`` (-10, or -inf for one-hot rows)."""
    t = torch.full((len(rows), V), rest)
    for i, r in enumerate(rows):
        for k, v in r.items():
            t[i, k] = v
    return t


def counts(table=None):
    table = table or {}
    return lambda x, t: table.get((x, t), 0)


def rule(method, special=(), **params):
    """The run's rule for ``method`` (``CSDConfig.rule``), with the rival's parameters."""
    return CSDConfig.of(method=method, **params).validated().rule(special)


def greedy(drafts, lg, count, r):
    """Greedy verification as the decode loop does it: the block's scores in one transfer, then the rule."""
    return rule_decide(drafts, score_block(drafts, lg, r.scores)[1], count, r)


def decide(drafts, lg, r):
    return greedy(drafts, lg, counts(), r)


def statuses(d):
    return [v.status for v in d.verdicts]


# -- lossy SD ---------------------------------------------------------------------------------------
def test_lossy_keeps_a_token_within_tau_of_the_top1_and_walks_on():
    # draft 4 where the target prefers 5: p(4)/p(5) = 0.7 >= 0.6, kept; then 2 matches; bonus 7
    lg = logits({5: 10, 4: 10 + math.log(0.7)}, {2: 10}, {7: 10})
    d = decide([4, 2], lg, rule("lossy"))
    assert statuses(d) == [RELAXED, ACCEPTED] and d.verdicts[0].rule == RULE_RELAXED
    assert d.n_kept == 2 and d.bonus and d.next_token == 7
    assert d.observed == ((4, 5),)                            # a divergence all the same: counted like SD's


def test_lossy_rejects_below_tau_and_emits_the_targets_top1():
    lg = logits({5: 10, 4: 10 + math.log(0.5)}, {2: 10}, {7: 10})
    d = decide([4, 2], lg, rule("lossy"))
    assert statuses(d) == [REJECTED] and d.verdicts[0].rule == RULE_NOT_RELAXED
    assert d.n_kept == 0 and not d.bonus and d.next_token == 5
    assert decide([4, 2], lg, rule("lossy", tau_lossy=0.4)).n_kept == 2     # a looser tau keeps it


def test_lossy_at_tau_one_keeps_only_ties():
    assert decide([4], logits({5: 10, 4: 9.999}, {7: 10}), rule("lossy", tau_lossy=1.0)).n_kept == 0
    assert lossy_keeps(0.0, 0.0) and not lossy_keeps(-1e-6, 0.0)              # a tie with the top-1 passes


def test_no_rival_ever_relaxes_a_special_token():
    # target prefers 5 (special) over the draft's 4 by a hair: every rule at its loosest would keep it
    lg = logits({5: 10, 4: 9.99}, {2: 10}, {2: 10}, {2: 10}, {7: 10})
    loosest = {"lossy": dict(tau_lossy=1e-9), "topk": dict(topk=8, delta=1.0),
               "typical": dict(posterior_threshold=1e-9, posterior_alpha=1e-9),
               "fly": dict(win_len=2, entropy_thre=0.0)}
    for method, params in loosest.items():
        for special in ({5}, {4}):                             # t* special, then x~ special
            d = greedy([4, 2, 2, 2], lg, counts({(4, 5): 100}), rule(method, special, **params))
            v = d.verdicts[0]
            assert (v.status, v.rule, v.count) == (REJECTED, RULE_SPECIAL, None), (method, special)
            assert d.observed == () and d.next_token == 5
        plain = greedy([4, 2, 2, 2], lg, counts(), rule(method, **params))
        assert plain.verdicts[0].status == RELAXED, method       # the same token, not special: kept


# -- top-k (TensorRT-LLM) ---------------------------------------------------------------------------
def test_topk_needs_the_top_k_and_the_probability_gap():
    # probabilities about 0.5 (token 5), 0.3 (token 6), 0.2 (token 4): the draft's 4 is third (rank 2)
    lg = logits({5: math.log(0.5), 6: math.log(0.3), 4: math.log(0.2)}, {7: 10}, rest=NEG)
    assert decide([4], lg, rule("topk", topk=3, delta=0.5)).verdicts[0].status == RELAXED
    assert decide([4], lg, rule("topk", topk=2, delta=0.5)).verdicts[0].rule == RULE_NOT_RELAXED   # not in top 2
    assert decide([4], lg, rule("topk", topk=3, delta=0.2)).verdicts[0].rule == RULE_NOT_RELAXED   # 0.5 - 0.2 > 0.2
    assert decide([4], lg, rule("topk", topk=3, delta=0.31)).verdicts[0].status == RELAXED         # a gap of 0.3
    d = decide([4], lg, rule("topk", topk=3, delta=0.5))
    assert d.verdicts[0].target_rank == 2 and d.bonus and d.next_token == 7


def test_topk_at_k1_delta0_is_exact():
    lg = logits({5: 10, 4: 9.9}, {7: 10})
    assert decide([4], lg, rule("topk", topk=1, delta=0.0)).n_kept == 0
    assert topk_keeps(0, 0.5, 0.0, 1, 0.0)            # a tie with the top-1 has rank 0 and no gap


# -- typical acceptance (vLLM / Medusa) -------------------------------------------------------------
def test_typical_threshold_follows_the_entropy():
    # a flat row (7 tokens at 1/7, H ~ 1.95 nats): threshold = min(0.09, 0.3 e^-H) ~ 0.043 < 1/7 -> kept
    flat = {k: 0.0 for k in range(7)}
    flat[5] = 1e-3                                               # the top-1 is 5, by a hair
    d = decide([4], logits(flat, {7: 10}, rest=NEG), rule("typical"))
    assert d.verdicts[0].status == RELAXED and d.verdicts[0].entropy == pytest.approx(math.log(7), abs=1e-3)
    # a peaked row: p(4) ~ 0.05 < threshold 0.09 -> rejected
    peaked = logits({5: math.log(0.95), 4: math.log(0.05)}, {7: 10}, rest=NEG)
    assert decide([4], peaked, rule("typical")).verdicts[0].rule == RULE_NOT_RELAXED
    # the strict ">": p equal to the threshold is refused
    assert not typical_keeps(0.09, 0.0, 0.09, 0.3) and typical_keeps(0.0901, 0.0, 0.09, 0.3)


def test_typical_entropy_is_vllms_with_the_1e5_floor():
    lg = logits({5: 1.0, 4: 0.5, 3: 0.0}, {7: 10})
    _, s = score_block([4], lg, {ENTROPY})
    p = torch.softmax(lg[0], -1)
    assert s.entropy[0] == pytest.approx(float(-(p * torch.log(p + 1e-5)).sum()), rel=1e-5)


# -- FLy --------------------------------------------------------------------------------------------
def fly_block(mismatch_at, n=8, flat=True, second=None):
    """n draft tokens, all 2 except 4 at ``mismatch_at`` (and ``second``); the target wants 2 everywhere
    (5 at the mismatch); its row at the mismatch is flat over 5, 4 and 3 (high top-3 entropy) or peaked."""
    rows = []
    for i in range(n):
        if i == mismatch_at:
            rows.append({5: 1.0, 4: 0.9, 3: 0.8} if flat else {5: 10, 4: 0})
        elif i == second:
            rows.append({5: 10})                               # the target wants 5, the draft wrote 2
        else:
            rows.append({2: 10})
    rows.append({7: 10})
    drafts = [4 if i == mismatch_at else 2 for i in range(n)]
    return drafts, logits(*rows)


def test_fly_forgives_a_mismatch_followed_by_win_len_minus_one_matches():
    drafts, lg = fly_block(0)
    d = decide(drafts, lg, rule("fly", win_len=4))
    assert statuses(d) == [RELAXED] + [ACCEPTED] * 7 and d.bonus and d.next_token == 7
    assert d.verdicts[0].matches_after == 7 and d.verdicts[0].top3_entropy > 0.3


def test_fly_window_broken_by_a_second_mismatch():
    drafts, lg = fly_block(0, second=2)                     # position 2 mismatches inside the window of 4
    d = decide(drafts, lg, rule("fly", win_len=4))
    assert statuses(d) == [REJECTED] and d.verdicts[0].matches_after == 1 and d.next_token == 5
    assert decide(drafts, lg, rule("fly", win_len=2)).verdicts[0].status == RELAXED   # a window of 2 needs 1 match


def test_fly_never_forgives_in_the_last_win_len_positions():
    # a mismatch at 4 of 8 with win_len 4: positions 5..7 match, but 4 + 4 is not < 8
    drafts, lg = fly_block(4)
    d = decide(drafts, lg, rule("fly", win_len=4))
    assert statuses(d) == [ACCEPTED] * 4 + [REJECTED]
    drafts, lg = fly_block(3)                                # at 3: 3 + 4 < 8, forgiven
    assert decide(drafts, lg, rule("fly", win_len=4)).verdicts[3].status == RELAXED
    assert not fly_keeps(4, 8, 3, 1.0, 4, 0.3) and fly_keeps(3, 8, 4, 1.0, 4, 0.3)


def test_fly_entropy_gate_refuses_a_near_certain_target_unless_off():
    drafts, lg = fly_block(0, flat=False)                  # target sure of 5: top-3 entropy near 0
    d = decide(drafts, lg, rule("fly", win_len=4))
    assert statuses(d) == [REJECTED] and d.verdicts[0].top3_entropy < 0.01
    off = decide(drafts, lg, rule("fly", win_len=4, entropy_thre=0.01))   # <= 0.01: FLy's gate off
    assert off.verdicts[0].status == RELAXED and off.verdicts[0].top3_entropy is None   # not even computed


def test_fly_with_a_block_no_longer_than_its_window_is_sd():
    drafts, lg = fly_block(0, n=6)
    assert decide(drafts, lg, rule("fly", win_len=6)).n_kept == 0
    assert decide(drafts, lg, rule("fly", win_len=5)).n_kept == 6


def test_top3_entropy_with_minus_inf_logits_is_finite():
    # a row with two finite logits: the third of the top 3 has p = 0, and 0 log 0 = 0 (not NaN)
    _, s = score_block([4], logits({5: 0.0, 4: 0.0}, {7: 10}, rest=NEG), {TOP3_ENTROPY, RANK, ENTROPY})
    assert s.top3_entropy[0] == pytest.approx(math.log(2))
    assert s.rank == [0]                                         # a tie with the top-1: nothing strictly above


def test_matches_after_counts_the_run_of_matches():
    assert matches_after([1, 2, 3, 4], [9, 2, 3, 9]) == [2, 1, 0, 0]
    assert matches_after([], []) == []


# -- the scores and the what-if ---------------------------------------------------------------------
def test_score_block_carries_only_what_the_rule_reads():
    lg = logits({5: 10, 4: 9}, {2: 10}, {7: 10})
    _, plain = score_block([4, 2], lg)
    assert plain.rank == () and plain.entropy == () and plain.top3_entropy == ()
    _, every = score_block([4, 2], lg, ALL_SCORES)
    assert every.rank == [1, 0] and len(every.entropy) == len(every.top3_entropy) == 2
    assert (every.t_star, every.z_x) == (plain.t_star, plain.z_x)
    assert rule("lossy").scores == frozenset() and rule("topk").scores == {RANK}
    assert rule("typical").scores == {ENTROPY} and rule("fly").scores == {TOP3_ENTROPY}
    assert CSDConfig(method="csd", score_all=True).rule().scores == ALL_SCORES


def test_keeps_logged_is_the_rule_on_arrays():
    lossy = Rescue.of(False, False, 6, 0.01, relax=Relax("lossy"))
    gap = np.array([-0.1, -1.0, np.nan])
    assert lossy.keeps_logged(gap=gap).tolist() == [True, False, False]
    assert lossy.keeps_logged(gap=None) is False                 # not logged: never kept
    csd = Rescue.of(True, True, 6, 0.01)
    assert csd.keeps_logged(count=np.array([6, 5]), gap=np.array([-1.0, -1.0])).tolist() == [True, False]
    sd = Rescue.of(False, False, 6, 0.01)
    assert sd.keeps_logged(count=100, gap=0.0) is False


# -- configuration ----------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,needle", [
    ("tau_lossy", 0, "tau_lossy (the lossy rule's tau) must be in (0, 1]"),
    ("tau_lossy", 1.5, "must be in (0, 1]"),
    ("topk", 0, "topk (the topk rule's k) must be an integer >= 1"),
    ("topk", 2.5, "must be an integer >= 1"),
    ("delta", -0.1, "delta (the topk rule's probability gap) must be >= 0"),
    ("posterior_threshold", 0, "posterior_threshold (the typical rule's) must be in (0, 1]"),
    ("posterior_threshold", 1.01, "must be in (0, 1]"),
    ("posterior_alpha", 0, "posterior_alpha (the typical rule's alpha) must be > 0"),
    ("win_len", 1, "win_len (FLy's window) must be an integer in 2..32"),
    ("entropy_thre", -1, "entropy_thre (FLy's entropy gate) must be >= 0"),
    ("entropy_thre", float("nan"), "must be >= 0"),
])
def test_out_of_range_rival_parameters_are_refused(field, value, needle):
    with pytest.raises(ConfigError) as e:
        CSDConfig.of(method="topk", **{field: value}).validated()
    assert needle in str(e.value)


def test_rivals_are_greedy_only_and_record_their_parameters():
    for method in ("lossy", "topk", "typical", "fly"):
        with pytest.raises(ConfigError, match=f"{method} is a greedy rule here"):
            CSDConfig(method=method, temperature=0.7).validated()
    assert CSDConfig(method="topk").run_fields()["rule_params"] == {"topk": 15, "delta": 0.5}
    assert CSDConfig(method="csd").run_fields()["rule_params"] is None
    assert CSDConfig(method="sd").rule().relax is None and CSDConfig(method="fly").relax.params.win_len == 6


def test_the_config_holds_the_rivals_as_one_record_and_inherits_nothing():
    """One record of the rivals' parameters, held (not inherited) by the config and read by their rule; a flat
    name (the command line's, a sweep's) still reaches it."""
    from csd.rule import Rivals
    assert CSDConfig.__mro__[1:] == (object,) and not hasattr(CSDConfig(), "win_len")
    cfg = CSDConfig.of(method="fly", win_len=4, lam=3.0)
    assert cfg.rivals == Rivals(win_len=4) and cfg.lam == 3.0 and cfg.relax == Relax("fly", cfg.rivals)
    assert cfg.value("win_len") == 4 and cfg.updated(topk=3).rivals == Rivals(topk=3, win_len=4)


# -- in the decode loop, on tiny in-process models (float32) ----------------------------------------
STRICTEST = {     # each rule at its strictest: nothing but the target's own top-1 (ties aside) is kept
    "lossy": dict(tau_lossy=1.0),
    "topk": dict(topk=1, delta=0.0),
    "typical": dict(posterior_threshold=1.0, posterior_alpha=1e9),   # min(1, huge) = 1: p(x~) > 1 never holds
    "fly": dict(win_len=6, entropy_thre=0.3),                         # blocks of 4: no window fits
}


@pytest.fixture(scope="module")
def close_pair(qwen_tokenizer):
    from conftest import make_pair, perturbed, tiny_model
    target = tiny_model(2)
    return make_pair(qwen_tokenizer, target, perturbed(target, 0.05))


@pytest.fixture(scope="module")
def loose_pair(qwen_tokenizer):
    """A draft further from its target: divergences in most blocks."""
    from conftest import make_pair, perturbed, tiny_model
    target = tiny_model(2)
    return make_pair(qwen_tokenizer, target, perturbed(target, 0.3, seed=1))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def runs():
    from test_engine_tiny import ar_ids, run_all
    return run_all, ar_ids


@pytest.mark.parametrize("method", list(STRICTEST))
def test_each_rule_at_its_strictest_is_ar_token_for_token(close_pair, method):
    run_all, ar_ids = runs()
    run = run_all(close_pair, CSDConfig.of(method=method, gamma=4, max_new_tokens=48, **STRICTEST[method]))
    assert run.token_ids == ar_ids(close_pair, 48)
    assert not any(e.status == RELAXED for e in run.events) and run.metrics.relaxed == 0
    # one host transfer per block, the rule's scores included
    assert run.metrics.host_syncs == run.metrics.target_forwards


def test_fly_with_its_gate_above_any_top3_entropy_is_ar_even_with_windows(close_pair):
    # win_len 2 lets every window through, but no top-3 entropy reaches 10 nats (at most 3/e)
    run_all, ar_ids = runs()
    run = run_all(close_pair, CSDConfig.of(method="fly", gamma=8, win_len=2, entropy_thre=10.0, max_new_tokens=48))
    assert run.token_ids == ar_ids(close_pair, 48)


@pytest.mark.parametrize("method,params", [("lossy", dict(tau_lossy=0.01)), ("topk", dict(topk=8, delta=0.9)),
                                           ("typical", {}), ("fly", dict(win_len=2, entropy_thre=0.0))])
def test_relaxed_keeps_are_counted_logged_and_replayed_by_the_what_if(loose_pair, method, params):
    run_all, _ = runs()
    cfg = CSDConfig.of(method=method, gamma=6, max_new_tokens=60, **params)
    run = run_all(loose_pair, cfg)
    m, evs = run.metrics, run.events
    relaxed = [e for e in evs if e.status == RELAXED]
    assert relaxed, f"{method} should keep some divergent draft tokens here"
    assert m.relaxed == len(relaxed) and m.rescued == 0
    assert m.new_tokens == m.accepted + m.relaxed + m.target_forwards
    assert all(e.rule == RULE_RELAXED and e.in_output and e.is_divergence for e in relaxed)
    assert all(e.rule in (RULE_MATCH,) for e in evs if e.status == ACCEPTED)
    # the what-if over the logged values gives the loop's decision at every divergence
    r = cfg.rule(loose_pair.special_ids)
    for e in evs:
        if e.status in (RELAXED, REJECTED) and e.rule != RULE_SPECIAL:
            kept = r.keeps_logged(count=e.memory_count, gap=e.gap, p_x=e.target_prob, target_rank=e.target_rank,
                                  entropy=e.entropy, top3_entropy=e.top3_entropy, index=e.index_in_block,
                                  block_len=e.block_len, matches_after=e.matches_after)
            assert kept == (e.status == RELAXED), e
    assert m.host_syncs == m.target_forwards


def test_score_all_logs_every_rules_inputs_on_a_csd_run(loose_pair):
    run_all, ar_ids = runs()
    plain = run_all(loose_pair, CSDConfig(method="sd", gamma=4, max_new_tokens=24))
    scored = run_all(loose_pair, CSDConfig(method="sd", gamma=4, max_new_tokens=24, score_all=True))
    assert scored.token_ids == plain.token_ids == ar_ids(loose_pair, 24)     # scores change no decision
    drafted = [e for e in scored.events if e.draft_id is not None]
    assert drafted and all(e.target_rank is not None and e.entropy is not None and e.top3_entropy is not None
                           and e.matches_after is not None for e in drafted)
    assert all(e.target_rank is None and e.entropy is None for e in plain.events)
    assert scored.metrics.host_syncs == scored.metrics.target_forwards


# -- the command line and the benchmark (parsing only: no model is loaded) ----------------------------
def test_generate_help_lists_the_rivals_and_their_options(capsys):
    import csd.cli as cli
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for word in ("lossy", "topk", "typical", "fly", "--tau-lossy", "--topk", "--delta", "--posterior-threshold",
                 "--posterior-alpha", "--win-len", "--entropy-thre", "TensorRT-LLM", "vLLM"):
        assert word in out, word
    a = cli.build_parser().parse_args(["generate", "--prompt", "x", "--method", "fly", "--win-len", "4",
                                       "--entropy-thre", "0.1", "--gamma", "12"])
    assert (a.method, a.win_len, a.entropy_thre, a.topk, a.tau_lossy) == ("fly", 4, 0.1, 15, 0.6)


@pytest.mark.parametrize("argv,needle", [
    (["--method", "topk", "--topk", "0"], "topk (the topk rule's k) must be an integer >= 1, got 0"),
    (["--method", "lossy", "--tau-lossy", "1.5"], "tau_lossy (the lossy rule's tau) must be in (0, 1], got 1.5"),
    (["--method", "topk", "--delta", "-0.1"], "delta (the topk rule's probability gap) must be >= 0"),
    (["--method", "typical", "--posterior-threshold", "0"], "posterior_threshold (the typical rule's) must be in"),
    (["--method", "typical", "--posterior-alpha", "-1"], "posterior_alpha (the typical rule's alpha) must be > 0"),
    (["--method", "fly", "--win-len", "1"], "win_len (FLy's window) must be an integer in 2..32"),
    (["--method", "fly", "--entropy-thre", "-0.5"], "entropy_thre (FLy's entropy gate) must be >= 0"),
    (["--method", "lossy", "--temperature", "0.8"], "lossy is a greedy rule here"),
])
def test_generate_refuses_out_of_range_rival_parameters_before_any_model(no_models, capsys, argv, needle):
    import csd.cli as cli
    assert cli.main(["generate", "--prompt", "x", "--no-db", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_bench_takes_the_rivals_as_methods_and_sweeps(no_models, capsys):
    import csd.cli as cli
    from csd.bench.harness import BenchConfig
    from csd.bench.methods import parse_sweep, validate_methods
    from csd.cli.bench import bench_config
    assert validate_methods(["ar", "lossy", "topk", "typical", "fly"]) == ["ar", "lossy", "topk", "typical", "fly"]
    a = cli.build_parser().parse_args(["bench", "--methods", "sd,csd,lossy,fly", "--topk", "5", "--win-len", "4",
                                       "--sweep", "tau_lossy=0.4;topk=3,delta=0.2;method=fly,gamma=15"])
    config = bench_config(a, ["sd", "csd", "lossy", "fly"])
    assert config.rivals == {"topk": 5, "win_len": 4}                # only what differs from the defaults
    cols = {m.name: m.cfg for m in config.columns()}
    assert list(cols) == ["sd", "csd", "lossy", "fly", "lossy[tau_lossy=0.4]", "topk[topk=3,delta=0.2]",
                          "fly[gamma=15]"]
    assert cols["fly"].rivals.win_len == 4 and cols["fly[gamma=15]"].gamma == 15
    assert cols["topk[topk=3,delta=0.2]"].rivals.topk == 3
    assert cols["lossy[tau_lossy=0.4]"].relax.log_tau == pytest.approx(math.log(0.4))
    assert isinstance(config, BenchConfig)
    assert parse_sweep("posterior_threshold=0.05,posterior_alpha=0.2") == [
        {"posterior_threshold": 0.05, "posterior_alpha": 0.2, "method": "typical"}]
    for sweep, needle in (("topk=0", "topk (the topk rule's k) must be an integer >= 1"),
                          ("tau_lossy=0.5,win_len=4", "belong to fly and lossy: one method per setting"),
                          ("method=csd,entropy_thre=0.2", "entropy_thre: a parameter of fly, not of csd")):
        assert cli.main(["bench", "--methods", "sd", "--sweep", sweep, "--no-db"]) == 2
        assert needle in capsys.readouterr().err, sweep
    assert cli.main(["bench", "--methods", "lossy", "--tau-lossy", "0", "--no-db"]) == 2
    assert "tau_lossy (the lossy rule's tau) must be in (0, 1]" in capsys.readouterr().err
