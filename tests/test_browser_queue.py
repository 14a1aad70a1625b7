"""The page's status line under load, in a real headless Chromium (as test_browser.py): requests made through
the API count ahead of a page's request while they wait in gradio's queue (not only once they start), and a
request that waits is never called refused; Stop on a queued page ends it at once and the pages behind move
up; the wait estimate never says "any moment" while requests wait ahead; an empty SGLang table is refused and
the memory kept; the status line shows the latest refusal, and a corrected box clears a box's refusal. The app
is served in this process on tiny models whose target passes go through a gate, so the model is held while
the queue fills. Screenshots go to $CSD_SCREENSHOT_DIR.
"""
from __future__ import annotations

import re
import time

import browser_kit
import pytest
from browser_kit import TINY_PROMPT, WAIT_MS, need_chromium, new_page, open_tab, set_number, start, status, wait_status

need_chromium()
from ui_fixtures import Gate, served, tiny_services  # noqa: E402

pytestmark = pytest.mark.slow

shots_fixture, browser_fixture = browser_kit.shots_fixture, browser_kit.browser_fixture  # fixtures

API_REQUESTS = 12
# every text the status line shows, as the page draws it (a MutationObserver: nothing is missed between polls)
RECORD = """() => { window.seen = []; const el = document.querySelector('#gen-status');
  new MutationObserver(() => window.seen.push(el.innerText)).observe(el, {subtree: true, childList: true,
                                                                          characterData: true}); }"""


@pytest.fixture(scope="module")
def gate():
    return Gate()


@pytest.fixture(scope="module")
def served_app(gate):
    services = tiny_services(None, gate=gate, status_interval_s=0.5)
    with served(services) as url:
        yield services, url
    gate.open()


def test_api_requests_queued_ahead_count_and_the_page_is_never_told_refused(browser, served_app, gate, shots,
                                                                          monkeypatch):
    """12 API requests, the first held inside its first verify pass, 11 in gradio's queue; then a page clicks
    Generate. Its status line counts all 12 ahead and keeps waiting past the time after which a request that
    never reached the queue is written off; once the model is free, the 12 and the page's run all finish."""
    from gradio_client import Client

    from csd.ui.tabs import jobs
    monkeypatch.setattr(jobs, "ORPHAN_S", 3.0)        # written off after 3 s if it never reached the queue
    services, url = served_app
    gate.arm(2)
    clients = [Client(url, verbose=False) for _ in range(API_REQUESTS)]
    asked = [c.submit("the cat sat on the mat", True, "csd", 4, False, 6, -2, 0, 8, 0, False, api_name="/generate")
             for c in clients]
    assert gate.reached.wait(60), "the first API request never reached the model"
    deadline = time.monotonic() + 60
    while len(services.lane.queue()) < API_REQUESTS - 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(services.lane.queue()) == API_REQUESTS - 1, "the API requests are not in gradio's queue"
    pg = new_page(browser, url, 1440, 900)
    try:
        pg.evaluate(RECORD)
        start(pg, TINY_PROMPT, 8)
        wait_status(pg, f"{API_REQUESTS} requests ahead of yours")
        pg.wait_for_timeout(int(1000 * (jobs.ORPHAN_S + 1.5)))     # past the write-off: still waiting
        assert f"{API_REQUESTS} requests ahead of yours" in pg.locator("#gen-status").inner_text()
        pg.screenshot(path=str(shots / "queued-behind-api-requests.png"))
        gate.open()
        wait_status(pg, "Done: 8 tokens")
        pg.wait_for_selector('#metrics [data-state="done"]', timeout=WAIT_MS)
        seen = pg.evaluate("() => window.seen")
    finally:
        gate.open()
        pg.context.close()
    for a in asked:
        assert a.result(timeout=120)[3]["new_tokens"] == 8
    said = " | ".join(seen)
    assert "refused" not in said and "did not reach" not in said and "Not run" not in said, said
    counts = [int(m.group(1)) for t in seen if (m := re.search(r"(\d+) requests? ahead", t))]
    assert counts and max(counts) == API_REQUESTS and counts == sorted(counts, reverse=True), counts


def ahead(text: str) -> int | None:
    m = re.search(r"(\d+) requests? ahead", text)
    return int(m.group(1)) if m else None


