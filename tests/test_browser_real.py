"""The app as a newcomer runs it, in a real headless Chromium: ``python app.py`` with the real embedded
pair. A CSD answer streams in coloured, a click pins a token's details, tau recolours it, the
presentation mode puts the answer above the fold at 1280x720, the phone layout holds, the Pareto chart
and the comparison render, and markup in a prompt stays text. Screenshots go to $CSD_SCREENSHOT_DIR.
"""
from __future__ import annotations

import os
import re

import browser_kit
import pytest
from browser_kit import (
    PROSE,
    RUN_TIMEOUT_MS,
    WAIT_MS,
    XSS,
    generate,
    need_chromium,
    new_page,
    open_tab,
    set_number,
    status,
    token_classes,
    wait_status,
)

need_chromium()
from appserver import running_app  # noqa: E402

pytestmark = pytest.mark.slow

shots_fixture, browser_fixture = browser_kit.shots_fixture, browser_kit.browser_fixture  # fixtures


# -- the real pair, end to end ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_url(tmp_path_factory):
    """``python app.py`` (the real embedded pair) on a free port with its own SQLite file.
    CSD_TEST_APP_URL points the test at an app that is already running instead."""
    if os.environ.get("CSD_TEST_APP_URL"):
        yield os.environ["CSD_TEST_APP_URL"].rstrip("/")
        return
    with running_app(tmp_path_factory.mktemp("browser-app")) as url:
        yield url


