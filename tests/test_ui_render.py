"""The app's pure pieces as plain functions, on hand-made events: escaping, colour classes and their
legends, token details, what-if recolouring, run summaries, the figures, config parsing and the
request lane. No model, no server, no browser (the handlers: test_ui_handlers.py, test_ui_panels.py).
"""
from __future__ import annotations

import html
import math
import re
from pathlib import Path

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest
from ui_fixtures import XSS, spans

from csd import rule
from csd.config import ConfigError, CSDConfig
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
from csd.ui import export, figures, render, rules
from csd.ui.lane import Lane
from csd.ui.state import RunSettings
from csd.ui.tabs import common, compare, explore, teach

ROOT = Path(__file__).resolve().parents[1]




def ev(status, text="x", pos=0, count=None, gap=None, **kw) -> TokenEvent:
    div = status in (RESCUED, REJECTED)
    kw.setdefault("rule", {RESCUED: RULE_RESCUE, REJECTED: RULE_MEMORY_RARE}.get(status))
    return TokenEvent(position=pos, token_id=1, text=text, status=status, block=kw.pop("block", 0),
                      index_in_block=pos, draft_id=1 if div or status == ACCEPTED else None,
                      draft_text=kw.pop("draft_text", text), target_id=2 if div else 1,
                      target_text=kw.pop("target_text", "y" if div else text),
                      gap=gap if gap is not None else (0.0 if status == ACCEPTED else None), memory_count=count, **kw)


# -- escaping, colours, marks ----------------------------------------------------------------------
def test_token_text_details_and_prompt_are_escaped():
    e = ev(REJECTED, text=XSS, count=3, gap=-1.0, draft_text='"><script>alert(2)</script>')
    out = render.render_tokens([e], cfg=CSDConfig(lam=6, tau=0.01), prompt=XSS)
    assert "<img" not in out and "<script" not in out
    assert "&lt;img src=x onerror=alert(1)&gt;" in out
    # the details are an attribute: its quotes are escaped, so it cannot close the attribute
    detail = re.search(r'data-detail="([^"]*)"', out).group(1)
    assert "&quot;&gt;&lt;script&gt;" in detail


@pytest.mark.parametrize("status,cls", [(ACCEPTED, "tok-accepted"), (RESCUED, "tok-rescued"),
                                        (REJECTED, "tok-rejected"), (CORRECTED, "tok-corrected"),
                                        (BONUS, "tok-bonus"), (TARGET, "tok-target")])
def test_each_status_has_its_class_and_a_legend_sentence(status, cls):
    out = render.render_tokens([ev(status, count=1, gap=-1.0)], cfg=CSDConfig(lam=6, tau=0.01))
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
    assert render.log_tau is rule.log_tau
    counts, gaps = np.arange(0, 12), np.linspace(-9, 0, 12)
    for lam in (0, 3, 6, 11):
        for tau in (1e-4, 0.01, 0.5, 1.0):
            want = rule.rescues(counts, gaps, lam, rule.log_tau(tau))
            got = [rules.would_keep(ev(REJECTED, count=int(c), gap=float(g)), (lam, tau)) for c, g in zip(counts, gaps)]
            assert got == list(want)
    assert rules.would_keep(ev(ACCEPTED), (0, 1e-4)) is None
    assert rules.would_keep(ev(REJECTED, count=None, gap=-1.0), (0, 1e-4)) is None
    assert rules.would_keep(ev(REJECTED, count=50, gap=0.0, rule=RULE_SPECIAL), (0, 1e-4)) is None
    for module in (render, teach):       # the Teach view explains the rule: it uses it too
        assert not re.search(r"math\.log\(|def log_tau|>= lam", Path(module.__file__).read_text())
    assert not re.search(r"math\.log\(tau|def log_tau|c >= lam", Path(figures.__file__).read_text())
    for lam in (0, 3, 6, 11):           # each half of the rule, as the details and the charts ask it
        assert list(rules.memory_knows(counts, lam)) == list(rule.rescues(counts, None, lam, 0, use_scg=False))
    for tau in (1e-4, 0.01, 0.5, 1.0):
        assert [rules.gate_passes(float(g), tau) for g in gaps] == list(
            rule.rescues(None, gaps, 0, rule.log_tau(tau), use_ocm=False))


def test_one_door_from_a_slider_to_the_rule():
    """Every what-if reaches the rule through ``rules.whatif_rule``, which the engine's config validates: a
    value out of range is refused with the config's message, and no other module of the app builds or
    evaluates a rule of its own (``rescues``, ``Rescue(...)``, ``Rescue.of``)."""
    from csd.config import ConfigError
    for bad in ((6, 0.0), (6, 1.5), (-1, 0.01), (6, float("nan"))):
        with pytest.raises(ConfigError, match="tau must be in|lambda must be"):
            rules.as_rule(bad)
        with pytest.raises(ConfigError):
            rules.would_keep(ev(REJECTED, count=9, gap=-1.0), bad)
    with pytest.raises(ConfigError, match="tau must be in"):
        rules.gate_passes(-1.0, 0.0)
    with pytest.raises(ConfigError, match="lambda must be"):
        rules.memory_knows(3, -2)
    ui = Path(rules.__file__).parent
    doors = {str(p.relative_to(ui)) for p in ui.rglob("*.py") if p.name != "rules.py"
             and re.search(r"\brescues\(|\bRescue\(|Rescue\.of\(", p.read_text(encoding="utf-8"))}
    assert doors == set()


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


