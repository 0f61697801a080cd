"""The streaming markdown view: block splitting, and streamed text rendering like the whole text."""
from __future__ import annotations

from rich.console import Console
from textual.app import App

from ninfer_cli.tui.markdown_view import Block, MarkdownView, split_blocks
from ninfer_cli.tui.session import split_tokens

from tui_helpers import run

DOC = """# Title

First paragraph
continues here.

- one
- two

  still item two

```python
def f():

    return 1
```

1. a

2. b

| x | y |
|---|---|
| 1 | 2 |

Last line without newline"""


def test_split_blocks_keeps_fences_and_continuations_whole():
    blocks, rest = split_blocks(DOC)
    assert blocks[0] == "# Title"
    assert blocks[1] == "First paragraph\ncontinues here."
    assert blocks[2] == "- one\n- two\n\n  still item two"
    assert blocks[3] == "```python\ndef f():\n\n    return 1\n```"
    assert blocks[4:6] == ["1. a", "2. b"]
    assert blocks[6] == "| x | y |\n|---|---|\n| 1 | 2 |"
    assert DOC[rest:] == "Last line without newline"
    assert "".join(b + "\n\n" for b in blocks) + DOC[rest:] == DOC


def test_split_blocks_waits_for_the_next_block_to_start():
    assert split_blocks("para one\n\n") == ([], 0)
    assert split_blocks("para one\n\n  ind") == ([], 0)  # an indented line continues the block
    assert split_blocks("para one\n\nne") == (["para one"], len("para one\n\n"))
    blocks, rest = split_blocks("para one\n\nnext\n")
    assert blocks == ["para one"] and rest == len("para one\n\n")
    assert split_blocks("```\ncode\n\nmore\n") == ([], 0)  # inside an open fence


def _plain(view: MarkdownView, width: int = 60) -> list[str]:
    console = Console(width=width, color_system=None, record=True)
    out = []
    for block in view.query(Block):
        if block.display:
            with console.capture() as cap:
                console.print(block.content)
            out += [ln.rstrip() for ln in cap.get().splitlines() if ln.strip()]
    return out


class _Host(App):
    def __init__(self, view: MarkdownView) -> None:
        super().__init__()
        self.view = view

    def compose(self):
        yield self.view


def test_streamed_view_shows_the_same_as_the_whole_document():
    async def body():
        whole = MarkdownView(DOC)
        async with _Host(whole).run_test(size=(80, 60)) as pilot:
            await pilot.pause()
            expected = _plain(whole)
        streamed = MarkdownView()
        async with _Host(streamed).run_test(size=(80, 60)) as pilot:
            for piece in split_tokens(DOC):
                streamed.append(piece)
                if len(streamed.text) % 7 == 0:
                    await streamed.flush()
            await streamed.flush()
            await pilot.pause()
            assert streamed.text == DOC
            assert _plain(streamed) == expected
            assert len(streamed.query(Block)) <= 1 + 1 + len(split_blocks(DOC)[0]) // MarkdownView.CHUNK
        assert any("Title" in ln for ln in expected) and any("still item two" in ln for ln in expected)
    run(body())
