"""MTP speculation on the CUDA engine (engine/gpu/verify.py, engine/gpu_spec.py) against plain greedy decode on the
same engine: a tiny Qwen3.5 with the real head sizes and a random MTP head (which rejects almost everything), and
oracle drafts (the plain continuation, corrupted at a chosen position) that accept all or reject at each position.
Greedy speculation must give plain decode's tokens exactly, commit the columns it yields (the fold equals the step
by step state) and leave a sequence that plain decode continues; the tiny MoE config the same. Sampled rounds:
test_spec_sampling_gpu.py."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from engine.synthetic import TINY_CUDA  # noqa: E402

CFG = dict(TINY_CUDA, mtp_num_hidden_layers=1)
PROMPT = [11, 305, 7, 42, 999, 3, 87, 150]
N = 40


SHORTLIST = 512  # rows of the proposal head of `short_eng` (of the 1,000 ids)


def _dense(proposal=0):
    from engine.config import ModelArgs
    from engine.gpu import weights as gpu_weights
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5 import random_weights

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, random_weights(args, seed=7, mtp=True, proposal=proposal))
    return build_engine(args, w, CFG, max_context=512, prefill_gemm=0)


@pytest.fixture(scope="module")
def eng():
    return _dense()


@pytest.fixture(scope="module")
def short_eng():
    """The dense model with a proposal head: the MTP drafts from a shortlist of the target head's rows."""
    return _dense(SHORTLIST)


@pytest.fixture(scope="module")
def moe_eng():
    """The tiny MoE config (8 experts, 2 a token) with an MTP head whose layer is a MoE block too."""
    from engine.config import ModelArgs
    from engine.gpu import weights as gpu_weights
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5 import random_weights
    from test_gpu_engine import MOE_CFG  # (tests/gpu is on sys.path under pytest)

    cfg = dict(MOE_CFG, mtp_num_hidden_layers=1)
    args = ModelArgs.from_config(cfg)
    w = gpu_weights.from_logical(args, random_weights(args, seed=7, mtp=True), recipe="groupwise-int-moe")
    return build_engine(args, w, cfg, max_context=512, prefill_gemm=0)


def _plain(eng, prompt, n, sampler=None):
    from engine.generate import generate_step
    from engine.sampling import Sampler

    eng.reset()
    return list(generate_step(eng, prompt, sampler or Sampler(temperature=0.0), max_tokens=n))


def _spec(eng, prompt, n, k=3, draft=None, sampler=None):
    from engine.sampling import Sampler
    from engine.speculative import SpecStats, speculative_generate_step

    eng.reset()
    stats = SpecStats(k)
    out = list(speculative_generate_step(eng, prompt, sampler or Sampler(temperature=0.0), k=k, max_tokens=n,
                                         draft=draft, stats=stats))
    return out, stats


def _oracle(prompt, cont, corrupt_at=None, vocab=CFG["vocab_size"]):
    """Drafts from the plain continuation `cont` (cont[j]: the token at position len(prompt) + j); draft position
    `corrupt_at` (1-based) replaced by another id every round."""
    def draft(tokens, k):
        start = len(tokens) - len(prompt)  # the drafts are the tokens after the last one in `tokens`
        out = [cont[start + i] if start + i < len(cont) else 0 for i in range(k)]
        if corrupt_at is not None:
            out[corrupt_at - 1] = (out[corrupt_at - 1] + 1) % vocab
        return out
    return draft


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculation_equals_plain_decode(eng, k):
    plain = _plain(eng, PROMPT, N)
    out, stats = _spec(eng, PROMPT, N, k=k)
    assert out == plain
    assert stats.rounds > 0 and stats.drafted == k * stats.rounds


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculation_with_the_proposal_head_equals_plain_decode(short_eng, k):
    plain = _plain(short_eng, PROMPT, N)
    out, stats = _spec(short_eng, PROMPT, N, k=k)
    assert out == plain
    assert stats.rounds > 0 and stats.drafted == k * stats.rounds
    sp = short_eng.speculator(k)
    assert sp.mtp.phead is not None and set(sp.drafted.get().tolist()) <= set(sp.mtp.pids.get().tolist())


