"""Model work on the page: a ``Job`` of the model lane (``csd.ui.lane``) from the click that asks for it to its
end, its status line, and the run it holds (docs/design.md, "The web app")."""
from __future__ import annotations

import html
import itertools
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import gradio as gr

from csd.config import GAMMA_AUTO, ConfigError, CSDConfig
from csd.db.store import NullRecorder, recording, run_fields
from csd.runtime import threads

from .. import render, wait
from ..lane import KINDS, Job
from ..render import plural
from ..state import RunView, Services, Session
from .common import decoder_for, ensure_session, error, warn

log = logging.getLogger(__name__)

ORPHAN_S = 20.0     # a request this long in the lane and never seen in gradio's queue never reached it


def request_job(services: Services, kind: str, sess: Session | None, prompt: str | None = None, chat: bool = True,
                session_hash: str = "", event: str = ""):
    """A click asking for model work, answered at once: a bad prompt is refused, else the request joins the lane
    (``session_hash``, ``event``: how the lane finds its run in gradio's queue). -> (session, status, timer)."""
    sess = ensure_session(services, sess)
    if prompt is not None:
        try:
            prompt_ids(services, prompt, chat)
        except gr.Error as e:       # the reason, for the status line that ``refused`` draws next
            _said[session_hash, kind] = html.unescape(e.message).rstrip(".") + "."
            while len(_said) > 1000:
                _said.pop(next(iter(_said)))
            raise
    job = services.lane.request(sess.session_id, kind, session_hash, event)
    sess.pending[kind].append(job)
    sess.jobs[kind] = job
    return sess, status_line(services, sess, kind), gr.Timer(active=True)


def take_job(services: Services, sess: Session | None, kind: str) -> tuple[Session, Job]:
    """The session and the job this handler runs: the oldest the page asked for, else a new one (an API caller);
    one stopped before it started is finished here (its handler runs in the light group and ends at once)."""
    sess = ensure_session(services, sess)
    q = sess.pending[kind]
    job = q.popleft() if q else services.lane.request(sess.session_id, kind)
    sess.jobs[kind] = job
    if job.cancel:
        services.lane.finish(job, "Stopped before it started: the model never ran for it.")
    else:
        job.decoder = decoder_for(services, sess)     # this user's exact mode, for this run
    return sess, job


def stop(services: Services, kind: str | None, sess: Session | None):
    """Stop this session's jobs of ``kind`` (None: all), running or waiting. -> that kind's (or generate's) status."""
    if not isinstance(sess, Session):
        return render.render_status("Nothing to stop.", "idle")
    for job in sess.all_jobs(kind):
        if not job.finished:
            job.cancel = True
    for k in KINDS if kind is None else (kind,):
        take_back(services, sess, k)
    return status_line(services, sess, kind or "generate")


def take_back(services: Services, sess: Session, kind: str) -> None:
    """The stopped requests of ``kind`` still waiting in gradio's queue of model work leave it for the light
    group, where their handler ends them at once ("Stopped before it started"): the requests behind move up."""
    services.lane.take_back([j for j in sess.pending[kind] if j.cancel and j.waiting and not j.withdrawn])


REFUSED = "Not run: the request was refused (the message says why)."
_refusals = itertools.count(1)      # each refusal's line differs from the last: the page draws every one


_said: dict[tuple[str, str], str] = {}     # (a page's session hash, kind) -> why its last click was refused


def refused(services: Services, kind: str, sess: Session | None, session_hash: str = ""):
    """A click refused before the model's handler ran: its waiting request is withdrawn and the status line says
    it was not run, and why where the refusal said (``request_job``); it stays until the next click (the status
    timer draws it again). Else, unless an earlier job still runs or the handler said why: ``REFUSED``."""
    why = _said.pop((session_hash, kind), None)
    if isinstance(sess, Session):
        q = sess.pending[kind]
        if q and q[-1].waiting:
            services.lane.finish(q.pop(), REFUSED)
        job = sess.jobs.get(kind)
        if why is not None and (job is None or job.finished):
            sess.jobs[kind] = Job(next(_refusals), sess.session_id, kind, summary=f"Not run: {why}",
                                  finished_at=time.monotonic())
            return status_line(services, sess, kind)
        if job is not None and (not job.finished or job.summary.startswith(("Not run", "Failed"))):
            return status_line(services, sess, kind)
    if why is not None:
        return render.render_status(f"Not run: {why}", "stopped", next(_refusals))
    return render.render_status(REFUSED, "stopped", next(_refusals))


