"""NumPy Qwen3.5 (dense and MoE) against logits transformers computed (dev/make_golden_qwen35.py)."""
import numpy as np
import pytest

from engine.models.qwen3_5 import Model, ModelArgs, hf_to_logical
from tests.model.conftest import rel_l2

TOL = 1e-4  # fp32 relative L2, issue 4


def _logical(cfg, hf_weights):
    out = {}
    for name, arr in hf_weights.items():
        for lname, a in hf_to_logical(name, arr, cfg):
            assert lname not in out, lname
            out[lname] = a
    return out


@pytest.fixture(scope="module")
def loaded(golden):
    kind, cfg, hf_weights, tokens, logits = golden
    args = ModelArgs.from_config(cfg)
    return kind, args, _logical(cfg, hf_weights), tokens, logits


def test_schedule_mixes_gdn_and_attention(loaded):
    _, args, _, _, _ = loaded
    assert args.layer_types == ("linear_attention", "full_attention", "linear_attention", "full_attention")


@pytest.mark.parametrize("gdn_mode", ["chunked", "recurrent"])
def test_full_forward_matches_transformers(loaded, gdn_mode):
    kind, args, w, tokens, ref_logits = loaded
    model = Model(args, gdn_mode=gdn_mode).load(w)
    out = model(tokens)
    assert out.shape == ref_logits.shape and out.dtype == np.float32
    errs = [rel_l2(out[t], ref_logits[t]) for t in range(len(tokens))]
    assert max(errs) < TOL, (kind, max(errs))


@pytest.mark.parametrize("split", [1, 17, 39])
def test_prefill_then_decode_matches_transformers(loaded, split):
    kind, args, w, tokens, ref_logits = loaded
    model = Model(args).load(w)
    cache = model.make_cache()
    rows = [model(tokens[:split], cache)]
    for t in tokens[split:]:
        rows.append(model([t], cache))
    out = np.concatenate(rows)
    assert cache.position == len(tokens)
    errs = [rel_l2(out[t], ref_logits[t]) for t in range(len(tokens))]
    assert max(errs) < TOL, (kind, split, max(errs))


def test_prefill_in_chunks_with_preallocated_cache(loaded):
    _, args, w, tokens, ref_logits = loaded
    model = Model(args).load(w)
    cache = model.make_cache(max_len=len(tokens))
    out = np.concatenate([model(tokens[i : i + 13], cache) for i in range(0, len(tokens), 13)])
    assert rel_l2(out, ref_logits) < TOL


def test_last_only_is_the_last_row(loaded):
    _, args, w, tokens, ref_logits = loaded
    model = Model(args).load(w)
    last = model(tokens, model.make_cache(), last_only=True)
    assert last.shape == (1, args.vocab_size)
    assert rel_l2(last[0], ref_logits[-1]) < TOL


def test_swapped_query_gate_is_detected(loaded):
    """Negative control: reading q_proj as [all queries | all gates] must break parity."""
    kind, args, w, tokens, ref_logits = loaded
    bad = dict(w)
    i = args.full_attention_layers[0]
    q, g = w[f"text/layers/{i}/attention/query"], w[f"text/layers/{i}/attention/gate"]
    both = np.concatenate([q.reshape(args.num_attention_heads, args.head_dim, -1),
                           g.reshape(args.num_attention_heads, args.head_dim, -1)], axis=1)
    flat = both.reshape(2 * q.shape[0], -1)
    bad[f"text/layers/{i}/attention/query"], bad[f"text/layers/{i}/attention/gate"] = flat[: q.shape[0]], flat[q.shape[0] :]
    out = Model(args).load(bad)(tokens)
    assert rel_l2(out, ref_logits) > 1e-2
