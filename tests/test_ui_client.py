"""The app launched as ``python app.py`` on a free local port, driven through ``gradio_client``.

Each step is a named endpoint (api_name): /generate streams coloured events and metrics, /stop
cancels, /recolour and /analyse answer without a model, /explore_events keeps sessions apart,
/memory_upload refuses foreign files, and bad input comes back as a clear error.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradio_client import Client, handle_file

from appserver import running_app
PROSE = "Write a short paragraph about why people enjoy walking in the mountains."
ALL_STATUSES = ["accepted", "rescued", "rejected", "corrected", "bonus", "target"]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """``python app.py`` on a free port with its own SQLite file; stopped after the module."""
    with running_app(tmp_path_factory.mktemp("client-app"), "--queue-size", "8", "--concurrency", "1") as url:
        yield url


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def gen_args(prompt=PROSE, method="csd", lam=0, log10_tau=-2, max_new=16, gamma=6):
    # prompt, chat, method, gamma, lambda, log10 tau, temperature, max new tokens, seed, hide rejected
    return (prompt, True, method, gamma, lam, log10_tau, 0, max_new, 0, False)


def file_of(value) -> str:
    """A download button's new value as the client returns it (an update carrying the file)."""
    return value["value"] if isinstance(value, dict) else value


def test_endpoints_are_named(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    for name in ("/generate", "/stop", "/recolour", "/compare", "/analyse", "/explore_events", "/export_csv",
                 "/memory_view", "/calibrate", "/memory_upload", "/memory_download", "/teach_run", "/teach_next"):
        assert name in names, name


def test_generate_streams_coloured_events_and_metrics(client):
    job = client.submit(*gen_args(), api_name="/generate")
    updates = [u for u in job]                       # every streamed page update
    tokens, metrics_html, metrics, whatif = job.result()
    assert len(updates) >= 2, "the answer should stream in several updates"
    spans = re.findall(r'<span class="tok (tok-[a-z]+)[^"]*" data-status="([a-z]+)"', tokens)
    assert spans and all(cls == f"tok-{st}" or (st == "corrected" and cls == "tok-corrected") for cls, st in spans)
    assert {st for _, st in spans} <= set(ALL_STATUSES) - {"target"}
    n_out = sum(st != "rejected" for _, st in spans)
    assert n_out == metrics["new_tokens"] and (metrics["new_tokens"] == 16 or metrics["stopped_by"] == "eos")
    assert 1 <= metrics["target_forwards"] <= metrics["new_tokens"]
    assert metrics["mean_accepted_length"] == pytest.approx(metrics["new_tokens"] / metrics["target_forwards"])
    assert 'data-state="done"' in metrics_html and "tokens / s" in metrics_html
    # the first update says at once that the run started; the next ones hold coloured tokens
    assert "drafting and verifying the first block" in updates[0][0] and "tok tok-" in updates[1][0]


def test_recolour_and_analyse_need_no_model(client):
    tokens, line = client.predict(0, 0.0, False, api_name="/recolour")    # tau = 1: nothing passes the gate
    n_rescued = tokens.count('data-status="rescued"')
    assert tokens.count("wi-reject") == n_rescued
    assert line.startswith("At λ = 0, τ = 1") or line.startswith("No divergences")
    pareto, gaps, positions, heat, summary, last = client.predict("this session", 6, -2, False, api_name="/analyse")
    assert "divergences logged" in summary


def test_sessions_are_separate(client, app_url):
    rows = client.predict("this session", 0, ALL_STATUSES, "any", "", api_name="/explore_events")
    table, caption, _ = rows
    assert len(table["data"]) > 0 and not caption.startswith("0 ")
    other = Client(app_url, verbose=False)
    table, caption, _ = other.predict("this session", 0, ALL_STATUSES, "any", "", api_name="/explore_events")
    assert table["data"] == [] or table["data"] == [[""] * len(table["headers"])]
    assert caption.startswith("0 events")
    table, caption, _ = other.predict("all runs", 0, ALL_STATUSES, "any", "", api_name="/explore_events")
    assert not caption.startswith("0 ")
    path = file_of(client.predict("this session", 0, ALL_STATUSES, "any", "", api_name="/export_csv"))
    header = Path(path).read_text().splitlines()[0].split(",")
    assert header[:2] == ["run_id", "seq"] and "gap" in header and "context" in header


def test_bad_input_gets_a_clear_message_and_the_app_keeps_working(client):
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict(*gen_args(prompt="   "), api_name="/generate")
    with pytest.raises(Exception, match="(?i)gamma|maximum"):
        client.predict(*gen_args(gamma=40), api_name="/generate")
    with pytest.raises(Exception, match="greater than maximum value 0"):   # log10 tau > 0 means tau > 1
        client.predict(*gen_args(log10_tau=0.5), api_name="/generate")
    with pytest.raises(Exception, match="lambda must be a count >= 0|less than minimum"):
        client.predict(*gen_args(lam=-1), api_name="/generate")
    tokens, _, metrics, _ = client.predict(*gen_args(max_new=4, method="sd"), api_name="/generate")
    assert metrics["new_tokens"] >= 1 and "tok tok-" in tokens


def test_stop_cancels_and_keeps_what_was_made(client):
    job = client.submit(*gen_args(max_new=200), api_name="/generate")
    for _ in job:
        break                                        # the first streamed update has arrived
    client.predict(api_name="/stop")
    tokens, _, metrics, _ = job.result(timeout=300)
    assert metrics["stopped_by"] == "cancelled" and 1 <= metrics["new_tokens"] < 200


def test_memory_upload_refuses_other_files(client, tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2, 3]")
    _, _, err = client.predict(handle_file(str(junk)), 6, api_name="/memory_upload")
    assert "not a CSD Explorer correction-memory file" in err
    path = file_of(client.predict(api_name="/memory_download"))
    summary, table, err = client.predict(handle_file(path), 6, api_name="/memory_upload")
    assert err == "" and "patterns" in summary


def test_calibrate_with_progress(client):
    summary, table = client.predict("default corpus", None, 200, 6, api_name="/calibrate")
    assert re.search(r"default corpus: \d+ positions\. This memory belongs to your session only", summary), summary
