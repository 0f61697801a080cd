"""`ninfer serve [MODEL]`: the OpenAI (Chat Completions, Completions, Responses) and Anthropic (Messages)
HTTP APIs over one loaded model. FastAPI and uvicorn come from the `serve` extra and are imported only here,
inside the command."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from ninfer_cli.options import (
    SpecOpt,
    Ctx,
    Device,
    DeviceOpt,
    Effort,
    FrequencyPenalty,
    KvOpt,
    MinP,
    ModelArg,
    PrefillChunk,
    PresencePenalty,
    ProfileOpt,
    Seed,
    Temperature,
    Think,
    ThinkingBudget,
    TopK,
    TopP,
    VramLimit,
)

SERVER = "Server"
Host = Annotated[str, typer.Option("--host", rich_help_panel=SERVER,
                                   help="Address to listen on. Anything but loopback needs --api-key.")]
Port = Annotated[int, typer.Option("--port", min=0, max=65535, rich_help_panel=SERVER,
                                   help="Port to listen on (0: any free port, printed at start).")]
ApiKey = Annotated[Optional[str], typer.Option(
    "--api-key", envvar="NINFER_API_KEY", show_envvar=True, rich_help_panel=SERVER, show_default=False,
    help="Require this key ('Authorization: Bearer KEY' or 'x-api-key: KEY') on /v1; /health stays open.")]
ModelId = Annotated[Optional[str], typer.Option("--model-id", rich_help_panel=SERVER, show_default=False,
                                                help="The model's id in the API. Default: its name, e.g. smollm2-135m.")]
Cors = Annotated[Optional[list[str]], typer.Option(
    "--cors", metavar="ORIGIN", rich_help_panel=SERVER, show_default=False,
    help="Let browser pages from ORIGIN call the server (repeatable; * for any). Off by default.")]
MaxRequestMib = Annotated[float, typer.Option("--max-request-mib", min=0.001, rich_help_panel=SERVER,
                                              help="Largest request body, in MiB; larger ones get 413.")]
DefaultMaxTokens = Annotated[int, typer.Option("--default-max-tokens", min=1, rich_help_panel=SERVER,
                                               help="Output limit of requests that set none.")]
RequestLogFile = Annotated[Optional[str], typer.Option(
    "--request-log", metavar="FILE", rich_help_panel=SERVER, show_default=False,
    help="Append JSON lines to FILE: server_start, request_start, request_done (tokens, timings), request_error.")]
MaxPending = Annotated[int, typer.Option("--max-pending-requests", min=0, rich_help_panel=SERVER,
                                         help="Requests that may wait while one runs; more get 429.")]
PendingTimeout = Annotated[int, typer.Option("--pending-timeout-ms", min=1, rich_help_panel=SERVER,
                                             help="Longest wait for the model before 503, in milliseconds.")]
TemplateFile = Annotated[Optional[str], typer.Option("--chat-template", metavar="FILE", show_default=False,
                                                     help="Render prompts with this Jinja chat template instead of "
                                                          "the model's own.")]


def is_loopback(host: str) -> bool:
    """Whether `host` is only reachable from this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(model: ModelArg = None, host: Host = "127.0.0.1", port: Port = 8080, api_key: ApiKey = None,
          model_id: ModelId = None, cors: Cors = None, max_request_mib: MaxRequestMib = 384.0,
          default_max_tokens: DefaultMaxTokens = 8192, request_log: RequestLogFile = None,
          max_pending_requests: MaxPending = 16, pending_timeout_ms: PendingTimeout = 600_000,
          temperature: Temperature = None, top_k: TopK = None, top_p: TopP = None, min_p: MinP = None,
          presence_penalty: PresencePenalty = None, frequency_penalty: FrequencyPenalty = None, seed: Seed = None,
          think: Think = None, reasoning_effort: Effort = None, thinking_budget: ThinkingBudget = None,
          ctx: Ctx = None, device: DeviceOpt = Device.auto, profile: ProfileOpt = None, kv: KvOpt = None,
          vram_limit: VramLimit = None, prefill_chunk: PrefillChunk = None,
          chat_template: TemplateFile = None, spec: SpecOpt = None) -> None:
    """Serve a model over HTTP: OpenAI Chat Completions, Completions and Responses, Anthropic Messages.

    Base URLs: OpenAI clients http://127.0.0.1:8080/v1, Anthropic clients http://127.0.0.1:8080.
    Examples: `ninfer serve`, `ninfer serve qwen38-27b --port 9000`,
    `NINFER_API_KEY=secret ninfer serve --host 0.0.0.0`.
    """
    import importlib.util
    import sys

    from engine.errors import NinferError

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn")):
        raise NinferError("`ninfer serve` needs FastAPI and uvicorn, which are not installed",
                          "pip install 'ninfer[serve]'")
    key = api_key or None
    if not is_loopback(host) and key is None:
        raise NinferError(f"refusing to listen on {host} without an API key: anyone who can reach it could use "
                          f"the model", "pass --api-key KEY (or set NINFER_API_KEY), or listen on 127.0.0.1")
    from ninfer_cli.model_session import resolve_model
    from ninfer_cli.options import reasoning_choice, sampling_overrides

    effort = reasoning_choice(reasoning_effort, think)
    path, name = resolve_model(model)  # may pull the default model first (with its own progress)
    short = name.removesuffix(":latest").removesuffix(".ninfer")
    mid = model_id or short
    sampling = sampling_overrides(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
                                  spec=spec)
    sock = _listen(host, port)
    bound = sock.getsockname()[1]

    def load():
        import time

        from ninfer_cli.commands.run import use_template_file
        from ninfer_cli.model_session import open_session
        from ninfer_cli.serve.generation import ModelHost

        t0 = time.perf_counter()
        sys.stderr.write(f"loading {name} ...\n")
        engine, session, _ = open_session(str(path), device=device, ctx=ctx,
                                          think=think if effort is None else effort.value != "off",
                                          effort=None if effort is None else effort.value,
                                          thinking_budget=thinking_budget, profile=profile, kv=kv,
                                          vram_limit=vram_limit, prefill_chunk=prefill_chunk)
        use_template_file(session, chat_template)
        if spec:
            from engine.speculative import check_spec

            check_spec(engine, spec)
        sys.stderr.write(f"ready: {mid} on {engine.device}, context {engine.max_context or '?'} tokens, loaded in "
                         f"{time.perf_counter() - t0:.1f} s\n")
        return ModelHost(engine, session, model_id=mid, default_max_tokens=default_max_tokens, think=session.think,
                         effort=session.effort, thinking_budget=thinking_budget, sampling=sampling)

    _run_server(sock, host, bound, mid, key, load, aliases=(name, short, str(path)), cors=tuple(cors or ()),
                max_request_mib=max_request_mib, request_log=request_log, max_pending=max_pending_requests,
                pending_timeout_s=pending_timeout_ms / 1000)


