"""The benchmark's columns, each a ``Method``: AR, SD, CSD, the ablations and the rivals on the engine,
transformers' generate and assisted generation, and one column per sweep setting."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from csd.config import METHODS, PARAM_METHOD, PRESETS, RIVAL_PARAMS, CSDConfig, parse_gamma

HF_ASSISTED = "hf-assisted"
HF_FIXED = "hf-assisted-fixed"
HF_AR = "hf-ar"                 # transformers' own generate on the target alone: AR on transformers' engine
HF_METHODS = (HF_ASSISTED, HF_FIXED, HF_AR)
HF_KIND = {HF_ASSISTED: "defaults", HF_FIXED: "fixed", HF_AR: "generate"}
CSD_PAPER = "csd-paper"         # the paper's CSD (csd.config.PRESETS["paper"]): gamma 6, no copies
BENCH_METHODS = METHODS + (CSD_PAPER,) + HF_METHODS
DEFAULT_METHODS = ("ar", "sd", "csd", HF_ASSISTED, HF_FIXED)


@dataclass(frozen=True)
class Method:
    """One column of the benchmark: an engine configuration, or transformers' assisted generation."""
    name: str
    cfg: CSDConfig                  # the engine's config (for hf methods: the max tokens and gamma they use)
    hf: str | None = None           # None (this project's engine), "defaults", "fixed" or "generate" (HF_KIND)
    acts: str = ""                  # an int8 target's activation scales for this column: "row", "pass"
                                    # or "" (the run's)

    @property
    def reads_memory(self) -> bool:
        return self.hf is None and self.cfg.use_ocm


SWEEP_KEYS = ("lam", "tau", "gamma", "lookup", "lookup_ngram", *PARAM_METHOD)
ACTS_KEY = "activations"   # a column's representation, not a rule's setting: row or pass (int8 target)
OLD_ACTS_KEY = "int8_activations"   # its name in commands written before 2026-12-05
INT_KEYS = ("lookup", "lookup_ngram", *(k for k in PARAM_METHOD if isinstance(CSDConfig().value(k), int)))


def setting_name(setting: dict, base: CSDConfig) -> str:
    """A sweep column's name: its method (csd unless the setting says) and the fields that differ
    from that method's column, e.g. csd[lam=3,tau=0.1], sd[lookup=8] or lossy[tau_lossy=0.4]."""
    method = setting.get("method", "csd")
    diff = [f"{k}={setting[k]:g}" if isinstance(setting[k], float) else f"{k}={setting[k]}"
            for k in SWEEP_KEYS if k in setting and setting[k] != base.value(k)]
    if setting.get(ACTS_KEY):
        diff.append(f"{ACTS_KEY}={setting[ACTS_KEY]}")
    return f"{method}[{','.join(diff)}]" if diff else method


def parse_sweep(sweep: str | Iterable | None) -> list[dict]:
    """"lam=6,tau=0.01;lam=3,tau=0.1;gamma=auto" -> one dict per setting, each checked by the engine's
    config; a rival's parameter (csd.config.PARAM_METHOD) names its method."""
    if not sweep:
        return []
    if not isinstance(sweep, str):
        return [dict(zip(("lam", "tau"), map(float, x))) if not isinstance(x, dict) else x for x in sweep]
    out = []
    for part in sweep.split(";"):
        if not part.strip():
            continue
        kv = dict(x.split("=", 1) for x in part.replace(" ", "").split(",") if "=" in x)
        kv = {ACTS_KEY if k == OLD_ACTS_KEY else k: v for k, v in kv.items()}
        if not kv or set(kv) - {*SWEEP_KEYS, "method", ACTS_KEY}:
            raise ValueError(f"sweep setting {part.strip()!r}: write lam=L,tau=T[,gamma=G|auto][,lookup=N"
                             "[,lookup_ngram=M]][,method=sd|csd|...][,activations=row|pass], or a rival's "
                             "parameters (" + ", ".join(f"{m}: {'/'.join(ps)}" for m, ps in RIVAL_PARAMS.items())
                             + ") (settings separated by ';')")
        try:
            setting = {k: int(v) if k in INT_KEYS else float(v) for k, v in kv.items()
                       if k not in ("gamma", "method", ACTS_KEY)}
            if "gamma" in kv:
                setting["gamma"] = parse_gamma(kv["gamma"])
            owners = {PARAM_METHOD[k] for k in setting if k in PARAM_METHOD}
            if "method" in kv:
                setting["method"] = kv["method"]
            elif owners:
                setting["method"] = min(owners)
            params = ", ".join(k for k in setting if k in PARAM_METHOD)
            if len(owners) > 1:
                raise ValueError(f"{params} belong to {' and '.join(sorted(owners))}: one method per setting")
            if owners - {setting.get("method")}:
                raise ValueError(f"{params}: a parameter of {min(owners)}, not of {setting['method']}")
            if ACTS_KEY in kv:
                if kv[ACTS_KEY] not in ("row", "pass"):
                    raise ValueError(f"{ACTS_KEY} {kv[ACTS_KEY]!r}: choose row or pass")
                setting[ACTS_KEY] = kv[ACTS_KEY]
            if setting.get("method") in HF_METHODS or (setting.get("method") == "ar" and set(setting) != {
                    "method", ACTS_KEY}):
                raise ValueError("a sweep column is sd, csd or an ablation, or a rival (lossy, topk, typical, fly); "
                                 "ar only with activations alone")
            CSDConfig.of(**{k: v for k, v in setting.items() if k != ACTS_KEY}).validated()
        except ValueError as e:                       # a ConfigError among them
            raise ValueError(f"sweep setting {part.strip()!r}: {e}") from None
        if setting not in out:
            out.append(setting)
    return out


def make_methods(methods: str | Iterable[str], base: CSDConfig, sweep=None) -> list[Method]:
    """The named methods, then one column per sweep setting (one equal to ``base`` is ``csd``); ar and
    the transformers columns never copy (``base.lookup``)."""
    plain = replace(base, lookup=0)
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    out: list[Method] = []
    for m in dict.fromkeys(names):
        if m not in BENCH_METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(BENCH_METHODS)}")
        if m in HF_METHODS or m == "ar":
            out.append(Method(m, replace(plain, method="ar"), HF_KIND.get(m)))
        elif m == CSD_PAPER:
            out.append(Method(m, replace(base, **PRESETS["paper"])))
        else:
            out.append(Method(m, replace(base, method=m)))
    for setting in parse_sweep(sweep):
        name = setting_name(setting, base)
        fields = {k: v for k, v in setting.items() if k != ACTS_KEY}
        if not any(x.name == name for x in out):
            out.append(Method(name, (plain if fields.get("method") == "ar" else base).updated(
                **{"method": "csd", **fields}), acts=setting.get(ACTS_KEY, "")))
    if not out:
        raise ValueError("no method to benchmark")
    return out


def validate_methods(methods: Iterable[str]) -> list[str]:
    return [m.name for m in make_methods(list(methods), CSDConfig())]
