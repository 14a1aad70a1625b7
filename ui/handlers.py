"""Event handlers: plain functions from component values (and the session) to new values.

Handlers that need the loaded models or the store take ``services`` first; ``build_demo`` binds
it with ``functools.partial``. Streaming handlers are generators that ``yield`` once per target
pass (the engine marks the last event of each pass with ``pass_end``), so one pass is one
visible burst. Model work is a ``Job`` of the model lane (``ui.lane``): a click asks for one at
once (``request_job``, beside the model's queue), the queued handler takes it, and Stop cancels exactly
the jobs it names, waiting or running. Bad input raises ``gr.Error`` with the engine's message;
an unexpected failure is logged with its traceback first and shown as a sentence.
"""
from __future__ import annotations

import difflib
import html
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gradio as gr
import numpy as np

from csd.calibrate import Stop as CalibrationStop
from csd.calibrate import calibrate, calibrate_prompts
from csd.config import DEFAULT_LOOKUP, GAMMA_AUTO, METHODS, ConfigError, CSDConfig, default_lookup
from csd.corpus import default_corpus, read_corpus, read_prompts
from csd.events import REJECTED, RESCUED, STATUSES, RunMetrics, TokenEvent, common_prefix
from csd.memory import CorrectionMemory, MemoryFileError
from csd.rule import log_tau, rescues
from db import analytics as A
from db.store import NullRecorder, recording

from . import figures, render
from .lane import Job
from .state import RunView, Services, Session, new_session

log = logging.getLogger(__name__)

SCOPE_RUN, SCOPE_SESSION, SCOPE_ALL = "this run", "this session", "all runs (shared: every user's)"
LOOKUP_TOKENS = DEFAULT_LOOKUP   # the Generate tab's copy length when copying is on (the CLI's default --lookup)
WHATIF_LAMS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
WHATIF_LOG10_TAUS = tuple(np.round(np.linspace(-4, 0, 17), 2))
NO_STORE = "No store: start the app with --db to record runs."
ORPHAN_S = 20.0     # a request waiting this long with nothing ahead of it never reached the queue


def scopes(services: Services) -> list[str]:
    """The scopes of Analyse and Explore; the shared one only when the app offers it."""
    return [SCOPE_RUN, SCOPE_SESSION] + ([SCOPE_ALL] if services.settings.shared_scope else [])


def _error(msg: str) -> gr.Error:
    """A page error; gradio renders toast messages as HTML, so the text is escaped."""
    return gr.Error(render.esc_message(msg))


def _warn(msg: str) -> None:
    gr.Warning(render.esc_message(msg))


def _info(msg: str) -> None:
    gr.Info(render.esc_message(msg))


# -- inputs ------------------------------------------------------------------------------------
def tau_from_log10(log10_tau: float) -> float:
    return 10.0 ** float(log10_tau)


def describe_tau(log10_tau: float) -> str:
    tau = tau_from_log10(log10_tau)
    return f"τ = {tau:.3g}  (log τ = {log_tau(tau):.2f})"


def _as_int(name: str, v) -> int:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        raise ConfigError(f"{name} is missing")
    if isinstance(v, float) and not v.is_integer():
        raise ConfigError(f"{name} must be a whole number, got {v!r}")
    return int(v)


