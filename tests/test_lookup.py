"""Tokens copied from the context (csd.lookup): where they come from, when they are proposed, and
that the target's exact rule keeps greedy output unchanged (tiny in-process models, float32)."""
from __future__ import annotations

import pytest

from conftest import make_pair, perturbed, tiny_model
from csd.config import DEFAULT_LOOKUP, ConfigError, CSDConfig, default_lookup
from csd.costs import CostModel
from csd.decode import Decoder
from csd.events import ACCEPTED, RESCUED, RULE_MATCH, TokenEvent
from csd.lookup import Lookup
from csd.memory import CorrectionMemory

PROMPT = [3, 7, 1, 4]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def pair(qwen_tokenizer):
    target = tiny_model(2)
    return make_pair(qwen_tokenizer, target, perturbed(target, 0.05))


def costs(verify, draft_ms):
    return CostModel({k: verify(k) for k in (1, 2, 4, 8, 16, 33)}, draft_ms)


def run_all(pair, cfg, memory=None, costs=None):
    memory = CorrectionMemory(pair.pair_id) if memory is None else memory   # an empty memory is falsy
    run = Decoder(pair, costs=costs, online_costs=costs is None).run(PROMPT, cfg, memory)   # the stated costs alone
    list(run)
    return run


def test_continuation_of_the_latest_longest_match():
    lk = Lookup(8)
    assert lk.continuation([1, 2, 3, 4, 5, 6, 7, 1, 2, 3]) == [4, 5, 6, 7, 1, 2, 3]
    assert lk.continuation([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 9]) == []        # [3, 4, 9] never occurred before
    seq = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 9, 1, 2, 3]
    assert lk.continuation(seq) == [4, 9, 1, 2, 3]                               # the latest occurrence wins
    assert Lookup(2).continuation(seq) == [4, 9]                                 # at most max_len tokens
    # a 4-token match wins over a more recent 3-token one
    seq = [8, 1, 2, 3, 5, 0, 1, 2, 3, 6, 8, 1, 2, 3]
    assert Lookup(3).continuation(seq) == [5, 0, 1]
    assert Lookup(3, n_min=3).continuation([1, 2, 5, 1, 2]) == []                # two tokens are no match at n_min 3
    assert Lookup(3, n_min=2).continuation([1, 2, 5, 1, 2]) == [5, 1, 2]
    with pytest.raises(ValueError, match="n_min"):
        Lookup(3, n_min=9)


def test_choice_weighs_the_verify_cost_against_the_drafts_rate():
    flat = costs(lambda k: 100.0 if k <= 5 else 100.0 + 20 * (k - 5), 40.0)     # up to 5 tokens cost one pass
    lk = Lookup(16, flat)
    cand = list(range(16))
    chosen = lk.choose(cand)
    assert 1 <= len(chosen) <= 16 and chosen == cand[:len(chosen)]
    fast_draft = Lookup(16, costs(lambda k: 100.0 if k <= 5 else 100.0 + 20 * (k - 5), 5.0))
    for _ in range(20):                              # a cheap draft that keeps all 6 of its tokens: 7 per 170 ms
        fast_draft.observe_model(tokens=7, drafted=6)
    assert fast_draft.choose(cand) == []             # unproven copies do not beat that
    lk = Lookup(16, flat)
    for _ in range(20):                              # the draft makes 3 tokens per 3-token block (220 ms)
        lk.observe_model(tokens=3, drafted=3)
    assert lk.choose(cand)                           # copies at the prior's rate do
    for _ in range(50):                              # copies were always wrong: a pass for one token
        lk.observe_copies(16, 0)
    assert lk.choose(cand) == []
    lk = Lookup(16, flat)
    for _ in range(50):                              # copies were always right: as long as the costs say
        lk.observe_copies(16, 16)
    assert 5 <= len(lk.choose(cand)) <= 8            # past 5 tokens each one costs a fifth of a pass
    cheap = Lookup(16, costs(lambda k: 100.0 + k, 40.0))
    for _ in range(50):
        cheap.observe_copies(16, 16)
    assert len(cheap.choose(cand)) == 16             # a nearly flat pass: all of them
    assert Lookup(4).choose(cand) == cand            # no cost model: everything found
    assert Lookup(4).choose([]) == []


