"""Bad input in the app, without a browser: a setting out of its range is refused with a sentence
that names the range (before the handler runs, as gradio itself checks a slider), the session's
memory and last answer survive a refused request, and an expected refusal is one log line with no
traceback (gradio prints one for every ``gr.Error`` unless told not to).

The app is built on the tiny in-process models of ``ui_fixtures``; its components are the ones
the page uses, found by their ``elem_id``.
"""
from __future__ import annotations

import logging

import gradio as gr
import pytest
from ui_fixtures import tiny_services

from csd.ui import build_demo
from csd.ui.state import RunSettings
from csd.ui.tabs import common, generate, jobs

PROMPT = "Write about the cat on the mat and the dog in the park."


@pytest.fixture(scope="module")
def services():
    return tiny_services(None)


@pytest.fixture(scope="module")
def demo(services):
    return build_demo(services)


def component(demo, elem_id: str):
    found = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    assert len(found) == 1, elem_id
    return found[0]


def refusal(comp, value) -> str:
    with pytest.raises(gr.Error) as err:
        comp.preprocess(value)
    assert err.value.print_exception is False         # no traceback in the log for the user's mistake
    return err.value.message


# (elem_id, a value out of range, the range as the message must name it)
OUT_OF_RANGE = [
    ("gamma", 40, "γ (the draft block length) must be a whole number from 1 to 32; got 40."),
    ("gamma", 0, "from 1 to 32; got 0."),
    ("gamma", 6.5, "a whole number from 1 to 32; got 6.5."),
    ("lam", -1, "λ (the memory count threshold) must be a whole number from 0 to 64; got -1."),
    ("lam", 65, "from 0 to 64; got 65."),
    ("log10-tau", -5, "τ's power of ten (the gate threshold) must be between -4 and 0 (τ from 0.0001 to 1); got -5."),
    ("log10-tau", 0.5, "between -4 and 0 (τ from 0.0001 to 1); got 0.5."),
    ("temperature", 2.5, "Temperature must be between 0 and 2 (0 = greedy); got 2.5."),
    ("temperature", -0.1, "between 0 and 2"),
    ("max-new", 0, "Max new tokens must be a whole number from 1 to 512 (this app's limit); got 0."),
    ("max-new", 513, "from 1 to 512"),
    ("c-max-new", 10_000, "Max new tokens must be a whole number from 1 to 512"),
    ("teach-max", 200, "Teach's max new tokens must be a whole number from 4 to 128"),
    ("seed", -1, "Seed must be a whole number, 0 or more; got -1."),
    ("cal-prompts", 0, "Prompts must be a whole number from 1 to 10,000; got 0."),
    ("gamma", None, "from 1 to 32; got nothing."),
    ("lam", "six", 'from 0 to 64; got "six".'),
    ("log10-tau", float("nan"), "between -4 and 0"),
    # not "tau_lossy is missing"
    ("tau-lossy", None, "The lossy rule's tau must be between 0.001 and 1; got nothing."),
    ("cal-prompts", None, "Prompts must be a whole number from 1 to 10,000; got nothing."),
]


@pytest.mark.parametrize("elem_id,value,words", OUT_OF_RANGE)
def test_a_setting_out_of_range_names_the_range(demo, elem_id, value, words):
    assert words in refusal(component(demo, elem_id), value)


def test_in_range_values_pass_as_gradio_would_pass_them(demo):
    assert component(demo, "gamma").preprocess(32) == 32
    assert component(demo, "log10-tau").preprocess(-4) == -4
    assert component(demo, "seed").preprocess(None) is None          # an empty seed box: no seed
    assert "csd-optional" in component(demo, "seed").elem_classes     # the page's script lets it be empty
    assert "csd-optional" not in (component(demo, "tau-lossy").elem_classes or [])
    assert component(demo, "seed").preprocess(7) == 7
    assert component(demo, "method").preprocess("sd") == "sd"


