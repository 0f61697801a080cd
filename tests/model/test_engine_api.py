"""engine.load / Engine: logits, low-level protocol, stream (stops, length, cancel, seeds, prefix reuse)."""
import threading

import numpy as np
import pytest

import engine
from engine.generate import GenerationConfig
from engine.models.qwen3_5 import hf_to_logical
from tests.model.conftest import load_golden, rel_l2

TOL = 1e-4


@pytest.fixture(scope="module")
def dense():
    cfg, hf, tokens, logits = load_golden("dense")
    weights = {n: a for k, v in hf.items() for n, a in hf_to_logical(k, v, cfg)}
    return cfg, weights, tokens, logits


@pytest.fixture()
def eng(dense):
    cfg, weights, _, _ = dense
    return engine.load({"config": cfg, "weights": weights}, device="cpu", prefill_chunk=16)


def test_logits_every_position(eng, dense):
    _, _, tokens, ref = dense
    out = eng.logits(tokens)
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert rel_l2(out, ref) < TOL
    assert eng.position == 0  # logits() leaves the engine's sequence alone


def test_prefill_decode_protocol(eng, dense):
    _, _, tokens, ref = dense
    last = eng.prefill(tokens[:30])
    assert eng.position == 30 and last.shape == (ref.shape[1],)
    assert rel_l2(last, ref[29]) < TOL
    for i in range(30, 40):
        assert rel_l2(eng.decode_step(int(tokens[i])), ref[i]) < TOL
    info = eng.info()
    assert info["backend"] == "numpy" and info["weight_bytes"] > 0 and info["state_bytes"] > 0
    emb = dense[1]["text/token_embedding"]
    assert info["weight_bytes_per_token"] == info["weight_bytes"] - emb.nbytes + emb.nbytes // emb.shape[0]
    assert info["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4  # 2 attention layers x K,V x 2 heads x 32 x fp32
    eng.reset()
    assert eng.position == 0


def test_decode_greedy_feeds_back_argmax(eng, dense):
    _, _, tokens, _ = dense
    eng.prefill(tokens[:10])
    got = eng.decode_greedy(int(tokens[10]), 6)
    seq = list(tokens[:11])
    for _ in range(6):
        seq.append(int(np.argmax(eng.logits(seq)[-1])))
    assert got == seq[11:]


def _collect(stream):
    recs = list(stream)
    return [r.token for r in recs if r.token is not None and r.finish_reason in (None, "length")], recs


def test_stream_greedy_length_and_stats(eng, dense):
    _, _, tokens, _ = dense
    toks, recs = _collect(eng.stream(tokens[:12], GenerationConfig(max_tokens=5, temperature=0.0)))
    assert len(toks) == 5 and recs[-1].finish_reason == "length"
    assert all(r.finish_reason is None for r in recs[:-1])
    assert recs[-1].prompt_tokens == 12 and recs[-1].generation_tokens == 5
    assert recs[-1].prompt_tps > 0 and recs[-1].memory > 0
    eng2 = engine.load({"config": dense[0], "weights": dense[1]}, device="cpu")
    first = int(np.argmax(eng2.prefill(tokens[:12])))
    assert toks == [first] + eng2.decode_greedy(first, 4)


def test_stream_seeded_sampling_is_reproducible(eng, dense):
    _, _, tokens, _ = dense
    cfg = GenerationConfig(max_tokens=12, temperature=1.0, top_p=0.95, seed=1234)
    a, _ = _collect(eng.stream(tokens[:8], cfg))
    eng.reset()
    b, _ = _collect(eng.stream(tokens[:8], cfg))
    c, _ = _collect(eng.stream(tokens[:8], GenerationConfig(max_tokens=12, temperature=1.0, top_p=0.95, seed=99)))
    assert a == b and a != c


def test_stream_stop_token(eng, dense):
    _, _, tokens, _ = dense
    greedy, _ = _collect(eng.stream(tokens[:12], GenerationConfig(max_tokens=6, temperature=0.0)))
    stop = greedy[3]
    first = greedy.index(stop)
    toks, recs = _collect(eng.stream(tokens[:12], GenerationConfig(max_tokens=6, temperature=0.0,
                                                                     stop_token_ids=(stop,))))
    assert toks == greedy[:first]
    assert recs[-1].finish_reason == "stop" and recs[-1].token == stop


def test_stream_cancel_between_tokens(eng, dense):
    _, _, tokens, _ = dense
    cancel = threading.Event()
    recs = []
    for r in eng.stream(tokens[:12], GenerationConfig(max_tokens=50, temperature=0.0), cancel=cancel):
        recs.append(r)
        if len(recs) == 3:
            cancel.set()
    assert len(recs) == 4 and recs[-1].finish_reason == "cancelled" and recs[-1].token is None
    assert eng.position == 12 + 2  # the third token was never fed back


def test_prefix_reuse_gives_the_same_tokens(eng, dense):
    _, _, tokens, _ = dense
    cfg = GenerationConfig(max_tokens=4, temperature=0.0)
    first, _ = _collect(eng.stream(tokens[:10], cfg))
    pos = eng.position
    follow = list(tokens[:10]) + first + [int(tokens[20])]
    again, _ = _collect(eng.stream(follow, cfg))
    assert eng.position == len(follow) + 3  # only the new tail was prefilled
    assert pos == 10 + 3
    fresh = engine.load({"config": dense[0], "weights": dense[1]}, device="cpu")
    want, _ = _collect(fresh.stream(follow, cfg))
    assert again == want
    # a prompt that diverges from the cached sequence starts over (GDN state cannot be trimmed)
    other, _ = _collect(eng.stream(list(tokens[:5]) + [int(tokens[30])], cfg))
    want2, _ = _collect(fresh.stream(list(tokens[:5]) + [int(tokens[30])], cfg))
    assert other == want2


class _CharTokenizer:
    """id i <-> chr(ord('a') + i % 26); enough to test text assembly and stop strings."""

    eos_token_ids = ()

    def detokenizer(self):
        class D:
            def add(self, t):
                return chr(ord("a") + t % 26)

            def flush(self):
                return ""

        return D()


def test_stop_string_cuts_text(dense):
    cfg, weights, tokens, _ = dense
    e = engine.load({"config": cfg, "weights": weights, "tokenizer": _CharTokenizer()}, device="cpu")
    recs = list(e.stream(tokens[:12], GenerationConfig(max_tokens=8, temperature=0.0)))
    text = "".join(r.text for r in recs)
    assert len(text) == 8
    stop = text[3:5]
    e.reset()
    recs = list(e.stream(tokens[:12], GenerationConfig(max_tokens=8, temperature=0.0, stop_strings=(stop,))))
    assert recs[-1].finish_reason == "stop"
    assert "".join(r.text for r in recs) == text[: text.index(stop)]


def test_load_errors():
    from engine.errors import NinferError

    with pytest.raises(NinferError):
        engine.load("/nonexistent/model.ninfer", device="cpu")
    with pytest.raises(NinferError):
        engine.load({"config": {"model_type": "gpt2", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 8},
                     "weights": {}}, device="cpu")


def _llama_weights(rng, h=32, layers=2, heads=4, kv=2, inter=48, vocab=64):
    d = h // heads
    w = {"text/token_embedding": rng.standard_normal((vocab, h)).astype(np.float32) / 4,
         "text/final_norm": np.ones(h, np.float32)}
    for i in range(layers):
        p = f"text/layers/{i}/"
        shapes = {"attention/query": (heads * d, h), "attention/key": (kv * d, h), "attention/value": (kv * d, h),
                  "attention/output": (h, heads * d), "mlp/gate": (inter, h), "mlp/up": (inter, h),
                  "mlp/down": (h, inter)}
        w |= {p + k: (rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32) for k, s in shapes.items()}
        w[p + "input_norm"] = w[p + "post_attention_norm"] = np.ones(h, np.float32)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 128}
    return cfg, w


