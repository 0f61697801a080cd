"""The HTTP server: a FastAPI app over one loaded model, with a FIFO queue in front of the engine, API-key
checks, request logs and the error envelopes.

Requests run one at a time (one engine, one sequence). Those that arrive meanwhile wait in a bounded FIFO;
a full queue answers 429 and a wait past the timeout 503, both with Retry-After. A client that goes away
cancels its generation before the next token, and the next request in the queue starts.
"""
from __future__ import annotations

import asyncio
import collections
import hmac
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import NinferError
from ninfer_cli.serve import anthropic, openai, responses
from ninfer_cli.serve.errors import ApiError, api_of_path, from_validation
from ninfer_cli.serve.generation import ModelHost, Run
from ninfer_cli.serve.logs import RequestLog, usage_of
from ninfer_cli.serve.schema import constraint_for, new_id, sse

MIB = 1 << 20


@dataclass
class ServeConfig:
    """Server settings that do not depend on the model."""

    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_request_bytes: int = 384 * MIB
    max_pending: int = 16
    pending_timeout_s: float = 600.0
    request_log: str | None = None
    model_aliases: tuple[str, ...] = ()  # other names a request may give for the model (e.g. name:tag)


class Gate:
    """One request on the engine at a time; the others wait in a bounded FIFO (on the event loop)."""

    def __init__(self, max_pending: int, timeout_s: float):
        self.max_pending, self.timeout_s = max_pending, timeout_s
        self.busy = False
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    async def acquire(self, gone: asyncio.Event) -> bool:
        """Wait for the engine; False when the client left first. 429 when the queue is full, 503 on timeout."""
        if not self.busy and not self.waiting:
            self.busy = True
            return True
        if self.waiting >= self.max_pending:
            raise ApiError(429, f"the server is busy: {self.waiting} requests are already waiting; retry shortly",
                           code="queue_full", headers={"Retry-After": "1"})
        turn = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        left = asyncio.ensure_future(gone.wait())
        try:
            await asyncio.wait({turn, left}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._give_up(turn)
            raise
        finally:
            left.cancel()
        if turn.done() and not turn.cancelled():
            if gone.is_set():
                self.release()
                return False
            return True
        self._give_up(turn)
        if gone.is_set():
            return False
        raise ApiError(503, f"waited {self.timeout_s:g} s for the model without a turn; retry later",
                       kind="overloaded", code="queue_timeout", headers={"Retry-After": "5"})

    def _give_up(self, turn: asyncio.Future) -> None:
        if turn.done() and not turn.cancelled():
            self.release()  # the turn arrived as we left: pass it on
        else:
            turn.cancel()
        try:
            self._waiters.remove(turn)
        except ValueError:
            pass

    def release(self) -> None:
        """Hand the engine to the next waiter, or mark it free."""
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.busy = False


class _Watch:
    """Sets `gone` (and the generation's cancel event) when the client disconnects."""

    def __init__(self, request: Request):
        self.gone = asyncio.Event()
        self.cancel = threading.Event()
        self._task = asyncio.ensure_future(self._watch(request.receive))

    async def _watch(self, receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - a broken connection is a disconnect too
            pass
        self.gone.set()
        self.cancel.set()

    def stop(self) -> None:
        self._task.cancel()


@dataclass
class ServeState:
    """The model (once loaded) and what the requests share."""

    config: ServeConfig
    host: ModelHost | None = None
    load_error: str | None = None
    gate: Gate | None = None
    log: RequestLog | None = None
    runs: set = field(default_factory=set)
    on_loaded: object = None  # called (on the loading thread) once the model is loaded or has failed to

    def cancel_all(self) -> None:
        """Stop every generation (shutdown)."""
        for run in list(self.runs):
            run.cancel.set()

    def model_ids(self) -> set[str]:
        return {self.host.model_id, *self.config.model_aliases} if self.host else set()


def _loading_error() -> ApiError:
    return ApiError(503, "the model is still loading; retry in a moment", kind="overloaded", code="loading",
                    headers={"Retry-After": "2"})


def build_app(config: ServeConfig, load=None, *, log: RequestLog | None = None, on_loaded=None):
    """The ASGI app (`app.state` is its ServeState). `load()` returns the ModelHost; it runs on a thread at
    startup while /health says loading, then `on_loaded(state)` hears how it went."""
    state = ServeState(config, gate=Gate(config.max_pending, config.pending_timeout_s),
                       log=log or RequestLog(config.request_log), on_loaded=on_loaded)

    async def lifespan(_app):
        if load is not None:
            threading.Thread(target=_load, args=(state, load), name="ninfer-load", daemon=True).start()
        yield
        state.cancel_all()
        state.log.close()

    app = FastAPI(title="ninfer", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.ninfer = state
    _handlers(app)
    _routes(app, state)
    if config.cors:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors), allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["Retry-After", "x-request-id"])
    return Front(app, state)


def _load(state: ServeState, load) -> None:
    try:
        state.host = load()
    except NinferError as exc:
        state.load_error = exc.message + (f": {exc.next_action}" if exc.next_action else "")
    except Exception as exc:  # noqa: BLE001 - reported on /health and by the command
        state.load_error = f"{type(exc).__name__}: {exc}"
    if state.on_loaded is not None:
        state.on_loaded(state)


def _error_response(err: ApiError, path: str) -> JSONResponse:
    return JSONResponse(err.body(api_of_path(path)), status_code=err.status, headers=err.headers)


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        request.state.ninfer["error"] = exc.message
        return _error_response(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = {404: f"no route {request.url.path}: see GET /v1/models and docs/serving.md",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return await api_error(request, ApiError(exc.status_code, message))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return await api_error(request, ApiError(400, f"invalid request: {exc.errors()[0].get('msg', '')}"))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        if os.environ.get("NINFER_DEBUG", "") not in ("", "0"):
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        return await api_error(request, ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))


async def _json_body(request: Request, limit: int) -> dict:
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, f"the request body is over {limit / MIB:g} MiB, this server's limit (--max-request-mib)",
                       code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_big
    if not body.strip():
        raise ApiError(400, "the request has no body: send a JSON object", code="invalid_json")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return data


def _routes(app: FastAPI, state: ServeState) -> None:
    def ready() -> ModelHost:
        if state.host is None:
            if state.load_error:
                raise ApiError(503, f"the model failed to load: {state.load_error}", kind="overloaded")
            raise _loading_error()
        return state.host

    async def parse(request: Request, schema):
        host = ready()
        data = await _json_body(request, state.config.max_request_bytes)
        try:
            req = schema.model_validate(data)
        except ValidationError as exc:
            raise from_validation(exc) from None
        if req.model not in state.model_ids():
            raise ApiError(404, f"unknown model {req.model!r}: this server serves {host.model_id!r}", param="model",
                           code="model_not_found")
        return host, req

    async def generate(request: Request, host: ModelHost, job, respond):
        prepared = await asyncio.to_thread(host.prepare, job)
        watch = _Watch(request)
        t0 = time.perf_counter()
        try:
            turn = await state.gate.acquire(watch.gone)
        except BaseException:
            watch.stop()
            raise
        if not turn:
            watch.stop()
            request.state.ninfer["error"] = "the client left while waiting"
            return Response(status_code=499)

        def done():
            state.gate.release()
            watch.stop()
            state.runs.discard(run)

        run = Run(host, prepared, watch.cancel, done)
        run.queued_s = time.perf_counter() - t0
        state.runs.add(run)
        request.state.ninfer["run"] = run
        run.start()
        return await respond(run)

    def streamed(request: Request, run: Run, events, api: str) -> StreamingResponse:
        async def body():
            try:
                async for chunk in events:
                    yield chunk
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - headers are sent: the error goes in the stream
                err = _as_api_error(exc)
                request.state.ninfer["error"] = err.message
                yield sse(err.anthropic(), "error") if api == "anthropic" else sse(err.openai())
            finally:
                run.cancel.set()  # a client that left mid-stream stops the engine at once

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def finished(run: Run) -> object:
        try:
            return await run.collect()
        except Exception as exc:  # noqa: BLE001
            raise _as_api_error(exc) from None

    @app.get("/health")
    async def health():
        if state.host is None:
            body = {"status": "error", "error": state.load_error} if state.load_error else {"status": "loading"}
            return JSONResponse(body, status_code=503)
        return {"status": "ok", "model": state.host.model_id}

    @app.get("/v1/models")
    async def models(request: Request):
        host = ready()
        if "anthropic-version" in request.headers:
            return {"data": [_anthropic_model(host)], "has_more": False, "first_id": host.model_id,
                    "last_id": host.model_id}
        return {"object": "list", "data": [_openai_model(host)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        host = ready()
        if model_id not in state.model_ids():
            raise ApiError(404, f"unknown model {model_id!r}: this server serves {host.model_id!r}", param="model",
                           code="model_not_found")
        return _anthropic_model(host) if "anthropic-version" in request.headers else _openai_model(host)

    async def openai_endpoint(request: Request, schema, to_job, events, answer, prefix: str, request_format,
                              api: str = "openai"):
        host, req = await parse(request, schema)
        job = to_job(req)
        job.constraint = constraint_for(request_format(req), getattr(req, "tools", None),
                                        getattr(req, "tool_choice", None), api,
                                        parallel_tool_calls=getattr(req, "parallel_tool_calls", None),
                                        structured_outputs=getattr(req, "structured_outputs", None))
        rid, created = new_id(prefix), int(time.time())

        async def respond(run: Run):
            if req.stream:
                return streamed(request, run, events(run.deltas(), rid, host.model_id, created, req), "openai")
            return answer(rid, host.model_id, created, req, await finished(run))

        return await generate(request, host, job, respond)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await openai_endpoint(request, openai.ChatRequest, openai.chat_job, openai.chat_events,
                                     openai.chat_completion, "chatcmpl-", lambda r: r.response_format)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await openai_endpoint(request, openai.CompletionRequest, openai.completion_job,
                                     openai.completion_events, openai.text_completion, "cmpl-", lambda r: None)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await openai_endpoint(request, responses.ResponsesRequest, responses.responses_job,
                                     responses.response_events, responses.response_json, "resp_",
                                     lambda r: r.text.format if r.text else None, "responses")

    @app.post("/v1/messages")
    async def messages(request: Request):
        host, req = await parse(request, anthropic.MessagesRequest)
        job = anthropic.messages_job(req)
        job.constraint = constraint_for((req.output_config or {}).get("format") or getattr(req, "output_format", None),
                                        req.tools, req.tool_choice, "anthropic")
        mid = new_id("msg_")

        async def respond(run: Run):
            def stop_sequence():
                return run.prepared.watched.matched_stop(job.stop)

            if req.stream:
                return streamed(request, run, anthropic.message_events(run.deltas(), mid, host.model_id,
                                                                       len(run.prepared.ids), stop_sequence),
                                "anthropic")
            final = await finished(run)
            return anthropic.message_json(mid, host.model_id, final, stop_sequence())

        return await generate(request, host, job, respond)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        host, req = await parse(request, anthropic.CountRequest)
        job = anthropic.count_job(req)
        return {"input_tokens": await asyncio.to_thread(host.count_tokens, job)}


def _openai_model(host: ModelHost) -> dict:
    return {"id": host.model_id, "object": "model", "created": host.created, "owned_by": "ninfer"}


def _anthropic_model(host: ModelHost) -> dict:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(host.created))
    return {"type": "model", "id": host.model_id, "display_name": host.model_id, "created_at": created}


def _as_api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, NinferError):
        return ApiError(400, exc.message + (f": {exc.next_action}" if exc.next_action else ""))
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}")


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


class Front:
    """Outermost ASGI layer: request id, API-key check (not on /health or CORS preflight), the stderr line and
    the JSON-lines log of every request, and a last envelope for anything that escaped."""

    def __init__(self, app: FastAPI, state: ServeState):
        self.app, self.state = app, state
        key = state.config.api_key
        self._key = key.encode() if key else None

    def _authorized(self, scope) -> bool:
        if self._key is None:
            return True
        bearer = _header(scope, b"authorization") or b""
        given = [bearer[7:].strip() if bearer[:7].lower() == b"bearer " else b"", _header(scope, b"x-api-key") or b""]
        return any(hmac.compare_digest(g, self._key) for g in given)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        t0 = time.perf_counter()
        info = scope.setdefault("state", {}).setdefault("ninfer", {})
        info["id"] = rid = new_id("req_")[:16]
        started = {"status": 0}

        async def tracked(message):
            if message["type"] == "http.response.start":
                started["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        logged = path != "/health"
        if logged and method == "POST":
            self.state.log.event("request_start", id=rid, method=method, path=path)
        try:
            if path.startswith("/v1") and method != "OPTIONS" and not self._authorized(scope):
                err = ApiError(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY' or "
                                    "'x-api-key: KEY'", headers={"WWW-Authenticate": "Bearer"})
                info["error"] = err.message
                await _error_response(err, path)(scope, receive, tracked)
            else:
                await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - never a traceback to the client
            info.setdefault("error", f"{type(exc).__name__}: {exc}")
            if not started["status"]:
                err = ApiError(500, f"internal error: {type(exc).__name__}")
                await _error_response(err, path)(scope, receive, tracked)
        finally:
            if logged:
                status, ms = started["status"] or 500, (time.perf_counter() - t0) * 1e3
                run = info.get("run")
                finish = lambda: self._finish(info, method, path, status, ms)  # noqa: E731
                if run is None:
                    finish()
                else:
                    run.when_done(finish)  # a cancelled stream's figures are known once the engine stops

    def _finish(self, info: dict, method: str, path: str, status: int, ms: float) -> None:
        usage = usage_of(info.get("run"))
        self.state.log.line(method, path, status, ms, usage)
        if method != "POST":
            return
        fields = {"id": info["id"], "method": method, "path": path, "status": status, "total_ms": round(ms, 2)}
        if info.get("error") or status >= 400:
            self.state.log.event("request_error", **fields, error=info.get("error"), **({"usage": usage} if usage else {}))
        else:
            self.state.log.event("request_done", **fields, **(usage or {}))
