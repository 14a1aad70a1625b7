"""A PNG of a benchmark chart, for the README: ``python -m tools.snapshot frontier.html frontier.png``.

Plotly's own image export needs kaleido and a Chrome download; this renders the chart's HTML in the
Chromium that the browser tests already use (Debian's ``chromium``, driven by playwright)."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# headless, and nothing that reaches out to the network by itself (the browser tests use the same)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium() -> str | None:
    """The Chromium that playwright drives here (Debian's package), or None."""
    return next((c for c in CHROMIUM_CANDIDATES if Path(c).exists()), None) or shutil.which("chromium")


def snapshot(html: str | Path, png: str | Path, width: int = 1100, height: int = 620) -> Path:
    from playwright.sync_api import sync_playwright

    exe = find_chromium()
    if exe is None:
        raise SystemExit("no Chromium found: install Debian's chromium (apt-get install chromium)")
    src = Path(html).resolve()
    if not src.is_file():
        raise SystemExit(f"{html}: no such file")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(src.as_uri())
            page.wait_for_selector(".plotly-graph-div .main-svg", timeout=30_000)
            page.wait_for_timeout(500)             # let the first layout settle
            page.locator(".plotly-graph-div").first.screenshot(path=str(png))
        finally:
            browser.close()
    return Path(png)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.snapshot", description=__doc__.splitlines()[0])
    ap.add_argument("html")
    ap.add_argument("png")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument("--height", type=int, default=620)
    a = ap.parse_args(argv)
    print(snapshot(a.html, a.png, a.width, a.height))


if __name__ == "__main__":
    main()
