"""The app's handlers, renderers and figure builders as plain functions: no browser, no server.

Pure pieces (escaping, colour classes, details, what-if, figures) use hand-made events; the
handlers run the real engine on tiny in-process models (``ui_fixtures``: a target and a
perturbed copy as draft, over a 32-piece tokenizer) and a real SQLite store. The gate of
``ui_fixtures`` holds the engine inside a chosen forward pass, so Stop can be pressed during the
prefill, and a job can wait behind another, without any timing assumption.
"""
from __future__ import annotations

import csv
import html
import json
import math
import re
import threading
from pathlib import Path

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest
from ui_fixtures import IM_END, XSS, Gate, tiny_services

from csd import rule
from csd.config import ConfigError
from csd.events import (
    ACCEPTED,
    BONUS,
    CORRECTED,
    REJECTED,
    RESCUED,
    RULE_GAP_LOW,
    RULE_MEMORY_RARE,
    RULE_NO_RESCUE,
    RULE_RESCUE,
    RULE_SPECIAL,
    STATUSES,
    TARGET,
    RunMetrics,
    TokenEvent,
)
from csd.memory import CorrectionMemory
from ui import export, figures, render
from ui.lane import Lane
from ui.state import Session
from ui.tabs import analyse, common, compare, explore, generate, jobs, teach

PROMPT = "Write about the cat on the mat and the dog in the park."
ROOT = Path(__file__).resolve().parents[1]


def ev(status, text="x", pos=0, count=None, gap=None, **kw) -> TokenEvent:
    div = status in (RESCUED, REJECTED)
    kw.setdefault("rule", {RESCUED: RULE_RESCUE, REJECTED: RULE_MEMORY_RARE}.get(status))
    return TokenEvent(position=pos, token_id=1, text=text, status=status, block=kw.pop("block", 0),
                      index_in_block=pos, draft_id=1 if div or status == ACCEPTED else None,
                      draft_text=kw.pop("draft_text", text), target_id=2 if div else 1,
                      target_text=kw.pop("target_text", "y" if div else text),
                      gap=gap if gap is not None else (0.0 if status == ACCEPTED else None), memory_count=count, **kw)


def spans(html_text: str) -> list[str]:
    return re.findall(r'<span class="(tok [^"]*)"', html_text)


# -- escaping, colours, marks ----------------------------------------------------------------------
def test_token_text_details_and_prompt_are_escaped():
    e = ev(REJECTED, text=XSS, count=3, gap=-1.0, draft_text='"><script>alert(2)</script>')
    out = render.render_tokens([e], lam=6, tau=0.01, prompt=XSS)
    assert "<img" not in out and "<script" not in out
    assert "&lt;img src=x onerror=alert(1)&gt;" in out
    # the details are an attribute: its quotes are escaped, so it cannot close the attribute
    detail = re.search(r'data-detail="([^"]*)"', out).group(1)
    assert "&quot;&gt;&lt;script&gt;" in detail


@pytest.mark.parametrize("status,cls", [(ACCEPTED, "tok-accepted"), (RESCUED, "tok-rescued"),
                                        (REJECTED, "tok-rejected"), (CORRECTED, "tok-corrected"),
                                        (BONUS, "tok-bonus"), (TARGET, "tok-target")])
def test_each_status_has_its_class_and_a_legend_sentence(status, cls):
    out = render.render_tokens([ev(status, count=1, gap=-1.0)], lam=6, tau=0.01)
    assert spans(out)[0].split()[1] == cls
    assert f".{cls} {{" in render.CSS
    legend = render.render_legend()
    sentence = render.STATUS_STYLE[status][2]
    assert html.escape(sentence) in legend and len(sentence.split()) >= 6   # a plain sentence, not a word


def _rule(selector: str) -> str:
    m = re.search(re.escape(selector) + r" \{([^}]*)\}", render.CSS)
    assert m, selector
    return m.group(1)


def test_marks_differ_by_more_than_colour():
    """Colour-blind safe: bonus vs correction, and the two what-if outlines, differ in line style
    or glyph, not only in hue; a rescue carries a box and a star."""
    def shape(decl: str) -> set[str]:
        return {w for w in ("dotted", "dashed", "double", "solid", "inset", "line-through", "wavy") if w in decl}
    assert shape(_rule(".tok-bonus")) != shape(_rule(".tok-corrected"))
    assert _rule(".tok-bonus::after") and "+" in _rule(".tok-bonus::after")
    assert shape(_rule(".tok.wi-rescue")) == {"dashed"} and shape(_rule(".tok.wi-reject")) == {"double"}
    assert "outline" in _rule(".tok-rescued") and "★" in _rule(".tok-rescued::after")
    legend = render.render_legend(diff=True)
    for words in ("dashed box", "double box", "dotted underline", "solid underline", "wavy"):
        assert words in legend


def test_legends_of_generate_compare_and_analyse():
    gen, cmp_ = render.render_legend(), render.render_legend(whatif=False, diff=True)
    assert "would be rescued" in gen and "departs" not in gen
    assert "departs" in cmp_ and "would be rescued" not in cmp_
    for status in STATUSES:
        assert render.STATUS_STYLE[status][0] in gen and render.STATUS_STYLE[status][0] in cmp_


def test_special_tokens_are_markers_and_bytes_never_a_question_mark():
    end = ev(ACCEPTED, text="<|im_end|>", pos=3, special=True)
    part = ev(ACCEPTED, text="", pos=1)                 # a token ending inside a character
    whole = ev(ACCEPTED, text="é", pos=2)               # the next one carries the character
    lone = ev(REJECTED, text="\ufffd", pos=4, count=0, gap=-3.0)   # a rejected byte token, peeked alone
    out = render.render_tokens([part, whole, end, lone])
    assert "im_end" not in out.split("data-detail")[0] and "⟨end of turn⟩</span>" in out
    assert "tok-special" in out and "\ufffd" not in out and ">?<" not in out
    assert "⟨byte⟩" in out and ">é</span>" in out
    assert 'class="tok tok-accepted partial"' in out
    assert "not answer text" in render.token_detail(end)


def test_hide_rejected_is_a_class_on_the_container():
    out = render.render_tokens([ev(REJECTED, count=0, gap=-1.0)], hide_rejected=True)
    assert 'class="csd-tokens csd-hide-rejected"' in out
    assert ".csd-hide-rejected .tok-rejected" in render.CSS


