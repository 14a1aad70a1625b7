"""Event handlers: plain functions from component values (and the session) to new values.

Handlers that need the loaded models or the store take ``services`` first; ``build_demo`` binds
it with ``functools.partial``. Streaming handlers are generators that ``yield`` after each token.
Bad input raises ``gr.Error`` with the engine's message, which the page shows; nothing here
leaves the app in a broken state.
"""
from __future__ import annotations

import difflib
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import gradio as gr
import numpy as np

from csd.calibrate import calibrate, default_corpus, read_corpus
from csd.config import METHODS, CSDConfig, ConfigError
from csd.events import STATUSES, TokenEvent
from csd.memory import CorrectionMemory, MemoryFileError
from db import analytics as A
from db.models import CANCELLED, FAILED, FINISHED

from . import figures, render
from .state import RunView, Services, Session, new_session

SCOPES = ("this run", "this session", "all runs")
WHATIF_LAMS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
WHATIF_LOG10_TAUS = tuple(np.round(np.linspace(-4, 0, 17), 2))
STREAM_INTERVAL_S = 0.05   # at most ~20 page updates a second while streaming


def _error(msg: str) -> gr.Error:
    """A page error; gradio renders toast messages as HTML, so the text is escaped."""
    return gr.Error(render.esc_message(msg))


def _warn(msg: str) -> None:
    gr.Warning(render.esc_message(msg))


def _info(msg: str) -> None:
    gr.Info(render.esc_message(msg))


class _Stopped(Exception):
    """Raised from a progress callback when the user pressed Stop."""


# -- inputs ------------------------------------------------------------------------------------
def tau_from_log10(log10_tau: float) -> float:
    return 10.0 ** float(log10_tau)


def describe_tau(log10_tau: float) -> str:
    tau = tau_from_log10(log10_tau)
    return f"τ = {tau:.3g}  (log τ = {math.log(tau):.2f})"


def _as_int(name: str, v) -> int:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        raise ConfigError(f"{name} is missing")
    if isinstance(v, float) and not v.is_integer():
        raise ConfigError(f"{name} must be a whole number, got {v!r}")
    return int(v)


def make_config(method: str, gamma, lam, log10_tau, temperature, max_new_tokens, seed=None,
                explain: bool = False) -> CSDConfig:
    """The engine's config from slider values (floats from the page), validated by the engine."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    seed = None if seed is None or seed == "" else _as_int("seed", seed)
    cfg = CSDConfig(method=method, gamma=_as_int("gamma", gamma), lam=float(lam), tau=tau_from_log10(log10_tau),
                    temperature=float(temperature), max_new_tokens=_as_int("max new tokens", max_new_tokens),
                    seed=seed, explain=explain)
    return cfg.validated()


def ensure_session(services: Services, sess: Session | None) -> Session:
    return sess if isinstance(sess, Session) else new_session(services)


def _scope_filter(sess: Session, scope: str, run_id=None):
    """A db.analytics.Filter for a scope, or a message saying why there is nothing to show."""
    if run_id not in (None, "", 0):
        return A.Filter(run_ids=(int(run_id),)), None
    if scope == "this run":
        if sess.last is None or sess.last.run_id is None:
            return None, "No run in this session yet: generate an answer first, or pick another scope."
        return A.Filter(run_ids=(sess.last.run_id,)), None
    if scope == "this session":
        return A.Filter(session_id=sess.session_id), None
    if scope == "all runs":
        return A.ANY, None
    raise _error(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")


# -- running the engine ------------------------------------------------------------------------
class _Recorder:
    """Records a run in the store if there is one; a failing store costs a warning, not the run."""

    def __init__(self, services: Services, sess: Session, prompt: str, cfg: CSDConfig, label: str):
        self.rec, self.run_id, self.warning = None, None, None
        store = services.store
        if store is None:
            return
        p = services.pair
        try:
            self.run_id = store.start_run(kind="generate", **p.run_fields(), **cfg.run_fields(), prompt=prompt,
                                          session_id=sess.session_id, label=label)
            self.rec = store.recorder(self.run_id)
        except Exception as e:   # the database is down or full: generate anyway
            self.rec, self.run_id = None, None
            self.warning = f"this run is not recorded: {e}"

    def add(self, ev: TokenEvent) -> None:
        if self.rec is not None:
            self.rec.add(ev)

    def finish(self, text: str, metrics, status: str, error: str | None = None) -> None:
        if self.rec is None:
            return
        try:
            self.rec.finish(text, metrics, status, error)
        except Exception as e:
            self.warning = f"the run's record is incomplete: {e}"
        self.rec = None


def start_run(services: Services, sess: Session, prompt: str, chat: bool, cfg: CSDConfig,
              memory: CorrectionMemory, label: str = "ui"):
    """Validate and start a run, and its record in the store. -> (run, recorder, view, t0).
    Raises gr.Error with the engine's message on bad input (empty or too long prompt, bad config)."""
    t0 = time.perf_counter()
    pair = services.pair
    try:
        ids = pair.encode_prompt(prompt, chat)
        cfg = cfg.validated(pair.context_limit, len(ids))
        run = services.decoder.run(ids, cfg, memory)
    except (ConfigError, ValueError) as e:
        raise _error(str(e)) from None
    rec = _Recorder(services, sess, prompt, cfg, label)
    if rec.warning:
        _warn(rec.warning)
    return run, rec, RunView(rec.run_id, prompt, chat, cfg), t0