def test_real_pair_end_to_end(browser, real_url, shots):
    page = new_page(browser, real_url)
    # 1. A CSD answer streams in coloured. lambda = 0 lets the memory pass every pattern, so the
    #    gate (tau) decides and moving tau must change decisions.
    set_number(page, "lam", 0)
    first = generate(page, PROSE, 20)
    server = re.search(r"([0-9.]+) s\s*first token after", page.locator("#metrics").inner_text())
    note = (f"{first:.2f} s from clicking Generate to the first streamed token in the browser"
            + (f" ({server.group(1)} s of it in the engine's prefill + first draft + verify pass)" if server else ""))
    print("\n" + note)
    (shots / "first-token.txt").write_text(note + "\n")
    classes = token_classes(page)
    assert classes and {c.split()[1] for c in classes} <= {"tok-accepted", "tok-rescued", "tok-rejected",
                                                          "tok-corrected", "tok-bonus"}
    # The status line ends on "Done:". Wait for it rather than read it once: a status-timer tick
    # computed just before the run ended can land after the run's last update and show the
    # running line for one more tick (the timer stays on and the next tick shows "Done:").
    wait_status(page, "Done:")
    metrics = page.locator("#metrics").inner_text()
    assert "target passes" in metrics and "accepted: draft = target" in metrics and "rescued by CSD" in metrics
    head = page.locator("#header").inner_text()         # plain words first, the technical detail folded
    # the target in int8 or on the GGUF file's own blocks, whichever prepare timed faster here (docs/cpu.md)
    words = r"(8-bit integers|the GGUF file's own 4-, 5-, 6- and 8-bit blocks|4-bit integers \(ONNX Runtime\))"
    weights = rf"(weights in {words}|the target's weights in {words}, the draft's in {words})"
    assert re.search(r"Qwen2\.5-Coder 0\.5B drafts for Qwen2\.5-Coder 1\.5B; " + weights + r"; exact: SD gives the "
                     r"target's own answer", head)     # int8 draft where runs decode together, else as prepare timed it
    assert "arXiv 2604.13634" in head and "q4_k_m" not in head
    page.locator("#header summary").click(position={"x": 4, "y": 4})   # its start: the middle may be the paper link
    assert "q4_k_m" in page.locator("#header").inner_text()
    # a click pins the token's details, with a plain first line
    page.locator("#tokens .tok").nth(1).click()
    detail = page.locator("#tokens-detail .csd-detail-body .first")
    # which kind token 1 is depends on the run's blocks (a bonus token when the first block was kept whole)
    assert detail.inner_text().startswith(("The draft wrote", "The target", "A free token"))
    page.screenshot(path=str(shots / "generate.png"), full_page=True)

    # 2. tau = 1 (log tau = 0): no divergence passes the gate, every rescue is outlined "would be rejected"
    n_rescued = sum("tok-rescued" in c for c in classes)
    n_div = n_rescued + sum("tok-rejected" in c for c in classes)
    assert n_div > 0, "a 20-token prose answer should diverge somewhere"
    set_number(page, "log10-tau", 0)
    page.wait_for_function("n => document.querySelectorAll('#tokens .tok.wi-reject').length === n", arg=n_rescued,
                           timeout=WAIT_MS)
    if n_rescued:
        assert "outlined" in page.locator("#whatif-line").inner_text()
    page.locator("#tokens").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "generate-recoloured-tau1.png"))
    set_number(page, "log10-tau", -2)
    page.wait_for_function("() => document.querySelectorAll('#tokens .tok.wi-reject').length === 0", timeout=WAIT_MS)

    # 3. Presentation mode at 1280x720: the answer is above the fold, in large type
    page.set_viewport_size({"width": 1280, "height": 720})
    page.locator("#present input").check()
    page.evaluate("() => window.scrollTo(0, 0)")
    page.wait_for_function("() => document.body.classList.contains('csd-present')")
    box = page.locator("#tokens .csd-tokens").bounding_box()
    assert box["y"] + 60 < 720, f"the answer starts at y = {box['y']:.0f}, below the fold"
    assert page.locator("#tokens .csd-tokens").evaluate("e => parseFloat(getComputedStyle(e).fontSize)") >= 24
    assert page.locator("#legend").is_visible()
    page.screenshot(path=str(shots / "generate-1280x720-presentation.png"))
    page.locator("#present input").uncheck()

    # 4. The phone: nothing wider than the screen, every tab in reach
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(500)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 392
    page.screenshot(path=str(shots / "generate-phone-390x844.png"))
    page.set_viewport_size({"width": 1400, "height": 1000})

    # 5. The Pareto chart and the other analyse charts, from the store
    open_tab(page, "Analyse")
    page.wait_for_function("() => document.querySelectorAll('#pareto-plot .bars path').length > 0", timeout=WAIT_MS)
    assert "divergences logged" in page.locator("#analyse-summary").inner_text()
    assert page.locator("#analyse-key").is_visible() and page.locator("#analyse-legend").is_hidden()   # folded
    page.screenshot(path=str(shots / "analyse.png"), full_page=True)

    # 6. Compare: the exact-mode switch off and on again (the page's exactness texts follow the target),
    #    then the chart leads with target passes and the note explains the time
    #    On the GGUF blocks there is nothing to switch: every row is computed on its own.
    open_tab(page, "Compare")
    if re.search(r"(; weights in|the target's weights in) the GGUF file's own", head):
        assert not page.locator("#exact-mode").is_visible()          # the switch is int8's alone
        assert "each token's row on its own" in page.locator("#compare-exactness").inner_text()
    else:
        assert page.locator("#exact-mode input").is_checked()
        flip_the_exact_mode(page)
    set_number(page, "c-max-new", 8)
    page.click("#compare-btn")
    page.wait_for_function("() => document.querySelectorAll('#compare-plot .bars path').length >= 3",
                           timeout=3 * RUN_TIMEOUT_MS)
    for m in ("ar", "sd", "csd"):
        assert page.locator(f"#pane-{m} .tok").count() > 0
    # the app's target computes each row on its own (int8 per token, or the GGUF blocks): SD writes AR's answer
    assert "same tokens as AR" in page.locator("#cap-sd").inner_text()
    assert "token for token" in page.locator("#compare-exactness").inner_text()
    page.locator("#pane-csd .tok").first.click()
    assert page.locator("#compare-detail .csd-detail-body .first").inner_text()
    note = page.locator("#compare-note").inner_text()
    assert note.startswith("SD used") and "Why speculative decoding can be slower than AR" in note
    cap = page.locator("#cap-csd").inner_text()                  # where CSD's answer leaves SD's, if it does
    assert "same tokens as SD" in cap or ("leaves SD's answer at token" in cap and "<code>" not in cap)
    page.screenshot(path=str(shots / "compare.png"), full_page=True)

    # 7. Teach: one iteration at a time, the thrown-away part of a block greyed out
    open_tab(page, "Teach")
    set_number(page, "teach-max", 10)
    page.click("#teach-run")
    page.wait_for_selector("#teach-view table", timeout=RUN_TIMEOUT_MS)
    assert "Iteration 1 of" in page.locator("#teach-view").inner_text()
    page.screenshot(path=str(shots / "teach.png"), full_page=True)

    # 8. Explore & memory: this session's events, the memory's top patterns and where they come from
    open_tab(page, "Explore & memory")
    page.wait_for_function("() => document.querySelector('#memory-summary')?.innerText.includes('your session only')",
                           timeout=WAIT_MS)
    page.wait_for_function("() => document.querySelector('#events-caption')?.innerText.includes('events match')",
                           timeout=WAIT_MS)
    page.screenshot(path=str(shots / "explore-memory.png"), full_page=True)

    # 9. A prompt with markup is shown as text and runs nothing; bad input is a sentence
    open_tab(page, "Generate")
    generate(page, f"Repeat exactly this text and nothing else: {XSS}", 6)
    assert XSS in page.locator("#tokens .csd-prompt").inner_text()
    assert page.locator("img[src='x']").count() == 0
    page.wait_for_timeout(500)
    assert page.dialogs == [], page.dialogs
    page.locator("#tokens").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "generate-xss.png"))
    page.locator("#prompt textarea").fill("   ")
    page.click("#generate-btn")
    page.locator(".toast-body", has_text="the prompt is empty").wait_for(state="visible", timeout=WAIT_MS)
    page.wait_for_timeout(500)
    assert "Starting" not in status(page)          # refused at the click: the request never joined the queue
    page.screenshot(path=str(shots / "error.png"))
    assert page.external == [], f"the page fetched from outside: {page.external[:5]}"
    page.context.close()



def flip_the_exact_mode(page) -> None:
    """Compare's exact-mode switch off and on again: the page's exactness texts follow the int8 target's scales."""
    page.locator("#exact-mode input").uncheck()
    page.wait_for_function("() => document.querySelector('#compare-exactness').innerText.includes('one scale')",
                           timeout=WAIT_MS)
    # the fold, drawn again closed
    page.evaluate("() => { document.querySelector('#header details').open = true; }")
    assert "scaled per pass" in page.locator("#header").inner_text()
    assert "not exact: SD can differ" in page.locator("#header").inner_text()
    page.locator("#exact-mode input").check()
    page.wait_for_function("() => document.querySelector('#compare-exactness').innerText"
                           ".includes('scaled on their own')", timeout=WAIT_MS)
    page.evaluate("() => { document.querySelector('#header details').open = true; }")
    assert "scaled per token (exact)" in page.locator("#header").inner_text()
    assert "; exact: SD gives" in page.locator("#header").inner_text()

# -- streaming: one pass, one burst ----------------------------------------------------------------
