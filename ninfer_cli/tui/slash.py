"""Slash commands of the chat box: the table, parsing, and completion (no textual here)."""
from __future__ import annotations

from dataclasses import dataclass

from ninfer_cli.tui.session import EFFORTS, SETTABLE


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    help: str
    choices: tuple[str, ...] = ()


COMMANDS: tuple[Command, ...] = (
    Command("/help", "", "show commands and keys"),
    Command("/clear", "", "start a new conversation"),
    Command("/regen", "", "answer the last message again"),
    Command("/think", "[off|low|medium|high]", "set reasoning effort", EFFORTS),
    Command("/system", "[text]", "show or set the system prompt"),
    Command("/set", "<param> <value>", "set a sampling parameter", tuple(SETTABLE)),
    Command("/format", "[json|schema|regex|grammar|choice <value>|off]", "constrain the answers' format",
            ("json", "schema", "regex", "grammar", "choice", "off")),
    Command("/spec", "[off|mtp:K]", "speculative decoding: K drafts a round from the model's MTP head",
            ("off", "mtp:1", "mtp:2", "mtp:3", "mtp:4", "mtp:5")),
    Command("/stats", "", "timings of the last answer"),
    Command("/save", "[title]", "save now (conversations save themselves)"),
    Command("/load", "[id]", "open a saved conversation"),
    Command("/model", "[name]", "list installed models, or switch to one"),
    Command("/export", "md|json [path]", "write the conversation to a file", ("md", "json")),
    Command("/copy", "[code]", "copy the last answer (or its last code block)", ("code",)),
    Command("/bye", "", "quit"),
)
ALIASES = {"/exit": "/bye", "/quit": "/bye", "/?": "/help", "/nothink": "/think off"}
BY_NAME = {c.name: c for c in COMMANDS}


def parse(text: str) -> tuple[str, list[str]] | None:
    """`"/set top_p 0.9"` -> `("/set", ["top_p", "0.9"])`; None when `text` is not a command.

    `/system` keeps its argument whole (a prompt may contain spaces and newlines)."""
    text = text.strip()
    if not text.startswith("/") or text.startswith("//"):
        return None
    head, _, rest = text.partition(" ")
    head = head.lower()
    if head in ALIASES:
        alias_head, _, alias_rest = ALIASES[head].partition(" ")
        head, rest = alias_head, (alias_rest + " " + rest).strip()
    if head in ("/system", "/save", "/format"):
        return head, [rest.strip()] if rest.strip() else []
    return head, rest.split()


def complete(text: str) -> list[str]:
    """Full-text completions for what is typed so far (commands, then their fixed choices)."""
    if not text.startswith("/") or "\n" in text:
        return []
    if " " not in text:
        low = text.lower()
        return [c.name for c in COMMANDS if c.name.startswith(low)]
    head, _, rest = text.partition(" ")
    cmd = BY_NAME.get(head.lower())
    if cmd is None or not cmd.choices or " " in rest:
        return []
    return [f"{cmd.name} {c}" for c in cmd.choices if c.startswith(rest.lower())]


def hints(text: str) -> list[Command]:
    """Commands whose name matches what is typed, for the hint line above the input."""
    if not text.startswith("/") or "\n" in text:
        return []
    head = text.split(" ", 1)[0].lower()
    if " " in text:
        return [c for c in COMMANDS if c.name == head]
    return [c for c in COMMANDS if c.name.startswith(head)]


def palette_entries(models: list[str] = ()) -> list[tuple[str, str, str, list[str]]]:
    """(title, help, command, args) for the command palette: every command, once per fixed choice
    (`/think high`, `/export md`), plus `/model NAME` for each installed model."""
    out = []
    for c in COMMANDS:
        if c.name == "/set":
            out.append((c.name, "show the sampling parameters (`/set <param> <value>` changes one)", c.name, []))
            continue
        if c.name != "/export":  # it needs a format: only its choices
            out.append((c.name, c.help, c.name, []))
        for choice in c.choices:
            out.append((f"{c.name} {choice}", c.help, c.name, [choice]))
        if c.name == "/think":
            out.append(("/think default", "back to the model's default reasoning", c.name, ["default"]))
        if c.name == "/model":
            out += [(f"/model {m}", "switch to this installed model", c.name, [m]) for m in models]
    return out


def help_text() -> str:
    """Markdown help for `/help`."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")  # a pipe ends a table cell, even inside a code span

    rows = [f"| `{cell((c.name + ' ' + c.args).strip())}` | {cell(c.help)} |" for c in COMMANDS]
    keys = "\n".join(f"| {k} | {v} |" for k, v in (
        ("Enter", "send"), ("Shift+Enter, Ctrl+J", "new line"), ("Tab", "complete a command"),
        ("Up, Down", "earlier messages"), ("Esc, Ctrl+C", "stop the answer"), ("Ctrl+T", "cycle reasoning effort"),
        ("Ctrl+Y", "copy the last answer"), ("Ctrl+Q", "quit")))
    keys = "| key | action |\n|---|---|\n" + keys
    return "| command | what it does |\n|---|---|\n" + "\n".join(rows) + "\n\n" + keys
