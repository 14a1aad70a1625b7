"""The app served in this process on tiny models (``ui_fixtures``), driven through ``gradio_client``.

Each step is a named endpoint (api_name): /generate streams one update per verify pass, /stop
cancels, /recolour and /analyse answer without a model, /explore_events keeps sessions apart,
/export_csv exports what the filter shows, /memory_upload refuses foreign or damaged files with
the engine's message, /calibrate counts exactly what it is asked, and bad input comes back as a
clear error. The gate holds the engine inside a pass where a test needs it to wait.
"""
from __future__ import annotations

import csv
import logging
import re
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from ui_fixtures import Gate, served, tiny_services

from csd.ui.rules import RIVAL_FIELDS
from csd.ui.tabs import common, explore

PROMPT = "Write about the cat on the mat and the dog in the park."
ALL_STATUSES = ["accepted", "rescued", "rejected", "corrected", "bonus", "target"]


@pytest.fixture(scope="module")
def gate():
    return Gate()


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, gate):
    from csd.db.store import Store
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('client-app') / 'ui.sqlite3'}")
    with served(tiny_services(store, gate=gate, max_prompt_tokens=100)) as url:
        yield url
    store.close()


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def gen_args(prompt=PROMPT, method="csd", lam=6, log10_tau=-0.5, max_new=24, gamma=4, auto=False):
    # prompt, chat, method, gamma, auto gamma, lambda, log10 tau, temperature, max new tokens, seed, hide rejected
    return (prompt, True, method, gamma, auto, lam, log10_tau, 0, max_new, 0, False)


def file_of(value) -> str:
    """A download button's new value as the client returns it (an update carrying the file)."""
    return value["value"] if isinstance(value, dict) else value


