"""The memory plan against what the CUDA engine really allocates (full-size synthetic 27B, ~17 GB)."""
import gc

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_plan_matches_the_pool_after_capture(kv):
    """The plan (decode step, columns step, KV) is what the pool holds; the tensor-core prefill, which
    the engine adds by default only in memory the plan leaves free, stays within its planned bound."""
    import cupy as cp

    from engine.gpu import memory as mp
    from engine.config import ModelArgs
    from engine.gpu.memory import PREFILL_COLS
    from engine.synthetic import build_engine, geometry_config

    ctx = 32768
    args = ModelArgs.from_config(geometry_config("qwen3.8-27b"))
    plan = mp.plan_memory(args, mp.weights_from_recipe(args, "groupwise-int-w8head"), kv=kv, prefill_chunk=0,
                          # (the CUDA engine uploads the MTP head the geometry has, and its proposal head)
                          optional=("mtp", "draft_head"),
                          **mp.engine_prefill_executors())
    pool = cp.get_default_memory_pool()

    def used_by(**kw):
        gc.collect()
        pool.free_all_blocks()
        before = pool.used_bytes()
        eng = build_engine("qwen3.8-27b", max_context=ctx, kv=kv, **kw)
        eng.decode_step(1)  # captures the graph
        cp.cuda.Device().synchronize()
        used, chunk = pool.used_bytes() - before, eng.model.gemm_chunk
        del eng
        gc.collect()
        pool.free_all_blocks()
        return used, chunk

    used, _ = used_by(prefill_gemm=0)
    expected = plan.needed(ctx) - mp.GRAPH_POOL  # graphs live outside CuPy's pool
    assert abs(used - expected) < 0.005 * expected, (used, expected, [(i.name, i.bytes) for i in plan.items(ctx)])
    used_auto, chunk = used_by()
    assert chunk > 0  # an H200 has the room
    bound = mp.prefill_executor_bytes(args, PREFILL_COLS, chunk) - mp.prefill_executor_bytes(args, PREFILL_COLS, 0)
    assert 0.5 * bound < used_auto - used <= bound, (used_auto - used, bound, chunk)