def test_renderer_takes_events_only():
    with pytest.raises(TypeError, match="TokenEvent"):
        render.render_tokens([ev(ACCEPTED).to_dict()])


def test_plain_first_line_of_each_decision():
    rescued = ev(RESCUED, draft_text=" nature", target_text=" the", count=9, gap=-1.2)
    first = render.token_detail(rescued, 6, 0.01).splitlines()[0]
    assert first.startswith("The draft wrote ␣nature, the target preferred ␣the; kept because")
    assert "9 times (at least λ = 6)" in first and "log τ = −4.61" in first
    rare = ev(REJECTED, count=2, gap=-0.1, rule=RULE_MEMORY_RARE, discarded=[5, 6])
    assert "2 times, fewer than λ = 6" in render.plain_sentence(rare, 6, 0.01, 2)
    assert "2 later draft tokens were discarded" in render.token_detail(rare, 6, 0.01).splitlines()[0]
    low = ev(REJECTED, count=9, gap=-8.0, rule=RULE_GAP_LOW)
    assert "too unlikely" in render.plain_sentence(low, 6, 0.01)
    assert "never rescued" in render.plain_sentence(ev(REJECTED, rule=RULE_SPECIAL), 6, 0.01)
    assert "has no rescue" in render.plain_sentence(ev(REJECTED, rule=RULE_NO_RESCUE))
    assert render.plain_sentence(ev(BONUS, text=" a")).startswith("A free token")
    assert render.plain_sentence(ev(CORRECTED, text=" a")).startswith("The target's own token")


# -- the rule: one implementation ------------------------------------------------------------------
def test_what_if_is_csd_rule_rescues():
    assert render.log_tau is rule.log_tau and render.rescues is rule.rescues
    counts, gaps = np.arange(0, 12), np.linspace(-9, 0, 12)
    for lam in (0, 3, 6, 11):
        for tau in (1e-4, 0.01, 0.5, 1.0):
            want = rule.rescues(counts, gaps, lam, rule.log_tau(tau))
            got = [render.would_rescue(ev(REJECTED, count=int(c), gap=float(g)), lam, tau) for c, g in zip(counts, gaps)]
            assert got == list(want)
    assert render.would_rescue(ev(ACCEPTED), 0, 1e-4) is None
    assert render.would_rescue(ev(REJECTED, count=None, gap=-1.0), 0, 1e-4) is None
    assert render.would_rescue(ev(REJECTED, count=50, gap=0.0, rule=RULE_SPECIAL), 0, 1e-4) is None
    for module in (render, teach):       # the Teach view explains the rule: it uses it too
        assert not re.search(r"math\.log\(|def log_tau|>= lam", Path(module.__file__).read_text())
    assert not re.search(r"math\.log\(tau|def log_tau|c >= lam", Path(figures.__file__).read_text())


def test_whatif_recolouring_marks_changed_decisions_only():
    events = [ev(ACCEPTED, pos=0), ev(RESCUED, pos=1, count=9, gap=-0.5), ev(REJECTED, pos=2, count=2, gap=-0.2),
              ev(CORRECTED, pos=2), ev(REJECTED, pos=3, count=9, gap=-8.0)]
    same = render.render_tokens(events, whatif=(6, 0.01))
    assert "wi-rescue" not in same and "wi-reject" not in same
    assert "outlined" not in render.whatif_summary(events, 6, 0.01)       # nothing changed: no outline sentence
    low_lam = render.render_tokens(events, whatif=(2, 0.01))
    assert low_lam.count("wi-rescue") == 1 and "wi-reject" not in low_lam
    assert "1 changed decision is outlined" in render.whatif_summary(events, 2, 0.01)
    tau_one = render.render_tokens(events, whatif=(0, 1.0))
    assert tau_one.count("wi-reject") == 1 and "wi-rescue" not in tau_one
    assert "3 of 3 divergences" in render.whatif_summary(events, 0, 1e-4)


def test_run_summary_lists_the_rescues_with_links():
    events = [ev(ACCEPTED), ev(RESCUED, pos=1, draft_text=" a", target_text=" the", count=9, gap=-1.0),
              ev(REJECTED, pos=2, count=0, gap=-1.0), ev(CORRECTED, pos=2)]
    out = render.run_summary(events)
    assert "<b>1 rescued:</b>" in out and 'data-goto="1"' in out and "␣a kept over ␣the (token 1)" in out
    assert "1 draft token rejected" in out
    assert render.run_summary([ev(ACCEPTED)]).count("0 rescued") == 1
    nav = render.render_tokens(events)
    assert 'data-nav="rescued"' in nav and 'data-nav="rejected"' in nav and "1 rescued · 1 rejected" in nav


def test_accepted_and_rescued_shares_are_shown_apart():
    m = RunMetrics(new_tokens=12, target_forwards=3, drafted=10, accepted=9, rescued=1, wall_s=2.0)
    out = export.render_metrics(m, method="csd")
    assert ">90%<" in out and ">10%<" in out and "100%" not in out
    assert "target passes (9 fewer than AR)" in out


def test_long_prompts_are_folded():
    out = render.render_tokens([ev(ACCEPTED)], prompt="word " * 400)
    assert "<details" in out and "2,000 characters" in out
    assert "<details" not in render.render_tokens([ev(ACCEPTED)], prompt="short")


def test_teach_shows_discarded_draft_tokens_and_scrolls():
    block = [ev(ACCEPTED, pos=0, block_len=4),
             ev(REJECTED, pos=1, count=0, gap=-2.0, discarded=[7, 8], block_len=4), ev(CORRECTED, pos=1, block_len=4)]
    out = teach.render_teach_step(block, step=0, n_steps=1, text_before="", lam=6, tau=0.01, method="csd",
                                  discarded_texts=[" ran", " to"])
    assert out.count("tok-discarded") == 4            # two chips in the drafted block, two table rows
    assert 'class="discarded"' in out and "Never checked" in out
    assert "the draft proposed 4 tokens" in out and "2 discarded unchecked" in out
    assert '<div class="csd-scroll"><table>' in out and "overflow-x: auto" in _rule(".csd-scroll")
    # t* in the explanation is a literal star: Markdown must not read it as emphasis
    assert not re.search(r"(?<!\\)\*ᵢ", teach.TEACH_EXPLANATION)