def _ago(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def _run_progress(job: Job, now: float) -> str:
    """What a running job is doing, from its live Run's counters (read without a lock)."""
    run = job.run
    label = f"{job.label}: " if job.label else ""
    if job.progress:
        return f"{label}{job.progress} · {_ago(job.elapsed(now))}"
    if run is None:
        return f"{label}starting · {_ago(job.elapsed(now))}"
    m = run.metrics
    if m.target_forwards == 0 and m.prefill_s == 0 and job.prompt_tokens > 1:
        return f"{label}reading the prompt ({job.prompt_tokens:,} tokens) · {_ago(job.elapsed(now))}"
    wall = run.metrics_snapshot().wall_s                 # since the run's first pass: the live rate
    rate = f", {m.new_tokens / wall:.1f} tok/s" if wall and m.new_tokens else ""
    return (f"{label}verify pass {m.target_forwards + 1} running · {m.new_tokens}/"    # short: a longer line
            f"{plural(job.max_tokens, 'token')}{rate} · {_ago(job.elapsed(now))}")    # wraps beside the buttons


def status_line(services: Services, sess: Session | None, kind: str) -> str:
    """The status line beside a Run button: the queue ahead, the progress, Stopping…, or what the job did."""
    job = sess.jobs.get(kind) if isinstance(sess, Session) else None
    if job is None:
        return render.render_status("Ready.", "idle")
    now = time.monotonic()
    if job.finished:
        failed = job.cancel or job.summary.startswith(("Not run", "Failed", "The request did not"))
        return render.render_status(job.summary or "Done.", "stopped" if failed else "done", job.ticket)
    if job.cancel:
        if job.waiting:
            take_back(services, sess, kind)     # its run reached the queue after the click on Stop
        what = "it will not start" if job.waiting else "after the current step"
        return render.render_status(f"Stopping… ({what}) · {_ago(job.elapsed(now))}", "stopping")
    if job.waiting:
        services.lane.touch(job)
        pos = services.lane.position(job)
        if _orphan(services, sess, job, pos, now):
            return render.render_status(job.summary, "stopped")
        slots = max(1, services.settings.concurrency)
        if not pos.waiting and len(pos.running) < slots:
            return render.render_status(f"Starting… (waited {_ago(now - job.queued_at)})", "waiting")
        first = pos.running[0] if pos.running else None
        doing = f" The one running: {_run_progress(first, now)}." if len(pos.running) == 1 else \
            f" {len(pos.running)} running; the first: {_run_progress(first, now)}." if first else ""
        more = wait.describe(services.lane.estimate(pos.waiting, pos.running, slots, now), pos.waiting)
        # no request can pass a waiting one: a count one higher is an event read both in gradio's queue and as
        # started, between the two reads (``Lane.position``), not a request that came ahead
        job.ahead = min(len(pos), job.ahead if job.ahead is not None else len(pos))
        return render.render_status(f"Waiting for the model: {plural(job.ahead, 'request')} ahead of yours "
                                    f"(waited {_ago(now - job.queued_at)}{more}).{doing}", "waiting")
    return render.render_status(_run_progress(job, now), "running")


def _orphan(services: Services, sess: Session, job: Job, pos, now: float) -> bool:
    """True, and the job finished, if its run never reached gradio's queue long after the click (refused on its
    way). Without a view of the queue (the handlers alone): if it waits with nothing ahead that long."""
    if now - job.queued_at <= ORPHAN_S:
        return False
    if (job.reached or pos.queued) if services.lane.queue is not None else len(pos):
        return False
    q = sess.pending[job.kind]
    if job in q:
        q.remove(job)
    services.lane.finish(job, "The request did not reach the model (the queue refused it); please try again.")
    return True


def poll_status(services: Services, sess: Session | None):
    """The status timer's tick: every status line (``KINDS`` order), and the timer, off once nothing waits or runs."""
    if isinstance(sess, Session):
        now = time.monotonic()
        for job in sess.all_jobs():
            if job.waiting and job is not sess.jobs.get(job.kind):
                services.lane.touch(job)
                _orphan(services, sess, job, services.lane.position(job), now)
    return (*[status_line(services, sess, k) for k in KINDS],
            gr.Timer(active=isinstance(sess, Session) and any(not j.finished for j in sess.all_jobs())))


@contextmanager
def in_lane(services: Services, job: Job):
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


def prompt_ids(services: Services, prompt: str, chat: bool, cfg: CSDConfig | None = None) -> list[int]:
    """The prompt's token ids; refused when empty, over the app's cap or (given ``cfg``) the model's context."""
    pair, cap = services.pair, services.settings.max_prompt_tokens
    try:
        ids = pair.encode_prompt(prompt, chat)
    except ValueError as e:
        raise error(str(e)) from None
    if len(ids) > cap:
        raise error(f"The prompt is {plural(len(ids), 'token')} long; this app takes prompts of at most "
                    f"{plural(cap, 'token')} (python app.py --max-prompt-tokens N sets the limit). Please shorten it.")
    if cfg is not None:
        try:
            cfg.validated(pair.context_limit, len(ids))
        except ConfigError as e:
            raise error(str(e)) from None
    return ids


@contextmanager
def recorded(services: Services, sess: Session, job: Job, prompt: str, cfg: CSDConfig, label: str):
    """The run's recorder (a no-op one without a store); a failing database costs a warning, never the run."""
    pair = (job.decoder or services.decoder).pair     # the run's view: its representation goes into the record
    fields = run_fields(pair, cfg, kind="generate", prompt=prompt, session_id=sess.session_id, label=label,
                        memory_policy=sess.memory.policy.label if cfg.use_ocm else None)
    try:
        rec = recording(services.store, **fields)
    except Exception as e:   # the database is down or full: generate anyway
        log.exception("could not start recording a run")
        warn(f"This run is not recorded: {e}")
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
            warn(f"The run's record is incomplete: {e}")


def follow_run(run, rec, view: RunView, t0: float) -> Iterator[RunView]:
    """Record a started run's events; yield the view after every target pass and once more, done, at the end."""
    view.run_id = getattr(rec, "run_id", None)
    try:
        for ev in run:
            rec.add(ev)
            view.events.append(ev)
            if view.first_token_s is None and ev.in_output:
                view.first_token_s = time.perf_counter() - t0
            if ev.pass_end:
                view.metrics = run.metrics_snapshot()
                threads.hand_back()     # the next pass may run on another request thread (csd.runtime.threads)
                yield view
    except Exception as e:
        log.exception("generation failed")
        raise error(f"Generation failed: {type(e).__name__}: {e}", expected=False) from None
    finally:
        run.close()
        view.token_ids, view.text = list(run.token_ids), run.text
        view.metrics = run.metrics_snapshot()
        view.done = True
    rec.result(view.text, view.metrics)
    threads.hand_back()
    yield view


def run_recorded(services: Services, sess: Session, job: Job, prompt: str, chat: bool, cfg: CSDConfig, memory,
                 kind: str, label: str = "") -> Iterator[RunView]:
    """A tab's run: ``start_run``, the view once started, then ``follow_run`` under ``recorded`` (``kind``)."""
    t0 = time.perf_counter()
    run, view = start_run(services, sess, job, prompt, chat, cfg, memory, label)
    yield view
    with recorded(services, sess, job, prompt, cfg, kind) as rec:
        yield from follow_run(run, rec, view, t0)


def start_run(services: Services, sess: Session, job: Job, prompt: str, chat: bool, cfg: CSDConfig, memory,
              label: str = "") -> tuple[object, RunView]:
    ids = prompt_ids(services, prompt, chat, cfg)
    try:
        run = (dec := job.decoder or services.decoder).run(ids, cfg, memory, should_stop=lambda: job.cancel,
                                                           owner=sess.session_id)    # copies other users' prompts only
    except (ConfigError, ValueError) as e:
        raise error(str(e)) from None
    job.run, job.label, job.progress = run, label, ""
    job.prompt_tokens, job.max_tokens = len(ids), cfg.max_new_tokens
    return run, RunView(None, prompt, chat, cfg, prompt_tokens=len(ids), pair=dec.pair.describe())


def done_sentence(view: RunView) -> str:
    m = view.metrics
    if m is None:
        return "Done."
    head = "Stopped" if m.stopped_by == "cancelled" else "Done"
    said = f"{head}: {plural(m.new_tokens, 'token')} in {plural(m.target_forwards, 'verify pass', 'verify passes')}, " \
           f"{m.wall_s:.1f} s."
    if m.prompt_rows_copied:        # its time is shorter by the reading another user's run did for it
        said += f" Another user's run had read the first {plural(m.prompt_rows_copied, 'token')} of this prompt: " \
                "this run copied them instead of reading them."
    return said


def speculation_sentence(view: RunView, block, costs) -> str:
    """Where γ auto drafted fewer tokens a block than the bar's γ: how many, and why, from the run's measured
    draft and verify times (the cost model's where nothing was drafted)."""
    m, cfg = view.metrics, view.cfg
    if m is None or cfg.gamma != GAMMA_AUTO or not cfg.uses_draft or not m.target_forwards:
        return ""
    blocks = m.target_forwards - m.lookup_blocks
    drafted = m.drafted / blocks if blocks else 0.0
    try:
        block = int(block)
    except (TypeError, ValueError):
        return ""
    if blocks <= 0 or drafted >= block - 0.5:
        return ""
    draft_ms = 1000 * m.draft_s / m.draft_forwards if m.draft_forwards else costs.draft_ms
    verify_ms = 1000 * m.verify_s / m.target_forwards
    costs = f"a draft token took {draft_ms:.0f} ms, a verify pass {verify_ms:.0f} ms"
    if m.drafted == 0:
        return f"γ auto drafted nothing, not {block}: {costs}."
    return f"γ auto drafted about {drafted:.0f} a block, not {block}: {costs}."
