"""At a simulated 300 tok/s the app drops no text and a key press reaches the screen (the latency figures printed;
the bounds only catch a regression of the kind Textual's Markdown widgets had).

Latency is measured from a key event entering the app to the next frame the compositor renders
after the input box changed (the headless driver discards frames, so each one is also turned into
terminal bytes here, as a real terminal would need). Wall time depends on the machine's load;
the main thread's CPU time for the same span does not, so both are reported."""
from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time

from textual import events
from textual._compositor import CompositorUpdate

from ninfer_cli.tui.session import ChatSettings, FakeSession, split_tokens
from ninfer_cli.tui.widgets import AssistantMessage, PromptInput

from tui_helpers import make_app, run, wait_for

SECTION = ("## Section {i}\n\nThe **quick** brown fox jumps over the lazy dog, then `code` shows up in the "
           "middle of a sentence with a [link](https://example.com). " * 2 +
           "\n\n- item one\n- item two\n\n```python\nfor i in range({i}):\n    print(i)\n```\n\n")
REPLY = "".join(SECTION.format(i=i) for i in range(12)) + "The end."


def cpu_share(seconds: float = 0.1) -> float:
    """The share of a core this thread gets while it spins: ~1 on a machine with a core to spare, well
    below when other processes oversubscribe the cores (then the latency figures say nothing of ours)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < seconds:
        pass
    return (time.thread_time() - c0) / (time.perf_counter() - t0)


def test_300_tokens_per_second_no_text_lost_and_keys_stay_fast(tmp_path):
    # The objects the suite's earlier tests left in this process go out of the collector's way (a full collection
    # over them inside the stream would be timed as the app's), as they would not exist in a chat process.
    gc.collect()
    gc.freeze()
    share = [cpu_share()]

    async def body():
        session = FakeSession(tokens_per_second=300, reply=REPLY)
        app = make_app(tmp_path, session, settings=ChatSettings(effort="off", max_tokens=4096))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.loaded)
            frames: list[tuple[float, float]] = []
            display = app._display

            def spy(screen, update):
                if update is not None:
                    if isinstance(update, CompositorUpdate):
                        update.render_segments(app.console)
                    frames.append((time.perf_counter(), time.thread_time()))
                return display(screen, update)

            app._display = spy
            box = app.query_one(PromptInput)
            box.load_text("stream")
            box.action_submit()  # not pilot.press: it waits for an idle CPU, which a stream never is
            await wait_for(pilot, lambda: app.buffer is not None and app.buffer.tokens > 10)
            wall, cpu = [], []
            while app.generating:
                before = box.text
                t0, c0 = time.perf_counter(), time.thread_time()
                app._driver.send_message(events.Key("x", "x"))
                while box.text == before or not any(t > t0 for t, _ in frames):
                    await asyncio.sleep(0.0005)
                    if time.perf_counter() - t0 > 2:
                        raise AssertionError("a key press took over 2 s to reach the screen")
                t, c = next(f for f in frames if f[0] > t0)
                wall.append(t - t0)
                cpu.append(c - c0)
                await asyncio.sleep(0.07)
            await wait_for(pilot, lambda: app.conversation.messages[-1]["role"] == "assistant")
            answer = app.conversation.messages[-1]
            assert answer["content"] == REPLY
            assert app.query_one(AssistantMessage).answer.text == REPLY
            assert answer["stats"]["generation_tokens"] == len(split_tokens(REPLY))
            share.append(cpu_share())
            quiet = min(share) > 0.8 and os.getloadavg()[0] < (os.cpu_count() or 1)
            if quiet:
                assert answer["stats"]["tokens_per_second"] > 250
            wall.sort()
            cpu.sort()
            p95 = int(len(wall) * 0.95)
            print(f"\n{len(wall)} key presses during a {len(split_tokens(REPLY))}-token stream at "
                  f"{answer['stats']['tokens_per_second']:.0f} tok/s: key to frame median "
                  f"{statistics.median(wall) * 1e3:.1f} ms, p95 {wall[p95] * 1e3:.1f} ms wall; main-thread CPU "
                  f"median {statistics.median(cpu) * 1e3:.1f} ms, p95 {cpu[p95] * 1e3:.1f} ms; a core's share "
                  f"{min(share):.2f}")
            # Medians: single outliers on a shared machine are the neighbours' doing, not ours. The timings only
            # mean something when the cores are not oversubscribed (a spinning thread gets most of a core, before
            # and after the stream); on a busy machine the text must still arrive whole, which is checked above.
            # The bounds are regression guards, not targets: this 2-core machine reads medians of 31-85 ms wall and
            # 20-61 ms of CPU from run to run (the span holds the stream's own renders too); Textual's Markdown
            # widgets, which this app's renderer replaced, took 100+ ms of CPU a frame and grew with the answer.
            if quiet:
                assert len(wall) >= 10
                assert statistics.median(wall) < 0.15
                assert statistics.median(cpu) < 0.1
    try:
        run(body())
    finally:
        gc.unfreeze()
