"""Cache vs no cache on sequences longer than a GDN chunk (the golden sequence is 40 tokens)."""
import numpy as np
import pytest

from engine.config import ModelArgs
from engine.models.qwen3_5 import Model, random_weights
from tests.model.conftest import rel_l2

TOL = 1e-4
CFG = dict(model_type="qwen3_5_text", hidden_size=48, num_hidden_layers=3, vocab_size=97, intermediate_size=64,
           layer_types=["linear_attention", "full_attention", "linear_attention"], num_attention_heads=2,
           num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_key_head_dim=8,
           linear_num_value_heads=4, linear_value_head_dim=8, rope_parameters={"rope_theta": 1e7})


@pytest.fixture(scope="module")
def setup():
    args = ModelArgs.from_config(CFG)
    w = random_weights(args, seed=3)
    tokens = np.random.default_rng(4).integers(0, args.vocab_size, 150)
    ref = Model(args, gdn_mode="recurrent").load(w)(tokens)
    return args, w, tokens, ref


def test_chunked_prefill_equals_recurrent_across_chunks(setup):
    args, w, tokens, ref = setup
    assert rel_l2(Model(args).load(w)(tokens), ref) < TOL


@pytest.mark.parametrize("pieces", [[150], [64, 86], [63, 1, 1, 85], [100] + [1] * 50])
def test_any_split_of_prefill_and_decode_is_the_same(setup, pieces):
    args, w, tokens, ref = setup
    model = Model(args).load(w)
    cache = model.make_cache()
    out, i = [], 0
    for n in pieces:
        out.append(model(tokens[i : i + n], cache))
        i += n
    assert cache.position == 150
    assert rel_l2(np.concatenate(out), ref) < TOL


def test_cache_reset_and_state_sizes(setup):
    args, w, tokens, _ = setup
    model = Model(args).load(w)
    cache = model.make_cache()
    first = model(tokens[:10], cache)
    assert cache.kv_bytes == 10 * cache.kv_bytes_per_token == 10 * 2 * 1 * 32 * 4
    assert cache.state_bytes == 2 * (4 * (2 * 16 + 32) * 3 + 4 * 4 * 8 * 8)  # conv [C, K-1] + S [Hv, Dv, Dk]
    assert not cache.can_trim
    cache.reset()
    assert cache.position == 0 and cache.kv_bytes == 0
    assert rel_l2(model(tokens[:10], cache), first) < 1e-6
