"""The page's status line under load, in a real headless Chromium (as test_browser.py): requests made through
the API count ahead of a page's request while they wait in gradio's queue (not only once they start), and a
request that waits is never called refused. The app is served in this process on tiny models whose target
passes go through a gate, so the model is held while the queue fills. Screenshots go to $CSD_SCREENSHOT_DIR.
"""
from __future__ import annotations

import re
import time

import browser_kit
import pytest
from browser_kit import TINY_PROMPT, WAIT_MS, need_chromium, new_page, start, wait_status

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
