"""The rivals in the app and the store, on the tiny in-process models of ``ui_fixtures``: Generate and
Teach run them with the bar's parameters, Compare shows any two or three methods side by side, Analyse
recolours the last answer under any rule without a model, the store and the exports carry the relaxed
status and the scores the what-if reads; bad parameters get the engine's message."""
from __future__ import annotations

import csv
import html
import re

import gradio as gr
import pytest
from ui_fixtures import Gate, tiny_services

from csd.db import analytics as A
from csd.events import ACCEPTED, REJECTED, RELAXED, RESCUED, RULE_NOT_RELAXED, RULE_RELAXED, STATUSES, TokenEvent
from csd.ui import render, rules
from csd.ui.state import RunSettings
from csd.ui.tabs import analyse, common, compare, explore, generate, teach

PROMPT = "Write about the cat on the mat and the dog in the park."


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from csd.db.store import Store
    s = Store.open(f"sqlite:///{tmp_path_factory.mktemp('ui-rivals') / 'ui.sqlite3'}")
    yield s
    s.close()


@pytest.fixture(scope="module")
def gate():
    return Gate()


@pytest.fixture(scope="module")
def services(store, gate):
    return tiny_services(store, gate=gate)


def gen(services, method, sess=None, max_new=24, temperature=0, **rivals):
    s = RunSettings(method=method, gamma=4, lam=6, log10_tau=-0.5, temperature=temperature, max_new_tokens=max_new,
                    seed=0, rivals=rivals)
    out = list(generate.generate(services, PROMPT, s, sess))
    return out[-1]


@pytest.fixture(scope="module")
def lossy_run(services):
    """A lossy run at tau 0.01: most divergences relaxed, some refused."""
    return gen(services, "lossy", tau_lossy=0.01)


def test_generate_runs_each_rival_and_logs_every_rules_scores(services, store):
    for method, params in (("lossy", dict(tau_lossy=0.01)), ("topk", dict(topk=20, delta=0.9)), ("typical", {}),
                           ("fly", dict(win_len=2, entropy_thre=0.0))):
        tokens, summary, metrics_html, metrics, whatif, status, sess = gen(services, method, **params)
        view = sess.last
        assert view.cfg.method == method and view.done and metrics["new_tokens"] == 24
        relaxed = [e for e in view.events if e.status == RELAXED]
        assert metrics["relaxed"] == len(relaxed) and metrics["rescued"] == 0
        assert tokens.count("tok-relaxed") == len(relaxed)
        if relaxed:
            assert f"{len(relaxed)} relaxed" in summary and "relaxed by the" in metrics_html
        drafted = [e for e in view.events if e.draft_id is not None and e.source is None]
        assert all(e.entropy is not None and e.target_rank is not None and e.top3_entropy is not None
                   for e in drafted)                   # Generate logs every rule's scores for the what-if
        run = store.get_run(view.run_id)
        assert run.method == method and run.rule_params == view.cfg.rule_params()
    assert sum(e.status == RELAXED for e in gen(services, "lossy", tau_lossy=0.01)[-1].last.events) > 0


def test_bad_rival_input_gets_the_engines_message_before_any_model_runs(services, gate):
    gate.arm(None)                                                # counts the target's passes from here
    with pytest.raises(gr.Error, match="greedy rule"):
        gen(services, "typical", temperature=0.7)
    with pytest.raises(gr.Error, match=re.escape("topk (the topk rule's k) must be an integer &gt;= 1")):
        gen(services, "topk", topk=0)
    with pytest.raises(gr.Error, match="topk must be a whole number"):
        gen(services, "topk", topk=2.5)
    with pytest.raises(gr.Error, match=re.escape("tau_lossy (the lossy rule's tau) must be in (0, 1]")):
        gen(services, "lossy", tau_lossy=1.5)
    with pytest.raises(gr.Error, match="win_len"):
        gen(services, "fly", win_len=1)
    assert gate.calls == 0                                        # no model ran for any of them


