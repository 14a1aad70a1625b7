"""The app in a real headless Chromium (Debian's /usr/bin/chromium driven by playwright), served in
this process on tiny models (``ui_fixtures``) whose target passes go through a gate, so that the page
can be checked while the engine is held at a known point: the first pass is on the page before the
second ends; Stop during the prefill and Stop while queued; two users sharing the model; the phone
layout; the legends; token details and navigation; Teach; memory upload errors; the CSV export.
The real pair, end to end: test_browser_real.py. Screenshots go to $CSD_SCREENSHOT_DIR.
"""
from __future__ import annotations

import csv
import json
import re

import browser_kit
import pytest
from browser_kit import (
    TINY_PROMPT,
    WAIT_MS,
    generate,
    need_chromium,
    new_page,
    open_tab,
    set_number,
    start,
    status,
    wait_status,
)

need_chromium()
from ui_fixtures import Gate, served, tiny_services  # noqa: E402

pytestmark = pytest.mark.slow

shots_fixture, browser_fixture = browser_kit.shots_fixture, browser_kit.browser_fixture  # fixtures


@pytest.fixture(scope="module")
def gate():
    return Gate()


@pytest.fixture(scope="module")
def tiny_url(tmp_path_factory, gate):
    """The app on tiny models, served in this process; its target passes go through ``gate``."""
    from csd.db.store import Store
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('browser-tiny') / 'ui.sqlite3'}")
    services = tiny_services(store, gate=gate, status_interval_s=0.5, max_prompt_tokens=220)
    with served(services) as url:
        yield url
    store.close()


@pytest.fixture(autouse=True)
def open_gate(gate):
    gate.arm(None)
    yield
    gate.open()


@pytest.fixture()
def page(browser, tiny_url):
    pg = new_page(browser, tiny_url)
    yield pg
    assert pg.external == [], f"the page fetched from outside: {pg.external[:5]}"
    pg.context.close()


def test_each_verify_pass_is_on_the_page_before_the_next_one_ends(page, gate, shots):
    """The engine is held inside its second verify pass (target call 3: prefill, pass 1, pass 2).
    Everything pass 1 decided, up to its last event (the correction or bonus, marked pass_end),
    must already be on the page: a throttle that holds back the end of a pass fails here."""
    gate.arm(3)
    start(page, TINY_PROMPT, 24, gamma=4)
    assert gate.reached.wait(60), "the engine never reached its second verify pass"
    page.wait_for_selector('#tokens .tok[data-block="0"][data-pass-end]', timeout=30_000)
    n0 = page.locator('#tokens .tok[data-block="0"]').count()
    assert n0 >= 2 and page.locator('#tokens .tok[data-block="1"]').count() == 0
    assert page.locator("#whatif-line").inner_text().startswith("Verify pass 1:")
    wait_status(page, "verify pass 2 running")                  # the live status during a long pass
    assert page.locator('#tokens .tok.latest[data-block="0"]').count() == n0   # the burst that just came
    gate.open()
    page.wait_for_selector('#metrics [data-state="done"]', timeout=WAIT_MS)
    assert page.locator('#tokens .tok[data-block="0"]').count() == n0
    wait_status(page, "Done: 24 tokens")


def test_stop_during_the_prefill(page, gate, shots):
    """A prompt of two prefill chunks; the engine is held in the first. Stop shows "Stopping…",
    and the run ends before the second chunk, with no token."""
    gate.arm(1)
    start(page, "q" * 200, 16)
    assert gate.reached.wait(60)
    wait_status(page, "reading the prompt (200 tokens)")
    page.click("#stop-btn")
    wait_status(page, "Stopping…")
    page.screenshot(path=str(shots / "stopping-during-prefill.png"))
    gate.open()
    wait_status(page, "Stopped: 0 tokens")
    assert page.locator("#tokens .tok").count() == 0 and gate.calls == 1


