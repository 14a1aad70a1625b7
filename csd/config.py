"""Decoding configuration with the defaults of Calibrated Speculative Decoding.

Paper: "Calibrated Speculative Decoding: Frequency-Guided Candidate Selection for
Efficient Inference", arXiv 2604.13634. Variations are made with ``dataclasses.replace``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .rule import log_tau

METHODS = ("ar", "sd", "csd", "ocm-only", "scg-only")
METHOD_SHORT = {   # the app's method picker: fits a narrow column
    "ar": "target alone", "sd": "speculative, top-1 match", "csd": "SD + memory + gate",
    "ocm-only": "memory, no gate", "scg-only": "gate, no memory",
}
METHOD_HELP = {
    "ar": "the target alone, autoregressive (baseline)",
    "sd": "standard speculative decoding (a draft token is kept only where it is the target's top-1)",
    "csd": "SD + Online Correction Memory + Semantic Consistency Gate",
    "ocm-only": "ablation: memory without gate (rescue any pattern with count >= lambda)",
    "scg-only": "ablation: gate without memory (rescue any divergence with gap >= log tau)",
}
GAMMA_RANGE = (1, 32)
LOOKUP_NGRAM_MAX = 4   # the longest suffix csd.lookup matches
GAMMA_AUTO = "auto"   # the block length chosen per block by csd.policy.AutoGamma
# Copies from the context proposed by the command line, the benchmark and the Generate tab unless told
# otherwise (csd.lookup; faster on code, verified exactly). CSDConfig itself keeps 0: the paper's method.
DEFAULT_LOOKUP = 16


def default_lookup(method: str) -> int:
    """The product's copy length for ``method``: copies are verified like draft tokens, so ar has none."""
    return 0 if method == "ar" else DEFAULT_LOOKUP


class ConfigError(ValueError):
    """A decoding parameter is out of range; the message says which and why."""


@dataclass(frozen=True)
class CSDConfig:
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

    def validated(self, context_limit: int | None = None, prompt_tokens: int = 0) -> CSDConfig:
        """Return self if every field is in range, else raise ConfigError with a clear message."""
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.gamma != GAMMA_AUTO and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                         or not GAMMA_RANGE[0] <= self.gamma <= GAMMA_RANGE[1]):
            raise ConfigError(f"gamma must be an integer in {GAMMA_RANGE[0]}..{GAMMA_RANGE[1]} or 'auto', "
                              f"got {self.gamma!r}")
        if isinstance(self.gamma_max, bool) or not isinstance(self.gamma_max, int) \
                or not GAMMA_RANGE[0] <= self.gamma_max <= GAMMA_RANGE[1]:
            raise ConfigError(f"gamma_max must be an integer in {GAMMA_RANGE[0]}..{GAMMA_RANGE[1]}, "
                              f"got {self.gamma_max!r}")
        if isinstance(self.gamma_min, bool) or not isinstance(self.gamma_min, int) \
                or not 0 <= self.gamma_min <= self.gamma_max:
            raise ConfigError(f"gamma_min must be an integer in 0..{self.gamma_max} (gamma_max), "
                              f"got {self.gamma_min!r}")
        if not _finite(self.lam) or self.lam < 0:
            raise ConfigError(f"lambda must be a count >= 0, got {self.lam!r}")
        if not _finite(self.tau) or not 0 < self.tau <= 1:
            raise ConfigError(f"tau must be in (0, 1], got {self.tau!r}")
        if not _finite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if context_limit is not None and prompt_tokens + self.max_new_tokens > context_limit:
            raise ConfigError(
                f"prompt ({prompt_tokens} tokens) + max_new_tokens ({self.max_new_tokens}) exceeds the "
                f"model's context of {context_limit} tokens")
        if isinstance(self.lookup, bool) or not isinstance(self.lookup, int) \
                or not 0 <= self.lookup <= GAMMA_RANGE[1]:
            raise ConfigError(f"lookup must be an integer in 0..{GAMMA_RANGE[1]} (0 turns it off), got {self.lookup!r}")
        if self.lookup and not self.uses_draft:
            raise ConfigError("lookup proposals are verified like draft tokens: use them with sd, csd or an "
                              "ablation, not ar")
        if isinstance(self.lookup_ngram, bool) or not isinstance(self.lookup_ngram, int) \
                or not 1 <= self.lookup_ngram <= LOOKUP_NGRAM_MAX:
            raise ConfigError(f"lookup_ngram must be an integer in 1..{LOOKUP_NGRAM_MAX}, got {self.lookup_ngram!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        return self

    def run_fields(self) -> dict:
        """The parameters a stored run records (gamma "auto" is stored as 0)."""
        return dict(method=self.method, gamma=0 if self.gamma == GAMMA_AUTO else self.gamma, lam=self.lam,
                    tau=self.tau, temperature=self.temperature, seed=self.seed, max_new_tokens=self.max_new_tokens,
                    lookup=self.lookup)


def parse_gamma(value: str | int) -> int | str:
    """``--gamma`` on the command line: a whole number or "auto"."""
    if isinstance(value, int) or value == GAMMA_AUTO:
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"gamma must be an integer in {GAMMA_RANGE[0]}..{GAMMA_RANGE[1]} or 'auto', "
                          f"got {value!r}") from None


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