def make_config(method: str, gamma, lam, log10_tau, temperature, max_new_tokens, seed=None,
                explain: bool = False, auto_gamma: bool = False, lookup: bool = False) -> CSDConfig:
    """The engine's config from slider values (floats from the page), validated by the engine.
    ``auto_gamma``: the block length is chosen per block from the machine's measured costs;
    ``lookup``: copies from the context (up to ``LOOKUP_TOKENS``) are proposed where they pay (sd, csd
    and the ablations; the switch means nothing to ar)."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    seed = None if seed is None or seed == "" else _as_int("seed", seed)
    cfg = CSDConfig(method=method, gamma=GAMMA_AUTO if auto_gamma else _as_int("gamma", gamma), lam=float(lam),
                    tau=tau_from_log10(log10_tau), temperature=float(temperature),
                    max_new_tokens=_as_int("max new tokens", max_new_tokens), seed=seed, explain=explain,
                    lookup=default_lookup(method) if lookup else 0)   # ar drafts nothing to copy into
    return cfg.validated()


def _config(*args, **kw) -> CSDConfig:
    try:
        return make_config(*args, **kw)
    except ConfigError as e:
        raise _error(str(e)) from None


def ensure_session(services: Services, sess: Session | None) -> Session:
    return sess if isinstance(sess, Session) else new_session(services)


def _scope_filter(services: Services, sess: Session, scope: str, run_id=None):
    """A db.analytics.Filter for a scope, or a message saying why there is nothing to show."""
    private = None if services.settings.shared_scope else sess.session_id
    if run_id not in (None, "", 0):
        return A.Filter(run_ids=(int(run_id),), session_id=private), None
    if scope == SCOPE_RUN:
        if sess.last is None or sess.last.run_id is None:
            return None, "No run in this session yet: generate an answer first, or pick another scope."
        return A.Filter(run_ids=(sess.last.run_id,)), None
    if scope == SCOPE_SESSION:
        return A.Filter(session_id=sess.session_id), None
    if scope == SCOPE_ALL and services.settings.shared_scope:
        return A.ANY, None
    raise _error(f"unknown scope {scope!r}; choose one of {', '.join(scopes(services))}")


# -- the model lane: asking, waiting, stopping -------------------------------------------------
def request_job(services: Services, kind: str, sess: Session | None, prompt: str | None = None, chat: bool = True):
    """A click on Generate / Compare / Run / Calibrate, answered at once (not behind model work):
    a prompt that is empty or over the cap is refused here, before it waits for anything; else
    the request takes its place in the lane and the page starts asking for its status.
    -> (session, status line, status timer)."""
    sess = ensure_session(services, sess)
    if prompt is not None:
        _prompt_ids(services, prompt, chat)
    job = services.lane.request(sess.session_id, kind)
    sess.pending[kind].append(job)
    sess.jobs[kind] = job
    return sess, status_line(services, sess, kind), gr.Timer(active=True)


def take_job(services: Services, sess: Session, kind: str) -> Job:
    """The job this handler call runs: the oldest one the page asked for, else a new one (an API
    caller that went straight to the endpoint)."""
    q = sess.pending[kind]
    job = q.popleft() if q else services.lane.request(sess.session_id, kind)
    sess.jobs[kind] = job
    return job


def stop(services: Services, kind: str | None, sess: Session | None):
    """Stop this session's jobs of ``kind`` (None: all kinds), running or still waiting.
    -> the status line of ``kind`` (or of generate)."""
    if not isinstance(sess, Session):
        return render.render_status("Nothing to stop.", "idle")
    for job in sess.all_jobs(kind):
        if not job.finished:
            job.cancel = True
    return status_line(services, sess, kind or "generate")


def _ago(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def _run_progress(job: Job, now: float) -> str:
    """What a running job is doing, from its live Run (read without a lock: counters only)."""
    run = job.run
    label = f"{job.label}: " if job.label else ""
    if job.progress:
        return f"{label}{job.progress} · {_ago(job.elapsed(now))}"
    if run is None:
        return f"{label}starting · {_ago(job.elapsed(now))}"
    m = run.metrics
    if m.target_forwards == 0 and m.prefill_s == 0 and job.prompt_tokens > 1:
        return f"{label}reading the prompt ({job.prompt_tokens:,} tokens) · {_ago(job.elapsed(now))}"
    return (f"{label}verify pass {m.target_forwards + 1} running · {m.new_tokens} of at most {job.max_tokens} "
            f"tokens · {_ago(job.elapsed(now))}")


def status_line(services: Services, sess: Session | None, kind: str) -> str:
    """The status line beside a Run button: the queue ahead, the live progress, Stopping…, or
    what the last job did."""
    job = sess.jobs.get(kind) if isinstance(sess, Session) else None
    if job is None:
        return render.render_status("Ready.", "idle")
    now = time.monotonic()
    if job.finished:
        failed = job.cancel or job.summary.startswith(("Not run", "Failed", "The request did not"))
        return render.render_status(job.summary or "Done.", "stopped" if failed else "done")
    if job.cancel:
        what = "it will not start" if job.waiting else "after the current step"
        return render.render_status(f"Stopping… ({what}) · {_ago(job.elapsed(now))}", "stopping")
    if job.waiting:
        services.lane.touch(job)
        ahead = services.lane.ahead(job)
        if _orphan(services, sess, job, ahead, now):
            return render.render_status(job.summary, "stopped")
        if not ahead:
            return render.render_status(f"Starting… (waited {_ago(now - job.queued_at)})", "waiting")
        running = [j for j in ahead if j.running]
        first = running[0] if running else None
        doing = f" The one running: {_run_progress(first, now)}." if first else ""
        n = len(ahead)
        return render.render_status(f"Waiting for the model: {n} request{'s' if n > 1 else ''} ahead of yours "
                                    f"(waited {_ago(now - job.queued_at)}).{doing}", "waiting")
    return render.render_status(_run_progress(job, now), "running")


def _orphan(services: Services, sess: Session, job: Job, ahead: list[Job], now: float) -> bool:
    """A request that waits with nothing ahead of it, long after the queue would have started it,
    was refused on its way (a full queue, an input the queue rejected, a second click the page
    ignored): it stops waiting. True if ``job`` was such a request."""
    if ahead or now - job.queued_at <= ORPHAN_S:
        return False
    q = sess.pending[job.kind]
    if job in q:
        q.remove(job)
    services.lane.finish(job, "The request did not reach the model (the queue refused it); please try again.")
    return True


def poll_status(services: Services, sess: Session | None):
    """The status timer's tick: every status line; the timer stops once nothing is waiting or running.
    -> (generate, compare, teach, calibrate status lines, timer)."""
    if isinstance(sess, Session):
        now = time.monotonic()
        for job in sess.all_jobs():
            if job.waiting and job is not sess.jobs.get(job.kind):
                services.lane.touch(job)
                _orphan(services, sess, job, services.lane.ahead(job), now)
    lines = [status_line(services, sess, k) for k in ("generate", "compare", "teach", "calibrate")]
    busy = isinstance(sess, Session) and any(not j.finished for j in sess.all_jobs())
    return (*lines, gr.Timer(active=busy))


@contextmanager
def _in_lane(services: Services, job: Job):
    """The job holds the model inside this block; its summary is written on the way out."""
    services.lane.start(job)
    try:
        yield job
    except gr.Error as e:
        job.summary = f"Not run: {e.message}"
        raise
    except GeneratorExit:
        job.summary = job.summary or "Stopped (the page went away)."
        raise
    finally:
        services.lane.finish(job)


def _prompt_ids(services: Services, prompt: str, chat: bool, cfg: CSDConfig | None = None) -> list[int]:
    """The prompt's token ids, refused with a clear message when empty, over the app's prompt cap
    or (given the config) too long for the model's context."""
    pair, cap = services.pair, services.settings.max_prompt_tokens
    try:
        ids = pair.encode_prompt(prompt, chat)
    except ValueError as e:
        raise _error(str(e)) from None
    if len(ids) > cap:
        raise _error(f"The prompt is {len(ids):,} tokens long; this app takes prompts of at most {cap:,} tokens "
                     f"(python app.py --max-prompt-tokens N sets the limit). Please shorten it.")
    if cfg is not None:
        try:
            cfg.validated(pair.context_limit, len(ids))
        except ConfigError as e:
            raise _error(str(e)) from None
    return ids


