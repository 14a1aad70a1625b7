"""The whole app in a real headless Chromium (Debian's /usr/bin/chromium driven by playwright).

Starts ``python app.py`` on a free port with a fresh SQLite store, then: runs a CSD generation and
waits for streamed coloured tokens (printing the time from the click to the first token), moves
tau and sees the recolouring, opens the Pareto chart, checks that a prompt containing
``<img src=x onerror=alert(1)>`` shows as text and runs no script, visits every view, and checks
that the page fetched nothing from outside 127.0.0.1. Screenshots go to $CSD_SCREENSHOT_DIR
(default: <tmp>/csd-screenshots).
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
XSS = "<img src=x onerror=alert(1)>"
RUN_TIMEOUT_MS = 300_000

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing: .ci/run must install Debian's chromium")
    pytest.skip(f"{CHROMIUM} is not installed (Debian package chromium)", allow_module_level=True)
from playwright import sync_api  # noqa: E402

from appserver import running_app  # noqa: E402


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """``python app.py`` on a free port with its own SQLite file; stopped after the module.
    CSD_TEST_APP_URL points the test at an app that is already running instead."""
    if os.environ.get("CSD_TEST_APP_URL"):
        yield os.environ["CSD_TEST_APP_URL"].rstrip("/")
        return
    with running_app(tmp_path_factory.mktemp("browser-app")) as url:
        yield url


@pytest.fixture(scope="module")
def shots() -> Path:
    d = Path(os.environ.get("CSD_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "csd-screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser, app_url):
    """A fresh page (a fresh gradio session) that records dialogs and requests leaving 127.0.0.1."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.dialogs, pg.external = [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("request", lambda r: pg.external.append(r.url)
          if not r.url.startswith(("http://127.0.0.1", "data:", "blob:", "about:")) else None)
    pg.goto(app_url)
    pg.wait_for_selector("#generate-btn", timeout=60_000)
    yield pg
    ctx.close()


# -- helpers ---------------------------------------------------------------------------------------
def set_number(page, elem_id: str, value) -> None:
    """Type a value into the number box of a slider or number component and commit it."""
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")
    box.blur()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def generate(page, prompt: str, max_new: int) -> float:
    """Fill the prompt, click Generate, wait for the first streamed token and for the end.
    Returns the seconds from the click to the first coloured token of this run."""
    page.locator("#prompt textarea").fill(prompt)
    set_number(page, "max-new", max_new)
    page.wait_for_timeout(300)
    t0 = time.perf_counter()
    page.click("#generate-btn")
    # The first streamed update shows this prompt above the answer, with the first token.
    page.wait_for_function(
        """p => { const h = document.querySelector('#tokens .csd-prompt');
                  return h && h.innerText.includes(p) && document.querySelectorAll('#tokens .tok').length > 0; }""",
        arg=prompt.strip(), timeout=RUN_TIMEOUT_MS, polling=50)
    first = time.perf_counter() - t0
    page.wait_for_selector('#metrics [data-state="done"]', timeout=RUN_TIMEOUT_MS)
    return first


def token_classes(page) -> list[str]:
    return page.locator("#tokens .tok").evaluate_all("els => els.map(e => e.className)")


