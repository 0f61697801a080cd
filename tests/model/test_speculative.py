"""Speculative decoding on the NumPy engine: greedy identity with plain decode (MTP head, oracle drafts with
chosen corruptions), ReplaySSM fold against token-by-token decode, stops inside a round, the context edge."""
import threading

import numpy as np
import pytest

from engine.api import Engine
from engine.cache import GDNState, KVCache
from engine.errors import NinferError
from engine.generate import GenerationConfig
from engine.models.qwen3_5 import Model, random_weights
from engine.models.replay_ssm import Verification
from engine.speculative import MTPDrafter, SpecStats, forced_draft, parse_spec, speculative_generate_step
from engine.sampling import Sampler
from tests.model.conftest import rel_l2
from tests.model.test_mtp import _args

PROMPT = [5, 17, 33, 2, 9]
TOL = 1e-5


@pytest.fixture(scope="module", params=["dense", "moe", "dense-shortlist"])
def model(request):
    """The tiny dense and MoE models; "dense-shortlist" drafts with a proposal head of 96 of its 200 ids."""
    args = _args(request.param == "moe")
    return Model(args).load(random_weights(args, seed=1, proposal=96 if "shortlist" in request.param else 0))


@pytest.fixture(scope="module")
def dense():
    args = _args(False)
    return Model(args).load(random_weights(args, seed=1))


def _engine(model, **kw) -> Engine:
    return Engine(model, {}, device="cpu", **kw)


def _greedy(**kw) -> GenerationConfig:
    return GenerationConfig(temperature=0.0, **kw)


def _plain(model, n, prompt=PROMPT) -> list[int]:
    return [r.token for r in _engine(model).stream(prompt, _greedy(max_tokens=n))]


def _assert_same_sequence(a: Engine, b: Engine):
    """Two engines hold the same consumed ids, positions, KV and GDN state (to float tolerance)."""
    assert a.position == b.position and a._tokens == b._tokens
    for x, y in zip(a.cache.layers, b.cache.layers):
        if isinstance(x, GDNState):
            assert rel_l2(x.recurrent, y.recurrent) < TOL and rel_l2(x.conv, y.conv) < TOL
        else:
            assert x.length == y.length == a.position
            assert rel_l2(x._k[: x.length], y._k[: y.length]) < TOL
    assert rel_l2(a._last, b._last) < TOL


class Oracle:
    """Drafts the target's own greedy continuation `ref`, corrupting draft position `bad` (1-based) of every
    round; records the drafts it gave."""

    def __init__(self, ref, prompt_len, vocab, bad=0):
        self.ref, self.p, self.vocab, self.bad = ref, prompt_len, vocab, bad
        self.calls = []

    def __call__(self, tokens, k):
        j = len(tokens) - self.p  # tokens[-1] is ref[j - 1]
        assert tokens[self.p :] == self.ref[:j]
        out = list(self.ref[j : j + k])
        if self.bad:
            out[self.bad - 1] = (out[self.bad - 1] + 1) % self.vocab
        self.calls.append(out)
        return out


# --- greedy identity --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_with_the_mtp_head_equals_plain_decode(model, k):
    want = _plain(model, 24)
    eng = _engine(model)
    recs = list(eng.stream(PROMPT, _greedy(max_tokens=24, spec=f"mtp:{k}")))
    assert [r.token for r in recs] == want
    st = recs[-1].spec
    assert st.rounds > 0 and st.drafted == k * st.rounds and sum(st.accepted_at) == st.accepted
    assert recs[-1].finish_reason == "length"
    ref = _engine(model)
    ref.prefill(PROMPT + want[:-1])
    _assert_same_sequence(eng, ref)