# -- recording ---------------------------------------------------------------------------------
@contextmanager
def _recorded(services: Services, sess: Session, prompt: str, cfg: CSDConfig, label: str):
    """``store.record(...)`` for a run, or a no-op recorder without a store. A failing database
    costs a warning (logged with its traceback), never the run."""
    p = services.pair
    fields = dict(kind="generate", **p.run_fields(), **cfg.run_fields(), prompt=prompt, session_id=sess.session_id,
                  label=label, target_repr=p.target_repr, draft_repr=p.draft_dtype or None)
    try:
        rec = recording(services.store, **fields)
    except Exception as e:   # the database is down or full: generate anyway
        log.exception("could not start recording a run")
        _warn(f"This run is not recorded: {e}")
        rec = NullRecorder()
    exc_info = (None, None, None)
    try:
        yield rec
    except BaseException as e:
        exc_info = (type(e), e, e.__traceback__)
        raise
    finally:
        try:
            rec.__exit__(*exc_info)
        except Exception as e:
            log.exception("could not finish the record of run %s", getattr(rec, "run_id", None))
            _warn(f"The run's record is incomplete: {e}")


def follow_run(run, rec, view: RunView, t0: float) -> Iterator[RunView]:
    """Iterate a started run, recording each event; yield the view at the end of every target pass
    and once more, finished, at the end. A failing model is logged and shown as an error."""
    view.run_id = getattr(rec, "run_id", None)
    try:
        for ev in run:
            rec.add(ev)
            view.events.append(ev)
            if view.first_token_s is None and ev.in_output:
                view.first_token_s = time.perf_counter() - t0
            if ev.pass_end:
                view.metrics = run.metrics_snapshot()
                yield view
    except Exception as e:
        log.exception("generation failed")
        raise _error(f"Generation failed: {type(e).__name__}: {e}") from None
    finally:
        run.close()
        view.token_ids = list(run.token_ids)
        view.text = run.text
        view.metrics = run.metrics_snapshot()
        view.done = True
    rec.result(view.text, view.metrics)
    yield view


def _start(services: Services, sess: Session, job: Job, prompt: str, chat: bool, cfg: CSDConfig, memory,
           label: str = "") -> tuple[object, RunView]:
    ids = _prompt_ids(services, prompt, chat, cfg)
    try:
        run = services.decoder.run(ids, cfg, memory, should_stop=lambda: job.cancel)
    except (ConfigError, ValueError) as e:
        raise _error(str(e)) from None
    job.run, job.label, job.progress = run, label, ""
    job.prompt_tokens, job.max_tokens = len(ids), cfg.max_new_tokens
    return run, RunView(None, prompt, chat, cfg, prompt_tokens=len(ids))


def _done_sentence(view: RunView) -> str:
    m = view.metrics
    if m is None:
        return "Done."
    head = "Stopped" if m.stopped_by == "cancelled" else "Done"
    return (f"{head}: {m.new_tokens} tokens in {m.target_forwards} verify pass{'es' if m.target_forwards != 1 else ''}"
            f", {m.wall_s:.1f} s.")


def _pass_sentence(view: RunView) -> str:
    """What the pass that just arrived did (the burst on the page)."""
    last = view.events[-1].block
    evs = [e for e in view.events if e.block == last]
    if view.cfg.method == "ar":
        return f"Verify pass {last + 1}: one token (autoregressive)."
    drafted = sum(1 for e in evs if e.draft_id is not None)
    kept = sum(1 for e in evs if e.draft_id is not None and e.in_output)
    end = evs[-1].status
    tail = "a free bonus token" if end == "bonus" else "the target's correction"
    n = evs[0].block_len or drafted
    return f"Verify pass {last + 1}: {kept} of {n} drafted tokens kept, then {tail}."


# -- Generate ----------------------------------------------------------------------------------
def _tokens_html(view: RunView | None, lam: float, tau: float, hide_rejected: bool,
                 diff_positions: set[int] | None = None, view_id: str = "tokens", prompt: bool = True,
                 empty: str | None = None, panel: str | None = None) -> str:
    kw = dict(empty=empty) if empty else {}
    kw["panel"] = panel
    if view is None:
        return render.render_tokens([], hide_rejected=hide_rejected, view=view_id, **kw)
    latest = view.events[-1].block if (view.events and not view.done) else None
    return render.render_tokens(view.events, lam=view.cfg.lam, tau=view.cfg.tau, hide_rejected=hide_rejected,
                                whatif=(lam, tau), diff_positions=diff_positions,
                                prompt=view.prompt if prompt else None, latest_block=latest, view=view_id, **kw)


def _metrics_html(sess: Session, view: RunView) -> str:
    ar = sess.ar_speed.get((view.prompt, view.chat)) if view.cfg.method != "ar" else None
    return render.render_metrics(view.metrics, running=not view.done, ar=ar, first_token_s=view.first_token_s,
                                 method=view.cfg.method)


def _remember_ar(sess: Session, view: RunView | None) -> None:
    if view is not None and view.cfg.method == "ar" and view.done and view.metrics \
            and view.metrics.stopped_by != "cancelled":
        sess.ar_speed[(view.prompt, view.chat)] = view.metrics


