"""How a loaded pair holds its numbers: one record (``Representation``) that the engine reads, that every
stored run, result and memory file carries, and that ``of`` reads back from files written before it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

ACTIVATIONS = ("row", "pass")   # an int8 target's activation scales: per token (greedy SD == AR) or per pass
_PER = {"row": "token", "pass": "pass"}


def activation_mode(mode: str) -> str:
    """``mode`` if it is one of ``ACTIVATIONS``, else ValueError."""
    if mode not in ACTIVATIONS:
        raise ValueError(f"int8 activations {mode!r}: choose {' or '.join(ACTIVATIONS)}")
    return mode


@dataclass(frozen=True)
class Representation:
    target: str                 # the target's weights: "gguf", "int8", "float32", "bfloat16", "float16" or "ov4"
    draft: str = ""             # the draft's: "int8", "int4", "float32", ... ("" where no draft is loaded)
    activations: str = ""       # an int8 target's activation scales, one of ACTIVATIONS ("" for the others)

    def __post_init__(self):
        if self.activations:
            activation_mode(self.activations)

    @property
    def exact_rows(self) -> bool:
        """Each token's row of a verify pass computed as if alone: greedy SD writes AR's answer."""
        exact_by_construction = ("float32", "gguf")      # gguf: csd.runtime.kquant computes each row on its own
        return self.target in exact_by_construction or (self.target == "int8" and self.activations == "row")

    @property
    def label(self) -> str:
        """The target's as a stored run records it ("int8, activations per token"); at most 32 characters."""
        per = _PER.get(self.activations) if self.target == "int8" else None
        return f"int8, activations per {per}" if per else self.target

    def with_activations(self, mode: str) -> Representation:
        """With an int8 target's activation scales ``mode`` ("" for other targets; ``mode`` "": as it is)."""
        if not mode:
            return self
        return replace(self, activations=mode if self.target == "int8" else "")   # validated after

    def as_dict(self) -> dict:
        return {"target": self.target, "draft": self.draft, "activations": self.activations}

    @classmethod
    def of(cls, d: dict) -> Representation:
        """From a result, profile or memory file: its ``representation``, or the keys older files held."""
        if isinstance(d.get("representation"), dict):
            r = d["representation"]
            return cls(*(str(r.get(k) or "") for k in ("target", "draft", "activations")))
        label = str(d.get("target_repr") or d.get("dtype") or "")                       # before 2026-12-05
        target, _, per = label.partition(", activations per ")
        acts = {v: k for k, v in _PER.items()}.get(per) or str(d.get("int8_activations") or "")
        return cls(target, str(d.get("draft_repr") or d.get("draft_dtype") or ""), acts if target == "int8" else "")