def test_no_silent_exception_handlers_in_ui():
    for path in (ROOT / "ui").rglob("*.py"):
        src = path.read_text()
        assert not re.search(r"except[^\n]*:\s*\n\s*pass\b", src), path
        assert "logging.getLogger(__name__)" in src or "except" not in src, path


# -- figures ---------------------------------------------------------------------------------------
def test_pareto_figure_readable():
    rows = [dict(draft_id=i, target_id=i + 100, draft_text=f" w{i}", target_text=XSS, count=c,
                 example_context="ctx <b>") for i, c in enumerate([5, 4, 3, 3, 2, 2, 1, 1, 1, 1])]
    fig = figures.make_pareto_figure(rows)
    assert [t.type for t in fig.data] == ["bar", "scatter"]
    assert fig.data[1].y[-1] == pytest.approx(1.0)
    assert "(2 of 10) = 39%" in fig.layout.title.subtitle.text            # csd.rule.top_share: 9 of 23
    assert all("<img" not in h for h in fig.data[0].hovertext)
    # the legend sits above the plot, away from the slanted labels; counts are whole numbers
    assert fig.layout.legend.y >= 1 and fig.layout.legend.yanchor == "bottom" and not fig.layout.annotations
    assert fig.layout.yaxis.tickformat == "d" and fig.layout.yaxis.dtick == 1
    assert figures.make_pareto_figure([]).layout.annotations[0].text.startswith("No divergences")


def test_gap_figure_uses_the_rule():
    gaps, counts = [-0.1, -0.5, -3.0, -6.0, -9.0], [10, 1, 10, 10, 0]
    fig = figures.make_gap_figure(gaps, counts, lam=6, tau=0.01)
    assert sorted(fig.data[0].x) == [-6.0, -3.0, -0.1] and sorted(fig.data[1].x) == [-9.0, -0.5]
    kinds = {s.type: s for s in fig.layout.shapes}
    assert kinds["line"].x0 == pytest.approx(math.log(0.01))
    assert "2 of 5" in fig.layout.annotations[0].text


def test_position_and_whatif_figures():
    fig = figures.make_position_figure({"sd": [dict(index_in_block=0, kept=9, decided=10)], "ar": []})
    assert [t.name for t in fig.data] == ["sd"] and list(fig.data[0].y) == [0.9]
    rate = np.array([[1.0, 0.9, 0.0], [0.5, 0.4, 0.0], [0.1, 0.1, 0.0]])
    fig = figures.make_whatif_figure([0, 6, 12], [1e-4, 1e-2, 1.0], rate, lam=6, tau=0.01, total=20)
    assert [t.type for t in fig.data] == ["heatmap", "scatter"] and fig.data[1].y[0] == 6


def test_compare_figure_leads_with_target_passes():
    res = {m: RunMetrics(new_tokens=16, target_forwards=f, wall_s=w) for m, f, w in
           [("ar", 16, 4.0), ("sd", 5, 3.0), ("csd", 4, 2.5)]}
    fig = figures.make_compare_figure(res)
    assert fig.layout.annotations[0].text == "target passes" and list(fig.data[0].y) == [16, 5, 4]
    assert isinstance(figures.make_compare_figure({}), go.Figure)


# -- inputs --------------------------------------------------------------------------------------
def test_make_config_converts_and_validates():
    cfg = common.make_config("csd", 6.0, 3.0, -2.0, 0.0, 16.0, 0.0)
    assert (cfg.gamma, cfg.lam, cfg.max_new_tokens, cfg.seed) == (6, 3.0, 16, 0)
    assert common.make_config("csd", 6, 6, -2, 0, 16, auto_gamma=True).gamma == "auto"
    for args, msg in [(("csd", 40, 6, -2, 0, 16), "gamma"), (("csd", 6, 6, 0.5, 0, 16), "tau"),
                      (("csd", 2.5, 6, -2, 0, 16), "whole number"), (("fast", 6, 6, -2, 0, 16), "method"),
                      (("csd", 6, -1, -2, 0, 16), "lambda")]:
        with pytest.raises(ConfigError, match=msg):
            common.make_config(*args)


def test_pattern_parsing_and_escaped_errors():
    assert explore.parse_pattern("any") is None and explore.parse_pattern("12:34") == (12, 34)
    with pytest.raises(gr.Error) as err:
        explore.parse_pattern(XSS)
    assert "<img" not in err.value.message and "&lt;img src=x onerror=alert(1)&gt;" in err.value.message


def test_departures_mark_replaced_and_inserted_positions():
    assert compare.departures([1, 2, 3, 4], [1, 2, 3, 4]) == set()
    assert compare.departures([1, 2, 3, 4], [1, 9, 3, 4]) == {1}
    assert compare.departures([1, 2, 3], [1, 2, 7, 8, 3]) == {2, 3}


def test_compare_caption_says_where_csd_leaves_sd():
    from csd.config import CSDConfig
    from csd.events import ACCEPTED, BONUS, RESCUED
    from ui.state import RunView

    def view(method, events):
        kept = [e for e in events if e.status != "rejected"]
        return RunView(None, "p", True, CSDConfig(method=method), events=events, done=True,
                       metrics=RunMetrics(new_tokens=len(kept), target_forwards=1, wall_s=1.0),
                       token_ids=[e.token_id for e in kept])

    sd = view("sd", [TokenEvent(0, 5, "```", ACCEPTED, 0, 0), TokenEvent(1, 6, "def", BONUS, 0, 1)])
    csd = view("csd", [TokenEvent(0, 5, "```", ACCEPTED, 0, 0),
                       TokenEvent(1, 7, XSS, RESCUED, 0, 1, draft_id=7, target_id=6, target_text="def", memory_count=68)])
    cap = compare._compare_caption("csd", csd, None, None, sd)
    assert "leaves SD's answer at token 1" in cap and "<code>def</code>" in cap and "seen this divergence 68 times" in cap
    assert "<img" not in cap and "&lt;img src=x onerror=alert(1)&gt;" in cap          # token text escaped
    assert "same tokens as SD" in compare._compare_caption("csd", sd, None, None, sd)
    short = view("csd", sd.events[:1])
    assert "where CSD ended" in compare._compare_caption("csd", short, None, None, sd)
    sd_cap = compare._compare_caption("sd", sd, None, None, sd)                             # only CSD's caption says it
    assert "same tokens as SD" not in sd_cap and "leaves SD" not in sd_cap


