"""The Explore & memory tab: the logged events, filtered and exported; the session's correction memory."""
from __future__ import annotations

import itertools
import logging
import tempfile
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from csd.calibration.calibrate import Stop as CalibrationStop
from csd.calibration.calibrate import calibrate, calibrate_prompts
from csd.calibration.sglang_table import disallowed, load_memory_or_table, vocabulary_of
from csd.config import ConfigError
from csd.corpus import default_corpus, read_corpus, read_prompts
from csd.db import analytics as A
from csd.events import REJECTED, RELAXED, RESCUED, STATUSES, TokenEvent
from csd.memory import CorrectionMemory, MemoryFileError, policy_from
from csd.numbers import Field, grouped
from csd.runtime import threads

from .. import render, rules
from ..render import plural
from ..state import Services, Session
from .common import (
    SCOPE_SESSION,
    as_number,
    decoder_for,
    ensure_session,
    error,
    info,
    scope_filter,
    scopes,
    target_choices,
    target_dropdown,
    warn,
)
from .inputs import box, number
from .jobs import in_lane, status_line, stop, take_job
from .page import Page

log = logging.getLogger(__name__)


# -- events ------------------------------------------------------------------------------------
DRAFTS, CHOOSES = "the draft's token (x~)", "the target's choice (t*)"    # plain words, the paper's symbols beside
EVENT_COLUMNS = ["run", "seq", "pos", "status", "token", DRAFTS, CHOOSES, "how close (logit gap)", "count", "rule",
                 "context", "memory"]


def parse_pattern(value) -> tuple[int, int] | None:
    """'12:34' (draft id : target id) -> (12, 34); '' or 'any' -> None."""
    if value in (None, "", "any"):
        return None
    try:
        d, t = str(value).split(":")
        return int(d), int(t)
    except ValueError:
        raise error(f"pattern {value!r}: pick one from the list, or type draft_id:target_id") from None


def _event_filter(services: Services, sess: Session, scope: str, run_id, statuses, pattern, text, target):
    base, why = scope_filter(services, sess, scope, run_id, target)
    if base is None:
        return None, why
    bad = [s for s in (statuses or []) if s not in STATUSES]
    if bad:
        raise error(f"unknown status {bad[0]!r}")
    return replace(base, statuses=tuple(statuses) if statuses else None, pattern=parse_pattern(pattern),
                   text=(text or "").strip() or None), None


def _event_row(le: A.LoggedEvent) -> list:
    e: TokenEvent = le.event
    return [le.run_id, le.seq, e.position, e.status + (" (special)" if e.special else ""), render.show_token(e.text),
            render.show_token(e.draft_text) if e.draft_id is not None else "",
            render.show_token(e.target_text) if e.target_text is not None else "",
            None if e.gap is None else round(e.gap, 3), e.memory_count, e.rule or "",
            render.show_text(le.context)[-60:], le.memory_policy or ""]


def explore_events(services: Services, scope: str, run_id, statuses, pattern, text, target, sess: Session | None):
    """The filtered events table (``target``: a recorded target representation, or "any"), the download hidden
    (prepared for other filters). -> (rows, caption, pattern and target dropdown updates, download, session)."""
    sess, hidden = ensure_session(services, sess), hide_download()
    f, why = _event_filter(services, sess, scope, run_id, statuses, pattern, text, target)
    if f is None:
        return [], why, gr.update(), target_choices(services, sess), hidden, sess
    limit = services.settings.events_limit
    try:
        rows = A.logged_events(services.store, f, limit=limit)
        n = A.count_events(services.store, f)
        top = A.pareto_table(services.store, replace(f, statuses=None, pattern=None, text=None), limit=60)
        choices = [("any", "any")] + [(f"{render.show_token(r.draft_text)} → {render.show_token(r.target_text)}  "
                                       f"({r.count})", f"{r.draft_id}:{r.target_id}") for r in top]
        targets = target_choices(services, sess)
    except Exception as e:
        log.exception("the store could not list events")
        raise error(f"The store could not answer: {e}", expected=False) from None
    caption = (f"{plural(n, 'event')} {'matches' if n == 1 else 'match'}"
               + (f"; the first {limit} are shown (export the CSV for all)" if n > limit else ""))
    return [_event_row(le) for le in rows], caption, gr.update(choices=choices), targets, hidden, sess