def test_oracle_drafts_accept_everything_and_the_fold_equals_the_steps(eng):
    plain = _plain(eng, PROMPT, N)
    states = [{key: L[key].get() for key in ("state", "conv_state") if key in L} for L in eng.model.executor.layers]
    pos = eng.position
    out, stats = _spec(eng, PROMPT, N, draft=_oracle(PROMPT, plain))
    assert out == plain
    # every round takes all three drafts (the last one as far as max_tokens lets it)
    assert min(stats.accepted_at) >= stats.rounds - 1 and stats.rounds <= -(-(N - 2) // 4) + 1, stats.as_dict()
    assert eng.position == pos
    for L, ref in zip(eng.model.executor.layers, states):
        for key, want in ref.items():
            # (decode takes the cluster delta rule and the conv in the projection's epilogue, the fold the columns
            # kernels: the same arithmetic in another order, ~1e-3 apart after 40 tokens)
            np.testing.assert_allclose(L[key].get(), want, rtol=1e-2, atol=5e-3)


@pytest.mark.parametrize("at", [1, 2, 3])
def test_oracle_drafts_rejected_at_each_position(eng, at):
    plain = _plain(eng, PROMPT, N)
    out, stats = _spec(eng, PROMPT, N, draft=_oracle(PROMPT, plain, corrupt_at=at))
    assert out == plain
    assert stats.accepted_at[at - 1:] == [0] * (3 - at + 1)
    assert min(stats.accepted_at[:at - 1], default=stats.rounds) >= stats.rounds - 1


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_a_stop_inside_a_round_leaves_a_sequence_plain_decode_continues(eng, n):
    plain = _plain(eng, PROMPT, n + 12)
    out, _ = _spec(eng, PROMPT, n, draft=_oracle(PROMPT, plain))
    assert out == plain[:n] and eng.position == len(PROMPT) + n - 1
    from engine.generate import generate_step
    from engine.sampling import Sampler

    # the engine holds PROMPT + out[:-1]: feeding the last token continues the sequence
    more = list(generate_step(eng, out[-1:], Sampler(temperature=0.0), max_tokens=12))
    assert more == plain[n:n + 12]


def test_the_context_edge_falls_back_to_plain_steps(eng):
    from engine.sampling import Sampler
    from engine.speculative import SpecStats, speculative_generate_step

    long = [int(t) for t in np.random.default_rng(1).integers(0, CFG["vocab_size"], 496)]
    plain = _plain(eng, long, 14)  # (to position 509 of 512)
    eng.reset()
    stats = SpecStats(3)
    out = list(speculative_generate_step(eng, long, Sampler(temperature=0.0), k=3, max_tokens=14, stats=stats))
    assert out == plain[:len(out)] and stats.plain_steps > 1


@pytest.mark.parametrize("k", [1, 3])
def test_moe_greedy_speculation_equals_plain_decode(moe_eng, k):
    """The MoE block over the verified columns (every row's experts, moe_cols_prep): MTP drafts, and oracle drafts
    that accept everything or are rejected at the second position."""
    plain = _plain(moe_eng, PROMPT, N)
    out, stats = _spec(moe_eng, PROMPT, N, k=k)
    assert out == plain and stats.rounds > 0
    out, stats = _spec(moe_eng, PROMPT, N, k=k, draft=_oracle(PROMPT, plain))
    assert out == plain and min(stats.accepted_at) >= stats.rounds - 1
    if k > 1:
        out, stats = _spec(moe_eng, PROMPT, N, k=k, draft=_oracle(PROMPT, plain, corrupt_at=2))
        assert out == plain and stats.accepted_at[1:] == [0] * (k - 1)


@pytest.mark.parametrize("model,length", [("dense", 37), ("dense", 150), ("moe", 150), ("shortlist", 37)])
def test_the_mtp_head_drafts_what_the_reference_drafts(request, monkeypatch, model, length):
    """The MTP head on the GPU (the prompt's rows through it 8 positions a pass, the catch-up rows, the drafts) against
    the NumPy reference (Model.forward's final hidden rows of the whole sequence, then Model.mtp over all of them) on
    the same stored weights: with oracle drafts every round accepts all, so round i verifies from generated token
    1 + 4i, and its first draft is the MTP's pick after the sequence up to that token. They agree at 75% of the rounds
    or more (a near tie among random logits may go either way; an MTP that missed the prompt or read another position
    would agree about never). A prompt of 37 takes the 8-position passes over it, one of 150 a tensor-core chunk."""
    from engine.config import ModelArgs
    from engine.gpu import weights as gpu_weights
    from engine.models.qwen3_5 import Model, random_weights
    from test_gpu_engine import MOE_CFG

    eng = request.getfixturevalue({"dense": "eng", "moe": "moe_eng", "shortlist": "short_eng"}[model])
    cfg, recipe = (CFG, "groupwise-int") if model != "moe" else (dict(MOE_CFG, mtp_num_hidden_layers=1),
                                                                 "groupwise-int-moe")
    proposal = SHORTLIST if model == "shortlist" else 0
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, CFG["vocab_size"], length)]
    plain = _plain(eng, prompt, N)
    sp = eng.speculator(3)
    gpu, real_round = [], sp.round

    def recorded(drafts=None, params=None):
        out = real_round(drafts, params)
        gpu.append(int(sp.drafted[0].get()))
        return out

    monkeypatch.setattr(sp, "round", recorded)
    out, stats = _spec(eng, prompt, N, draft=_oracle(prompt, plain))
    assert out == plain and min(stats.accepted_at) >= stats.rounds - 1
    args = ModelArgs.from_config(cfg)
    model = Model(args).load(gpu_weights.as_stored(random_weights(args, seed=7, mtp=True, proposal=proposal), recipe))
    ref = []
    for i in range(len(gpu) - 1):  # (the last round may stop short of all four)
        f = 1 + 4 * i
        seq = prompt + plain[:f]  # the target's consumed ids; plain[f] is the verified round's first
        _, hidden = model.forward(np.asarray(seq), model.make_cache())
        _, d = model.mtp(hidden, seq[1:] + [plain[f]], model.make_mtp_cache(), logits=False)
        ref.append(model.propose(d[-1], CFG["vocab_size"]))
    assert len(ref) >= 4 and sum(a == b for a, b in zip(gpu, ref)) >= 0.75 * len(ref), (gpu, ref)
