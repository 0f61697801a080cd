"""Public engine API: `load(...) -> Engine`; the Engine runs one sequence on NumPy (or CuPy arrays).

The Engine speaks the low-level protocol `ninfer bench` and the generation loop use (reset, prefill,
decode_step, decode_greedy, info, position) and the high-level one (logits, stream).
"""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from engine.backend import resolve_device, xp_for
from engine.errors import NinferError
from engine.generate import GenerationConfig, Response, stream_generate
from engine.sampling import greedy, make_sampler
from engine.speculative import speculative_steps, with_stats

__all__ = ["load", "Engine", "GenerationConfig", "Response"]

QWEN_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe")
QWEN_ARCHS = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
              "Qwen3_5MoeForConditionalGeneration")


class _ArtifactWeights(Mapping):
    """Lazy name -> float32 array view of an artifact's bindings (decoded on access)."""

    def __init__(self, artifact):
        self.artifact = artifact

    def __getitem__(self, name):
        if name not in self.artifact.bindings:
            raise KeyError(name)
        return self.artifact.parameter(name)

    def __contains__(self, name):
        return name in self.artifact.bindings

    def __iter__(self):
        return iter(self.artifact.bindings)

    def __len__(self):
        return len(self.artifact.bindings)


def _to_host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def build_model(config: Mapping[str, Any], weights: Mapping[str, Any], xp=np, *, gdn_mode: str = "chunked"):
    """The architecture's Model for an HF-style config, loaded with logical-name weights."""
    cfg = dict(config)
    mtype = str(cfg.get("model_type", ""))
    archs = tuple(cfg.get("architectures") or ())
    if mtype in QWEN_TYPES or any(a in QWEN_ARCHS for a in archs):
        from engine.models import qwen3_5  # noqa: PLC0415

        args = qwen3_5.ModelArgs.from_config(cfg)
        if not args.mtp_num_hidden_layers and "mtp/input_projection" in weights:
            args = dataclasses.replace(args, mtp_num_hidden_layers=1)
        return qwen3_5.Model(args, xp=xp, gdn_mode=gdn_mode).load(weights)
    if mtype == "llama" or "LlamaForCausalLM" in archs:
        from engine.models import llama  # noqa: PLC0415

        return llama.Model(llama.ModelArgs.from_config(cfg), xp=xp).load(weights)
    raise NinferError(f"unsupported model type {mtype or archs!r}",
                      "ninfer runs Qwen3.5/3.6/3.8 hybrid models and Llama (SmolLM2)")


def load(path_or_artifact, device: str = "auto", *, max_context: int | None = None, gdn_mode: str = "chunked",
         prefill_chunk: int | None = None, kv: str = "bf16", progress=None) -> "Engine":
    """Load a model: a `.ninfer` path, an opened Artifact, or `{"config": hf_config, "weights": {name: array}}`.

    device "auto" | "cpu" | "gpu" ("gpu" runs these reference models on CuPy arrays).
    max_context caps positions (default: the model's max_position_embeddings).
    progress(done_bytes, total_bytes) follows the copy of the weights to the GPU (the CPU path maps the
    file and copies nothing up front). prefill_chunk: prompt tokens per pass (default 256; on the GPU
    it caps the tensor-core chunk, which is on where the memory allows: `engine.gpu_engine.PREFILL_GEMM`).
    """
    try:
        dev = resolve_device(device)
    except RuntimeError as e:
        raise NinferError(str(e), "use --device cpu, or install CuPy on a machine with an NVIDIA GPU") from None
    except ValueError as e:
        raise NinferError(str(e)) from None
    xp = xp_for(dev)
    tokenizer, artifact = None, None
    src = path_or_artifact
    if isinstance(src, Mapping):
        if "config" not in src or "weights" not in src:
            raise NinferError("load() takes a dict with 'config' and 'weights'")
        config, weights = dict(src["config"]), src["weights"]
        tokenizer = src.get("tokenizer")
    else:
        if isinstance(src, (str, Path)):
            p = Path(src)
            if not p.exists():
                raise NinferError(f"no model file at {p}", "check the path, or `ninfer ls` for stored models")
            from engine.artifact.container import open_artifact  # noqa: PLC0415

            artifact = open_artifact(p)
        else:
            artifact = src
        comps = artifact.components
        if "text" not in comps or "config" not in comps["text"]:
            raise NinferError(f"{getattr(artifact, 'path', 'artifact')} has no text config",
                              "re-convert the model with `ninfer convert`")
        config = dict(comps["text"]["config"])
        weights = _ArtifactWeights(artifact)
        tokenizer = _tokenizer_of(artifact)
    if kv not in ("bf16", "int8"):
        raise NinferError(f"unknown KV format {kv!r}", "use bf16 or int8")
    if dev == "gpu":
        from engine.gpu_engine import try_build  # noqa: PLC0415

        fast = try_build(config, artifact if artifact is not None else weights, max_context=max_context,
                         tokenizer=tokenizer, kv=kv, progress=progress, prefill_chunk=prefill_chunk)
        if fast is not None:
            fast.artifact = artifact
            return fast
    if kv != "bf16":
        raise NinferError("int8 KV needs the CUDA decode path (Qwen3.5 dense or MoE on a GPU)",
                          "drop --kv int8 (this model/device keeps float KV)")
    model = build_model(config, weights, xp, gdn_mode=gdn_mode)
    return Engine(model, config, device=dev, tokenizer=tokenizer, max_context=max_context,
                  prefill_chunk=prefill_chunk or 256, artifact=artifact)


