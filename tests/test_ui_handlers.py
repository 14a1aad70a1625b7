"""The app's handlers and figure builders as plain functions: no browser, no server.

Pure pieces (escaping, colour classes, what-if, figures) use hand-made events; the handlers that
run the engine use the real embedded pair (conftest's ``real_pair``, loaded once) and a real SQLite store.
"""
from __future__ import annotations

import csv
import html
import math
import re

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest

from csd.config import ConfigError
from csd.events import ACCEPTED, BONUS, CORRECTED, REJECTED, RESCUED, STATUSES, TARGET, TokenEvent
from csd.memory import CorrectionMemory
from ui import figures, handlers as H, render
from ui.state import Session

XSS = "<img src=x onerror=alert(1)>"
PROSE = "Write a short paragraph about why people enjoy walking in the mountains."


def ev(status, text="x", pos=0, count=None, gap=None, **kw) -> TokenEvent:
    div = status in (RESCUED, REJECTED)
    return TokenEvent(position=pos, token_id=1, text=text, status=status, block=0, index_in_block=pos,
                      draft_id=1 if div or status == ACCEPTED else None, draft_text=text,
                      target_id=2 if div else 1, target_text="y" if div else text,
                      gap=gap if gap is not None else (0.0 if status == ACCEPTED else None),
                      memory_count=count, **kw)


# -- escaping and colours --------------------------------------------------------------------------
def test_token_text_and_tooltips_are_escaped():
    e = ev(REJECTED, text=XSS, count=3, gap=-1.0)
    e.draft_text = '"><script>alert(2)</script>'
    out = render.render_tokens([e], lam=6, tau=0.01, prompt=XSS)
    assert "<img" not in out and "<script" not in out
    assert "&lt;img src=x onerror=alert(1)&gt;" in out
    # the tooltip is an attribute: its quotes are escaped, so it cannot close the attribute
    title = re.search(r'title="([^"]*)"', out).group(1)
    assert "&quot;&gt;&lt;script&gt;" in title


@pytest.mark.parametrize("status,cls", [(ACCEPTED, "tok-accepted"), (RESCUED, "tok-rescued"),
                                        (REJECTED, "tok-rejected"), (CORRECTED, "tok-corrected"),
                                        (BONUS, "tok-bonus"), (TARGET, "tok-target")])
def test_each_status_has_its_colour_class(status, cls):
    out = render.render_tokens([ev(status, count=1, gap=-1.0)], lam=6, tau=0.01)
    assert f'class="tok {cls}"' in out
    assert f"{cls} {{" in render.CSS or f".{cls} {{" in render.CSS


def test_legend_names_every_status():
    legend = render.render_legend()
    for status in STATUSES:
        assert render.STATUS_STYLE[status][0] in legend


def test_hide_rejected_is_a_class_on_the_container():
    out = render.render_tokens([ev(REJECTED, count=0, gap=-1.0)], hide_rejected=True)
    assert 'class="csd-tokens csd-hide-rejected"' in out
    assert ".csd-hide-rejected .tok-rejected" in render.CSS


# -- what-if ---------------------------------------------------------------------------------------
def test_would_rescue_is_the_csd_rule():
    e = ev(REJECTED, count=6, gap=math.log(0.01))
    assert render.would_rescue(e, 6, 0.01) is True            # both thresholds met exactly
    assert render.would_rescue(e, 7, 0.01) is False           # memory too rare
    assert render.would_rescue(e, 6, 0.02) is False           # gap below log tau
    assert render.would_rescue(ev(ACCEPTED), 0, 1e-4) is None  # not a divergence
    assert render.would_rescue(ev(REJECTED, count=None, gap=-1.0), 0, 1e-4) is None


def test_whatif_recolouring_marks_changed_decisions_only():
    events = [ev(ACCEPTED, pos=0), ev(RESCUED, pos=1, count=9, gap=-0.5), ev(REJECTED, pos=2, count=2, gap=-0.2),
              ev(CORRECTED, pos=2), ev(REJECTED, pos=3, count=9, gap=-8.0)]
    same = render.render_tokens(events, whatif=(6, 0.01))
    assert "wi-rescue" not in same and "wi-reject" not in same
    low_lam = render.render_tokens(events, whatif=(2, 0.01))       # the count-2 rejection would be rescued
    assert low_lam.count("wi-rescue") == 1 and "wi-reject" not in low_lam
    tau_one = render.render_tokens(events, whatif=(0, 1.0))        # log tau = 0: nothing passes the gate
    assert tau_one.count("wi-reject") == 1 and "wi-rescue" not in tau_one
    assert "1 of 3 divergences" in render.whatif_summary(events, 6, 0.01)
    assert render.whatif_summary(events, 0, 1e-4).startswith("At λ = 0, τ = 0.0001")
    assert "3 of 3 divergences" in render.whatif_summary(events, 0, 1e-4)


