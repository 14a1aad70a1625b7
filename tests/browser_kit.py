"""What the browser tests share (test_browser.py on tiny models, test_browser_real.py on the real pair):
Debian's Chromium driven by playwright, a fresh page per user, and the few gestures every test makes."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from playwright import sync_api

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# headless, and nothing that reaches out to the network by itself
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium() -> str | None:
    """The Chromium that playwright drives here (Debian's package), or None."""
    return next((c for c in CHROMIUM_CANDIDATES if Path(c).exists()), None) or shutil.which("chromium")


CHROMIUM = find_chromium()
XSS = "<img src=x onerror=alert(1)>"
RUN_TIMEOUT_MS = 300_000
WAIT_MS = 60_000
PROSE = "Write a short paragraph about why people enjoy walking in the mountains."
TINY_PROMPT = "Write about the cat on the mat and the dog in the park."


def need_chromium() -> None:
    """At a browser test module's top: CI without Chromium fails, elsewhere the module skips."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            raise RuntimeError("Chromium is missing: .ci/run must install Debian's chromium")
        pytest.skip("Chromium is not installed (Debian package chromium)", allow_module_level=True)


def shots_dir() -> Path:
    """Where screenshots go: $CSD_SCREENSHOT_DIR (default: <tmp>/csd-screenshots)."""
    d = Path(os.environ.get("CSD_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "csd-screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module", name="shots")
def shots_fixture() -> Path:
    return shots_dir()


@pytest.fixture(scope="module", name="browser")
def browser_fixture():
    """A headless Chromium for one test module."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def new_page(browser, url: str, width: int = 1400, height: int = 1000):
    """A fresh context (a fresh gradio session) whose page records dialogs and outside requests."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    pg = ctx.new_page()
    pg.dialogs, pg.external = [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("request", lambda r: pg.external.append(r.url)
          if not r.url.startswith(("http://127.0.0.1", "data:", "blob:", "about:")) else None)
    pg.goto(url)
    pg.wait_for_selector("#generate-btn", timeout=WAIT_MS)
    return pg



def set_number(page, elem_id: str, value) -> None:
    """Type a value into the number box of a slider or number component (a text box: ui/static/numbers.js) and
    commit it."""
    box = page.locator(f"#{elem_id} input[data-csd-number]").first
    box.fill(str(value))
    box.press("Enter")
    box.blur()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def status(page, elem_id: str = "gen-status") -> str:
    return page.locator(f"#{elem_id}").inner_text()


def wait_status(page, text: str, elem_id: str = "gen-status", timeout: int = WAIT_MS) -> None:
    page.wait_for_function("([id, t]) => document.querySelector('#' + id)?.innerText.includes(t)",
                           arg=[elem_id, text], timeout=timeout)


def start(page, prompt: str, max_new: int, gamma: int | None = None) -> None:
    page.locator("#prompt textarea").fill(prompt)
    set_number(page, "max-new", max_new)
    if gamma is not None:                     # a fixed block: gamma auto (the default) off
        page.locator("#auto-gamma input[type=checkbox]").uncheck()
        set_number(page, "gamma", gamma)
    page.wait_for_timeout(300)
    page.click("#generate-btn")


def generate(page, prompt: str, max_new: int, gamma: int | None = None) -> float:
    """Fill the prompt, click Generate, wait for the first coloured token and for the end.
    Returns the seconds from the click to the first token of this run."""
    t0 = time.perf_counter()
    start(page, prompt, max_new, gamma)
    page.wait_for_function(
        """p => { const h = document.querySelector('#tokens .csd-prompt');
                  return h && h.innerText.includes(p.slice(0, 60))
                         && document.querySelectorAll('#tokens .tok').length > 0; }""",
        arg=prompt.strip(), timeout=RUN_TIMEOUT_MS, polling=50)
    first = time.perf_counter() - t0
    page.wait_for_selector('#metrics [data-state="done"]', timeout=RUN_TIMEOUT_MS)
    return first


def token_classes(page, where: str = "#tokens") -> list[str]:
    return page.locator(f"{where} .tok").evaluate_all("els => els.map(e => e.className)")
