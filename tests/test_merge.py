"""csd.bench.merge: one frontier from runs of the same items, speed compared only within a run."""
import json

import pytest

from csd.bench.merge import main, merge
from csd.bench.results import ResultsError


def _run(path, sd_tps, settings, items=(("gsm8k", "1"), ("gsm8k", "2")), sd_ids=None, status="finished"):
    sd_ids = sd_ids or {k: [1, 2, 3] for k in items}
    recs = [{"dataset": d, "item_id": i, "method": "sd", "token_ids": sd_ids[(d, i)]} for d, i in items]
    points = [{"method": "sd", "tokens_per_s": sd_tps, "accuracy": 0.5, "accuracy_ci95": [0.1, 0.9], "n": len(items),
               "target_passes_per_token": 0.33, "rescued": 0, "accuracy_vs_sd": None}]
    for name, tps, acc in settings:
        recs += [{"dataset": d, "item_id": i, "method": name, "token_ids": [1, 2]} for d, i in items]
        points.append({"method": name, "tokens_per_s": tps, "accuracy": acc, "accuracy_ci95": [0.1, 0.9],
                       "n": len(items), "target_passes_per_token": 0.3, "rescued": 5,
                       "accuracy_vs_sd": {"n": 2, "gained": 0, "lost": 1, "p_value": 1.0, "diff": -0.5}})
    data = {"meta": {"command": f"python -m csd bench --out {path}", "machine": {"cpu": "test CPU"}, "dtype": "int8",
                     "draft_dtype": "int8", "started_at": "t0"}, "status": status, "items": recs, "frontier": points,
            "summary": {"all": {p["method"]: {"eos_share": 0.5 if p["method"] == "sd" else 1.0} for p in points}}}
    data["_path"] = str(path)
    return data


def test_speed_is_relative_to_the_sd_of_the_same_run():
    a = _run("a", 10.0, [("csd", 12.0, 0.5)])
    b = _run("b", 5.0, [("csd[lam=3]", 6.5, 0.5), ("csd", 5.5, 0.5)])
    m = merge([a, b])
    by = {p["method"]: p for p in m["points"]}
    assert [p["method"] for p in m["points"]] == ["sd", "csd", "csd[lam=3]", "csd (run 2)"]
    assert by["csd"]["speed_vs_sd"] == pytest.approx(1.2)
    assert by["csd[lam=3]"]["speed_vs_sd"] == pytest.approx(1.3)       # 6.5 / 5.0, not / 10.0
    assert by["csd (run 2)"]["run"] == 2 and by["sd"]["run"] == 1
    assert m["checks"]["sd_identical_to_run_1"] == [2] and m["status"] == "finished"


def test_sd_answers_that_differ_between_runs_are_counted():
    items = (("gsm8k", "1"), ("gsm8k", "2"))
    b_ids = {items[0]: [1, 2, 3], items[1]: [9]}
    m = merge([_run("a", 10.0, []), _run("b", 10.0, [("csd[lam=3]", 11.0, 0.5)], sd_ids=b_ids, status="interrupted")])
    assert m["checks"]["sd_identical_to_run_1"] == [1]
    assert m["status"] == "partial"


def test_runs_on_other_items_or_without_sd_are_refused():
    a = _run("a", 10.0, [("csd", 12.0, 0.5)])
    other = _run("b", 10.0, [("csd[lam=3]", 11.0, 0.5)], items=(("gsm8k", "1"), ("gsm8k", "3")),
                 sd_ids={("gsm8k", "1"): [1], ("gsm8k", "3"): [1]})
    with pytest.raises(ResultsError, match="not the same items"):
        merge([a, other])
    no_sd = _run("c", 10.0, [("csd[lam=3]", 11.0, 0.5)])
    no_sd["frontier"] = no_sd["frontier"][1:]
    with pytest.raises(ResultsError, match="no SD column"):
        merge([a, no_sd])
    with pytest.raises(ResultsError, match="at least two"):
        merge([a])


def test_cli_writes_a_frontier_the_app_shows(tmp_path, capsys):
    from csd.ui import figures

    for name, run in (("a", _run("a", 10.0, [("csd", 12.0, 0.5)])), ("b", _run("b", 5.0, [("csd[lam=3]", 6.5, 0.5)]))):
        (tmp_path / name).mkdir()
        run.pop("_path")
        (tmp_path / name / "results.json").write_text(json.dumps(run))
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 0
    assert "SD identical to run 1's on [2] of 2" in capsys.readouterr().out
    data = figures.load_frontier(str(tmp_path / "m" / "frontier.json"))
    table = figures.frontier_table(data)
    assert "× SD, same run" in table and "1.30x (run 2)" in table and "Merged from 2 runs" in table
    # one table for the command line and the app: EOS share from each run's summary, McNemar p when known
    assert "| csd[lam=3] | 6.50 | 1.30x (run 2) | 0.300 | 5 | 100% | 50% [10, 90] | +0 / −1 (p = 1.00) |" in table
    assert "| sd | 10.00 | 1.00x (run 1) | 0.330 | 0 | 50% |" in table
    fig = figures.make_frontier_figure(data)
    assert "relative to SD" in fig.layout.xaxis.title.text
    assert sorted(round(t.x[0], 2) for t in fig.data) == [1.0, 1.2, 1.3]
    assert (tmp_path / "m" / "frontier.html").read_text().count("plotly.min.js") >= 1

    assert main([str(tmp_path / "a"), str(tmp_path / "missing"), "--out", str(tmp_path / "m2")]) == 2
    assert "no such file" in capsys.readouterr().err