def _metrics_json(m: RunMetrics | None) -> dict | None:
    """The one border where metrics become a dict: the JSON component."""
    return None if m is None else m.to_dict()


def generate(services: Services, prompt: str, chat: bool, method: str, gamma, auto_gamma: bool, lam, log10_tau,
             temperature, max_new_tokens, seed, hide_rejected: bool, lookup: bool, sess: Session | None):
    """Stream one generation, one burst per verify pass. Yields (tokens html, rescue summary,
    metrics html, metrics json, what-if line, status line, session)."""
    sess = ensure_session(services, sess)
    job = take_job(services, sess, "generate")
    if job.cancel:
        services.lane.finish(job, "Stopped before it started: the model never ran for it.")
        yield (gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), status_line(services, sess, "generate"), sess)
        return
    with _in_lane(services, job):
        cfg = _config(method, gamma, lam, log10_tau, temperature, max_new_tokens, seed, auto_gamma=auto_gamma,
                      lookup=bool(lookup))
        t0 = time.perf_counter()
        run, view = _start(services, sess, job, prompt, chat, cfg, sess.memory)
        sess.last = view
        yield (_tokens_html(view, cfg.lam, cfg.tau, hide_rejected,
                            empty=f"Reading the prompt ({view.prompt_tokens:,} tokens), then the first draft "
                                  f"block and its verify pass…"),
               "", render.render_metrics(None), None, "", status_line(services, sess, "generate"), sess)
        with _recorded(services, sess, prompt, cfg, "generate") as rec:
            for _ in follow_run(run, rec, view, t0):    # the same view, one pass further each time
                if view.done:
                    break
                yield (_tokens_html(view, cfg.lam, cfg.tau, hide_rejected), render.run_summary(view.events),
                       _metrics_html(sess, view), gr.skip(), render.esc_md(_pass_sentence(view)),
                       status_line(services, sess, "generate"), sess)
        _remember_ar(sess, view)
        job.summary = _done_sentence(view)
    yield (_tokens_html(view, cfg.lam, cfg.tau, hide_rejected), render.run_summary(view.events),
           _metrics_html(sess, view), _metrics_json(view.metrics),
           render.esc_md(render.whatif_summary(view.events, cfg.lam, cfg.tau)),
           status_line(services, sess, "generate"), sess)


def recolour(services: Services, lam, log10_tau, hide_rejected: bool, sess: Session | None):
    """Recolour the last answer under other thresholds (no model runs). -> (tokens html, what-if line)."""
    sess = ensure_session(services, sess)
    tau = tau_from_log10(log10_tau)
    view = sess.last
    if view is None:
        return render.render_tokens([], hide_rejected=hide_rejected), "", sess
    return (_tokens_html(view, float(lam), tau, hide_rejected),
            render.esc_md(render.whatif_summary(view.events, float(lam), tau)), sess)


def export_answer(services: Services, lam, log10_tau, sess: Session | None):
    """The last answer as a self-contained coloured HTML page and as JSON. -> (files, session)."""
    sess = ensure_session(services, sess)
    view = sess.last
    if view is None or not view.events:
        raise _error("Nothing to export yet: generate an answer first.")
    d = services.pair.describe()
    facts = {"method": view.cfg.method, "γ": view.cfg.gamma, "λ": f"{view.cfg.lam:g}", "τ": f"{view.cfg.tau:.3g}",
             "draft": d["draft"], "target": d["target"], "representations": f"target {d['target_repr']}, "
             f"draft {d['draft_repr']}", "device": d["device"]}
    out = Path(tempfile.mkdtemp(prefix="csd-answer-"))
    page = render.render_export_html(view.events, prompt=view.prompt, title="CSD Explorer answer", facts=facts,
                                     lam=view.cfg.lam, tau=view.cfg.tau, metrics=view.metrics, method=view.cfg.method)
    (out / "csd-answer.html").write_text(page, encoding="utf-8")
    (out / "csd-answer.json").write_text(render.export_json(
        view.events, prompt=view.prompt, chat=view.chat, text=view.text, config=vars(view.cfg), pair=d,
        metrics=_metrics_json(view.metrics)), encoding="utf-8")
    return gr.update(value=[str(out / "csd-answer.html"), str(out / "csd-answer.json")], visible=True), sess


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


def _code(text: str) -> str:
    """A token's text as inline code in a Markdown caption, escaped (it reaches the page as HTML)."""
    return f"<code>{html.escape(repr(text)[1:-1])}</code>"


def leaves_sd(csd: RunView, sd: RunView) -> str:
    """Where CSD's answer first leaves SD's (SD's token there is the target's choice) and why: a rescue
    (with the memory's count) or, in a representation whose passes round differently, the rounding."""
    a, b = sd.token_ids, csd.token_ids
    if a == b:
        return " · same tokens as SD"
    i = common_prefix(a, b)
    if i >= len(a) or i >= len(b):
        return f" · leaves SD's answer at token {i}, where {'SD' if i >= len(a) else 'CSD'} ended"
    ev, sd_ev = (next((e for e in v.events if e.position == i and e.status != REJECTED), None) for v in (csd, sd))
    head = (f" · leaves SD's answer at token {i}: SD (the target's choice) wrote {_code(sd_ev.text if sd_ev else '')}, "
            f"CSD kept {_code(ev.text if ev else '')}")
    if ev is not None and ev.status == RESCUED:
        seen = f"the memory had seen this divergence {ev.memory_count} times" if ev.memory_count else "the gate let it through"
        return head + f", a rescue ({seen}); everything after it follows from that token"
    return head