def export_events_csv(services: Services, scope: str, run_id, statuses, pattern, text, target, sess: Session | None):
    """Write exactly the filtered events to a new CSV file. -> (download button, session)."""
    sess = ensure_session(services, sess)
    f, why = _event_filter(services, sess, scope, run_id, statuses, pattern, text, target)
    if f is None:
        raise error(why)
    out = Path(tempfile.mkdtemp(prefix="csd-export-"))
    tmp = out / "events.csv"
    try:
        n = A.export_csv(services.store, f, tmp)
    except Exception as e:
        log.exception("the CSV export failed")
        raise error(f"The export failed: {e}", expected=False) from None
    path = tmp.rename(out / f"csd-events-{n}.csv")
    return gr.update(value=str(path), label=f"Download CSV ({n} events)", visible=True), sess


def hide_download():
    """Any filter changed: the prepared CSV no longer matches the filters."""
    return gr.update(visible=False, value=None)


# -- memory ------------------------------------------------------------------------------------
MEMORY_COLUMNS = [DRAFTS, CHOOSES, "ids", "count", "≥ λ"]
CAL_PROMPTS, CAL_TEXT = "prompts: the target's own answers", "text: teacher-forced reading"
SRC_SHIPPED, SRC_UPLOAD = "shipped set", "uploaded file"
MAX_PROMPTS, MAX_ANSWER_TOKENS, MAX_POSITIONS = 10_000, 2048, 1_000_000   # a calibration's limits
# the calibration's boxes: drawn with these ranges, and what they give read by them (csd.numbers)
PROMPTS = Field("Prompts", 1, MAX_PROMPTS, whole=True)
ANSWER_TOKENS = Field("Answer tokens each", 1, MAX_ANSWER_TOKENS, whole=True)
POSITIONS = Field("Text positions", 1, MAX_POSITIONS, whole=True)


def _calibration_lines(cal) -> list[str]:
    """A line per source the memory was calibrated on (the last three; one calibrated twice is summed, named once)."""
    sums: dict[tuple, list] = {}
    for c in cal if isinstance(cal, list) else []:
        c = c if isinstance(c, dict) else {}            # an uploaded memory's may hold anything
        prompts = c.get("mode") == "prompts"
        n = sums.setdefault((prompts, str(c.get("source" if prompts else "corpus") or "?")), [0, 0, 0])
        for i, key in enumerate(("prompts", "positions")):
            n[i] += c[key] if isinstance(c.get(key), int) else 0
        n[2] += 1
    lines = []
    for (prompts, name), (n, positions, times) in list(sums.items())[-3:]:
        sizes = [plural(n, "prompt")] if prompts else []
        again = f" ({times} calibrations)" if times > 1 else ""
        lines.append(f"{render.esc_md(name)}: {', '.join([*sizes, plural(positions, 'position')])}{again}")
    return lines


def memory_view(services: Services, lam, sess: Session | None):
    """The session's memory: a summary line and its top patterns. -> (markdown, rows, session)."""
    sess = ensure_session(services, sess)
    mem, lam, tok = sess.memory, float(lam), services.pair.tokenizer
    rows = [[render.show_token(tok.decode([d])), render.show_token(tok.decode([t])), f"{d}:{t}", c,
             "yes" if rules.memory_knows(c, lam) else ""] for (d, t), c in mem.top(40)]
    # a list; an uploaded memory's may hold anything, names included
    cal_txt = "; ".join(_calibration_lines(mem.meta.get("calibration")))
    mismatch = mem.mismatch(services.pair)
    n_mem, n_cand = len(mem), mem.n_candidates(lam)
    md = (f"**{n_mem:,}** {'pattern' if n_mem == 1 else 'patterns'}, **{mem.total:,.0f}** "
          f"{'divergence' if mem.total == 1 else 'divergences'} counted, **{n_cand:,}** "
          f"{'pattern' if n_cand == 1 else 'patterns'} at or above λ = {lam:g}; the top 20% of patterns hold "
          f"{100 * mem.top_share(0.2):.0f}% of the counts."
          + (f" Calibration: {cal_txt}." if cal_txt else " Not calibrated in this session.")
          + (f" **Note:** {render.esc_md(mismatch)}; it is used anyway (the patterns barely depend on how the "
             f"weights are held)." if mismatch else "")
          + _table_line(mem) + _policy_line(mem)
          + " This memory belongs to your session only: your runs update it, nobody else's do.")
    return md, rows, sess


