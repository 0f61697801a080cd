"""The MTP head (transformers does not run it) against a plain float64 formula of spec/model.md §1.6."""
import numpy as np
import pytest

from engine.config import ModelArgs
from engine.models.qwen3_5 import Model, random_weights
from tests.model.conftest import rel_l2

TOL = 1e-4


def _args(moe: bool) -> ModelArgs:
    cfg = dict(model_type="qwen3_5_moe_text" if moe else "qwen3_5_text", hidden_size=48, num_hidden_layers=2,
               vocab_size=200, layer_types=["linear_attention", "full_attention"], num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_key_head_dim=8,
               linear_num_value_heads=4, linear_value_head_dim=8, rope_parameters={"rope_theta": 1e6,
               "partial_rotary_factor": 0.5}, mtp_num_hidden_layers=1)
    cfg.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
    if not moe:
        cfg.update(num_experts=0, intermediate_size=40)
    return ModelArgs.from_config(cfg)


def _norm(x, w, eps=1e-6, offset=True):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * ((1 + w) if offset else w)


def _silu(x):
    return x / (1 + np.exp(-x))


def _plain_mtp(args, w, hidden, next_tokens, pos0=0):
    """Draft logits computed token by token in float64 with explicit loops; no engine code."""
    W = {k: v.astype(np.float64) for k, v in w.items() if k.startswith(("mtp/", "text/token", "text/output"))}
    p = "mtp/layers/0/"
    hq, hkv, d, r = args.num_attention_heads, args.num_key_value_heads, args.head_dim, args.rotary_dim
    e = _norm(W["text/token_embedding"][next_tokens], W["mtp/embedding_norm"])
    h = _norm(hidden.astype(np.float64), W["mtp/hidden_norm"])
    x = np.concatenate([e, h], 1) @ W["mtp/input_projection"].T
    n = _norm(x, W[p + "input_norm"])
    q = (n @ W[p + "attention/query"].T).reshape(-1, hq, d)
    g = n @ W[p + "attention/gate"].T
    k = (n @ W[p + "attention/key"].T).reshape(-1, hkv, d)
    v = (n @ W[p + "attention/value"].T).reshape(-1, hkv, d)
    q, k = _norm(q, W[p + "attention/query_norm"]), _norm(k, W[p + "attention/key_norm"])
    for arr in (q, k):
        for t in range(arr.shape[0]):
            for i in range(r // 2):
                phi = (pos0 + t) * args.rope_theta ** (-2 * i / r)
                a, b = arr[t, :, i].copy(), arr[t, :, i + r // 2].copy()
                arr[t, :, i], arr[t, :, i + r // 2] = a * np.cos(phi) - b * np.sin(phi), b * np.cos(phi) + a * np.sin(phi)
    att = np.zeros((x.shape[0], hq, d))
    for t in range(x.shape[0]):
        for hh in range(hq):
            s = k[: t + 1, hh // (hq // hkv)] @ q[t, hh] / np.sqrt(d)
            pr = np.exp(s - s.max())
            att[t, hh] = pr / pr.sum() @ v[: t + 1, hh // (hq // hkv)]
    x = x + (att.reshape(x.shape[0], -1) / (1 + np.exp(-g))) @ W[p + "attention/output"].T
    m = _norm(x, W[p + "post_attention_norm"])
    if args.is_moe:
        y = np.zeros_like(x)
        for t in range(x.shape[0]):
            logits = W[p + "moe/router"] @ m[t]
            pr = np.exp(logits - logits.max())
            pr /= pr.sum()
            top = np.argsort(-pr, kind="stable")[: args.num_experts_per_tok]
            for ex in top:
                pe = p + f"moe/experts/{ex}/"
                hid = _silu(W[pe + "gate"] @ m[t]) * (W[pe + "up"] @ m[t])
                y[t] += pr[ex] / pr[top].sum() * (W[pe + "down"] @ hid)
            sh = W[p + "moe/shared/down"] @ (_silu(W[p + "moe/shared/gate"] @ m[t]) * (W[p + "moe/shared/up"] @ m[t]))
            y[t] += sh / (1 + np.exp(-(W[p + "moe/shared_score"] @ m[t])[0]))
    else:
        y = (_silu(m @ W[p + "mlp/gate"].T) * (m @ W[p + "mlp/up"].T)) @ W[p + "mlp/down"].T
    x = x + y
    dh = _norm(x, W["mtp/final_norm"])
    head = W.get("text/output_head", W["text/token_embedding"])
    return dh @ head.T, dh


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_mtp_matches_plain_formula(moe):
    args = _args(moe)
    w = random_weights(args, seed=5)
    model = Model(args).load(w)
    tokens = np.random.default_rng(0).integers(0, args.vocab_size, 12)
    logits, hidden = model.forward(tokens, model.make_cache())
    draft, dh = model.mtp(hidden[:-1], tokens[1:], model.make_mtp_cache())
    want, want_h = _plain_mtp(args, w, hidden[:-1], tokens[1:])
    assert draft.shape == (11, args.vocab_size)
    assert rel_l2(draft, want) < TOL and rel_l2(dh, want_h) < TOL


def test_mtp_incremental_equals_one_shot():
    args = _args(False)
    model = Model(args).load(random_weights(args, seed=6))
    tokens = np.random.default_rng(1).integers(0, args.vocab_size, 10)
    _, hidden = model.forward(tokens)
    full, _ = model.mtp(hidden[:-1], tokens[1:], model.make_mtp_cache())
    cache = model.make_mtp_cache()
    parts = [model.mtp(hidden[:5], tokens[1:6], cache)[0]]
    parts += [model.mtp(hidden[i : i + 1], tokens[i + 1 : i + 2], cache)[0] for i in range(5, 9)]
    assert cache.position == 9
    assert rel_l2(np.concatenate(parts), full) < TOL


def test_mtp_uses_the_next_token_not_the_current_one():
    """Negative control: unshifted tokens give different drafts."""
    args = _args(False)
    model = Model(args).load(random_weights(args, seed=7))
    tokens = np.random.default_rng(2).integers(0, args.vocab_size, 8)
    _, hidden = model.forward(tokens)
    good, _ = model.mtp(hidden[:-1], tokens[1:])
    bad, _ = model.mtp(hidden[:-1], tokens[:-1])
    assert rel_l2(bad, good) > 1e-2


def test_the_proposal_head_drafts_the_best_shortlisted_id():
    """A proposal head (the target head's rows of a shortlist of ids, proposal_weights) drafts, from a draft hidden
    row, the shortlisted id with the largest target logit; without one the draft is the target head's argmax."""
    from engine.models.qwen3_5 import proposal_weights

    args = _args(False)
    w = random_weights(args, seed=8)
    full = Model(args).load(w)
    short = Model(args).load({**w, **proposal_weights(w, 64, seed=3)})
    ids = short.proposal[1]
    assert len(ids) == 64 == len(set(ids.tolist())) and ids.max() < args.vocab_size
    tokens = np.random.default_rng(4).integers(0, args.vocab_size, 10)
    _, hidden = full.forward(tokens)
    logits, d = full.mtp(hidden[:-1], tokens[1:])
    none, d2 = short.mtp(hidden[:-1], tokens[1:], logits=False)
    assert none is None and rel_l2(d2, d) < 1e-6
    hits = 0
    for row, lg in zip(d, logits):
        assert full.propose(row) == int(np.argmax(lg))
        assert short.propose(row) == int(ids[np.argmax(lg[ids])])
        hits += short.propose(row) == full.propose(row)
    assert hits < len(d)  # (a shortlist of 64 of 200 ids misses some of the full head's picks)
    with pytest.raises(ValueError, match="proposal head of 300 rows"):
        proposal_weights(w, 300)
