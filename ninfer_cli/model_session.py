"""From a model name on the command line to a loaded engine and a `ChatSession` (run, chat, REPL).

Heavy imports (engine, numpy) happen inside the functions: command modules import this lazily.
"""
from __future__ import annotations

import sys
from pathlib import Path

from engine.errors import NinferError

DEFAULT_MODEL = "smollm2-135m"


def is_model_ref(text: str | None) -> bool:
    """Whether a positional argument names a model (stored, in the catalog, or a .ninfer path)."""
    if not text or "\n" in text or " " in text.strip():
        return False
    if text.endswith(".ninfer") or Path(text).is_file():
        return True
    from ninfer_cli.store import Store, parse_ref

    try:
        name, _ = parse_ref(text)
    except NinferError:
        return False
    if Store().find(text) is not None or name == DEFAULT_MODEL:
        return True
    try:
        from ninfer_cli import catalog

        return name in catalog.entries()
    except Exception:  # noqa: BLE001 - a broken catalog must not stop a prompt from running
        return False


def looks_like_model(text: str) -> bool:
    """Whether an unknown first word of `ninfer run` was meant as a model: a tag, a path, or a near miss of a
    known name (`qwen38-27` for `qwen38-27b`). Such a word is kept as the model (and reported unknown)
    instead of being read as the first word of the prompt."""
    if ":" in text or "/" in text or text.endswith(".ninfer"):
        return True
    import difflib

    from ninfer_cli.store import Store

    try:
        from ninfer_cli import catalog

        known = set(catalog.entries()) | {r.split(":")[0] for r in Store().refs()}
    except Exception:  # noqa: BLE001 - a broken catalog or store must not stop a prompt from running
        return False
    return bool(difflib.get_close_matches(text.lower(), known, n=1, cutoff=0.8))


def resolve_model(ref: str | None, *, quiet: bool = False) -> tuple[Path, str]:
    """(artifact path, display name); no name means the default model, pulled first when missing."""
    if ref and (ref.endswith(".ninfer") or Path(ref).is_file()):
        path = Path(ref)
        if not path.is_file():
            raise NinferError(f"no model file at {path}", "check the path, or `ninfer ls` for stored models")
        return path, path.name
    from ninfer_cli.store import Store, parse_ref

    store = Store()
    name, _tag = parse_ref(ref or DEFAULT_MODEL)
    found = store.find(ref or DEFAULT_MODEL)
    if found is None and name == DEFAULT_MODEL:
        from ninfer_cli.default_model import ensure_default_model

        found = ensure_default_model(quiet=quiet, store=store)
    if found is None:
        in_catalog = False
        try:
            from ninfer_cli import catalog

            in_catalog = name in catalog.entries()
        except Exception:  # noqa: BLE001
            pass
        if in_catalog:
            raise NinferError(f"{ref} is not downloaded yet", f"run `ninfer pull {ref}` first")
        raise store.unknown(ref)
    if not found.artifact_path.exists():
        raise NinferError(f"{found.ref}: artifact {found.artifact_path} is missing",
                          f"run `ninfer rm {found.ref}` and pull it again")
    return found.artifact_path, found.ref