def _compare_caption(method: str, view: RunView | None, ar: RunView | None, diff: set[int] | None,
                     sd: RunView | None = None) -> str:
    if view is None:
        return f"**{method.upper()}**: waiting"
    m = view.metrics
    if m is None:
        return f"**{method.upper()}**: reading the prompt…"
    saved = m.new_tokens - m.target_forwards
    head = f"**{method.upper()}**: {m.target_forwards} target passes"
    if method != "ar" and saved > 0:
        head += f" (**{saved} saved**)"
    head += f" for {m.new_tokens} tokens, {m.wall_s:.2f} s"
    if not view.done:
        return head + " (running…)"
    if method != "ar" and ar is not None and ar.done and diff is not None:
        head += " · same tokens as AR" if not diff else \
            f" · departs from AR at token {min(diff)}; {len(diff)} tokens differ (wavy underline)"
        if ar.metrics and ar.metrics.tokens_per_s and m.tokens_per_s:
            head += f" · {m.tokens_per_s / ar.metrics.tokens_per_s:.2f}× AR tokens/s"
    if method == "csd" and sd is not None and sd.done:
        head += leaves_sd(view, sd)
    return head


def compare_note(views: dict[str, RunView | None]) -> str:
    """Lead with the target passes saved, then explain the wall time from the measured cost of a
    verify pass against an AR step (why SD can be slower than AR on a busy or float32 CPU)."""
    done = {k: v.metrics for k, v in views.items() if v is not None and v.done and v.metrics}
    if "ar" not in done or len(done) < 2:
        return ("Speculative decoding saves **target passes**: one pass checks a whole block of draft tokens. "
                "Whether that saves **time** depends on what a pass costs on this machine; the comparison "
                "measures both.")
    a = done["ar"]
    step = a.verify_s / a.target_forwards if a.target_forwards else 0.0
    lines = []
    for k in ("sd", "csd"):
        if k not in done:
            continue
        m = done[k]
        saved = a.target_forwards - m.target_forwards
        per = m.verify_s / m.target_forwards if m.target_forwards else 0.0
        ratio = per / step if step else 0.0
        lines.append(f"**{k.upper()}** used {m.target_forwards} target passes instead of AR's {a.target_forwards} "
                     f"(**{saved} saved**, {m.mean_accepted_length:.2f} tokens per pass); one of its verify passes "
                     f"(a block of about {m.mean_block_len:.1f} draft tokens + 1) took {per:.3f} s against "
                     f"{step:.3f} s for an AR step (**{ratio:.1f}×**); drafting took {m.draft_s:.2f} s in all, and "
                     f"reading the prompt {m.prefill_s:.2f} s with both models (AR: {a.prefill_s:.2f} s, the target "
                     f"alone).")
    faster = [k for k in ("sd", "csd") if k in done and done[k].wall_s < a.wall_s]
    why = ("**Why speculative decoding can be slower than AR here.** On a GPU a verify pass over γ + 1 tokens costs "
           "about as much as one AR step, so every kept draft token is time saved. On a CPU, and more so a busy "
           "one or a float32 model, the work of a pass grows with the tokens in it: when a verify pass costs "
           "nearly as many AR steps as the tokens it yields, the passes saved no longer save time, and the draft's "
           "own time comes on top. A shorter block (γ) or γ = auto (chosen from this machine's measured costs) "
           "helps.")
    verdict = ("Here " + " and ".join(k.upper() for k in faster) + " also finished sooner than AR."
               if faster else "Here neither finished sooner than AR.")
    return "\n\n".join(lines + [verdict, why])


def compare(services: Services, prompt: str, chat: bool, gamma, auto_gamma: bool, lam, log10_tau, max_new_tokens,
            sess: Session | None):
    """Run AR, SD and CSD on one prompt, one after another (greedy), one burst per verify pass.
    Yields the three panes, their captions, the chart, the explanation, the status line, the session."""
    sess = ensure_session(services, sess)
    job = take_job(services, sess, "compare")
    views: dict[str, RunView | None] = dict.fromkeys(COMPARE_METHODS)
    tau = tau_from_log10(log10_tau)

    def out(final: bool = False):
        ar = views["ar"]
        diffs = {m: (departures(ar.token_ids, v.token_ids) if (ar and ar.done and v and v.done and m != "ar") else None)
                 for m, v in views.items()}
        panes = [_tokens_html(views[m], float(lam), tau, False, diffs[m], view_id=f"pane-{m}", prompt=False,
                              panel="compare")
                 if views[m] else render.render_tokens([], empty="waiting…", view=f"pane-{m}", panel="compare")
                 for m in COMPARE_METHODS]
        caps = [_compare_caption(m, views[m], ar, diffs[m], views["sd"]) for m in COMPARE_METHODS]
        fig = figures.make_compare_figure({m: v.metrics for m, v in views.items() if v and v.done and v.metrics}) \
            if final else gr.skip()
        note = compare_note(views) if final else gr.skip()
        return (*panes, *caps, fig, note, status_line(services, sess, "compare"), sess)

    if job.cancel:
        services.lane.finish(job, "Stopped before it started: the model never ran for it.")
        yield (*[gr.skip()] * 8, status_line(services, sess, "compare"), sess)
        return
    with _in_lane(services, job):
        cfgs = {m: _config(m, gamma, lam, log10_tau, 0.0, max_new_tokens, auto_gamma=auto_gamma and m != "ar")
                for m in COMPARE_METHODS}
        for m in COMPARE_METHODS:
            if job.cancel:
                break
            # SD gets a throwaway copy of the memory, so that CSD does not learn from SD's run of this prompt.
            memory = sess.memory if m == "csd" else sess.memory.copy()
            t0 = time.perf_counter()
            run, views[m] = _start(services, sess, job, prompt, chat, cfgs[m], memory, label=m.upper())
            yield out()
            with _recorded(services, sess, prompt, cfgs[m], "compare") as rec:
                for _ in follow_run(run, rec, views[m], t0):
                    yield out()
            _remember_ar(sess, views[m])
        if views["csd"] is not None:
            sess.last = views["csd"]
        done = [v for v in views.values() if v is not None and v.done]
        job.summary = ("Stopped" if job.cancel else "Done") + \
            f": {len(done)} of 3 methods ran, {sum(v.metrics.new_tokens for v in done)} tokens in all."
    yield out(final=True)