def _policy_line(mem: CorrectionMemory) -> str:
    forgot = f"; {plural(mem.evicted, 'pattern')} forgotten so far" if mem.evicted else ""
    return f" Size: {mem.nbytes:,} bytes on a device. Policy: **{mem.policy.describe()}**{forgot}."


def _read_policy(capacity, half_life):
    """The policy the boxes ask for (``csd.numbers``), or ``ValueError`` with the sentence naming the box."""
    try:
        return policy_from(capacity, half_life, (CAPACITY_BOX, HALF_LIFE_BOX))
    except ValueError as e:
        raise ValueError(f"{e} Leave the box empty for none.") from None


def memory_set_policy(services: Services, capacity, half_life, lam, sess: Session | None):
    """Give the session's memory a capacity and/or a half-life (an empty box: none; both empty: unbounded, the
    paper's); a bad value is refused with a sentence naming the box. -> (summary, rows, session)."""
    sess = ensure_session(services, sess)
    try:
        policy = _read_policy(capacity, half_life)
    except ValueError as e:
        raise error(str(e)) from None
    sess.memory.set_policy(policy)
    info(f"Memory policy: {sess.memory.policy.describe()}")
    return memory_view(services, lam, sess)


CAPACITY_BOX, HALF_LIFE_BOX = "Memory capacity", "Memory half-life"     # the boxes' labels: their refusals name them
_notes = itertools.count(1)      # each note differs from the last: the page draws a refusal after a refusal


def policy_boxes(services: Services, sess: Session | None, note: str = ""):
    """What the policy boxes show: the memory's own policy (after an upload, a reset, an apply), and the line beside
    them (``note``: a refusal, or what was applied). -> (capacity, half-life, note html)."""
    sess = ensure_session(services, sess)
    p = sess.memory.policy
    state = "stopped" if note.startswith("Not") else "done"
    boxes = ("" if v is None else grouped(v) for v in (p.capacity, p.half_life))
    return *boxes, render.render_status(note, state, next(_notes))


def memory_apply(services: Services, capacity, half_life, lam, sess: Session | None):
    """The page's Apply: ``memory_set_policy``, its refusal kept beside the boxes (what was typed stays in them, to be
    fixed) and echoed in a toast. -> (summary, rows, capacity, half-life, note, session)."""
    sess = ensure_session(services, sess)
    try:
        sess.memory.set_policy(_read_policy(capacity, half_life))
    except ValueError as e:
        log.info("refused: %s", e)
        warn(str(e))
        said = render.render_status(f"Not applied: {e}", "stopped", next(_notes))
        return (*memory_view(services, lam, sess)[:2], gr.update(), gr.update(), said, sess)
    md, rows, sess = memory_view(services, lam, sess)
    return (md, rows, *policy_boxes(services, sess, f"Applied: {sess.memory.policy.describe()}."), sess)


def _table_line(mem: CorrectionMemory) -> str:
    """Where an imported SGLang table came from, and what its allow=false marks mean here."""
    sg = mem.meta.get("sglang")
    if not isinstance(sg, dict):
        return ""
    n_off = len(disallowed(mem))
    return (f" Imported from the SGLang CSD table {render.esc_md(str(sg.get('source') or ''))}"
            + (f": {plural(n_off, 'entry', 'entries')} marked allow=false (SGLang never admits them; this app's rule "
               "admits by count alone)" if n_off else "") + ".")


def _read_source(services: Services, job, prompts_mode: bool, source: str, upload) -> tuple[str, list]:
    """(its name, the prompts or texts) of a calibration's source; a refusal ends the job."""
    if source == SRC_UPLOAD and not upload:
        services.lane.finish(job, "Not run: no file uploaded.")
        raise error("Upload a prompts or text file first (.jsonl, .txt), or choose the shipped set.")
    name = Path(upload).name if source == SRC_UPLOAD else ("shipped prompts" if prompts_mode else "shipped corpus")
    try:
        if prompts_mode:
            return name, read_prompts(upload) if source == SRC_UPLOAD else read_prompts()
        return name, read_corpus(upload) if source == SRC_UPLOAD else default_corpus()
    except ValueError as e:
        services.lane.finish(job, "Not run: the file could not be read.")
        raise error(str(e).replace(str(upload), name) if upload else str(e)) from None