def follow_run(sess: Session, run, rec: _Recorder, view: RunView, t0: float) -> Iterator[RunView]:
    """Iterate a started run, recording each event; yield the growing view after each one and the
    finished view at the end. Stops early (recorded as cancelled) when ``sess.stop`` is set or the
    consumer closes this generator; a failing model is recorded as failed and shown as an error."""
    status, error = CANCELLED, None
    try:
        for ev in run:
            rec.add(ev)
            view.events.append(ev)
            if view.first_token_s is None:
                view.first_token_s = time.perf_counter() - t0
            view.metrics = _live_metrics(run, t0)
            if sess.stop:
                break
            yield view
        else:
            status = FINISHED
    except Exception as e:
        status, error = FAILED, f"{type(e).__name__}: {e}"
        raise _error(f"generation failed: {error}") from None
    finally:
        run.close()
        view.token_ids = list(run.token_ids)
        view.text = run.text
        view.metrics = run.metrics.to_dict()
        view.done = True
        rec.finish(view.text, run.metrics, status, error)
    if rec.warning:
        _warn(rec.warning)
    yield view


def stream_run(services: Services, sess: Session, prompt: str, chat: bool, cfg: CSDConfig,
               memory: CorrectionMemory, label: str = "ui") -> Iterator[RunView]:
    """``start_run`` then ``follow_run``: the growing ``RunView`` after each event."""
    yield from follow_run(sess, *start_run(services, sess, prompt, chat, cfg, memory, label))


def _live_metrics(run, t0: float) -> dict:
    d = run.metrics.to_dict()
    d["wall_s"] = time.perf_counter() - t0
    d["tokens_per_s"] = d["new_tokens"] / d["wall_s"] if d["wall_s"] > 0 else 0.0
    return d


def _tokens_html(view: RunView | None, lam: float, tau: float, hide_rejected: bool,
                 diff_positions: set[int] | None = None) -> str:
    if view is None:
        return render.render_tokens([], hide_rejected=hide_rejected)
    return render.render_tokens(view.events, lam=view.cfg.lam, tau=view.cfg.tau, hide_rejected=hide_rejected,
                                whatif=(lam, tau), diff_positions=diff_positions, prompt=view.prompt)


def _metrics_html(sess: Session, view: RunView) -> str:
    ar = sess.ar_speed.get((view.prompt, view.chat))
    if view.cfg.method == "ar":
        ar = None
    return render.render_metrics(view.metrics, running=not view.done, ar_tokens_per_s=ar,
                                 first_token_s=view.first_token_s, method=view.cfg.method)


def _remember_ar(sess: Session, view: RunView) -> None:
    if view.cfg.method == "ar" and view.done and view.metrics and view.metrics.get("stopped_by") != "cancelled":
        sess.ar_speed[(view.prompt, view.chat)] = view.metrics["tokens_per_s"]