def test_an_answer_without_rescues_says_why():
    events = [ev(ACCEPTED), ev(REJECTED, pos=1, count=2, gap=-0.1), ev(REJECTED, pos=2, count=40, gap=-9.0),
              ev(REJECTED, pos=3, count=0, gap=-1.0), ev(REJECTED, pos=4, count=90, gap=-3.0, special=True)]
    out = render.run_summary(events, cfg=CSDConfig(lam=6, tau=0.01))
    assert "0 rescued; 4 draft tokens rejected." in out
    assert "2 of 3 rejected swaps had been seen fewer than λ = 6 times" in out and "1 passed λ" in out
    assert "log τ = −4.61" in out or "log τ = -4.61" in out
    assert "Why" not in render.run_summary(events) and "None rescued" not in render.run_summary(events)
    sd = render.run_summary([ev(REJECTED, pos=1)], cfg=CSDConfig(method="sd"))
    assert "None rescued" not in sd                       # SD rescues nothing by design: no reason to give


def test_accepted_and_rescued_shares_are_shown_apart():
    m = RunMetrics(new_tokens=12, target_forwards=3, drafted=10, accepted=9, rescued=1, wall_s=2.0)
    out = export.render_metrics(m, method="csd")
    assert ">90%<" in out and ">10%<" in out          # apart, and their sum only under its own name
    assert out.count("100%") == 1 and '100%</div><div class="k">kept = accepted + rescued (10 of 10 drafted)' in out
    assert "target passes (9 fewer than AR)" in out


def test_long_prompts_are_folded():
    out = render.render_tokens([ev(ACCEPTED)], prompt="word " * 400)
    assert "<details" in out and "2,000 characters" in out
    assert "<details" not in render.render_tokens([ev(ACCEPTED)], prompt="short")


