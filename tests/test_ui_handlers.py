"""The app's Generate, Compare, Analyse and export handlers as plain functions, on the real engine with
tiny in-process models (``ui_fixtures``: a target and a perturbed copy as draft, over a 32-piece
tokenizer) and a real SQLite store. The gate of ``ui_fixtures`` holds the engine inside a chosen forward
pass, so Stop can be pressed during the prefill, and a job can wait behind another, without any timing
assumption.
"""
from __future__ import annotations

import copy
import csv
import html
import json
import re
import threading
from dataclasses import replace
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go
import pytest
import ui_fixtures
from ui_fixtures import IM_END, gen, spans, tiny_services

from csd.events import (
    RESCUED,
    STATUSES,
    RunMetrics,
)
from csd.ui.state import RunSettings
from csd.ui.tabs import analyse, common, compare, explore, generate, jobs

ui_store, ui_gate, ui_services = ui_fixtures.ui_store, ui_fixtures.ui_gate, ui_fixtures.ui_services  # fixtures




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
    assert run.status == "finished" and run.representation == "float32" and run.output_text == sess.last.text
    from csd.db import analytics as A
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
    with pytest.raises(gr.Error, match=r"power of ten \(the gate threshold\) must be a number, 0 or less"):
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
    said = re.search(r"γ auto drafted nothing, not 6: a draft token took \d+ ms, a verify pass \d+ ms\.", status)
    assert said, status
    *_, on = gen(services, method="sd", gamma=6, auto=True, max_new=12, show_spec=True)
    view = on[-1].last
    assert view.cfg.gamma_min == common.SHOW_SPECULATION == 3
    blocks = [e.block_len for e in view.events if e.pass_end]
    assert all(n >= 3 for n in blocks[:-1]) and view.metrics.drafted >= 3 * (len(blocks) - 1)
    # the floor of 3 is below the bar's 6, so the status says in one sentence how long the blocks were
    status = html.unescape(on[-2])
    said = re.search(r"γ auto drafted about (\d+) a block, not 6: a draft token took \d+ ms, a verify pass \d+ ms\.",
                     status)
    assert said and int(said.group(1)) >= 3, status
    assert common.make_config(RunSettings(method="ar", gamma=6, max_new_tokens=8, show_spec=True)).gamma_min == 0


def test_the_done_sentence_counts_in_words():
    from csd.events import RunMetrics
    view = jobs.RunView(None, "p", True, common.make_config(RunSettings(method="sd", gamma=4, max_new_tokens=8)),
                        metrics=RunMetrics(new_tokens=1, target_forwards=1, wall_s=0.5))
    assert jobs.done_sentence(view) == "Done: 1 token in 1 verify pass, 0.5 s."
    view.metrics = RunMetrics(new_tokens=5, target_forwards=2, wall_s=1.0)
    assert jobs.done_sentence(view) == "Done: 5 tokens in 2 verify passes, 1.0 s."
    view.metrics = RunMetrics(new_tokens=5, target_forwards=2, wall_s=1.0, prompt_rows_copied=24)
    assert jobs.done_sentence(view) == ("Done: 5 tokens in 2 verify passes, 1.0 s. Another user's run had read the "
                                        "first 24 tokens of this prompt: this run copied them instead of reading them.")


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
    pareto, gaps, pos, heat, summary, heading, tokens, _, _ = analyse.analyse(services, common.SCOPE_RUN,
                                                                              RunSettings(lam=6, log10_tau=-0.5), sess)
    assert all(isinstance(f, go.Figure) for f in (pareto, gaps, pos, heat))
    assert "divergences logged" in summary and "no decision changes" in heading and "outlined" not in heading
    heading = analyse.analyse(services, common.SCOPE_RUN, RunSettings(lam=0, log10_tau=0.0), sess)[5]
    assert "changed decision" in heading and "outlined" in heading


def test_analyse_filters_by_the_recorded_target_representation(services, csd_run):
    sess = csd_run[-1][-1]

    def logged(target):
        summary = analyse.analyse(services, common.SCOPE_SESSION, RunSettings(), sess, target)[4]
        return int(re.search(r"(\d+) divergences? logged", summary).group(1)), summary
    everything, _ = logged("any")
    assert everything > 0 and logged(services.pair.rep.label)[0] == everything
    none, summary = logged("bfloat16")
    assert none == 0 and "target bfloat16" in summary
    targets = analyse.analyse(services, common.SCOPE_SESSION, RunSettings(), sess)[7]
    assert targets["choices"] == ["any", services.pair.rep.label]


