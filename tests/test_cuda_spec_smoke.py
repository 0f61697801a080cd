"""MTP speculation on the CUDA engine, its Python on the CPU (tests/fake_cupy.py: kernels are no-ops): the round and
fold graphs build for the plans of both GPU classes, and the loop keeps the sequence's bookkeeping (tokens,
position) to the columns each round commits, a stop inside a round included. The numbers: tests/gpu/test_spec_gpu.py."""
from collections import Counter

import numpy as np
import pytest

from cuda_smoke import CFG, cp, flat, moe_cfg, on_gpu  # noqa: F401

MTP_CFG = dict(CFG, mtp_num_hidden_layers=1)


def _engine(gpu, monkeypatch, cfg=MTP_CFG, proposal=0):
    from engine.config import ModelArgs
    from engine.gpu import weights as gpu_weights
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5 import random_weights

    on_gpu(monkeypatch, gpu)
    args = ModelArgs.from_config(cfg)
    recipe = "groupwise-int-moe" if args.is_moe else "groupwise-int"
    w = gpu_weights.from_logical(args, random_weights(args, seed=1, mtp=True, proposal=proposal), recipe=recipe)
    return build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0)


@pytest.mark.parametrize("gpu,proposal", [("sm_90", 0), ("sm_86", 0), ("sm_90", 300)])
def test_round_graph_holds_verify_fold_and_the_mtp_head(cp, gpu, proposal, monkeypatch):
    eng = _engine(gpu, monkeypatch, proposal=proposal)
    sp = eng.speculator(3)
    names = [getattr(op, "name", "gemv") for op in flat(sp.mtp.round_ops())]
    assert names.count("mtp_input") == 1 + 2  # the four caught-up rows in one pass, drafts 2 and 3
    assert names.count("spec_gather_row") == 1
    # the three drafts' heads: the proposal head's argmax mapped to its ids, or the target's argmax copied
    assert names.count("spec_map_id") == (3 if proposal else 0)
    assert names.count("argmax_step_mb") == 3
    if proposal:
        assert sp.mtp.plogits.shape == (1, proposal) and sp.mtp.phead.n == proposal
    verify = [getattr(op, "name", "gemv") for op in flat(sp.verify.ops)]
    n_gdn = sum(t != "full_attention" for t in eng.model.args.layer_types)
    assert verify.count("gdn_prep_verify") == verify.count("gdn_delta_verify") == n_gdn
    assert "gdn_delta_cols" not in verify and verify[-1] == "spec_accept"
    # the round folds inside the verification's GDN kernels; the fold alone (a stop inside a round) settles ctl[0]
    assert "gdn_fold" not in verify and "gdn_conv_fold" not in verify
    fold = sp.verify.fold_ops()
    names = [op.name for op in fold]
    assert names.count("gdn_fold") == names.count("gdn_conv_fold") == n_gdn and names[-1] == "spec_advance"
    assert int(fold[-1].args[-1]) == 1 and int(sp.verify.advance_op().args[-1]) == 0


def test_the_drafts_take_the_tables_forms_for_the_mtp_layers_shapes(cp, monkeypatch):
    """The one-token table's entries for the MTP layer's shapes reach its one-row drafts (input projection and the
    layer's GEMVs); the target's plan keeps only its own shapes."""
    from engine.gpu import kernel_names as KN

    fc = _engine("sm_90", monkeypatch).speculator(3).mtp.fc
    key = (fc.fmt, fc.n, fc.k)
    assert key not in KN.GEMV_TABLE
    monkeypatch.setitem(KN.GEMV_TABLE, key, dict(rows=1, unroll=2, splits=1, pre2=True))
    eng = _engine("sm_90", monkeypatch)
    mtp = eng.speculator(3).mtp
    assert mtp.ctx.gemv_cfg[key] == KN.GEMV_TABLE[key] and key not in eng.model.executor.plan.gemv_cfg()
    fcs = [op.__self__ for op in flat(mtp.round_ops()) if getattr(getattr(op, "__self__", None), "w", None) is mtp.fc]
    rows = [p for p in fcs if p.m == 1]  # (the catch-up's is the 4-column pass)
    assert len(rows) == 2 and all(p.rows == 1 and p.kname.startswith("gemv_rs_pre") for p in rows)


