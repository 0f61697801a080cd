"""What `ninfer bench` measures: engines for a stored model, a full-size synthetic model (GPU), or the
small random `tiny` Qwen3.5 (NumPy), and the cost model (bytes and flops per token) of a geometry.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from engine.bench import Costs, Instance
from engine.errors import NinferError

TINY = {
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 32,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 65536,
    "mtp_num_hidden_layers": 1,  # the MTP head real Qwen3.5 artifacts carry: `--spec mtp:K` runs on tiny
}


def geometries() -> dict[str, tuple[dict, str]]:
    """Synthetic geometry name -> (HF-style text config, default recipe); full sizes from engine.synthetic."""
    from engine.synthetic import GEOMETRIES  # noqa: PLC0415

    return {**GEOMETRIES, "tiny": (TINY, "float32")}


def default_recipe(geometry: str) -> str | None:
    return geometries().get(geometry, (None, None))[1]


# ---------------------------------------------------------------------------------- cost model
def geometry_costs(args, *, weight_bytes_per_param: float, kv_bytes_per_elem: float,
                   state_bytes_per_elem: int = 4) -> tuple[Costs, int]:
    """Per-token bytes and flops of a geometry (ModelArgs); returns (costs, resident parameter count).

    Counts every matrix a decoded token multiplies by (the embedding is a row gather, so excluded from the
    per-token read; a MoE layer reads only its routed and shared experts).
    """
    h = args.hidden_size
    full = [i for i, t in enumerate(args.layer_types) if t == "full_attention"]
    n_full, n_gdn = len(full), args.num_hidden_layers - len(full)
    hq, hkv, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim
    q_width = hq * d * (2 if args.attention_gated else 1)
    attn = h * q_width + 2 * h * hkv * d + hq * d * h
    kdim = args.linear_num_key_heads * args.linear_key_head_dim
    vdim = args.linear_value_dim
    conv_ch = 2 * kdim + vdim
    gdn = h * conv_ch + h * vdim + 2 * h * args.linear_num_value_heads + vdim * h + conv_ch * args.linear_conv_kernel_dim
    if args.is_moe:
        expert = 3 * h * args.moe_intermediate_size
        shared = 3 * h * args.shared_expert_intermediate_size + h
        ffn_active = h * args.num_experts + args.num_experts_per_tok * expert + shared
        ffn_resident = h * args.num_experts + args.num_experts * expert + shared
    else:
        ffn_active = ffn_resident = 3 * h * args.intermediate_size
    head = args.vocab_size * h
    per_token = n_full * attn + n_gdn * gdn + args.num_hidden_layers * ffn_active + head
    resident = n_full * attn + n_gdn * gdn + args.num_hidden_layers * ffn_resident + head
    if not args.tie_word_embeddings:
        resident += args.vocab_size * h
    state = n_gdn * (args.linear_num_value_heads * args.linear_value_head_dim * args.linear_key_head_dim
                     * state_bytes_per_elem + (args.linear_conv_kernel_dim - 1) * conv_ch * state_bytes_per_elem)
    costs = Costs(
        weight_bytes=int(resident * weight_bytes_per_param),
        weight_bytes_per_token=int(per_token * weight_bytes_per_param),
        state_bytes=int(state),
        kv_bytes_per_token=int(n_full * 2 * hkv * d * kv_bytes_per_elem),
        params_per_token=int(per_token),
        attn_flops_per_ctx=4 * n_full * hq * d,
    )
    return costs, int(resident)


def _geometry_of(engine):
    """The engine's geometry as `engine.config.ModelArgs` (every architecture file has its own args)."""
    from engine.config import ModelArgs  # noqa: PLC0415

    cfg = getattr(engine, "config", None)
    if isinstance(cfg, dict) and "hidden_size" in cfg:
        try:
            return ModelArgs.from_config(cfg)
        except Exception:  # noqa: BLE001  (a geometry we cannot read only costs us the estimates)
            return None
    args = getattr(engine, "args", None)
    return args if isinstance(args, ModelArgs) else None


def engine_costs(engine, info: dict) -> tuple[Costs, dict]:
    """Costs from `info()`, with what the engine leaves out estimated from its geometry."""
    from engine.bench import costs_from_info  # noqa: PLC0415

    costs = costs_from_info(info)
    source = {"weight_bytes_per_token": "engine" if "weight_bytes_per_token" in info else None}
    args = _geometry_of(engine)
    if args is None:
        return costs, source
    per_param = 4.0
    est, resident = geometry_costs(args, weight_bytes_per_param=1.0, kv_bytes_per_elem=4)
    if costs.weight_bytes:
        per_param = costs.weight_bytes / resident
    else:
        costs.weight_bytes = int(resident * per_param)
        source["weight_bytes"] = "estimated from geometry (float32)"
    if "weight_bytes_per_token" not in info:
        costs.weight_bytes_per_token = int(est.params_per_token * per_param)
        source["weight_bytes_per_token"] = "estimated from geometry"
    if "state_bytes" not in info:
        costs.state_bytes = est.state_bytes
    if "kv_bytes_per_token" not in info:
        costs.kv_bytes_per_token = est.kv_bytes_per_token
    if costs.params_per_token is None:
        costs.params_per_token = est.params_per_token
    if not costs.attn_flops_per_ctx:
        costs.attn_flops_per_ctx = est.attn_flops_per_ctx
    return costs, source


