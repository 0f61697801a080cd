"""Text typed at the terminal before the chat app took it over.

A first run spends seconds in `pip install` and the first pull; what the user types meanwhile waits in
the terminal's line buffer. Textual starts reading that buffer mid-line while its screen is not up
yet, so most of it was dropped, and the Enter of a cooked-mode line (already turned into `\\n`) became
a new line in the input box. We read the buffer ourselves just before the app starts: finished lines
are sent (once the model is ready), the unfinished one waits in the input box.
"""
from __future__ import annotations

import os
import re
import sys

_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|O.|.)")  # arrow keys and other sequences typed early


def pending_input(stream=None) -> str:
    """Everything typed at the terminal on `stream` (stdin) and not read yet; "" when it is not a tty.

    Canonical mode is switched off for the read so the unfinished line comes too; the terminal's
    settings are restored before returning."""
    import select  # noqa: PLC0415
    import termios  # noqa: PLC0415

    stream = stream or sys.stdin
    try:
        fd = stream.fileno()
        if not os.isatty(fd):
            return ""
        saved = termios.tcgetattr(fd)
    except (AttributeError, OSError, ValueError, termios.error):
        return ""
    raw = termios.tcgetattr(fd)
    raw[3] &= ~termios.ICANON
    raw[6][termios.VMIN], raw[6][termios.VTIME] = 0, 0
    chunks: list[bytes] = []
    try:
        termios.tcsetattr(fd, termios.TCSANOW, raw)
        while select.select([fd], [], [], 0)[0]:
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.append(data)
    except (OSError, termios.error):
        pass
    finally:
        try:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
        except termios.error:
            pass
    return b"".join(chunks).decode("utf-8", "replace")


def split_typed(text: str) -> tuple[list[str], str]:
    """(finished lines to send, the unfinished rest for the input box) from raw typed text."""
    text = _ESCAPES.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    kept: list[str] = []
    for ch in text:
        if ch in "\x7f\b":  # erase typed after the line discipline let go of the line
            if kept and kept[-1] != "\n":
                kept.pop()
        elif ch in "\n\t" or ch >= " ":
            kept.append(ch)
    *lines, rest = "".join(kept).split("\n")
    return [line.strip() for line in lines if line.strip()], rest