# -- Generate ----------------------------------------------------------------------------------
def generate(services: Services, prompt: str, chat: bool, method: str, gamma, lam, log10_tau, temperature,
             max_new_tokens, seed, hide_rejected: bool, sess: Session | None):
    """Stream one generation. Yields (tokens html, metrics html, metrics json, what-if line, session)."""
    sess = ensure_session(services, sess)
    sess.stop = False
    try:
        cfg = make_config(method, gamma, lam, log10_tau, temperature, max_new_tokens, seed)
    except ConfigError as e:
        raise _error(str(e)) from None
    tau = cfg.tau
    run, rec, view, t0 = start_run(services, sess, prompt, chat, cfg, sess.memory, label="generate")
    sess.last = view
    try:   # show at once that the run started: the first tokens come after the first verify pass
        yield (render.render_tokens([], prompt=prompt, empty="drafting and verifying the first block…"),
               render.render_metrics({"new_tokens": 0}, running=True, method=cfg.method), None, "", sess)
    except GeneratorExit:
        run.close()
        rec.finish("", run.metrics, CANCELLED)
        raise
    last = 0.0
    for view in follow_run(sess, run, rec, view, t0):
        now = time.perf_counter()
        if view.done or now - last >= STREAM_INTERVAL_S or len(view.events) == 1:
            last = now
            if view.done:
                _remember_ar(sess, view)
            yield (_tokens_html(view, cfg.lam, tau, hide_rejected), _metrics_html(sess, view),
                   view.metrics,
                   render.whatif_summary(view.events, cfg.lam, tau) if view.done else "", sess)


def stop(sess: Session | None) -> str:
    """Ask the running generation, comparison or calibration of this session to stop."""
    if isinstance(sess, Session):
        sess.stop = True
    return "Stopping…"


def recolour(services: Services, lam, log10_tau, hide_rejected: bool, sess: Session | None):
    """Recolour the last answer under other thresholds (no model runs). -> (tokens html, what-if line)."""
    sess = ensure_session(services, sess)
    tau = tau_from_log10(log10_tau)
    view = sess.last
    if view is None:
        return render.render_tokens([], hide_rejected=hide_rejected), "", sess
    events = list(view.events)
    return (_tokens_html(replace(view, events=events), float(lam), tau, hide_rejected),
            render.whatif_summary(events, float(lam), tau), sess)


# -- Compare -----------------------------------------------------------------------------------
COMPARE_METHODS = ("ar", "sd", "csd")


def departures(base_ids: list[int], other_ids: list[int]) -> set[int]:
    """Output positions of ``other_ids`` that differ from ``base_ids`` (replaced or inserted)."""
    sm = difflib.SequenceMatcher(a=base_ids, b=other_ids, autojunk=False)
    out: set[int] = set()
    for tag, _i1, _i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "insert"):
            out.update(range(j1, j2))
    return out


def _compare_caption(method: str, view: RunView | None, ar: RunView | None, diff: set[int] | None) -> str:
    if view is None:
        return f"**{method.upper()}** — waiting"
    m = view.metrics or {}
    head = (f"**{method.upper()}** — {m.get('new_tokens', 0)} tokens, {m.get('target_forwards', 0)} target passes, "
            f"{m.get('wall_s', 0):.2f} s")
    if not view.done:
        return head + " (running…)"
    if method != "ar" and ar is not None and ar.done and diff is not None:
        if not diff:
            head += " · same tokens as AR"
        else:
            head += f" · departs from AR at token {min(diff)}; {len(diff)} tokens differ (underlined)"
        ar_tps = (ar.metrics or {}).get("tokens_per_s") or 0
        if ar_tps and m.get("tokens_per_s"):
            head += f" · {m['tokens_per_s'] / ar_tps:.2f}× AR tokens/s"
    return head