# ---------------------------------------------------------------------------------- engines
def _call_with_options(factory, what: str, *args, **opts):
    """Call an engine factory with the settings it declares; a setting it lacks is a user error."""
    try:
        params = inspect.signature(factory).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        params, takes_kwargs = {}, True
    for key, value in list(opts.items()):
        if key in params or (takes_kwargs and key != "spec"):  # (**kw of builders pass to engines: no spec there)
            continue
        # speculation is a decode mode (engine.speculative): a factory that does not size anything for it
        # builds the same engine
        if value is None or (key, value) == ("lanes", 1) or key == "spec":
            opts.pop(key)
            continue
        flag = {"kv": "--kv", "lanes": "--lanes", "spec": "--spec"}.get(key, key)
        raise NinferError(f"{what} does not support {flag} {value}", f"leave {flag} out")
    return factory(*args, **opts)


def instance_options(instance: Instance) -> dict:
    opts = {}
    if instance.kv is not None:
        opts["kv"] = instance.kv
    if instance.lanes != 1:
        opts["lanes"] = instance.lanes
    if instance.spec != "off":
        opts["spec"] = instance.spec
    return opts


def build_tiny(device: str, max_context: int, instance: Instance):
    """The `tiny` synthetic model: a small random Qwen3.5 hybrid run by the NumPy engine."""
    import numpy as np  # noqa: PLC0415

    from engine.api import load  # noqa: PLC0415
    from engine.config import ModelArgs  # noqa: PLC0415

    weights = tiny_weights(ModelArgs.from_config(TINY), np.random.default_rng(0))
    return _call_with_options(load, "the NumPy engine", {"config": dict(TINY), "weights": weights},
                              device=device, max_context=max_context, **instance_options(instance))


def tiny_weights(args, rng) -> dict:
    """Random weights of a Qwen3.5 geometry under the v3 logical names (container.md §2.3), with the MTP
    head when the geometry has one (drawn after the text weights, which stay those of a head-less model)."""
    import numpy as np  # noqa: PLC0415

    h, f32 = args.hidden_size, np.float32

    def mat(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(f32)

    def vec(n, scale=0.1):
        return (scale * rng.standard_normal(n)).astype(f32)

    hq, hkv, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim
    kdim = args.linear_num_key_heads * args.linear_key_head_dim
    vdim, hv = args.linear_value_dim, args.linear_num_value_heads

    def block(p: str, kind: str) -> dict:
        w = {p + "input_norm": vec(h), p + "post_attention_norm": vec(h)}
        if kind == "full_attention":
            w |= {p + "attention/query": mat(hq * d, h), p + "attention/gate": mat(hq * d, h),
                  p + "attention/key": mat(hkv * d, h), p + "attention/value": mat(hkv * d, h),
                  p + "attention/query_norm": vec(d), p + "attention/key_norm": vec(d),
                  p + "attention/output": mat(h, hq * d)}
        else:
            w |= {p + "gdn/query": mat(kdim, h), p + "gdn/key": mat(kdim, h), p + "gdn/value": mat(vdim, h),
                  p + "gdn/z": mat(vdim, h), p + "gdn/a_projection": mat(hv, h),
                  p + "gdn/b_projection": mat(hv, h), p + "gdn/a_log": vec(hv, 0.5),
                  p + "gdn/dt_bias": vec(hv, 0.5),
                  p + "gdn/convolution": mat(args.linear_conv_kernel_dim, 2 * kdim + vdim),
                  p + "gdn/norm": 1 + vec(args.linear_value_head_dim), p + "gdn/output": mat(h, vdim)}
        return w | {p + "mlp/gate": mat(args.intermediate_size, h), p + "mlp/up": mat(args.intermediate_size, h),
                    p + "mlp/down": mat(h, args.intermediate_size)}

    w = {"text/token_embedding": mat(args.vocab_size, h), "text/final_norm": vec(h)}
    if not args.tie_word_embeddings:
        w["text/output_head"] = mat(args.vocab_size, h)
    for i, kind in enumerate(args.layer_types):
        w |= block(f"text/layers/{i}/", kind)
    if args.mtp_num_hidden_layers:
        w |= {"mtp/input_projection": mat(h, 2 * h), "mtp/embedding_norm": vec(h), "mtp/hidden_norm": vec(h),
              "mtp/final_norm": vec(h)}
        w |= block("mtp/layers/0/", "full_attention")
    return w


def build_synthetic(geometry: str, *, recipe: str | None, device: str, max_context: int, instance: Instance):
    """A full-size synthetic engine (random packed weights in device memory); needs a CUDA GPU."""
    known = geometries()
    if geometry not in known:
        raise NinferError(f"unknown synthetic geometry {geometry!r}", f"pick one of {', '.join(known)}")
    if geometry == "tiny":
        return build_tiny(device, max_context, instance)
    if device != "gpu":
        raise NinferError(
            f"--synthetic {geometry} builds its weights in GPU memory and needs a CUDA GPU with CuPy",
            "run it on a machine with an NVIDIA GPU (pip install 'ninfer[cuda13]'), or use --synthetic tiny here",
        )
    from engine.synthetic import build_engine  # noqa: PLC0415

    opts = instance_options(instance)
    return _call_with_options(build_engine, "the synthetic GPU engine", geometry, recipe=recipe, device="gpu",
                              max_context=max_context, **opts)


def build_model(path: Path, *, device: str, max_context: int, instance: Instance):
    """Load a stored artifact with the engine settings of `instance`."""
    import engine  # noqa: PLC0415

    return _call_with_options(engine.load, "this engine", str(path), device=device, max_context=max_context,
                              **instance_options(instance))


def hf_config_of(model_path: Path | None, geometry: str | None) -> dict:
    """The HF-style text config a baseline model is built from."""
    if geometry:
        return dict(geometries()[geometry][0])
    from engine.artifact.container import open_artifact  # noqa: PLC0415

    art = open_artifact(model_path)
    return dict(art.components["text"]["config"])
