"""Markdown that streams cheaply: one `Static` per finished block, and one live tail.

Textual's `Markdown` widget (even through `Markdown.get_stream()`) mounts several widgets per list
item, paragraph or fence. Measured on a 2-core machine at 300 tok/s, every layout then costs
100-600 ms once an answer holds a few lists or code blocks, and key presses wait that long. Here a
finished block is rendered once by Rich and cached by its `Static`; only the unfinished tail is
re-rendered, at most `FLUSH_S` apart, so the cost of a redraw stays flat however long the chat grows.
"""
from __future__ import annotations

from markdown_it import MarkdownIt
from rich.console import Console, ConsoleOptions, Group
from rich.markdown import Markdown as RichMarkdown
from rich.measure import Measurement
from rich.segment import Segment
from textual.containers import Vertical
from textual.widgets import Static

FLUSH_S = 1 / 12
_FENCES = ("```", "~~~")


def split_blocks(text: str, start: int = 0) -> tuple[list[str], int]:
    """Cut the finished top-level blocks off `text[start:]`.

    A block is finished when a blank line is followed by the start of an unindented line outside
    any code fence. Returns the finished blocks (trailing newlines removed) and where the unfinished rest
    begins."""
    blocks: list[str] = []
    block_start = start
    fence: str | None = None
    prev_blank = False
    pos = start
    while True:
        end = text.find("\n", pos)
        if end < 0:
            # The last line is still being written; its first character is enough to end a block.
            partial = text[pos:]
            if fence is None and prev_blank and partial and not partial[0].isspace() and pos > block_start:
                blocks.append(text[block_start:pos].rstrip("\n"))
                block_start = pos
            break
        line = text[pos:end]
        stripped = line.lstrip()
        if fence is None and prev_blank and stripped and not line[0].isspace() and pos > block_start:
            blocks.append(text[block_start:pos].rstrip("\n"))
            block_start = pos
        if fence is None:
            marker = next((f for f in _FENCES if stripped.startswith(f)), None)
            if marker is not None:
                fence = marker
        elif stripped.startswith(fence) and not stripped[len(fence):].strip():
            fence = None
        prev_blank = not stripped
        pos = end + 1
    return [b for b in blocks if b.strip()], block_start


class _Markdown(RichMarkdown):
    """Rich's Markdown with one shared parser: building a MarkdownIt per block took ~5 ms, paid on
    every redraw of the tail."""

    _parser: MarkdownIt | None = None

    def __init__(self, markup: str) -> None:
        if _Markdown._parser is None:
            _Markdown._parser = MarkdownIt().enable("strikethrough").enable("table")
        self.markup = markup
        self.parsed = _Markdown._parser.parse(markup)
        self.code_theme = self.inline_code_theme = "monokai"
        self.justify = None
        self.style = "none"
        self.hyperlinks = False
        self.inline_code_lexer = None


def _blank(line: list[Segment]) -> bool:
    return all(not seg.text.strip() and not (seg.style and seg.style.bgcolor) for seg in line)


def _trim(lines: list[list[Segment]]) -> list[list[Segment]]:
    """Drop empty lines around a block (Rich opens some elements with one); the margins between
    blocks are the layout's job. Lines with a background (code padding) stay."""
    start, end = 0, len(lines)
    while start < end and _blank(lines[start]):
        start += 1
    while end > start and _blank(lines[end - 1]):
        end -= 1
    return lines[start:end]


class CachedMarkdown:
    """Rich markdown rendered once per width: Textual measures a widget's height by rendering it,
    on every layout, and highlighting code each time made redraws grow with the chat."""

    def __init__(self, text: str) -> None:
        self.markdown = _Markdown(text)
        self._lines: dict[int, list[list[Segment]]] = {}

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        lines = self._lines.get(options.max_width)
        if lines is None:
            if len(self._lines) > 3:
                self._lines.clear()
            lines = _trim(console.render_lines(self.markdown, options.update(height=None), pad=False))
            self._lines[options.max_width] = lines
        newline = Segment.line()
        for line in lines:
            yield from line
            yield newline

    def height(self, console: Console, width: int) -> int:
        """Lines this takes at `width` (rendered once, then cached)."""
        lines = self._lines.get(width)
        if lines is None:
            list(self.__rich_console__(console, console.options.update_width(width)))
            lines = self._lines[width]
        return len(lines)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, options.max_width)


def render(text: str) -> CachedMarkdown:
    """The renderable for one block of markdown."""
    return CachedMarkdown(text)


class Block(Static):
    """A `Static` that remembers its height per width: Textual asks every widget for it on every
    layout, and with a long chat that alone took most of each frame."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._heights: dict[int, int] = {}

    def update(self, content="", *, layout: bool = True) -> None:
        self._heights = {}
        super().update(content, layout=layout)

    def update_same_height(self, renderable: CachedMarkdown) -> None:
        """Update, and skip the screen-wide layout when the height did not change (most tokens
        extend a line without wrapping it)."""
        width = self.content_region.width
        if width <= 0 or width not in self._heights:
            self.update(renderable)
            return
        height = renderable.height(self.app.console, width)
        relayout = height != self._heights[width]
        super().update(renderable, layout=relayout)
        self._heights = {width: height}

    def get_content_height(self, container, viewport, width: int) -> int:
        height = self._heights.get(width)
        if height is None:
            height = self._heights[width] = super().get_content_height(container, viewport, width)
        return height


class MarkdownView(Vertical):
    """A markdown document that can be appended to; `text` is always the whole source.

    Finished blocks are grouped `CHUNK` to a widget: every layout visits every widget, so one per
    block made each redraw of a long answer cost more than a key press may wait."""

    CHUNK = 12
    DEFAULT_CSS = """
    MarkdownView { height: auto; }
    MarkdownView > Block { height: auto; margin: 0 0 1 0; }
    MarkdownView > Block.tail { margin: 0; }
    """

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = text
        self._committed = 0
        self._tail = Block("", classes="tail")
        self._chunk: list[CachedMarkdown] = []
        self._chunk_widget: Block | None = None
        self._flush_pending = False

    def compose(self):
        blocks, self._committed = split_blocks(self.text)
        for i in range(0, len(blocks), self.CHUNK):
            self._chunk = [render(b) for b in blocks[i:i + self.CHUNK]]
            self._chunk_widget = Block(self._group(), classes="block")
            yield self._chunk_widget
        yield self._tail

    def _group(self) -> Group:
        parts: list = []
        for md in self._chunk:
            if parts:
                parts.append("")
            parts.append(md)
        return Group(*parts)

    def on_mount(self) -> None:
        self._update_tail()

    def append(self, fragment: str) -> None:
        """Add text; the screen catches up within `FLUSH_S`."""
        if not fragment:
            return
        self.text += fragment
        if not self._flush_pending:
            self._flush_pending = True
            self.set_timer(FLUSH_S, self.flush)

    async def flush(self) -> None:
        """Show everything appended so far."""
        self._flush_pending = False
        blocks, self._committed = split_blocks(self.text, self._committed)
        for block in blocks:
            if self._chunk_widget is None or len(self._chunk) >= self.CHUNK:
                self._chunk = []
                self._chunk_widget = Block("", classes="block")
                await self.mount(self._chunk_widget, before=self._tail)
            self._chunk.append(render(block))
        if blocks:
            self._chunk_widget.update(self._group())
        self._update_tail()

    def _update_tail(self) -> None:
        tail = self.text[self._committed:].strip("\n")
        self._tail.display = bool(tail)
        if not tail:
            self._tail.update("")
            return
        self._tail.update_same_height(render(tail))
