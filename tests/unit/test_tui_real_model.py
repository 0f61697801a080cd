"""The chat app on the real default model (SmolLM2 on NumPy), when it is in the local store."""
from __future__ import annotations

import pytest

from tui_helpers import make_app, run, send, wait_for

pytestmark = pytest.mark.slow


def _default_model():
    from ninfer_cli.model_session import DEFAULT_MODEL
    from ninfer_cli.store import Store

    found = Store().find(DEFAULT_MODEL)
    if found is None or not found.artifact_path.exists():
        pytest.skip("the default model is not in the store (ninfer pull smollm2-135m)")
    return found


def _real_app(tmp_path, max_tokens: int):
    """The stored default model, its CPU session and the chat app over it (greedy, at most `max_tokens`
    a reply)."""
    found = _default_model()
    from ninfer_cli.tui.engine_session import EngineSession
    from ninfer_cli.tui.session import ChatSettings

    session = EngineSession(found.artifact_path, found.ref, device="cpu")
    return found, session, make_app(tmp_path, session, settings=ChatSettings(temperature=0.0, max_tokens=max_tokens))


def test_real_default_model_answers_in_the_app(tmp_path):
    _, session, app = _real_app(tmp_path, 24)

    async def body():
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.loaded or app.load_error, timeout=60)
            assert app.load_error is None
            assert session.info.context_max > 0 and not session.info.thinking
            await send(pilot, "What is the capital of France?", timeout=120)
            answer = app.conversation.messages[-1]
            assert "Paris" in answer["content"]
            stats = answer["stats"]
            assert stats["generation_tokens"] > 0 and stats["tokens_per_second"] > 0
            assert stats["prompt_tokens"] > 5
            assert "tok/s" in str(app.query_one("#st-last").render())
            assert "RAM" in str(app.query_one("#st-mem").render())
    run(body())


def test_real_default_model_stops_on_escape(tmp_path):
    found, session, app = _real_app(tmp_path, 400)

    async def body():
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.loaded or app.load_error, timeout=60)
            from tui_helpers import start

            await start(pilot, "Write a long story about a dragon.")
            await wait_for(pilot, lambda: app.buffer is not None and app.buffer.tokens >= 3, timeout=120)
            await pilot.press("escape")
            assert not app.generating and app.stop_latency < 0.1
            await wait_for(pilot, lambda: app.engine_stop_latency is not None, timeout=30)
            answer = app.conversation.messages[-1]
            assert answer["stats"]["finish_reason"] == "cancelled"
            assert answer["stats"]["generation_tokens"] < 100
            # The engine stops after the decode step it is in (one step of this model on this machine).
            print(f"\nEsc on {found.ref}: answer closed in {app.stop_latency * 1e3:.1f} ms, "
                  f"engine free after {app.engine_stop_latency * 1e3:.0f} ms")
            assert app.engine_stop_latency < 1.0
    run(body())
