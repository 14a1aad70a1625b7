"""The benchmark's columns: AR, SD, CSD and the ablations as the engine runs them, transformers'
assisted generation at its defaults and configured like ours, and one CSD column per setting of a
sweep (``lam=3,tau=0.1;gamma=auto``), each a ``Method``."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from csd.config import METHODS, ConfigError, CSDConfig, parse_gamma

HF_ASSISTED = "hf-assisted"
HF_FIXED = "hf-assisted-fixed"
HF_METHODS = (HF_ASSISTED, HF_FIXED)
BENCH_METHODS = METHODS + HF_METHODS
DEFAULT_METHODS = ("ar", "sd", "csd", HF_ASSISTED, HF_FIXED)


@dataclass(frozen=True)
class Method:
    """One column of the benchmark: an engine configuration, or transformers' assisted generation."""
    name: str
    cfg: CSDConfig                  # the engine's config (for hf methods: the max tokens and gamma they use)
    hf: str | None = None           # None, "defaults" or "fixed"

    @property
    def reads_memory(self) -> bool:
        return self.hf is None and self.cfg.use_ocm


SWEEP_KEYS = ("lam", "tau", "gamma", "lookup", "lookup_ngram")


def setting_name(setting: dict, base: CSDConfig) -> str:
    """A sweep column's name: its method (csd unless the setting says) and the fields that differ
    from that method's column, e.g. csd[lam=3,tau=0.1] or sd[lookup=8]."""
    method = setting.get("method", "csd")
    diff = [f"{k}={setting[k]:g}" if isinstance(setting[k], float) else f"{k}={setting[k]}"
            for k in SWEEP_KEYS if k in setting and setting[k] != getattr(base, k)]
    return f"{method}[{','.join(diff)}]" if diff else method


def parse_sweep(sweep: str | Iterable | None) -> list[dict]:
    """"lam=6,tau=0.01;lam=3,tau=0.1;gamma=auto" -> one dict per CSD setting (keys lam, tau, gamma),
    each checked by the engine's config."""
    if not sweep:
        return []
    if not isinstance(sweep, str):
        return [dict(zip(("lam", "tau"), map(float, x))) if not isinstance(x, dict) else x for x in sweep]
    out = []
    for part in sweep.split(";"):
        if not part.strip():
            continue
        kv = dict(x.split("=", 1) for x in part.replace(" ", "").split(",") if "=" in x)
        if not kv or set(kv) - {*SWEEP_KEYS, "method"}:
            raise ValueError(f"sweep setting {part.strip()!r}: write lam=L,tau=T[,gamma=G|auto][,lookup=N"
                             "[,lookup_ngram=M]]"
                             "[,method=sd|csd|...] (settings separated by ';')")
        try:
            setting = {k: float(v) for k, v in kv.items() if k in ("lam", "tau")}
            if "gamma" in kv:
                setting["gamma"] = parse_gamma(kv["gamma"])
            for key in ("lookup", "lookup_ngram"):
                if key in kv:
                    setting[key] = int(kv[key])
            if "method" in kv:
                setting["method"] = kv["method"]
            if setting.get("method") in ("ar", *HF_METHODS):
                raise ValueError("a sweep column is sd, csd or an ablation")
            CSDConfig(**setting).validated()
        except (ValueError, ConfigError) as e:
            raise ValueError(f"sweep setting {part.strip()!r}: {e}") from None
        if setting not in out:
            out.append(setting)
    return out


def make_methods(methods: str | Iterable[str], base: CSDConfig, sweep=None) -> list[Method]:
    """The benchmark's columns: named methods, then one CSD column per sweep setting (the setting
    equal to ``base`` is the plain ``csd`` column). ``base.lookup`` is the drafting columns' copy
    length; ar and the transformers columns never copy."""
    plain = replace(base, lookup=0)
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    out: list[Method] = []
    for m in dict.fromkeys(names):
        if m not in BENCH_METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(BENCH_METHODS)}")
        if m in HF_METHODS:
            out.append(Method(m, replace(plain, method="ar"), "defaults" if m == HF_ASSISTED else "fixed"))
        elif m == "ar":
            out.append(Method(m, replace(plain, method="ar")))
        else:
            out.append(Method(m, replace(base, method=m)))
    for setting in parse_sweep(sweep):
        name = setting_name(setting, base)
        if not any(x.name == name for x in out):
            out.append(Method(name, replace(base, **{"method": "csd", **setting})))
    if not out:
        raise ValueError("no method to benchmark")
    return out


def validate_methods(methods: Iterable[str]) -> list[str]:
    return [m.name for m in make_methods(list(methods), CSDConfig())]
