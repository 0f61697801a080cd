"""Weights in device memory for the CUDA decode path: from an artifact, from float arrays, or random.

All three produce the same mapping the CUDA model takes: logical name -> `DevMatrix` for matrices
(packed planes kept as they are on disk) and float32 CuPy arrays for norms, conv taps and gates.
"""
from __future__ import annotations

import math

import numpy as np

from engine.artifact import formats
from engine.config import QWEN_TOKEN_DOMAIN
from engine.gpu.gemv import DevMatrix
from engine.models.qwen3_5 import PROPOSAL_ROWS

# The groupwise-int recipe (spec/container.md §2.8): format of each logical matrix by its role.
GROUPWISE_INT = {
    "attention/query": "q4_g64_fp16", "attention/key": "q4_g64_fp16",
    "attention/gate": "q5_g64_fp16", "attention/value": "q5_g64_fp16", "attention/output": "q5_g64_fp16",
    "gdn/query": "q4_g64_fp16", "gdn/key": "q4_g64_fp16", "gdn/value": "q5_g64_fp16", "gdn/z": "q5_g64_fp16",
    "gdn/output": "q5_g64_fp16", "gdn/a_projection": "bf16", "gdn/b_projection": "bf16",
    "mlp/gate": "q4_g64_fp16", "mlp/up": "q4_g64_fp16", "mlp/down": "q5_g64_fp16",
    "text/token_embedding": "q6_g64_fp16", "text/output_head": "q6_g64_fp16", "proposal/head": "q4_g64_fp16",
}
RECIPES = {
    "groupwise-int": GROUPWISE_INT,
    "groupwise-int-w8head": {**GROUPWISE_INT, "text/token_embedding": "q8_g32_fp16",
                             "text/output_head": "q8_g32_fp16"},
    "q8": {k: ("bf16" if v == "bf16" else "q8_g32_fp16") for k, v in GROUPWISE_INT.items()},
}
# Qwen3.6-35B-A3B groupwise-int (spec/container.md §2.8): W8 for the dense matrices, Q4/Q5 routed experts
GROUPWISE_INT_MOE = {k: ("bf16" if v == "bf16" else "q8_g32_fp16") for k, v in GROUPWISE_INT.items()}
GROUPWISE_INT_MOE.update({"text/output_head": "q6_g64_fp16", "moe/router": "bf16", "moe/shared_score": "bf16",
                          "moe/experts/gate": "q4_g64_fp16", "moe/experts/up": "q4_g64_fp16",
                          "moe/experts/down": "q5_g64_fp16", "moe/shared/gate": "q8_g32_fp16",
                          "moe/shared/up": "q8_g32_fp16", "moe/shared/down": "q8_g32_fp16",
                          "proposal/head": "q4_g64_fp16"})
RECIPES["groupwise-int-moe"] = GROUPWISE_INT_MOE
VECTORS = ("input_norm", "post_attention_norm", "final_norm", "query_norm", "key_norm", "gdn/norm",
           "gdn/a_log", "gdn/dt_bias", "gdn/convolution", "mtp/embedding_norm", "mtp/hidden_norm")
# the components the CUDA engine uploads (the MTP head and its proposal head: speculative decoding)
DEVICE_PREFIXES = ("text/", "mtp/", "proposal/")
IDS = ("proposal/token_ids",)  # int32 vectors, uploaded as they are


def concat_rows(cp, mats: list[DevMatrix]) -> DevMatrix:
    """One packed matrix holding the rows of several (same format and K), planes copied on the device."""
    if len(mats) == 1:
        return mats[0]
    first = mats[0]
    if all(b.buf is first.buf and b.row0 == a.row0 + a.n for a, b in zip(mats, mats[1:])):
        # rows already adjacent in one object (the published artifacts' fused parents): a view
        return DevMatrix(first.fmt, sum(m.n for m in mats), first.k, first.buf, first.row0, first.gpr,
                         first.base, first.high, first.scales)
    fmt, k = first.fmt, first.k
    if any(m.fmt != fmt or m.k != k for m in mats):
        raise ValueError("cannot fuse matrices of different formats or widths")
    n = sum(m.n for m in mats)
    if fmt in ("bf16", "fp32"):
        es = 2 if fmt == "bf16" else 4
        buf = cp.empty(n * k * es, dtype=cp.uint8)
        off = 0
        for m in mats:
            nb = m.n * k * es
            buf[off:off + nb] = m.buf[m.base:m.base + nb]
            off += nb
        return DevMatrix.from_object(fmt, (n, k), buf)
    geo = formats.rowsplit_geometry(fmt, (n, k))
    buf = cp.zeros(geo.bytes, dtype=cp.uint8)
    hb, gpr = geo.high_bytes_per_group, geo.groups_per_row
    r = 0
    for m in mats:
        for off_src, off_dst, per_row in ((m.base, geo.base_off, 32 * gpr), (m.high, geo.high_off, hb * gpr),
                                          (m.scales, geo.scale_off, 2 * gpr)):
            nb = m.n * per_row
            if nb:
                buf[off_dst + r * per_row: off_dst + r * per_row + nb] = m.buf[off_src:off_src + nb]
        r += m.n
    return DevMatrix.from_object(fmt, (n, k), buf)


