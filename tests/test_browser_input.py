"""Number boxes taken as typed, in a real headless Chromium (as test_browser.py, tiny models served in this
process): text that is not a number in λ's box, the seed box or Compare's max new tokens starts no run and
names the box by its label; a half-typed value draws no error; a number typed and committed is the one the
run uses (read back from the store). Screenshots go to $CSD_SCREENSHOT_DIR.
"""
from __future__ import annotations

import sqlite3

import browser_kit
import pytest
from browser_kit import TINY_PROMPT, WAIT_MS, need_chromium, new_page, open_tab, set_number, status, wait_status

need_chromium()
from ui_fixtures import served, tiny_services  # noqa: E402

pytestmark = pytest.mark.slow

shots_fixture, browser_fixture = browser_kit.shots_fixture, browser_kit.browser_fixture  # fixtures

TOASTS = "() => [...document.querySelectorAll('.toast-message-item')].filter(e => e.offsetParent !== null)" \
         ".map(e => e.innerText)"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(url, the store's SQLite file) of the app on tiny models."""
    from csd.db.store import Store
    db = tmp_path_factory.mktemp("browser-input") / "ui.sqlite3"
    store = Store.open(f"sqlite:///{db}")
    with served(tiny_services(store, status_interval_s=0.5)) as url:
        yield url, db
    store.close()


def runs(db) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute("select kind, method, lam, seed, max_new_tokens from runs order by id").fetchall()
    finally:
        con.close()


def type_into(page, elem_id: str, text: str) -> None:
    """Type ``text`` key by key into a number box, over what it held, then leave the box."""
    box = page.locator(f"#{elem_id} input[data-csd-number]").first
    box.click()
    box.press("Control+a")
    box.press("Backspace")
    page.keyboard.type(text)
    box.blur()


@pytest.mark.parametrize("elem_id,tab,button,status_id,label,words", [
    ("lam", "Generate", "#generate-btn", "gen-status", "λ (memory count threshold)", "a whole number from 0 to 64"),
    ("seed", "Generate", "#generate-btn", "gen-status", "Seed (sampling only)", "a whole number, 0 or more"),
    ("c-max-new", "Compare", "#compare-btn", "compare-status", "Max new tokens", "a whole number from 1 to 512"),
])
def test_text_that_is_not_a_number_starts_no_run_and_names_the_box(browser, app, shots, elem_id, tab, button,
                                                                  status_id, label, words):
    url, db = app
    before = runs(db)
    pg = new_page(browser, url, 1440, 900)
    try:
        open_tab(pg, tab)
        if tab == "Generate":
            pg.locator("#prompt textarea").fill(TINY_PROMPT)
        type_into(pg, elem_id, "abc")
        box = pg.locator(f"#{elem_id} input[data-csd-number]").first
        said = f'{label} must be {words}; got "abc".'
        assert box.input_value() == "abc" and box.get_attribute("aria-invalid") == "true"   # kept as typed
        assert pg.locator(f"#{elem_id} .csd-number-error").inner_text() == said          # at the box, on blur
        pg.click(button)
        wait_status(pg, f"Not run: {said}", elem_id=status_id)
        pg.wait_for_timeout(1500)                           # nothing was sent: no run, no toast, no stale status
        assert f"Not run: {said}" in status(pg, status_id) and pg.evaluate(TOASTS) == []
        assert box.input_value() == "abc"
        pg.screenshot(path=str(shots / f"number-box-{elem_id}-abc.png"))
    finally:
        pg.context.close()
    assert runs(db) == before


def test_a_value_is_read_when_the_box_is_left_not_on_each_keystroke(browser, app):
    url, db = app
    pg = new_page(browser, url, 1440, 900)
    try:
        box = pg.locator("#lam input[data-csd-number]").first
        box.click()
        box.press("Control+a")
        pg.keyboard.type("-", delay=50)
        pg.wait_for_timeout(1000)
        assert pg.evaluate(TOASTS) == []                  # "-" on its way to "-1": not "got nothing"
        pg.keyboard.type("1")
        pg.wait_for_timeout(1000)
        assert pg.evaluate(TOASTS) == []
        box.blur()                                        # left: read, and refused with its range
        pg.wait_for_function(f"() => ({TOASTS})().some(t => t.includes('from 0 to 64; got -1'))", timeout=WAIT_MS)
        assert box.input_value() == "-1"
        # numbers typed and committed are what the run uses
        pg.locator("#prompt textarea").fill(TINY_PROMPT)
        for elem_id, value in (("lam", 7), ("seed", 3), ("max-new", 12)):
            set_number(pg, elem_id, value)
        pg.wait_for_timeout(300)
        pg.click("#generate-btn")
        wait_status(pg, "Done: 12 tokens")
    finally:
        pg.context.close()
    assert runs(db)[-1] == ("generate", "csd", 7.0, 3, 12)


def test_an_empty_box_that_needs_a_number_says_so_by_its_label(browser, app):
    """An emptied rival's box is named by its label (it was "tau_lossy is missing", the engine's field)."""
    url, db = app
    before = runs(db)
    pg = new_page(browser, url, 1440, 900)
    try:
        pg.click("#rivals-panel button")
        type_into(pg, "tau-lossy", "")
        pg.locator("#prompt textarea").fill(TINY_PROMPT)
        pg.click("#generate-btn")
        wait_status(pg, "Not run: lossy: τ must be between 0.001 and 1; it is empty.")
    finally:
        pg.context.close()
    assert runs(db) == before