def test_llama_dispatch_and_kv_prefix_trim():
    from engine.models import llama

    cfg, w = _llama_weights(np.random.default_rng(0))
    e = engine.load({"config": cfg, "weights": w}, device="cpu")
    assert isinstance(e.model, llama.Model)
    ids = [3, 9, 27, 5, 11, 40, 2]
    full = e.logits(ids)
    assert full.shape == (7, 64)
    gcfg = GenerationConfig(max_tokens=3, temperature=0.0)
    a, _ = _collect(e.stream(ids, gcfg))
    # diverging prompt on a pure-KV model: the cache is trimmed to the common prefix, not rebuilt
    b, _ = _collect(e.stream(ids[:4] + [1, 2], gcfg))
    fresh = engine.load({"config": cfg, "weights": w}, device="cpu")
    assert b == _collect(fresh.stream(ids[:4] + [1, 2], gcfg))[0]
    assert len(a) == 3


def test_load_from_artifact_file(tmp_path, dense):
    from engine.artifact.container import write_artifact

    cfg, weights, tokens, ref = dense
    tensors = [(n, "fp32", "contiguous_le_v1", a.shape, np.ascontiguousarray(a, np.float32)) for n, a in weights.items()]
    path = write_artifact(tmp_path / "tiny.ninfer", {"text": {"config": cfg}}, tensors)
    e = engine.load(str(path), device="cpu")
    assert e.tokenizer is None
    assert rel_l2(e.logits(tokens), ref) < TOL


def test_moe_bytes_per_token_count_only_routed_experts():
    cfg, hf, _, _ = load_golden("moe")
    w = {n: a for k, v in hf.items() for n, a in hf_to_logical(k, v, cfg)}
    info = engine.load({"config": cfg, "weights": w}, device="cpu").info()
    expert = sum(a.nbytes for n, a in w.items() if "/moe/experts/" in n)
    emb = w["text/token_embedding"]
    unread = expert * (1 - cfg["num_experts_per_tok"] / cfg["num_experts"])
    want = info["weight_bytes"] - emb.nbytes + emb.nbytes // emb.shape[0] - unread
    assert abs(info["weight_bytes_per_token"] - want) <= 8


def test_generation_stops_with_length_at_the_context_edge(dense):
    from engine.errors import NinferError

    cfg, weights, tokens, _ = dense
    e = engine.load({"config": cfg, "weights": weights}, device="cpu", max_context=16)
    toks, recs = _collect(e.stream(tokens[:12], GenerationConfig(max_tokens=100, temperature=0.0)))
    assert len(toks) == 4 and recs[-1].finish_reason == "length"
    with pytest.raises(NinferError):
        next(iter(e.stream(tokens[:16], GenerationConfig(max_tokens=5))))
    with pytest.raises(NinferError):
        e.prefill(tokens[:17].tolist())


def test_interrupted_forward_resets_the_sequence(eng, dense, monkeypatch):
    _, _, tokens, ref = dense
    eng.prefill(tokens[:10])
    calls = {"n": 0}
    real = eng.model.__class__.__call__

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(eng.model.__class__, "__call__", flaky)
    with pytest.raises(KeyboardInterrupt):
        eng.prefill(tokens[10:40])  # chunk 1 runs, chunk 2 is interrupted
    monkeypatch.undo()
    assert eng.position == 0
    out = list(eng.stream(tokens[:20], GenerationConfig(max_tokens=1, temperature=0.0)))
    assert out[0].token == int(np.argmax(ref[19]))
