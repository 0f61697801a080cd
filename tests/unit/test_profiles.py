"""Launch profiles: lookup, the flag-over-profile merge, and resolving a launch against a memory budget."""
from __future__ import annotations

import pytest

from engine import memory_budget as mb
from engine.gpu import memory as mp
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
    assert fast.spec == "mtp" and fast.draft_tokens == 3 and fast.status is None and "mtp:3" in fast.summary


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
    assert P.flags_of(P.get_profile("qwen38-27b", "fast")) == "--ctx auto --kv bf16 --spec mtp:3"


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


def test_long_profile_uses_int8_and_reaches_64k_on_24_gib():
    launch = _launch(profile="long", vram_limit=24 * GIB)
    assert launch.values["kv"] == "int8" and launch.plan.kv_bytes_per_token == 33_792
    assert launch.max_context >= 65536
    assert launch.max_context == mp.fit_context(launch.plan, launch.budget.free) == 163840


def test_without_int8_on_the_gpu_long_falls_back_and_the_flag_fails(monkeypatch):
    monkeypatch.setattr(mp, "GPU_KV_FORMATS", ("bf16",))
    launch = _launch(profile="long", vram_limit=24 * GIB)
    assert launch.values["kv"] == "bf16" and launch.plan.kv == "bf16"
    assert any("int8 KV is not implemented on the GPU yet" in n for n in launch.notes)
    with pytest.raises(NinferError, match="int8 KV is not implemented on the GPU yet"):
        _launch(kv="int8")


def test_int8_flag_on_a_path_that_cannot_build_it_says_so():
    from engine.config import ModelArgs
    from engine.synthetic import geometry_config

    args = ModelArgs.from_config(geometry_config("qwen3.8-27b"))
    weights = mp.weights_from_recipe(args, "groupwise-int")
    with pytest.raises(NinferError, match="not reachable through engine.load yet"):
        P.resolve_launch("qwen38-27b", args, weights, kv="int8", memory=CARD_24, kv_formats=("bf16",))


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


def _with_mtp(device="gpu", mtp=True, **kw):
    import dataclasses

    from engine.config import ModelArgs
    from engine.synthetic import geometry_config

    args = ModelArgs.from_config(geometry_config("qwen3.8-27b"))
    weights = mp.weights_from_recipe(args, "groupwise-int")
    if mtp:
        weights["mtp"] = 900 * 2**20
    else:
        args = dataclasses.replace(args, mtp_num_hidden_layers=0)
        weights.pop("mtp", None)
    return P.resolve_launch("qwen38-27b", args, weights, profile="fast", device=device, memory=CARD_24, **kw)


def test_fast_profile_without_an_mtp_head_runs_without_speculation_and_plans_no_mtp():
    launch = _with_mtp(mtp=False, vram_limit=24 * GIB)
    assert launch.values["spec"] is None and P.spec_flag(launch.values) is None
    assert "qwen38-27b carries no MTP head (no mtp weights in the artifact): profile fast runs without " \
           "speculation" in launch.notes
    assert not any("mtp" in i.name.lower() for i in launch.plan.items(4096))


def test_fast_profile_with_an_mtp_head_keeps_mtp3_and_plans_its_parts():
    launch = _with_mtp(vram_limit=24 * GIB)
    assert P.spec_flag(launch.values) == "mtp:3" and not any("speculation" in n for n in launch.notes)
    names = " ".join(i.name.lower() for i in launch.plan.items(4096))
    assert "mtp" in names
    without = _with_mtp(mtp=False, vram_limit=24 * GIB).plan
    assert launch.plan.total(4096) > without.total(4096)  # the head and its arenas cost memory
    assert P.spec_flag(_launch(profile="fast", vram_limit=24 * GIB).values) == "mtp:3"  # the geometry has a head
    cpu = _with_mtp(device="cpu")
    assert P.spec_flag(cpu.values) == "mtp:3" and cpu.plan is None  # the NumPy engine speculates too


def test_a_spec_kind_that_is_not_built_is_dropped_with_a_note():
    why = P.spec_unavailable({"spec": "dflash", "draft_tokens": 7}, True)
    assert why == "dflash speculation is not built (mtp is)"
    assert P.spec_unavailable({"spec": None, "draft_tokens": 0}, False) is None


class _NumpyEngine:
    def __init__(self):
        import types

        self.device, self.model = "cpu", types.SimpleNamespace(mtp_layer=object())


class _CudaEngineWithoutMtp:
    """What check_spec sees of the CUDA engine over a model whose artifact carries no MTP weights."""

    def __init__(self):
        import types

        self.device, self.speculator = "gpu", object()
        self.model = types.SimpleNamespace(args=types.SimpleNamespace(is_moe=True), mtp_weights={})