def test_one_of_many_runs_sharing_passes_copies_fewer_tokens():
    """Copies kept at a rate that falls from 0.85 to 0.13 along the block, on a CPU whose passes are compute-bound
    (20 ms of weights, 6.5 ms a row): a run alone copies several tokens a block; one of 8 runs that share every pass
    pays an eighth of the 20 ms and all of its rows (``CostModel.shared``), so it copies fewer; alone again, as many
    as before."""
    rows = costs(lambda k: 20.0 + 6.5 * k, 8.0)
    lk = Lookup(16, rows)
    for i in range(50):
        lk.observe_copies(16, i % 8)
    cand = list(range(16))
    alone = len(lk.choose(cand))
    lk.share(8)
    among = len(lk.choose(cand))
    assert alone >= 3 and among < alone
    lk.share(1)
    assert len(lk.choose(cand)) == alone


@pytest.mark.parametrize("method", ["sd", "csd"])
@pytest.mark.parametrize("gamma,ngram", [(4, 3), ("auto", 3), ("auto", 1)])
def test_copied_tokens_keep_greedy_output_and_are_never_rescued(pair, method, gamma, ngram):
    n = 80
    ref = run_all(pair, CSDConfig(method="ar", max_new_tokens=n)).token_ids
    # lam 0 with the widest gate: CSD would rescue any divergence of the draft's
    cfg = CSDConfig(method=method, gamma=gamma, lam=0, tau=1e-9, max_new_tokens=n, lookup=8, lookup_ngram=ngram)
    cheap = costs(lambda k: 100.0 + k, 40.0)
    run = run_all(pair, cfg, costs=cheap)
    if method == "sd":
        assert run.token_ids == ref                  # exact verification of copies: SD is still AR
    m = run.metrics
    copied = [e for e in run.events if e.source == "lookup"]
    assert m.lookup_blocks > 0 and copied, "the tiny model repeats itself, so copies should be proposed"
    assert all(e.status == ACCEPTED and e.rule == RULE_MATCH and e.draft_id == e.target_id for e in copied)
    assert len(copied) == m.lookup_kept <= m.lookup_drafted
    assert all(e.source is None for e in run.events if e.status == RESCUED)
    assert m.new_tokens == m.accepted + m.rescued + m.lookup_kept + m.target_forwards
    passes = [e for e in run.events if e.pass_end]
    assert len(passes) == m.target_forwards
    assert sum(e.block_len for e in passes) == m.drafted + m.lookup_drafted     # copies counted apart
    assert sum(m.per_position_drafted) <= m.drafted


def test_copies_do_not_teach_the_memory(pair):
    memory = CorrectionMemory(pair.pair_id)
    run = run_all(pair, CSDConfig(method="csd", gamma=4, max_new_tokens=80, lookup=8), memory)
    div = [e for e in run.events if e.status in ("rescued", "rejected")]
    assert all(e.source is None for e in div)
    assert memory.total == len(div)                  # one count per divergence of the draft, none from copies


def test_lookup_is_validated():
    with pytest.raises(ConfigError, match="not ar"):
        CSDConfig(method="ar", lookup=4).validated()
    assert CSDConfig(method="sd", lookup=4, temperature=0.7).validated()   # sampled copies: see test_decode_tiny
    for bad in (-1, 33, 2.5, True):
        with pytest.raises(ConfigError, match="lookup must be"):
            CSDConfig(lookup=bad).validated()
    assert CSDConfig(lookup=0, temperature=0.7).validated()
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ConfigError, match="lookup_ngram must be an integer in 1..4"):
            CSDConfig(lookup=8, lookup_ngram=bad).validated()


def test_the_store_keeps_the_source(tmp_path):
    from csd.db import analytics as A
    from csd.db.analytics import Filter
    from csd.db.store import Store

    ev = TokenEvent(position=0, token_id=5, text="x", status=ACCEPTED, block=0, index_in_block=0, draft_id=5,
                    target_id=5, rule=RULE_MATCH, source="lookup")
    with Store.open(f"sqlite:///{tmp_path / 's.sqlite3'}") as store:
        run_id = store.start_run(method="sd")
        with store.recorder(run_id) as rec:
            rec.add(ev)
        (row,) = A.events(store, Filter(run_ids=[run_id]), limit=None)
    assert row["source"] == "lookup"