def test_a_prompt_over_the_cap_is_refused_at_the_click(page, gate):
    assert "at most 220 tokens" in page.locator("#prompt").inner_text()
    start(page, "q" * 300, 8)
    page.wait_for_selector("text=this app takes prompts of at most 220 tokens", timeout=WAIT_MS)
    assert "--max-prompt-tokens" in page.locator(".toast-body").first.inner_text()
    assert gate.calls == 0 and "Starting" not in status(page)


def test_two_users_share_the_model_and_stop_works_while_queued(browser, tiny_url, gate, shots):
    a, b = new_page(browser, tiny_url), new_page(browser, tiny_url)
    try:
        gate.arm(2)                                     # A holds the model inside its first verify pass
        start(a, TINY_PROMPT, 12, gamma=4)
        assert gate.reached.wait(60)
        start(b, "the dog ran to the hill", 12, gamma=4)
        wait_status(b, "1 request ahead of yours")       # B's queue position, beside B's Generate button
        wait_status(b, "verify pass 1 running")          # and what the request ahead is doing
        b.screenshot(path=str(shots / "queued-second-user.png"))
        b.click("#stop-btn")                            # B gives up while waiting: it leaves the queue at once,
        wait_status(b, "Stopped before it started")      # while A still holds the model (issue 55)
        gate.open()
        wait_status(a, "Done: 12 tokens")
        # read it when it is there: a status timer's re-render can leave the line empty for a moment
        done = a.wait_for_function("() => { const t = document.querySelector('#gen-status')?.innerText || '';"
                                   " return /in \\d+ verify pass/.test(t) ? t : null; }", timeout=WAIT_MS).json_value()
        passes = int(re.search(r"in (\d+) verify pass", done).group(1))
        assert gate.calls == 1 + passes                 # A's prefill and passes: B never ran
        assert b.locator("#tokens .tok").count() == 0

        # both at once: each gets its own answer, and sees only its own runs' events
        first_run = a.locator("#tokens .tok").count()
        start(a, TINY_PROMPT, 8)
        start(b, "the dog ran to the hill", 8)
        for pg, prompt in ((a, TINY_PROMPT), (b, "the dog ran to the hill")):
            pg.wait_for_selector('#metrics [data-state="done"]', timeout=WAIT_MS)
            wait_status(pg, "Done: 8 tokens")
            assert prompt in pg.locator("#tokens .csd-prompt").inner_text()
        own = {id(a): first_run + a.locator("#tokens .tok").count(), id(b): b.locator("#tokens .tok").count()}
        for pg in (a, b):
            open_tab(pg, "Explore & memory")
            for st in ("accepted", "corrected", "bonus"):
                pg.locator("#e-status").get_by_label(st, exact=True).check()
            pg.click("#events-btn")
            pg.wait_for_function("n => document.querySelector('#events-caption')?.innerText.startsWith(n + ' events')",
                                 arg=own[id(pg)], timeout=WAIT_MS)
    finally:
        a.context.close()
        b.context.close()


# -- layouts ---------------------------------------------------------------------------------------
TAB_ORDER = ["Generate", "Compare", "Analyse", "Explore & memory", "Teach"]


def phone_tab(pg, name: str):
    """The visible button of a tab in the tab bar."""
    return pg.locator("#tabs [role=tab]:visible").filter(has_text=re.compile(f"^{re.escape(name)}$"))


def tab_reading_order(pg) -> list[str]:
    """The visible tab buttons as a reader meets them: row by row (top to bottom), left to right."""
    buttons = "#tabs .tab-wrapper [role=tablist] button:visible, #tabs .overflow-dropdown button:visible"
    boxes = pg.locator(buttons).evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect();"
        " return [e.innerText.trim(), r.x, r.y, r.height]; })")
    rows: list[list] = []
    for text, x, y, h in sorted(boxes, key=lambda b: b[2]):
        if rows and abs(rows[-1][0][2] - y) < h / 2:
            rows[-1].append((text, x, y))
        else:
            rows.append([(text, x, y)])
    return [t for row in rows for t, _, _ in sorted(row, key=lambda b: b[1])]


