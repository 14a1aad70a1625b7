"""Decoding configuration with the defaults of "Calibrated Speculative Decoding: Frequency-Guided
Candidate Selection for Efficient Inference" (arXiv 2604.13634); vary it with ``dataclasses.replace``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from .numbers import Field
from .rule import ALL_SCORES, RIVALS, Relax, Rescue, Rivals, log_tau

METHODS = ("ar", "sd", "csd", "ocm-only", "scg-only") + RIVALS
GAMMA_RANGE = (1, 32)
LOOKUP_NGRAM_MAX = 4   # the longest suffix csd.lookup matches
GAMMA_AUTO = "auto"   # the block length chosen per block by csd.policy.AutoGamma
# copies from the context (csd.lookup) the command line, the benchmark and the app propose; CSDConfig keeps 0
DEFAULT_LOOKUP = 16


# the paper's CSD as it reports it (``--preset paper``, the benchmark's ``csd-paper``): fixed gamma, no copies
PRESETS = {"paper": {"method": "csd", "gamma": 6, "gamma_min": 0, "lam": 6.0, "tau": 0.01, "lookup": 0}}


def default_lookup(method: str) -> int:
    """The product's copy length for ``method``: copies are verified like draft tokens, so ar has none."""
    return 0 if method == "ar" else DEFAULT_LOOKUP


class ConfigError(ValueError):
    """A decoding parameter is out of range; the message says which and why."""


# The numbers a run is given, with the ranges ``CSDConfig.validated`` accepts: the command line's flags and the app's
# boxes read what is typed through these (csd.numbers), each renamed as the flag or the box is called
# (``Field.named``), so that a refusal is one sentence naming it. gamma's "auto" is read beside GAMMA.
GAMMA = Field("gamma", *GAMMA_RANGE, whole=True)
GAMMA_MAX = Field("gamma_max", *GAMMA_RANGE, whole=True)
LAM = Field("lambda", 0)
TAU = Field("tau", 0, 1, above=True)
TEMPERATURE = Field("temperature", 0, note="(0 = greedy)")
MAX_NEW_TOKENS = Field("max_new_tokens", 1, whole=True)
LOOKUP = Field("lookup", 0, GAMMA_RANGE[1], whole=True, note="(0 turns it off)")
LOOKUP_NGRAM = Field("lookup_ngram", 1, LOOKUP_NGRAM_MAX, whole=True)
SEED = Field("seed", 0, whole=True, optional=True)


# each rival parameter's range (test, wording) and its name in a message; the record is csd.rule.Rivals
RIVAL_RANGES = {
    "tau_lossy": (lambda v: 0 < v <= 1, "in (0, 1]", "the lossy rule's tau"),
    "topk": (lambda v: v >= 1, ">= 1", "the topk rule's k"),
    "delta": (lambda v: v >= 0, ">= 0", "the topk rule's probability gap"),
    "posterior_threshold": (lambda v: 0 < v <= 1, "in (0, 1]", "the typical rule's"),
    "posterior_alpha": (lambda v: v > 0, "> 0", "the typical rule's alpha"),
    "win_len": (lambda v: 2 <= v <= GAMMA_RANGE[1], f"in 2..{GAMMA_RANGE[1]}", "FLy's window"),
    "entropy_thre": (lambda v: v >= 0, ">= 0", "FLy's entropy gate"),
}
RIVAL_FIELDS = fields(Rivals)
# each rival's parameters (the rivals' record): the command line's options and the benchmark's sweep keys
RIVAL_PARAMS = {m: tuple(f.name for f in RIVAL_FIELDS if f.metadata["method"] == m) for m in RIVALS}
PARAM_METHOD = {f.name: f.metadata["method"] for f in RIVAL_FIELDS}


def check_rivals(rivals: Rivals) -> None:
    """Raise ConfigError naming the first rival parameter out of its range."""
    for f in RIVAL_FIELDS:
        v, integer = getattr(rivals, f.name), isinstance(f.default, int)
        test, range_, what = RIVAL_RANGES[f.name]
        if not (_is_int(v) if integer else _finite(v)) or not test(v):
            raise ConfigError(f"{f.name} ({what}) must be {'an integer ' if integer else ''}{range_}, got {v!r}")


