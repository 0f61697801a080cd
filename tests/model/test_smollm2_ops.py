"""The Llama file's fast RoPE and cache-layout attention equal the reference ops (engine.ops.ref), and a
tiny random Llama gives the same logits fused and unfused, in one pass and token by token."""
import numpy as np
import pytest

from engine.models import llama
from engine.ops import ref


def test_rope_matches_reference():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3, 16)).astype(np.float32)
    model = llama.Model(llama.ModelArgs(hidden_size=48, intermediate_size=8, num_hidden_layers=1,
                                        num_attention_heads=3, num_key_value_heads=1, vocab_size=10, head_dim=16,
                                        rope_theta=10000.0))
    cos, sin = model._rope_table(12)
    got = llama._rope(np, x, cos[5:12, None], sin[5:12, None])
    np.testing.assert_allclose(got, ref.rope(x, np.arange(5, 12), 16, 10000.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t, start", [(1, 0), (1, 9), (6, 0), (4, 5)])
def test_attention_matches_reference(t, start):
    rng = np.random.default_rng(t + start)
    hq, hkv, d = 6, 2, 8
    s = start + t
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    k = rng.standard_normal((s, hkv, d)).astype(np.float32)
    v = rng.standard_normal((s, hkv, d)).astype(np.float32)
    got = llama._attend(np, q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), np.float32(d ** -0.5), start)
    np.testing.assert_allclose(got, ref.attention(q, k, v, d ** -0.5, q_start=start), rtol=1e-5, atol=1e-5)


def _tiny():
    args = llama.ModelArgs(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=50, head_dim=8, max_position_embeddings=64)
    rng = np.random.default_rng(1)
    w = {"text/token_embedding": rng.standard_normal((50, 32)), "text/final_norm": 1 + 0.1 * rng.standard_normal(32)}
    for i in range(2):
        p = f"text/layers/{i}/"
        w.update({p + "input_norm": 1 + 0.1 * rng.standard_normal(32), p + "post_attention_norm": np.ones(32),
                  p + "attention/query": rng.standard_normal((32, 32)) * 0.2,
                  p + "attention/key": rng.standard_normal((16, 32)) * 0.2,
                  p + "attention/value": rng.standard_normal((16, 32)) * 0.2,
                  p + "attention/output": rng.standard_normal((32, 32)) * 0.2,
                  p + "mlp/gate": rng.standard_normal((48, 32)) * 0.2, p + "mlp/up": rng.standard_normal((48, 32)) * 0.2,
                  p + "mlp/down": rng.standard_normal((32, 48)) * 0.2})
    return args, w


def test_fused_unfused_and_incremental_agree():
    args, w = _tiny()
    ids = [3, 14, 15, 9, 26, 5, 35]
    plain = llama.Model(args, fuse=False).load(w)
    fused = llama.Model(args, fuse=True).load(w)
    full = plain(ids)
    np.testing.assert_allclose(fused(ids), full, rtol=1e-5, atol=1e-5)
    cache = plain.make_cache(16)
    steps = np.concatenate([plain(ids[:3], cache)] + [plain([t], cache) for t in ids[3:]])
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)
    assert cache.position == len(ids) and cache.kv_bytes == len(ids) * cache.kv_bytes_per_token
    cache.trim(3)  # prefix reuse: drop the tail, run it again
    np.testing.assert_allclose(plain(ids[3:], cache), full[3:], rtol=1e-5, atol=1e-5)


def test_context_overflow_is_a_user_error():
    from engine.errors import NinferError

    args, w = _tiny()
    m = llama.Model(args).load(w)
    with pytest.raises(NinferError, match="context full"):
        m(list(range(10)), m.make_cache(8))


def test_cache_grows_and_keeps_its_contents(monkeypatch):
    monkeypatch.setattr(llama.KVCache, "_START", 2)
    args, w = _tiny()
    m = llama.Model(args).load(w)
    ids = [(7 * i + 3) % 50 for i in range(13)]
    full = m(ids, m.make_cache(13))
    cache = m.make_cache(13)
    assert cache.k.shape[2] == 2
    steps = np.concatenate([m(ids[:3], cache)] + [m([t], cache) for t in ids[3:]])
    assert cache.k.shape[2] == 13  # 2 -> 4 -> 8 -> 16, capped at max_len
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)