def _run_calibration(job, run) -> str:
    """``run(progress)`` on the model, stoppable; -> a note when it stopped early."""
    def cb(msg: str, frac: float) -> None:
        if job.cancel:
            raise CalibrationStop
        job.progress = f"{msg} ({100 * frac:.0f}%)"

    job.progress = "starting the calibration"
    try:
        run(cb)
    except CalibrationStop:
        return " Stopped early: the counts so far are kept."
    except ValueError as e:
        job.summary = f"Not run: {e}"
        raise error(str(e)) from None
    except Exception as e:
        log.exception("calibration failed")
        job.summary = "Failed."
        raise error(f"The calibration failed: {type(e).__name__}: {e}", expected=False) from None
    finally:
        threads.hand_back()     # this request thread's workers, where it ran the passes (csd.runtime.threads)
    return ""


def calibrate_memory(services: Services, sess: Session | None, lam, mode: str, source: str, upload, *, n_prompts,
                     answer_tokens, max_positions):
    """Calibrate the session's memory on the target's answers to prompts or teacher-forced over a text (shipped or
    uploaded), its sizes checked against the limits. -> (summary, rows, status line, session)."""
    sess, job = take_job(services, sess, "calibrate")
    if job.cancel:
        return (*memory_view(services, lam, sess)[:2], status_line(services, sess, "calibrate"), sess)
    prompts_mode = mode != CAL_TEXT
    try:
        if prompts_mode:
            n_prompts = as_number(PROMPTS, n_prompts)
            tokens = as_number(ANSWER_TOKENS, answer_tokens)
        else:
            n = as_number(POSITIONS, max_positions)
    except ConfigError as e:
        services.lane.finish(job, f"Not run: {e}")
        raise error(str(e)) from None
    name, data = _read_source(services, job, prompts_mode, source, upload)
    before, work = sess.memory.total, sess.memory.copy()
    with in_lane(services, job):
        pair = decoder_for(services, sess).pair     # the user's view: its passes go where the runs' go
        if prompts_mode:
            prompts = data[:n_prompts]
            note = _run_calibration(job, lambda cb: calibrate_prompts(
                pair, prompts, work, max_new_tokens=tokens, batch_size=min(8, len(prompts)), lam=float(lam),
                progress=cb, source=name))
        else:
            note = _run_calibration(job, lambda cb: calibrate(
                pair, data, work, max_positions=n, progress=cb, corpus_name=name))
        sess.memory = work
        if services.store is not None and work.total != before:
            try:
                services.store.save_memory(work, label=f"ui calibration: {name}")
            except Exception as e:
                log.exception("could not save the calibrated memory")
                warn(f"The calibrated memory is in your session but not saved in the store: {e}")
        last = (work.meta.get("calibration") or [{}])[-1]
        what = f" ({plural(last['positions'], 'position')})" if isinstance(last, dict) and last.get("positions") else ""
        job.summary = f"Calibrated on {name}{what}: {plural(round(work.total - before), 'divergence')} added.{note}"
        job.progress = ""
    info(job.summary)
    return (*memory_view(services, lam, sess)[:2], status_line(services, sess, "calibrate"), sess)


def memory_reset(services: Services, to: str, lam, sess: Session | None):
    """Reset the session's memory to the default one, or clear it."""
    sess = ensure_session(services, sess)
    policy = sess.memory.policy                         # the session's policy outlives a reset
    sess.memory = CorrectionMemory(services.pair.pair_id) if to == "clear" else services.new_memory()
    sess.memory.set_policy(policy)
    return memory_view(services, lam, sess)


def memory_download(services: Services, sess: Session | None):
    sess = ensure_session(services, sess)
    path = Path(tempfile.mkdtemp(prefix="csd-memory-")) / "csd-memory.json.gz"
    sess.memory.save(path)
    return gr.update(value=str(path), label=f"Download csd-memory.json.gz ({plural(len(sess.memory), 'pattern')})",
                     visible=True), sess