@pytest.mark.parametrize("eng, spec, note", [
    (_NumpyEngine(), "mtp:3", "speculative decoding mtp:3 (profile fast)"),
    (_CudaEngineWithoutMtp(), None, "--spec mtp:3 needs a model with an MTP head: profile fast runs without "
                                    "speculation"),
])
def test_load_fitted_leaves_the_engine_to_check_spec(monkeypatch, eng, spec, note):
    """After loading, the profile's mtp:3 becomes the engine's default `--spec` where check_spec allows it (what
    `generation_config` uses when no --spec is given); where it refuses, a note and no speculation."""
    import engine.backend
    from ninfer_cli.model_session import generation_config

    monkeypatch.setattr(engine.backend, "resolve_device", lambda d: "cpu")
    monkeypatch.setattr(P, "launch_for_artifact", lambda *a, **k: _with_mtp(device="cpu"))
    said = []
    got = P.load_fitted("m.ninfer", "qwen38-27b", lambda n: eng, profile="fast", say=said.append)
    assert got is eng and getattr(eng, "launch_spec", None) == spec and note in said
    import types

    session = types.SimpleNamespace(engine=eng, template=None, think=None, effort=None)
    assert generation_config(session, {}).spec == (spec or "off")
    assert generation_config(session, {"spec": "off"}).spec == "off"  # the flag wins


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


# ---- loading through the fitted launch
class OutOfMemoryError(Exception):
    pass


def _fake_gpu(monkeypatch):
    import engine.backend

    monkeypatch.setattr(engine.backend, "resolve_device", lambda d: "gpu")
    monkeypatch.setattr(mb, "apply_vram_limit", lambda limit: None)
    monkeypatch.setattr(P, "launch_for_artifact",
                        lambda path, ref, **k: _launch(profile=k.get("profile"), ctx=k.get("ctx"), kv=k.get("kv"),
                                                       vram_limit=k.get("vram_limit")))


def test_load_fitted_steps_down_the_ladder_when_the_gpu_refuses(monkeypatch):
    _fake_gpu(monkeypatch)
    tried, said = [], []

    def load(n, **opts):
        tried.append((n, opts))
        if n > 65536:
            raise OutOfMemoryError("refused")
        return "engine"

    assert P.load_fitted("m.ninfer", "qwen38-27b", load, vram_limit=24 * GIB, say=said.append) == "engine"
    assert [n for n, _ in tried] == [98304, 65536] and tried[0][1] == {}
    assert said[0].startswith("context auto -> 98,304")
    assert said[1] == "the GPU refused context 98,304: trying 65,536"


def test_load_fitted_passes_int8_and_an_explicit_context_is_not_stepped(monkeypatch):
    _fake_gpu(monkeypatch)
    tried = []

    def load(n, **opts):
        tried.append((n, opts))
        raise OutOfMemoryError("refused")

    with pytest.raises(OutOfMemoryError):
        P.load_fitted("m.ninfer", "qwen38-27b", load, profile="long", ctx=65536, vram_limit=24 * GIB)
    assert tried == [(65536, {"kv": "int8"})]


def test_load_fitted_on_the_cpu_without_flags_is_a_plain_load(monkeypatch):
    import engine.backend

    monkeypatch.setattr(engine.backend, "resolve_device", lambda d: "cpu")
    monkeypatch.setattr(P, "launch_for_artifact", lambda *a, **k: pytest.fail("no launch without flags"))
    assert P.load_fitted("m.ninfer", "smollm2-135m", lambda n: ("loaded", n), ctx=2048) == ("loaded", 2048)


def test_prefit_context_for_the_tui(monkeypatch):
    import engine.backend
    import ninfer_cli.model_session as ms

    assert P.prefit_context("anything", ctx=4096) == 4096  # no launch flag: the loader fits it itself
    monkeypatch.setattr(engine.backend, "resolve_device", lambda d: "gpu")
    monkeypatch.setattr(ms, "resolve_model", lambda ref, quiet=False: ("m.ninfer", "qwen38-27b"))
    monkeypatch.setattr(mb, "apply_vram_limit", lambda limit: None)
    monkeypatch.setattr(P, "launch_for_artifact",
                        lambda path, ref, **k: _launch(profile=k.get("profile"), vram_limit=k.get("vram_limit")))
    said = []
    assert P.prefit_context("qwen38-27b", profile="long", vram_limit=24 * GIB, say=said.append) == 163840
    assert said and said[0].startswith("context auto -> 163,840 (int8 KV")