@dataclass(frozen=True)
class CSDConfig:
    """A run's parameters; the rivals' (greedy) in one record, ``rivals``."""
    method: str = "csd"          # one of METHODS
    gamma: int | str = 6         # draft block length (paper default 6), or "auto" (csd.policy.AutoGamma)
    gamma_max: int = 16          # the longest block "auto" may draft
    gamma_min: int = 0           # the fewest tokens "auto" drafts a block (the app's "show speculation": 3)
    lam: float = 6               # OCM threshold: a pattern is a candidate once its count reaches lam (paper: 6)
    tau: float = 0.01            # SCG threshold: rescue iff z(x~) - z(t*) >= log tau (paper: 0.01)
    temperature: float = 0.0     # 0 = greedy; > 0 = sampling with rejection-sampling verification
    max_new_tokens: int = 128    # new tokens to generate at most
    seed: int | None = None      # seeds the one torch.Generator of a run (sampling only)
    explain: bool = False        # attach draft/target top-k probabilities to events (teach mode)
    explain_top_k: int = 5       # how many target candidates an explained event carries
    lookup: int = 0              # propose up to this many tokens copied from the context when they pay (0: off)
    lookup_ngram: int = 3        # the shortest recurring suffix (in tokens) that the lookup copies after (1..4)
    score_all: bool = False      # compute every rival's scores on each block so the what-if can replay any rule (app)
    rivals: Rivals = field(default_factory=Rivals)   # the rivals' parameters, each read by its method only

    @classmethod
    def of(cls, **params) -> CSDConfig:
        """A config from flat parameters, as the command line, a sweep and the app name them."""
        return cls().updated(**params)

    def updated(self, **params) -> CSDConfig:
        """A copy with ``params`` changed; a rival's parameter (tau_lossy, topk, ...) goes into ``rivals``."""
        theirs = {k: params.pop(k) for k in list(params) if k in PARAM_METHOD}
        return replace(self, **params, **({"rivals": replace(self.rivals, **theirs)} if theirs else {}))

    def value(self, name: str):
        """A parameter by its flat name (a rival's from ``rivals``)."""
        return getattr(self.rivals if name in PARAM_METHOD else self, name)


    @property
    def uses_draft(self) -> bool:
        return self.method != "ar"

    @property
    def use_ocm(self) -> bool:
        return self.method in ("csd", "ocm-only")

    @property
    def use_scg(self) -> bool:
        return self.method in ("csd", "scg-only")

    @property
    def log_tau(self) -> float:
        return log_tau(self.tau)

    @property
    def relax(self) -> Relax | None:
        """The rival's relaxed rule of this method, None for ar, sd, csd and the ablations."""
        return Relax(self.method, self.rivals) if self.method in RIVALS else None

    def rule(self, special=()) -> Rescue:
        """The run's rule for ``csd.rule.decide``: CSD's modules, or the rival's relaxed rule."""
        return Rescue.of(self.use_ocm, self.use_scg, self.lam, self.tau, special, self.relax,
                         ALL_SCORES if self.score_all else ())

    def rule_params(self) -> dict | None:
        """The rival's parameters by name (what a stored run records), None for the other methods."""
        return {p: getattr(self.rivals, p) for p in RIVAL_PARAMS[self.method]} if self.method in RIVALS else None

    def validated(self, context_limit: int | None = None, prompt_tokens: int = 0) -> CSDConfig:
        """Return self if every field is in range, else raise ConfigError with a clear message."""
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        lo, hi = GAMMA_RANGE
        if self.gamma != GAMMA_AUTO:
            _integer("gamma", self.gamma, lo, hi, " or 'auto'")
        _integer("gamma_max", self.gamma_max, lo, hi)
        _integer("gamma_min", self.gamma_min, 0, self.gamma_max, " (gamma_max)")
        if not _finite(self.lam) or self.lam < 0:
            raise ConfigError(f"lambda must be a count >= 0, got {self.lam!r}")
        if not _finite(self.tau) or not 0 < self.tau <= 1:
            raise ConfigError(f"tau must be in (0, 1], got {self.tau!r}")
        if not _finite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        _integer("max_new_tokens", self.max_new_tokens, 1)
        if context_limit is not None and prompt_tokens + self.max_new_tokens > context_limit:
            raise ConfigError(
                f"prompt ({prompt_tokens} tokens) + max_new_tokens ({self.max_new_tokens}) exceeds the "
                f"model's context of {context_limit} tokens")
        _integer("lookup", self.lookup, 0, hi, " (0 turns it off)")
        if self.lookup and not self.uses_draft:
            raise ConfigError("lookup proposals are verified like draft tokens: use them with sd, csd or an "
                              "ablation, not ar")
        _integer("lookup_ngram", self.lookup_ngram, 1, LOOKUP_NGRAM_MAX)
        if self.seed is not None and not (_is_int(self.seed) and self.seed >= 0):
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        check_rivals(self.rivals)
        if self.method in RIVALS and self.temperature > 0:
            raise ConfigError(f"{self.method} is a greedy rule here (as TensorRT-LLM's relaxed acceptance and the "
                              f"rivals' published settings): use temperature 0, or sd / csd to sample")
        return self

    def run_fields(self) -> dict:
        """The parameters a stored run records (gamma "auto" is stored as 0)."""
        return dict(method=self.method, gamma=0 if self.gamma == GAMMA_AUTO else self.gamma, lam=self.lam,
                    tau=self.tau, temperature=self.temperature, seed=self.seed, max_new_tokens=self.max_new_tokens,
                    lookup=self.lookup, rule_params=self.rule_params())


def parse_gamma(value: str | int) -> int | str:
    """``--gamma`` on the command line: a whole number or "auto"."""
    if isinstance(value, int) or value == GAMMA_AUTO:
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"gamma must be an integer in {GAMMA_RANGE[0]}..{GAMMA_RANGE[1]} or 'auto', "
                          f"got {value!r}") from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _integer(name: str, x, lo: int, hi: int | None = None, note: str = "") -> None:
    """Raise ConfigError unless ``x`` is an integer in lo..hi (``hi`` None: no upper bound)."""
    if not _is_int(x) or x < lo or (hi is not None and x > hi):
        raise ConfigError(f"{name} must be an integer {f'>= {lo}' if hi is None else f'in {lo}..{hi}'}{note}, "
                          f"got {x!r}")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