def compare(services: Services, prompt: str, chat: bool, gamma, lam, log10_tau, max_new_tokens,
            sess: Session | None):
    """Run AR, SD and CSD on one prompt, one after another (greedy). Yields the three panes, their
    captions, the chart, and the session."""
    sess = ensure_session(services, sess)
    sess.stop = False
    views: dict[str, RunView | None] = dict.fromkeys(COMPARE_METHODS)
    try:
        cfgs = {m: make_config(m, gamma, lam, log10_tau, 0.0, max_new_tokens) for m in COMPARE_METHODS}
    except ConfigError as e:
        raise _error(str(e)) from None
    tau = tau_from_log10(log10_tau)

    def out(final: bool = False):
        ar = views["ar"]
        diffs = {m: (departures(ar.token_ids, v.token_ids) if (ar and ar.done and v and v.done and m != "ar") else None)
                 for m, v in views.items()}
        panes = [_tokens_html(replace(views[m], prompt=""), float(lam), tau, False, diffs[m]) if views[m] else
                 render.render_tokens([], empty="waiting…") for m in COMPARE_METHODS]
        caps = [_compare_caption(m, views[m], ar, diffs[m]) for m in COMPARE_METHODS]
        fig = figures.make_compare_figure({m: v.metrics for m, v in views.items() if v and v.done}) \
            if final else gr.update()
        return (*panes, *caps, fig, sess)

    last = 0.0
    for m in COMPARE_METHODS:
        # SD gets a throwaway copy of the memory, so that CSD does not learn from SD's run of this prompt.
        memory = sess.memory if m == "csd" else sess.memory.copy()
        for view in stream_run(services, sess, prompt, chat, cfgs[m], memory, label="compare"):
            views[m] = view
            now = time.perf_counter()
            if view.done or now - last >= 2 * STREAM_INTERVAL_S:
                last = now
                yield out()
        _remember_ar(sess, views[m])
        if sess.stop:
            break
    if views["csd"] is not None:
        sess.last = views["csd"]
    yield out(final=True)


# -- Analyse -----------------------------------------------------------------------------------
def analyse(services: Services, scope: str, lam, log10_tau, hide_rejected: bool, sess: Session | None):
    """The four charts for a scope and thresholds, from the store (no model runs).
    -> (pareto, gaps, positions, what-if heatmap, summary, last answer recoloured, session)."""
    sess = ensure_session(services, sess)
    lam, tau = float(lam), tau_from_log10(log10_tau)
    tokens, line = recolour(services, lam, log10_tau, hide_rejected, sess)[:2]
    if services.store is None:
        msg = "No store: start the app with --db to record runs."
        e = figures.empty_figure(msg)
        return e, e, e, e, msg, tokens, sess
    f, why = _scope_filter(sess, scope)
    if f is None:
        e = figures.empty_figure(why)
        return e, e, e, e, why, tokens, sess
    try:
        rows = A.pareto_table(services.store, f)
        div = A.cached_divergences(services.store, f)
        pos = A.acceptance_by_position(services.store, f)
        grid = A.what_if_grid(services.store, WHATIF_LAMS, [tau_from_log10(x) for x in WHATIF_LOG10_TAUS], f)
        wi = A.what_if(services.store, lam, tau, f)
        kinds = A.rescued_by_kind(services.store, f)
    except Exception as e:
        raise _error(f"the store could not answer: {e}") from None
    summary = (f"**{scope}**: {wi.total} divergences logged; at λ = {lam:g}, τ = {tau:.3g} the rule would rescue "
               f"**{wi.rescued}** ({100 * wi.rate:.1f}%). Top 20% of patterns cover "
               f"{100 * A.top_share(rows):.0f}% of divergences. Rescued tokens by kind: "
               + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ".")
    return (figures.make_pareto_figure(rows), figures.make_gap_figure(div.gap, div.count, lam, tau),
            figures.make_position_figure(pos),
            figures.make_whatif_figure(grid.lams, [tau_from_log10(x) for x in WHATIF_LOG10_TAUS], grid.rate, lam, tau,
                                       grid.total),
            summary, tokens, sess)


# -- Explore -----------------------------------------------------------------------------------
EVENT_COLUMNS = ["run", "seq", "pos", "status", "token", "draft x~", "target t*", "gap", "count", "rule", "context"]


def parse_pattern(value) -> tuple[int, int] | None:
    """'12:34' (draft id : target id) -> (12, 34); '' or 'any' -> None."""
    if value in (None, "", "any"):
        return None
    try:
        d, t = str(value).split(":")
        return int(d), int(t)
    except ValueError:
        raise _error(f"pattern {value!r}: pick one from the list, or type draft_id:target_id") from None


def _event_filter(sess: Session, scope: str, run_id, statuses, pattern, text):
    base, why = _scope_filter(sess, scope, run_id)
    if base is None:
        return None, why
    bad = [s for s in (statuses or []) if s not in STATUSES]
    if bad:
        raise _error(f"unknown status {bad[0]!r}")
    return A.Filter(run_ids=base.run_ids, session_id=base.session_id, statuses=tuple(statuses) if statuses else None,
                  pattern=parse_pattern(pattern), text=(text or "").strip() or None), None


