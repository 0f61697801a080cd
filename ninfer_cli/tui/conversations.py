"""Saved chat conversations: one JSON file per conversation under the platformdirs data folder.

Kept free of textual so that `ninfer chat --list` stays light. Files are written to a temporary
name and renamed, so a crash never leaves half a conversation on disk.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from engine.errors import NinferError

FORMAT_VERSION = 1


def conversations_dir() -> Path:
    """`$NINFER_CHATS`, else `<user data dir>/ninfer/conversations`."""
    env = os.environ.get("NINFER_CHATS")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("ninfer")) / "conversations"


def new_id() -> str:
    """Sortable and short: `20261129-1626-3fa9`."""
    return time.strftime("%Y%m%d-%H%M") + "-" + secrets.token_hex(2)


@dataclass
class Conversation:
    """One chat: settings and the turns (`role`, `content`, optional `reasoning` and `stats`)."""

    id: str = field(default_factory=new_id)
    model: str = ""
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    settings: dict = field(default_factory=dict)
    messages: list[dict] = field(default_factory=list)

    def default_title(self) -> str:
        first = next((m["content"] for m in self.messages if m["role"] == "user"), "")
        line = " ".join(first.split())
        return line[:60] + ("…" if len(line) > 60 else "")

    def to_json(self) -> str:
        data = {"format": FORMAT_VERSION, **asdict(self)}
        return json.dumps(data, ensure_ascii=False, indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> "Conversation":
        return cls(id=data["id"], model=data.get("model", ""), title=data.get("title", ""),
                   created=data.get("created", 0.0), updated=data.get("updated", 0.0),
                   settings=data.get("settings", {}), messages=list(data.get("messages", [])))


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def to_markdown(conv: Conversation) -> str:
    """A readable transcript: title, model, system prompt, then each turn (thinking as a quote)."""
    lines = [f"# {conv.title or conv.default_title() or conv.id}", "",
             f"- model: {conv.model}", f"- id: {conv.id}", f"- saved: {_stamp(conv.updated)}", ""]
    system = conv.settings.get("system")
    if system:
        lines += ["## System", "", system, ""]
    for m in conv.messages:
        lines += [f"## {m['role'].capitalize()}", ""]
        if m.get("reasoning"):
            lines += ["> **Thinking**", ">"] + [f"> {ln}" for ln in m["reasoning"].strip().splitlines()] + [""]
        lines += [m["content"], ""]
        stats = m.get("stats")
        if stats:
            lines += [f"*{stats.get('generation_tokens', 0)} tokens, "
                      f"{stats.get('tokens_per_second', 0):.1f} tok/s, "
                      f"TTFT {stats.get('ttft', 0):.2f} s*", ""]
    return "\n".join(lines).rstrip() + "\n"


class ConversationStore:
    """The folder of saved conversations."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else conversations_dir()

    def path(self, conv_id: str) -> Path:
        return self.root / f"{conv_id}.json"

    def save(self, conv: Conversation) -> Path:
        """Write atomically; skips conversations with no messages. Returns the file path."""
        conv.updated = time.time()
        if not conv.title:
            conv.title = conv.default_title()
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(conv.id)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(conv.to_json(), encoding="utf-8")
        os.replace(tmp, target)
        return target

    def list(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first (unreadable files skipped)."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.glob("*.json"):
            try:
                out.append(Conversation.from_dict(json.loads(p.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda c: c.updated, reverse=True)

    def load(self, conv_id: str | None = None) -> Conversation:
        """Load by id or unique id prefix; the latest one when `conv_id` is None."""
        convs = self.list()
        if not convs:
            raise NinferError("no saved conversations yet", "start one with `ninfer chat`")
        if conv_id is None:
            return convs[0]
        matches = [c for c in convs if c.id == conv_id] or [c for c in convs if c.id.startswith(conv_id)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise NinferError(f"no conversation '{conv_id}'", "list them with `ninfer chat --list`")
        raise NinferError(f"'{conv_id}' matches {len(matches)} conversations",
                          "give more of the id (`ninfer chat --list`)")

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(id, updated, model, turns, title) for `ninfer chat --list`."""
        return [(c.id, _stamp(c.updated), c.model.removesuffix(":latest"),
                 str(sum(1 for m in c.messages if m["role"] == "user")),
                 c.title or c.default_title()) for c in self.list()]


def print_list(store: ConversationStore | None = None, *, as_json: bool = False) -> None:
    """Print saved conversations to stdout (a table, or JSON lines of the same fields)."""
    store = store or ConversationStore()
    rows = store.rows()
    if as_json:
        keys = ("id", "updated", "model", "turns", "title")
        print(json.dumps([dict(zip(keys, r)) for r in rows], ensure_ascii=False))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not rows:
        console.print(f"no saved conversations in {store.root}", style="dim")
        return
    table = Table("ID", "UPDATED", "MODEL", "TURNS", "TITLE", box=None, header_style="bold")
    for r in rows:
        table.add_row(*r)
    console.print(table)