def test_teach_shows_discarded_draft_tokens_and_scrolls():
    block = [ev(ACCEPTED, pos=0, block_len=4),
             ev(REJECTED, pos=1, count=0, gap=-2.0, discarded=[7, 8], block_len=4), ev(CORRECTED, pos=1, block_len=4)]
    out = teach.render_teach_step(block, step=0, n_steps=1, text_before="", cfg=CSDConfig(lam=6, tau=0.01),
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
    def make_config(method, gamma, lam, log10_tau, temperature, max_new, seed=None, **kw):
        return common.make_config(RunSettings(method=method, gamma=gamma, lam=lam, log10_tau=log10_tau,
                                              temperature=temperature, max_new_tokens=max_new, seed=seed, **kw))
    cfg = make_config("csd", 6.0, 3.0, -2.0, 0.0, 16.0, 0.0)
    assert (cfg.gamma, cfg.lam, cfg.max_new_tokens, cfg.seed) == (6, 3.0, 16, 0)
    assert make_config("csd", 6, 6, -2, 0, 16, auto_gamma=True).gamma == "auto"
    for args, msg in [(("csd", 40, 6, -2, 0, 16), "γ"), (("csd", 6, 6, 0.5, 0, 16), "τ's power of ten"),
                      (("csd", 2.5, 6, -2, 0, 16), "whole number"), (("fast", 6, 6, -2, 0, 16), "method"),
                      (("csd", 6, -1, -2, 0, 16), "λ")]:
        with pytest.raises(ConfigError, match=msg):
            make_config(*args)
    # the same sentence as the box's own check (tests/test_ui_bad_input.py) and the flag's, the box named
    for args, words in [(("csd", 40, 6, -2, 0, 16), "γ (the draft block length) must be a whole number from 1 to 32; "
                                                    "got 40."),
                        (("csd", "abc", 6, -2, 0, 16), 'γ (the draft block length) must be a whole number from 1 '
                                                       'to 32; got "abc".'),
                        (("csd", 6, 6, -2, 0, "1e9", "x"), 'Seed must be a whole number, 0 or more; got "x".'),
                        (("csd", 6, 6, -2, 0, 2.5), "Max new tokens must be a whole number, 1 or more; got 2.5."),
                        (("csd", 6, "six", -2, 0, 16), 'λ (the memory count threshold) must be a number, 0 or more; '
                                                       'got "six".'),
                        (("csd", 6, 6, -2, -1, 16), "Temperature must be a number, 0 or more (0 = greedy); got -1.")]:
        with pytest.raises(ConfigError) as e:
            make_config(*args)
        assert str(e.value) == words


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
    from csd.events import ACCEPTED, BONUS, RESCUED
    from csd.ui.state import RunView

    def view(method, events):
        kept = [e for e in events if e.status != "rejected"]
        return RunView(None, "p", True, CSDConfig(method=method), events=events, done=True,
                       metrics=RunMetrics(new_tokens=len(kept), target_forwards=1, wall_s=1.0),
                       token_ids=[e.token_id for e in kept])

    sd = view("sd", [TokenEvent(0, 5, "```", ACCEPTED, 0, 0), TokenEvent(1, 6, "def", BONUS, 0, 1)])
    csd = view("csd", [TokenEvent(0, 5, "```", ACCEPTED, 0, 0),
                       TokenEvent(1, 7, XSS, RESCUED, 0, 1, draft_id=7, target_id=6, target_text="def",
                                  memory_count=68)])
    cap = compare._compare_caption("csd", csd, None, None, sd)
    assert "leaves SD's answer at token 1" in cap and "<code>def</code>" in cap
    assert "seen this divergence 68 times" in cap
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
    assert (lane.position(c).running, lane.position(c).waiting) == ([a], 1)
    b.seen_at -= 60                                  # its page stopped asking: a closed tab
    assert (lane.position(c).running, lane.position(c).waiting) == ([a], 0)
    lane.finish(a, "done")
    assert len(lane.position(c)) == 0 and a.summary == "done" and a.finished


def test_a_request_counts_every_request_queued_before_it_whichever_way_it_came():
    """Gradio's queue holds two API requests (no job until their handler starts), then page B's run; page C's
    click has not reached the queue yet: B has 1 running and 2 queued ahead, C the running one and all 3
    queued (B's among them)."""
    queue = [("api1", "generate"), ("api2", "compare"), ("pageB", "generate")]
    lane = Lane(queue=lambda: list(queue))
    running = lane.request("api0", "generate")
    lane.start(running)
    b = lane.request("s-b", "generate", "pageB", "generate")
    c = lane.request("s-c", "generate", "pageC", "generate")
    pb, pc = lane.position(b), lane.position(c)
    assert (pb.running, pb.waiting, pb.queued, len(pb)) == ([running], 2, True, 3) and b.reached
    assert (pc.waiting, pc.queued, len(pc), c.reached) == (3, False, 4, False)
    queue[:] = [("api2", "compare"), ("pageB", "generate"), ("pageC", "generate")]      # the queue moves
    assert lane.position(c).waiting == 2 and lane.position(c).queued and lane.position(b).waiting == 1
    # the same page's second request of a kind is its second queued event of that name
    d = lane.request("s-b", "generate", "pageB", "generate")
    queue.append(("pageB", "generate"))
    assert lane.position(d).waiting == 3 and lane.position(b).waiting == 1


def test_a_rejected_newline_is_a_marker_not_a_line_break():
    """A token outside the answer (rejected) holding newlines is drawn with ⏎, so it adds no blank lines that
    the answer does not have; the answer's own newlines stay line breaks."""
    html = render.render_tokens([ev(ACCEPTED, "a\n", pos=0), ev(REJECTED, "\n\n<b>", pos=1)])
    rejected = html[html.index("tok-rejected"):]
    assert rejected[rejected.index(">") + 1:].startswith(2 * render.NEWLINE_MARK + "&lt;b&gt;</span>")
    assert "&lt;b&gt;</span>\n" not in html                                        # no line break after it
    assert re.search(r'<span class="tok tok-accepted tok-has-nl[^>]*>a<span class="tok-nl">⏎</span></span>\n', html)


@pytest.mark.parametrize("status", [ACCEPTED, RESCUED, CORRECTED, BONUS])
def test_every_token_holding_a_newline_shows_its_mark_on_one_line(status):
    """A rescued ``.\\n`` was an amber ``.`` whose box and star split over two lines: the mark is inside the span
    (in the token's colours, which stays on one line), the line break right after it."""
    html = render.render_tokens([ev(status, ".\n\n", pos=0), ev(ACCEPTED, "Next", pos=1)])
    span = re.search(r'<span class="tok [^"]*"[^>]*>(.*?)</span>(\n*)<span class="tok ', html)
    assert "tok-has-nl" in html and span.group(1) == "." + 2 * render.NEWLINE_MARK and span.group(2) == "\n\n"
    assert ".tok-has-nl { white-space: pre; }" in render.CSS


def test_the_reading_view_folds_each_run_of_rejected_tokens_behind_one_marker():
    """Issue 68: struck-through rejected tokens inline made the answer hard to read. Each run of them is one fold,
    its marker shown (and the tokens hidden until a click) in the reading view and in presentation mode."""
    events = [ev(ACCEPTED), ev(REJECTED, count=0, gap=-1.0), ev(REJECTED, count=0, gap=-1.0), ev(CORRECTED),
              ev(ACCEPTED), ev(REJECTED, count=0, gap=-1.0)]
    out = render.render_tokens(events)
    assert out.count('class="csd-fold"') == 2 and out.count("csd-fold-mark") == 2
    assert "2 rejected draft tokens: click to show or fold" in out and "1 rejected draft token:" in out
    assert out.count('data-status="rejected"') == 3                   # every token is still there, folded
    for css in ("body.csd-present .csd-fold:not(.open) > .csd-fold-body", "body.csd-reading .csd-fold-mark"):
        assert css in render.CSS
    assert "csd-fold" not in render.render_tokens([ev(ACCEPTED), ev(CORRECTED)])