def _pattern_choices(services: Services, f) -> list[tuple[str, str]]:
    rows = A.pareto_table(services.store, A.Filter(run_ids=f.run_ids, session_id=f.session_id), limit=60)
    return [("any", "any")] + [(f"{render.show_token(r.draft_text)} → {render.show_token(r.target_text)}  ({r.count})",
                                f"{r.draft_id}:{r.target_id}") for r in rows]


def explore_events(services: Services, scope: str, run_id, statuses, pattern, text, sess: Session | None):
    """The filtered events table. -> (rows, caption, pattern dropdown update, session)."""
    sess = ensure_session(services, sess)
    if services.store is None:
        return [], "No store: start the app with --db to record runs.", gr.update(), sess
    f, why = _event_filter(sess, scope, run_id, statuses, pattern, text)
    if f is None:
        return [], why, gr.update(), sess
    limit = services.settings.events_limit
    rows = A.events(services.store, f, limit=limit)
    n = A.count_events(services.store, f)
    table = [[r["run_id"], r["seq"], r["position"], r["status"], render.show_token(r["text"]),
              render.show_token(r["draft_text"]) if r["draft_id"] is not None else "",
              render.show_token(r["target_text"]) if r["target_text"] is not None else "",
              None if r["gap"] is None else round(r["gap"], 3), r["memory_count"], r["rule"] or "",
              render.show_text(r["context"])[-60:]] for r in rows]
    caption = f"{n} events match" + (f"; the first {limit} are shown (download the CSV for all)" if n > limit else "")
    return table, caption, gr.update(choices=_pattern_choices(services, f)), sess


def export_events_csv(services: Services, scope: str, run_id, statuses, pattern, text, sess: Session | None):
    """Write the filtered events to a CSV file. -> (file path, session)."""
    sess = ensure_session(services, sess)
    if services.store is None:
        raise _error("No store: start the app with --db to record runs.")
    f, why = _event_filter(sess, scope, run_id, statuses, pattern, text)
    if f is None:
        raise _error(why)
    path = Path(tempfile.mkdtemp(prefix="csd-export-")) / "csd-events.csv"
    n = A.export_csv(services.store, f, path)
    return gr.update(value=str(path), label=f"Download CSV ({n} events)", visible=True), sess


# -- Memory ------------------------------------------------------------------------------------
MEMORY_COLUMNS = ["draft x~", "target t*", "ids", "count", "≥ λ"]


def memory_view(services: Services, lam, sess: Session | None):
    """The session's memory: a summary line and its top patterns. -> (markdown, rows, session)."""
    sess = ensure_session(services, sess)
    mem, lam = sess.memory, float(lam)
    tok = services.pair.tokenizer
    rows = [[render.show_token(tok.decode([d])), render.show_token(tok.decode([t])), f"{d}:{t}", c,
             "yes" if c >= lam else ""] for (d, t), c in mem.top(40)]
    cal = mem.meta.get("calibration") or []
    cal_txt = "; ".join(f"{render.esc(c.get('corpus') or 'corpus')}: {c.get('positions', 0)} positions"
                        for c in cal[-3:])   # a corpus name may be an uploaded file's name
    md = (f"**{len(mem)}** patterns, **{mem.total}** divergences counted, **{mem.n_candidates(lam)}** patterns at "
          f"or above λ = {lam:g}; the top 20% of patterns hold {100 * mem.top_share(0.2):.0f}% of the counts."
          + (f" Calibration: {cal_txt}." if cal_txt else " Not calibrated in this session.")
          + " This memory belongs to your session only.")
    return md, rows, sess


