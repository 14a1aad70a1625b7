"""What the tabs share: page errors and toasts, the inputs of the bar above the tabs (γ, λ, τ),
the session, the scopes of Analyse and Explore, and the coloured answer's HTML.

A handler is a plain function from component values (and the session) to new values; handlers
that need the loaded models or the store take ``services`` first, and the tabs bind it with
``functools.partial``. Bad input raises ``gr.Error`` with the engine's message, escaped (gradio
renders toasts as HTML), and is logged as one line without a traceback (``error``).
"""
from __future__ import annotations

import logging
import math

import gradio as gr

from csd.config import GAMMA_AUTO, METHODS, ConfigError, CSDConfig, default_lookup
from csd.db import analytics as A
from csd.rule import log_tau

from .. import render, rules
from ..state import RunView, Services, Session, new_session

log = logging.getLogger(__name__)

SCOPE_RUN, SCOPE_SESSION, SCOPE_ALL = "this run", "this session", "all runs (shared: every user's)"
NO_STORE = "No store: start the app with --db to record runs."
# "Show speculation" (on by default): gamma auto drafts at least this many tokens a block, so that the
# demo shows drafting on any machine; off, auto drafts only what the measured costs say pays (as the
# command line and the benchmark do), which on a slow or busy machine can be nothing at all
SHOW_SPECULATION = 3


def exactness_note(target_repr: str, int8_activations: str = "") -> str:
    """Whether greedy SD reproduces the target's own answer (AR) in the representation the target runs
    in here, in plain words: token for token in float32 and in int8 with per-token activation scales
    (tests check both); not in int8 with one scale per pass, nor in half precision, where a verify pass
    rounds its tokens together, not one by one as AR does (docs/exactness.md)."""
    if target_repr == "float32":
        return ("**Exactness here:** the target runs in float32, where greedy SD writes the target's own answer "
                "(AR's) token for token; CSD may leave it where it rescues a draft token.")
    if target_repr == "int8" and int8_activations == "row":
        return ("**Exactness here:** the target runs in int8 with each token's activations scaled on their own, "
                "so a verify pass computes for every token what the target alone computes for it: greedy SD "
                "writes the target's own answer (AR's) token for token; CSD may leave it where it rescues a draft "
                "token.")
    how = ("quantises the activations of all the tokens in a verify pass with one scale"
           if target_repr == "int8" else f"rounds a verify pass of several tokens in {target_repr} differently "
           "from a pass of one")
    return (f"**Exactness here:** the target runs in {target_repr}, which {how}, so where the target's top two "
            "tokens nearly tie, SD can pick differently from the target alone (AR) and its answer can leave AR's. "
            "In float32 (`--dtype float32`) SD writes AR's answer token for token; CSD may also leave it where it "
            "rescues a draft token.")


EXACT_MODE_LABEL = ("Exact mode: the int8 target scales each token's activations on its own, so greedy SD writes "
                    "AR's answer token for token (off: one scale per verify pass, 7-17% faster a pass)")


def can_switch_exactness(pair) -> bool:
    """Whether the exact-mode switch applies: an int8 target on the lean path (float32 is exact as it is)."""
    return pair.target_repr == "int8" and hasattr(pair.target_lm, "int8_per_row")


def set_exact_mode(services: Services, redraw: list, on: bool) -> list[str]:
    """The exact-mode switch: the target's int8 activations per token (on) or per pass (off), for every
    user (one model), between runs (it queues behind model work); a new decoder reads the measured costs of
    the new mode. -> the redrawn texts that state the exactness (``Page.exactness``)."""
    if not can_switch_exactness(services.pair):
        raise error(f"Exact mode applies to an int8 target; this one runs in {services.pair.target_repr}.")
    mode = "row" if on else "pass"
    if services.pair.int8_activations != mode:
        from csd.decode import Decoder
        services.pair.set_int8_activations(mode)
        services.decoder = Decoder(services.pair, online_costs=services.decoder.online_costs)
    return [fn() for fn in redraw]


def scopes(services: Services) -> list[str]:
    """The scopes of Analyse and Explore; the shared one only when the app offers it."""
    return [SCOPE_RUN, SCOPE_SESSION] + ([SCOPE_ALL] if services.settings.shared_scope else [])


def error(msg: str, *, expected: bool = True) -> gr.Error:
    """A page error; gradio renders toast messages as HTML, so the text is escaped.

    ``expected`` (bad input, a prompt over the cap, a refused file): the user's mistake, not the
    app's, is logged here as one line and gradio prints no traceback for it; otherwise the caller
    has logged the failure with its traceback (``log.exception``) before raising this."""
    if expected:
        log.info("refused: %s", msg)
    return gr.Error(render.esc_message(msg), print_exception=False)