def _listen(host: str, port: int):
    """A bound socket for (host, port), or a one-line error (port in use, unknown address)."""
    import socket

    from engine.errors import NinferError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise NinferError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                          "pick another --port, or stop the program that uses it") from None
    return sock


def _run_server(sock, host: str, port: int, mid: str, key, load, *, aliases, cors, max_request_mib, request_log,
                max_pending, pending_timeout_s) -> None:
    import sys

    import uvicorn

    from engine.errors import NinferError
    from ninfer_cli.serve.app import MIB, ServeConfig, build_app
    from ninfer_cli.serve.logs import RequestLog

    config = ServeConfig(api_key=key, cors=cors, max_request_bytes=int(max_request_mib * MIB),
                         max_pending=max_pending, pending_timeout_s=pending_timeout_s, request_log=request_log,
                         model_aliases=tuple(aliases))
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    server: list = []

    def loaded(state):
        if state.load_error and server:
            server[0].should_exit = True
        elif state.host is not None:
            state.log.event("server_start", url=url, model=mid, context=state.host.max_context,
                            device=getattr(state.host.engine, "device", None))

    app = build_app(config, load, log=RequestLog(request_log), on_loaded=loaded)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:
                sys.stderr.write(f"listening on {url} · OpenAI base URL {url}/v1 · Anthropic base URL {url} · "
                                 f"model id {mid} · " + ("API key required" if key else "no API key") + "\n")

        def handle_exit(self, sig, frame):
            app.state.cancel_all()
            super().handle_exit(sig, frame)

    server.append(Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                        timeout_graceful_shutdown=3)))
    server[0].run(sockets=[sock])
    if app.state.load_error:
        raise NinferError(f"could not load {mid}: {app.state.load_error}")