# -- Analyse -----------------------------------------------------------------------------------
def analyse(services: Services, scope: str, lam, log10_tau, hide_rejected: bool, sess: Session | None):
    """The four charts for a scope and thresholds, from the store (no model runs).
    -> (pareto, gaps, positions, what-if heatmap, summary, heading, last answer recoloured, session)."""
    sess = ensure_session(services, sess)
    lam, tau = float(lam), tau_from_log10(log10_tau)
    tokens = _tokens_html(sess.last, lam, tau, hide_rejected, view_id="analyse-tokens")
    changed = render.changed_decisions(sess.last.events, lam, tau) if sess.last else 0
    heading = ("**Last answer under the λ/τ sliders**"
               + (f": {changed} changed decision{'s' if changed != 1 else ''} outlined (dashed: would be rescued, "
                  f"double: would be rejected)" if changed else (": no decision changes" if sess.last else "")))
    if services.store is None:
        e = figures.empty_figure(NO_STORE)
        return e, e, e, e, NO_STORE, heading, tokens, sess
    f, why = _scope_filter(services, sess, scope)
    if f is None:
        e = figures.empty_figure(why)
        return e, e, e, e, why, heading, tokens, sess
    try:
        rows = A.pareto_table(services.store, f)
        div = A.cached_divergences(services.store, f)
        pos = A.acceptance_by_position(services.store, f)
        grid = A.what_if_grid(services.store, WHATIF_LAMS, [tau_from_log10(x) for x in WHATIF_LOG10_TAUS], f)
        wi = A.what_if(services.store, lam, tau, f)
        kinds = A.rescued_by_kind(services.store, f)
    except Exception as e:
        log.exception("the store could not answer the analysis")
        raise _error(f"The store could not answer: {e}") from None
    summary = (f"**{render.esc_md(scope)}**: {wi.total} divergences logged; at λ = {lam:g}, τ = {tau:.3g} the rule "
               f"would rescue **{wi.rescued}** ({100 * wi.rate:.1f}%). Top 20% of patterns cover "
               f"{100 * A.top_share(rows):.0f}% of divergences. Rescued tokens by kind: "
               + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ".")
    return (figures.make_pareto_figure(rows), figures.make_gap_figure(div.gap, div.count, lam, tau),
            figures.make_position_figure(pos),
            figures.make_whatif_figure(grid.lams, [tau_from_log10(x) for x in WHATIF_LOG10_TAUS], grid.rate, lam, tau,
                                       grid.total),
            summary, heading, tokens, sess)


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


def _event_filter(services: Services, sess: Session, scope: str, run_id, statuses, pattern, text):
    base, why = _scope_filter(services, sess, scope, run_id)
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


def _event_row(le: A.LoggedEvent) -> list:
    e: TokenEvent = le.event
    return [le.run_id, le.seq, e.position, e.status + (" (special)" if e.special else ""), render.show_token(e.text),
            render.show_token(e.draft_text) if e.draft_id is not None else "",
            render.show_token(e.target_text) if e.target_text is not None else "",
            None if e.gap is None else round(e.gap, 3), e.memory_count, e.rule or "",
            render.show_text(le.context)[-60:]]


def explore_events(services: Services, scope: str, run_id, statuses, pattern, text, sess: Session | None):
    """The filtered events table. -> (rows, caption, pattern dropdown update, download button, session).
    The download button is hidden: a file prepared for other filters must not be offered."""
    sess = ensure_session(services, sess)
    hidden = gr.update(visible=False, value=None)
    if services.store is None:
        return [], NO_STORE, gr.update(), hidden, sess
    f, why = _event_filter(services, sess, scope, run_id, statuses, pattern, text)
    if f is None:
        return [], why, gr.update(), hidden, sess
    limit = services.settings.events_limit
    try:
        rows = A.logged_events(services.store, f, limit=limit)
        n = A.count_events(services.store, f)
        choices = _pattern_choices(services, f)
    except Exception as e:
        log.exception("the store could not list events")
        raise _error(f"The store could not answer: {e}") from None
    caption = f"{n} events match" + (f"; the first {limit} are shown (export the CSV for all)" if n > limit else "")
    return [_event_row(le) for le in rows], caption, gr.update(choices=choices), hidden, sess


def export_events_csv(services: Services, scope: str, run_id, statuses, pattern, text, sess: Session | None):
    """Write exactly the filtered events to a new CSV file. -> (download button, session)."""
    sess = ensure_session(services, sess)
    if services.store is None:
        raise _error(NO_STORE)
    f, why = _event_filter(services, sess, scope, run_id, statuses, pattern, text)
    if f is None:
        raise _error(why)
    out = Path(tempfile.mkdtemp(prefix="csd-export-"))
    tmp = out / "events.csv"
    try:
        n = A.export_csv(services.store, f, tmp)
    except Exception as e:
        log.exception("the CSV export failed")
        raise _error(f"The export failed: {e}") from None
    path = tmp.rename(out / f"csd-events-{n}.csv")
    return gr.update(value=str(path), label=f"Download CSV ({n} events)", visible=True), sess