def test_the_answer_streams_in_view_and_teach_fits_a_projector(browser, tiny_url, gate, shots):
    """A newcomer sees the first streamed tokens without scrolling, at 1440x900 and at 1280x720 (the
    engine is held in its second verify pass, so the first pass's tokens are on the page while the
    answer streams); in presentation mode at 1280x720, Teach shows the drafted block and its table."""
    for w, h in ((1440, 900), (1280, 720)):
        pg = new_page(browser, tiny_url, w, h)
        try:
            gate.arm(3)
            start(pg, TINY_PROMPT, 12)
            pg.wait_for_selector("#tokens .tok", timeout=WAIT_MS)
            first = pg.locator("#tokens .tok").first.bounding_box()
            assert pg.evaluate("() => window.scrollY") == 0
            assert 0 <= first["y"] and first["y"] + first["height"] <= h, f"{w}x{h}: first token at {first}"
            pg.screenshot(path=str(shots / f"generate-{w}x{h}.png"))
        finally:
            gate.open()
            pg.context.close()
    pg = new_page(browser, tiny_url, 1280, 720)
    try:
        pg.locator("#present input").check()
        pg.wait_for_function("() => document.body.classList.contains('csd-present')")
        open_tab(pg, "Teach")
        pg.click("#teach-run")
        pg.wait_for_selector("#teach-view table", timeout=WAIT_MS)
        pg.evaluate("() => window.scrollTo(0, 0)")
        block = pg.locator("#teach-view .csd-block").bounding_box()
        header = pg.locator("#teach-view thead").bounding_box()
        first_row = pg.locator("#teach-view tbody tr").first.bounding_box()
        assert block["y"] + block["height"] <= 720 and header["y"] + header["height"] <= 720
        assert first_row["y"] + 40 <= 720, f"the table's first row starts at y = {first_row['y']:.0f}"
        pg.screenshot(path=str(shots / "teach-1280x720-presentation.png"))
    finally:
        pg.context.close()


def test_teach_and_analyse_keep_what_they_change_in_view(browser, tiny_url, shots):
    """1280x720 without presentation mode: Teach's Run and Next bring the drawn iteration into view with
    its buttons (it starts below the fold); 1440x900: Analyse's answer sits near the λ/τ sliders that
    recolour it, above the charts."""
    pg = new_page(browser, tiny_url, 1280, 720)
    try:
        open_tab(pg, "Teach")
        pg.click("#teach-run")
        pg.wait_for_selector("#teach-view table", timeout=WAIT_MS)
        for step in range(2):
            pg.wait_for_function("() => { const b = document.querySelector('#teach-view .csd-block');"
                                 " const r = b && b.getBoundingClientRect();"
                                 " return r && r.top >= 0 && r.bottom <= 720; }",
                                 timeout=WAIT_MS)
            nxt = pg.locator("#teach-next").bounding_box()
            assert 0 <= nxt["y"] and nxt["y"] + nxt["height"] <= 720, f"step {step}: Next at {nxt}"
            pg.evaluate("() => window.scrollTo(0, 0)")
            pg.click("#teach-next")
        pg.screenshot(path=str(shots / "teach-1280x720.png"))
    finally:
        pg.context.close()
    pg = new_page(browser, tiny_url, 1440, 900)
    try:
        open_tab(pg, "Analyse")
        pg.wait_for_selector("#analyse-tokens", state="visible", timeout=WAIT_MS)
        lam, answer = pg.locator("#lam").bounding_box(), pg.locator("#analyse-tokens").bounding_box()
        assert answer["y"] - (lam["y"] + lam["height"]) < 700, f"λ at {lam}, the answer at {answer}"
        assert answer["y"] < pg.locator("#pareto-plot").bounding_box()["y"]
    finally:
        pg.context.close()


