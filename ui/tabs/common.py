"""What the tabs share: page errors and toasts, the inputs of the bar above the tabs (γ, λ, τ), the session,
the scopes of Analyse and Explore, and the coloured answer's HTML. A handler is a plain function from component
values (``services`` first, bound with ``functools.partial``) to new values; bad input raises ``error``."""
from __future__ import annotations

import logging
from dataclasses import replace

import gradio as gr

from csd.config import (
    GAMMA,
    GAMMA_AUTO,
    LAM,
    MAX_NEW_TOKENS,
    METHODS,
    SEED,
    TEMPERATURE,
    ConfigError,
    CSDConfig,
    default_lookup,
)
from csd.db import analytics as A
from csd.numbers import Field, NumberError
from csd.rule import log_tau

from .. import render, rules
from ..state import RunSettings, RunView, Services, Session, new_session

log = logging.getLogger(__name__)

SCOPE_RUN, SCOPE_SESSION, SCOPE_ALL = "this run", "this session", "all runs (shared: every user's)"
SCOPE_MEMORY = "this session's memory (its counts)"   # Analyse only: the memory, e.g. an uploaded SGLang table
ANY_TARGET = "any"
NO_STORE = "No store: start the app with --db to record runs."
# "Show speculation" (on by default): gamma auto drafts at least this many tokens a block, so that the
# demo shows drafting on any machine; off, auto drafts only what the measured costs say pays (as the
# command line and the benchmark do), which on a slow or busy machine can be nothing at all
SHOW_SPECULATION = 3


def exactness_note(target: str, activations: str = "") -> str:
    """Whether greedy SD reproduces the target's own answer (AR) in the representation the target runs
    in here, in plain words (docs/exactness.md; ``csd.representation.Representation.exact_rows``)."""
    exact = ("greedy SD writes the target's own answer (AR's) token for token; CSD may leave it where it rescues a "
             "draft token.")
    if target == "float32":
        return f"**Exactness here:** the target runs in float32, where {exact}"
    if target == "gguf":
        return ("**Exactness here:** the target computes on its GGUF file's own blocks, each token's row on its own, "
                f"so a verify pass computes for every token what the target alone computes for it: {exact}")
    if target == "int8" and activations == "row":
        return ("**Exactness here:** the target runs in int8 with each token's activations scaled on their own, "
                f"so a verify pass computes for every token what the target alone computes for it: {exact}")
    how = ("quantises the activations of all the tokens in a verify pass with one scale"
           if target == "int8" else f"need not compute a verify pass of several tokens in {target} as it "
           "computes a pass of one")
    return (f"**Exactness here:** the target runs in {target}, which {how}, so where the target's top two "
            "tokens nearly tie, SD can pick differently from the target alone (AR) and its answer can leave AR's. "
            "In float32 (`--dtype float32`) SD writes AR's answer token for token; CSD may also leave it where it "
            "rescues a draft token.")


EXACT_MODE_LABEL = ("Exact mode: the int8 target scales each token's activations on its own, so greedy SD writes "
                    "AR's answer token for token (off: one scale per verify pass, 7-17% faster a pass)")


def can_switch_exactness(pair) -> bool:
    """Whether the exact-mode switch applies: an int8 target on the lean path (float32 is exact as it is)."""
    return pair.rep.target == "int8" and hasattr(pair.target_lm, "int8_per_row")


def set_exact_mode(services: Services, redraw: list, on: bool, sess: Session | None = None) -> list:
    """The exact-mode switch: this user's int8 activations per token (on) or per pass (off), no other user's
    (``decoder_for``). -> the redrawn texts that state the exactness (``Page.exactness``: fn(mode)), the session."""
    if not can_switch_exactness(services.pair):
        raise error(f"Exact mode applies to an int8 target; this one runs in {services.pair.rep.target}.")
    if services.settings.concurrency > 1 and services.batcher is None:
        raise error("Exact mode is fixed while several generations may run at once (--concurrency > 1).")
    sess = ensure_session(services, sess)
    sess.activations = "row" if on else "pass"
    return [*(fn(sess.activations) for fn in redraw), sess]


def session_activations(services: Services, sess: Session | None) -> str:
    """The int8 activation scales this user's runs use: their choice, else the app's default."""
    return (sess.activations if isinstance(sess, Session) else "") or services.default_activations


def decoder_for(services: Services, sess: Session):
    """The decoder of this user's run. Where runs decode together (a batcher), it runs on a ``csd.runtime.batch``
    view in the user's activation scales, with the solo draft if no run is in flight; that holds for every target,
    the GGUF one (which has no activation scales) included. Without a batcher: the shared pair's decoder, or
    ``ModelPair.with_activations`` for an int8 target in another mode."""
    mode, b = session_activations(services, sess), services.batcher
    solo = bool(b and b.solo and b.idle())
    if b is None and (not can_switch_exactness(services.pair) or not mode):
        return services.decoder
    if (mode, solo) not in services.decoders:
        from csd.runtime.profile import decoder as measured_decoder  # another mode: the view's own costs
        costs = services.decoder.cost_source if mode == services.default_activations and not solo else None
        view = b.view(mode, solo) if b is not None else services.pair.with_activations(mode)
        services.decoders[mode, solo] = measured_decoder(view, costs, online_costs=services.decoder.online_costs,
                                                         prompt_rows=services.decoder.prompt_rows)
    return services.decoders[mode, solo]


def scopes(services: Services) -> list[str]:
    """The scopes of Analyse and Explore; the shared one only when the app offers it."""
    return [SCOPE_RUN, SCOPE_SESSION] + ([SCOPE_ALL] if services.settings.shared_scope else [])


