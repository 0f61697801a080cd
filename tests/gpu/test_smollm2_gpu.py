"""`--device gpu` for the default model's architecture: the Llama file on CuPy arrays (engine.load falls back to
it, the CUDA decode engine being Qwen-only) matches the NumPy run on a small random Llama."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

CFG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
       "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
       "vocab_size": 300, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
       "max_position_embeddings": 128}


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    h, m = CFG["hidden_size"], CFG["intermediate_size"]
    w = {"text/token_embedding": rng.standard_normal((CFG["vocab_size"], h)).astype(np.float32),
         "text/final_norm": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)}
    for i in range(CFG["num_hidden_layers"]):
        p = f"text/layers/{i}/"
        for name, shape in (("attention/query", (64, h)), ("attention/key", (32, h)), ("attention/value", (32, h)),
                            ("attention/output", (h, 64)), ("mlp/gate", (m, h)), ("mlp/up", (m, h)),
                            ("mlp/down", (h, m))):
            w[p + name] = (0.15 * rng.standard_normal(shape)).astype(np.float32)
        w[p + "input_norm"] = np.ones(h, np.float32)
        w[p + "post_attention_norm"] = np.ones(h, np.float32)
    return w


def test_llama_on_cupy_matches_numpy():
    import engine

    w = _weights()
    cpu = engine.load({"config": CFG, "weights": w}, device="cpu")
    gpu = engine.load({"config": CFG, "weights": w}, device="gpu")
    assert gpu.device == "gpu" and "cupy" in type(gpu.model.embedding).__module__
    ids = [5, 17, 42, 99, 3, 250, 7]
    ref, got = cpu.logits(ids), gpu.logits(ids)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4
    first = int(np.argmax(ref[-1]))
    cpu.reset()
    gpu.reset()
    cpu.prefill(ids)
    gpu.prefill(ids)
    assert gpu.decode_greedy(first, 16) == cpu.decode_greedy(first, 16)