def test_phone_layout(browser, tiny_url, shots):
    """390x844: nothing wider than the screen; the tab row wraps but keeps its order, whichever tab is
    open; Teach's table scrolls sideways and says so (a label, and a fade while columns are off to the
    right), which a wide screen, where the table fits, does not."""
    pg = new_page(browser, tiny_url, 390, 844)
    try:
        assert pg.evaluate("() => document.documentElement.scrollWidth") <= 392
        assert tab_reading_order(pg) == TAB_ORDER
        for name, panel in (("Compare", "#tab-compare"), ("Analyse", "#tab-analyse"),
                            ("Explore & memory", "#tab-explore"), ("Teach", "#tab-teach"),
                            ("Generate", "#tab-generate")):
            tab = phone_tab(pg, name)
            assert tab.count() == 1 and tab.is_visible(), f"tab {name} is not reachable"
            tab.click()
            pg.wait_for_selector(f"{panel}", state="visible", timeout=WAIT_MS)
            assert tab_reading_order(pg) == TAB_ORDER, f"with {name} open"
        assert pg.locator("#tabs .overflow-menu").count() == 0
        # Teach: the table scrolls sideways, so its decision and why columns can be reached
        phone_tab(pg, "Teach").click()
        set_number(pg, "teach-max", 12)
        pg.click("#teach-run")
        pg.wait_for_selector("#teach-view table", timeout=WAIT_MS)
        scroller = pg.locator("#teach-view .csd-scroll")
        assert scroller.evaluate("e => e.scrollWidth > e.clientWidth")
        box, hint = pg.locator("#teach-view .csd-scroll-box"), pg.locator("#teach-view .csd-scroll-hint")
        pg.wait_for_function("() => document.querySelector('#teach-view .csd-scroll-box')?.dataset.scrolls === 'more'",
                             timeout=WAIT_MS)
        assert hint.is_visible() and "scroll the table sideways" in hint.inner_text()
        hb = hint.bounding_box()
        assert hb["x"] >= 0 and hb["x"] + hb["width"] <= 392
        fade = box.evaluate("e => getComputedStyle(e, '::after').backgroundImage")
        assert "gradient" in fade
        pg.locator("#teach-view").scroll_into_view_if_needed()
        pg.screenshot(path=str(shots / "teach-phone-390x844.png"))
        scroller.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
        pg.wait_for_function("() => document.querySelector('#teach-view .csd-scroll-box')?.dataset.scrolls === 'end'",
                             timeout=WAIT_MS)
        assert box.evaluate("e => getComputedStyle(e, '::after').content") in ("none", "normal")   # no fade at the end
        why = pg.locator("#teach-view th").last.bounding_box()
        assert why["x"] >= 0 and why["x"] + why["width"] <= 392
        assert pg.evaluate("() => document.documentElement.scrollWidth") <= 392
        # a wide screen: the table fits, no hint
        pg.set_viewport_size({"width": 1920, "height": 1000})
        pg.wait_for_function("() => document.querySelector('#teach-view .csd-scroll-box')?.dataset.scrolls === 'no'",
                             timeout=WAIT_MS)
        assert hint.is_hidden()
    finally:
        pg.context.close()


def test_one_toast_at_a_time(page, shots):
    """Two errors in a row leave one toast on the screen, the newer one; the out-of-range value typed
    in log10 tau's box gets a sentence naming the range (two handlers refuse it: still one toast)."""
    visible = "() => [...document.querySelectorAll('.toast-message-item')].filter(e => e.offsetParent !== null)" \
              ".map(e => e.innerText)"
    set_number(page, "log10-tau", -5)
    page.wait_for_function(f"() => ({visible})().some(t => t.includes('between -4 and 0'))", timeout=WAIT_MS)
    page.wait_for_timeout(700)
    shown = page.evaluate(visible)
    assert len(shown) == 1 and ("τ's power of ten (the gate threshold) must be between -4 and 0 "
                                "(τ from 0.0001 to 1)" in shown[0])
    assert page.locator(".toast-body:visible").count() == 1
    set_number(page, "log10-tau", -2)          # the refused value stays in the box (not clamped): put it right
    page.locator("#prompt textarea").fill("   ")
    page.click("#generate-btn")
    page.wait_for_function(f"() => ({visible})().some(t => t.includes('the prompt is empty'))", timeout=WAIT_MS)
    page.wait_for_timeout(700)
    assert page.evaluate(visible) == ["the prompt is empty"]
    assert page.locator(".toast-body:visible").count() == 1
    assert not page.locator(".toast-count:visible").count()        # no "(3)": one message on the screen
    page.screenshot(path=str(shots / "one-toast.png"))