def test_departures_mark_replaced_and_inserted_positions():
    assert H.departures([1, 2, 3, 4], [1, 2, 3, 4]) == set()
    assert H.departures([1, 2, 3, 4], [1, 9, 3, 4]) == {1}
    assert H.departures([1, 2, 3], [1, 2, 7, 8, 3]) == {2, 3}


# -- inputs --------------------------------------------------------------------------------------
def test_make_config_converts_and_validates():
    cfg = H.make_config("csd", 6.0, 3.0, -2.0, 0.0, 16.0, 0.0)
    assert (cfg.gamma, cfg.lam, cfg.max_new_tokens, cfg.seed) == (6, 3.0, 16, 0)
    assert cfg.tau == pytest.approx(0.01)
    with pytest.raises(ConfigError, match="gamma"):
        H.make_config("csd", 40, 6, -2, 0, 16)
    with pytest.raises(ConfigError, match="tau"):
        H.make_config("csd", 6, 6, 0.5, 0, 16)
    with pytest.raises(ConfigError, match="whole number"):
        H.make_config("csd", 2.5, 6, -2, 0, 16)
    with pytest.raises(ConfigError, match="method"):
        H.make_config("fast", 6, 6, -2, 0, 16)
    with pytest.raises(ConfigError, match="lambda"):
        H.make_config("csd", 6, -1, -2, 0, 16)


def test_pattern_parsing():
    assert H.parse_pattern("any") is None and H.parse_pattern("") is None
    assert H.parse_pattern("12:34") == (12, 34)
    with pytest.raises(gr.Error):
        H.parse_pattern("the -> a")


def test_error_messages_are_escaped():
    # gradio renders toast messages as HTML: user text inside an error must come out as text
    with pytest.raises(gr.Error) as err:
        H.parse_pattern(XSS)
    assert "<img" not in err.value.message and "&lt;img src=x onerror=alert(1)&gt;" in err.value.message


# -- figures ---------------------------------------------------------------------------------------
def test_pareto_figure():
    rows = [dict(draft_id=i, target_id=i + 100, draft_text=f" w{i}", target_text=XSS, count=c,
                 example_context="ctx <b>") for i, c in enumerate([50, 20, 10, 5, 5, 4, 3, 2, 1, 1])]
    fig = figures.make_pareto_figure(rows)
    types = [t.type for t in fig.data]
    assert types == ["bar", "scatter"]
    assert list(fig.data[0].y) == [50, 20, 10, 5, 5, 4, 3, 2, 1, 1]
    assert fig.data[1].y[-1] == pytest.approx(1.0)
    assert any(s.type == "line" for s in fig.layout.shapes)               # the top-20% mark
    assert "= 69%" in fig.layout.annotations[0].text                      # top 2 of 10 = 70/101
    assert all("<img" not in h for h in fig.data[0].hovertext)           # escaped for plotly
    assert figures.make_pareto_figure([]).layout.annotations[0].text.startswith("No divergences")


def test_gap_figure_has_log_tau_line_and_rescue_region():
    gaps, counts = [-0.1, -0.5, -3.0, -6.0, -9.0], [10, 1, 10, 10, 0]
    fig = figures.make_gap_figure(gaps, counts, lam=6, tau=0.01)
    assert [t.type for t in fig.data] == ["histogram", "histogram"]
    assert sorted(fig.data[0].x) == [-6.0, -3.0, -0.1] and sorted(fig.data[1].x) == [-9.0, -0.5]
    kinds = {s.type: s for s in fig.layout.shapes}
    assert kinds["line"].x0 == pytest.approx(math.log(0.01))
    assert kinds["rect"].x0 == pytest.approx(math.log(0.01)) and kinds["rect"].x1 == 0
    assert "2 of 5" in fig.layout.annotations[0].text                     # -0.1 and -3.0 pass both


def test_position_figure_one_line_per_method():
    data = {"sd": [dict(index_in_block=0, kept=9, decided=10), dict(index_in_block=1, kept=5, decided=10)],
            "csd": [dict(index_in_block=0, kept=10, decided=10)], "ar": []}
    fig = figures.make_position_figure(data)
    assert sorted(t.name for t in fig.data) == ["csd", "sd"]
    sd = next(t for t in fig.data if t.name == "sd")
    assert list(sd.y) == [0.9, 0.5] and list(sd.x) == [1, 2]


