"""A benchmark run's results as data: one ``ItemResult`` per method and item and what is computed from them, for a
run as it goes, read back (``load_results``, ``resummarize``) or pooled (``pool``). The layout of ``results.json``
is a contract: ``{"meta", "status", "items", "summary", "targets", "frontier", "divergences"}``."""
from __future__ import annotations

import copy
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from csd.events import common_prefix
from csd.representation import Representation

from .io import read_results_json
from .methods import HF_AR, HF_ASSISTED, HF_FIXED
from .stats import paired_accuracy, pareto, speedup, wilson

# The issues' goals over the mix of all datasets: goal -> (column, figure, threshold, higher is better, the
# report's label, its unit).
GOALS = {"csd_over_ar": ("csd", "speedup_over_ar", 2.0, True, "CSD speed-up over AR", "x"),
         "csd_over_hf": ("csd", "speedup_over_hf", 1.3, True, "CSD over hf-assisted (defaults)", "x"),
         "csd_over_sd": ("csd", "speedup_over_sd", 1.0, True, "CSD over SD", "x"),
         "csd_tokens_per_s": ("csd", "tokens_per_s", 8.0, True, "CSD tokens per second", ""),
         "csd_passes_vs_sd": ("csd", "target_passes_vs_sd", 0.9, False, "CSD target passes / SD's", ""),
         "csd_bookkeeping_share": ("csd", "bookkeeping_share", 0.001, False, "CSD memory + gate time / wall time", "%"),
         "csd_policy_share": ("csd", "policy_share", 0.005, False, "CSD block-length policy time / wall time", "%"),
         "sd_eos_share": ("sd", "eos_share", 0.9, True, "SD answers that ended by themselves", "%")}
SHARE_OF_BOUND = 0.8            # CSD's share of the profile's ideal speed-up, the goal where that is under 2x


@dataclass
class ItemResult:
    """One method on one item."""
    dataset: str
    item_id: str
    method: str
    order: int                         # position of this method in the item's rotated order
    wall_s: float                      # measured here, around the whole generation
    new_tokens: int
    target_passes: int | None          # target forward passes (hf: counted by a forward hook)
    draft_passes: int | None
    drafted: int | None = None         # draft tokens proposed (None where the method does not say)
    accepted: int | None = None
    rescued: int | None = None
    divergences: int | None = None
    bookkeeping_s: float | None = None  # memory + gate time inside the engine
    policy_s: float | None = None       # block-length policy time inside the engine
    engine_wall_s: float | None = None  # the engine's own wall time (excludes setting up the run)
    stopped_by: str = ""
    correct: bool | None = None        # None: not graded
    predicted: str | None = None
    grade_detail: str = ""
    identical_to_ar: bool | None = None  # same token ids as AR on this item (None without AR)
    identical_to_sd: bool | None = None  # same token ids as SD on this item (None without SD)
    text: str = ""
    token_ids: list = field(default_factory=list)
    lookup_blocks: int | None = None   # target passes over tokens copied from the context (csd.lookup)
    lookup_drafted: int | None = None
    lookup_kept: int | None = None
    leaves_sd_at: list | None = None   # [position, SD's token, this answer's token] where it first differs from SD's
    prefill_s: float | None = None     # reading the prompt (both models), inside wall_s (None for hf)
    prompt_tokens: int | None = None   # the prompt's length in the target's tokens

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        return self.new_tokens / self.target_passes if self.target_passes else None

    @property
    def acceptance_rate(self) -> float | None:
        return ((self.accepted or 0) + (self.rescued or 0)) / self.drafted if self.drafted else None

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s, "mean_accepted_length": self.mean_accepted_length,
                "acceptance_rate": self.acceptance_rate}

    @classmethod
    def from_dict(cls, d: dict) -> ItemResult:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def by_item(items: list) -> dict[tuple, dict[str, dict]]:
    """A run's items (stored dicts or ``ItemResult``) grouped as {(dataset, item_id): {method: item}},
    in the run's order."""
    out: dict[tuple, dict] = {}
    for it in items:
        d = it if isinstance(it, dict) else vars(it)
        out.setdefault((d["dataset"], d["item_id"]), {})[d["method"]] = it
    return out


# -- where answers leave SD's -----------------------------------------------------------------------
def leaves_at(ref_ids: list[int], ids: list[int], decode) -> list | None:
    """Where an answer first differs from the reference answer: [position, the reference's token, this
    answer's token] as text ("" past an answer's end); None when they are the same."""
    if ids == ref_ids:
        return None
    i = common_prefix(ref_ids, ids)
    return [i, decode([ref_ids[i]]) if i < len(ref_ids) else "", decode([ids[i]]) if i < len(ids) else ""]