def hide_download():
    """Any filter changed: the prepared CSV no longer matches the filters."""
    return gr.update(visible=False, value=None)


# -- Memory ------------------------------------------------------------------------------------
MEMORY_COLUMNS = ["draft x~", "target t*", "ids", "count", "≥ λ"]
CAL_PROMPTS, CAL_TEXT = "prompts: the target's own answers", "text: teacher-forced reading"
SRC_SHIPPED, SRC_UPLOAD = "shipped set", "uploaded file"


def _calibration_line(c: dict) -> str:
    if not isinstance(c, dict):
        return "?"
    if c.get("mode") == "prompts":
        name = c.get("source") or "prompts"
        return f"{render.esc_md(name)}: {c.get('prompts', 0)} prompts, {c.get('positions', 0)} positions"
    return f"{render.esc_md(c.get('corpus') or 'corpus')}: {c.get('positions', 0)} positions"


def memory_view(services: Services, lam, sess: Session | None):
    """The session's memory: a summary line and its top patterns. -> (markdown, rows, session)."""
    sess = ensure_session(services, sess)
    mem, lam = sess.memory, float(lam)
    tok = services.pair.tokenizer
    rows = [[render.show_token(tok.decode([d])), render.show_token(tok.decode([t])), f"{d}:{t}", c,
             "yes" if rescues(c, None, lam, 0, use_scg=False) else ""] for (d, t), c in mem.top(40)]
    cal = mem.meta.get("calibration") or []
    cal = cal if isinstance(cal, list) else []
    cal_txt = "; ".join(_calibration_line(c) for c in cal[-3:])   # a corpus name may be an uploaded file's name
    mismatch = mem.mismatch(services.pair)
    md = (f"**{len(mem)}** patterns, **{mem.total}** divergences counted, **{mem.n_candidates(lam)}** patterns at "
          f"or above λ = {lam:g}; the top 20% of patterns hold {100 * mem.top_share(0.2):.0f}% of the counts."
          + (f" Calibration: {cal_txt}." if cal_txt else " Not calibrated in this session.")
          + (f" **Note:** {render.esc_md(mismatch)}; it is used anyway (the patterns barely depend on how the "
             f"weights are held)." if mismatch else "")
          + " This memory belongs to your session only: your runs update it, nobody else's do.")
    return md, rows, sess


def calibrate_memory(services: Services, mode: str, source: str, upload, n_prompts, answer_tokens, max_positions,
                     lam, sess: Session | None):
    """Calibrate the session's memory: on the target's own answers to prompts (shipped or uploaded,
    JSONL or one prompt per line), or teacher-forced over a text (shipped corpus or upload).
    -> (summary, rows, status line, session)."""
    sess = ensure_session(services, sess)
    job = take_job(services, sess, "calibrate")
    if job.cancel:
        services.lane.finish(job, "Stopped before it started: the model never ran for it.")
        return (*memory_view(services, lam, sess)[:2], status_line(services, sess, "calibrate"), sess)
    prompts_mode = mode != CAL_TEXT
    try:
        n_prompts = _as_int("prompts", n_prompts)
        tokens = _as_int("answer tokens", answer_tokens)
        n = _as_int("positions", max_positions)
        if prompts_mode and not (1 <= n_prompts <= 10_000 and 1 <= tokens <= 2048):
            raise ConfigError(f"prompts must be in 1..10000 and answer tokens in 1..2048, got {n_prompts} and {tokens}")
        if not prompts_mode and not 1 <= n <= 1_000_000:
            raise ConfigError(f"positions must be in 1..1000000, got {n}")
    except ConfigError as e:
        services.lane.finish(job, f"Not run: {e}")
        raise _error(str(e)) from None
    if source == SRC_UPLOAD and not upload:
        services.lane.finish(job, "Not run: no file uploaded.")
        raise _error("Upload a prompts or text file first (.jsonl, .txt), or choose the shipped set.")
    name = Path(upload).name if source == SRC_UPLOAD else ("shipped prompts" if prompts_mode else "shipped corpus")
    try:
        if prompts_mode:
            prompts = read_prompts(upload) if source == SRC_UPLOAD else read_prompts()
            prompts = prompts[:n_prompts]
        else:
            texts = read_corpus(upload) if source == SRC_UPLOAD else default_corpus()
    except ValueError as e:
        services.lane.finish(job, "Not run: the file could not be read.")
        raise _error(str(e).replace(str(upload), name) if upload else str(e)) from None

    def cb(msg: str, frac: float) -> None:
        if job.cancel:
            raise CalibrationStop
        job.progress = f"{msg} ({100 * frac:.0f}%)"

    before = sess.memory.total
    work = sess.memory.copy()
    note = ""
    with _in_lane(services, job):
        job.progress = "starting the calibration"
        try:
            if prompts_mode:
                calibrate_prompts(services.pair, prompts, work, max_new_tokens=tokens, batch_size=min(8, len(prompts)),
                                  lam=float(lam), progress=cb, source=name)
            else:
                calibrate(services.pair, texts, work, max_positions=n, progress=cb, corpus_name=name)
        except CalibrationStop:
            note = " Stopped early: the counts so far are kept."
        except ValueError as e:
            job.summary = f"Not run: {e}"
            raise _error(str(e)) from None
        except Exception as e:
            log.exception("calibration failed")
            job.summary = "Failed."
            raise _error(f"The calibration failed: {type(e).__name__}: {e}") from None
        sess.memory = work
        if services.store is not None and work.total != before:
            try:
                services.store.save_memory(work, label=f"ui calibration: {name}")
            except Exception as e:
                log.exception("could not save the calibrated memory")
                _warn(f"The calibrated memory is in your session but not saved in the store: {e}")
        last = (work.meta.get("calibration") or [{}])[-1]
        what = f"{last.get('positions')} positions" if isinstance(last, dict) and last.get("positions") else ""
        job.summary = (f"Calibrated on {name}" + (f" ({what})" if what else "") +
                       f": {work.total - before} divergences added.{note}")
        job.progress = ""
    _info(job.summary)
    return (*memory_view(services, lam, sess)[:2], status_line(services, sess, "calibrate"), sess)


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
    """Replace the session's memory with an uploaded memory file. A file that is not a memory, is
    damaged or belongs to another pair is refused with the engine's sentence; a memory calibrated
    with other representations is loaded, and the summary says so.
    -> (summary, rows, message html, session)."""
    sess = ensure_session(services, sess)
    if not file:
        return (*memory_view(services, lam, sess)[:2], "", sess)
    name = Path(file).name
    try:
        mem = CorrectionMemory.load(file, expected_pair=services.pair.pair_id)
    except MemoryFileError as e:          # the engine's own refusal: a sentence, no traceback needed
        msg = str(e).replace(str(file), name)
        log.warning("memory upload refused: %s", msg)
    except Exception as e:      # not the engine's own refusal: a bug or an unreadable file
        log.exception("loading an uploaded memory file failed")
        msg = f"{name} could not be read as a correction memory ({type(e).__name__}: {e})"
    else:
        sess.memory = mem
        _info(f"Memory loaded: {len(mem)} patterns")
        md, rows, sess = memory_view(services, lam, sess)
        mismatch = mem.mismatch(services.pair)
        note = render.render_error(f"Loaded, with a note: {mismatch}.") if mismatch else ""
        return md, rows, note, sess
    _warn(f"Memory not loaded: {msg}")
    return (*memory_view(services, lam, sess)[:2], render.render_error(f"Memory not loaded: {msg}"), sess)


