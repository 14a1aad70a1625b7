"""A run's speed waterfall: what each layer of the stack buys in tok/s, hf-ar -> ar -> sd -> sd with
copies -> csd with copies, each step over the one before on the same items (docs/benchmarks.md)."""
from __future__ import annotations

from .io import DASH, fmt, md_table, ratio_text
from .results import by_item
from .stats import speedup

STEPS = (("transformers' generate (AR)", "hf-ar", None), ("our engine (AR)", "ar", None),
         ("speculation (SD, no copies)", "sd", False), ("copies from the context (SD + copies)", "sd", True),
         ("the rule (CSD + copies)", "csd", True))


def columns(results: dict) -> list[tuple[str, str]]:
    """(step, column) for each step the run has, in the waterfall's order."""
    settings = (results.get("meta") or {}).get("config", {}).get("settings") or {}
    out = []
    for step, method, copies in STEPS:
        for name, s in settings.items():
            plain = s.get("method") == method and not s.get("hf") and _plain(name)
            if method == "hf-ar" and s.get("hf") == "generate" or method == "ar" and plain or (
                    plain and copies is not None and bool(s.get("lookup")) == copies):
                out.append((step, name))
                break
    return out


def _plain(name: str) -> bool:
    """A column that differs from its method at most in its copies (not csd[lam=3] or sd[gamma=2])."""
    if "[" not in name:
        return True
    inside = name[name.index("[") + 1:].rstrip("]").split(",")
    return all(p.split("=")[0] in ("lookup", "lookup_ngram") for p in inside)


def waterfall(results: dict) -> list[dict]:
    """Each step present: its column, tok/s, and its factor over the step before (with the interval)."""
    steps = columns(results)
    names = [c for _, c in steps]
    rows = [v for v in by_item(results.get("items") or []).values() if all(c in v for c in names)]
    out, prev = [], None
    for step, col in steps:
        tok, wall = sum(r[col]["new_tokens"] for r in rows), sum(r[col]["wall_s"] for r in rows)
        f, ci = (speedup((r[col]["new_tokens"], r[col]["wall_s"], r[prev]["new_tokens"], r[prev]["wall_s"])
                         for r in rows) if prev else (None, None))
        out.append({"step": step, "column": col, "n": len(rows), "tokens_per_s": tok / wall if wall else None,
                    "factor": f, "factor_ci95": ci, "over": prev})
        prev = col
    return out


def waterfall_lines(results: dict) -> list[str]:
    """The report's waterfall section (empty where the run has fewer than two of its steps)."""
    steps = waterfall(results)
    if len(steps) < 2:
        return []
    rows = [[s["step"], f"`{s['column']}`", fmt(s["tokens_per_s"]),
             DASH if s["over"] is None else f"{ratio_text(s['factor'], s['factor_ci95'])} over `{s['over']}`"]
            for s in steps]
    return ["", f"## Speed waterfall ({steps[0]['n']} items every step finished)", "",
            "Each step's factor is its tok/s over the step above it, on the same items (95% interval over the "
            "items). Rows on transformers' engine: `hf-ar`; every other row runs on this project's engine.", "",
            *md_table(["Step", "Column", "tok/s", "Factor over the step above"], rows, left=2)]