def mark_where_answers_leave_sd(records: dict, decode) -> None:
    """Set ``leaves_sd_at`` on one item's records, {method: record} (every method but SD, where SD ran)."""
    sd = records.get("sd")
    for r in records.values():
        if sd is not None and r is not sd:
            r.leaves_sd_at = leaves_at(sd.token_ids, r.token_ids, decode)


def fill_leaves_sd_at(results: dict) -> None:
    """A run from before ``leaves_sd_at`` existed gains it from its token ids, where its pair is the embedded one."""
    items = results.get("items") or []
    if all("leaves_sd_at" in it for it in items) or not any(it["method"] == "sd" for it in items):
        return                   # nothing to fill, or no SD to compare with: no tokenizer needed
    from csd.runtime.embedded import prepare_embedded
    from csd.runtime.pair import EMBEDDED_PAIR_ID
    if (results["meta"].get("models") or {}).get("pair_id") != EMBEDDED_PAIR_ID:
        return
    from transformers import AutoTokenizer

    decode = AutoTokenizer.from_pretrained(prepare_embedded("target")).decode
    records = [ItemResult.from_dict(it) for it in items]
    for group in by_item(records).values():         # the run's own pairing, one item at a time
        mark_where_answers_leave_sd(group, decode)
    for it, r in zip(items, records):
        it["leaves_sd_at"] = r.leaves_sd_at


# -- the summary, the goals, the frontier -----------------------------------------------------------
def summarize(records: list[ItemResult], methods: list[str]) -> dict:
    """Per dataset (and "all"), per method, over the items that every method finished."""
    complete = {k: v for k, v in by_item(records).items() if all(m in v for m in methods)}
    datasets = list(dict.fromkeys(k[0] for k in complete))
    out = {}
    for ds in datasets + (["all"] if len(datasets) > 1 else []):
        keys = [k for k in complete if ds == "all" or k[0] == ds]
        out[ds] = {m: _method_stats([complete[k] for k in keys], m) for m in methods}
    return out


def _paired(rows, m: str, ref: str) -> dict | None:
    """Accuracy of m against ref on the items both graded: gained, lost, exact McNemar p."""
    if not rows or ref not in rows[0] or m == ref:
        return None
    return paired_accuracy((row[m].correct, row[ref].correct) for row in rows
                           if row[m].correct is not None and row[ref].correct is not None)


def _method_stats(rows: list[dict[str, ItemResult]], m: str) -> dict:
    rs = [row[m] for row in rows]
    n = len(rs)
    wall = sum(r.wall_s for r in rs)
    tokens = sum(r.new_tokens for r in rs)
    tp = None if any(r.target_passes is None for r in rs) else sum(r.target_passes for r in rs)
    drafted = None if any(r.drafted is None for r in rs) else sum(r.drafted for r in rs)
    kept = None if drafted is None else sum((r.accepted or 0) + (r.rescued or 0) for r in rs)
    div = None if drafted is None else sum(r.divergences or 0 for r in rs)
    rescued = None if drafted is None else sum(r.rescued or 0 for r in rs)
    graded = [r for r in rs if r.correct is not None]
    n_correct = sum(bool(r.correct) for r in graded)
    ci = wilson(n_correct, len(graded))
    s = {
        "n": n, "wall_s": wall, "new_tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else None,
        "target_passes": tp, "target_passes_per_token": tp / tokens if tp is not None and tokens else None,
        "mean_accepted_length": tokens / tp if tp else None,
        "drafted": drafted, "acceptance_rate": kept / drafted if drafted else None,
        "rescued": rescued, "divergences": div,
        "rescues_per_divergence": rescued / div if div else None,
        "eos_share": sum(r.stopped_by == "eos" for r in rs) / n if n else None,
        "cap_share": sum(r.stopped_by == "max_new_tokens" for r in rs) / n if n else None,
        "n_graded": len(graded), "n_correct": n_correct,
        "accuracy": n_correct / len(graded) if graded else None,
        "accuracy_ci95": list(ci) if ci else None,
    }
    for k in ("bookkeeping", "policy"):     # shares of the wall time (None where an item did not measure it)
        times = [getattr(r, k + "_s") for r in rs]
        s[k + "_share"] = sum(times) / wall if wall > 0 and None not in times else None
    for ref in ("ar", "sd"):
        same = [getattr(r, "identical_to_" + ref) for r in rs]
        s["identical_to_" + ref] = sum(map(bool, same)) if rs and same[0] is not None else None
    if rs and all(r.lookup_blocks is not None for r in rs):
        blocks, proposed = sum(r.lookup_blocks for r in rs), sum(r.lookup_drafted for r in rs)
        copies_kept = sum(r.lookup_kept for r in rs)
        s.update(lookup_blocks=blocks, lookup_drafted=proposed, lookup_kept=copies_kept,
                 lookup_pass_share=blocks / tp if tp else None,
                 lookup_acceptance=copies_kept / proposed if proposed else None)
    for ref, key in (("ar", "speedup_over_ar"), ("sd", "speedup_over_sd"), (HF_ASSISTED, "speedup_over_hf"),
                     (HF_FIXED, "speedup_over_hf_fixed"), (HF_AR, "speedup_over_hf_ar")):
        if rows and ref in rows[0]:     # a ratio of tok/s on the same items, with its interval over them
            value, ci = speedup((row[m].new_tokens, row[m].wall_s, row[ref].new_tokens, row[ref].wall_s)
                                for row in rows)
            s[key] = value
            if ref != m:
                s[key + "_ci95"] = ci
    if rows and "ar" in rows[0]:
        s["accuracy_vs_ar"] = _paired(rows, m, "ar")
        ar_tokens = sum(row["ar"].new_tokens for row in rows)      # longer or shorter answers than AR's
        s["length_vs_ar"] = tokens / ar_tokens if ar_tokens else None
    s["accuracy_vs_sd"] = _paired(rows, m, "sd")
    if rows and "sd" in rows[0] and tp is not None:
        sd_tp = sum(row["sd"].target_passes for row in rows)
        s["target_passes_vs_sd"] = tp / sd_tp if sd_tp else None
    return s


