"""The app's other handlers on the tiny pair (``ui_fixtures``) and a real SQLite store: memory upload,
download and calibration, Teach, the status poll, the command line, per-user sessions, the frontier
panel and the exact-mode switch.
"""
from __future__ import annotations

import html
import json

import gradio as gr
import pytest
import ui_fixtures
from ui_fixtures import FLAT_COSTS, PROMPT, gen, tiny_services

from csd.events import (
    REJECTED,
)
from csd.memory import CorrectionMemory
from csd.representation import Representation
from csd.ui import figures
from csd.ui.state import RunSettings, Session
from csd.ui.tabs import common, compare, explore, generate, jobs, teach

ui_store, ui_gate, ui_services = ui_fixtures.ui_store, ui_fixtures.ui_gate, ui_fixtures.ui_services  # fixtures




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
    md, rows, status, sess = explore.calibrate_memory(services, sess, 6, explore.CAL_TEXT, explore.SRC_SHIPPED, None,
                                                      n_prompts=8, answer_tokens=16, max_positions=300)
    assert sess.memory.meta["calibration"][-1]["positions"] == 300
    assert "shipped corpus: 300 positions" in md and "Calibrated on shipped corpus (300 positions)" in status


def test_prompt_calibration_from_an_upload(services, tmp_path):
    sess = common.ensure_session(services, None)
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("the cat", "a dog ran", "we saw")))
    md, rows, status, sess = explore.calibrate_memory(services, sess, 6, explore.CAL_PROMPTS, explore.SRC_UPLOAD,
                                                      str(prompts), n_prompts=2, answer_tokens=8, max_positions=0)
    cal = sess.memory.meta["calibration"][-1]
    assert cal["mode"] == "prompts" and cal["prompts"] == 2 and cal["source"] == "mine.jsonl"
    assert "mine.jsonl: 2 prompts" in md
    with pytest.raises(gr.Error, match="Upload"):
        explore.calibrate_memory(services, sess, 6, explore.CAL_PROMPTS, explore.SRC_UPLOAD, None,
                                 n_prompts=2, answer_tokens=8, max_positions=0)
    with pytest.raises(gr.Error, match="positions must be"):
        explore.calibrate_memory(services, sess, 6, explore.CAL_TEXT, explore.SRC_SHIPPED, None,
                                 n_prompts=2, answer_tokens=8, max_positions=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json")
    with pytest.raises(gr.Error, match="bad.jsonl:1: not valid JSON") as err:
        explore.calibrate_memory(services, sess, 6, explore.CAL_PROMPTS, explore.SRC_UPLOAD, str(bad),
                                 n_prompts=2, answer_tokens=8, max_positions=0)
    assert str(tmp_path) not in err.value.message


def test_calibration_stop_keeps_text_counts(services, monkeypatch):
    """Stop raises csd.calibration.calibrate.Stop from the progress callback; a text calibration keeps what it
    counted so far."""
    sess = common.ensure_session(services, None)
    before = sess.memory.total

    def fake(pair, texts, memory, *, progress, **kw):
        memory.observe(1, 2, 5)
        sess.jobs["calibrate"].cancel = True          # the Stop button, pressed meanwhile
        progress("calibrating", 0.5)
        raise AssertionError("the callback should have stopped the calibration")
    monkeypatch.setattr(explore, "calibrate", fake)
    md, rows, status, sess = explore.calibrate_memory(services, sess, 6, explore.CAL_TEXT, explore.SRC_SHIPPED, None,
                                                      n_prompts=8, answer_tokens=16, max_positions=300)
    assert "Stopped early: the counts so far are kept" in status and sess.memory.total == before + 5


# -- teach ---------------------------------------------------------------------------------------------
def test_teach_steps_plays_and_shows_discarded_tokens(services):
    sess = common.ensure_session(services, None)
    settings = RunSettings(method="sd", gamma=4, max_new_tokens=24)
    *_, (view, status, sess) = teach.teach_run(services, PROMPT, settings, sess)
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
        view, timer, sess = teach.teach_play(services, sess)
    assert f"Iteration {len(blocks)} of {len(blocks)}" in view and timer.active is False
    with pytest.raises(gr.Error, match="speculative"):
        list(teach.teach_run(services, PROMPT, RunSettings(method="ar", gamma=4, max_new_tokens=12), sess))


def test_status_poll_stops_when_nothing_is_left(services):
    sess = common.ensure_session(services, None)
    *lines, timer = jobs.poll_status(services, sess)
    assert timer.active is False and all("Ready." in x for x in lines)
    sess, line, timer = jobs.request_job(services, "compare", sess)
    *lines, timer = jobs.poll_status(services, sess)
    assert timer.active is True and 'data-state="waiting"' in lines[1]
    jobs.stop(services, "compare", sess)
    list(compare.compare(services, "the cat", RunSettings(gamma=4, max_new_tokens=4), sess))
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


def test_the_header_names_the_models_threads_not_the_pages(services):
    """The app keeps every thread but the model's to one CPU thread (csd.runtime.threads.one_core) once it has started,
    so the header, drawn later on such a thread, said "1 threads": it names the count the model runs on."""
    import threading
    from dataclasses import replace

    from csd.ui.app import header
    assert services.model_threads == services.pair.describe()["threads"] >= 1   # counted when made
    said = {}

    def page_thread():                    # a thread kept to one CPU thread, as the app's request threads are
        from csd.runtime import threads
        threads.own_cores(1)
        said["text"] = header(replace(services, model_threads=7))
    t = threading.Thread(target=page_thread)
    t.start()
    t.join()
    assert "7 model threads" in said["text"] and "1 threads" not in said["text"]


def test_command_line_options():
    import csd_app
    args = csd_app.parse_args(["--max-prompt-tokens", "100", "--no-shared-scope", "--port", "7000",
                               "--concurrency", "2"])
    assert (args.max_prompt_tokens, args.shared_scope, args.port, args.concurrency) == (100, False, 7000, 2)
    args = csd_app.parse_args([])
    assert (args.max_prompt_tokens, args.shared_scope, args.queue_size) == (2048, True, 64)
    with pytest.raises(SystemExit):
        csd_app.parse_args(["--max-prompt-tokens", "0"])
    with pytest.raises(SystemExit):
        csd_app.parse_args(["--concurrency", "0"])


def test_runs_decode_together_by_default_where_they_can():
    from dataclasses import replace

    import csd_app
    from csd.runtime.lm import LeanLM
    pair = tiny_services().pair                                   # a transformers draft and target
    lean = replace(pair, target_lm=LeanLM(pair.target), draft_lm=LeanLM(pair.draft))
    assert csd_app.parse_args([]).concurrency is None
    assert csd_app.concurrency_for(None, pair) == 1
    assert csd_app.concurrency_for(None, lean) == csd_app.BATCHED_CONCURRENCY > 1
    assert csd_app.concurrency_for(3, pair) == 3


def test_the_app_drafts_in_int8_where_runs_decode_together():
    """An int8 draft's steps for several runs are one batched pass that fbgemm runs well, an ort4 draft's one call a
    run, the k-quant kernel's slower on many rows (docs/users.md, docs/cpu.md): the app's auto is int8 where runs
    may decode together on the CPU, prepare's timed choice where they go one at a time, and what was asked otherwise."""
    import csd_app
    from csd.cli.common import app_draft_weights

    def draft(*flags):
        args = csd_app.parse_args(["--device", "cpu", *flags])
        return app_draft_weights(args, args.concurrency)
    assert draft() == "int8"
    assert draft("--concurrency", "4") == "int8"
    assert draft("--concurrency", "1") == "auto"
    assert draft("--target-impl", "hf") == "auto"
    assert draft("--draft-dtype", "ort4") == "ort4"
    # a GPU's draft: the target's dtype
    assert app_draft_weights(csd_app.parse_args(["--device", "cuda"]), None) == "auto"


def test_a_run_alone_drafts_with_ort4_where_prepare_chose_it_and_the_app_drafts_in_int8(monkeypatch):
    """``app_solo_draft``: the real embedded draft in ort4 (or q4_0) for the batcher's lone runs (csd.runtime.batch),
    only where ``--draft-dtype auto`` met int8 for runs that decode together and prepare timed that one faster."""
    import csd_app
    from csd.cli.common import app_draft_weights, app_solo_draft
    from csd.runtime import profile
    from csd.runtime.ortlm import OrtLM, ort_missing

    base = tiny_services().pair          # the pair the app loaded: the solo one shares its target

    def solo(chosen, *flags):
        monkeypatch.setattr(profile, "chosen_draft_weights", lambda: chosen)
        args = csd_app.parse_args(["--device", "cpu", *flags])
        asked, args.draft_weights = args.draft_weights, app_draft_weights(args, args.concurrency)
        return app_solo_draft(args, asked, base)
    assert solo("ort4", "--draft-dtype", "int8") is None and solo("ort4", "--draft-dtype", "ort4") is None
    assert solo("ort4", "--concurrency", "1") is None          # every run drafts with prepare's choice already
    assert solo("int8") is None
    got = solo("ort4")
    assert got is None if ort_missing() else (got.rep.draft == "ort4" and isinstance(got.draft_lm, OrtLM)
                                              and got.target_lm is base.target_lm and got.rep.target == base.rep.target)
    from csd.runtime.kquant import KQuantLM, kernel_missing
    got = solo("q4_0")                   # the k-quant draft at 4 bits: faster alone, slower batched than int8
    assert got is None if kernel_missing() else (got.rep.draft == "q4_0" and isinstance(got.draft_lm, KQuantLM)
                                                 and got.target_lm is base.target_lm)


def test_session_objects_are_per_user(services):
    a, b = common.ensure_session(services, None), common.ensure_session(services, None)
    assert isinstance(a, Session) and a.session_id != b.session_id and a.memory is not b.memory


def test_frontier_panel_reads_the_benchmark_file(tmp_path):
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


def test_the_exact_mode_switch_is_each_users_own(store, monkeypatch):
    """Compare's exact-mode switch: shown for an int8 target on the lean path (not for float32). It is the
    user's own: user A turning it off changes A's texts and A's runs, never B's (B's runs still scale per
    token and B's page still says so); the model takes each user's mode at the start of their run, and
    every stored run records the activation scales it ran with."""
    import copy
    from dataclasses import replace

    from csd.config import CSDConfig
    from csd.runtime.lm import HFLM, LeanLM
    from csd.runtime.quant import quantize_int8
    from csd.ui import build_demo, make_services
    from csd.ui.state import new_session
    from csd.ui.tabs import common, jobs

    def switch(demo):
        return next(b for b in demo.config["components"] if b.get("props", {}).get("elem_id") == "exact-mode")["props"]

    float_services = tiny_services(store)
    assert switch(build_demo(float_services))["visible"] is False
    with pytest.raises(gr.Error, match="applies to an int8 target"):
        common.set_exact_mode(float_services, [], False)
    int8 = quantize_int8(copy.deepcopy(float_services.pair.target)).eval()
    pair = replace(float_services.pair, target=int8, target_lm=LeanLM(int8),
                   rep=Representation("int8", activations="pass"))
    pair.set_activations("row")
    services = make_services(pair, store, costs=float_services.decoder.costs)
    props = switch(build_demo(services))
    assert props["visible"] is True and props["value"] is True and props["interactive"] is not False

    def note(mode: str) -> str:
        return common.exactness_note(pair.rep.target, mode)

    a, b = new_session(services), new_session(services)
    first = services.decoder
    *off, a = common.set_exact_mode(services, [note], False, a)
    assert "one scale" in off[0] and "token for token" not in off[0].split("In float32")[0]
    assert pair.rep.activations == "row" and services.decoder is first      # B's model is untouched
    assert common.session_activations(services, b) == "row"
    from csd.runtime import profile
    measured = []
    monkeypatch.setattr(profile, "cached_costs", lambda p, **kw: measured.append(p) or FLAT_COSTS)
    dec_a, dec_b = common.decoder_for(services, a), common.decoder_for(services, b)
    assert dec_a.pair.rep.activations == "pass" and dec_b.pair.rep.activations == "row"   # the mode is data
    assert dec_a.costs is FLAT_COSTS and measured == [dec_a.pair]       # gamma auto: A's mode's own costs, measured
    assert pair.rep.activations == "row" and services.decoder is first      # choosing a decoder switches nothing

    def one_pass(dec):
        lm = dec.pair.target_lm
        lm.forward(lm.new_cache(), [3, 4], 1)
    one_pass(dec_a)                                                             # A's run's passes: A's mode
    assert pair.rep.activations == "pass" and not pair.target_lm.per_row and services.decoder is first
    one_pass(dec_b)                                                             # B's: B's mode
    assert pair.rep.activations == "row" and pair.target_lm.per_row and services.decoder is first
    for sess, scales in ((a, "pass"), (b, "token")):                          # what each run records
        services.lane.finish(job := jobs.take_job(services, sess, "generate")[1])
        with jobs.recorded(services, sess, job, PROMPT, CSDConfig(), "") as rec:
            pass
        assert store.get_run(rec.run_id).representation == f"int8, activations per {scales}"
    *on, a = common.set_exact_mode(services, [note], True, a)
    assert "scaled on their own" in on[0]
    assert isinstance(pair.draft_lm, HFLM)          # a transformers draft: runs cannot decode together
    busy = make_services(pair, store, replace(services.settings, concurrency=2), costs=first.costs)
    assert busy.batcher is None and switch(build_demo(busy))["interactive"] is False      # several at once: fixed
    together = make_services(replace(pair, draft_lm=LeanLM(pair.draft)), store,
                             replace(services.settings, concurrency=2), costs=first.costs)
    assert together.batcher is not None and switch(build_demo(together))["interactive"] is not False


def test_users_decoding_together_keep_their_own_scales_and_answers(store):
    """Two users at once on runs that decode together (``--concurrency 2``): A per pass, B exact. Each
    run records its own scales, B's SD writes B's AR answer, and each answer is the one its user gets
    alone."""
    import copy
    import threading
    from dataclasses import replace

    from csd.config import CSDConfig
    from csd.runtime.lm import LeanLM
    from csd.runtime.quant import quantize_int8
    from csd.ui import make_services
    from csd.ui.state import new_session
    from csd.ui.tabs import common, jobs

    base = tiny_services(store).pair
    int8 = quantize_int8(copy.deepcopy(base.target)).eval()
    pair = replace(base, target=int8, target_lm=LeanLM(int8), draft_lm=LeanLM(base.draft),
                   rep=Representation("int8", activations="pass"))
    pair.set_activations("row")

    def answers(services, users, method):
        out = {}

        def go(name, sess):
            _, job = jobs.take_job(services, sess, "generate")
            with jobs.in_lane(services, job):
                run, view = jobs.start_run(services, sess, job, PROMPT, True, CSDConfig(method=method, gamma=4,
                                           max_new_tokens=20, lookup=0), sess.memory.copy())
                with jobs.recorded(services, sess, job, PROMPT, view.cfg, "") as rec:
                    list(jobs.follow_run(run, rec, view, 0.0))
                out[name] = (view.token_ids, store.get_run(rec.run_id).representation)

        threads = [threading.Thread(target=go, args=u) for u in users.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return out

    together = make_services(pair, store, replace(tiny_services(store).settings, concurrency=2), costs=FLAT_COSTS)
    a, b = new_session(together), new_session(together)
    common.set_exact_mode(together, [], False, a)
    sd = answers(together, dict(a=a, b=b), "sd")
    ar = answers(together, dict(b=b), "ar")
    assert sd["a"][1] == "int8, activations per pass" and sd["b"][1] == "int8, activations per token"
    assert sd["b"][0] == ar["b"][0] and len(sd["a"][0]) == 20
    assert together.batcher.stats()["draft"]["widest"] == 2      # the two users' draft steps shared passes
    alone = make_services(pair, store, costs=FLAT_COSTS)
    b_alone = new_session(alone)
    assert answers(alone, dict(b=b_alone), "sd")["b"][0] == sd["b"][0]