def test_stop_on_a_queued_page_ends_it_at_once_and_the_pages_behind_move_up(browser, served_app, gate, shots):
    """One run ends first (the estimate's measure). Then 12 API requests of 96 tokens, the first held inside its
    first verify pass, and two pages behind them. Stop on the first page ends its request within 10 s while the
    model is still held; the page behind it counts one fewer ahead; once the model is free, the 12 and the second
    page's run finish, and the stopped request never ran."""
    from gradio_client import Client
    services, url = served_app
    first, second = new_page(browser, url, 1440, 900), new_page(browser, url, 1440, 900)
    try:
        gate.open()
        start(first, TINY_PROMPT, 8)
        wait_status(first, "Done: 8 tokens")
        gate.arm(2)
        clients = [Client(url, verbose=False) for _ in range(API_REQUESTS)]
        asked = [c.submit("the cat sat on the mat", True, "csd", 4, False, 6, -2, 0, 96, 0, False,
                          api_name="/generate") for c in clients]
        assert gate.reached.wait(60), "the first API request never reached the model"
        deadline = time.monotonic() + 60
        while len(services.lane.queue()) < API_REQUESTS - 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        for pg in (first, second):
            pg.evaluate(RECORD)
            start(pg, TINY_PROMPT, 8)
        wait_status(first, f"{API_REQUESTS} requests ahead of yours")
        wait_status(second, f"{API_REQUESTS + 1} requests ahead of yours")
        second.wait_for_timeout(3000)                       # the held run grows older: the estimate with it
        t0 = time.monotonic()
        first.click("#stop-btn")
        wait_status(first, "Stopped before it started", timeout=10_000)
        stopped_in = time.monotonic() - t0
        wait_status(second, f"{API_REQUESTS} requests ahead of yours", timeout=10_000)
        assert gate.reached.is_set() and not gate.release.is_set()     # the model never let go meanwhile
        second.screenshot(path=str(shots / "stopped-ahead-moved-up.png"))
        gate.open()
        wait_status(second, "Done: 8 tokens", timeout=120_000)
        seen = {n: pg.evaluate("() => window.seen") for n, pg in (("first", first), ("second", second))}
        # its earlier answer stays: the stopped request drew nothing
        assert "Stopped before it started" in status(first) and first.locator("#tokens .tok").count() == 8
    finally:
        gate.open()
        first.context.close()
        second.context.close()
    assert stopped_in < 10, stopped_in
    for a in asked:
        assert a.result(timeout=120)[3]["new_tokens"] == 96
    said = [t for texts in seen.values() for t in texts]
    assert not [t for t in said if "any moment" in t and (ahead(t) or 0) >= 2], said   # 1 runs, 1+ wait ahead
    assert any("more, from the last" in t for t in seen["second"]), seen["second"]
    counts = [n for t in seen["second"] if (n := ahead(t)) is not None]
    assert counts == sorted(counts, reverse=True) and API_REQUESTS + 1 in counts and API_REQUESTS in counts


def test_the_status_line_shows_the_latest_refusal_and_a_fixed_box_clears_it(browser, served_app, gate):
    """'abc' refused by the page, then -5 refused by the server: the line names the server's refusal, not 'abc'
    (twice over: the second server refusal of the same words is drawn too); a box fixed after a page refusal
    clears the line."""
    _, url = served_app
    gate.open()
    pg = new_page(browser, url)
    try:
        for _ in range(2):
            set_number(pg, "log10-tau", "abc")
            pg.click("#generate-btn")
            wait_status(pg, 'got "abc"')
            set_number(pg, "log10-tau", -5)
            pg.wait_for_timeout(300)
            pg.click("#generate-btn")
            pg.wait_for_function("() => !document.querySelector('#gen-status').innerText.includes('abc')",
                                 timeout=WAIT_MS)
            wait_status(pg, "Not run: the request was refused")
        set_number(pg, "log10-tau", "abc")
        pg.click("#generate-btn")
        wait_status(pg, 'got "abc"')
        set_number(pg, "log10-tau", -1)
        pg.wait_for_function("() => !document.querySelector('#gen-status').innerText.includes('abc')",
                             timeout=5000)
        assert status(pg).strip() == "Ready."
        start(pg, TINY_PROMPT, 4)                              # and the fixed box runs
        wait_status(pg, "Done: 4 tokens")
    finally:
        pg.context.close()


def test_an_empty_table_is_refused_in_the_page_and_the_memory_kept(browser, served_app, tmp_path):
    _, url = served_app
    pg = new_page(browser, url)
    try:
        open_tab(pg, "Explore & memory")
        pg.wait_for_function("() => document.querySelector('#memory-summary')?.innerText.includes('patterns')",
                             timeout=WAIT_MS)
        before = pg.locator("#memory-summary").inner_text()
        assert not before.startswith("0 ")
        for name, text, message in (("empty.jsonl", "", "empty.jsonl is empty"),
                                    ("blank.jsonl", "\n\n  \n", "blank.jsonl is empty"),
                                    ("none.json", '{"metadata": {}, "entries": []}', "none.json holds no entries")):
            (tmp_path / name).write_text(text)
            with pg.expect_file_chooser() as chooser:
                pg.click("#memory-upload")
            chooser.value.set_files(str(tmp_path / name))
            pg.wait_for_function("m => document.querySelector('#memory-error')?.innerText.includes(m)",
                                 arg=message, timeout=WAIT_MS)
            assert pg.locator("#memory-summary").inner_text() == before
    finally:
        pg.context.close()


def test_the_header_says_what_runs_in_plain_words_with_the_detail_folded(browser, served_app):
    _, url = served_app
    pg = new_page(browser, url)
    try:
        head = pg.locator("#header").inner_text()
        assert "Tiny-Draft drafts for Tiny-Target; weights in 32-bit floats; exact: SD gives the target's own " \
               "answer" in head, head
        assert "arXiv 2604.13634" in head and "path)" not in head          # the technical words are folded
        pg.locator("#header summary").click(position={"x": 4, "y": 4})   # its start, not the paper link
        assert "Draft tiny-draft → target tiny-target" in pg.locator("#header").inner_text()
    finally:
        pg.context.close()