def test_lane_orders_requests_and_forgets_abandoned_ones():
    lane = Lane(stale_s=30)
    a, b, c = lane.request("s1", "generate"), lane.request("s2", "generate"), lane.request("s3", "compare")
    lane.start(a)
    assert lane.ahead(c) == [a, b]
    b.seen_at -= 60                                  # its page stopped asking: a closed tab
    assert lane.ahead(c) == [a]
    lane.finish(a, "done")
    assert lane.ahead(c) == [] and a.summary == "done" and a.finished
    lane.drop_session("s3")
    assert c.cancel and len(lane) == 1


# -- handlers on the tiny pair ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from db.store import Store
    s = Store.open(f"sqlite:///{tmp_path_factory.mktemp('ui-handlers') / 'ui.sqlite3'}")
    yield s
    s.close()


@pytest.fixture(scope="module")
def gate():
    return Gate()


@pytest.fixture(scope="module")
def services(store, gate):
    return tiny_services(store, gate=gate)


def gen(services, sess=None, prompt=PROMPT, method="csd", gamma=4, auto=False, lam=6, log10_tau=-0.5, max_new=24,
        lookup=False, temperature=0, show_spec=False):
    return generate.generate(services, prompt, True, method, gamma, auto, lam, log10_tau, temperature, max_new, 0, False,
                             lookup, show_spec, sess)


@pytest.fixture(scope="module")
def csd_run(services):
    """One streamed CSD generation (tau = 0.32: some divergences rescued, some rejected)."""
    return list(gen(services))


def test_generate_streams_one_burst_per_verify_pass(csd_run):
    *streamed, final = csd_run
    sess = final[-1]
    view = sess.last
    assert view.done and view.metrics.new_tokens == 24
    passes = [i for i, e in enumerate(view.events) if e.pass_end]
    assert len(passes) == view.metrics.target_forwards >= 3
    first, per_pass = streamed[0], streamed[1:]
    assert "Reading the prompt" in first[0] and spans(first[0]) == []
    assert len(per_pass) == len(passes)                  # one page update per target pass, none in between
    for n, (out, end) in enumerate(zip(per_pass, passes)):
        tokens_html = out[0]
        assert len(spans(tokens_html)) == end + 1        # every event of the pass, and none of the next one
        assert tokens_html.count("data-pass-end") == n + 1
        assert f"Verify pass {n + 1}:" in out[4]          # the page says which pass it was


def test_generate_keeps_metrics_typed_and_records_the_run(csd_run, store):
    tokens, summary, metrics_html, metrics_json, whatif, status, sess = csd_run[-1]
    assert isinstance(sess.last.metrics, RunMetrics) and isinstance(metrics_json, dict)
    assert metrics_json["new_tokens"] == 24 and metrics_json["accepted_share"] == sess.last.metrics.accepted_share
    assert 'data-state="done"' in metrics_html and "Done: 24 tokens" in status
    assert whatif.startswith("At λ = 6")
    run = store.get_run(sess.last.run_id)
    assert run.status == "finished" and run.target_repr == "float32" and run.output_text == sess.last.text
    from db import analytics as A
    assert A.count_events(store, A.Filter(run_ids=(run.id,))) == len(sess.last.events)


def test_a_failing_store_costs_a_warning_not_the_run(services, monkeypatch):
    class Broken:
        def record(self, **fields):
            raise RuntimeError("disk full")
    monkeypatch.setattr(services, "store", Broken())
    with pytest.warns(UserWarning, match="not recorded: disk full"):
        *_, final = gen(services, max_new=6)
    assert final[-1].last.done and final[-1].last.metrics.new_tokens == 6 and final[-1].last.run_id is None


def test_stop_ends_a_running_generation_and_keeps_what_it_made(services):
    sess = common.ensure_session(services, None)
    it = gen(services, sess, max_new=60)
    next(it), next(it)                                    # the first pass is on the page
    assert 'data-state="stopping"' in jobs.stop(services, "generate", sess)
    *_, final = it
    m = final[-1].last.metrics
    assert m.stopped_by == "cancelled" and 1 <= m.new_tokens < 60
    assert "Stopped:" in final[5]


def test_stop_while_queued_cancels_that_request_only(services, gate, store):
    sess, _, timer = jobs.request_job(services, "generate", None)      # the click, answered at once
    assert timer.active
    jobs.stop(services, "generate", sess)                             # Stop before the queue reached it
    gate.arm(None)
    outs = list(gen(services, sess))
    assert len(outs) == 1 and "Stopped before it started" in outs[0][5]
    assert gate.calls == 0 and sess.last is None                   # the model never ran for it
    # a later request is a new job: the old Stop does not reach it
    *_, final = gen(services, sess, max_new=4)
    assert final[-1].last.metrics.stopped_by == "max_new_tokens"


def test_stop_during_prefill(services, gate):
    """A prompt of several prefill chunks; Stop while the first chunk is held: the run ends before
    the next chunk, with no token made."""
    sess = common.ensure_session(services, None)
    gate.arm(1)
    outs = []
    t = threading.Thread(target=lambda: outs.extend(gen(services, sess, prompt="q" * 200, max_new=16)))
    t.start()
    try:
        assert gate.reached.wait(60)
        assert "reading the prompt" in jobs.status_line(services, sess, "generate")
        jobs.stop(services, "generate", sess)
    finally:
        gate.open()
        t.join(120)
    m = sess.last.metrics
    assert m.stopped_by == "cancelled" and m.new_tokens == 0 and m.target_forwards == 0
    assert gate.calls == 1                                         # the second chunk never ran


def test_a_waiting_request_sees_what_is_ahead(services, gate):
    first, second = common.ensure_session(services, None), common.ensure_session(services, None)
    gate.arm(2)
    t = threading.Thread(target=lambda: list(gen(services, first, max_new=8)))
    t.start()
    try:
        assert gate.reached.wait(60)
        second, line, _ = jobs.request_job(services, "generate", second)
        assert "1 request ahead of yours" in line and "verify pass 1 running" in line
        assert "verify pass 1 running" in jobs.status_line(services, first, "generate")
        jobs.stop(services, "generate", second)
        assert "Stopping… (it will not start)" in jobs.status_line(services, second, "generate")
    finally:
        gate.open()
        t.join(120)
    assert len(list(gen(services, second))) == 1                  # it never ran