def error(msg: str, *, expected: bool = True) -> gr.Error:
    """A page error, escaped (gradio renders toasts as HTML). ``expected``: the user's mistake, logged here as one
    line without a traceback; otherwise the caller has logged the failure (``log.exception``) before raising this."""
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


# the bar's boxes by their names in a refusal (ui/app.py and ui/tabs/generate.py draw them with these)
GAMMA_BOX, LAM_BOX, LOG10_TAU_BOX = ("γ (the draft block length)", "λ (the memory count threshold)",
                                     "τ's power of ten (the gate threshold)")
TEMPERATURE_BOX, MAX_NEW_BOX, SEED_BOX = "Temperature", "Max new tokens", "Seed"
# τ as the bar gives it, its power of ten: CSDConfig's tau in (0, 1] is a power of at most 0
LOG10_TAU = Field(LOG10_TAU_BOX, hi=0, note="(τ at most 1)")


def as_number(field: Field, v):
    """``v`` as ``field`` reads it (``csd.numbers``: the words of every box, flag and file field), or ``ConfigError``
    with its sentence naming the field."""
    try:
        return field.read(v)
    except NumberError as e:
        raise ConfigError(str(e)) from None


def read_number(field: Field, value):
    """``value`` as ``field`` reads it (``csd.numbers``), or a page error with its sentence."""
    try:
        return field.read(value)
    except NumberError as e:
        raise error(str(e)) from None


def rival_params(values: dict) -> dict:
    """The rivals' parameters from the bar's inputs by name (k and the window made whole numbers, or refused)."""
    return {name: as_number(Field(name, whole=name in rules.INT_FIELDS), v) for name, v in values.items()}


def make_config(s: RunSettings, explain: bool = False, score_all: bool = False) -> CSDConfig:
    """The engine's config from the page's settings, validated; ``score_all``: every rule's scores, for the what-if."""
    method = s.method
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    gamma = GAMMA_AUTO if s.auto_gamma else as_number(GAMMA.named(GAMMA_BOX), s.gamma)
    return CSDConfig.of(method=method, gamma=gamma, lam=as_number(LAM.named(LAM_BOX), s.lam),
                        tau=tau_from_log10(as_number(LOG10_TAU, s.log10_tau)),
                        temperature=as_number(TEMPERATURE.named(TEMPERATURE_BOX), s.temperature),
                        max_new_tokens=as_number(MAX_NEW_TOKENS.named(MAX_NEW_BOX), s.max_new_tokens),
                        seed=as_number(SEED.named(SEED_BOX), s.seed), explain=explain,
                        lookup=default_lookup(method) if s.lookup else 0,   # ar drafts nothing to copy into
                        gamma_min=SHOW_SPECULATION if s.auto_gamma and s.show_spec and method != "ar" else 0,
                        score_all=score_all and method != "ar", **rival_params(s.rivals)).validated()


def page_config(s: RunSettings, **kw) -> CSDConfig:
    try:
        return make_config(s, **kw)
    except ConfigError as e:
        raise error(str(e)) from None


def ensure_session(services: Services, sess: Session | None) -> Session:
    return sess if isinstance(sess, Session) else new_session(services)


def scope_filter(services: Services, sess: Session, scope: str, run_id=None, target=None):
    """The ``Filter`` of a scope (and a recorded target representation), or why there is nothing to show."""
    if services.store is None:
        return None, NO_STORE
    if run_id not in (None, "", 0):
        f = A.Filter(run_ids=(int(run_id),), session_id=None if services.settings.shared_scope else sess.session_id)
    elif scope == SCOPE_RUN:
        if sess.last is None or sess.last.run_id is None:
            return None, "No run in this session yet: generate an answer first, or pick another scope."
        f = A.Filter(run_ids=(sess.last.run_id,))
    elif scope == SCOPE_SESSION:
        f = A.Filter(session_id=sess.session_id)
    elif scope == SCOPE_ALL and services.settings.shared_scope:
        f = A.ANY
    else:
        raise error(f"unknown scope {scope!r}; choose one of {', '.join(scopes(services))}")
    if target not in (None, "", ANY_TARGET):
        f = replace(f, representations=(str(target),))
    return f, None


def target_dropdown(elem_id: str):
    """The filter by the runs' recorded target representation (int8: with its activation scales): ``target_choices``."""
    return gr.Dropdown([ANY_TARGET], value=ANY_TARGET, label="Target (representation, activation scales)",
                       allow_custom_value=True, elem_id=elem_id)


def target_choices(services: Services, sess: Session):
    """The target dropdown's choices: the representations this user's runs (or, shared, everyone's) recorded."""
    if services.store is None:
        return gr.update()
    private = None if services.settings.shared_scope else sess.session_id
    return gr.update(choices=[ANY_TARGET, *A.representations(services.store, private)])


# -- answers -----------------------------------------------------------------------------------
def tokens_html(run: RunView | None, whatif, hide_rejected: bool = False, show_prompt: bool = True, **frame) -> str:
    """The coloured answer of ``run``, its changed decisions outlined under ``whatif`` (CSD's (lam, tau) or a
    ``csd.rule.Rescue``); ``frame``: ``render.render_tokens``' marks and frame."""
    if run is None:
        return render.render_tokens([], hide_rejected=hide_rejected, **frame)
    latest = run.events[-1].block if (run.events and not run.done) else None
    return render.render_tokens(run.events, cfg=run.cfg, hide_rejected=hide_rejected, whatif=whatif,
                                prompt=run.prompt if show_prompt else None, latest_block=latest, **frame)


def remember_ar(sess: Session, view: RunView | None) -> None:
    if view is not None and view.cfg.method == "ar" and view.done and view.metrics \
            and view.metrics.stopped_by != "cancelled":
        sess.ar_speed[(view.prompt, view.chat)] = view.metrics