def test_legends_on_generate_compare_and_analyse(page):
    for tab, elem in (("Generate", "#legend"), ("Compare", "#compare-legend"), ("Analyse", "#analyse-legend")):
        open_tab(page, tab)
        if tab == "Analyse":                      # folded there, its key above the answer
            page.click("#analyse-legend-panel .label-wrap")
        legend = page.locator(elem)
        legend.wait_for(state="visible", timeout=WAIT_MS)
        text = legend.inner_text()
        for words in ("accepted", "rescued", "struck through", "solid underline", "dotted underline", "end of turn"):
            assert words in text, (tab, words)
    assert "wavy magenta underline" in page.locator("#compare-legend").inner_text()
    assert "dashed box" in page.locator("#analyse-legend").inner_text()


# -- a researcher's tools --------------------------------------------------------------------------
# the events table answered: "2 events match", or "1 event matches" once a filter leaves one
EVENTS_MATCH = "() => /events? match/.test(document.querySelector('#events-caption')?.innerText || '')"


def test_token_details_navigation_and_export(page, tmp_path):
    set_number(page, "log10-tau", -0.5)          # tau 0.32: some divergences rescued, some rejected
    generate(page, TINY_PROMPT, 40, gamma=4)
    assert "rescued:" in page.locator("#summary").inner_text()
    page.click("#tokens [data-nav=rescued]")
    pinned = page.locator("#tokens .tok.pinned")
    assert pinned.get_attribute("data-status") == "rescued"
    first = page.locator("#tokens-detail .csd-detail-body .first").inner_text()
    assert first.startswith("The draft wrote") and "kept because the memory had seen this swap" in first
    i = int(pinned.get_attribute("data-i"))
    page.click("#tokens [data-nav=rescued]")
    assert int(page.locator("#tokens .tok.pinned").get_attribute("data-i")) != i or \
        page.locator('#tokens .tok[data-status="rescued"]').count() == 1
    # a link in the rescue list jumps to its token
    page.locator("#summary a[data-goto]").first.click()
    assert page.locator("#tokens .tok.pinned").get_attribute("data-status") == "rescued"
    # the coloured answer as files
    page.click("#export-btn")
    page.wait_for_selector("#export-files a", timeout=WAIT_MS)
    names = re.sub(r"\s", "", page.locator("#export-files").inner_text())
    assert "csd-answer.html" in names and "csd-answer.json" in names

    # the CSV offered is the filtered one
    open_tab(page, "Explore & memory")
    page.click("#events-btn")
    page.wait_for_function(EVENTS_MATCH, timeout=WAIT_MS)
    page.click("#export-csv-btn")                    # rescued + rejected (the default filter)
    page.wait_for_selector("#events-csv", state="visible", timeout=WAIT_MS)
    page.locator("#e-status").get_by_label("rejected", exact=True).uncheck()
    page.wait_for_selector("#events-csv", state="hidden", timeout=WAIT_MS)   # no stale file on offer
    page.click("#events-btn")
    page.wait_for_function(EVENTS_MATCH, timeout=WAIT_MS)
    page.click("#export-csv-btn")
    page.wait_for_selector("#events-csv", state="visible", timeout=WAIT_MS)
    label = page.locator("#events-csv").inner_text()
    n = int(re.search(r"\((\d+) events\)", label).group(1))
    with page.expect_download() as dl:
        page.click("#events-csv")
    path = tmp_path / "events.csv"
    dl.value.save_as(path)
    rows = list(csv.DictReader(path.open(newline="")))
    assert len(rows) == n and {r["status"] for r in rows} == {"rescued"}


