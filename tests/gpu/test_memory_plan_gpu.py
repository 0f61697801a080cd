"""The memory plan against what the CUDA engine really allocates (full-size synthetic 27B, ~17 GB)."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_plan_matches_the_pool_after_capture(kv):
    import cupy as cp

    from engine import memory_plan as mp
    from engine.config import ModelArgs
    from engine.synthetic import build_engine, geometry_config

    ctx = 32768
    args = ModelArgs.from_config(geometry_config("qwen3.8-27b"))
    plan = mp.plan_memory(args, mp.weights_from_recipe(args, "groupwise-int-w8head"), kv=kv, prefill_chunk=0,
                          **mp.engine_prefill_executors())
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()
    eng = build_engine("qwen3.8-27b", max_context=ctx, kv=kv)
    eng.decode_step(1)  # captures the graph
    cp.cuda.Device().synchronize()
    used = pool.used_bytes() - before
    expected = plan.needed(ctx) - mp.GRAPH_POOL  # graphs live outside CuPy's pool
    assert abs(used - expected) < 0.005 * expected, (used, expected, [(i.name, i.bytes) for i in plan.items(ctx)])
    del eng
    pool.free_all_blocks()