def test_the_loop_commits_what_its_consumer_takes(cp, monkeypatch):
    from engine.sampling import Sampler
    from engine.speculative import SpecStats, speculative_generate_step

    eng = _engine("sm_90", monkeypatch)
    sp = eng.speculator(3)
    sp.verify.out[...] = np.asarray([3, 11, 12, 13, 14], dtype=np.int32)  # every round: m = 3 (no kernel runs)
    stats = SpecStats(3)
    prompt = [1, 2, 3, 4, 5]
    gen = speculative_generate_step(eng, prompt, Sampler(temperature=0.0), k=3, max_tokens=9, stats=stats)
    out = list(gen)
    # the prompt's pick, the plain step's pick (the executor's tokens[0]: 0 here), then rounds of three
    assert len(out) == 9 and out[2:8] == [11, 12, 13, 11, 12, 13] and out[8] == 11
    assert stats.rounds == 3 and stats.accepted == 2 + 2 + 1 and stats.accepted_at == [3, 2, 0]
    # committed: the prompt, the first token, the plain step's pick and m columns a round, one of the last round
    assert eng.position == len(prompt) + 1 + 3 + 3 + 1 == len(eng._tokens)
    assert eng._tokens[len(prompt) + 1:] == [out[1], 11, 12, out[4], 11, 12, out[7]]
    assert int(sp.verify.ctl[0]) == 1  # the last fold ran with the columns taken


def _names(ops):
    return [getattr(op, "name", "gemv") for op in flat(ops)]


def test_a_round_graph_for_each_way_the_columns_pick(cp, monkeypatch):
    """Greedy, the histogram sampler and the top-k sampler over the K + 1 rows, each drawing at its column's own
    position (copied from the columns' positions: the samplers advance theirs) and ending in the same accept."""
    sp = _engine("sm_90", monkeypatch).speculator(3)
    tails = sp.verify.tails()
    assert set(sp.graphs) == set(tails) == {"greedy", "sample", "topk"}
    body = len(tails["greedy"]) - 2
    assert _names(tails["greedy"][body:]) == ["argmax_step_mb", "spec_accept"]
    assert _names(tails["sample"][body:]) == ["spec_copy_i32", "sample_max_mb", "sample_step_mb", "spec_accept"]
    # (the top-k sampler's penalties: a row of counts a column, kept by spec_counts around the draws and the accept)
    assert _names(tails["topk"][body:]) == ["spec_copy_i32", "spec_counts", "sample_topk_mb", "spec_accept",
                                            "spec_counts"]
    assert all(t[:body] == tails["greedy"][:body] for t in tails.values())


def test_the_round_graph_follows_the_sampler(cp, monkeypatch):
    from engine.device_sampling import pack_params, unpack_params

    sp = _engine("sm_90", monkeypatch).speculator(3)
    assert sp.round_graph(None) is sp.graph is sp.round_graph(pack_params(temperature=0.0))
    row = pack_params(temperature=0.8, top_k=20, seed=5)
    assert sp.round_graph(row) is sp.graphs["topk"]
    assert np.array_equal(np.asarray(sp.verify.sampler.sp_params), np.tile(row, (4, 1)))  # a row a column
    assert sp.round_graph(pack_params(temperature=0.8, top_p=0.9, seed=5)) is sp.graphs["sample"]
    assert unpack_params(np.asarray(sp.verify.sampler.sp_params)[3])["top_p"] == 0.9
    # penalties: the top-k sampler's rounds (a row of counts a column); the histogram sampler draws without them
    assert sp.round_graph(pack_params(temperature=0.8, top_k=20, presence=0.5)) is sp.graphs["topk"]
    with pytest.raises(ValueError, match="penalties"):
        sp.round_graph(pack_params(temperature=0.8, top_p=0.9, presence=0.5))


def test_sampled_rounds_run_and_penalties_decode_plainly(cp, monkeypatch):
    from engine.sampling import Sampler
    from engine.speculative import SpecStats, speculative_generate_step

    eng = _engine("sm_90", monkeypatch)
    sp = eng.speculator(3)
    sp.verify.out[...] = np.asarray([2, 21, 22, 23, 24], dtype=np.int32)
    stats = SpecStats(3)
    out = list(speculative_generate_step(eng, [1, 2, 3], Sampler(temperature=0.7, top_p=0.9, seed=3), k=3,
                                         max_tokens=6, stats=stats))
    assert out[2:] == [21, 22, 21, 22] and stats.rounds == 2
    stats = SpecStats(3)
    out = list(speculative_generate_step(eng, [1, 2, 3], Sampler(temperature=0.7, presence_penalty=0.5, seed=3), k=3,
                                         max_tokens=6, stats=stats))
    assert len(out) == 6 and stats.rounds == 0 and "penalties" in stats.as_dict()["plain"]  # (the host's draws)
    # with a top_k the rounds draw with the penalties, from the counts of the tokens generated before the first round
    stats = SpecStats(3)
    sampler = Sampler(temperature=0.7, top_k=20, presence_penalty=0.5, seed=3)
    out = list(speculative_generate_step(eng, [1, 2, 3], sampler, k=3, max_tokens=6, stats=stats))
    assert out[2:] == [21, 22, 21, 22] and stats.rounds == 2 and not stats.plain_why
    counts = np.asarray(sp.verify.sampler.sp_counts)
    first_two = Counter(out[:2])
    assert all((counts[:, t] == n).all() for t, n in first_two.items()) and counts.sum() == 4 * 2