def test_sweep_columns_with_copies():
    from csd.bench.methods import make_methods, parse_sweep

    cols = make_methods("sd,csd", CSDConfig(gamma="auto"),
                        sweep="method=sd,lookup=8;lookup=8;lam=2,lookup=8;lookup=8,lookup_ngram=2")
    assert [c.name for c in cols] == ["sd", "csd", "sd[lookup=8]", "csd[lookup=8]", "csd[lam=2,lookup=8]",
                                      "csd[lookup=8,lookup_ngram=2]"]
    assert cols[-1].cfg.lookup_ngram == 2 and cols[-2].cfg.lookup_ngram == 3
    by = {c.name: c.cfg for c in cols}
    assert by["sd[lookup=8]"].method == "sd" and by["sd[lookup=8]"].lookup == 8 and by["sd"].lookup == 0
    assert by["csd[lam=2,lookup=8]"].lam == 2 and by["csd[lam=2,lookup=8]"].gamma == "auto"
    for bad, needle in (("method=ar,lookup=8", "sd, csd or an ablation"), ("lookup=-3", "lookup must be"),
                        ("speed=9", "write lam=L"), ("lookup=8,lookup_ngram=7", "lookup_ngram must be"),
                        ("lookup=8,lookup_ngram=two", "invalid literal")):
        with pytest.raises(ValueError, match=needle):
            parse_sweep(bad)


def test_the_benchmark_copies_in_its_drafting_columns_only():
    """``bench --lookup N`` (default 16) gives the sd, csd and ablation columns copies; ar and the
    transformers columns never have any, and a sweep column can turn them off (the paper's method)."""
    from csd.bench.methods import make_methods
    from csd.cli import build_parser

    assert build_parser().parse_args(["bench"]).lookup == DEFAULT_LOOKUP == 16
    assert default_lookup("csd") == default_lookup("sd") == 16 and default_lookup("ar") == 0   # generate's default
    cols = make_methods("ar,sd,csd,ocm-only,hf-assisted,hf-assisted-fixed", CSDConfig(gamma="auto", lookup=16),
                        sweep="lookup=0;method=sd,lookup=0")
    by = {c.name: c.cfg.lookup for c in cols}
    assert by == {"ar": 0, "sd": 16, "csd": 16, "ocm-only": 16, "hf-assisted": 0, "hf-assisted-fixed": 0,
                  "csd[lookup=0]": 0, "sd[lookup=0]": 0}
    assert all(c.cfg.validated() for c in cols)


def test_the_app_marks_copied_tokens():
    from csd.ui.render import plain_sentence, render_tokens

    ev = TokenEvent(position=0, token_id=5, text="<b>", status=ACCEPTED, block=0, index_in_block=0, draft_id=5,
                    draft_text="<b>", target_id=5, target_text="<b>", rule=RULE_MATCH, source="lookup")
    html = render_tokens([ev, TokenEvent(**{**ev.to_dict(), "source": None})])
    assert html.count("copied") == 1 and "&lt;b&gt;" in html and "<b>" not in html
    assert plain_sentence(ev).startswith("Copied from earlier")


def test_position_rates_are_conditional_on_the_tokens_before():
    from csd.lookup import PRIOR

    lk = Lookup(16)
    for _ in range(30):
        lk.observe_copies(8, 2)                  # two kept, the third rejected, five never decided
    assert lk.rate(1) > 0.9 and lk.rate(2) > 0.9 and lk.rate(3) < 0.1
    assert lk.rate(4) == pytest.approx(lk.rate(3))    # an undecided position inherits the deepest decided one
    assert Lookup(16).rate(5) == pytest.approx(PRIOR[0])
    long = Lookup(16)
    for _ in range(30):
        long.observe_copies(2, 2)                # short proposals that were always kept ...
    assert long.rate(8) > 0.9             # ... make the longer ones worth trying


def test_the_report_counts_the_copies():
    from csd.bench.report import render_markdown

    stats = {"n": 2, "tokens_per_s": 10.0, "mean_accepted_length": 3.0, "acceptance_rate": 0.8,
             "lookup_blocks": 7, "lookup_drafted": 30, "lookup_kept": 21, "lookup_pass_share": 0.25,
             "lookup_acceptance": 0.7}
    results = {"meta": {"command": "x", "started_at": "t", "machine": {"cpu": "c", "torch_threads": 2, "torch": "t",
                                                                        "transformers": "t"},
                        "pair": {"draft": "d", "target": "t"}, "dtype": "int8",
                        "config": {"max_new_tokens": 9, "gamma": "auto", "seed": 0, "lam": 6, "memory_mode": "online"},
                        "memory": {"patterns": 1, "candidates_at_lambda": 0}},
               "summary": {"all": {"csd[lookup=16]": stats}}}
    md = render_markdown(results)
    assert "Copies from the context in `csd[lookup=16]`: 7 target passes (25% of its passes) verified 30 " \
           "copied tokens and kept 21 (70%)." in md
