"""The README's speed tables are re-derived from the committed results.json files (bench.figures):
a figure that drifts from its measurement fails here, in CI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.figures import derive, main, table
from bench.results import ResultsError

ROOT = Path(__file__).resolve().parent.parent
MARKED = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def test_every_marked_table_matches_its_results_json():
    assert "<!-- figures: " in (ROOT / "README.md").read_text()        # the README's tables are marked
    assert main(["check", *map(str, MARKED)]) == 0


def test_a_figure_that_drifts_is_caught_and_rewritten(tmp_path, capsys):
    run = "docs/bench/epyc-defaults24-smoothed"
    body = table(ROOT / run)
    page = tmp_path / "page.md"
    page.write_text(f"text\n<!-- figures: {run} -->\n{body}<!-- /figures -->\nmore\n")
    assert main(["check", str(page)]) == 0
    page.write_text(page.read_text().replace("| 9.24 |", "| 9.42 |"))    # a hand-edited figure
    assert main(["check", str(page)]) == 1
    assert "differs from its results.json" in capsys.readouterr().err
    assert main(["write", str(page)]) == 0 and main(["check", str(page)]) == 0
    assert "| 9.24 |" in page.read_text() and page.read_text().endswith("more\n")


def test_the_table_is_a_ratio_of_tokens_per_second_with_its_interval():
    run = ROOT / "docs/bench/epyc-defaults24-smoothed"
    items = json.loads((run / "results.json").read_text())["items"]
    tps = {m: sum(i["new_tokens"] for i in items if i["method"] == m) / sum(i["wall_s"] for i in items
                                                                             if i["method"] == m)
           for m in ("ar", "csd")}
    row = next(r for r in table(run).splitlines() if r.startswith("| csd |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].startswith(f"{tps['csd'] / tps['ar']:.2f}x (")      # x AR, then its interval
    lo, hi = (float(x) for x in cells[2].split("(")[1].rstrip(")").split("-"))
    assert lo <= tps["csd"] / tps["ar"] <= hi


def test_a_bad_marker_says_what_is_wrong():
    with pytest.raises(ResultsError, match="no method nope"):
        derive("<!-- figures: docs/bench/epyc-defaults24-smoothed methods=ar,nope -->\n<!-- /figures -->")
    with pytest.raises(ResultsError, match="unknown option"):
        derive("<!-- figures: docs/bench/epyc-defaults24-smoothed colour=red -->\n<!-- /figures -->")
    with pytest.raises(ResultsError, match="cannot be read"):
        derive("<!-- figures: docs/bench/nowhere -->\n<!-- /figures -->")
