"""What the v2 -> v3 upgrade synthesizes: components, bindings and uses (data/v2-to-v3-bindings.md).

Pure functions over the v2 object list; no I/O. The upgrader is closed: only the published
(model_id, weights_id) pairs are known, with their geometry hard-coded here.
"""
from __future__ import annotations

import math

import numpy as np

from engine.errors import NinferError

# (model_id, weights_id) -> accepted v2 object counts
KNOWN_INPUTS = {
    ("qwen3.6-27b", "groupwise-int"): {1124},
    ("qwen3.6-27b", "nvfp4"): {1307},
    ("qwen3.8-27b", "groupwise-int"): {1124, 1190},
    ("qwen3.8-27b", "nvfp4"): {1124, 1190},
    ("qwen3.6-35b-a3b", "groupwise-int"): {940},
}
EXPECTED_BINDINGS = {"moe": 32713, "dflash2": 1513, "dense": 1422}
V3_FORMAT = {"BF16": "bf16", "FP32": "fp32", "I32": "int32", "Q4G64_F16S": "q4_g64_fp16",
             "Q5G64_F16S": "q5_g64_fp16", "Q6G64_F16S": "q6_g64_fp16", "W8G32_F16S": "q8_g32_fp16",
             "NVFP4": "nvfp4", "FP8_E4M3FN_ROW_BF16S": "fp8_e4m3fn_row_bf16"}
V3_LAYOUT = {"contiguous-le-v1": "contiguous_le_v1", "row-split-k128-v1": "row_split_k128_v1",
             "blockscale-k16-m128x4-v1": "block_scale_k16_m128x4_v1", "row-scale-v1": "row_scale_v1"}
_V2_TENSOR_KEYS = {"name", "kind", "shape", "format", "layout", "offset", "bytes"}
_V2_RESOURCE_KEYS = {"name", "kind", "encoding", "offset", "bytes"}
VISION_ROLES = ("preprocessor_config.json", "video_preprocessor_config.json")
TEXT_ROLES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def _f32(x: float) -> float:
    """Round through binary32, as the upgrader does (1e-6 -> 9.999999974752427e-07)."""
    return float(np.float32(x))


def is_moe(model_id: str) -> bool:
    return model_id == "qwen3.6-35b-a3b"