def role(name: str) -> str:
    """'text/layers/3/attention/query' -> 'attention/query', '.../moe/experts/7/up' -> 'moe/experts/up';
    top-level names stay whole."""
    parts = name.split("/")
    if len(parts) > 3 and parts[1] == "layers":
        parts = parts[3:]
        if parts[:2] == ["moe", "experts"] and len(parts) == 4:
            parts = ["moe", "experts", parts[3]]
        return "/".join(parts)
    return name


def is_vector(name: str) -> bool:
    return any(name.endswith(v) for v in VECTORS)


def upload_matrix(cp, fmt: str, x: np.ndarray) -> DevMatrix:
    """Encode a float matrix [N, K] in `fmt` (canonical encoder) and put it on the device."""
    x = np.asarray(x, dtype=np.float32)
    if fmt == "bf16":
        raw = formats.f32_to_bf16_bits(x).view(np.uint8).ravel()
    else:
        raw = formats.encode(fmt, "row_split_k128_v1", x)
    return DevMatrix.from_object(fmt, x.shape, cp.asarray(raw))


def as_stored(weights: dict, recipe: str = "groupwise-int") -> dict:
    """The float values the packed planes of `recipe` represent (what both engines must compute with
    when a test compares them): matrices encoded and decoded, bf16 ones rounded, vectors as float32."""
    table = RECIPES[recipe]
    out = {}
    for name, v in weights.items():
        if not name.startswith(DEVICE_PREFIXES):
            continue
        if name in IDS:
            out[name] = np.asarray(v, np.int32)
            continue
        v = np.asarray(v, np.float32)
        fmt = None if is_vector(name) or v.ndim != 2 else table.get(role(name), "q8_g32_fp16")
        if fmt is None:
            out[name] = v
        elif fmt == "bf16":
            out[name] = formats.bf16_bits_to_f32(formats.f32_to_bf16_bits(v))
        else:
            out[name] = formats.decode(fmt, "row_split_k128_v1", v.shape, formats.encode(fmt, "row_split_k128_v1", v))
    return out


def from_logical(args, weights: dict, recipe: str = "groupwise-int") -> dict:
    """Device weights from float arrays keyed by logical name (tests, HF checkpoints in memory)."""
    import cupy as cp  # noqa: PLC0415

    table = RECIPES[recipe]
    out = {}
    for name, value in weights.items():
        if not name.startswith(DEVICE_PREFIXES):
            continue
        if name in IDS:
            out[name] = cp.asarray(np.asarray(value, dtype=np.int32))
        elif is_vector(name):
            out[name] = cp.asarray(np.asarray(value, dtype=np.float32))
        else:
            out[name] = upload_matrix(cp, table.get(role(name), "q8_g32_fp16"), value)
    return out


def upload_bytes(artifact) -> int:
    """Bytes of the packed text objects a GPU load copies (each object once; the vectors are negligible)."""
    seen, total = set(), 0
    for name in artifact.bindings:
        if not name.startswith(DEVICE_PREFIXES) or is_vector(name):
            continue
        for s in artifact.packed(name):
            if s.object_id not in seen:
                seen.add(s.object_id)
                total += int(np.asarray(artifact.object_bytes(s.object_id)).nbytes)
    return total