def memory_upload(services: Services, file, lam, sess: Session | None):
    """Replace the session's memory with an uploaded memory file or SGLang CSD table (.json/.jsonl); one the engine
    refuses is refused with its sentence. -> (summary, rows, message html, session)."""
    sess = ensure_session(services, sess)
    if not file:
        return (*memory_view(services, lam, sess)[:2], "", sess)
    name = Path(file).name
    try:
        mem = load_memory_or_table(file, services.pair.pair_id, vocabulary_of(services.pair))
    except MemoryFileError as e:          # the engine's own refusal: a sentence, no traceback needed
        msg = str(e).replace(str(file), name)
        log.warning("memory upload refused: %s", msg)
    except Exception as e:      # not the engine's own refusal: a bug or an unreadable file
        log.exception("loading an uploaded memory file failed")
        msg = f"{name} could not be read as a correction memory ({type(e).__name__}: {e})"
    else:
        sess.memory = mem
        info(f"Memory loaded: {plural(len(mem), 'pattern')}")
        mismatch = mem.mismatch(services.pair)
        note = render.render_error(f"Loaded, with a note: {mismatch}.") if mismatch else ""
        return (*memory_view(services, lam, sess)[:2], note, sess)
    warn(f"Memory not loaded: {msg}")
    return (*memory_view(services, lam, sess)[:2], render.render_error(f"Memory not loaded: {msg}"), sess)


# -- the tab -----------------------------------------------------------------------------------
def _events_panel(s, scope_choices) -> SimpleNamespace:
    gr.Markdown("### Divergence events")
    with gr.Row():
        scope = gr.Radio(scope_choices, value=SCOPE_SESSION, label="Scope", elem_id="e-scope",
                         info="'all runs' is shared: it shows every user's answers" if s.shared_scope else None)
        run = number("Run id", optional=True, value=0, precision=0, label="Run id (0 = the scope)", minimum=0)
        status = gr.CheckboxGroup(list(STATUSES), value=[RESCUED, RELAXED, REJECTED], label="Status",
                                  elem_id="e-status")
    with gr.Row():
        pattern = gr.Dropdown([("any", "any")], value="any", label="Pattern (the draft's token → the target's choice)",
                              allow_custom_value=True)
        text = gr.Textbox(label="Text contains", placeholder="token, draft, target or context text", elem_id="e-text")
        target = target_dropdown("e-target")
        with gr.Column(scale=0, min_width=160):
            btn = gr.Button("Show events", variant="primary", elem_id="events-btn")
            csv_btn = gr.Button("Export these events as CSV", elem_id="export-csv-btn")
    caption = gr.Markdown(elem_id="events-caption")
    csv = gr.DownloadButton("Download CSV", visible=False, elem_id="events-csv")
    table = gr.Dataframe(headers=EVENT_COLUMNS, interactive=False, wrap=True, max_height=420, elem_id="events-table")
    return SimpleNamespace(filters=[scope, run, status, pattern, text, target], pattern=pattern, target=target,
                           btn=btn, csv_btn=csv_btn, caption=caption, csv=csv, table=table)


