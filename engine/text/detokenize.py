"""Byte-safe streaming detokenizer: text comes out only when its UTF-8 bytes are complete.

A byte-level BPE token may hold half of a character (emoji, CJK); decoding token by token would print
U+FFFD. We keep the bytes of an unfinished character until the token that completes it arrives.
"""
from __future__ import annotations


class Detokenizer:
    """`add(token_id) -> str` new complete text; `flush() -> str` whatever is left (lossy only if invalid)."""

    def __init__(self, tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._pending = b""
        self.text = ""
        self.tokens: list[int] = []

    def reset(self) -> None:
        """Start a new stream."""
        self._pending = b""
        self.text = ""
        self.tokens = []

    def add(self, token_id: int) -> str:
        """Feed one id; return the text it completes (may be empty)."""
        token_id = int(token_id)
        self.tokens.append(token_id)
        if self.skip_special and token_id in self.tokenizer.special_ids:
            return ""
        data = self._pending + self.tokenizer.token_bytes(token_id)
        cut = _complete_prefix(data)
        self._pending = data[cut:]
        out = data[:cut].decode("utf-8", errors="replace")
        self.text += out
        return out

    def flush(self) -> str:
        """The bytes still held, decoded with replacement characters; the stream is then empty."""
        out = self._pending.decode("utf-8", errors="replace")
        self._pending = b""
        self.text += out
        return out


def _complete_prefix(data: bytes) -> int:
    """Length of `data` without a trailing, possibly unfinished, UTF-8 sequence."""
    n = len(data)
    # A UTF-8 character is at most 4 bytes: look back at most 3 for its lead byte.
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n  # ASCII: everything before it is complete too
        if b >= 0xC0:  # lead byte: how long should this sequence be?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n  # only continuation bytes in the last four: invalid anyway, let replacement show it