def test_relaxed_tokens_have_their_colour_legend_and_details(lossy_run):
    assert ".tok-relaxed {" in render.CSS and "tok-relaxed" in render.render_legend()
    assert html.escape(render.STATUS_STYLE[RELAXED][2]) in render.render_legend()
    tokens, *_, sess = lossy_run
    detail = html.unescape(re.search(r'class="tok tok-relaxed[^"]*"[^>]*data-detail="([^"]*)"', tokens).group(1))
    assert "kept by the run's relaxed rule, not by a memory: lossy SD: p(x~)/p(t*) =" in detail
    assert "τ = 0.01" in detail and 'data-nav="relaxed"' in tokens


def test_whatif_under_a_rival_matches_the_store_and_changes_no_model(services, lossy_run, store):
    sess = lossy_run[-1]
    view = sess.last
    strict = rules.whatif_rule("lossy", 6, 0.01, {"tau_lossy": 1.0})
    changed = render.changed_decisions(view.events, strict)
    n_relaxed = sum(e.status == RELAXED for e in view.events)
    assert changed == n_relaxed > 0                               # tau 1 keeps no divergence
    out = analyse.analyse(services, common.SCOPE_RUN, RunSettings(method="lossy", lam=6, log10_tau=-0.5,
                                                                     rivals={"tau_lossy": 1.0}), sess)
    heading, tokens, summary = out[5], out[6], out[4]
    assert "Last answer under lossy SD at τ = 1" in heading and tokens.count("wi-reject") == n_relaxed
    assert "Under **lossy SD at τ = 1**" in summary and "would keep **0**" in summary
    # the same rule over the store: the run's divergences it keeps, as the answer's what-if counts them
    for method, params in (("typical", {}), ("topk", {"topk": 3, "delta": 0.2}), ("fly", {"win_len": 2}),
                           ("csd", {}), ("sd", {})):
        r = rules.whatif_rule(method, 6, 0.3, params)
        want = sum(1 for e in view.events if rules.would_keep(e, r))
        got = A.what_if_rule(store, r, A.Filter(run_ids=(view.run_id,)))
        assert got.rescued == want and got.total == sum(e.is_divergence for e in view.events), method
        assert A.unscored(store, r, A.Filter(run_ids=(view.run_id,))) == 0
    # the CSD what-if of the sliders on a rival's answer: relaxed tokens CSD would refuse are outlined
    csd_tokens = analyse.analyse(services, common.SCOPE_RUN, RunSettings(lam=64), sess)[6]
    assert csd_tokens.count("wi-reject") == n_relaxed             # lambda 64: no pattern is known that often


def cmp_settings(panes, **rivals):
    return RunSettings(gamma=4, lam=6, log10_tau=-0.5, max_new_tokens=12, panes=panes, rivals=rivals)


def test_compare_shows_any_two_or_three_methods(services):
    sess = common.ensure_session(services, None)
    outs = list(compare.compare(services, "the cat sat", cmp_settings(("sd", "lossy", compare.NONE), tau_lossy=0.01),
                                sess))
    *panes, cap1, cap2, cap3, fig, note, status, sess = outs[-1]
    assert cap1.startswith("**SD**:") and cap2.startswith("**LOSSY**:") and cap3 == "*(no method)*"
    assert "same tokens as SD" in cap2 or "departs from SD" in cap2       # compared with the first pane
    assert "no method picked" in panes[2] and 'data-csd-view="pane-csd"' in panes[2]
    assert list(fig.data[0].x) == ["sd", "lossy"] and "Done: 2 of 2 methods ran" in status
    assert sess.last.cfg.method == "lossy"
    outs = list(compare.compare(services, "the cat sat", cmp_settings(("ar", "typical", "fly"), win_len=2), sess))
    *panes, cap1, cap2, cap3, fig, note, status, sess = outs[-1]
    assert [c.split(":")[0] for c in (cap1, cap2, cap3)] == ["**AR**", "**TYPICAL**", "**FLY**"]
    assert "**TYPICAL** used" in note and "Done: 3 of 3 methods ran" in status
    for picked, needle in ((("csd", "csd", "sd"), "Pick each method once"),
                           (("csd", compare.NONE, compare.NONE), "Pick two or three methods"),
                           (("csd", "fast", "sd"), "unknown method 'fast'")):
        with pytest.raises(gr.Error, match=needle):
            list(compare.compare(services, "the cat", RunSettings(gamma=4, max_new_tokens=4, panes=picked), sess))