# -- Teach -------------------------------------------------------------------------------------
def _blocks(events: list[TokenEvent]) -> list[list[TokenEvent]]:
    out: dict[int, list[TokenEvent]] = {}
    for e in events:
        out.setdefault(e.block, []).append(e)
    return [out[k] for k in sorted(out)]


def teach_view(services: Services | None, sess: Session | None, step: int) -> str:
    view = sess.teach if isinstance(sess, Session) else None
    if view is None or not view.events:
        return '<div class="csd-note">Run a teaching example to step through it (← and → keys step, Play steps ' \
               'by itself).</div>'
    blocks = _blocks(view.events)
    step = max(0, min(step, len(blocks) - 1))
    sess.teach_step = step
    before = "".join(e.text for b in blocks[:step] for e in b if e.in_output and not e.special)
    block = blocks[step]
    discarded = [e.discarded for e in block if e.status == REJECTED and e.discarded]
    decode = services.pair.tokenizer.decode if services is not None else (lambda ids: "?")
    texts = [decode([i]) for i in (discarded[0] if discarded else [])]
    return render.render_teach_step(block, step=step, n_steps=len(blocks), text_before=before, lam=view.cfg.lam,
                                    tau=view.cfg.tau, method=view.cfg.method, discarded_texts=texts)


def teach_run(services: Services, prompt: str, method: str, gamma, lam, log10_tau, max_new_tokens,
              sess: Session | None):
    """Run a short generation with explanations (draft and target top-k, a fixed gamma), then
    show iteration 1. Yields (view, status line, session) as the passes arrive."""
    sess = ensure_session(services, sess)
    job = take_job(services, sess, "teach")
    if job.cancel:
        services.lane.finish(job, "Stopped before it started: the model never ran for it.")
        yield gr.skip(), status_line(services, sess, "teach"), sess
        return
    if method == "ar":
        services.lane.finish(job, "Not run: Teach needs a speculative method.")
        raise _error("Teach steps through speculative iterations: pick sd, csd or an ablation, not ar.")
    with _in_lane(services, job):
        cfg = _config(method, gamma, lam, log10_tau, 0.0, max_new_tokens, explain=True)
        t0 = time.perf_counter()
        run, view = _start(services, sess, job, prompt, True, cfg, sess.memory)
        with _recorded(services, sess, prompt, cfg, "teach") as rec:
            for _ in follow_run(run, rec, view, t0):
                if not view.done:
                    yield gr.skip(), status_line(services, sess, "teach"), sess
        sess.teach, sess.teach_step = view, 0
        job.summary = _done_sentence(view) + " Step through the iterations below."
    yield teach_view(services, sess, 0), status_line(services, sess, "teach"), sess


def teach_step(services: Services, delta: int, sess: Session | None):
    if not isinstance(sess, Session):
        return teach_view(services, None, 0), sess
    return teach_view(services, sess, sess.teach_step + int(delta)), sess


def teach_play(services: Services, sess: Session | None):
    """Play: step once now and let the autoplay timer go on. -> (view, timer, session)."""
    view, sess = teach_step(services, 1, sess)
    return view, gr.Timer(active=_teach_has_next(sess)), sess


def teach_tick(services: Services, sess: Session | None):
    """The autoplay timer: one iteration further; it stops itself at the last one."""
    view, sess = teach_step(services, 1, sess)
    return view, gr.Timer(active=_teach_has_next(sess)), sess


def teach_pause():
    return gr.Timer(active=False)


def _teach_has_next(sess: Session | None) -> bool:
    return isinstance(sess, Session) and sess.teach is not None and \
        sess.teach_step < len(_blocks(sess.teach.events)) - 1