def warn(msg: str) -> None:
    gr.Warning(render.esc_message(msg))


def info(msg: str) -> None:
    gr.Info(render.esc_message(msg))


# -- inputs ------------------------------------------------------------------------------------
def tau_from_log10(log10_tau: float) -> float:
    return 10.0 ** float(log10_tau)


def describe_tau(log10_tau: float) -> str:
    tau = tau_from_log10(log10_tau)
    return f"τ = {tau:.3g}  (log τ = {log_tau(tau):.2f})"


def as_int(name: str, v) -> int:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        raise ConfigError(f"{name} is missing")
    if isinstance(v, float) and not v.is_integer():
        raise ConfigError(f"{name} must be a whole number, got {v!r}")
    return int(v)


def rival_params(*values) -> dict:
    """The rivals' parameters from the bar's inputs, in ``csd.ui.rules.RIVAL_FIELDS`` order (numbers from the
    page; k and the window made whole numbers, or refused)."""
    out = {}
    for name, v in zip(rules.RIVAL_FIELDS, values):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            raise ConfigError(f"{name} is missing")
        out[name] = as_int(name, v) if name in rules.INT_FIELDS else float(v)
    return out


def make_config(method: str, gamma, lam, log10_tau, temperature, max_new_tokens, seed=None,
                explain: bool = False, auto_gamma: bool = False, lookup: bool = False,
                show_speculation: bool = False, rivals=None, score_all: bool = False) -> CSDConfig:
    """The engine's config from slider values (floats from the page), validated by the engine.
    ``auto_gamma``: the block length is chosen per block from the machine's measured costs, at least
    ``SHOW_SPECULATION`` tokens with ``show_speculation``;
    ``lookup``: copies from the context (up to ``LOOKUP_TOKENS``) are proposed where they pay (sd, csd
    and the ablations; the switch means nothing to ar); ``rivals``: the rivals' parameters (a dict, or
    the bar's values in ``csd.ui.rules.RIVAL_FIELDS`` order); ``score_all``: log every rule's scores so that the what-if can replay any rule."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    seed = None if seed is None or seed == "" else as_int("seed", seed)
    cfg = CSDConfig(method=method, gamma=GAMMA_AUTO if auto_gamma else as_int("gamma", gamma), lam=float(lam),
                    tau=tau_from_log10(log10_tau), temperature=float(temperature),
                    max_new_tokens=as_int("max new tokens", max_new_tokens), seed=seed, explain=explain,
                    lookup=default_lookup(method) if lookup else 0,   # ar drafts nothing to copy into
                    gamma_min=SHOW_SPECULATION if auto_gamma and show_speculation and method != "ar" else 0,
                    score_all=score_all and method != "ar",
                    **(rival_params(*rivals) if isinstance(rivals, (list, tuple)) else rivals or {}))
    return cfg.validated()


def page_config(*args, **kw) -> CSDConfig:
    try:
        return make_config(*args, **kw)
    except ConfigError as e:
        raise error(str(e)) from None


def ensure_session(services: Services, sess: Session | None) -> Session:
    return sess if isinstance(sess, Session) else new_session(services)


def scope_filter(services: Services, sess: Session, scope: str, run_id=None):
    """A csd.db.analytics.Filter for a scope, or a message saying why there is nothing to show."""
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
    raise error(f"unknown scope {scope!r}; choose one of {', '.join(scopes(services))}")


# -- answers -----------------------------------------------------------------------------------
def tokens_html(view: RunView | None, lam: float, tau: float, hide_rejected: bool,
                diff_positions: set[int] | None = None, view_id: str = "tokens", prompt: bool = True,
                empty: str | None = None, panel: str | None = None, whatif=None) -> str:
    """The coloured answer of ``view``, its changed decisions outlined under CSD's (lam, tau) or the
    rule ``whatif`` (a ``csd.rule.Rescue``)."""
    kw = dict(empty=empty) if empty else {}
    kw["panel"] = panel
    if view is None:
        return render.render_tokens([], hide_rejected=hide_rejected, view=view_id, **kw)
    latest = view.events[-1].block if (view.events and not view.done) else None
    return render.render_tokens(view.events, lam=view.cfg.lam, tau=view.cfg.tau, hide_rejected=hide_rejected,
                                whatif=(lam, tau) if whatif is None else whatif, relax=view.cfg.relax,
                                diff_positions=diff_positions,
                                prompt=view.prompt if prompt else None, latest_block=latest, view=view_id,
                                method=view.cfg.method, **kw)


def remember_ar(sess: Session, view: RunView | None) -> None:
    if view is not None and view.cfg.method == "ar" and view.done and view.metrics \
            and view.metrics.stopped_by != "cancelled":
        sess.ar_speed[(view.prompt, view.chat)] = view.metrics