@pytest.mark.parametrize("gpu", ["sm_90", "sm_86"])
def test_moe_verification_runs_every_row_through_the_routed_experts(cp, gpu, monkeypatch):
    """The MoE block over the K + 1 columns: the router and top-k for every row, the slots reordered with their rows'
    staged x (moe_cols_prep), one routed gate|up and one down launch over all K + 1 rows' slots."""
    cfg = dict(moe_cfg(), mtp_num_hidden_layers=1)
    eng = _engine(gpu, monkeypatch, cfg)
    sp = eng.speculator(3)
    n = len(eng.model.args.layer_types)
    verify = flat(sp.verify.ops)
    names = _names(sp.verify.ops)
    assert names.count("moe_cols_prep") == names.count("moe_route") == n
    assert not any(m.startswith("moe_fused") for m in names)
    prep = [op for op in verify if getattr(op, "name", "") == "moe_cols_prep"][0]
    assert prep.grid == (4 * 2,)  # K + 1 rows, 2 experts a token
    # the routed down: moe_down over the slots alone (the shared expert's down runs over the 4 rows beside it)
    downs = [op for op in verify if getattr(op, "name", "").startswith("moe_down")]
    assert len(downs) == n and all(op.grid[2] == 4 * 2 and int(op.args[-1]) == 4 * 2 for op in downs)
    assert verify[-1].name == "spec_accept"
    # the MTP head: the catch-up over the K + 1 columns in the columns form, the drafts 2..K one-token rows
    mtp = _names(sp.mtp.round_ops())
    assert mtp.count("moe_cols_prep") == 1 and sum(m.startswith("moe_fused") for m in mtp) == 2


def test_the_mtp_head_reads_the_prompt_and_follows_the_sequence_across_turns(cp, monkeypatch):
    """The prompt's final hidden rows are staged as the prefill hands them over and go through the MTP head when the
    first token is sampled (the last row's next one): 8 positions a pass below GEMM_MIN rows, else tensor-core chunks
    of GEMM_ROWS (a short one padded); the stream's end runs the MTP over the last round's columns, so a prompt that
    extends the sequence reuses it; after plain decode the next speculative turn prefills again."""
    from engine.generate import generate_step
    from engine.gpu import mtp_prompt
    from engine.sampling import Sampler
    from engine.speculative import speculative_generate_step

    eng = _engine("sm_90", monkeypatch)
    sp = eng.speculator(3)
    passes, chunks = [], []
    monkeypatch.setattr(sp.prompt.cols.graph, "launch", lambda stream=None: passes.append(1), raising=False)
    real_chunk = sp.prompt.gemm.run_chunk
    monkeypatch.setattr(sp.prompt.gemm, "run_chunk", lambda ids, start, valid=None: (
        chunks.append((start, valid)), real_chunk(ids, start, valid)))
    sp.verify.out[...] = np.asarray([2, 21, 22, 23, 24], dtype=np.int32)
    prompt = list(range(1, 22))  # 21 ids: two columns chunks of 8, then 5 decode steps
    out = list(speculative_generate_step(eng, prompt, Sampler(temperature=0.0), k=3, max_tokens=6))
    assert len(passes) == 3 and not chunks and sp.prompt.base > 21  # 21 rows (the last one's next: the first token)
    assert sp.follows(eng) and eng.position == len(eng._tokens) == 21 + len(out) - 1
    held = list(eng._tokens)
    passes.clear()
    more = held + [out[-1], 7, 8]
    list(speculative_generate_step(eng, more, Sampler(temperature=0.0), k=3, max_tokens=2))
    assert len(passes) == 1  # (prefix reuse: the three new positions only)
    list(generate_step(eng, more, Sampler(temperature=0.0), max_tokens=2))  # plain decode
    assert not sp.follows(eng)
    passes.clear()
    list(speculative_generate_step(eng, more, Sampler(temperature=0.0), k=3, max_tokens=2))
    assert len(passes) == -(-len(more) // 8)  # all of it again
    passes.clear()
    long = list(range(1, 1 + mtp_prompt.GEMM_ROWS + 100))
    for i in range(0, len(long), 200):  # prompt pieces as the engine's chunks would hand them over
        sp.prompt.absorb(eng.model.executor.ctx.xn.reshape(1, -1).repeat(200, 0), min(200, len(long) - i), i,
                         long[i + 1:i + 201])
    sp.prompt.flush(5)
    assert chunks == [(0, None), (mtp_prompt.GEMM_ROWS, 100)] and not passes and sp.prompt.done == len(long)
