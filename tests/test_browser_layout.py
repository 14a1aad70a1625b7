"""What a newcomer sees without scrolling, in a real headless Chromium (as test_browser.py, tiny models served in
this process): at 1440x900 Generate's colour key beside the first tokens and Analyse's λ slider beside the answer it
recolours, the full legend folded; at 390x844 the prompt and Generate on the first screen, the bar of settings
folded; a token holding a newline drawn with its mark, its box and star on one line. Screenshots go to
$CSD_SCREENSHOT_DIR.
"""
from __future__ import annotations

import browser_kit
import pytest
from browser_kit import TINY_PROMPT, WAIT_MS, generate, need_chromium, new_page, open_tab, set_number

need_chromium()
from ui_fixtures import served, tiny_services  # noqa: E402

from csd.events import ACCEPTED, CORRECTED, REJECTED, RESCUED, TokenEvent  # noqa: E402

pytestmark = pytest.mark.slow

shots_fixture, browser_fixture = browser_kit.shots_fixture, browser_kit.browser_fixture  # fixtures


@pytest.fixture(scope="module")
def tiny_url():
    with served(tiny_services(None, status_interval_s=0.5)) as url:
        yield url


def in_view(pg, selector: str, height: int) -> dict:
    box = pg.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not on the page"
    assert 0 <= box["y"] and box["y"] + min(box["height"], 40) <= height, f"{selector} at {box}, screen {height}"
    return box


def test_generate_shows_the_legend_beside_the_first_tokens(browser, tiny_url, shots):
    pg = new_page(browser, tiny_url, 1440, 900)
    try:
        generate(pg, TINY_PROMPT, 24, gamma=4)
        pg.evaluate("() => window.scrollTo(0, 0)")
        key = in_view(pg, "#legend-key", 900)
        first = in_view(pg, "#tokens .tok", 900)
        tokens = pg.locator("#tokens").bounding_box()
        assert key["x"] >= tokens["x"] + tokens["width"] and key["y"] + key["height"] <= 900   # beside the answer
        assert first["y"] + first["height"] <= 900
        for words in ("accepted", "rescued", "rejected", "correction", "bonus"):
            assert words in pg.locator("#legend-key").inner_text()
        pg.screenshot(path=str(shots / "generate-1440x900-legend.png"))
    finally:
        pg.context.close()


def test_analyse_keeps_a_slider_and_what_it_recolours_in_view(browser, tiny_url, shots):
    pg = new_page(browser, tiny_url, 1440, 900)
    try:
        set_number(pg, "log10-tau", -0.5)
        generate(pg, TINY_PROMPT, 40, gamma=4)
        open_tab(pg, "Analyse")
        pg.wait_for_selector("#analyse-tokens .tok", timeout=WAIT_MS)
        pg.wait_for_selector("#whatif-plot .main-svg", timeout=WAIT_MS)
        before = pg.locator("#analyse-tokens").inner_html()
        set_number(pg, "lam", 64)                 # no pattern seen 64 times: every rescue would be rejected
        pg.wait_for_function("b => document.querySelector('#analyse-tokens').innerHTML !== b", arg=before,
                             timeout=WAIT_MS)
        pg.evaluate("() => window.scrollTo(0, 0)")
        in_view(pg, "#lam", 900)
        in_view(pg, "#analyse-tokens .tok.wi-reject", 900)      # the recoloured decision, beside the slider
        in_view(pg, "#whatif-plot", 900)
        assert pg.locator("#analyse-legend").is_hidden()          # the full legend folded; its key in view
        in_view(pg, "#analyse-key", 900)
        pg.screenshot(path=str(shots / "analyse-1440x900.png"))
        # scrolled down to the Pareto and gap charts, the bar (and its sliders) stays at the top
        pg.locator("#pareto-plot").evaluate("e => e.scrollIntoView({block: 'end'})")
        pg.wait_for_timeout(300)
        assert pg.evaluate("() => window.scrollY") > 200
        lam = in_view(pg, "#lam", 900)
        pareto = pg.locator("#pareto-plot").bounding_box()
        assert lam["y"] + lam["height"] <= pareto["y"] and pareto["y"] + pareto["height"] <= 901, (lam, pareto)
        pg.screenshot(path=str(shots / "analyse-1440x900-pareto.png"))
        open_tab(pg, "Generate")                  # elsewhere the bar scrolls away with the page
        pg.evaluate("() => window.scrollTo(0, 600)")
        assert pg.locator("#lam").bounding_box()["y"] < 0
    finally:
        pg.context.close()


def test_a_phone_sees_the_prompt_and_generate_first(browser, tiny_url, shots):
    pg = new_page(browser, tiny_url, 390, 844)
    try:
        pg.wait_for_function("() => !document.querySelector('#bar .label-wrap').classList.contains('open')",
                             timeout=WAIT_MS)
        for sel in ("#prompt textarea", "#generate-btn"):
            box = pg.locator(sel).bounding_box()
            assert box["y"] + box["height"] <= 844, f"{sel} at {box}"
        assert pg.locator("#lam").is_hidden()
        pg.screenshot(path=str(shots / "phone-390x844-first-screen.png"))
        pg.click("#bar .label-wrap")                 # the settings unfold on demand
        pg.wait_for_selector("#lam", state="visible", timeout=WAIT_MS)
        assert pg.evaluate("() => document.documentElement.scrollWidth") <= 392
    finally:
        pg.context.close()


def test_a_newline_token_shows_its_mark_with_its_box_and_star_on_one_line(browser, shots):
    """A rescued ".\\n" (the first example's) and other tokens holding newlines, drawn by the page's renderer and
    style sheet: the mark is visible in the token's colours and the span is one box on one line."""
    from csd.ui import render

    def ev(status, text, pos):
        return TokenEvent(position=pos, token_id=pos, text=text, status=status, block=0, index_in_block=pos)

    events = [ev(ACCEPTED, "Janet sells the rest", 0), ev(RESCUED, ".\n", 1), ev(ACCEPTED, "She", 2),
              ev(CORRECTED, ":\n\n", 3), ev(REJECTED, "\n", 4), ev(ACCEPTED, "end", 5)]
    html = render.render_tokens(events)
    pg = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        pg.set_content(f"<html><head><style>{render.CSS}</style></head><body>{html}</body></html>")
        for status in ("rescued", "corrected", "rejected"):
            tok = pg.locator(f'.tok[data-status="{status}"]')
            mark = tok.locator(".tok-nl")
            assert mark.count() >= 1 and mark.first.is_visible() and mark.first.inner_text() == "⏎"
            assert tok.evaluate("e => e.getClientRects().length") == 1, f"{status}: its box splits over lines"
            bg = tok.evaluate("e => getComputedStyle(e).backgroundColor")
            assert bg not in ("rgba(0, 0, 0, 0)", "transparent")      # the mark sits on the token's colour
        star = pg.locator('.tok[data-status="rescued"]').evaluate("e => getComputedStyle(e, '::after').content")
        assert "★" in star
        # the answer keeps its line: "She" starts a new line below the rescued ".⏎"
        rescued = pg.locator('.tok[data-status="rescued"]').bounding_box()
        she = pg.locator('.tok[data-i="2"]').bounding_box()
        assert she["y"] > rescued["y"] + rescued["height"] / 2
        pg.screenshot(path=str(shots / "newline-marks.png"))
    finally:
        pg.close()
