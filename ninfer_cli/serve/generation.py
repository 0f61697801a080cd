"""What the server asks of the engine: a request in the engine's terms (`Job`), turned into prompt ids and
a GenerationConfig (`ModelHost.prepare`), then run on a worker thread whose deltas reach the event loop
(`Run`). Generation itself is `ChatSession.stream_ids` (chat) or `Engine.stream` (raw completions): the
same stream `ninfer run` and `ninfer chat` read.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from engine.errors import NinferError
from engine.text.session import ChatSession, Delta, TurnStats
from ninfer_cli.serve.errors import ApiError


@dataclass
class Job:
    """One request in the engine's terms. Exactly one of `messages` (rendered with the model's chat
    template) and `prompt` (raw text, no template) is set; `None` fields take the server's defaults."""

    messages: list[dict] | None = None
    prompt: str | None = None
    tools: list[dict] | None = None  # OpenAI function schemas: {"type": "function", "function": {...}}
    sampling: dict = field(default_factory=dict)  # GenerationConfig fields the request set
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    think: bool | None = None
    effort: str | None = None
    thinking_budget: int | None = None
    constraint: object = None  # engine.constraints.Constraint from schema.constraint_for (None: free text)


@dataclass
class Prepared:
    """A Job ready to run: its session, prompt ids and config."""

    session: ChatSession
    watched: "_Watched"
    ids: list[int]
    config: object
    in_thinking: bool
    raw: bool
    prepare_s: float


class _Watched:
    """The engine as one request's session sees it: passes the stream through, keeping the last record and
    the ids of the last call (to tell which stop string ended it)."""

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.config = getattr(engine, "config", {})
        self.last = None
        self.tokens: list[int] = []

    def stream(self, prompt_ids, config, *, cancel=None):
        self.tokens = []
        for resp in self.engine.stream(prompt_ids, config, cancel=cancel):
            self.last = resp
            if resp.token is not None:
                self.tokens.append(int(resp.token))
            yield resp

    def matched_stop(self, stops: tuple[str, ...]) -> str | None:
        """The stop string that ended the answer, or None (EOS, length, cancel)."""
        last = self.last
        if not stops or last is None or last.finish_reason != "stop" or last.token is None:
            return None
        if int(last.token) in set(getattr(self.tokenizer, "eos_token_ids", ())):
            return None
        raw = self.tokenizer.decode(self.tokens)
        found = [(raw.find(s), -len(s), s) for s in stops if s and s in raw]
        return min(found)[2] if found else None


