"""The real model behind the chat app: the engine plus the text front end's `ChatSession`.

Everything model-specific (chat template, reasoning split, thinking budget, sampling presets) is the
text front end's; this only translates the app's settings into its calls and its `Delta`s into the
`Response`-like records the app reads.
"""
from __future__ import annotations

import threading
from pathlib import Path

from ninfer_cli.tui.session import ChatSettings, Chunk, Memory, ModelInfo, process_memory, spec_on

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed")


class EngineSession:
    """Loads `path` on `load()` (from the app's worker thread) and streams answers."""

    def __init__(self, path: Path | str | None, name: str, *, device: str = "auto", ctx: int | None = None,
                 think: bool | None = None, **launch) -> None:
        """`path` None is the default model, pulled by `load()` when it is missing; `think` applies while
        the effort is the model default; `launch` goes to `open_session` (preserve_thinking, profile,
        kv, vram_limit, prefill_chunk)."""
        self.path = Path(path) if path is not None else None
        self.device = getattr(device, "value", device)
        self.ctx = ctx
        self.think = think
        self.launch = {k: v for k, v in launch.items() if v is not None}
        self.info = ModelInfo(name, ctx or 0, self.device)  # "auto" until the engine has chosen
        self.engine = None
        self.chat = None

    def load(self, progress=None) -> None:
        from engine.text.reasoning import supports_thinking
        from ninfer_cli.model_session import open_session

        if self.path is None:
            from ninfer_cli.default_model import ensure_default_model

            manifest = ensure_default_model(quiet=True, progress=progress)
            self.path, self.info.name = manifest.artifact_path, manifest.ref

        engine, chat, _ = open_session(str(self.path), device=self.device, ctx=self.ctx, quiet=True, **self.launch)
        self.engine, self.chat = engine, chat
        source = chat.template.source if chat.template else ""
        self.info = ModelInfo(self.info.name, int(getattr(engine, "max_context", 0) or 0), engine.device,
                              thinking=supports_thinking(source))

    def send(self, messages: list[dict], settings: ChatSettings, cancel: threading.Event):
        from engine.text.reasoning import starts_in_thinking
        from ninfer_cli.model_session import generation_config

        chat = self.chat
        effort = settings.effort
        chat.set_reasoning(think=self.think if effort is None else effort != "off", effort=effort)
        chat.thinking_budget = settings.thinking_budget
        overrides = {k: getattr(settings, k) for k in _SAMPLING if getattr(settings, k) is not None}
        overrides["max_tokens"] = settings.max_tokens
        if spec_on(settings.spec):
            overrides["spec"] = settings.spec
        if getattr(settings, "format", None):
            from ninfer_cli.options import parse_format

            overrides["constraint"] = parse_format(settings.format)
        config = generation_config(chat, overrides)
        # As `chat.complete` does, with the prompt's size said first: the context gauge counts from it.
        prompt = chat.render(messages)
        ids = chat.tokenizer.encode(prompt, add_special=True)
        yield Chunk(prompt_tokens=len(ids))
        for delta in chat.stream_ids(ids, config, cancel, in_thinking=starts_in_thinking(prompt)):
            if not delta.done:
                yield Chunk(text=delta.content, reasoning=delta.reasoning)
                continue
            st = delta.stats
            yield Chunk(prompt_tokens=st.prompt_tokens, generation_tokens=st.generation_tokens,
                        prompt_tps=st.prompt_tps, generation_tps=st.generation_tps,
                        finish_reason=delta.finish_reason or "stop", spec=st.spec)

    def check_spec(self, spec: str) -> None:
        """NinferError, with the next action, when the loaded engine or model cannot run `spec`."""
        from engine.speculative import check_spec

        if self.engine is not None:
            check_spec(self.engine, spec)

    def memory(self) -> Memory:
        if self.info.device == "gpu":
            from engine.backend import cupy_or_none

            cp = cupy_or_none()
            if cp is not None:
                free, total = cp.cuda.runtime.memGetInfo()
                return Memory("VRAM", total - free, total)
        return process_memory()
