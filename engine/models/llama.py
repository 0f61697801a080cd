"""Llama (SmolLM2, the embedded default model): RMSNorm, GQA attention with NeoX RoPE, SwiGLU MLP.

Same contract as `qwen3_5.py`: `ModelArgs`, `Model(args)`, `Model.load(weights)`, `Model.make_cache()`,
`Model(tokens, cache) -> logits`. Weights are float32, `[out, in]`, q/k rows in Hugging Face order.

The NumPy decode path is the product on machines without a GPU, so weights are copied once into
anonymous memory with q|k|v and gate|up fused, the KV cache is preallocated in the layout attention
reads (`[Hkv, S, D]`), the RoPE table is computed once, and per token only small vectors are allocated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from engine.ops import ref

F32 = np.float32


@dataclass(frozen=True)
class ModelArgs:
    """Geometry of a Llama text model (HF `LlamaConfig` names)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192
    model_type: str = "llama"

    @classmethod
    def from_config(cls, config: Mapping) -> "ModelArgs":
        """From an HF-style config dict (`config.json` or an artifact's text component config)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        rope = config.get("rope_parameters") or {}
        return cls(
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            vocab_size=int(config["vocab_size"]),
            head_dim=int(config.get("head_dim") or hidden // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            rope_theta=float(config.get("rope_theta") or rope.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
            max_position_embeddings=int(config.get("max_position_embeddings", 8192)),
        )


class KVCache:
    """Per-layer K/V, `[layers, Hkv, capacity, D]`, growing by doubling up to `max_len`; `position` is the next
    position. Growing instead of reserving `max_len` matters: NumPy backs big arrays with 2 MiB huge pages,
    so a first write into each (layer, head) row of an 8k reservation zeroed ~360 MiB and cost ~0.8 s of
    time to first token."""

    _START = 256

    def __init__(self, args: ModelArgs, max_len: int, xp=np):
        self.xp = xp
        self.max_len = int(max_len)
        self._shape = (args.num_hidden_layers, args.num_key_value_heads, args.head_dim)
        cap = min(self.max_len, self._START)
        self.k = xp.zeros(self._shape[:2] + (cap, self._shape[2]), F32)
        self.v = xp.zeros_like(self.k)
        self.position = 0

    def reserve(self, end: int) -> None:
        """Make room for positions [0, end) (end <= max_len), keeping what is stored."""
        cap = self.k.shape[2]
        if end <= cap:
            return
        while cap < end:
            cap *= 2
        cap = min(cap, self.max_len)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = self.xp.zeros(self._shape[:2] + (cap, self._shape[2]), F32)
            new[:, :, :self.position] = old[:, :, :self.position]
            setattr(self, name, new)

    def reset(self) -> None:
        """Forget every position (the buffers are reused)."""
        self.position = 0

    def trim(self, length: int) -> None:
        """Keep only the first `length` positions."""
        self.position = min(self.position, max(0, length))

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one position takes, all layers."""
        return 2 * self.k.shape[0] * self.k.shape[1] * self.k.shape[3] * 4

    @property
    def kv_bytes(self) -> int:
        """KV bytes in use."""
        return self.position * self.kv_bytes_per_token

    state_bytes = 0

    @property
    def nbytes(self) -> int:
        """KV bytes in use (the reserved buffers are touched only as far as they are used)."""
        return self.kv_bytes