def test_whatif_figure_marks_current_thresholds():
    lams, taus = [0, 6, 12], [1e-4, 1e-2, 1.0]
    rate = np.array([[1.0, 0.9, 0.0], [0.5, 0.4, 0.0], [0.1, 0.1, 0.0]])
    fig = figures.make_whatif_figure(lams, taus, rate, lam=6, tau=0.01, total=20)
    assert [t.type for t in fig.data] == ["heatmap", "scatter"]
    assert list(fig.data[0].x) == pytest.approx([-4, -2, 0])
    assert fig.data[1].x[0] == pytest.approx(-2) and fig.data[1].y[0] == 6


def test_compare_figure_three_panels():
    res = {m: dict(wall_s=w, target_forwards=f, tokens_per_s=t)
           for m, w, f, t in [("ar", 4.0, 16, 4.0), ("sd", 3.0, 5, 5.3), ("csd", 2.5, 4, 6.4)]}
    fig = figures.make_compare_figure(res)
    assert len(fig.data) == 3 and all(t.type == "bar" for t in fig.data)
    assert list(fig.data[1].y) == [16, 5, 4]
    assert isinstance(figures.make_compare_figure({}), go.Figure)


# -- handlers on the real pair ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def services(real_pair, tmp_path_factory):
    """The app's services on the real embedded pair (conftest's, loaded once per test session)."""
    from db.store import Store
    from ui import make_services
    pair = real_pair
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('ui-handlers') / 'ui.sqlite3'}")
    yield make_services(pair, store)
    store.close()


@pytest.fixture(scope="module")
def csd_session(services):
    """One streamed CSD generation (lambda = 0: the gate decides), shared by the tests below."""
    outs = list(H.generate(services, PROSE, True, "csd", 6, 0, -2, 0, 16, 0, False, None))
    return outs


def test_generate_streams_coloured_tokens_and_metrics(csd_session):
    outs = csd_session
    assert len(outs) >= 2                                 # streamed, not one final answer
    tokens, metrics_html, metrics, whatif, sess = outs[-1]
    assert isinstance(sess, Session) and sess.last is not None and sess.last.done
    assert metrics["new_tokens"] == 16 or metrics["stopped_by"] == "eos"
    assert metrics["target_forwards"] >= 1 and 'data-state="done"' in metrics_html
    assert len(re.findall(r'class="tok tok-', tokens)) == len(sess.last.events)
    assert "tok-accepted" in tokens
    assert whatif.startswith("At λ = 0") or whatif.startswith("No divergences")
    assert sess.last.run_id is not None                   # recorded in the store
    # every intermediate page is a prefix of the final one, token-wise
    assert tokens.count('class="tok ') >= outs[0][0].count('class="tok ')


def test_recolour_changes_classes_without_running_a_model(services, csd_session):
    sess = csd_session[-1][-1]
    n_rescued = sum(e.status == RESCUED for e in sess.last.events)
    tokens, line, _ = H.recolour(services, 0, 0.0, False, sess)      # tau = 1: the gate refuses every divergence
    assert tokens.count("wi-reject") == n_rescued
    tokens, line, _ = H.recolour(services, 64, -2, True, sess)       # lambda = 64: no memory count reaches it
    assert tokens.count("wi-reject") == n_rescued and "csd-hide-rejected" in tokens