@pytest.mark.parametrize("bad", [0, 1, 2, 3], ids=["accept-all", "reject@1", "reject@2", "reject@3"])
def test_oracle_drafts_accept_exactly_the_prefix_before_the_corruption(dense, bad):
    k, n = 3, 17
    want = _plain(dense, n + k + 1)
    oracle = Oracle(want, len(PROMPT), dense.args.vocab_size, bad)
    eng, stats = _engine(dense), SpecStats(k)
    got = list(speculative_generate_step(eng, PROMPT, Sampler(temperature=0.0), k=k, max_tokens=n, draft=oracle,
                                         stats=stats))
    assert got == want[:n]
    accepted = k if bad == 0 else bad - 1
    assert stats.rounds == -(-(n - 1) // (accepted + 1))
    full = stats.rounds - 1  # the last round is cut by max_tokens
    assert stats.accepted_at[:accepted] >= [full] * accepted and stats.accepted_at[accepted:] == [0] * (k - accepted)
    assert stats.tokens_per_round == pytest.approx(1 + stats.accepted / stats.rounds)
    ref = _engine(dense)
    ref.prefill(PROMPT + want[: n - 1])
    _assert_same_sequence(eng, ref)


@pytest.mark.parametrize("accept", [(1.0, 1.0, 1.0), (0.88, 0.77, 0.67), (0.0, 0.0, 0.0)])
def test_forced_drafts_with_the_mtp_head_running_keep_greedy_identity(dense, accept):
    """forced_draft over the plain continuation, with the MTP head still run every round (mtp=True): output
    equals plain greedy, and all-or-nothing acceptance shows in the counters."""
    k, n = 3, 40
    want = _plain(dense, n + k + 1)
    eng, stats = _engine(dense), SpecStats(k)
    ran = []
    orig = MTPDrafter.__call__

    def spy(self, tokens, k):
        ran.append(len(tokens))
        return orig(self, tokens, k)

    MTPDrafter.__call__ = spy
    try:
        got = list(speculative_generate_step(eng, PROMPT, Sampler(temperature=0.0), k=k, max_tokens=n, mtp=True,
                                             draft=forced_draft(want, len(PROMPT), accept, seed=0), stats=stats))
    finally:
        MTPDrafter.__call__ = orig
    assert got == want[:n]
    assert len(ran) == stats.rounds > 0  # the head drafted every round, its proposals overridden
    if accept[0] == 1.0:
        assert stats.accepted_at[:2] == [stats.rounds] * 2  # (the last round may be cut by max_tokens)
    elif accept[0] == 0.0:
        assert stats.accepted == 0 and stats.rounds == n - 1
    else:
        assert 0 < stats.accepted < stats.drafted


def test_mtp_drafts_follow_the_sequence_across_streams(dense):
    """Each round's MTP drafts equal a from-scratch pass (shifted tokens, the target's hidden states, then
    autoregressive steps): with all drafts overridden to be accepted (several committed columns a round), in
    a second turn that extends the cached sequence, and in a third that diverges from it (a fresh prefill)."""
    k = 3
    seen = []
    orig = MTPDrafter.__call__

    def spy(self, tokens, k):
        out = orig(self, tokens, k)
        kv = self.mtp_cache[0]
        seen.append((list(tokens), out, kv._k[: kv.length].copy(), kv._v[: kv.length].copy()))
        return out

    def turn(eng, prompt, n):
        ref = _plain(dense, n + k + 1, prompt)
        oracle = Oracle(ref, len(prompt), dense.args.vocab_size)
        stats = SpecStats(k)
        got = list(speculative_generate_step(eng, prompt, Sampler(temperature=0.0), k=k, max_tokens=n,
                                             draft=oracle, mtp=True, stats=stats))
        assert got == ref[:n] and stats.rounds == -(-(n - 1) // (k + 1))  # every draft accepted
        return got

    eng = _engine(dense)
    MTPDrafter.__call__ = spy
    try:
        first = turn(eng, PROMPT, 9)
        cache = eng.cache
        second = PROMPT + first + [7, 8]
        turn(eng, second, 6)
        assert eng.cache is cache  # the second turn extended the sequence instead of starting over
        turn(eng, PROMPT[:3] + [99, 98], 6)
        assert eng.cache is not cache
    finally:
        MTPDrafter.__call__ = orig
    assert len(seen) >= 6 and any(len(t[0]) > len(second) for t in seen)
    for tokens, drafts, keys, values in seen:
        _, hidden = dense.forward(np.asarray(tokens[:-1]))
        mcache = dense.make_mtp_cache()
        logits, h = dense.mtp(hidden, tokens[1:], mcache)
        kv = mcache[0]
        assert keys.shape[0] == kv.length == len(tokens) - 1  # the MTP KV of (h_t, x_t+1) for every t
        assert rel_l2(keys, kv._k[: kv.length]) < TOL and rel_l2(values, kv._v[: kv.length]) < TOL
        want = [int(np.argmax(logits[-1]))]
        for _ in range(k - 1):
            logits, h = dense.mtp(h[-1:], want[-1:], mcache)
            want.append(int(np.argmax(logits[-1])))
        assert drafts == want


# --- ReplaySSM ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [0, 1, 2, 3, 4])
def test_fold_of_m_columns_equals_feeding_them_one_by_one(model, m):
    ids = [11, 42, 7, 99]
    spec, step = _engine(model), _engine(model)
    spec.prefill(PROMPT)
    step.prefill(PROMPT)
    before = [(c.conv.copy(), c.recurrent.copy()) for c in spec.cache.layers if isinstance(c, GDNState)]
    ver = Verification(model, ids, spec.cache)
    after = [(c.conv, c.recurrent) for c in spec.cache.layers if isinstance(c, GDNState)]
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(before, after))
    assert spec.position == len(PROMPT)
    assert all(c.length == len(PROMPT) for c in spec.cache.layers if isinstance(c, KVCache))
    rows = [step.decode_step(t) for t in ids]
    assert rel_l2(ver.logits, np.stack(rows)) < TOL  # the verify columns are the decode steps' logits
    step = _engine(model)
    step.prefill(PROMPT + ids[:m])
    assert ver.commit(m)
    spec._tokens.extend(ids[:m])
    spec._last = ver.logits[m - 1] if m else step._last
    _assert_same_sequence(spec, step)
    assert not ver.commit(m)  # once only


def test_commit_after_the_cache_moved_on_changes_nothing(dense):
    eng = _engine(dense)
    eng.prefill(PROMPT)
    ver = Verification(dense, [1, 2, 3], eng.cache)
    eng.decode_step(4)
    state = [c.recurrent.copy() for c in eng.cache.layers if isinstance(c, GDNState)]
    assert not ver.commit(2)
    assert eng.position == len(PROMPT) + 1
    assert all(np.array_equal(a, c.recurrent) for a, c in zip(state, [c for c in eng.cache.layers
                                                                       if isinstance(c, GDNState)]))


# --- stops inside a round ------------------------------------------------------------------------------------


class Letters:
    """Detokenizer stand-in: id -> one letter."""

    def add(self, tok):
        return chr(ord("a") + tok % 26)

    def flush(self):
        return ""


class LetterTokenizer:
    eos_token_ids = ()

    def detokenizer(self):
        return Letters()


def _stop_cases(ref, k):
    """(label, config kwargs, cancel-after) for a stop at each position of the first two rounds."""
    cases = []
    for s in range(1, 2 * k + 3):  # ref[0] comes from the prompt; round r yields ref[(r-1)(k+1)+1 ...]
        cases.append((f"max_tokens@{s}", {"max_tokens": s + 1}, None))
        cases.append((f"cancel@{s}", {"max_tokens": 40}, s + 1))
        if ref[s] not in ref[:s]:
            cases.append((f"stop_id@{s}", {"max_tokens": 40, "stop_token_ids": (ref[s],)}, None))
        text = "".join(chr(ord("a") + t % 26) for t in ref[: s + 1])
        if text[-2:] not in text[:-1]:
            cases.append((f"stop_str@{s}", {"max_tokens": 40, "stop_strings": (text[-2:],)}, None))
    return cases


def _run(eng, prompt, cfg, cancel_after):
    cancel = threading.Event()
    out = []
    for r in eng.stream(prompt, cfg, cancel=cancel):
        out.append((r.token, r.text, r.finish_reason))
        if cancel_after and len(out) == cancel_after:
            cancel.set()
    return out


def test_a_stop_inside_a_round_commits_exactly_the_tokens_before_it(dense):
    """Oracle drafts accept everything, so the stops land at every position of a round (and the bonus); the
    records, the consumed ids and the cache equal plain decode's, and the sequence continues correctly."""
    k = 3
    ref = _plain(dense, 12)
    cases = _stop_cases(ref, k)
    assert sum(c[0].startswith("stop_id") for c in cases) >= k + 1
    import engine.speculative as spec_mod

    real = spec_mod.speculative_generate_step
    long = _plain(dense, 40)
    assert long[:12] == ref

    def with_oracle(*a, **kw):
        return real(*a, **kw, draft=Oracle(long, len(PROMPT), dense.args.vocab_size))

    spec_mod.speculative_generate_step = with_oracle
    try:
        for label, kw, cancel_after in cases:
            plain, spec = _engine(dense), _engine(dense)
            plain.tokenizer = spec.tokenizer = LetterTokenizer()
            want = _run(plain, PROMPT, _greedy(**kw), cancel_after)
            got = _run(spec, PROMPT, _greedy(**kw, spec=f"mtp:{k}"), cancel_after)
            assert got == want, label
            _assert_same_sequence(spec, plain)
            more = [3, 141]
            spec.prefill(more)
            fresh = _engine(dense).logits(spec._tokens)
            assert rel_l2(spec._last, fresh[-1]) < 1e-4, label
    finally:
        spec_mod.speculative_generate_step = real


def test_closing_the_stream_mid_round_commits_what_was_consumed(dense):
    ref = _plain(dense, 10)
    eng = _engine(dense)
    steps = speculative_generate_step(eng, PROMPT, Sampler(temperature=0.0), k=4,
                                      draft=Oracle(ref, len(PROMPT), dense.args.vocab_size))
    got = [next(steps) for _ in range(4)]  # the prompt's token, then 3 of round one's 5
    steps.close()
    assert got == ref[:4] and eng._tokens == PROMPT + ref[:3]
    step = _engine(dense)
    step.prefill(PROMPT + ref[:3])
    _assert_same_sequence(eng, step)


# --- context edge -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 5])
def test_the_context_edge_falls_back_to_plain_steps(dense, k):
    edge = 16
    want = [r.token for r in _engine(dense, max_context=edge).stream(PROMPT, _greedy(max_tokens=-1))]
    assert len(want) == edge - len(PROMPT)
    eng = _engine(dense, max_context=edge)
    recs = list(eng.stream(PROMPT, _greedy(max_tokens=-1, spec=f"mtp:{k}")))
    assert [r.token for r in recs] == want and recs[-1].finish_reason == "length"
    st = recs[-1].spec
    assert 1 <= st.plain_steps <= k and st.rounds >= 1
    assert eng.position == edge - 1


# --- configuration ------------------------------------------------------------------------------------------


def test_parse_spec():
    assert parse_spec("off") == ("off", 0)
    assert parse_spec("mtp:3") == ("mtp", 3) and parse_spec(" MTP:5 ") == ("mtp", 5)
    assert parse_spec("mtp") == ("mtp", 3)
    for bad in ("mtp:0", "mtp:6", "mtp:x", "mtp:", "dflash:3", "on", "3"):
        with pytest.raises(NinferError) as e:
            parse_spec(bad)
        assert "\n" not in str(e.value) and e.value.next_action


def test_spec_is_refused_where_it_cannot_run(dense):
    assert GenerationConfig().spec == "off"
    args = _args(False)
    bare = Model(args).load(random_weights(args, seed=2, mtp=False))
    with pytest.raises(NinferError, match="needs a model with an MTP head"):
        _engine(bare).stream(PROMPT, _greedy(spec="mtp:3"))
    with pytest.raises(NinferError, match="not built for this engine"):
        Engine(dense, {}, device="gpu").stream(PROMPT, _greedy(spec="mtp:3"))
    with pytest.raises(NinferError):
        _engine(dense).stream(PROMPT, _greedy(spec="mtp:9"))
    recs = list(_engine(bare).stream(PROMPT, _greedy(max_tokens=3)))
    assert recs[-1].spec is None


def test_sampled_speculation_is_reproducible_from_its_seed(dense):
    cfg = GenerationConfig(max_tokens=12, temperature=0.8, top_p=0.9, seed=11, spec="mtp:2")
    runs = [[r.token for r in _engine(dense).stream(PROMPT, cfg)] for _ in range(2)]
    other = [r.token for r in _engine(dense).stream(PROMPT, GenerationConfig(**{**cfg.__dict__, "seed": 12}))]
    assert runs[0] == runs[1] and runs[0] != other