def test_explore_and_csv_export_use_the_same_filter(services, csd_run):
    sess = csd_run[-1][-1]
    everything = explore.explore_events(services, common.SCOPE_SESSION, 0, list(STATUSES), "any", "", "any", sess)
    rows, caption, _, targets, download, _ = everything
    assert targets["choices"] == ["any", services.pair.rep.label]
    assert caption.startswith(f"{len(rows)} events") and download["visible"] is False
    only = explore.explore_events(services, common.SCOPE_SESSION, 0, [RESCUED], "any", "", "any", sess)
    n = len(only[0])
    assert 0 < n < len(rows)
    button, _ = explore.export_events_csv(services, common.SCOPE_SESSION, 0, [RESCUED], "any", "", "any", sess)
    assert button["label"] == f"Download CSV ({n} events)" and Path(button["value"]).name == f"csd-events-{n}.csv"
    with open(button["value"], newline="") as fh:
        assert {r["status"] for r in csv.DictReader(fh)} == {RESCUED}
    with open(button["value"], newline="") as fh:
        assert len(list(csv.DictReader(fh))) == n
    assert explore.hide_download()["visible"] is False


def test_scopes_are_honest(services, store, csd_run):
    sess = csd_run[-1][-1]
    other = common.ensure_session(services, None)
    caption = explore.explore_events(services, common.SCOPE_SESSION, 0, list(STATUSES), "any", "", "any", other)[1]
    assert caption.startswith("0 events")
    assert "shared" in common.SCOPE_ALL and common.SCOPE_ALL in common.scopes(services)
    caption = explore.explore_events(services, common.SCOPE_ALL, 0, list(STATUSES), "any", "", "any", other)[1]
    assert not caption.startswith("0 ")
    private = tiny_services(store, shared_scope=False)
    assert common.SCOPE_ALL not in common.scopes(private)
    with pytest.raises(gr.Error, match="unknown scope"):
        explore.explore_events(private, common.SCOPE_ALL, 0, list(STATUSES), "any", "", "any", other)
    # a run id of someone else's session shows nothing when the scope is private
    rows, caption, *_ = explore.explore_events(private, common.SCOPE_SESSION, sess.last.run_id, list(STATUSES), "any",
                                               "", "any", other)
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
    assert payload["pair"]["representation"]["target"] == "float32" and sess.last.pair == payload["pair"]
    # the run's own pair, not the app's: a run that started alone drafted with the batcher's solo draft (on a copy
    # of the module's session, which the other tests read as the run made it)
    solo = copy.copy(sess)
    solo.last = replace(sess.last, pair={**sess.last.pair, "representation": {**sess.last.pair["representation"],
                                                                             "draft": "ort4"}})
    files, _ = generate.export_answer(services, 6, -0.5, solo)
    assert json.loads(Path(files["value"][1]).read_text())["pair"]["representation"]["draft"] == "ort4"
    assert sess.last.pair == payload["pair"]                  # the module's run as it was made
    with pytest.raises(gr.Error, match="Nothing to export"):
        generate.export_answer(services, 6, -2, common.ensure_session(services, None))


def test_compare_leads_with_target_passes_saved(services):
    sess = common.ensure_session(services, None)
    outs = list(compare.compare(services, "the cat sat",
                                RunSettings(gamma=4, lam=6, log10_tau=-0.5, max_new_tokens=12), sess))
    *panes, cap_ar, cap_sd, cap_csd, fig, note, status, sess = outs[-1]
    assert "tok-target" in panes[0] and "tok-target" not in panes[1]
    assert cap_sd.startswith("**SD**:") and "target passes" in cap_sd
    # greedy on the tiny pair, no rescue moves CSD off SD's answer for this prompt: the caption says so
    assert "same tokens as SD" in cap_csd and "leaves SD's answer" not in cap_csd
    assert note.startswith("**SD** used") and "saved" in note and "Why speculative decoding can be slower" in note
    assert [t.type for t in fig.data] == ["bar"] * 3 and list(fig.data[0].x) == ["ar", "sd", "csd"]
    assert sess.last.cfg.method == "csd" and isinstance(sess.ar_speed[("the cat sat", True)], RunMetrics)
    assert "Done: 3 of 3 methods ran" in status
    assert "busy" not in cap_sd + cap_csd                  # the model was its own


def test_compare_says_in_the_pane_when_the_machine_was_busy(services):
    """Issue 68: on a busy machine Compare showed CSD slower than AR with only a small note below."""
    other = services.lane.request("someone else", "generate")
    services.lane.start(other)                              # another user's run holds the model beside it
    try:
        sess = common.ensure_session(services, None)
        outs = list(compare.compare(services, "the cat sat", RunSettings(gamma=4, max_new_tokens=8), sess))
    finally:
        services.lane.finish(other)
    caps = outs[-1][3:6]
    assert all("**the machine was busy**: 1 other run shared it while this ran" in c for c in caps), caps