FRONTIER_FIELDS = ("tokens_per_s", "accuracy", "accuracy_ci95", "n_graded", "target_passes_per_token",
                   "speedup_over_ar", "speedup_over_ar_ci95", "speedup_over_sd", "rescued", "rescues_per_divergence",
                   "identical_to_sd", "n", "eos_share", "accuracy_vs_sd")


def frontier(summary: dict) -> list[dict]:
    """The speed/quality frontier over all items: one point per SD/CSD setting (and the baselines)."""
    return [{"method": name, **{k: s.get(k) for k in FRONTIER_FIELDS}} for name, s in overall(summary).items()]


def overall(summary: dict) -> dict:
    """Per-method figures over all items: the "all" row, or the only dataset's."""
    return summary.get("all") or (next(iter(summary.values())) if summary else {})


def bounds(results: dict) -> list[float]:
    """Every ideal speed-up over AR the run's profiles measured: the cached one's, then each re-measurement's."""
    meta = results.get("meta") or {}
    profiles = [meta.get("profile") or {}] + list(meta.get("profile_checks") or [])
    return [b for p in profiles if (b := (p.get("best_bound") or {}).get("speedup"))]


def median_bound(results: dict) -> float | None:
    """The median of the run's bounds: one profile slowed on a shared machine moves it less than its own."""
    found = bounds(results)
    return statistics.median(found) if found else None


def check_targets(stats: dict, bound: float | None = None) -> dict:
    """Each goal over the mix: value, threshold, whether it is met (None: not measured) and a speed-up's
    interval (reported, not judged). ``bound``: the profile's ideal speed-up over AR; where it is under
    the 2x goal, CSD's share of it is judged instead (at least 80%), else that share is only reported."""
    out = {}
    for goal, (m, key, threshold, higher, _label, _unit) in GOALS.items():
        value, ci = ((stats.get(m) or {}).get(k) for k in (key, key + "_ci95"))
        out[goal] = {"value": value, "threshold": threshold,
                     "met": None if value is None else (value >= threshold if higher else value <= threshold),
                     **({"ci95": ci} if ci is not None else {})}
    csd = stats.get("csd") or {}
    speedup = csd.get("speedup_over_ar")
    share = speedup / bound if speedup is not None and bound else None
    applies = bound is not None and bound < GOALS["csd_over_ar"][2]
    out["csd_share_of_bound"] = {"value": share, "threshold": SHARE_OF_BOUND, "bound": bound,
                                 "met": None if share is None or not applies else share >= SHARE_OF_BOUND}
    out.update(csd_accuracy_vs_sd=csd.get("accuracy_vs_sd"), csd_accuracy_vs_ar=csd.get("accuracy_vs_ar"))
    return out


