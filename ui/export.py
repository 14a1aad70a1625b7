"""The metrics cards of a run, and its coloured answer exported as a self-contained page and as JSON."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence

from csd.config import CSDConfig
from csd.events import RunMetrics, TokenEvent
from csd.rule import RIVALS

from .render import CSS, PAPER_URL, STATUS_STYLE, _prompt_html, esc, render_legend, token_detail, token_text_html


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.1 or x == 0 else f"{100 * x:.1f}%"


def render_metrics(m: RunMetrics | None, *, running: bool = False, ar: RunMetrics | None = None,
                   first_token_s: float | None = None, method: str | None = None) -> str:
    """The metrics cards. ``ar``: the metrics of an AR run on the same prompt (for the speed-up)."""
    if m is None:
        return '<div class="csd-note">Metrics appear here after the first verify pass.</div>'
    spec = method not in (None, "ar")
    saved = m.new_tokens - m.target_forwards
    cells = [(f"target passes ({saved} fewer than AR)" if spec and saved > 0 else "target passes",
              f"{m.target_forwards}"),
             ("new tokens", f"{m.new_tokens}"), ("tokens / s", f"{m.tokens_per_s:.2f}")]
    if spec:
        # every share names what it counts, of the drafted tokens: accepted, rescued (relaxed), and kept = both
        saved_by, n, share = ((f"relaxed by the {method} rule", m.relaxed, m.relaxed_share) if method in RIVALS
                              else ("rescued by CSD", m.rescued, m.rescued_share))
        also = "relaxed" if method in RIVALS else "rescued"
        cells += [(f"accepted: draft = target ({m.accepted} of {m.drafted} drafted)", _pct(m.accepted_share)),
                  (f"{saved_by} ({n} of {m.drafted} drafted)", _pct(share)),
                  (f"kept = accepted + {also} ({m.accepted + n} of {m.drafted} drafted)", _pct(m.acceptance_rate)),
                  ("tokens per target pass", f"{m.mean_accepted_length:.2f}"),
                  ("draft block length γ (mean)", f"{m.mean_block_len:.1f}")]
    cells.append(("wall time", f"{m.wall_s:.1f} s"))
    if m.prefill_s:
        cells.append(("reading the prompt", f"{m.prefill_s:.1f} s"))
    if spec and (m.draft_s or m.verify_s):
        cells.append(("drafting / verifying", f"{m.draft_s:.1f} / {m.verify_s:.1f} s"))
    if first_token_s is not None:
        cells.append(("first token after", f"{first_token_s:.2f} s"))
    if spec and ar is not None and ar.tokens_per_s:
        cells.append(("speed-up over AR (tokens/s)", f"{m.tokens_per_s / ar.tokens_per_s:.2f}×"
                      if m.tokens_per_s else "–"))
    elif spec:
        cells.append(("speed-up over AR: run AR on this prompt first", "–"))
    body = "".join(f'<div class="csd-metric"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
                   for k, v in cells)
    state = "running…" if running else f"finished ({esc(m.stopped_by or 'done')})"
    return (f'<div class="csd-metrics" data-state="{"running" if running else "done"}">{body}</div>'
            f'<div class="csd-status">{state}</div>')


# -- export ------------------------------------------------------------------------------------
def render_export_html(events: Sequence[TokenEvent], *, prompt: str, title: str, facts: dict,
                       metrics: RunMetrics | None, cfg: CSDConfig) -> str:
    """A self-contained HTML page of a run's coloured answer (styles inline, details as hover titles, no script)."""
    spans = []
    for ev in events:
        text, extra, after = token_text_html(ev)
        cls = " ".join(["tok", STATUS_STYLE.get(ev.status, ("tok-other",))[0], *extra])
        detail = token_detail(ev, cfg.lam, cfg.tau, method=cfg.method, relax=cfg.relax)
        spans.append(f'<span class="{cls}" title="{esc(detail)}">{text}</span>{after}')
    fact_rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts.items())
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>body{{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}"
            f"table{{border-collapse:collapse;font-size:13px}}th,td{{text-align:left;padding:2px 8px}}{CSS}</style>"
            f"</head><body><h1>{esc(title)}</h1>{_prompt_html(prompt)}"
            f'<div class="csd-tokens">{"".join(spans)}</div>{render_legend(whatif=False)}'
            f"{render_metrics(metrics, method=cfg.method)}<table>{fact_rows}</table>"
            f'<p>Calibrated Speculative Decoding: <a href="{PAPER_URL}">arXiv 2604.13634</a>. Hover a token for its '
            f"details.</p></body></html>")


def export_json(events: Sequence[TokenEvent], **fields) -> str:
    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x
    data = dict(fields, events=[{k: clean(v) for k, v in e.to_dict().items()} for e in events])
    return json.dumps(data, ensure_ascii=False, indent=1, default=str)