def text_config(model_id: str) -> dict:
    """The synthesized HF-style text config of a known model."""
    moe = is_moe(model_id)
    layers = 40 if moe else 64
    cfg = {
        "architectures": ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "hidden_size": 2048 if moe else 5120,
        "vocab_size": 248320,
        "tie_word_embeddings": False,
        "num_hidden_layers": layers,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        "max_position_embeddings": 262144,
        "rms_norm_eps": _f32(1e-6),
        "num_attention_heads": 16 if moe else 24,
        "num_key_value_heads": 2 if moe else 4,
        "head_dim": 256,
        "rope_parameters": {"rope_theta": _f32(1e7), "partial_rotary_factor": _f32(0.25), "mrope_section": [11, 11, 10]},
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_num_value_heads": 32 if moe else 48,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    if moe:
        cfg.update(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512)
    else:
        cfg["intermediate_size"] = 17408
    return cfg


def vision_config(model_id: str) -> dict:
    return {"model_type": "qwen3_5_moe_vision" if is_moe(model_id) else "qwen3_5_vision", "depth": 27,
            "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
            "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304}


def draft_config(kind: str) -> dict:
    """`dflash` (35B) or `dflash2` (Qwen3.8 DFlash2 bundle) config."""
    d2 = kind == "dflash2"
    cfg = {
        "architectures": ["DFlash2DraftModel" if d2 else "DFlashDraftModel"],
        "model_type": "qwen3",
        "intermediate_size": 17408 if d2 else 6144,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 5 if d2 else 6,
        "rms_norm_eps": _f32(1e-6),
        "rope_parameters": {"rope_theta": _f32(1e7)},
        "max_position_embeddings": 262144,
        "layer_types": ["sliding_attention"] * 5 if d2 else ["sliding_attention"] * 5 + ["full_attention"],
        "sliding_window": 2048 if d2 else 4096,
    }
    if d2:
        cfg["dflash_config"] = {"target_layer_ids": [5, 19, 33, 47, 61], "mask_token_id": 248070,
                                "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                                "selector_top_k": 16}
    else:
        cfg["dflash_config"] = {"target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37], "mask_token_id": 248077}
    return cfg


def build_components(model_id: str, objects: list[dict]) -> dict:
    """components.{text, vision, mtp, dflash?, dflash2?} with resources filled from `frontend/*`."""
    text_res, vision_res = {}, {}
    for o in objects:
        if o["kind"] != "resource":
            continue
        if not o["id"].startswith("frontend/"):
            raise NinferError(f"resource {o['id']!r} is not under frontend/")
        role = o["id"].removeprefix("frontend/")
        (vision_res if role in VISION_ROLES else text_res)[role] = o["id"]
    if set(text_res) != set(TEXT_ROLES) or set(vision_res) != set(VISION_ROLES):
        raise NinferError(f"the v2 file's frontend resources are incomplete ({sorted(text_res) + sorted(vision_res)})")
    moe = is_moe(model_id)
    comps = {
        "text": {"config": text_config(model_id), "resources": {r: text_res[r] for r in text_res},
                 "proposal": {"domain": "indexed", "rows": 131072}},
        "vision": {"config": vision_config(model_id), "target": "text", "resources": vision_res},
        "mtp": {"config": {"architectures": ["Qwen3_5MoeMTP" if moe else "Qwen3_5MTP"]}, "target": "text"},
    }
    if moe:
        comps["dflash"] = {"config": draft_config("dflash"), "target": "text"}
    if any(o["id"].startswith("dflash2/") for o in objects):
        comps["dflash2"] = {"config": draft_config("dflash2"), "target": "text"}
    return comps


# --- bindings ---------------------------------------------------------------------------------

def _param_name(v2: str) -> str:
    """v2 object name -> v3 parameter name for whole-object bindings."""
    if v2 == "text/draft_head":
        return "proposal/head"
    if v2 == "text/draft_head_token_ids":
        return "proposal/token_ids"
    if v2.startswith("mtp/layer/"):
        v2 = "mtp/layers/0/" + v2.removeprefix("mtp/layer/")
    for old, new in (("/norm1/weight", "/norm1_weight"), ("/norm1/bias", "/norm1_bias"),
                     ("/norm2/weight", "/norm2_weight"), ("/norm2/bias", "/norm2_bias"),
                     ("/merger/norm/weight", "/merger/norm_weight"), ("/merger/norm/bias", "/merger/norm_bias"),
                     ("/moe/shared_down", "/moe/shared/down")):
        if v2.endswith(old):
            return v2[: -len(old)] + new
    return v2


def _row_split(comps: dict, prefix: str, leaf: str, shape: list) -> list[tuple[str, int, int]] | None:
    """Children (leaf, row0, row1) of a fused parent, or None for a whole-object binding."""
    text = comps["text"]["config"]
    n = shape[0]
    q = text["num_attention_heads"] * text["head_dim"]
    kv = text["num_key_value_heads"] * text["head_dim"]
    kg = text["linear_num_key_heads"] * text["linear_key_head_dim"]
    vg = text["linear_num_value_heads"] * text["linear_value_head_dim"]

    def seq(*pairs):
        out, cur = [], 0
        for name, rows in pairs:
            out.append((name, cur, cur + rows))
            cur += rows
        if cur != n:
            raise NinferError(f"fused object {prefix}/{leaf} has {n} rows, expected {cur}")
        return out

    if prefix.startswith(("dflash/", "dflash2/")) and leaf == "attention/query_key_value":
        d = draft_config(prefix.split("/")[0])
        dq, dk = d["num_attention_heads"] * d["head_dim"], d["num_key_value_heads"] * d["head_dim"]
        out = seq(("attention/query", dq), ("attention/key", dk), ("attention/value", dk))
        return out + [("attention/context_key",) + out[1][1:], ("attention/context_value",) + out[2][1:]]
    if prefix.startswith("vision/"):
        if leaf == "attention/qkv":
            return seq(("attention/query", n // 3), ("attention/key", n // 3), ("attention/value", n // 3))
        if leaf == "attention/qkv_bias":
            return seq(("attention/query_bias", n // 3), ("attention/key_bias", n // 3), ("attention/value_bias", n // 3))
        return None
    rules = {
        "attention/query_key": (("attention/query", q), ("attention/key", kv)),
        "attention/gate_value": (("attention/gate", q), ("attention/value", kv)),
        "attention/query_key_gate_value": (("attention/query", q), ("attention/key", kv), ("attention/gate", q),
                                           ("attention/value", kv)),
        "gdn/query_key": (("gdn/query", kg), ("gdn/key", kg)),
        "gdn/value_z": (("gdn/value", vg), ("gdn/z", vg)),
        "gdn/query_key_value_z": (("gdn/query", kg), ("gdn/key", kg), ("gdn/value", vg), ("gdn/z", vg)),
        "gdn/a_b_projection": (("gdn/a_projection", n // 2), ("gdn/b_projection", n // 2)),
        "mlp/gate_up": (("mlp/gate", n // 2), ("mlp/up", n // 2)),
        "moe/shared_gate_up": (("moe/shared/gate", n // 2), ("moe/shared/up", n // 2)),
    }
    if leaf in rules:
        return seq(*rules[leaf])
    if leaf == "moe/router_shared_gate":
        return seq(("moe/router", text["num_experts"]), ("moe/shared_score", 1))
    if leaf == "moe/routed_gate_up":
        per = n // text["num_experts"]
        out = []
        for e in range(text["num_experts"]):
            out += [(f"moe/experts/{e}/gate", e * per, e * per + per // 2),
                    (f"moe/experts/{e}/up", e * per + per // 2, (e + 1) * per)]
        return out
    if leaf == "moe/routed_down":
        per = n // text["num_experts"]
        return [(f"moe/experts/{e}/down", e * per, (e + 1) * per) for e in range(text["num_experts"])]
    return None


def _split_prefix(name: str) -> tuple[str, str]:
    """`text/layers/3/attention/query_key` -> (`text/layers/3`, `attention/query_key`)."""
    parts = name.split("/")
    if parts[0] in ("text", "vision", "dflash", "dflash2") and len(parts) > 2 and parts[1] == "layers":
        return "/".join(parts[:3]), "/".join(parts[3:])
    if parts[0] == "mtp" and len(parts) > 1 and parts[1] == "layer":
        return "mtp/layers/0", "/".join(parts[2:])
    return "/".join(parts[:-1]), parts[-1]


def build_bindings(comps: dict, objects: list[dict]) -> dict:
    """Bindings in object order; fused parents contribute their children in row order."""
    bindings: dict = {}

    def add(name, value):
        if name in bindings:
            raise NinferError(f"duplicate parameter {name!r} while building bindings")
        bindings[name] = value

    for o in objects:
        if o["kind"] != "tensor" or o["id"].endswith("/input_scale_divisor"):
            continue
        prefix, leaf = _split_prefix(o["id"])
        children = _row_split(comps, prefix, leaf, o["shape"]) if o["shape"] else None
        if children is None:
            add(_param_name(o["id"]), {"object": o["id"]})
            continue
        inner = math.prod(o["shape"][1:])
        for child, r0, r1 in children:
            add(f"{prefix}/{child}", {"parts": [{"object": o["id"], "range": [r0 * inner, r1 * inner]}]})
    return bindings


# --- uses -------------------------------------------------------------------------------------

def inputs_of(param: str, backends: list[str]) -> list[str]:
    """Activation input positions of a parameter (empty: no use entry)."""
    if param == "text/output_head":
        return ["text/final_hidden"] + [f"{b}/final_hidden" for b in backends]
    if param == "proposal/head":
        return [f"{b}/final_hidden" for b in backends]
    if param == "mtp/input_projection":
        return ["mtp/stem_input"]
    parts = param.split("/")
    if parts[0] in ("text", "mtp") and len(parts) > 3 and parts[1] == "layers":
        block, role = "/".join(parts[:3]), "/".join(parts[3:])
        if role in ("attention/query", "attention/key", "attention/gate", "attention/value", "gdn/query", "gdn/key",
                    "gdn/value", "gdn/z", "gdn/a_projection", "gdn/b_projection"):
            return [f"{block}/mixer_input"]
        if role in ("attention/output", "gdn/output"):
            return [f"{block}/{role.split('/')[0]}/gated_output"]
        if role in ("mlp/gate", "mlp/up", "moe/router", "moe/shared_score", "moe/shared/gate", "moe/shared/up") or (
                role.startswith("moe/experts/") and role.endswith(("/gate", "/up"))):
            return [f"{block}/ffn_input"]
        if role == "mlp/down":
            return [f"{block}/mlp/product"]
        if role == "moe/shared/down":
            return [f"{block}/moe/shared/product"]
        if role.startswith("moe/experts/") and role.endswith("/down"):
            return [f"{block}/{role[: -len('/down')]}/product"]
        return []
    if param == "vision/patch_embedding":
        return ["vision/patch_input"]
    if param == "vision/merger/fc1":
        return ["vision/merger/input"]
    if param == "vision/merger/fc2":
        return ["vision/merger/activation"]
    if parts[0] == "vision" and len(parts) > 3 and parts[1] == "layers":
        block, role = "/".join(parts[:3]), "/".join(parts[3:])
        return {"attention/query": [f"{block}/attention_input"], "attention/key": [f"{block}/attention_input"],
                "attention/value": [f"{block}/attention_input"], "attention/output": [f"{block}/attention_output"],
                "mlp/fc1": [f"{block}/mlp_input"], "mlp/fc2": [f"{block}/mlp_activation"]}.get(role, [])
    if parts[0] in ("dflash", "dflash2"):
        d = parts[0]
        if param == f"{d}/feature_projection":
            return [f"{d}/target_features"]
        if param == "dflash2/candidate_selector/hidden_projection":
            return ["dflash2/final_hidden"]
        if len(parts) > 3 and parts[1] == "layers":
            block, role = "/".join(parts[:3]), "/".join(parts[3:])
            if role in ("attention/context_key", "attention/context_value"):
                return [f"{d}/context_input"]
            if role in ("attention/query", "attention/key", "attention/value"):
                return [f"{block}/query_projection_input"]
            table = {"attention/output": "attention_output", "mlp/gate": "mlp_input", "mlp/up": "mlp_input",
                     "mlp/down": "mlp_product", "attention_conv/kernel_projection": "attention_conv_input",
                     "mlp_conv/kernel_projection": "mlp_conv_input"}
            if role in table:
                return [f"{block}/{table[role]}"]
    return []


def policy(fmt: str) -> str:
    return {"nvfp4": "AllowA4", "fp8_e4m3fn_row_bf16": "AllowA8"}.get(fmt, "A16Only")


def _divisor_roles(group: str, operation: str) -> list[str]:
    if operation == "input_projection":
        return ["query", "key", "gate", "value"] if group.endswith("/attention") else ["query", "key", "value", "z"]
    return {"output_projection": ["output"], "gate_up_projection": ["gate", "up"],
            "down_projection": ["down"]}.get(operation, [])


def build_uses(comps: dict, objects: list[dict], bindings: dict) -> list[dict]:
    """One use per (parameter, input position), in binding order; NVFP4 divisors become auxiliaries."""
    backends = [b for b in ("mtp", "dflash", "dflash2") if b in comps]
    fmt = {o["id"]: o.get("format") for o in objects}
    aux: dict[str, str] = {}
    for o in objects:
        if o["kind"] == "tensor" and o["id"].endswith("/input_scale_divisor"):
            group, operation = o["id"].removesuffix("/input_scale_divisor").rsplit("/", 1)
            group_v3 = "mtp/layers/0/" + group.removeprefix("mtp/layer/") if group.startswith("mtp/layer/") else group
            roles = _divisor_roles(group_v3, operation)
            if not roles:
                raise NinferError(f"divisor {o['id']!r} serves no known projection")
            for role in roles:
                param = f"{group_v3}/{role}"
                if param not in bindings:
                    raise NinferError(f"divisor {o['id']!r} serves missing parameter {param!r}")
                aux[param] = o["id"]
    uses = []
    for param, b in bindings.items():
        obj = b["object"] if "object" in b else b["parts"][0]["object"]
        for inp in inputs_of(param, backends):
            use = {"parameter": param, "input": inp, "activation_policy": policy(fmt[obj])}
            if param in aux:
                use["auxiliaries"] = {"activation_input_divisor": {"object": aux[param]}}
            uses.append(use)
    return uses


def expected_binding_count(model_id: str, comps: dict) -> int:
    if is_moe(model_id):
        return EXPECTED_BINDINGS["moe"]
    return EXPECTED_BINDINGS["dflash2" if "dflash2" in comps else "dense"]


def translate_object(o: dict) -> dict:
    """A v1/v2 object entry -> v3 (id = old name; offset and bytes unchanged). Members are a closed set."""
    allowed = _V2_RESOURCE_KEYS if o.get("kind") == "resource" else _V2_TENSOR_KEYS
    if set(o) != allowed:
        raise NinferError(f"object {o.get('name')!r} has members {sorted(o)}, expected {sorted(allowed)}")
    if o.get("kind") == "resource":
        if o.get("encoding") != "raw-bytes-v1":
            raise NinferError(f"resource {o.get('name')!r} has unknown encoding {o.get('encoding')!r}")
        return {"id": o["name"], "kind": "resource", "offset": o["offset"], "bytes": o["bytes"], "encoding": "raw_bytes_v1"}
    if o.get("kind") != "tensor":
        raise NinferError(f"object {o.get('name')!r} has unknown kind {o.get('kind')!r}")
    if o.get("format") not in V3_FORMAT or o.get("layout") not in V3_LAYOUT:
        raise NinferError(f"tensor {o.get('name')!r} has unknown format/layout {o.get('format')}/{o.get('layout')}")
    return {"id": o["name"], "kind": "tensor", "offset": o["offset"], "bytes": o["bytes"], "shape": list(o["shape"]),
            "format": V3_FORMAT[o["format"]], "layout": V3_LAYOUT[o["layout"]]}