def test_a_method_not_offered_is_named_with_the_choices(demo):
    assert "Method must be one of ar, sd, csd, ocm-only, scg-only, lossy, topk, typical, fly; got 'fast'." in \
        refusal(component(demo, "method"), "fast")
    assert "must be one of sd, csd, ocm-only, scg-only, lossy, topk, typical, fly; got 'ar'" in \
        refusal(component(demo, "t-method"), "ar")


def test_the_page_draws_them_as_gradio_components(demo):
    """The checked components are gradio's own (the page has no other slider code) and only ever
    inputs: gradio rebuilds a component that a handler updates from its class, without the check."""
    for elem_id, kind in (("gamma", gr.Slider), ("log10-tau", gr.Slider), ("seed", gr.Number),
                          ("method", gr.Dropdown)):
        comp = component(demo, elem_id)
        assert type(comp) is kind and comp.get_block_name() == kind.__name__.lower()
    cfg = component(demo, "log10-tau").get_config()
    assert (cfg["minimum"], cfg["maximum"], cfg["value"]) == (-4, 0, -2) and "csd_what" not in cfg
    checked = {b._id for b in demo.blocks.values() if hasattr(b, "csd_what")}
    assert len(checked) >= 12
    for fn in demo.fns.values():
        assert not checked & {b._id for b in fn.outputs}, fn.name


def test_expected_refusals_are_one_log_line_without_a_traceback(services, caplog):
    caplog.set_level(logging.INFO, logger="csd.ui")
    for ask, words in ((lambda: jobs.request_job(services, "generate", None, "   ", True), "the prompt is empty"),
                       (lambda: jobs.request_job(services, "generate", None, "the cat " * 2000, True),
                        "this app takes prompts of at most 2,048 tokens"),
                       (lambda: list(generate.generate(services, PROMPT,
                                                       RunSettings(gamma=4, lam=6, log10_tau=0.5, max_new_tokens=8,
                                                                   seed=0), None)),
                        "τ's power of ten (the gate threshold) must be a number, 0 or less (τ at most 1); got 0.5.")):
        caplog.clear()
        with pytest.raises(gr.Error) as err:
            ask()
        assert err.value.print_exception is False
        assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
        rec = caplog.records[0]
        assert rec.levelno == logging.INFO and rec.getMessage().startswith("refused: ") and not rec.exc_info
        assert words in rec.getMessage() and "\n" not in rec.getMessage()
    # a failure the app did not expect is logged by its caller with the traceback, and not again as a refusal
    caplog.clear()
    assert common.error("The store could not answer: disk full", expected=False).print_exception is False
    assert caplog.records == []


def test_a_refused_request_keeps_the_session(services):
    sess = None
    for _ in generate.generate(services, PROMPT,
                               RunSettings(gamma=4, lam=0, log10_tau=-0.5, max_new_tokens=12, seed=0), sess):
        pass
    sess = _[-1]
    last, memory, total = sess.last, sess.memory, sess.memory.total
    assert last is not None and last.done and total > 0
    jobs.request_job(services, "generate", sess, PROMPT, True)      # the click; the handler then refuses
    with pytest.raises(gr.Error, match="power of ten \\(the gate threshold\\) must be a number, 0 or less"):
        list(generate.generate(services, PROMPT, RunSettings(gamma=4, lam=0, log10_tau=0.5, max_new_tokens=12, seed=0),
                               sess))
    assert sess.last is last and sess.memory is memory and sess.memory.total == total
    assert sess.jobs["generate"].summary.startswith("Not run: τ's power of ten (the gate threshold) must be") \
        and not sess.pending["generate"]
    assert len(services.lane) == 0


def test_the_app_logs_its_own_info_lines():
    """``python app.py`` shows the one-line refusals: its loggers speak from INFO."""
    import csd_app
    csd_app.configure_logging()
    assert logging.getLogger("csd.ui.tabs.common").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)