# -- the test --------------------------------------------------------------------------------------
def test_app_in_a_real_browser(page, shots):
    # 1. A CSD generation streams coloured tokens. lambda = 0 lets the memory pass every pattern,
    #    so the gate (tau) decides and moving tau must change decisions.
    set_number(page, "lam", 0)
    first = generate(page, "Write a short paragraph about why people enjoy walking in the mountains.", 24)
    server = re.search(r"([0-9.]+) s\s*first token after", page.locator("#metrics").inner_text())
    note = (f"{first:.2f} s from clicking Generate to the first streamed token in the browser"
            + (f" ({server.group(1)} s of it in the engine's first draft + verify pass)" if server else ""))
    print("\n" + note)
    (shots / "first-token.txt").write_text(note + "\n")
    classes = token_classes(page)
    assert classes and all(c.startswith("tok ") for c in classes)
    statuses = {c.split()[1] for c in classes}
    assert statuses <= {"tok-accepted", "tok-rescued", "tok-rejected", "tok-corrected", "tok-bonus"}, statuses
    assert "tok-accepted" in statuses
    tip = page.locator("#tokens .tok").first.get_attribute("title")
    assert "position 0" in tip and "block 0" in tip
    metrics = page.locator("#metrics").inner_text()
    assert "tokens / s" in metrics and "target passes" in metrics
    page.screenshot(path=str(shots / "generate.png"), full_page=True)

    # 2. Moving tau recolours the answer: at tau = 1 (log tau = 0) no divergence passes the gate,
    #    so every rescued token is outlined as "would be rejected"; at tau = 1e-4 more pass.
    n_rescued = sum("tok-rescued" in c for c in classes)
    n_div = n_rescued + sum("tok-rejected" in c for c in classes)
    assert n_div > 0, "a 24-token prose answer should diverge somewhere"
    set_number(page, "log10-tau", 0)
    page.wait_for_function("n => document.querySelectorAll('#tokens .tok.wi-reject').length === n", arg=n_rescued,
                           timeout=60_000)
    assert "would be rescued" in page.locator("#whatif-line").inner_text()
    after_hi = token_classes(page)
    page.screenshot(path=str(shots / "generate-recoloured-tau1.png"), full_page=True)
    set_number(page, "log10-tau", -4)
    page.wait_for_function("() => document.querySelectorAll('#tokens .tok.wi-reject').length === 0",
                           timeout=60_000)
    assert token_classes(page) != after_hi or n_rescued == 0
    if n_rescued == 0:   # nothing rescued to un-rescue: the rejected ones must light up instead
        assert page.locator("#tokens .tok.wi-rescue").count() > 0

    # 3. The Pareto chart (and the other analyse charts) from the store.
    set_number(page, "log10-tau", -2)
    open_tab(page, "Analyse")
    page.wait_for_selector("#pareto-plot .js-plotly-plot", timeout=60_000)
    page.wait_for_function("() => document.querySelectorAll('#pareto-plot .bars path').length > 0", timeout=60_000)
    assert "Pareto" in page.locator("#pareto-plot").inner_text()
    page.wait_for_selector("#whatif-plot .js-plotly-plot", timeout=60_000)
    page.wait_for_selector("#gap-plot .js-plotly-plot", timeout=60_000)
    assert "divergences logged" in page.locator("#analyse-summary").inner_text()
    page.screenshot(path=str(shots / "analyse.png"), full_page=True)

    # 4. Explore & memory: the events table of this session, the memory's top patterns.
    open_tab(page, "Explore & memory")
    page.wait_for_function("() => document.querySelector('#memory-summary')?.innerText.includes('patterns')",
                           timeout=60_000)
    page.click("#events-btn")
    page.wait_for_function("() => document.querySelectorAll('#events-table tbody tr').length > 0", timeout=60_000)
    page.screenshot(path=str(shots / "explore-memory.png"), full_page=True)

    # 5. Teach: one speculative iteration at a time.
    open_tab(page, "Teach")
    set_number(page, "teach-max", 12)
    page.click("#teach-run")
    page.wait_for_selector("#teach-view table", timeout=RUN_TIMEOUT_MS)
    assert "Iteration 1 of" in page.locator("#teach-view").inner_text()
    page.click("#teach-next")
    page.wait_for_function("() => document.querySelector('#teach-view').innerText.includes('Iteration 2 of')",
                           timeout=60_000)
    page.screenshot(path=str(shots / "teach.png"), full_page=True)

    # 6. Compare: AR, SD, CSD side by side with the chart.
    open_tab(page, "Compare")
    set_number(page, "c-max-new", 12)
    page.click("#compare-btn")
    page.wait_for_function("() => document.querySelectorAll('#compare-plot .bars path').length >= 3",
                           timeout=3 * RUN_TIMEOUT_MS)
    for m in ("ar", "sd", "csd"):
        assert page.locator(f"#pane-{m} .tok").count() > 0
    page.screenshot(path=str(shots / "compare.png"), full_page=True)

    # 7. A prompt with markup is shown as text and runs nothing.
    open_tab(page, "Generate")
    generate(page, f"Repeat exactly this text and nothing else: {XSS}", 16)
    assert XSS in page.locator("#tokens .csd-prompt").inner_text()
    assert page.locator("img[src='x']").count() == 0
    page.wait_for_timeout(1000)
    assert page.dialogs == [], page.dialogs
    page.screenshot(path=str(shots / "generate-xss.png"), full_page=True)
    # ... and in the events table too (every status, filtered on the markup's text)
    open_tab(page, "Explore & memory")
    page.get_by_label("accepted", exact=True).check()
    page.get_by_label("Text contains").fill("img")
    page.click("#events-btn")
    page.wait_for_function("() => document.querySelectorAll('#events-table tbody tr').length > 0", timeout=60_000)
    page.wait_for_timeout(500)
    assert page.locator("img[src='x']").count() == 0 and page.dialogs == []
    assert "<img" in page.locator("#events-table").inner_text()
    open_tab(page, "Generate")

    # 8. Bad input gets a clear message, and the app keeps working.
    page.locator("#prompt textarea").fill("   ")
    page.click("#generate-btn")
    page.wait_for_selector("text=the prompt is empty", timeout=60_000)
    page.screenshot(path=str(shots / "error.png"))    # the message is a toast over the viewport
    # ... and the app keeps working after it
    first_again = generate(page, "What is 2 + 2?", 4)
    assert page.locator("#tokens .tok").count() > 0 and first_again > 0

    assert page.external == [], f"the page fetched from outside: {page.external[:5]}"
    print(f"screenshots in {shots}")
