"""Quality alarms of a benchmark run: where a column's answers are not the kind AR gives (length,
endings, graded items); docs/benchmarks.md, "How the benchmark measures"."""
from __future__ import annotations

from .io import fmt, pct
from .results import by_item

LENGTH_BAND = (0.8, 1.25)       # a method's tokens over AR's on the same items, outside: an alarm
EOS_DROP = 0.10                 # a fall in the share of answers that ended by themselves, beyond: an alarm
TEXT_CHARS = 600                # of each text in the report (results.json keeps them whole)


def flips(results: dict, method: str) -> list[dict]:
    """The items that ``method`` and AR both graded and graded differently, in the run's order."""
    out = []
    for (ds, item), per in by_item(results.get("items") or []).items():
        a, m = per.get("ar"), per.get(method)
        if a and m and a.get("correct") is not None and m.get("correct") is not None and a["correct"] != m["correct"]:
            out.append({"dataset": ds, "item_id": item, "correct": m["correct"], "ar_correct": a["correct"],
                        "predicted": m.get("predicted"), "ar_predicted": a.get("predicted"),
                        "text": m.get("text") or "", "ar_text": a.get("text") or ""})
    return out


def alarms(stats: dict, ar: dict) -> list[str]:
    """What is out of its band for one column (``stats``) against AR's (``ar``), in words."""
    out = []
    length = stats.get("length_vs_ar")
    if length is not None and not LENGTH_BAND[0] <= length <= LENGTH_BAND[1]:
        out.append(f"answers {length:.2f}x AR's length (band {LENGTH_BAND[0]}-{LENGTH_BAND[1]})")
    eos, ar_eos = stats.get("eos_share"), ar.get("eos_share")
    if eos is not None and ar_eos is not None and ar_eos - eos > EOS_DROP:
        out.append(f"{100 * eos:.0f}% ended by EOS against AR's {100 * ar_eos:.0f}%")
    acc = stats.get("accuracy_vs_ar") or {}
    if acc.get("lost", 0) > acc.get("gained", 0):
        out.append(f"lost {acc['lost']} graded items to AR, gained {acc['gained']}")
    return out


def _text(t: str) -> str:
    cut = t if len(t) <= TEXT_CHARS else t[:TEXT_CHARS] + f" [... {len(t) - TEXT_CHARS} more characters]"
    return "\n".join("    " + line for line in cut.splitlines() or [""])


def alarm_lines(results: dict, overall_stats: dict) -> list[str]:
    """The report's "Quality against AR" section (empty without an AR column)."""
    ar = overall_stats.get("ar")
    if not ar:
        return []
    lines = ["", "## Quality against AR (all items)", "",
             "Length: a column's tokens over AR's on the same items. Ended: answers that stopped by EOS / by the "
             f"token cap. Alarm: length outside {LENGTH_BAND[0]}-{LENGTH_BAND[1]}x, {100 * EOS_DROP:.0f} points "
             "fewer answers ending by EOS than AR, or more graded items lost to AR than gained.", "",
             "| Method | Length vs AR | Ended by EOS | Cut by the cap | Graded unlike AR (gained / lost) | Alarm |",
             "|---|---:|---:|---:|---:|---|"]
    for m, s in overall_stats.items():
        acc = s.get("accuracy_vs_ar") or {}
        vs = f"{acc['gained']} / {acc['lost']}" if acc.get("n") else "–"
        found = alarms(s, ar) if m != "ar" else []
        lines.append(f"| {m} | {fmt(s.get('length_vs_ar'), '.2f', 'x')} | {pct(s.get('eos_share'), 0)} "
                     f"| {pct(s.get('cap_share'), 0)} | {vs} | {'; '.join(found) if found else 'none'} |")
    for m in [m for m in overall_stats if m != "ar"]:
        for f in flips(results, m):
            verdict = ("right where AR was wrong" if f["correct"] else "wrong where AR was right")
            lines += ["", f"**{m}, {f['dataset']} {f['item_id']}: {verdict}** (graded {f['predicted']!r}; "
                          f"AR's {f['ar_predicted']!r})", "", f"{m}:", "", _text(f["text"]), "", "AR:", "",
                      _text(f["ar_text"])]
    return lines

