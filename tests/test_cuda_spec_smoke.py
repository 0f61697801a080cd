"""MTP speculation on the CUDA engine, its Python on the CPU (tests/fake_cupy.py: kernels are no-ops): the round and
fold graphs build for the plans of both GPU classes, and the loop keeps the sequence's bookkeeping (tokens,
position) to the columns each round commits, a stop inside a round included. The numbers: tests/gpu/test_spec_gpu.py."""
import numpy as np
import pytest

from cuda_smoke import CFG, cp, flat, on_gpu  # noqa: F401

MTP_CFG = dict(CFG, mtp_num_hidden_layers=1)


def _engine(gpu, monkeypatch):
    from engine.config import ModelArgs
    from engine.gpu import weights as gpu_weights
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5 import random_weights

    on_gpu(monkeypatch, gpu)
    args = ModelArgs.from_config(MTP_CFG)
    w = gpu_weights.from_logical(args, random_weights(args, seed=1, mtp=True))
    return build_engine(args, w, MTP_CFG, max_context=256, prefill_cols=8, prefill_gemm=0)


@pytest.mark.parametrize("gpu", ["sm_90", "sm_86"])
def test_round_graph_holds_verify_fold_and_the_mtp_head(cp, gpu, monkeypatch):
    eng = _engine(gpu, monkeypatch)
    sp = eng.speculator(3)
    names = [getattr(op, "name", "gemv") for op in flat(sp.mtp.round_ops())]
    assert names.count("mtp_input") == 4 + 2  # four caught-up rows, drafts 2 and 3
    assert names.count("spec_gather_row") == 1
    verify = [getattr(op, "name", "gemv") for op in flat(sp.verify.ops)]
    n_gdn = sum(t != "full_attention" for t in eng.model.args.layer_types)
    assert verify.count("gdn_prep_verify") == verify.count("gdn_delta_verify") == n_gdn
    assert "gdn_delta_cols" not in verify and verify[-1] == "spec_accept_greedy"
    fold = [op.name for op in sp.verify.fold_ops()]
    assert fold.count("gdn_fold") == fold.count("gdn_conv_fold") == n_gdn and fold[-1] == "spec_advance"


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