def test_the_live_status_shows_passes_and_the_rate(services, gate):
    """While a run is in its third verify pass, its status names the pass and its tokens per second."""
    import re
    sess = common.ensure_session(services, None)
    gate.arm(4)                                      # the prompt's pass, then two verify passes made tokens
    t = threading.Thread(target=lambda: list(gen(services, sess, max_new=8)))
    t.start()
    try:
        assert gate.reached.wait(60)
        line = jobs.status_line(services, sess, "generate")
        assert "verify pass 3 running" in line and re.search(r" · \d+/8 tokens, \d+\.\d tok/s · ", line), line
    finally:
        gate.open()
        t.join(120)


def test_prompt_cap_names_the_limit(store):
    small = tiny_services(store, max_prompt_tokens=20)
    with pytest.raises(gr.Error, match="at most 20 tokens .*--max-prompt-tokens"):
        list(gen(small, prompt="the cat " * 30))
    with pytest.raises(gr.Error, match="prompt is empty"):
        list(gen(small, prompt="   "))
    with pytest.raises(gr.Error, match="tau"):
        list(gen(small, log10_tau=1.0))
    # the click itself is refused before the request waits in the queue
    with pytest.raises(gr.Error, match="at most 20 tokens"):
        jobs.request_job(small, "generate", None, "the cat " * 30, True)
    assert len(small.lane) == 0


def test_auto_gamma_on_generate(services):
    *_, final = gen(services, auto=True, max_new=16)
    view = final[-1].last
    assert view.cfg.gamma == "auto" and view.metrics.new_tokens == 16
    assert all(1 <= e.block_len <= 16 for e in view.events if e.block_len)


def test_show_speculation_keeps_drafting_where_auto_would_not(services, monkeypatch):
    """Where drafting cannot pay (a draft token as dear as a target pass), gamma auto drafts nothing
    and the status says so and why; the app's "show speculation" mode drafts at least 3 a block."""
    from csd.costs import CostModel
    dear = CostModel({k: 100.0 * k for k in (1, 2, 4, 8, 16, 33)}, 100.0)
    monkeypatch.setattr(services.decoder, "_costs", dear)
    *_, off = gen(services, method="sd", gamma=6, auto=True, max_new=12)
    view = off[-1].last
    assert view.metrics.drafted == 0 and view.metrics.target_forwards == 12
    status = html.unescape(off[-2])
    assert "γ auto drafted nothing (the bar's γ is 6)" in status and "ms for a verify pass" in status
    *_, on = gen(services, method="sd", gamma=6, auto=True, max_new=12, show_spec=True)
    view = on[-1].last
    assert view.cfg.gamma_min == common.SHOW_SPECULATION == 3
    blocks = [e.block_len for e in view.events if e.pass_end]
    assert all(n >= 3 for n in blocks[:-1]) and view.metrics.drafted >= 3 * (len(blocks) - 1)
    assert "(Show speculation asks for at least 3)" in html.unescape(on[-2]) or "γ auto drafted" not in on[-2]
    assert common.make_config("ar", 6, 6, -2, 0, 8, auto_gamma=False, show_speculation=True).gamma_min == 0


def test_the_done_sentence_counts_in_words():
    from csd.events import RunMetrics
    view = jobs.RunView(None, "p", True, common.make_config("sd", 4, 6, -2, 0, 8),
                        metrics=RunMetrics(new_tokens=1, target_forwards=1, wall_s=0.5))
    assert jobs.done_sentence(view) == "Done: 1 token in 1 verify pass, 0.5 s."
    view.metrics = RunMetrics(new_tokens=5, target_forwards=2, wall_s=1.0)
    assert jobs.done_sentence(view) == "Done: 5 tokens in 2 verify passes, 1.0 s."


def test_copies_on_generate_keep_sd_output(services):
    """The Generate tab's copy switch: greedy SD with copies is still SD's answer (the exact rule
    verifies them), and every kept copy, and nothing else, is underlined."""
    prompt = "Repeat this line three times: alpha beta gamma delta alpha beta gamma delta"
    *_, plain = gen(services, prompt=prompt, method="sd", max_new=48)
    *_, copied = gen(services, prompt=prompt, method="sd", max_new=48, lookup=True)
    a, b = plain[-1].last, copied[-1].last
    assert b.cfg.lookup == generate.LOOKUP_TOKENS and a.cfg.lookup == 0
    assert [e.token_id for e in b.events if e.in_output] == [e.token_id for e in a.events if e.in_output]
    kept = [e for e in b.events if e.source == "lookup"]
    assert b.metrics.lookup_blocks > 0 and len(kept) == b.metrics.lookup_kept    # the tiny model repeats itself
    assert copied[0].count("copied") == len(kept)
    # sampled copies run too (their distribution is tested in test_decode_tiny), and the switch means
    # nothing to ar, which has no draft block to copy into
    *_, sampled = gen(services, prompt=prompt, method="sd", max_new=48, lookup=True, temperature=0.7)
    assert sampled[-1].last.cfg.lookup == generate.LOOKUP_TOKENS and sampled[-1].last.metrics.new_tokens > 0
    *_, ar = gen(services, prompt=prompt, method="ar", max_new=8, lookup=True)
    assert ar[-1].last.cfg.lookup == 0 and ar[-1].last.metrics.lookup_blocks == 0


def test_special_tokens_from_the_engine_render_as_markers(services):
    """The engine flags special tokens (``ev.special``); whatever the tiny model writes, none of
    them shows as raw ``<|...|>`` text and every one is a marker."""
    *_, final = gen(services, max_new=64, lam=0, log10_tau=-4)
    view = final[-1].last
    tokens = final[0]
    specials = [e for e in view.events if e.special and e.in_output]
    assert tokens.count("tok-special") == len(specials)
    visible = re.sub(r'data-detail="[^"]*"', "", tokens)
    assert "&lt;|im_" not in visible and "<|im_" not in visible
    assert IM_END not in [e.token_id for e in view.events if not e.special]


