"""Launch profiles: lookup, the flag-over-profile merge, and resolving a launch against a memory budget."""
from __future__ import annotations

import pytest

from engine import memory_plan as mp
from engine.errors import NinferError
from ninfer_cli import profiles as P

GIB = 2**30
CARD_24 = (24 * GIB, 24 * GIB)  # (free, total) as memGetInfo would say on an empty 24 GiB card


def test_catalog_models_have_default_long_fast():
    for name in ("qwen38-27b", "qwen36-27b", "qwen36-35b-a3b"):
        assert [p.name for p in P.profiles_for(name)] == ["default", "long", "fast"]
    assert P.get_profile("qwen38-27b", "long").kv == "int8"
    assert P.get_profile("qwen38-27b:latest", None).name == "default"
    fast = P.get_profile("qwen36-35b-a3b", "FAST")
    assert fast.spec == "mtp" and fast.draft_tokens == 3 and "not implemented yet" in fast.status


def test_model_key_maps_refs_paths_and_synthetic_names():
    assert P.model_key("qwen38-27b:latest") == "qwen38-27b"
    assert P.model_key("qwen3.8-27b") == "qwen38-27b"  # bench --synthetic geometry
    assert P.model_key("/models/qwen3_6_35b_a3b.ninfer") == "qwen36-35b-a3b"
    assert P.model_key("/tmp/mine.ninfer") is None
    assert P.model_key(None) is None


def test_unknown_models_get_generic_profiles():
    assert [p.name for p in P.profiles_for("/tmp/mine.ninfer")] == ["default", "long"]
    assert [p.name for p in P.profiles_for("/tmp/mine.ninfer", has_mtp=True)] == ["default", "long", "fast"]


def test_unknown_profile_lists_what_exists():
    with pytest.raises(NinferError) as e:
        P.get_profile("smollm2-135m", "long")
    assert "has no profile 'long' (it has: default)" in e.value.message
    assert "ninfer profile ls smollm2-135m" in e.value.next_action


def test_merge_flags_win_none_means_not_given():
    long = P.get_profile("qwen38-27b", "long")
    values, sources = P.merge(long, ctx=None, kv=None)
    assert values["kv"] == "int8" and values["ctx"] is None and sources["kv"] == "profile long"
    values, sources = P.merge(long, ctx=32768, kv="bf16")
    assert values["ctx"] == 32768 and values["kv"] == "bf16"
    assert sources["ctx"] == sources["kv"] == "flag" and sources["lanes"] == "profile long"
    with pytest.raises(TypeError):
        P.merge(long, colour="red")


def test_flags_of():
    assert P.flags_of(P.get_profile("qwen38-27b", "long")) == "--ctx auto --kv int8"
    assert P.flags_of(P.get_profile("qwen38-27b", "fast")) == "--ctx auto --kv bf16 --spec mtp3"


# ---- resolving a launch (synthetic 27B, a 24 GiB budget, no device needed)
def _launch(**kw):
    kw.setdefault("memory", CARD_24)
    return P.launch_for_synthetic("qwen3.8-27b", **kw)


def test_auto_context_fits_a_24_gib_card_and_says_why():
    launch = _launch(vram_limit=24 * GIB)
    assert launch.max_context == 98304  # 27B bf16: 16 GiB of weights leave ~6 GiB of KV at 64 KiB/token
    assert launch.plan.total(98304) <= launch.budget.free < launch.plan.total(114688)
    assert any(n.startswith("context auto -> 98,304 (bf16 KV, 65,536 B/token)") for n in launch.notes)
    assert any("114,688 would need" in n for n in launch.notes)


def test_long_profile_says_int8_is_not_on_the_gpu_and_falls_back_to_bf16():
    launch = _launch(profile="long", vram_limit=24 * GIB)
    assert launch.values["kv"] == "bf16" and launch.plan.kv == "bf16"
    assert any("int8 KV is not implemented on the GPU yet" in n for n in launch.notes)


def test_int8_plan_reaches_64k_on_24_gib_when_the_engine_has_it(monkeypatch):
    monkeypatch.setattr(mp, "GPU_KV_FORMATS", ("bf16", "int8"))
    launch = _launch(profile="long", vram_limit=24 * GIB)
    assert launch.values["kv"] == "int8" and launch.max_context >= 65536
    assert launch.max_context == mp.fit_context(launch.plan, launch.budget.free)


def test_explicit_int8_flag_is_an_error_on_the_gpu():
    with pytest.raises(NinferError, match="int8 KV is not implemented on the GPU yet"):
        _launch(kv="int8")


def test_explicit_ctx_that_does_not_fit_fails_before_loading():
    with pytest.raises(NinferError) as e:
        _launch(ctx=262144, vram_limit=24 * GIB)
    assert "context 262,144 needs" in e.value.message and "free" in e.value.message
    assert "lower --ctx to 98,304" in e.value.next_action and "close other programs" in e.value.next_action


def test_explicit_ctx_that_fits_is_kept():
    launch = _launch(ctx=32768, vram_limit=24 * GIB)
    assert launch.max_context == 32768 and launch.sources["ctx"] == "flag"


def test_flag_beats_profile_in_a_launch():
    launch = _launch(profile="long", kv="bf16", vram_limit=24 * GIB)
    assert launch.values["kv"] == "bf16" and not any("int8" in n for n in launch.notes)


def test_fast_profile_runs_without_speculation_and_plans_no_mtp():
    launch = _launch(profile="fast", vram_limit=24 * GIB)
    assert launch.values["spec"] is None
    assert any("speculative decoding is not implemented yet" in n for n in launch.notes)
    assert not any("mtp" in i.name for i in launch.plan.items(4096))


def test_big_card_without_limit_takes_the_model_maximum():
    launch = _launch(memory=(139 * GIB, 141 * GIB))
    assert launch.max_context == 262144


def test_cpu_launch_has_no_plan_and_rejects_int8_flags():
    launch = P.resolve_launch("smollm2-135m", None, None, device="cpu", ctx=2048, vram_limit=GIB)
    assert launch.max_context == 2048 and launch.plan is None
    assert any("--vram-limit applies to the GPU only" in n for n in launch.notes)
    with pytest.raises(NinferError, match="not implemented on the CPU"):
        P.resolve_launch("smollm2-135m", None, None, device="cpu", kv="int8")


def test_no_budget_means_the_engine_default():
    launch = _launch(memory=None)
    assert launch.budget is None and launch.max_context is None