def test_teach_shows_the_discarded_tokens_and_steps_by_keys_and_autoplay(page):
    open_tab(page, "Teach")
    page.locator("#t-method input").click()
    page.get_by_role("option", name="sd", exact=True).click()
    set_number(page, "teach-max", 24)
    page.click("#teach-run")
    page.wait_for_selector("#teach-view table", timeout=WAIT_MS)
    text = page.locator("#teach-view").inner_text()
    n = int(re.search(r"Iteration 1 of (\d+)", text).group(1))
    assert n >= 3
    # t* is a literal star in the explanation, not the start of italics
    assert "t*ᵢ" in page.locator("#teach-explanation").inner_text()
    assert page.locator("#teach-explanation em").count() <= 2        # the two *and* / *correction* only
    page.locator("#teach-view").click()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.querySelector('#teach-view').innerText.includes('Iteration 2 of')",
                           timeout=WAIT_MS)
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => document.querySelector('#teach-view').innerText.includes('Iteration 1 of')",
                           timeout=WAIT_MS)
    for _ in range(n):                                # find a block where a rejection threw the rest away
        if page.locator("#teach-view tr.discarded").count():
            break
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(400)
    assert page.locator("#teach-view .tok-discarded").count() >= 2
    assert "Never checked" in page.locator("#teach-view tr.discarded").first.inner_text()
    # autoplay goes on by itself and stops at the end (started two iterations before it)
    at = int(re.search(r"Iteration (\d+) of", page.locator("#teach-view").inner_text()).group(1))
    while at != n - 2:
        page.keyboard.press("ArrowRight" if at < n - 2 else "ArrowLeft")
        at += 1 if at < n - 2 else -1
        page.wait_for_function("k => document.querySelector('#teach-view').innerText.includes(`Iteration ${k} of`)",
                               arg=at, timeout=WAIT_MS)
    page.click("#teach-play")
    page.wait_for_function("n => document.querySelector('#teach-view').innerText.includes(`Iteration ${n} of ${n}`)",
                           arg=n, timeout=WAIT_MS)
    page.click("#teach-stop")


def test_memory_upload_errors_are_sentences(page, tmp_path):
    open_tab(page, "Explore & memory")
    page.wait_for_function("() => document.querySelector('#memory-summary')?.innerText.includes('patterns')",
                           timeout=WAIT_MS)
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"format": "csd-explorer-memory", "version": 1, "pair": "x", "meta": [1],
                                "counts": []}))
    cut = tmp_path / "cut.json.gz"
    import gzip
    cut.write_bytes(gzip.compress(b'{"format": "csd-explorer-memory"}' * 20)[:25])
    for path, message in ((cut, "a damaged or truncated gzip file"), (meta, "'meta' must be an object")):
        with page.expect_file_chooser() as chooser:
            page.click("#memory-upload")
        chooser.value.set_files(str(path))
        page.wait_for_function("m => document.querySelector('#memory-error')?.innerText.includes(m)", arg=message,
                               timeout=WAIT_MS)
        text = page.locator("#memory-error").inner_text()
        assert text.startswith("Memory not loaded:") and text.strip() != "Error"


@pytest.mark.parametrize("elem_id,typed,words", [("lam", -1, "must be a whole number from 0 to 64; got -1"),
                                                 ("gamma", 1000, "must be a whole number from 1 to 32; got 1,000"),
                                                 ("max-new", 100000, "from 1 to 512 (this app's limit); got 100,000"),
                                                 ("tau-lossy", 5, "The lossy rule's tau must be between 0.001 and 1; "
                                                                  "got 5")])
def test_a_value_typed_out_of_range_is_refused_not_clamped(page, gate, elem_id, typed, words):
    """A value typed beyond a slider's or a number box's range is refused with its range named; the run
    does not start."""
    page.locator("#auto-gamma input[type=checkbox]").uncheck()
    if elem_id == "tau-lossy":                  # a rival's box, folded in the bar
        page.click("#rivals-panel button")
    set_number(page, elem_id, typed)
    page.wait_for_timeout(300)
    page.click("#generate-btn")
    page.wait_for_function("w => [...document.querySelectorAll('.toast-body')].some(t => t.textContent.includes(w))",
                           arg=words, timeout=WAIT_MS)
    page.wait_for_timeout(500)
    assert page.locator(f"#{elem_id} input[data-csd-number]").input_value() == str(typed)   # shown as typed
    wait_status(page, "Not run")                # the status line says so: no stale "Starting…"
    assert gate.calls == 0 and "Starting" not in status(page)