def test_recolour_changes_classes_without_running_a_model(services, csd_run, gate):
    sess = csd_run[-1][-1]
    gate.arm(None)
    n_rescued = sum(e.status == RESCUED for e in sess.last.events)
    tokens, line, _ = generate.recolour(services, 0, 0.0, False, sess)      # tau = 1: the gate refuses every divergence
    assert tokens.count("wi-reject") == n_rescued > 0
    tokens, line, _ = generate.recolour(services, 64, -2, True, sess)
    assert tokens.count("wi-reject") == n_rescued and "csd-hide-rejected" in tokens
    assert gate.calls == 0


def test_analyse_heading_mentions_outlines_only_when_something_changed(services, csd_run):
    sess = csd_run[-1][-1]
    pareto, gaps, pos, heat, summary, heading, tokens, _ = analyse.analyse(services, common.SCOPE_RUN, 6, -0.5, False, sess)
    assert all(isinstance(f, go.Figure) for f in (pareto, gaps, pos, heat))
    assert "divergences logged" in summary and "no decision changes" in heading and "outlined" not in heading
    heading = analyse.analyse(services, common.SCOPE_RUN, 0, 0.0, False, sess)[5]
    assert "changed decision" in heading and "outlined" in heading


def test_explore_and_csv_export_use_the_same_filter(services, csd_run):
    sess = csd_run[-1][-1]
    everything = explore.explore_events(services, common.SCOPE_SESSION, 0, list(STATUSES), "any", "", sess)
    rows, caption, _, download, _ = everything
    assert caption.startswith(f"{len(rows)} events") and download["visible"] is False
    only = explore.explore_events(services, common.SCOPE_SESSION, 0, [RESCUED], "any", "", sess)
    n = len(only[0])
    assert 0 < n < len(rows)
    button, _ = explore.export_events_csv(services, common.SCOPE_SESSION, 0, [RESCUED], "any", "", sess)
    assert button["label"] == f"Download CSV ({n} events)" and Path(button["value"]).name == f"csd-events-{n}.csv"
    with open(button["value"], newline="") as fh:
        assert {r["status"] for r in csv.DictReader(fh)} == {RESCUED}
    with open(button["value"], newline="") as fh:
        assert len(list(csv.DictReader(fh))) == n
    assert explore.hide_download()["visible"] is False


def test_scopes_are_honest(services, store, csd_run):
    sess = csd_run[-1][-1]
    other = common.ensure_session(services, None)
    assert explore.explore_events(services, common.SCOPE_SESSION, 0, list(STATUSES), "any", "", other)[1].startswith("0 events")
    assert "shared" in common.SCOPE_ALL and common.SCOPE_ALL in common.scopes(services)
    assert not explore.explore_events(services, common.SCOPE_ALL, 0, list(STATUSES), "any", "", other)[1].startswith("0 ")
    private = tiny_services(store, shared_scope=False)
    assert common.SCOPE_ALL not in common.scopes(private)
    with pytest.raises(gr.Error, match="unknown scope"):
        explore.explore_events(private, common.SCOPE_ALL, 0, list(STATUSES), "any", "", other)
    # a run id of someone else's session shows nothing when the scope is private
    rows, caption, *_ = explore.explore_events(private, common.SCOPE_SESSION, sess.last.run_id, list(STATUSES), "any", "", other)
    assert rows == [] and caption.startswith("0 events")


def test_export_of_the_coloured_answer(services, csd_run):
    sess = csd_run[-1][-1]
    files, _ = generate.export_answer(services, 6, -0.5, sess)
    page, data = (Path(p) for p in files["value"])
    text = page.read_text()
    assert "<script" not in text and "tok-rescued" in text and "arxiv.org/abs/2604.13634" in text
    assert re.findall(r"(?:src|href)=\"(https?://[^\"]+)", text) == ["https://arxiv.org/abs/2604.13634"]
    payload = json.loads(data.read_text())
    assert len(payload["events"]) == len(sess.last.events) and payload["metrics"]["new_tokens"] == 24
    assert payload["pair"]["target_repr"] == "float32"
    with pytest.raises(gr.Error, match="Nothing to export"):
        generate.export_answer(services, 6, -2, common.ensure_session(services, None))


def test_compare_leads_with_target_passes_saved(services):
    sess = common.ensure_session(services, None)
    outs = list(compare.compare(services, "the cat sat", True, 4, False, 6, -0.5, 12, False, sess))
    *panes, cap_ar, cap_sd, cap_csd, fig, note, status, sess = outs[-1]
    assert "tok-target" in panes[0] and "tok-target" not in panes[1]
    assert cap_sd.startswith("**SD**:") and "target passes" in cap_sd
    assert "same tokens as SD" in cap_csd or "leaves SD's answer at token" in cap_csd
    assert note.startswith("**SD** used") and "saved" in note and "Why speculative decoding can be slower" in note
    assert [t.type for t in fig.data] == ["bar"] * 3 and list(fig.data[0].x) == ["ar", "sd", "csd"]
    assert sess.last.cfg.method == "csd" and isinstance(sess.ar_speed[("the cat sat", True)], RunMetrics)
    assert "Done: 3 of 3 methods ran" in status


# -- memory ----------------------------------------------------------------------------------------
def _upload(services, path, sess=None):
    return explore.memory_upload(services, str(path), 6, common.ensure_session(services, sess))