def _memory_panel(s) -> SimpleNamespace:
    gr.Markdown("### Correction memory (this session's copy)")
    m = SimpleNamespace(summary=gr.Markdown(elem_id="memory-summary"))
    with gr.Row():
        with gr.Column(scale=2):
            m.table = gr.Dataframe(headers=MEMORY_COLUMNS, interactive=False, max_height=360, elem_id="memory-table")
        with gr.Column(scale=1):
            mode = gr.Radio([CAL_PROMPTS, CAL_TEXT], value=CAL_PROMPTS, label="Calibrate on", elem_id="cal-mode")
            source = gr.Radio([SRC_SHIPPED, SRC_UPLOAD], value=SRC_SHIPPED, label="From", elem_id="cal-source")
            upload = gr.File(label="Prompts (.jsonl: a 'prompt' per line, or .txt: one per line) or text (.txt, .jsonl "
                             "'text')", file_types=[".txt", ".jsonl", ".md", ".py"], type="filepath")
            with gr.Row():     # the calibration's settings, by ``calibrate_memory``'s names
                m.cal_in = dict(mode=mode, source=source, upload=upload,
                                n_prompts=box(PROMPTS, s.calibrate_prompts, "cal-prompts"),
                                answer_tokens=box(ANSWER_TOKENS, s.calibrate_answer_tokens, "cal-answer"),
                                max_positions=box(POSITIONS, s.calibrate_positions, "cal-positions"))
            with gr.Row(equal_height=True):
                m.cal = gr.Button("Calibrate", variant="primary", elem_id="calibrate-btn", scale=0, min_width=110)
                m.stop = gr.Button("Stop", variant="stop", elem_id="calibrate-stop", scale=0, min_width=80)
            m.status = gr.HTML(render.render_status("Ready."), elem_id="calibrate-status")
            with gr.Row():
                m.reset = gr.Button("Reset to default")
                m.clear = gr.Button("Clear")
            with gr.Row(equal_height=True):
                # text boxes: what is typed reaches the handler as typed ('abc' too), read by csd.numbers there
                m.capacity = gr.Textbox(label=CAPACITY_BOX, info="patterns; empty: unbounded", max_lines=1,
                                        elem_id="memory-capacity")
                m.half_life = gr.Textbox(label=HALF_LIFE_BOX, info="divergences; empty: never", max_lines=1,
                                         elem_id="memory-half-life")
                m.policy = gr.Button("Apply", scale=0, min_width=80, elem_id="memory-policy-btn")
            m.policy_note = gr.HTML(render.render_status("", "idle"), elem_id="memory-policy-status")
            m.dl_btn = gr.Button("Save memory to a file")
            m.upload = gr.UploadButton("Upload memory file or SGLang CSD table (.json / .json.gz / .jsonl)",
                                       type="filepath", file_types=[".json", ".gz", ".jsonl"], elem_id="memory-upload")
            m.file = gr.DownloadButton("Download csd-memory.json.gz", visible=False)
            m.error = gr.HTML(elem_id="memory-error")
    return m


def build(page: Page):
    services, sess, light, lam = page.services, page.sess, page.light, page.lam
    with gr.Tab("Explore & memory", id="explore", elem_id="tab-explore") as explore_tab:
        e = _events_panel(page.settings, scopes(services))
        m = _memory_panel(page.settings)
    page.status["calibrate"] = m.status

    def wire():
        mem_out = [m.summary, m.table, sess]
        boxes = (partial(policy_boxes, services), [sess], [m.capacity, m.half_life, m.policy_note])
        quiet = dict(api_visibility="private", show_progress="hidden", **light)
        explore_tab.select(partial(memory_view, services), [lam, sess], mem_out, api_name="memory_view", **light) \
            .then(*boxes, **quiet)
        ev_inputs, ev_out = [*e.filters, sess], [e.table, e.caption, e.pattern, e.target, e.csv, sess]
        e.btn.click(partial(explore_events, services), ev_inputs, ev_out, api_name="explore_events", **light)
        e.csv_btn.click(partial(export_events_csv, services), ev_inputs, [e.csv, sess], api_name="export_csv", **light)
        for ctl in e.filters:   # a prepared file must match the filters
            ctl.change(hide_download, None, e.csv, queue=False, show_progress="hidden", api_visibility="private")
        explore_tab.select(partial(explore_events, services), ev_inputs, ev_out, api_visibility="private", **light)
        sizes = [m.cal_in[k] for k in ("n_prompts", "answer_tokens", "max_positions")]
        page.model_job(m.cal, "calibrate", partial(calibrate_memory, services), dict(**m.cal_in, lam=lam),
                       [m.summary, m.table, m.status, sess], "calibrate", check_in=sizes)
        m.stop.click(partial(stop, services, "calibrate"), sess, m.status, queue=False,
                     api_name="stop_calibrate", show_progress="hidden")
        m.reset.click(partial(memory_reset, services, "default"), [lam, sess], mem_out, api_name="memory_reset",
                      **light).then(*boxes, **quiet)
        m.clear.click(partial(memory_reset, services, "clear"), [lam, sess], mem_out, api_name="memory_clear",
                      **light).then(*boxes, **quiet)
        m.policy.click(partial(memory_apply, services), [m.capacity, m.half_life, lam, sess],
                       [m.summary, m.table, m.capacity, m.half_life, m.policy_note, sess], api_name="memory_policy",
                       show_progress="hidden", **light)
        m.dl_btn.click(partial(memory_download, services), [sess], [m.file, sess], api_name="memory_download", **light)
        m.upload.upload(partial(memory_upload, services), [m.upload, lam, sess], [m.summary, m.table, m.error, sess],
                        api_name="memory_upload", **light).then(*boxes, **quiet)
    return wire
