"""One speed/quality frontier from several benchmark runs on the same items:
``python -m csd.bench.merge RUN_DIR RUN_DIR ... --out DIR``.

A sweep of many lambda/tau settings can take longer than one sitting on a small machine, so it
may be run in parts, each with SD beside its CSD settings (``--methods sd --sweep ...``). Speed is
only compared side by side within a run, so every point carries ``speed_vs_sd``: its tokens per
second over SD's in the same run; the merged figure plots that. Accuracy and target passes per
token do not depend on the machine's load and are compared across runs as they are.

The runs must cover the same items (dataset and item id) and each must include SD. Greedy SD is
the target's own output, so SD's answers should be the same token for token in every run; the
merge counts how many are, and the figure keeps the first run's SD point.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .io import write_json
from .report import frontier_figure, frontier_markdown
from .results import ResultsError, load_results


def _sd_answers(run: dict) -> dict[tuple, list]:
    return {(r["dataset"], r["item_id"]): r.get("token_ids") for r in run["items"] if r["method"] == "sd"}


def merge(runs: list[dict]) -> dict:
    """The merged frontier (``{"meta", "status", "points", "checks"}``) of ``runs`` (parsed results.json)."""
    if len(runs) < 2:
        raise ResultsError("give at least two benchmark runs to merge")
    sds = []
    for run in runs:
        sd = next((p for p in run["frontier"] if p["method"] == "sd"), None)
        if sd is None or not sd.get("tokens_per_s"):
            raise ResultsError(f"{run['_path']}: no SD column; run each part with --methods sd,... so that its "
                               "speed can be compared side by side")
        sds.append(sd)
    first, *others = [_sd_answers(run) for run in runs]
    for run, other in zip(runs[1:], others):
        if set(other) != set(first):
            differ = sorted(set(first) ^ set(other))[:3]
            raise ResultsError(f"{run['_path']}: not the same items as {runs[0]['_path']} "
                               f"({len(other)} against {len(first)}; e.g. {differ})")
    sd_identical = [sum(other[k] == first[k] for k in first) for other in others]
    points, seen = [], set()
    for i, (run, sd) in enumerate(zip(runs, sds)):
        for p in run["frontier"]:
            if i > 0 and p["method"] == "sd":
                continue
            name = p["method"] if p["method"] not in seen else f"{p['method']} (run {i + 1})"
            seen.add(name)
            tps = p.get("tokens_per_s")
            eos = ((run.get("summary") or {}).get("all") or {}).get(p["method"], {}).get("eos_share")
            points.append({"eos_share": eos, **p, "method": name, "run": i + 1,
                           "speed_vs_sd": tps / sd["tokens_per_s"] if tps else None})
    meta = {k: runs[0]["meta"].get(k) for k in ("machine", "dtype", "draft_dtype", "models")}
    meta["command"] = " ; ".join(str(r["meta"].get("command")) for r in runs)
    meta["runs"] = [{"command": r["meta"].get("command"), "started_at": r["meta"].get("started_at"),
                     "finished_at": r["meta"].get("finished_at"), "status": r.get("status"),
                     "sd_tokens_per_s": sd["tokens_per_s"], "items": len(first),
                     "machine": (r["meta"].get("machine") or {}).get("cpu")} for r, sd in zip(runs, sds)]
    checks = {"items": len(first), "sd_identical_to_run_1": sd_identical,
              "same_machine": len({m["machine"] for m in meta["runs"]}) == 1,
              "same_representations": len({(r["meta"].get("dtype"), r["meta"].get("draft_dtype")) for r in runs}) == 1}
    status = "finished" if all(r.get("status") == "finished" for r in runs) else "partial"
    return {"meta": meta, "status": status, "points": points, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csd.bench.merge", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="benchmark output directories (or their results.json), first one's SD kept")
    ap.add_argument("--out", required=True, help="directory for frontier.json and frontier.html")
    args = ap.parse_args(argv)
    try:
        merged = merge([load_results(Path(p)) for p in args.runs])
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "frontier.json", merged)
    frontier_figure(merged["points"], merged["meta"]).write_html(out / "frontier.html", include_plotlyjs="directory",
                                                                 full_html=True)
    c = merged["checks"]
    print(f"{c['items']} items; SD identical to run 1's on {c['sd_identical_to_run_1']} of {c['items']}; "
          f"same machine: {c['same_machine']}; same representations: {c['same_representations']}")
    print(frontier_markdown(merged["points"], merged["meta"]))
    print(f"written to {out}/frontier.json and frontier.html", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