def test_memory_upload_shows_the_engines_message(services, tmp_path):
    pair_id = services.pair.pair_id
    good = CorrectionMemory(pair_id, {(1, 2): 7, (3, 4): 2}).save(tmp_path / "mine.json.gz")
    cases = {
        "junk.json": ('{"hello": 1}', "not a CSD Explorer correction-memory file"),
        "meta.json": (json.dumps({"format": "csd-explorer-memory", "version": 1, "pair": pair_id, "meta": [1],
                                  "counts": []}), "'meta' must be an object"),
        "negative.json": (json.dumps({"format": "csd-explorer-memory", "version": 1, "pair": pair_id, "meta": {},
                                      "counts": [[1, 2, -5]]}), "negative"),
        "other.json": (json.dumps({"format": "csd-explorer-memory", "version": 1, "pair": "a->b", "meta": {},
                                   "counts": []}), "belongs to model pair 'a->b'"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.warns(UserWarning, match="Memory not loaded"):
            md, rows, err, sess = _upload(services, tmp_path / name)
        assert message in html.unescape(err) and 'class="csd-error"' in err, name
        assert str(tmp_path) not in err                     # the server's path is not shown
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(good.read_bytes()[:40])
    with pytest.warns(UserWarning, match="Memory not loaded"):
        md, rows, err, sess = _upload(services, truncated)
    assert "damaged or truncated gzip" in err and "Error" != err.strip()
    md, rows, err, sess = _upload(services, good)
    assert err == "" and sess.memory.count(1, 2) == 7 and "**2** patterns" in md


def test_an_unexpected_upload_failure_is_logged_and_explained(services, tmp_path, monkeypatch, caplog):
    def boom(*a, **k):
        raise RuntimeError("something odd")
    monkeypatch.setattr(CorrectionMemory, "load", boom)
    (tmp_path / "x.json").write_text("{}")
    with pytest.warns(UserWarning, match="Memory not loaded"):
        md, rows, err, sess = _upload(services, tmp_path / "x.json")
    assert "x.json could not be read as a correction memory (RuntimeError: something odd)" in err
    assert any(r.exc_info and "something odd" in str(r.exc_info[1]) for r in caplog.records)


def test_memory_calibrated_with_other_representations_loads_with_a_note(services, tmp_path):
    mem = CorrectionMemory(services.pair.pair_id, {(1, 2): 3},
                           meta={"calibration": [{"mode": "text", "positions": 10, "target_repr": "bfloat16"}]})
    md, rows, err, sess = _upload(services, mem.save(tmp_path / "bf16.json"))
    assert sess.memory.count(1, 2) == 3
    assert "calibrated with target bfloat16 (loaded: float32)" in md and "loaded: float32" in err


def test_download_reset_and_clear(services):
    sess = common.ensure_session(services, None)
    button, sess = explore.memory_download(services, sess)
    assert CorrectionMemory.load(button["value"], services.pair.pair_id).total == sess.memory.total
    md, rows, sess = explore.memory_reset(services, "clear", 6, sess)
    assert len(sess.memory) == 0 and rows == [] and "your session only" in md


def test_calibration_counts_exactly_the_positions_asked_for(services):
    sess = common.ensure_session(services, None)
    md, rows, status, sess = explore.calibrate_memory(services, explore.CAL_TEXT, explore.SRC_SHIPPED, None, 8, 16, 300, 6, sess)
    assert sess.memory.meta["calibration"][-1]["positions"] == 300
    assert "shipped corpus: 300 positions" in md and "Calibrated on shipped corpus (300 positions)" in status


def test_prompt_calibration_from_an_upload(services, tmp_path):
    sess = common.ensure_session(services, None)
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("the cat", "a dog ran", "we saw")))
    md, rows, status, sess = explore.calibrate_memory(services, explore.CAL_PROMPTS, explore.SRC_UPLOAD, str(prompts), 2, 8, 0, 6, sess)
    cal = sess.memory.meta["calibration"][-1]
    assert cal["mode"] == "prompts" and cal["prompts"] == 2 and cal["source"] == "mine.jsonl"
    assert "mine.jsonl: 2 prompts" in md
    with pytest.raises(gr.Error, match="Upload"):
        explore.calibrate_memory(services, explore.CAL_PROMPTS, explore.SRC_UPLOAD, None, 2, 8, 0, 6, sess)
    with pytest.raises(gr.Error, match="positions must be"):
        explore.calibrate_memory(services, explore.CAL_TEXT, explore.SRC_SHIPPED, None, 2, 8, 0, 6, sess)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json")
    with pytest.raises(gr.Error, match="bad.jsonl:1: not valid JSON") as err:
        explore.calibrate_memory(services, explore.CAL_PROMPTS, explore.SRC_UPLOAD, str(bad), 2, 8, 0, 6, sess)
    assert str(tmp_path) not in err.value.message


def test_calibration_stop_keeps_text_counts(services, monkeypatch):
    """Stop raises csd.calibrate.Stop from the progress callback; a text calibration keeps what it
    counted so far."""
    sess = common.ensure_session(services, None)
    before = sess.memory.total

    def fake(pair, texts, memory, *, progress, **kw):
        memory.observe(1, 2, 5)
        sess.jobs["calibrate"].cancel = True          # the Stop button, pressed meanwhile
        progress("calibrating", 0.5)
        raise AssertionError("the callback should have stopped the calibration")
    monkeypatch.setattr(explore, "calibrate", fake)
    md, rows, status, sess = explore.calibrate_memory(services, explore.CAL_TEXT, explore.SRC_SHIPPED, None, 8, 16, 300, 6, sess)
    assert "Stopped early: the counts so far are kept" in status and sess.memory.total == before + 5


# -- teach ---------------------------------------------------------------------------------------------
def test_teach_steps_plays_and_shows_discarded_tokens(services):
    sess = common.ensure_session(services, None)
    *_, (view, status, sess) = teach.teach_run(services, PROMPT, "sd", 4, 6, -2, 24, sess)
    blocks = teach._blocks(sess.teach.events)
    assert f"Iteration 1 of {len(blocks)}" in view and "draft top 5" in view and "Done:" in status
    assert sess.teach.cfg.gamma == 4
    cut = next(i for i, b in enumerate(blocks) if any(e.status == REJECTED and e.discarded for e in b))
    view, sess = teach.teach_step(services, cut, sess)
    n = len(next(e.discarded for e in blocks[cut] if e.status == REJECTED))
    assert view.count('class="discarded"') == n and "discarded unchecked" in view
    view, sess = teach.teach_step(services, -99, sess)
    assert "Iteration 1 of" in view
    view, timer, sess = teach.teach_play(services, sess)
    assert "Iteration 2 of" in view and timer.active == (len(blocks) > 2)
    for _ in range(len(blocks)):
        view, timer, sess = teach.teach_tick(services, sess)
    assert f"Iteration {len(blocks)} of {len(blocks)}" in view and timer.active is False
    with pytest.raises(gr.Error, match="speculative"):
        list(teach.teach_run(services, PROMPT, "ar", 4, 6, -2, 12, sess))


def test_status_poll_stops_when_nothing_is_left(services):
    sess = common.ensure_session(services, None)
    *lines, timer = jobs.poll_status(services, sess)
    assert timer.active is False and all("Ready." in x for x in lines)
    sess, line, timer = jobs.request_job(services, "compare", sess)
    *lines, timer = jobs.poll_status(services, sess)
    assert timer.active is True and 'data-state="waiting"' in lines[1]
    jobs.stop(services, "compare", sess)
    list(compare.compare(services, "the cat", True, 4, False, 6, -2, 4, False, sess))
    *lines, timer = jobs.poll_status(services, sess)
    assert timer.active is False and "Stopped before it started" in lines[1]


