"""The prefill piece plan (engine.gpu_engine.piece_plan): whole chunks and at most one padded chunk."""
from engine.gpu_engine import PAD_MIN, piece_plan

SIZES = [64, 256, 512, 1024, 2048, 4096, 8192]


def test_plans_cover_the_prompt_with_few_chunks():
    for r in range(1, 8192, 37):
        plan = piece_plan(r, SIZES)
        assert sum(v for _, v in plan) <= r
        assert all(v <= m for m, v in plan) and sum(v < m for m, v in plan) <= 1
        assert all(v == m for m, v in plan[:-1])  # the padded chunk, if any, comes last
        if r >= PAD_MIN:  # only a short tail is left to the columns step
            assert r - sum(v for _, v in plan) < PAD_MIN
    assert piece_plan(2000, SIZES) == [(2048, 2000)]
    assert piece_plan(512, SIZES) == [(512, 512)]
    assert piece_plan(PAD_MIN - 1, SIZES) == []