class Model:
    """A Llama decoder on NumPy."""

    def __init__(self, args: ModelArgs, xp=np, fuse: bool | None = None):
        self.args = args
        self.xp = xp
        self.fuse = True if fuse is None else fuse
        self.layers: list[dict[str, np.ndarray]] = []
        self.embedding: np.ndarray | None = None
        self.head: np.ndarray | None = None
        self.final_norm: np.ndarray | None = None
        half = args.head_dim // 2
        self._inv_freq = 1.0 / (args.rope_theta ** (np.arange(0, args.head_dim, 2, dtype=np.float64) / args.head_dim))
        self._rope_len = 0
        self._cos = self._sin = np.zeros((0, half), F32)

    def load(self, weights: Mapping[str, np.ndarray]) -> "Model":
        """Take logical parameters (`text/...`) as float32 arrays (fusing q|k|v and gate|up when `fuse`)."""
        a, xp = self.args, self.xp

        def get(name):
            # A private copy, not a view of the artifact's memory map: decode streams every weight once per
            # token, and through the map's 4 KiB file pages it ran 3x slower than from anonymous memory
            # (which NumPy backs with huge pages) on the dev box: 4.8 vs 14.8 tok/s per CPU-second.
            return xp.array(weights[name], dtype=F32, copy=True, order="C")

        self.embedding = get("text/token_embedding")
        self.final_norm = get("text/final_norm")
        self.head = self.embedding if a.tie_word_embeddings or "text/output_head" not in weights else get("text/output_head")
        self.layers = []
        for i in range(a.num_hidden_layers):
            p = f"text/layers/{i}/"
            layer = {"input_norm": get(p + "input_norm"), "post_norm": get(p + "post_attention_norm"),
                     "o": get(p + "attention/output"), "down": get(p + "mlp/down")}
            qkv = [p + f"attention/{n}" for n in ("query", "key", "value")]
            gate_up = [p + "mlp/gate", p + "mlp/up"]
            if self.fuse:  # concatenate straight from the source: one copy, not two
                layer["qkv"] = xp.concatenate([xp.asarray(weights[n], dtype=F32) for n in qkv])
                layer["gate_up"] = xp.concatenate([xp.asarray(weights[n], dtype=F32) for n in gate_up])
            else:
                layer.update(zip(("q", "k", "v", "gate", "up"), (get(n) for n in qkv + gate_up)))
            self.layers.append(layer)
        return self

    def make_cache(self, max_len: int | None = None) -> KVCache:
        """A fresh KV cache for up to `max_len` positions (default: the model's context)."""
        return KVCache(self.args, int(max_len or self.args.max_position_embeddings), self.xp)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the float32 weights the decode loop reads (tied head counted once)."""
        total = sum(w.nbytes for layer in self.layers for w in layer.values())
        total += self.embedding.nbytes + self.final_norm.nbytes
        return total + (0 if self.head is self.embedding else self.head.nbytes)

    def _rope_table(self, end: int):
        if end > self._rope_len:
            n = max(end, 2 * self._rope_len, 256)
            ang = np.arange(n, dtype=np.float64)[:, None] * self._inv_freq[None, :]
            self._cos = self.xp.asarray(np.cos(ang).astype(F32))
            self._sin = self.xp.asarray(np.sin(ang).astype(F32))
            self._rope_len = n
        return self._cos, self._sin

    def __call__(self, tokens, cache: KVCache | None = None, *, last_only: bool = False):
        """Logits `[T, vocab]` (or `[1, vocab]` with `last_only`) for `tokens` at the cache's positions."""
        a, xp = self.args, self.xp
        tokens = np.asarray(tokens.get() if hasattr(tokens, "get") else tokens, dtype=np.int64).reshape(-1)
        t = tokens.shape[0]
        cache = cache if cache is not None else self.make_cache(t)
        start = cache.position
        if start + t > cache.max_len:
            from engine.errors import NinferError

            raise NinferError(f"context full: {start + t} tokens > {cache.max_len}",
                              "start a new chat (/clear) or raise the context length")
        cache.reserve(start + t)
        hq, hkv, d = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        cos_t, sin_t = self._rope_table(start + t)
        cos, sin = cos_t[start:start + t, None, :], sin_t[start:start + t, None, :]
        scale = F32(1.0 / np.sqrt(d))
        x = self.embedding[xp.asarray(tokens)]  # [T, H]
        eps = a.rms_norm_eps
        with np.errstate(over="ignore"):  # exp(-gate) may overflow to inf in silu: the result is then 0, as it should
            for li, layer in enumerate(self.layers):
                h = _rmsnorm(xp, x, layer["input_norm"], eps)
                if self.fuse:
                    qkv = _mm(h, layer["qkv"])  # [T, (Hq + 2 Hkv) D]
                    q, k, v = qkv[:, :hq * d], qkv[:, hq * d:(hq + hkv) * d], qkv[:, (hq + hkv) * d:]
                else:
                    q, k, v = _mm(h, layer["q"]), _mm(h, layer["k"]), _mm(h, layer["v"])
                q = _rope(xp, q.reshape(t, hq, d), cos, sin)
                k = _rope(xp, k.reshape(t, hkv, d), cos, sin)
                cache.k[li, :, start:start + t] = k.transpose(1, 0, 2)
                cache.v[li, :, start:start + t] = v.reshape(t, hkv, d).transpose(1, 0, 2)
                o = _attend(xp, q, cache.k[li, :, :start + t], cache.v[li, :, :start + t], scale, start)
                x = x + _mm(o.reshape(t, hq * d), layer["o"])
                h = _rmsnorm(xp, x, layer["post_norm"], eps)
                if self.fuse:
                    gu = _mm(h, layer["gate_up"])
                    gate, up = gu[:, :a.intermediate_size], gu[:, a.intermediate_size:]
                else:
                    gate, up = _mm(h, layer["gate"]), _mm(h, layer["up"])
                x = x + _mm(gate / (1.0 + xp.exp(-gate)) * up, layer["down"])
        cache.position = start + t
        if last_only:
            x = x[-1:]
        return _mm(_rmsnorm(xp, x, self.final_norm, eps), self.head)