def _tokenizer_of(artifact):
    has = getattr(artifact, "has_resource", None)
    if has is not None and not has("tokenizer.json"):
        return None
    try:
        from engine.text.tokenizer import Tokenizer  # noqa: PLC0415
    except ImportError:
        return None
    return Tokenizer.from_artifact(artifact)


class Engine:
    """One model and one sequence's cache. Not thread-safe: drive it from one thread at a time."""

    _hidden_sink = None  # fn(final-normed hidden [T, H]) of every chunk fed, while engine.speculative asks

    def __init__(self, model, config: Mapping[str, Any], *, device: str = "cpu", tokenizer=None,
                 max_context: int | None = None, prefill_chunk: int = 256, artifact=None):
        self.model = model
        self.args = model.args
        self.config = dict(config)
        self.device = device
        self.tokenizer = tokenizer
        self.artifact = artifact
        self.xp = model.xp
        limit = int(getattr(self.args, "max_position_embeddings", 0) or 0) or None
        self.max_context = int(max_context) if max_context else limit
        self.prefill_chunk = max(1, int(prefill_chunk))
        self.domain = int(getattr(self.args, "domain", None) or self.args.vocab_size)
        self.cache = None
        self._tokens: list[int] = []  # ids the cache has consumed
        self._last = None  # logits after the last consumed id
        self.reset()

    # --- low-level protocol ---------------------------------------------------------------------

    def reset(self) -> None:
        """Start a new sequence (empty cache at position 0)."""
        self.cache = self._new_cache()
        self._tokens, self._last = [], None

    def _new_cache(self):
        # The Qwen caches grow; Llama's preallocates (zero pages cost nothing until written).
        if self.args.model_type == "llama":
            return self.model.make_cache(self.max_context)
        return self.model.make_cache()

    @property
    def position(self) -> int:
        """Tokens consumed by the current sequence."""
        return int(self.cache.position)

    def _check_room(self, n: int) -> None:
        if self.max_context and self.position + n > self.max_context:
            raise NinferError(f"context full: {self.position + n} tokens > {self.max_context}",
                              "start a new conversation or raise the context length")

    def _run(self, ids: Sequence[int], *, all_rows: bool = False):
        """Feed ids through the cache in chunks; the last logits (or every row) on the host."""
        self._check_room(len(ids))
        rows, last, i = [], None, 0
        try:
            while i < len(ids):
                n = self._chunk_len(self.position)
                chunk = np.asarray(ids[i : i + n], dtype=np.int64)
                if self._hidden_sink is not None:  # speculative decoding's MTP head reads the hidden states
                    out, hidden = self.model.forward(chunk, self.cache, last_only=not all_rows)
                    self._hidden_sink(hidden)
                else:
                    out = self.model(chunk, self.cache, last_only=not all_rows)
                if all_rows:
                    rows.append(_to_host(out))
                elif i + n >= len(ids):
                    last = _to_host(out[-1])
                i += n
        except BaseException:
            self.reset()  # an interrupted forward leaves layers out of step with each other
            raise
        self._tokens.extend(int(t) for t in ids)
        if all_rows:
            out = np.concatenate(rows).astype(np.float32, copy=False)
            self._last = out[-1]
            return out
        self._last = last.astype(np.float32, copy=False)
        return self._last

    def _chunk_len(self, position: int) -> int:
        """Tokens per forward: `prefill_chunk`, fewer deep in a long context so the attention scores
        [heads, chunk, position] stay under ~256 MB."""
        heads = max(1, int(getattr(self.args, "num_attention_heads", 1) or 1))
        return max(1, min(self.prefill_chunk, (1 << 28) // (4 * heads * (position + self.prefill_chunk))))

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Consume `token_ids` after what the cache holds; return the last logits [vocab] (float32)."""
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("prefill needs at least one token")
        return self._run(ids)

    def decode_step(self, token_id: int) -> np.ndarray:
        """Consume one id; return its logits [vocab]."""
        return self._run([int(token_id)])

    def decode_greedy(self, first_token: int, n: int) -> list[int]:
        """n greedy tokens: feed `first_token`, take the argmax, feed it back, ..."""
        out, tok = [], int(first_token)
        for _ in range(n):
            tok = greedy(self.decode_step(tok), self.domain)
            out.append(tok)
        return out

    def info(self) -> dict:
        """Backend and sizes for benchmarks (bytes)."""
        c = self.cache
        return {
            "backend": "numpy" if self.device == "cpu" else "cupy-reference",
            "device": self.device,
            "model_type": self.args.model_type,
            "weight_bytes": int(self.model.weight_bytes),
            "weight_bytes_per_token": self._bytes_per_token(),
            "state_bytes": int(getattr(c, "state_bytes", 0)),
            "kv_bytes_per_token": int(getattr(c, "kv_bytes_per_token", 0)),
            "position": self.position,
            "max_context": self.max_context,
            "vocab_size": self.args.vocab_size,
            "token_domain": self.domain,
        }

    def _bytes_per_token(self) -> int:
        per = getattr(self.model, "weight_bytes_per_token", None)
        if per is not None:
            return int(per)
        emb, head = getattr(self.model, "embedding", None), getattr(self.model, "head", None)
        total = int(self.model.weight_bytes)
        if emb is not None and head is not None and head is not emb:  # untied: one embedding row is read
            total -= emb.nbytes - emb.nbytes // emb.shape[0]
        return total

    def memory_bytes(self) -> int:
        """Weights plus the current cache contents."""
        return int(self.model.weight_bytes) + int(getattr(self.cache, "nbytes", 0))

    # --- high-level -------------------------------------------------------------------------------

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 logits [T, vocab] of every position of `token_ids` from a fresh cache (the engine's
        own sequence is left as it was)."""
        saved = (self.cache, self._tokens, self._last)
        try:
            self.cache, self._tokens, self._last = self._new_cache(), [], None
            return self._run([int(t) for t in token_ids], all_rows=True)
        finally:
            self.cache, self._tokens, self._last = saved

    def _resume(self, prompt: list[int]) -> np.ndarray:
        """Last logits of `prompt`, reusing the cache when it holds a prefix of it."""
        have = self._tokens
        common = 0
        for a, b in zip(have, prompt):
            if a != b:
                break
            common += 1
        if common == len(have) and common == len(prompt) and self._last is not None:
            return self._last
        if common == len(have) and common < len(prompt):
            return self._run(prompt[common:])
        if 0 < common and getattr(self.cache, "can_trim", self.args.model_type == "llama"):
            keep = min(common, len(prompt) - 1)
            self.cache.trim(keep)
            self._tokens = self._tokens[:keep]
            return self._run(prompt[keep:])
        self.reset()
        return self._run(prompt)

    def stream(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, *,
               cancel: threading.Event | None = None) -> Iterator[Response]:
        """Generate after `prompt_ids`, yielding `Response` records (see engine.generate)."""
        config = config or GenerationConfig()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise NinferError("empty prompt", "give the model some text")
        if self.max_context:
            room = self.max_context - len(prompt)
            if room <= 0:
                raise NinferError(f"the prompt ({len(prompt)} tokens) fills the context ({self.max_context})",
                                  "shorten the conversation or raise the context length")
            if config.max_tokens < 0 or config.max_tokens > room:
                config = dataclasses.replace(config, max_tokens=room)  # ends with "length" at the context edge
        sampler = make_sampler(config, domain=self.domain)
        stops = list(config.stop_token_ids)
        if self.tokenizer is not None and not config.ignore_eos:
            stops += list(getattr(self.tokenizer, "eos_token_ids", ()))
        if config.constraint is not None:
            from engine.constraints import new_matcher  # noqa: PLC0415

            # On a GPU the host waits on the device each step, so a worker thread computes the next mask
            # meanwhile; on NumPy the step keeps the cores busy and the mask (~0.02 ms) is cheaper inline.
            sampler.constraint = new_matcher(config.constraint, self.tokenizer, int(self.args.vocab_size), stops,
                                             overlap=self.device != "cpu")
        detok = self.tokenizer.detokenizer() if self.tokenizer is not None else None
        steps, spec = speculative_steps(self, prompt, config, sampler, cancel)
        out = stream_generate(_Resuming(self), prompt, config, sampler, detokenizer=detok,
                              stop_token_ids=stops, cancel=cancel, memory_fn=self.memory_bytes, steps=steps)
        return out if spec is None else with_stats(out, spec)


class _Resuming:
    """The protocol view stream_generate drives: prefill goes through prefix reuse."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def prefill(self, ids):
        return self.engine._resume(list(ids))

    def decode_step(self, tok):
        return self.engine.decode_step(tok)

    @property
    def decode_step_sparse(self):
        return getattr(self.engine, "decode_step_sparse", None)

    @property
    def decode_sampled(self):
        return getattr(self.engine, "decode_sampled", None)

    @property
    def decode_stream(self):
        return getattr(self.engine, "decode_stream", None)

    @property
    def decode_masked(self):
        return getattr(self.engine, "decode_masked", None)

    @property
    def position(self):
        return self.engine.position
