"""The memory plan's arithmetic against hand-computed figures (model.md §1.11, runtime.md §3.2-3.5),
the published inventories, the context ladder, and the errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import memory_budget as mb
from engine.gpu import memory as mp
from engine.config import ModelArgs
from engine.errors import NinferError
from engine.synthetic import geometry_config

GIB, MIB = 2**30, 2**20
DATA = Path("/work/shared/data")


@pytest.fixture(scope="module")
def a27():
    return ModelArgs.from_config(geometry_config("qwen3.8-27b"))


@pytest.fixture(scope="module")
def a35():
    return ModelArgs.from_config(geometry_config("qwen3.6-35b-a3b"))


def test_kv_bytes_per_token_27b_and_35b(a27, a35):
    # 27B: 16 attention layers x 4 kv heads x (K + V); bf16 256 x 2 B, int8-g64 256 B + 4 fp16 scales
    assert mp.kv_bytes_per_token(a27, "bf16") == 16 * 4 * 2 * 512 == 65_536
    assert mp.kv_bytes_per_token(a27, "int8") == 16 * 4 * 2 * 264 == 33_792
    # 35B-A3B: 10 attention layers x 2 kv heads
    assert mp.kv_bytes_per_token(a35, "bf16") == 20_480
    assert mp.kv_bytes_per_token(a35, "int8") == 10_560
    assert mp.kv_bytes_per_token(a27, "int8", layers=1) == 4 * 2 * 264  # the MTP layer


def test_unknown_kv_format_is_a_user_error(a27):
    with pytest.raises(NinferError, match="unknown KV format 'fp8'"):
        mp.kv_bytes_per_token(a27, "fp8")


def test_gdn_slot_bytes(a27, a35):
    # recurrent fp32 [Hv, 128, 128] per GDN layer: 144 MiB (27B), 60 MiB (35B); conv history 3 x C, fp32 here
    assert mp.gdn_slot_bytes(a27) == 48 * 48 * 128 * 128 * 4 + 48 * 3 * 10240 * 4 == 144 * MIB + 5_898_240
    assert mp.gdn_slot_bytes(a35) == 60 * MIB + 30 * 3 * 8192 * 4
    assert mp.gdn_slot_bytes(a27, conv_bytes=2) == 144 * MIB + 48 * 3 * 10240 * 2  # upstream's BF16 history


def test_replay_arena_matches_the_spec(a27, a35):
    # runtime.md §3.5: 27B C=8 T=6 81.84 MiB; 35B T=6 39.73 MiB; 35B T=16 105.94 MiB
    assert mp.replay_arena_bytes(a27, 8, 6) == 48 * 8 * 6 * (2 * 10240 + 2 * 128 * 16 + 2 * 128 * 48 + 8 * 48)
    assert round(mp.replay_arena_bytes(a27, 8, 6) / MIB, 2) == 81.84
    assert round(mp.replay_arena_bytes(a35, 8, 6) / MIB, 2) == 39.73
    assert round(mp.replay_arena_bytes(a35, 8, 16) / MIB, 2) == 105.94


def _inventory(name):
    path = DATA / f"inventory-{name}-groupwise-int.json"
    if not path.is_file():
        pytest.skip(f"{path} not here")
    return json.loads(path.read_text())


def test_recipe_weights_equal_the_published_27b_inventories(a27):
    for model, recipe in (("qwen3.6-27b", "groupwise-int"), ("qwen3.8-27b", "groupwise-int-w8head")):
        published = mp.weights_from_inventory(_inventory(model))
        assert mp.weights_from_recipe(a27, recipe)["text"] == published["text"], model
        # the MTP head (its matrices in q8) and the proposal head beside it: the published ones' sizes
        ours = mp.weights_from_recipe(a27, recipe)
        assert (ours["mtp"], ours["draft_head"]) == (published["mtp"], published["draft_head"]), model


def test_recipe_35b_differs_from_the_inventory_by_three_q6_down_layers(a35):
    published = mp.weights_from_inventory(_inventory("qwen3.6-35b-a3b"))
    ours = mp.weights_from_recipe(a35, "groupwise-int-moe")["text"]
    # the artifact keeps routed_down of 3 layers in q6 (8 more high bytes per 64-group) where the recipe has q5
    assert published["text"] - ours == 3 * 524288 * (512 // 64) * 8
    mtp = mp.weights_from_recipe(a35, "groupwise-int-moe")
    assert (mtp["mtp"], mtp["draft_head"]) == (published["mtp"], published["draft_head"])


def test_inventory_components_and_draft_head():
    w = mp.weights_from_inventory(_inventory("qwen3.8-27b"))
    assert set(w) == {"text", "draft_head", "mtp", "vision", "dflash2"}
    # q4 [131072, 5120]: 80 groups x (32 B codes + 2 B scale) per row, plus int32 token ids
    assert w["draft_head"] == 131072 * 80 * 34 + 131072 * 4


class _Obj:
    def __init__(self, id, nbytes, shape, kind="tensor"):
        self.id, self.bytes, self.shape, self.kind = id, nbytes, shape, kind


class _Art:
    def __init__(self, objs):
        self.objects = {o.id: o for o in objs}


def test_weights_from_artifact_groups_by_component_and_widens_vectors():
    art = _Art([_Obj("text/layers/0/mlp/up", 1000, (10, 64)), _Obj("text/layers/0/input_norm", 20, (10,)),
                _Obj("text/draft_head", 300, (4, 64)), _Obj("mtp/fc", 50, (5, 10)),
                _Obj("text/tokenizer.json", 999, (), kind="resource")])
    # the bf16 norm (20 B) is uploaded as fp32 (40 B); resources never reach the device
    assert mp.weights_from_artifact(art) == {"text": 1040, "draft_head": 300, "mtp": 50}


def _plan(args, **kw):
    kw.setdefault("weights", {"text": 16 * GIB, "mtp": GIB // 2})
    return mp.plan_memory(args, kw.pop("weights"), model="m", **kw)


def test_plan_totals_and_kv_pages(a27):
    p = _plan(a27, prefill_chunk=0)
    fixed = 16 * GIB + mp.gdn_slot_bytes(a27) + mp.workspace_bytes(a27, 1) + mp.GRAPH_POOL
    assert p.fixed_bytes == fixed
    assert p.kv_bytes(65536) == 1024 * 64 * 65536 == 4 * GIB
    assert p.kv_bytes(100) == 2 * 64 * 65536  # pages of 64 tokens
    assert p.total(65536) == fixed + 4 * GIB + GIB
    assert p.needed(65536) == p.total(65536) - GIB
    names = [i.name for i in p.items(65536)]
    assert names == ["weights: text", "GDN state slots", "activations/workspace", "CUDA graph pool",
                     "KV pool: text", "headroom"]
    assert sum(i.bytes for i in p.items(65536)) == p.total(65536)
    assert p.to_dict(65536)["total_bytes"] == p.total(65536)


def test_int8_halves_roughly_and_lanes_multiply(a27):
    assert _plan(a27, kv="int8").kv_bytes(65536) == 65536 * 33_792
    two = _plan(a27, lanes=2)
    assert two.kv_bytes(65536) == 2 * 4 * GIB
    assert two.fixed_bytes - _plan(a27).fixed_bytes >= mp.gdn_slot_bytes(a27)  # one more state slot


def test_mtp_spec_adds_weights_pool_and_arena(a27):
    p = _plan(a27, components=("text", "mtp"), spec="mtp", draft_tokens=3)
    names = [i.name for i in p.items(64)]
    assert "weights: mtp" in names and "ReplaySSM arena" in names and "KV pool: mtp" in names
    assert "MTP prompt chunk" in names
    assert p.kv_bytes_per_token == 65_536 + 4096
    # MTP pool: the context's pages + ceil((K - 1) / 64) per lane + the prompt chunk's padding (512 rows: 8 pages)
    assert p.kv_bytes(64) == 64 * 65_536 + (1 + 1 + 8) * 64 * 4096


def test_missing_component_is_an_error_optional_is_skipped(a27):
    with pytest.raises(NinferError, match="has no vision weights"):
        _plan(a27, components=("text", "vision"))
    p = _plan(a27, optional=("draft_head", "mtp"))
    assert [i.name for i in p.fixed if i.name.startswith("weights")] == ["weights: text", "weights: mtp"]


# ---- the ladder
def test_fit_context_picks_the_largest_rung_that_fits(a27):
    p = _plan(a27)
    assert mp.fit_context(p, p.total(98304)) == 98304  # exactly enough
    assert mp.fit_context(p, p.total(98304) - 1) == 65536  # one byte short: next rung down
    assert mp.fit_context(p, 10**15) == 262144  # capped at the model's positions


def test_fit_context_respects_max_positions(a27):
    from dataclasses import replace

    p = replace(_plan(a27), max_positions=40960)
    assert mp.ladder_for(p)[:3] == [40960, 32768, 16384]
    assert mp.fit_context(p, 10**15) == 40960


def test_fit_context_error_says_needed_and_free(a27):
    p = _plan(a27)
    with pytest.raises(NinferError) as e:
        mp.fit_context(p, 10 * GIB)
    assert "needed at context 4,096" in e.value.message and "10.00 GiB free" in e.value.message
    assert "close other programs" in e.value.next_action


def test_largest_context_is_page_aligned(a27):
    p = _plan(a27)
    n = p.largest_context(p.total(0) + 3 * 64 * 65536 + 5)
    assert n == 3 * 64
    assert p.largest_context(p.total(0) - 1) == 0


def test_check_context(a27):
    p = _plan(a27)
    mp.check_context(p, 65536, p.total(65536))  # fits: no error
    with pytest.raises(NinferError) as e:
        mp.check_context(p, 131072, p.total(98304), int8_available=False)
    assert "context 131,072 needs" in e.value.message and "free" in e.value.message
    assert "lower --ctx to 98,304" in e.value.next_action
    assert "not implemented on the GPU yet" in e.value.next_action
    with pytest.raises(NinferError) as e:
        mp.check_context(p, 131072, p.total(98304), int8_available=True)
    assert "use --kv int8" in e.value.next_action
    with pytest.raises(NinferError, match="beyond the model's 262,144 positions"):
        mp.check_context(p, 300000, 10**15)


# ---- budget, sizes, stepping down
def test_budget_under_a_vram_limit():
    assert mb.budget(None, None) is None
    ctx = mp.CONTEXT_ESTIMATE
    # other programs on a big card do not count against the limit; the CUDA context and our pool do
    b = mb.budget(24 * GIB, (100 * GIB, 140 * GIB))
    assert b.free == 24 * GIB - ctx and b.total == 24 * GIB
    assert mb.budget(24 * GIB, (100 * GIB, 140 * GIB, 2 * GIB)).free == 22 * GIB - ctx
    b = mb.budget(24 * GIB, (10 * GIB, 140 * GIB))  # the card has less free than the limit leaves
    assert b.free == 10 * GIB and "only 10.00 GiB is free" in b.source
    assert mb.budget(None, (5 * GIB, 24 * GIB)).free == 5 * GIB
    assert mb.budget(24 * GIB, None).free == 24 * GIB - ctx


@pytest.mark.parametrize("text,n", [("24GiB", 24 * GIB), ("24 gib", 24 * GIB), ("24G", 24 * 10**9),
                                    ("22.5GiB", int(22.5 * GIB)), ("512MiB", 512 * MIB), ("1000", 1000)])
def test_parse_size(text, n):
    assert mb.parse_size(text) == n


@pytest.mark.parametrize("text", ["", "lots", "24 parsecs", "0", "-1G"])
def test_parse_size_rejects(text):
    with pytest.raises(NinferError):
        mb.parse_size(text)


class OutOfMemoryError(Exception):
    pass


def test_build_with_ladder_steps_down_on_refusal():
    tried, steps = [], []

    def build(ctx):
        tried.append(ctx)
        if ctx > 65536:
            raise OutOfMemoryError(f"{ctx}")
        return f"engine@{ctx}"

    assert mb.build_with_ladder(build, [131072, 98304, 65536, 32768],
                                on_step=lambda a, b, e: steps.append((a, b))) == ("engine@65536", 65536)
    assert tried == [131072, 98304, 65536] and steps == [(131072, 98304), (98304, 65536)]


def test_build_with_ladder_other_errors_propagate_and_exhaustion_is_a_user_error():
    def broken(ctx):
        raise ValueError("bug")

    with pytest.raises(ValueError):
        mb.build_with_ladder(broken, [4096])

    def never(ctx):
        raise OutOfMemoryError("no")

    with pytest.raises(NinferError, match="refused every context down to 4,096"):
        mb.build_with_ladder(never, [8192, 4096])


def test_prefill_executors_are_planned():
    """The columns step's rows and the tensor-core chunk's scratch are in the plan; MoE has no columns
    step, and its tensor-core chunk (MOE_PREFILL) adds the routing and per-expert rows; the flash kernel
    reads the cache pages in place (no gathered rows, no score block)."""
    from engine.gpu import memory as mp
    from engine.config import ModelArgs
    from engine.synthetic import geometry_config

    dense = ModelArgs.from_config(geometry_config("qwen3.8-27b"))
    moe = ModelArgs.from_config(geometry_config("qwen3.6-35b-a3b"))
    assert mp.prefill_executor_bytes(dense, 8, 0) == mp.workspace_bytes(dense, 8)
    assert mp.prefill_executor_bytes(dense, 1, 0) == 0
    gemm = mp.prefill_executor_bytes(dense, 8, 256) - mp.prefill_executor_bytes(dense, 8, 0)
    # the fp16 copies of the 34,816 x 5,120 gate|up (one a ring buffer) and 256 rows of buffers
    assert gemm > mp.PREFILL_DQ_BUFS * 2 * 34816 * 5120 + mp.workspace_bytes(dense, 256) - 255 * 4 * dense.vocab_size
    assert gemm < mp.GIB + mp.PREFILL_DQ_BUFS * 2 * 34816 * 5120 + mp.workspace_bytes(dense, 256)
    moe_gemm = mp.prefill_executor_bytes(moe, 8, 256)
    assert moe_gemm == mp.prefill_executor_bytes(moe, 0, 256)  # (no columns step for MoE)
    assert moe_gemm > 256 * 8 * 6 * moe.hidden_size + 2 * 256 * 1024 * moe.hidden_size
    assert mp.prefill_executor_bytes(moe, 8, 0) == 0
    assert mp.prefill_gather_bytes_per_token(dense, 8, 256) == mp.prefill_gather_bytes_per_token(moe, 8, 256) == 0
    weights = mp.weights_from_recipe(dense, "groupwise-int-w8head")
    base = mp.plan_memory(dense, weights)
    cols = mp.plan_memory(dense, weights, prefill_cols=8)
    assert cols.fixed_bytes - base.fixed_bytes == mp.workspace_bytes(dense, 8)
    assert any(i.name == "prefill executors" for i in cols.items(4096))
    assert [p.name for p in mp.plan_memory(dense, weights, prefill_cols=8, prefill_gemm=256).pools] == ["text"]