def _mm(x, w):
    """x[T, K] @ w[N, K].T; one row goes through gemv on the row-major weight (reads it ~1.6x faster)."""
    if x.shape[0] == 1:
        return (w @ x[0])[None]
    return x @ w.T


def _rmsnorm(xp, x, w, eps):
    """Plain RMSNorm (weight not offset); `ref.rmsnorm(..., offset=False)` with fewer temporaries."""
    ms = (x * x).sum(axis=-1, keepdims=True) * F32(1.0 / x.shape[-1])
    return x * (1.0 / xp.sqrt(ms + F32(eps))) * w


def _rope(xp, x, cos, sin):
    """NeoX split-half RoPE on x[T, H, D] with cos/sin [T, 1, D/2] (same math as `ref.rope`)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _attend(xp, q, k, v, scale, start):
    """Causal GQA: q[T, Hq, D], k/v[Hkv, S, D] (cache layout), query t at position start + t -> [T, Hq, D]."""
    t, hq, d = q.shape
    hkv, s, _ = k.shape
    g = hq // hkv
    qg = q.reshape(t, hkv, g, d).transpose(1, 2, 0, 3).reshape(hkv, g * t, d)
    scores = (qg @ k.transpose(0, 2, 1)) * scale  # [Hkv, G*T, S]
    if t > 1:
        allowed = xp.arange(s)[None, :] <= (start + xp.arange(t))[:, None]  # [T, S]
        scores = xp.where(xp.tile(allowed, (g, 1))[None], scores, F32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    xp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = scores @ v  # [Hkv, G*T, D]
    return out.reshape(hkv, g, t, d).transpose(2, 0, 1, 3).reshape(t, hq, d)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> HF split-half order)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {
    "attn_norm": "input_norm", "ffn_norm": "post_attention_norm",
    "attn_q": "attention/query", "attn_k": "attention/key", "attn_v": "attention/value",
    "attn_output": "attention/output", "ffn_gate": "mlp/gate", "ffn_up": "mlp/up", "ffn_down": "mlp/down",
}


def config_from_gguf(reader) -> dict:
    """HF-style `LlamaConfig` dict from a llama GGUF's metadata."""
    def f(key, default=None):
        field = reader.fields.get(f"llama.{key}")
        return default if field is None else field.contents()

    heads = int(f("attention.head_count"))
    hidden = int(f("embedding_length"))
    names = {t.name for t in reader.tensors}
    vocab = f("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].contents())
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": int(f("feed_forward_length")),
        "num_hidden_layers": int(f("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(f("attention.head_count_kv", heads)),
        "head_dim": int(f("rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(f("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(f("rope.freq_base", 10000.0)), "vocab_size": int(vocab),
        "max_position_embeddings": int(f("context_length", 8192)),
        "tie_word_embeddings": "output.weight" not in names,
    }


def weights_from_gguf(reader):
    """Yield `(logical name, float32 [out, in] array)` from a llama GGUF (dequantized, q/k unpermuted)."""
    from gguf.quants import dequantize

    config = config_from_gguf(reader)
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(F32, copy=False)
        w = w.reshape([int(n) for n in reversed(t.shape)])
        name = t.name.removesuffix(".weight")
        if name == "token_embd":
            yield "text/token_embedding", w
        elif name == "output_norm":
            yield "text/final_norm", w
        elif name == "output":
            yield "text/output_head", w
        elif name.startswith("blk."):
            _, idx, kind = name.split(".", 2)
            if kind == "attn_q":
                w = unpermute_qk(w, config["num_attention_heads"])
            elif kind == "attn_k":
                w = unpermute_qk(w, config["num_key_value_heads"])
            if kind in _GGUF_NAMES:
                yield f"text/layers/{idx}/{_GGUF_NAMES[kind]}", w


def load_gguf(path, xp=np) -> tuple[Model, dict]:
    """A ready `Model` and its config straight from a llama GGUF file (tests, dev tools)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    config = config_from_gguf(reader)
    model = Model(ModelArgs.from_config(config), xp).load(dict(weights_from_gguf(reader)))
    return model, config


def from_artifact(artifact, xp=np) -> Model:
    """A ready `Model` from an opened v3 artifact whose text config is a Llama."""
    args = ModelArgs.from_config(artifact.components["text"]["config"])
    names = [n for n in artifact.bindings if n.startswith("text/")]
    return Model(args, xp).load({n: artifact.parameter(n) for n in names})


def is_llama(config: Mapping) -> bool:
    """Whether an HF-style config describes a Llama (what `engine.load` dispatches on)."""
    archs = config.get("architectures") or []
    return config.get("model_type") == "llama" or "LlamaForCausalLM" in archs