def test_teach_steps_through_a_rivals_decisions(services):
    sess = common.ensure_session(services, None)
    *_, (view, status, sess) = teach.teach_run(services, PROMPT, RunSettings(method="topk", gamma=4, max_new_tokens=24,
                                                                      rivals={"topk": 20, "delta": 0.9}), sess)
    assert "Done:" in status and "top-k at k = 20, δ = 0.9" in view and sess.teach.cfg.relax.params.topk == 20
    events = sess.teach.events
    decided = [e for e in events if e.rule in (RULE_RELAXED, RULE_NOT_RELAXED)]
    assert decided
    for e in decided:
        why = render.plain_sentence(e, 6, 0.01, method="topk", relax=sess.teach.cfg.relax)
        assert "top-k: x~ is the target's #" in why and ("relaxed rule" in why)
    steps = [html.unescape(teach.teach_view(services, sess, i)) for i in range(len(teach._blocks(events)))]
    assert any("relaxed rule" in v and "top-k: x~ is the target's #" in v for v in steps)   # Teach's why column


def test_explore_filters_and_exports_relaxed_events(services, lossy_run):
    sess = lossy_run[-1]
    rows, caption, *_ = explore.explore_events(services, common.SCOPE_RUN, 0, [RELAXED], "any", "", "any", sess)
    assert rows and all(r[3].startswith(RELAXED) for r in rows)
    button, _ = explore.export_events_csv(services, common.SCOPE_RUN, 0, list(STATUSES), "any", "", "any", sess)
    with open(button["value"], newline="") as fh:
        exported = list(csv.DictReader(fh))
    assert {RELAXED, ACCEPTED} <= {r["status"] for r in exported}
    assert {"target_rank", "entropy", "top3_entropy", "matches_after"} <= set(exported[0])
    assert all(r["entropy"] for r in exported if r["status"] == RELAXED)
    pos = A.acceptance_by_position(services.store, A.Filter(run_ids=(sess.last.run_id,)))["lossy"]
    kept = sum(e.status in (ACCEPTED, RELAXED) and e.draft_id is not None for e in sess.last.events)
    assert sum(p.kept for p in pos) == kept                         # relaxed tokens count as kept


def test_what_if_of_a_relaxed_event_without_scores_is_unknown():
    e = TokenEvent(position=0, token_id=1, text="x", status=RELAXED, block=0, index_in_block=0, draft_id=1,
                   target_id=2, gap=-0.5, memory_count=3, rule=RULE_RELAXED, target_prob=0.3)
    assert rules.would_keep(e, rules.whatif_rule("lossy", 6, 0.01)) is True
    assert rules.would_keep(e, rules.whatif_rule("typical", 6, 0.01)) is None         # no entropy logged
    assert rules.would_keep(e, (6, 0.01)) is False and render.whatif_class(e, 6, 0.01) == render.WHATIF_REJECT
    assert rules.would_keep(e, (3, 0.01)) is True
    rejected = TokenEvent(position=0, token_id=1, text="x", status=REJECTED, block=0, index_in_block=0, draft_id=1,
                          target_id=2, gap=-0.1, memory_count=0, rule=RULE_NOT_RELAXED)
    assert render.whatif_class(rejected, rules.whatif_rule("lossy", 6, 0.01)) == render.WHATIF_RESCUE
    assert render.whatif_class(rejected, rules.whatif_rule("sd", 6, 0.01)) is None
    assert "would be kept" in render.whatif_summary([e, rejected], rules.whatif_rule("typical", 6, 0.01))
    assert "2 lack a score this rule reads" in render.whatif_summary([e, rejected],
                                                                    rules.whatif_rule("typical", 6, 0.01))
    assert RESCUED in STATUSES and RELAXED in STATUSES
