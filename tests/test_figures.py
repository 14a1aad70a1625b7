"""The speed tables of docs/ are re-derived from the committed results.json files (csd.bench.figures):
a figure that drifts from its measurement fails here, in CI."""
from __future__ import annotations

from pathlib import Path

import pytest

from csd.bench.figures import derive, main, table
from csd.bench.io import read_results_json
from csd.bench.results import ResultsError

ROOT = Path(__file__).resolve().parent.parent
# the guides, and the READMEs of the runs whose notes moved beside their results
MARKED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
          *sorted((ROOT / "docs" / "bench").glob("*/README.md"))]


def test_every_marked_table_matches_its_results_json():
    assert "<!-- figures: " in (ROOT / "docs/benchmarks.md").read_text()     # the headline tables are marked
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
    items = read_results_json(run)[1]["items"]   # committed gzipped (results.json.gz)
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


def _cells(body: str, method: str) -> list[str]:
    row = next(r for r in body.splitlines() if r.startswith(f"| {method} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_columns_add_named_figures_and_speed_ups_over_any_method_on_one_dataset():
    from csd.bench.io import ratio
    from csd.bench.results import load_results, resummarize

    run = ROOT / "docs/bench/epyc-defaults24-smoothed"
    plain, body = table(run), table(run, columns=["rescued", "accuracy", "humaneval:sd", "all:csd"])
    head = body.splitlines()[0]
    assert head.startswith(plain.splitlines()[0][:-1])        # the generic columns first, as they were
    assert head.endswith("| rescued (per divergence) | accuracy (graded) [95% CI] | humaneval (10): x SD | x csd |")
    summary = resummarize(load_results(run))["summary"]
    cells = _cells(body, "csd")
    assert cells[-4].startswith(f"{summary['all']['csd']['rescued']} (")
    assert cells[-3].startswith(f"{summary['all']['csd']['n_correct']}/{summary['all']['csd']['n_graded']} (")
    assert cells[-2] == ratio(summary["humaneval"]["csd"], "speedup_over_sd")    # the summary's own per-dataset figure
    assert cells[-1] == "1.00x" and _cells(body, "ar")[-4] == "–"
    items = read_results_json(run)[1]["items"]   # committed gzipped (results.json.gz)
    tps = {m: sum(i["new_tokens"] for i in items if i["method"] == m)
           / sum(i["wall_s"] for i in items if i["method"] == m) for m in ("sd", "csd")}
    assert _cells(body, "sd")[-1].startswith(f"{tps['sd'] / tps['csd']:.2f}x (")   # over a method that is no reference


def test_columns_in_a_marker_and_method_names_with_commas():
    name = "csd[lookup=16,lookup_ngram=2]"
    text, differing = derive(f"<!-- figures: docs/bench/lookup-ar methods=ar,{name} columns=copies,prose:ar -->\n"
                             "<!-- /figures -->")
    assert len(differing) == 1 and f"| {name} |" in text and "| prose (2): x AR |" in text
    assert _cells(text.split("-->\n", 1)[1], name)[-2].count(",") == 2          # copy passes, per pass, kept
    with pytest.raises(ResultsError, match="unknown column"):
        derive("<!-- figures: docs/bench/lookup-ar columns=colour -->\n<!-- /figures -->")
    with pytest.raises(ResultsError, match="no method nope"):
        derive("<!-- figures: docs/bench/lookup-ar columns=all:nope -->\n<!-- /figures -->")
    with pytest.raises(ResultsError, match="synthetic"):
        derive("<!-- figures: docs/bench/gpu-h200/run5/s15auto columns=rescued -->\n<!-- /figures -->")


def test_a_committed_gzipped_run_is_read_and_re_rendered_gzipped(tmp_path):
    """docs/bench keeps the figures' runs as results.json.gz: the report, the figures and load_results
    read it as a results.json, and re-rendering one writes it back gzipped, never plain JSON in a .gz."""
    import gzip
    import json
    import shutil

    from csd.bench import report
    from csd.bench.results import load_results
    run = tmp_path / "speed"
    shutil.copytree(ROOT / "docs/bench/speed", run)
    before = read_results_json(run)[1]
    assert report.main([str(run)]) == 0
    assert not (run / "results.json").exists()
    answers = lambda items: [(i["item_id"], i["method"], i["token_ids"], i["wall_s"]) for i in items]  # noqa: E731
    committed = json.loads(gzip.decompress((run / "results.json.gz").read_bytes()))
    assert answers(committed["items"]) == answers(before["items"])
    assert answers(load_results(run)["items"]) == answers(before["items"])
    assert table(run) == table(ROOT / "docs/bench/speed")