def test_endpoints_are_named(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    for name in ("/generate", "/stop", "/recolour", "/compare", "/analyse", "/explore_events", "/export_csv",
                 "/memory_view", "/calibrate", "/memory_upload", "/memory_download", "/teach_run", "/teach_next",
                 "/export_answer", "/stop_compare", "/stop_calibrate"):
        assert name in names, name


def test_generate_takes_the_copy_switch_last_and_defaults_it_on(client):
    """Scripts written before the switches existed (11 values) still work, with the tab's defaults
    (copies on, as the command line's --lookup 16; show speculation on); a 12th value False turns
    copying off, a 13th value False turns show speculation off."""
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    params = api["/generate"]["parameters"]
    names = [p["parameter_name"] for p in params]
    at = names.index("lookup")                 # the 12th and 13th values; the rivals' parameters follow, optional
    assert names[at + 1] == "show_spec" and at == 11
    assert params[at]["parameter_default"] is True and params[at + 1]["parameter_default"] is True
    assert all(p["parameter_has_default"] for p in params[at:])
    assert names[at + 2:] == list(RIVAL_FIELDS)
    compare_names = [p["parameter_name"] for p in api["/compare"]["parameters"]]
    assert compare_names[7:] == ["show_spec", "method_1", "method_2", "method_3", *RIVAL_FIELDS]
    code = "Repeat this code exactly, in a python block:\ndef add(a, b):\n    total = a + b\n    return total"
    tokens, *_, metrics, _what_if, _status = client.predict(*gen_args(prompt=code, method="sd", max_new=32),
                                                            api_name="/generate")
    assert metrics["lookup_blocks"] > 0                          # the answer repeats the prompt's tokens
    assert len(re.findall(r'class="tok [^"]*\bcopied\b', tokens)) == metrics["lookup_kept"]
    *_, plain, _what_if, _status = client.predict(*gen_args(prompt=code, method="sd", max_new=32), False,
                                                  api_name="/generate")
    assert plain["lookup_blocks"] == 0                            # the 12th value turns it off


def test_generate_streams_one_update_per_verify_pass(client):
    job = client.submit(*gen_args(), api_name="/generate")
    updates = [u for u in job]
    tokens, summary, metrics_html, metrics, whatif, status = job.result()
    assert "Reading the prompt" in updates[0][0]
    passes = [u[0].count("data-pass-end") for u in updates[1:]]
    assert passes == list(range(1, metrics["target_forwards"] + 1)) + [metrics["target_forwards"]]
    spans = re.findall(r'<span class="tok (tok-[a-z]+)[^"]*" data-i="\d+" data-status="([a-z]+)"', tokens)
    assert spans and all(cls == f"tok-{st}" for cls, st in spans)
    assert sum(st != "rejected" for _, st in spans) == metrics["new_tokens"] == 24
    assert metrics["mean_accepted_length"] == pytest.approx(metrics["new_tokens"] / metrics["target_forwards"])
    assert 'data-state="done"' in metrics_html and "Done: 24 tokens" in status and "rescued" in summary


def test_stop_cancels_and_keeps_what_was_made(client, gate):
    gate.arm(4)                                      # hold the engine inside its third verify pass
    try:
        job = client.submit(*gen_args(max_new=200), api_name="/generate")
        assert gate.reached.wait(60)
        status = client.predict(api_name="/stop")
        assert 'data-state="stopping"' in status and "Stopping" in status
    finally:
        gate.open()
    tokens, _, _, metrics, _, status = job.result(timeout=120)
    assert metrics["stopped_by"] == "cancelled" and 1 <= metrics["new_tokens"] < 200
    assert "Stopped:" in status and metrics["target_forwards"] == 3


def test_recolour_and_analyse_need_no_model(client, gate):
    gate.arm(None)
    tokens, line = client.predict(0, 0.0, False, api_name="/recolour")    # tau = 1: nothing passes the gate
    assert tokens.count("wi-reject") == tokens.count('data-status="rescued"')
    assert line.startswith("At λ = 0, τ = 1")
    pareto, gaps, positions, heat, summary, heading, last, targets = client.predict(
        common.SCOPE_SESSION, 6, -2, False, api_name="/analyse")     # a script written before the target filter
    assert "divergences logged" in summary and gate.calls == 0
    summary = client.predict(common.SCOPE_SESSION, 6, -2, False, target="bfloat16", api_name="/analyse")[4]
    assert summary.startswith("**this session, target bfloat16**: 0 divergences logged")


def test_sessions_are_separate_and_the_shared_scope_says_so(client, app_url):
    table, caption, *_ = client.predict(common.SCOPE_SESSION, 0, ALL_STATUSES, "any", "", api_name="/explore_events")
    assert len(table["data"]) > 0 and not caption.startswith("0 ")
    other = Client(app_url, verbose=False)
    table, caption, *_ = other.predict(common.SCOPE_SESSION, 0, ALL_STATUSES, "any", "", api_name="/explore_events")
    assert caption.startswith("0 events")
    table, caption, *_ = other.predict(common.SCOPE_ALL, 0, ALL_STATUSES, "any", "", api_name="/explore_events")
    assert "shared" in common.SCOPE_ALL and not caption.startswith("0 ")


def test_csv_export_matches_the_filter(client):
    _, caption, *_ = client.predict(common.SCOPE_SESSION, 0, ["rescued"], "any", "", api_name="/explore_events")
    n = int(caption.split()[0])
    path = file_of(client.predict(common.SCOPE_SESSION, 0, ["rescued"], "any", "", api_name="/export_csv"))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n > 0 and {r["status"] for r in rows} == {"rescued"}
    assert Path(path).name == f"csd-events-{n}.csv"


def test_bad_input_gets_a_clear_message_and_the_app_keeps_working(client):
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict(*gen_args(prompt="   "), api_name="/generate")
    with pytest.raises(Exception, match="at most 100 tokens"):
        client.predict(*gen_args(prompt="the cat " * 80), api_name="/generate")
    with pytest.raises(Exception, match="from 1 to 32; got 40"):
        client.predict(*gen_args(gamma=40), api_name="/generate")
    with pytest.raises(Exception, match=r"between -4 and 0 \(τ from 0.0001 to 1\); got 0.5"):   # tau > 1
        client.predict(*gen_args(log10_tau=0.5), api_name="/generate")
    tokens, _, _, metrics, _, status = client.predict(*gen_args(max_new=4, method="sd", auto=True),
                                                      api_name="/generate")
    assert metrics["new_tokens"] == 4 and "tok tok-" in tokens


# (endpoint, arguments with one setting out of range, the sentence's range)
REFUSED = [
    ("/generate", gen_args(gamma=33), "γ (the draft block length) must be a whole number from 1 to 32; got 33."),
    ("/generate", gen_args(lam=-2), "λ (the memory count threshold) must be a whole number from 0 to 64; got -2."),
    ("/generate", gen_args(log10_tau=-5),
     "τ's power of ten (the gate threshold) must be between -4 and 0 (τ from 0.0001 to 1); got -5."),
    ("/generate", gen_args()[:7] + (3,) + gen_args()[8:], "Temperature must be between 0 and 2 (0 = greedy); got 3."),
    ("/generate", gen_args(max_new=0),
     "Max new tokens must be a whole number from 1 to 512 (this app's limit); got 0."),
    ("/generate", gen_args()[:9] + (-1,) + gen_args()[10:], "Seed must be a whole number, 0 or more; got -1."),
    ("/compare", (PROMPT, True, 40, False, 6, -2, 8), "from 1 to 32; got 40."),
    ("/compare", (PROMPT, True, 4, False, 6, -2, 600), "Max new tokens must be a whole number from 1 to 512"),
    ("/teach_run", (PROMPT, "csd", 4, 6, -4.5, 8), "between -4 and 0 (τ from 0.0001 to 1); got -4.5."),
    ("/teach_run", (PROMPT, "csd", 4, 6, -2, 129), "Teach's max new tokens must be a whole number from 4 to 128"),
]


def test_out_of_range_settings_are_refused_with_the_range_and_the_session_is_kept(app_url, gate, capfd, caplog):
    """Through the API, each setting out of range is refused before the handler runs, with a sentence
    naming the range; the server logs one line for each and no traceback; the caller's session (its
    last answer, its memory) is what it was before."""
    gate.arm(None)
    caplog.set_level(logging.INFO, logger="csd.ui")
    own = Client(app_url, verbose=False)
    *_, metrics, _, status = own.predict(*gen_args(max_new=12, lam=0), api_name="/generate")
    assert "Done: 12 tokens" in status
    before = (own.predict(0, -0.5, False, api_name="/recolour"), own.predict(0, api_name="/memory_view"))
    capfd.readouterr()
    caplog.clear()
    for endpoint, args, words in REFUSED:
        with pytest.raises(Exception) as err:
            own.predict(*args, api_name=endpoint)
        assert words in str(err.value), (endpoint, str(err.value))
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused: ")]
    assert len(refused) == len(REFUSED) and all(r.exc_info is None for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err
    after = (own.predict(0, -0.5, False, api_name="/recolour"), own.predict(0, api_name="/memory_view"))
    assert after == before and "tok tok-" in after[0][0] and "patterns" in after[1][0]
    assert own.predict(*gen_args(max_new=4), api_name="/generate")[-1].count("Done: 4 tokens") == 1


def test_memory_upload_refuses_other_files(client, tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2, 3]")
    _, _, err = client.predict(handle_file(str(junk)), 6, api_name="/memory_upload")
    assert "not a CSD Explorer correction-memory file" in err
    path = file_of(client.predict(api_name="/memory_download"))
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(Path(path).read_bytes()[:30])
    _, _, err = client.predict(handle_file(str(cut)), 6, api_name="/memory_upload")
    assert "cut.json.gz: a damaged or truncated gzip file" in err
    summary, table, err = client.predict(handle_file(path), 6, api_name="/memory_upload")
    assert err == "" and "patterns" in summary


def test_calibrate_counts_what_it_is_asked(client):
    summary, table, status = client.predict(explore.CAL_TEXT, explore.SRC_SHIPPED, None, 8, 16, 300, 6,
                                            api_name="/calibrate")
    assert "shipped corpus: 300 positions" in summary and "300 positions" in status
    summary, table, status = client.predict(explore.CAL_PROMPTS, explore.SRC_SHIPPED, None, 2, 8, 300, 6,
                                            api_name="/calibrate")
    assert "shipped prompts: 2 prompts" in summary and "your session only" in summary