# -- a whole run ------------------------------------------------------------------------------------
def assemble(records: list[ItemResult], names: list[str], divergences: dict[str, Counter], token_text: dict,
             status: str, bound: float | None = None) -> dict:
    """A run's figures from its records: items, summary, goals, frontier and each drafting column's
    divergence patterns (``divergences``: counts of (draft id, target id), ``token_text``: their text)."""
    div = {m: {**pareto(counts), "top": [{"draft_id": d, "target_id": t, "draft_text": token_text.get(d, ""),
                                          "target_text": token_text.get(t, ""), "count": c}
                                         for (d, t), c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:50]]}
           for m, counts in divergences.items()}
    summary = summarize(records, names)
    return {"status": status, "items": [r.to_dict() for r in records], "summary": summary,
            "targets": check_targets(overall(summary), bound),
            "frontier": frontier(summary), "divergences": div}


def resummarize(results: dict) -> dict:
    """The summary, goals and frontier of a run again from its stored items, by the current code."""
    records = [ItemResult.from_dict(d) for d in results.get("items") or []]
    before = results.get("summary") or {}
    names = list(next(iter(before.values()), {})) or list(dict.fromkeys(r.method for r in records))
    summary = summarize(records, names)
    results.update(summary=summary, frontier=frontier(summary),
                   targets=check_targets(overall(summary), median_bound(results)))
    return results


# -- runs read back and pooled ------------------------------------------------------------------------
class ResultsError(ValueError):
    """A results.json that cannot be read, or runs that cannot be joined; the message says why."""


def load_results(path: Path) -> dict:
    """A benchmark run's results.json, from its output directory or the file; ResultsError says what is wrong."""
    f = path / "results.json" if path.is_dir() else path
    try:
        f, data = read_results_json(path)
    except FileNotFoundError:
        raise ResultsError(f"{f}: no such file (give a benchmark output directory or its results.json)") from None
    except (ValueError, OSError) as e:
        raise ResultsError(f"{f}: not JSON ({e})") from None
    if not isinstance(data, dict) or "frontier" not in data or "items" not in data:
        raise ResultsError(f"{f}: not a benchmark results.json (no items or frontier)")
    data["_path"] = str(f)
    return data


POOL_SETUP = ("methods", "max_new_tokens", "gamma", "lookup", "lam", "tau", "seed", "memory_mode", "temperature")


def _setup(results: dict) -> dict:
    """What must be the same for two runs' items to count as one sample."""
    meta = results["meta"]
    return {"pair": meta.get("pair"), "target": meta.get("dtype"), "draft": Representation.of(meta).draft,
            "target path": (meta.get("models") or {}).get("target_impl"),
            "int8 smoothing": (meta.get("models") or {}).get("target_smoothing") or "",
            "machine": (meta.get("machine") or {}).get("cpu"),
            **{k: meta["config"].get(k) for k in POOL_SETUP}}


def pool(runs: list[dict], command: str = "") -> dict:
    """Benchmark runs of one set-up on different items as one run, every interval over all items;
    divergence patterns are not pooled (docs/benchmarks.md, "Pooling")."""
    if len(runs) < 2:
        raise ResultsError("pooling needs at least two runs")
    first = _setup(runs[0])
    for r in runs[1:]:
        if diff := [k for k, v in _setup(r).items() if first[k] != v]:
            raise ResultsError(f"the runs differ in {', '.join(diff)}: only runs of one set-up can be pooled")
    seen, items = set(), []
    for r in runs:
        for it in r["items"]:
            key = (it["dataset"], it["item_id"], it["method"])
            if key in seen:
                raise ResultsError(f"item {it['dataset']} {it['item_id']} ({it['method']}) is in two runs: "
                                   "pool runs on different items (--dataset gsm8k:11-20 draws the next ten)")
            seen.add(key)
            items.append(it)
    out = copy.deepcopy({k: v for k, v in runs[0].items() if k != "_path"})
    meta = out["meta"]
    meta["command"] = command or meta["command"]
    meta["pooled_from"] = [{"command": r["meta"].get("command"), "started_at": r["meta"].get("started_at"),
                            "status": r.get("status"), "items": len({(i["dataset"], i["item_id"]) for i in r["items"]}),
                            "loadavg_start": r["meta"].get("loadavg_start")} for r in runs]
    meta["profile_checks"] = list(meta.get("profile_checks") or []) + [
        p for r in runs[1:] for p in [r["meta"].get("profile")] + list(r["meta"].get("profile_checks") or []) if p]
    meta["config"]["datasets"] = list(dict.fromkeys(d for r in runs for d in r["meta"]["config"].get("datasets") or []))
    out.update(items=items, divergences={}, status="pooled")
    return resummarize(out)