def test_a_request_the_queue_never_ran_stops_waiting(services):
    sess, line, _ = jobs.request_job(services, "generate", None)
    job = sess.jobs["generate"]
    assert "Starting…" in line
    job.queued_at -= jobs.ORPHAN_S + 1                        # nothing ahead, and the queue never started it
    *lines, timer = jobs.poll_status(services, sess)
    assert "did not reach the model" in lines[0] and timer.active is False and not sess.pending["generate"]
    # a second click the page ignored leaves a request behind the one that runs: it goes too
    sess, _, _ = jobs.request_job(services, "generate", sess)
    sess, _, _ = jobs.request_job(services, "generate", sess)
    *_, final = gen(services, sess, max_new=4)
    assert final[-1].last.done and len(sess.pending["generate"]) == 1
    sess.pending["generate"][0].queued_at -= jobs.ORPHAN_S + 1
    *lines, timer = jobs.poll_status(services, sess)
    assert "Done: 4 tokens" in lines[0] and timer.active is False and not sess.pending["generate"]


def test_command_line_options():
    import csd_app
    args = csd_app.parse_args(["--max-prompt-tokens", "100", "--no-shared-scope", "--port", "7000", "--concurrency", "2"])
    assert (args.max_prompt_tokens, args.shared_scope, args.port, args.concurrency) == (100, False, 7000, 2)
    args = csd_app.parse_args([])
    assert (args.max_prompt_tokens, args.shared_scope, args.queue_size) == (2048, True, 16)
    with pytest.raises(SystemExit):
        csd_app.parse_args(["--max-prompt-tokens", "0"])


def test_session_objects_are_per_user(services):
    a, b = common.ensure_session(services, None), common.ensure_session(services, None)
    assert isinstance(a, Session) and a.session_id != b.session_id and a.memory is not b.memory


def test_frontier_panel_reads_the_benchmark_file(tmp_path):
    from ui import figures
    assert figures.load_frontier(str(tmp_path / "missing.json")) is None
    assert "No frontier yet" in figures.make_frontier_figure(None).layout.annotations[0].text
    data = {"meta": {"command": "python -m csd bench --sweep x", "machine": {"cpu": "CPU <b>"}, "dtype": "int8"},
            "points": [{"method": "sd", "tokens_per_s": 10.0, "accuracy": 0.5, "accuracy_ci95": [0.3, 0.7],
                        "n": 4, "target_passes_per_token": 0.2, "rescued": 0},
                       {"method": "csd", "tokens_per_s": 11.0, "accuracy": 0.5, "accuracy_ci95": [0.3, 0.7], "n": 4,
                        "target_passes_per_token": 0.18, "rescued": 3,
                        "accuracy_vs_sd": {"n": 4, "gained": 1, "lost": 1}}]}
    path = tmp_path / "frontier.json"
    path.write_text(__import__("json").dumps(data))
    loaded = figures.load_frontier(str(path))
    fig = figures.make_frontier_figure(loaded)
    assert [t.name for t in fig.data] == ["sd", "csd"] and fig.data[1].x[0] == 11.0
    table = figures.frontier_table(loaded)
    assert "| csd | 11.00 | 0.180 | 3 | – | 50% [30, 70] | +1 / −1 |" in table and "CPU &lt;b&gt;" in table


def test_what_the_app_says_of_exactness_follows_the_representation():
    """SD writes AR's answer token for token only where the target runs in float32; elsewhere the
    app says it may not, and why, next to the Compare panes and in Teach."""
    f32, i8, bf16 = (common.exactness_note(r) for r in ("float32", "int8", "bfloat16"))
    assert "token for token" in f32 and "differently" not in f32
    for note in (i8, bf16):
        assert "can pick differently from the target alone (AR)" in note and "float32" in note
    assert "one scale" in i8 and "bfloat16" in bf16
    assert common.exactness_note("int8", "pass") == i8                  # the default int8 says the same
    rows = common.exactness_note("int8", "row")                         # per-token scales: exact, as float32
    assert "token for token" in rows and "differently" not in rows and "scaled on their own" in rows
    assert "{exactness}" in teach.TEACH_EXPLANATION
    for text in (teach.TEACH_EXPLANATION, generate.__doc__ or ""):
        assert "equals the target's alone" not in text and "lossless" not in text


def test_the_exact_mode_switch_flips_the_int8_activations_between_runs(store):
    """Compare's exact-mode switch: shown for an int8 target on the lean path (not for float32), and
    flipping it changes how the target scales its activations and every text that states the exactness."""
    import copy
    from dataclasses import replace

    from csd.lm import LeanLM
    from csd.quant import quantize_int8
    from ui import build_demo, make_services
    from ui.tabs import common

    def switch(demo):
        return next(b for b in demo.config["components"] if b.get("props", {}).get("elem_id") == "exact-mode")["props"]

    float_services = tiny_services(store)
    assert switch(build_demo(float_services))["visible"] is False
    with pytest.raises(gr.Error, match="applies to an int8 target"):
        common.set_exact_mode(float_services, [], False)
    int8 = quantize_int8(copy.deepcopy(float_services.pair.target)).eval()
    pair = replace(float_services.pair, target=int8, target_lm=LeanLM(int8), target_repr="int8", int8_activations="pass")
    pair.set_int8_activations("row")
    services = make_services(pair, store, costs=float_services.decoder.costs)
    props = switch(build_demo(services))
    assert props["visible"] is True and props["value"] is True and props["interactive"] is not False
    def note() -> str:
        return common.exactness_note(pair.target_repr, pair.int8_activations)

    first = services.decoder
    off = common.set_exact_mode(services, [note], False)
    assert pair.int8_activations == "pass" and not pair.target_lm.per_row and services.decoder is not first
    assert "one scale" in off[0] and "token for token" not in off[0].split("In float32")[0]
    on = common.set_exact_mode(services, [note], True)
    assert pair.int8_activations == "row" and pair.target_lm.per_row and "scaled on their own" in on[0]
    busy = make_services(pair, store, replace(services.settings, concurrency=2), costs=first.costs)
    assert switch(build_demo(busy))["interactive"] is False            # several runs at once: fixed