def test_analyse_and_explore_read_the_store(services, csd_session):
    sess = csd_session[-1][-1]
    pareto, gaps, pos, heat, summary, tokens, _ = H.analyse(services, "this run", 6, -2, False, sess)
    assert all(isinstance(f, go.Figure) for f in (pareto, gaps, pos, heat))
    assert "divergences logged" in summary
    assert [t.type for t in pos.data] == ["scatter"] and pos.data[0].name == "csd"
    rows, caption, choices, _ = H.explore_events(services, "this session", 0, list(STATUSES), "any", "", sess)
    assert len(rows) == len(sess.last.events) and caption.startswith(f"{len(rows)} events")
    other = H.ensure_session(services, None)
    rows, caption, _, _ = H.explore_events(services, "this session", 0, list(STATUSES), "any", "", other)
    assert rows == [] and caption.startswith("0 events")     # another session does not see this one's runs
    button, _ = H.export_events_csv(services, "this session", 0, list(STATUSES), "any", "", sess)
    assert button["visible"] and f"({len(sess.last.events)} events)" in button["label"]
    with open(button["value"], newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(sess.last.events)


def test_bad_input_is_a_clear_error(services):
    with pytest.raises(gr.Error, match="prompt is empty"):
        list(H.generate(services, "  ", True, "csd", 6, 6, -2, 0, 16, 0, False, None))
    with pytest.raises(gr.Error, match="context"):
        list(H.generate(services, "word " * 40_000, True, "csd", 6, 6, -2, 0, 16, 0, False, None))
    with pytest.raises(gr.Error, match="tau"):
        list(H.generate(services, PROSE, True, "csd", 6, 6, 1.0, 0, 16, 0, False, None))


def test_speed_up_over_ar_appears_after_an_ar_run(services):
    sess = H.ensure_session(services, None)
    prompt = "What is 12 times 12?"
    *_, (tok, mhtml, m, _w, sess) = H.generate(services, prompt, True, "ar", 6, 6, -2, 0, 6, 0, False, sess)
    assert "tok-target" in tok and m["target_forwards"] == m["new_tokens"]
    assert sess.ar_speed[(prompt, True)] > 0
    *_, (tok, mhtml, m, _w, sess) = H.generate(services, prompt, True, "sd", 6, 6, -2, 0, 6, 0, False, sess)
    assert "speed-up over AR (tokens/s)" in mhtml


def test_memory_upload_refuses_wrong_files(services, tmp_path):
    sess = H.ensure_session(services, None)
    junk = tmp_path / "notes.json"
    junk.write_text('{"hello": 1}')
    md, rows, err, sess = H.memory_upload(services, str(junk), 6, sess)
    assert "not a CSD Explorer correction-memory file" in err and 'class="csd-error"' in err
    other = CorrectionMemory("some-draft->some-target", {(1, 2): 9})
    other_path = other.save(tmp_path / "other.json")
    md, rows, err, sess = H.memory_upload(services, str(other_path), 6, sess)
    assert "belongs to model pair 'some-draft->some-target'" in html.unescape(err)
    mine = CorrectionMemory(services.pair.pair_id, {(11, 22): 7, (33, 44): 2})
    path = mine.save(tmp_path / "mine.json.gz")
    md, rows, err, sess = H.memory_upload(services, str(path), 6, sess)
    assert err == "" and sess.memory.count(11, 22) == 7
    assert "**2** patterns" in md and rows[0][2] == "11:22" and rows[0][4] == "yes"
    button, sess = H.memory_download(services, sess)
    assert CorrectionMemory.load(button["value"], services.pair.pair_id).count(33, 44) == 2
    md, rows, sess = H.memory_reset(services, "clear", 6, sess)
    assert len(sess.memory) == 0 and rows == []


def test_teach_steps_through_iterations(services):
    sess = H.ensure_session(services, None)
    view, sess = H.teach_run(services, PROSE, "csd", 4, 6, -2, 12, sess)
    blocks = H._blocks(sess.teach.events)
    assert f"Iteration 1 of {len(blocks)}" in view
    assert "draft top 5" in view and "target top 5" in view
    first = blocks[0]
    assert first[0].target_top is not None and len(first[0].target_top) == 5
    assert first[0].draft_top is not None
    if len(blocks) > 1:
        view, sess = H.teach_step(1, sess)
        assert f"Iteration 2 of {len(blocks)}" in view
    view, sess = H.teach_step(-5, sess)                  # clamped at the first iteration
    assert "Iteration 1 of" in view
    assert "one target pass" in view
    with pytest.raises(gr.Error, match="speculative"):
        H.teach_run(services, PROSE, "ar", 4, 6, -2, 12, sess)


def test_compare_runs_three_methods_and_marks_departures(services):
    sess = H.ensure_session(services, None)
    outs = list(H.compare(services, "What is 7 times 8?", True, 4, 6, -2, 6, sess))
    *panes, cap_ar, cap_sd, cap_csd, fig, sess = outs[-1]
    assert "tok-target" in panes[0] and "tok-target" not in panes[1]
    assert cap_ar.startswith("**AR**") and "target passes" in cap_sd
    assert ("same tokens as AR" in cap_csd) or ("departs from AR at token" in cap_csd)
    assert [t.type for t in fig.data] == ["bar"] * 3 and list(fig.data[0].x) == ["ar", "sd", "csd"]
    assert sess.last is not None and sess.last.cfg.method == "csd"
    assert sess.ar_speed[("What is 7 times 8?", True)] > 0


def test_calibration_from_an_upload_and_its_errors(services, tmp_path):
    sess = H.ensure_session(services, None)
    short = tmp_path / "short.txt"
    short.write_text("Too short to calibrate on.")
    with pytest.raises(gr.Error, match="too short"):
        H.calibrate_memory(services, "uploaded file", str(short), 100, 6, sess, progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="Upload"):
        H.calibrate_memory(services, "uploaded file", None, 100, 6, sess, progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="max positions"):
        H.calibrate_memory(services, "default corpus", None, 0, 6, sess, progress=lambda *a, **k: None)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"The {i}th walker said that the hills were lovely, and the path was long." for i in range(60)))
    before = sess.memory.total
    md, rows, sess = H.calibrate_memory(services, "uploaded file", str(corpus), 300, 6, sess,
                                        progress=lambda *a, **k: None)
    assert "corpus.txt" in md and sess.memory.meta["calibration"][-1]["positions"] > 0
    assert sess.memory.total >= before