class ModelHost:
    """The loaded model and the defaults every request starts from (reasoning, sampling, output limit)."""

    def __init__(self, engine, session: ChatSession, *, model_id: str, default_max_tokens: int = 8192,
                 think: bool | None = None, effort: str | None = None, thinking_budget: int | None = None,
                 sampling: dict | None = None):
        self.engine = engine
        self.base = session
        self.model_id = model_id
        self.default_max_tokens = default_max_tokens
        self.think, self.effort, self.thinking_budget = think, effort, thinking_budget
        self.sampling = dict(sampling or {})
        self.created = int(time.time())

    @property
    def tokenizer(self):
        return self.base.tokenizer

    @property
    def max_context(self) -> int | None:
        return getattr(self.engine, "max_context", None)

    def _session(self, job: Job, watched: _Watched) -> ChatSession:
        think = job.think if job.think is not None or job.effort is not None else self.think
        effort = job.effort if job.effort is not None or job.think is not None else self.effort
        budget = job.thinking_budget if job.thinking_budget is not None else self.thinking_budget
        try:
            return ChatSession(watched, tokenizer=self.tokenizer, template=self.base.template, think=think,
                               effort=effort, thinking_budget=budget, tools=job.tools or None,
                               preserve_thinking=self.base.preserve_thinking)
        except NinferError as exc:
            raise ApiError(400, _one_line(exc), param="reasoning_effort") from None

    def _ids(self, job: Job, session: ChatSession) -> tuple[list[int], bool]:
        from engine.text.reasoning import starts_in_thinking

        if job.prompt is not None:
            return self.tokenizer.encode(job.prompt, add_special=True), False
        try:
            text = session.render(job.messages)
        except NinferError as exc:
            raise ApiError(400, _one_line(exc)) from None
        return self.tokenizer.encode(text, add_special=True), starts_in_thinking(text)

    def count_tokens(self, job: Job) -> int:
        """Prompt tokens of a job (the rendered conversation, tools included)."""
        return len(self._ids(job, self._session(job, _Watched(self.engine)))[0])

    def prepare(self, job: Job) -> Prepared:
        """Render, tokenize and check a job against the context; 400 when it cannot run."""
        from ninfer_cli.model_session import generation_config

        t0 = time.perf_counter()
        watched = _Watched(self.engine)
        session = self._session(job, watched)
        ids, in_thinking = self._ids(job, session)
        if not ids:
            raise ApiError(400, "the prompt is empty: give the model some text", param="prompt")
        ctx = self.max_context
        if ctx and len(ids) >= ctx:
            raise ApiError(400, f"the prompt has {len(ids)} tokens but this server's context holds {ctx} "
                                f"(prompt and answer together): shorten the prompt, or restart the server with "
                                f"a larger --ctx", code="context_length_exceeded", param="messages")
        fields = {**self.sampling, **job.sampling, "max_tokens": job.max_tokens or self.default_max_tokens,
                  "stop_strings": tuple(job.stop)}
        if job.constraint is not None:
            fields["constraint"] = job.constraint
        config = generation_config(session, fields)
        return Prepared(session, watched, ids, config, in_thinking, job.prompt is not None,
                        time.perf_counter() - t0)

    def run(self, p: Prepared, cancel: threading.Event):
        """The answer's `Delta`s, the last with `done` (runs on the worker thread)."""
        if not p.raw:
            yield from p.session.stream_ids(p.ids, p.config, cancel, in_thinking=p.in_thinking)
            return
        stats = TurnStats(prompt_tokens=len(p.ids))
        t0 = time.perf_counter()
        text, last = [], None
        for resp in p.watched.stream(p.ids, p.config, cancel=cancel):
            if not stats.ttft_s:
                stats.ttft_s, stats.prompt_tps = time.perf_counter() - t0, resp.prompt_tps
            if resp.text:
                text.append(resp.text)
                yield Delta(content=resp.text)
            last = resp
        stats.generation_tokens = last.generation_tokens if last else 0
        stats.generation_tps = last.generation_tps if last else 0.0
        stats.total_s = time.perf_counter() - t0
        stats.finish_reason = last.finish_reason if last else "cancelled"
        yield Delta(done=True, finish_reason=stats.finish_reason, stats=stats, answer="".join(text))


def _one_line(exc: NinferError) -> str:
    return f"{exc.message}: {exc.next_action}" if exc.next_action else exc.message


_END = object()


class Run:
    """One request's generation on a worker thread. `deltas()` yields its `Delta`s on the event loop;
    setting `cancel` stops it before the next token; `on_done` runs on the loop once the engine is free."""

    def __init__(self, host: ModelHost, prepared: Prepared, cancel: threading.Event, on_done):
        self.host, self.prepared, self.cancel = host, prepared, cancel
        self.final: Delta | None = None
        self.finished = False  # the engine is free again
        self.first_token_s: float | None = None
        self.started = time.perf_counter()
        self.queued_s = 0.0
        self._callbacks = [on_done]
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._work, name="ninfer-generate", daemon=True)

    def when_done(self, callback) -> None:
        """Run `callback()` on the event loop once the engine is free (now, if it already is)."""
        if self.finished:
            callback()
        else:
            self._callbacks.append(callback)

    def _done(self) -> None:
        self.finished = True
        for callback in self._callbacks:
            callback()

    def start(self) -> "Run":
        self._thread.start()
        return self

    def _put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is gone: the server is shutting down
            self.cancel.set()

    def _work(self) -> None:
        try:
            for delta in self.host.run(self.prepared, self.cancel):
                if self.first_token_s is None:
                    self.first_token_s = time.perf_counter() - self.started
                if delta.done:
                    self.final = delta
                self._put(delta)
        except BaseException as exc:  # noqa: BLE001 - reported to the request, never lost
            self._put(exc)
        finally:
            self._put(_END)
            try:
                self._loop.call_soon_threadsafe(self._done)
            except RuntimeError:
                pass

    async def deltas(self):
        """The answer as it is generated; raises what the engine raised."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def collect(self) -> Delta:
        """The final record, after the whole answer."""
        final = None
        async for delta in self.deltas():
            final = delta if delta.done else final
        if final is None:
            raise ApiError(500, "the generation ended without an answer")
        return final
