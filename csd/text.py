"""Token text for streaming: each output token's piece of the answer, such that the pieces
concatenate to the decoded answer."""
from __future__ import annotations


class Detokenizer:
    """Text of each output token such that the texts concatenate to the decoded answer: a token
    that ends inside a UTF-8 character (byte fallback) gets "" and the next one the whole character."""

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode
        self.ids: list[int] = []
        self.prefix = self.read = 0   # window start, and the end of what has been turned into text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.decode(self.ids[self.prefix:self.read])
        now = self.decode(self.ids[self.prefix:])
        if now.endswith("\ufffd"):
            return ""                  # an incomplete character: wait for its other bytes
        self.prefix, self.read = max(self.read - 4, 0), len(self.ids)
        return now[len(before):]

    def peek(self, token_id: int) -> str:
        """The text a token would add (for a rejected draft token, which is not pushed)."""
        base = self.ids[self.prefix:]
        return self.decode(base + [token_id])[len(self.decode(base)):]
