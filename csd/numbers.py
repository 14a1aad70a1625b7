"""One reading of a number typed into a box, a flag or a file field, with one set of words for its refusal (the
app's boxes, the command line's flags, a memory file's policy block): a ``Field`` names what is read and its range;
``read`` gives an int or a float, or refuses with a ``NumberError`` whose sentence names the field; ``grouped``
writes a large number the one way the app shows them (1,000,000,000, never 1e+09)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

# a number as typed: a sign, digits (in groups of three with commas, or not), a point and an exponent ("1e9")
_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d*)?([eE][-+]?\d+)?$")
_WHOLE = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)$")     # digits alone: read as an int, exactly


class NumberError(ValueError):
    """A value ``Field.read`` refused: one sentence naming the field, its range and what came."""


def grouped(x: float) -> str:
    """1,000,000,000 for a whole number, 0.01 or 1,234.5 for a fraction."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return str(x)
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.1f}" if abs(x) >= 1000 else f"{x:.4g}"


@dataclass(frozen=True)
class Field:
    """A number to read: ``name`` as the user sees it (a box's label, a flag), the range [lo, hi] (None: no bound),
    ``whole`` (an integer), ``optional`` (empty is None), ``note``: what the range means, said after it;
    ``above``: lo itself is out of the range, (lo, hi] (a threshold such as tau, more than 0 and at most 1)."""
    name: str
    lo: float | None = None
    hi: float | None = None
    whole: bool = False
    optional: bool = False
    note: str = ""
    above: bool = False

    def named(self, name: str) -> Field:
        """The same field as a flag or a box calls it ("--tau", "Max new tokens")."""
        return replace(self, name=name)

    def words(self) -> str:
        """'a whole number from 1 to 32', 'between -4 and 0', 'a whole number, 0 or more', 'above 0 and at most 1'."""
        kind, lo, hi = "a whole number" if self.whole else "a number", self.lo, self.hi
        if self.above and lo is not None:
            return f"{kind} above {grouped(lo)}" + (f" and at most {grouped(hi)}" if hi is not None else "")
        if lo is not None and hi is not None:
            return f"{kind} from {grouped(lo)} to {grouped(hi)}" if self.whole else \
                f"between {grouped(lo)} and {grouped(hi)}"
        if lo is not None:
            return f"{kind}, {grouped(lo)} or more"
        return f"{kind}, {grouped(hi)} or less" if hi is not None else kind

    def refusal(self, got: str) -> str:
        return f"{self.name} must be {self.words()}{f' {self.note}' if self.note else ''}; {got}."

    def read(self, value) -> int | float | None:
        """``value`` (text as typed, or a number) as an int (``whole``) or a float, None for an empty optional field."""
        if value is None or (isinstance(value, str) and not value.strip()):
            if self.optional:
                return None
            raise NumberError(self.refusal("got nothing" if value is None else "it is empty"))
        exact = None        # a whole number as typed or given, kept exact (a seed past 2**53)
        if isinstance(value, str):
            text = value.strip()
            got, ok = f'got "{text[:40]}"', bool(_NUMBER.match(text)) and any(c.isdigit() for c in text)
            v = float(text.replace(",", "")) if ok else math.nan
            if ok and _WHOLE.match(text):
                exact = int(text.replace(",", ""))
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            got, v = (f"got {grouped(value)}", float(value)) if ok else (f"got {str(value)[:40]}", math.nan)
            exact = value if ok and isinstance(value, int) else None
        ok = ok and math.isfinite(v) and not (self.whole and not v.is_integer())
        if not ok or not self._in_range(v):
            raise NumberError(self.refusal(got))
        if self.whole:
            return exact if exact is not None else int(v)
        return v

    def _in_range(self, v: float) -> bool:
        if self.lo is not None and (v <= self.lo if self.above else v < self.lo):
            return False
        return self.hi is None or v <= self.hi


# the memory policy (csd.memory): its flags, boxes and a file's block read through these, renamed for each
CAPACITY = Field("the memory capacity", 1, 100_000_000, whole=True, optional=True)   # 1.2 GB of patterns on a device
HALF_LIFE = Field("the memory half-life", 1, 100_000_000, optional=True)   # divergences: more never halves in a run
