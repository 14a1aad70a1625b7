"""What the tabs share while ``build_demo`` lays them out and wires them: the services, the
session's state, the bar above the tabs (γ, λ, τ), the status lines and their timer, and the two
concurrency groups.

Model work (generate, compare, teach, calibrate) shares one concurrency group whose limit is
``settings.concurrency``; a click first registers the request in the model lane (in the light
group, at once), so that its status line, beside the button, can say what is ahead of it and
Stop can cancel it before it starts. The chart and table handlers run beside the model group.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import partial

import gradio as gr

from ..lane import KINDS
from ..rules import RIVAL_FIELDS
from ..state import RunSettings, Services, Settings
from .jobs import poll_status, refused, request_job

EXAMPLES = [
    # GSM8K test set, item 1
    "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
    "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
    "How much in dollars does she make every day at the farmers' market?",
    # HumanEval/0
    'Complete this Python function.\n\nfrom typing import List\n\n\ndef has_close_elements(numbers: List[float], '
    'threshold: float) -> bool:\n    """ Check if in given list of numbers, are any two numbers closer to each other '
    'than\n    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    >>> '
    'has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    """\n',
    # prose
    "Write a short paragraph about why people enjoy walking in the mountains.",
]

MODEL_GROUP = "model"
HIDE_PRESENT = ["csd-hide-present"]


@dataclass(eq=False)
class Page:
    """Made by ``build_demo`` before the tabs; each tab's ``build(page)`` lays the tab out, adds
    what other tabs need to the page, and returns the function that wires its events (called once
    every tab is laid out, so that a tab can wire events to another tab's components)."""
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
        return dict(concurrency_limit=8, concurrency_id="light")

    @property
    def model(self) -> dict:
        return dict(concurrency_limit=self.settings.concurrency, concurrency_id=MODEL_GROUP)

    @property
    def status_io(self) -> tuple[list, list]:
        """``poll_status``'s inputs and outputs: every status line, in its order, and the timer."""
        return [self.sess], [*(self.status[k] for k in KINDS), self.status_timer]

    def named(self, order: tuple[str, ...], **own) -> dict:
        """A handler's inputs by name (``RunSettings``' fields): the tab's ``own`` components and the bar's, in
        the ``order`` of its API's values (scripts pass them by position: the order stays as it was), then the
        rivals' parameters."""
        comps = {"gamma": self.gamma, "auto_gamma": self.auto_gamma, "show_spec": self.show_spec, "lam": self.lam,
                 "log10_tau": self.log10_tau, **dict(zip(RIVAL_FIELDS, self.rivals)), **own}
        return {k: comps[k] for k in (*order, *RIVAL_FIELDS)}

    def handler(self, fn, head: str = "prompt"):
        """``fn(services, head, settings, sess)`` as gradio calls it with ``inputs_kwargs``: the session by
        position, the prompt (or ``head``) and every setting by name (the names are the API's keywords),
        made into one ``RunSettings``."""
        services = self.services
        if inspect.isgeneratorfunction(fn):
            def stream(sess, **values):
                yield from fn(services, values.pop(head), RunSettings.from_inputs(**values), sess)
            return stream

        def call(sess, **values):
            return fn(services, values.pop(head), RunSettings.from_inputs(**values), sess)
        return call

    def model_job(self, btn, kind: str, fn, named: dict, outputs, api_name: str, check_in=()):
        """A click: the request is checked and joins the lane at once (in the light group, which
        no model work holds up; a refusal is a toast), then, if it was not refused, the model's
        queued handler ``fn(sess, **named values)`` runs. The prompt and chat (when ``named`` has them)
        go with the request; ``check_in``: settings whose components refuse a value out of their
        range (``csd.ui.tabs.inputs``) at the click, before the request joins the lane."""
        services, sess = self.services, self.sess
        prompt_in = [named[k] for k in ("prompt", "chat") if k in named]
        n = len(prompt_in)

        def ask_for(sess, *values):     # the prompt (and chat), then the checked settings
            return request_job(services, kind, sess, *values[:n])

        ask = btn.click(ask_for, [sess, *prompt_in, *check_in],
                        [sess, self.status[kind], self.status_timer], show_progress="hidden",
                        api_visibility="private", **self.light)
        run = ask.success(fn, [sess], outputs, inputs_kwargs=named, api_name=api_name, show_progress="hidden",
                          **self.model)
        for step in (ask, run):      # refused before its handler ran: the status line says so, nothing waits
            step.failure(partial(refused, services, kind), [sess], [self.status[kind]], show_progress="hidden",
                         api_visibility="private", **self.light)
        # the last word on the status lines: a timer tick computed just before the run ended can land
        # after the run's last update and show it still running; this poll is sent after the run ends
        run.then(partial(poll_status, services), *self.status_io, queue=False, show_progress="hidden",
                 api_visibility="private")
        return run
