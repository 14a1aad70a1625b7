"""What the tabs share while ``build_demo`` lays them out and wires them: the services, the session, the bar, the
status lines and their timer, and the two concurrency groups, model work and light (docs/design.md)."""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from functools import partial

import gradio as gr

from ..lane import KINDS
from ..render import static_text
from ..rules import RIVAL_FIELDS
from ..state import RunSettings, Services, Settings
from .jobs import poll_status, refused, request_job

# the examples under the prompts, by source (GSM8K, HumanEval, prose)
EXAMPLES = list(json.loads(static_text("examples.json")).values())

MODEL_GROUP = "model"
LIGHT_GROUP = "light"       # charts, tables, bookkeeping: never held up by model work
HIDE_PRESENT = ["csd-hide-present"]


@dataclass(eq=False)
class Page:
    """Made by ``build_demo`` before the tabs; each tab's ``build(page)`` lays it out, adds what other tabs need, and
    returns its wiring function, called once every tab is laid out (so it can wire to another tab's components)."""
    services: Services
    sess: gr.State              # the Session, made by the first handler that needs it (ensure_session)
    status_timer: gr.Timer      # refreshes the status lines while a job waits or runs
    gamma: gr.Slider
    auto_gamma: gr.Checkbox
    show_spec: gr.Checkbox      # gamma auto drafts at least SHOW_SPECULATION tokens a block
    lam: gr.Slider
    log10_tau: gr.Slider
    rivals: list = field(default_factory=list)   # the rivals' parameters (csd.ui.rules.RIVAL_FIELDS order)
    status: dict[str, gr.HTML] = field(default_factory=dict)   # job kind -> the status line beside its button
    hide_rejected: gr.Checkbox | None = None   # Generate's switch; Analyse's recoloured answer follows it too
    analyse_io: tuple[dict, list] | None = None   # Analyse's named inputs and outputs, refreshed after runs
    exactness: list = field(default_factory=list)   # (component, fn() -> its text): redrawn by the exact-mode switch

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def light(self) -> dict:
        """The group of the chart, table and bookkeeping handlers, which no model work holds up."""
        return dict(concurrency_limit=8, concurrency_id=LIGHT_GROUP)

    @property
    def status_io(self) -> tuple[list, list]:
        """``poll_status``'s inputs and outputs: every status line, in its order, and the timer."""
        return [self.sess], [*(self.status[k] for k in KINDS), self.status_timer]

    def named(self, order: tuple[str, ...], **own) -> dict:
        """A handler's inputs by ``RunSettings`` field: the tab's ``own`` components and the bar's, in the ``order``
        of its API's values (scripts pass them by position: it stays), then the rivals' parameters."""
        comps = {"gamma": self.gamma, "auto_gamma": self.auto_gamma, "show_spec": self.show_spec, "lam": self.lam,
                 "log10_tau": self.log10_tau, **dict(zip(RIVAL_FIELDS, self.rivals)), **own}
        return {k: comps[k] for k in (*order, *RIVAL_FIELDS)}

    def handler(self, fn, head: str = "prompt", extra: tuple[str, ...] = ()):
        """``fn(services, head, settings, sess, **extra)`` as gradio calls it with ``inputs_kwargs``: the session by
        position, the prompt (or ``head``) and the settings by name (the API's keywords), made into one
        ``RunSettings``; ``extra``: inputs that are not settings (Analyse's target filter), passed by name."""
        def call(sess, **values):
            own = {k: values.pop(k) for k in extra if k in values}
            return fn(self.services, values.pop(head), RunSettings.from_inputs(**values), sess, **own)
        if inspect.isgeneratorfunction(fn):      # gradio streams only from a generator function
            def stream(sess, **values):
                yield from call(sess, **values)
            return stream
        return call

    def model_job(self, btn, kind: str, fn, named: dict, outputs, api_name: str, check_in=()):
        """A click: the request (with the prompt and chat, and ``check_in``'s settings checked) joins the lane at
        once in the light group, then, unless refused, the model's queued handler ``fn(sess, **named)`` runs."""
        services, sess = self.services, self.sess
        prompt_in = [named[k] for k in ("prompt", "chat") if k in named]
        n = len(prompt_in)

        def ask_for(request: gr.Request, sess, *values):     # the prompt (and chat), then the checked settings
            return request_job(services, kind, sess, *values[:n], session_hash=request.session_hash or "",
                               event=api_name)

        ask = btn.click(ask_for, [sess, *prompt_in, *check_in],
                        [sess, self.status[kind], self.status_timer], show_progress="hidden",
                        api_visibility="private", **self.light)
        run = ask.success(fn, [sess], outputs, inputs_kwargs=named, api_name=api_name, show_progress="hidden",
                          concurrency_limit=self.settings.concurrency, concurrency_id=MODEL_GROUP)
        def said_no(request: gr.Request, sess):
            return refused(services, kind, sess, request.session_hash or "")

        for step in (ask, run):      # refused before its handler ran: the status line says so, nothing waits
            step.failure(said_no, [sess], [self.status[kind]], show_progress="hidden", api_visibility="private",
                         **self.light)
        # the last word on the status lines, sent after the run ends (docs/design.md, "The model lane")
        run.then(partial(poll_status, services), *self.status_io, queue=False, show_progress="hidden",
                 api_visibility="private")
        return run
