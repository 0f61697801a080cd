"""Errors a user can cause. The CLI prints `message` and `next_action` on one line, exit 1."""
from __future__ import annotations


class NinferError(Exception):
    """A user-facing error: what went wrong, and what to do next."""

    def __init__(self, message: str, next_action: str | None = None):
        super().__init__(message)
        self.message = message
        self.next_action = next_action

    def __str__(self) -> str:
        return f"{self.message} ({self.next_action})" if self.next_action else self.message