def from_artifact(artifact, progress=None, xp=None) -> dict:
    """Device weights from a v3 artifact: every physical object uploaded once, parameters as row views.

    `progress(done_bytes, total_bytes)` is called after each object (the packed planes are copied as
    stored: the file's bytes are the device's bytes). `xp` is CuPy unless given (tests pass NumPy)."""
    if xp is None:
        import cupy as xp  # noqa: PLC0415
    cp = xp
    total = upload_bytes(artifact) if progress is not None else 0
    done = 0
    objects = {}
    out = {}
    for name in artifact.bindings:
        if not name.startswith(DEVICE_PREFIXES):
            continue
        if name in IDS:
            out[name] = cp.asarray(np.asarray(artifact.parameter(name, dtype=None), dtype=np.int32))
            continue
        if is_vector(name):
            out[name] = cp.asarray(artifact.parameter(name).astype(np.float32))
            continue
        slices = artifact.packed(name)
        mats = []
        for s in slices:
            if s.object_id not in objects:
                host = np.asarray(artifact.object_bytes(s.object_id))
                objects[s.object_id] = cp.asarray(host)
                if progress is not None:
                    done += int(host.nbytes)
                    progress(min(done, total), total)
            mats.append(DevMatrix.from_object(s.fmt, s.shape, objects[s.object_id], s.row0, s.row1))
        if len(mats) == 1:
            out[name] = mats[0]
        else:
            out[name] = concat_rows(cp, mats)
    return out