def calibrate_memory(services: Services, source: str, corpus_file, max_positions, lam, sess: Session | None,
                     progress=gr.Progress()):
    """Calibrate the session's memory on the default corpus or an uploaded file."""
    sess = ensure_session(services, sess)
    sess.stop = False
    try:
        n = _as_int("max positions", max_positions)
        if not 1 <= n <= 1_000_000:
            raise ConfigError(f"max positions must be in 1..1000000, got {n}")
    except ConfigError as e:
        raise _error(str(e)) from None
    if source == "uploaded file":
        if not corpus_file:
            raise _error("Upload a text or JSONL file first, or choose the default corpus.")
        try:
            texts = read_corpus(corpus_file)
        except ValueError as e:
            raise _error(str(e)) from None
        name = Path(corpus_file).name
    else:
        texts, name = default_corpus(), "default corpus"

    def cb(msg: str, frac: float) -> None:
        if sess.stop:
            raise _Stopped
        progress(frac, desc=msg)

    before = sess.memory.total
    progress(0.0, desc="calibrating…")
    work = sess.memory.copy()
    try:
        calibrate(services.pair, texts, work, max_positions=n, progress=cb, corpus_name=name)
        note = ""
    except _Stopped:
        note = " (stopped early; the counts so far are kept)"
    except ValueError as e:
        raise _error(str(e)) from None
    sess.memory = work
    if services.store is not None:
        try:
            services.store.save_memory(work, label=f"ui calibration: {name}")
        except Exception:
            pass
    _info(f"Calibrated on {name}: {work.total - before} divergences added{note}.")
    return memory_view(services, lam, sess)


def memory_reset(services: Services, to: str, lam, sess: Session | None):
    """Reset the session's memory to the default one, or clear it."""
    sess = ensure_session(services, sess)
    if to == "clear":
        sess.memory = CorrectionMemory(services.pair.pair_id)
    else:
        sess.memory = services.new_memory()
    return memory_view(services, lam, sess)


def memory_download(services: Services, sess: Session | None):
    sess = ensure_session(services, sess)
    path = Path(tempfile.mkdtemp(prefix="csd-memory-")) / "csd-memory.json.gz"
    sess.memory.save(path)
    return gr.update(value=str(path), label=f"Download csd-memory.json.gz ({len(sess.memory)} patterns)",
                     visible=True), sess


def memory_upload(services: Services, file, lam, sess: Session | None):
    """Replace the session's memory with an uploaded memory file (refused if not one, or for another pair)."""
    sess = ensure_session(services, sess)
    if not file:
        return (*memory_view(services, lam, sess)[:2], "", sess)
    try:
        mem = CorrectionMemory.load(file, expected_pair=services.pair.pair_id)
    except MemoryFileError as e:
        msg = str(e).replace(str(file), Path(file).name)
        _warn(f"Memory not loaded: {msg}")
        return (*memory_view(services, lam, sess)[:2], render.render_error(f"Memory not loaded: {msg}"), sess)
    sess.memory = mem
    _info(f"Memory loaded: {len(mem)} patterns")
    md, rows, sess = memory_view(services, lam, sess)
    return md, rows, "", sess


# -- Teach -------------------------------------------------------------------------------------
def _blocks(events: list[TokenEvent]) -> list[list[TokenEvent]]:
    out: dict[int, list[TokenEvent]] = {}
    for e in events:
        out.setdefault(e.block, []).append(e)
    return [out[k] for k in sorted(out)]


def teach_view(sess: Session | None, step: int) -> str:
    view = sess.teach if isinstance(sess, Session) else None
    if view is None or not view.events:
        return '<div class="csd-note">Run a teaching example to step through it.</div>'
    blocks = _blocks(view.events)
    step = max(0, min(step, len(blocks) - 1))
    sess.teach_step = step
    before = "".join(e.text for b in blocks[:step] for e in b if e.in_output)
    return render.render_teach_step(blocks[step], step=step, n_steps=len(blocks), text_before=before,
                                    lam=view.cfg.lam, tau=view.cfg.tau, method=view.cfg.method)


def teach_run(services: Services, prompt: str, method: str, gamma, lam, log10_tau, max_new_tokens,
              sess: Session | None):
    """Run a short generation with explanations (draft and target top-k), then show iteration 1."""
    sess = ensure_session(services, sess)
    sess.stop = False
    if method == "ar":
        raise _error("Teach steps through speculative iterations: pick sd, csd or an ablation, not ar.")
    try:
        cfg = make_config(method, gamma, lam, log10_tau, 0.0, max_new_tokens, explain=True)
    except ConfigError as e:
        raise _error(str(e)) from None
    view = None
    for view in stream_run(services, sess, prompt, True, cfg, sess.memory, label="teach"):
        pass
    sess.teach, sess.teach_step = view, 0
    return teach_view(sess, 0), sess


def teach_step(delta: int, sess: Session | None):
    if not isinstance(sess, Session):
        return teach_view(None, 0), sess
    return teach_view(sess, sess.teach_step + int(delta)), sess