def test_the_app_refuses_a_database_it_cannot_open_before_loading_models(capsys, tmp_path):
    """``python app.py --db ...``: a bad store is one error line and exit status 2, seconds in, not a traceback
    after minutes of loading; a plain file path is a SQLite file (tests/test_store_queries.py)."""
    import csd_app
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    for db in ("bogus://x", str(notes)):
        assert csd_app.main(["--db", db, "--port", "7869"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: cannot open the database") and "Traceback" not in err
        assert "loading models" not in err
    assert notes.read_text() == "not a database\n"


def test_a_refused_value_is_escaped_in_the_toast(demo):
    message = refusal(component(demo, "method"), "<img src=x onerror=alert(1)>")
    assert "<img" not in message and "&lt;img src=x onerror=alert(1)&gt;" in message


@pytest.mark.parametrize("button,checked", [("generate-btn", ("gamma", "lam", "log10-tau", "temperature", "max-new",
                                                             "seed", "method")),
                                            ("compare-btn", ("gamma", "lam", "log10-tau", "c-max-new")),
                                            ("teach-run", ("t-method", "gamma", "lam", "log10-tau", "teach-max")),
                                            ("calibrate-btn", ("cal-prompts", "cal-answer", "cal-positions"))])
def test_a_click_checks_the_settings_before_it_joins_the_lane(demo, button, checked):
    """The click's first step (the request for the model, private) takes the run's checked settings as
    inputs, so gradio refuses one out of range before the request waits for the model."""
    btn = component(demo, button)
    first = [fn for fn in demo.fns.values() if (btn._id, "click") in [(t[0], t[1]) for t in fn.targets]]
    assert len(first) == 1
    ids = {b._id for b in first[0].inputs}
    for elem_id in checked:
        assert component(demo, elem_id)._id in ids, elem_id



def test_a_request_refused_before_its_run_leaves_no_stale_status(services, demo):
    """A click whose run gradio refused after its request joined the lane: the request is withdrawn (no
    "Starting…", nothing ahead of the next one) and the status line says it was not run; a click refused
    before it joined says so too. Both steps of a click wire this on failure."""
    sess, line, _ = jobs.request_job(services, "generate", None)
    assert "Starting" in line and len(services.lane) == 1
    line = jobs.refused(services, "generate", sess)
    assert "Not run" in line and "Starting" not in line and len(services.lane) == 0
    assert "Not run" in jobs.status_line(services, sess, "generate")
    assert "Not run" in jobs.refused(services, "generate", None)
    wired = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", None) == "said_no"]
    assert len(wired) == 8     # generate, compare, teach, calibrate: the request and the run


def test_a_refused_prompt_keeps_its_reason_in_the_status_line(services):
    """The reason is the line's, not only a toast's: the status timer draws it again until the next click."""
    sess = common.ensure_session(services, None)
    with pytest.raises(gr.Error, match="the prompt is empty"):
        jobs.request_job(services, "generate", sess, "   ", True, session_hash="page-1")
    line = jobs.refused(services, "generate", sess, "page-1")
    assert "Not run: the prompt is empty." in line and "the message says why" not in line
    assert "Not run: the prompt is empty." in jobs.poll_status(services, sess)[0]
    with pytest.raises(gr.Error):
        jobs.request_job(services, "generate", None, "", True, session_hash="page-2")
    assert "Not run: the prompt is empty." in jobs.refused(services, "generate", None, "page-2")


def test_the_queue_holds_a_class_and_light_work_does_not_wait_for_the_model(demo):
    """A class of 20 at once, each with a model request and a light event queued, is not refused; the
    sliders' recolouring, the Teach steps and the charts run in the light group, never the model's."""
    assert demo._queue.max_size >= 40
    model = [fn for fn in demo.fns.values() if fn.concurrency_id == "model"]
    assert {fn.api_name for fn in model} >= {"generate", "compare", "teach_run", "calibrate"}
    light = {fn.api_name for fn in demo.fns.values() if fn.concurrency_id == "light"}
    assert {"recolour", "teach_next", "teach_prev", "teach_play", "analyse", "export_answer"} <= light
    assert not {fn.api_name for fn in model} & light