class UploadProgress:
    """`progress(done, total)` for `engine.load`: a bar on stderr while the weights go to the GPU, then one
    line with the size, time and rate. Nothing is drawn unless the GPU path calls it (CPU loads map)."""

    def __init__(self, name: str, stream=None):
        self.name, self.stream = name, stream or sys.stderr
        self._bar = self._task = None
        self._t0 = None

    def __call__(self, done: int, total: int) -> None:
        import time

        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            self._t0 = time.perf_counter()
            self._bar = Progress(TextColumn(f"[bold]loading {self.name} to the GPU"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("upload", total=total)
        self._bar.update(self._task, completed=done)
        if done >= total:
            self.close()

    def close(self) -> None:
        import time

        if self._bar is None:
            return
        task = self._bar.tasks[0]
        self._bar.stop()
        secs = max(time.perf_counter() - self._t0, 1e-9)
        self.stream.write(f"loaded {task.completed / 1e9:.2f} GB of weights to the GPU in {secs:.1f} s "
                          f"({task.completed / 1e9 / secs:.2f} GB/s)\n")
        self._bar = None


def open_session(ref: str | None, *, device: str = "auto", ctx: int | None = None, system: str | None = None,
                 think: bool | None = None, effort: str | None = None, thinking_budget: int | None = None,
                 preserve_thinking: bool | None = None, quiet: bool = False, profile: str | None = None,
                 kv: str | None = None, vram_limit: int | None = None, prefill_chunk: int | None = None,
                 synthetic: str | None = None):
    """(engine, ChatSession, display name) ready to answer.

    `profile`, `kv` and `vram_limit` settle the launch (`ninfer_cli.profiles.load_fitted`): on the GPU
    the context is fitted to free memory before loading, and what was chosen is said on stderr. `synthetic`
    (a benchmark geometry) builds random weights of that geometry on the GPU instead of loading a model."""
    import engine as eng
    from engine.text.session import ChatSession
    from engine.text.tokenizer import Tokenizer

    if synthetic:
        from engine import synthetic as syn  # noqa: PLC0415

        dev = getattr(device, "value", device)
        model = syn.build_engine(synthetic, device="gpu" if dev == "auto" else dev, max_context=int(ctx or 4096),
                                 kv=kv or "bf16")
        model.tokenizer = syn.tokenizer(model.args.vocab_size)
        return model, ChatSession(model, system=system), f"synthetic {synthetic}"
    path, name = resolve_model(ref, quiet=quiet)
    device = getattr(device, "value", device)
    from ninfer_cli.profiles import load_fitted

    say = None if quiet else (lambda text: sys.stderr.write(text + "\n"))
    upload = None if quiet else UploadProgress(name)
    try:
        chunk = {"prefill_chunk": int(prefill_chunk)} if prefill_chunk else {}
        model = load_fitted(path, name, lambda n, **kv: eng.load(path, device=device, max_context=n, progress=upload,
                                                                  **chunk, **kv),
                            device=device, profile=profile, ctx=ctx, kv=kv, vram_limit=vram_limit, say=say)
    finally:
        if upload is not None:
            upload.close()
    if model.device == "cpu":
        tune_blas_threads()
    if model.tokenizer is None:
        from engine.artifact.container import open_artifact

        model.tokenizer = Tokenizer.from_artifact(open_artifact(path))
    session = ChatSession(model, system=system, think=think, effort=getattr(effort, "value", effort),
                          thinking_budget=thinking_budget, preserve_thinking=preserve_thinking)
    return model, session, name


def generation_config(session, overrides: dict):
    """The model's preset for the session's reasoning mode, with the user's flags on top."""
    from engine.generate import GenerationConfig
    from engine.text.presets import sampling_preset
    from engine.text.reasoning import supports_thinking, template_kwargs

    source = session.template.source if session.template else ""
    kwargs = template_kwargs(source, think=session.think, effort=session.effort)
    thinking = supports_thinking(source) and kwargs.get("enable_thinking", True) is not False
    fields = {**sampling_preset(getattr(session.engine, "config", {}), thinking), **overrides}
    launch_spec = getattr(session.engine, "launch_spec", None)  # a launch profile's (ninfer_cli.profiles)
    if launch_spec and "spec" not in overrides:
        fields["spec"] = launch_spec
    return GenerationConfig(**fields)


def read_stdin_prompt() -> str:
    """All of stdin (for `-` or a piped prompt)."""
    return sys.stdin.read()


def tune_blas_threads() -> int | None:
    """Pick the BLAS thread count for NumPy decode, unless the user set one (OPENBLAS/OMP_NUM_THREADS).

    OpenBLAS threads spin while they wait; on a busy machine two of them on two cores make decode 5-10x
    slower than one, while on an idle one two threads beat one (16.3 vs 12.6 tok/s on the 2-core dev box).
    So: the cores other processes leave free, 1 to 4.
    Returns the count set, or None when nothing was changed.
    """
    import os

    if any(os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NINFER_BLAS_THREADS")):
        n_env = os.environ.get("NINFER_BLAS_THREADS")
        if not n_env:
            return None
        want = int(n_env)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        want = max(1, min(4, cores - _busy_cores()))
    return want if _set_openblas_threads(want) else None


def _busy_cores() -> int:
    """Cores other processes keep busy: the larger of those runnable right now (/proc/loadavg's running count
    minus us) and the whole part of the 1-minute load average. Guessing too few is the costly error."""
    import os

    average = int(os.getloadavg()[0])
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        return max(average, running - 1)
    except (OSError, ValueError, IndexError):
        return average


def _set_openblas_threads(n: int) -> bool:
    import ctypes
    import glob
    import os

    import numpy

    libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__) + ".libs", "*openblas*.so*"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(int(n))
                return True
    return False


NO_THINKING = "this model has no thinking mode: the reasoning settings change nothing"


def reasoning_note(session, think: bool | None, effort: str | None) -> str | None:
    """A warning line when reasoning flags (--think, -r, --thinking-budget) were given for a model that
    cannot think (else None)."""
    from engine.text.reasoning import supports_thinking

    asked = think is not None or effort is not None or getattr(session, "thinking_budget", None) is not None
    if asked and not supports_thinking(session.template.source if session.template else ""):
        return NO_THINKING
    return None