def _random_words(cp, rng, nbytes: int):
    words = rng.integers(0, 2**31 - 1, size=(nbytes + 3) // 4, dtype=cp.int32)
    return words.view(cp.uint8)[:nbytes]


def random_matrix(cp, rng, fmt: str, n: int, k: int) -> DevMatrix:
    """A packed [n, k] matrix of random codes and scales (~unit-variance outputs for unit inputs)."""
    if fmt == "bf16":
        vals = (rng.standard_normal((n, k), dtype=cp.float32) / math.sqrt(k)).view(cp.uint32)
        buf = (vals >> 16).astype(cp.uint16).view(cp.uint8).ravel()
        return DevMatrix.from_object(fmt, (n, k), buf)
    geo = formats.rowsplit_geometry(fmt, (n, k))
    buf = cp.zeros(geo.bytes + 4, dtype=cp.uint8)
    base_bytes = n * geo.groups_per_row * 32
    buf[:base_bytes] = _random_words(cp, rng, base_bytes)
    if fmt == "q8_g32_fp16":
        b = buf[:base_bytes]
        b[b == 0x80] = 0x81
    hb = n * geo.groups_per_row * geo.high_bytes_per_group
    if hb:
        buf[geo.high_off:geo.high_off + hb] = _random_words(cp, rng, hb)
    code_rms = {"q4_g64_fp16": 4.6, "q5_g64_fp16": 9.2, "q6_g64_fp16": 18.5, "q8_g32_fp16": 73.0}[fmt]
    s = rng.uniform(0.5, 1.5, size=n * geo.groups_per_row, dtype=cp.float32) / (code_rms * math.sqrt(k))
    buf[geo.scale_off:geo.scale_off + 2 * s.size] = s.astype(cp.float16).view(cp.uint8)
    return DevMatrix.from_object(fmt, (n, k), buf[:geo.bytes])


def mtp_table(table: dict) -> dict:
    """The MTP head's formats beside a recipe's: its matrices in q8, as the published files store them (the bf16
    ones, the router, stay bf16)."""
    return {k: ("bf16" if v == "bf16" else "q8_g32_fp16") for k, v in table.items()}


def synthetic(args, recipe: str = "groupwise-int", seed: int = 0) -> dict:
    """Random weights of the real geometry and recipe, made directly in device memory."""
    import cupy as cp  # noqa: PLC0415

    rng = cp.random.default_rng(seed)
    table = RECIPES[recipe]
    a = args
    H = a.hidden_size
    out = {
        "text/token_embedding": random_matrix(cp, rng, table["text/token_embedding"], a.vocab_size, H),
        "text/output_head": random_matrix(cp, rng, table["text/output_head"], a.vocab_size, H),
        "text/final_norm": cp.zeros(H, dtype=cp.float32),
    }
    qd, kvd = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    kd, vd = a.linear_num_key_heads * a.linear_key_head_dim, a.linear_num_value_heads * a.linear_value_head_dim
    hv = a.linear_num_value_heads

    def layer(p: str, kind: str, table=table) -> None:
        if a.is_moe:
            shapes = {"moe/shared/gate": (a.shared_expert_intermediate_size, H),
                      "moe/shared/up": (a.shared_expert_intermediate_size, H),
                      "moe/shared/down": (H, a.shared_expert_intermediate_size)}
            E, ie = a.num_experts, a.moe_intermediate_size
            router = random_matrix(cp, rng, table["moe/router"], E + 1, H)
            out[p + "moe/router"], out[p + "moe/shared_score"] = _rows(router, 0, E), _rows(router, E, E + 1)
            gu = random_matrix(cp, rng, table["moe/experts/gate"], E * 2 * ie, H)
            dn = random_matrix(cp, rng, table["moe/experts/down"], E * H, ie)
            for e in range(E):
                out[p + f"moe/experts/{e}/gate"] = _rows(gu, 2 * e * ie, (2 * e + 1) * ie)
                out[p + f"moe/experts/{e}/up"] = _rows(gu, (2 * e + 1) * ie, (2 * e + 2) * ie)
                out[p + f"moe/experts/{e}/down"] = _rows(dn, e * H, (e + 1) * H)
        else:
            shapes = {"mlp/gate": (a.intermediate_size, H), "mlp/up": (a.intermediate_size, H),
                      "mlp/down": (H, a.intermediate_size)}
        if kind == "full_attention":
            shapes.update({"attention/query": (qd, H), "attention/key": (kvd, H), "attention/gate": (qd, H),
                           "attention/value": (kvd, H), "attention/output": (H, qd)})
            out[p + "attention/query_norm"] = cp.zeros(a.head_dim, dtype=cp.float32)
            out[p + "attention/key_norm"] = cp.zeros(a.head_dim, dtype=cp.float32)
        else:
            shapes.update({"gdn/query": (kd, H), "gdn/key": (kd, H), "gdn/value": (vd, H), "gdn/z": (vd, H),
                           "gdn/a_projection": (hv, H), "gdn/b_projection": (hv, H), "gdn/output": (H, vd)})
            c = 2 * kd + vd
            out[p + "gdn/convolution"] = rng.standard_normal((a.linear_conv_kernel_dim, c), dtype=cp.float32) * 0.5
            out[p + "gdn/a_log"] = cp.log(rng.uniform(1, 16, size=hv, dtype=cp.float32))
            out[p + "gdn/dt_bias"] = cp.zeros(hv, dtype=cp.float32)
            out[p + "gdn/norm"] = cp.ones(a.linear_value_head_dim, dtype=cp.float32)
        # fused parents as the published artifacts store them: one object per pair of roles
        for pair in (("attention/query", "attention/key"), ("attention/gate", "attention/value"),
                     ("gdn/query", "gdn/key"), ("gdn/value", "gdn/z"), ("gdn/a_projection", "gdn/b_projection"),
                     ("mlp/gate", "mlp/up"), ("moe/shared/gate", "moe/shared/up")):
            if pair[0] in shapes:
                n0, n1 = shapes[pair[0]][0], shapes[pair[1]][0]
                parent = random_matrix(cp, rng, table[pair[0]], n0 + n1, H)
                out[p + pair[0]] = _rows(parent, 0, n0)
                out[p + pair[1]] = _rows(parent, n0, n0 + n1)
                del shapes[pair[0]], shapes[pair[1]]
        for r, (n, k) in shapes.items():
            out[p + r] = random_matrix(cp, rng, table[r], n, k)
        out[p + "input_norm"] = cp.zeros(H, dtype=cp.float32)
        out[p + "post_attention_norm"] = cp.zeros(H, dtype=cp.float32)

    for i, kind in enumerate(a.layer_types):
        layer(f"text/layers/{i}/", kind)
    if a.mtp_num_hidden_layers:  # the MTP head: one full-attention block, its input projection and norms
        layer("mtp/layers/0/", "full_attention", mtp_table(table))
        out["mtp/input_projection"] = random_matrix(cp, rng, table.get("mtp/input_projection", "q8_g32_fp16"), H, 2 * H)
        for n in ("embedding_norm", "hidden_norm", "final_norm"):
            out[f"mtp/{n}"] = cp.zeros(H, dtype=cp.float32)
        # and the proposal head the published artifacts carry beside it: a shortlist of the domain's ids
        rows = min(PROPOSAL_ROWS, a.vocab_size)
        out["proposal/head"] = random_matrix(cp, rng, table.get("proposal/head", "q4_g64_fp16"), rows, H)
        ids = np.random.default_rng(seed + 1).permutation(min(a.vocab_size, QWEN_TOKEN_DOMAIN))[:rows]
        out["proposal/token_ids"] = cp.asarray(ids.astype(np.int32))
    return out


def _rows(parent: DevMatrix, r0: int, r1: int) -> DevMatrix:
    return DevMatrix.from_object(parent.fmt, (parent.n, parent.k), parent.buf, r0, r1)
