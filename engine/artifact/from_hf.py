"""Hugging Face Qwen3.5 checkpoint folder (config.json + safetensors + tokenizer files) -> v3 `.ninfer`.

Streaming: safetensors shards are memory-mapped; the plan (names, shapes, formats) is built from
the shard headers, then each logical parameter is read, encoded and written one at a time, so
memory stays at about one source tensor. Checkpoint quirks (q/gate split, fused experts, conv
layout) live in `engine.models.qwen3_5.hf_to_logical`; this module only chooses formats and writes.
Each logical parameter is its own object with a whole-object binding.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from engine.artifact import formats
from engine.artifact.upgrade_rules import inputs_of
from engine.artifact.writer import DEFAULT_SPLIT_LIMIT, write_artifact
from engine.errors import NinferError

RECIPES = ("groupwise-int", "q8", "bf16", "fp32")
RESOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
_ST_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
              "I32": np.int32, "I64": np.int64, "U8": np.uint8, "I8": np.int8}
Q4, Q5, Q6, Q8 = "q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"
_Q4_ROLES = ("attention/query", "attention/key", "gdn/query", "gdn/key", "mlp/gate", "mlp/up")
_Q5_ROLES = ("attention/gate", "attention/value", "attention/output", "gdn/value", "gdn/z", "gdn/output", "mlp/down")
# the published 35B-A3B recipe keeps the routed down projections of three late layers at Q6
_Q6_DOWN_LAYERS_35B = (34, 38, 39)
_SMALL_MATRICES = ("gdn/a_projection", "gdn/b_projection", "gdn/convolution", "moe/router", "moe/shared_score")


# --- safetensors (read directly: NumPy has no bfloat16, so BF16 stays uint16 bit patterns) ---

class SafetensorsFile:
    """One shard: header parsed, data memory-mapped lazily."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise NinferError(f"{path}: not a safetensors file (too short)")
            n = struct.unpack("<Q", head)[0]
            if n > size - 8 or n > 100_000_000:
                raise NinferError(f"{path}: not a safetensors file (header length {n})", "re-download the shard")
            try:
                header = json.loads(f.read(n))
            except ValueError as e:
                raise NinferError(f"{path}: safetensors header is not JSON ({e})", "re-download the shard") from None
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        self.size = size
        self.tensors = header
        self._map = None

    def shape(self, name: str) -> tuple:
        return tuple(self.tensors[name]["shape"])

    def dtype(self, name: str):
        d = self.tensors[name]["dtype"]
        if d not in _ST_DTYPES:
            raise NinferError(f"{self.path}: tensor {name} has unsupported dtype {d}")
        return np.dtype(_ST_DTYPES[d])

    def array(self, name: str) -> np.ndarray:
        """A read-only view of the tensor (BF16 as uint16 bit patterns)."""
        info = self.tensors[name]
        lo, hi = info["data_offsets"]
        if self.data_start + hi > self.size:
            raise NinferError(f"{self.path}: tensor {name} lies past the end of the file (truncated?)",
                              "re-download the shard")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[self.data_start + lo: self.data_start + hi]
        return raw.view(self.dtype(name)).reshape(self.shape(name))


def _shards(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise NinferError(f"{index}: not a safetensors index ({e})") from None
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise NinferError(f"{folder}: shard {missing[0]} listed in the index is missing", "download every shard")
        return [folder / n for n in names]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise NinferError(f"{folder}: no *.safetensors files", "point at a Hugging Face checkpoint folder")
    return found


# --- config and formats ---------------------------------------------------------------------

def text_config(config: dict) -> dict:
    """The HF-style text config the engine reads (a multimodal wrapper's text_config, flattened)."""
    if "text_config" in config and "hidden_size" not in config:
        cfg = dict(config["text_config"])
        for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
            if key not in cfg and key in config:
                cfg[key] = config[key]
    else:
        cfg = dict(config)
    moe = bool(cfg.get("num_experts"))
    cfg["architectures"] = ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"]
    mt = str(cfg.get("model_type", "qwen3_5_moe_text" if moe else "qwen3_5_text"))
    cfg["model_type"] = mt if mt.endswith("_text") else mt + "_text"
    for key in ("torch_dtype", "dtype", "transformers_version", "_name_or_path"):
        cfg.pop(key, None)
    return cfg


def choose_format(recipe: str, name: str, shape: tuple, *, moe: bool, n_layers: int = 0) -> str:
    """Storage format of one logical parameter under a recipe (spec §2.8 for groupwise-int)."""
    if name.endswith(("gdn/a_log", "gdn/dt_bias")) or recipe == "fp32":
        return "fp32"
    if len(shape) != 2 or recipe == "bf16" or name.endswith(_SMALL_MATRICES):
        return "bf16"
    if recipe == "q8" or name.startswith("mtp/"):
        return Q8
    if name == "text/token_embedding":
        return Q8 if moe else Q6
    if name in ("text/output_head", "proposal/head"):
        return Q6
    if moe:
        if "/moe/experts/" in name:
            if name.endswith("/down") and n_layers == 40 and int(name.split("/")[2]) in _Q6_DOWN_LAYERS_35B:
                return Q6
            return Q4 if name.endswith(("/gate", "/up")) else Q5
        return Q8
    role = name.split("/", 3)[-1] if name.startswith("text/layers/") else name
    if role in _Q4_ROLES:
        return Q4
    if role in _Q5_ROLES:
        return Q5
    return Q8


def _as_source(arr: np.ndarray, fmt: str) -> np.ndarray:
    """What `formats.encode` should see: bf16 bit patterns (uint16) pass to bf16 and groupwise
    encoders as they are; fp32 targets widen them first."""
    if arr.dtype == np.uint16 and fmt == "fp32":
        return formats.bf16_bits_to_f32(arr)
    if arr.dtype not in (np.uint16, np.float32):
        return np.asarray(arr, dtype=np.float32)
    return arr


# --- conversion -----------------------------------------------------------------------------

def _resources(folder: Path) -> tuple[dict, dict]:
    blobs, roles = {}, {}
    for name in RESOURCE_FILES:
        p = folder / name
        if p.is_file():
            blobs[f"text/{name}"] = p.read_bytes()
            roles[name] = f"text/{name}"
    if "chat_template.jinja" not in roles and "tokenizer_config.json" in roles:
        try:
            tpl = json.loads(blobs["text/tokenizer_config.json"]).get("chat_template")
        except ValueError:
            tpl = None
        if isinstance(tpl, str):
            blobs["text/chat_template.jinja"] = tpl.encode("utf-8")
            roles["chat_template.jinja"] = "text/chat_template.jinja"
    return blobs, roles


def plan(folder, recipe: str = "groupwise-int"):
    """(components, [(logical name, fmt, shape, shard, hf name)], resources) for a checkpoint folder.

    Everything is validated against the model's expected parameter set before any byte is written."""
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import hf_to_logical, logical_shapes

    folder = Path(folder)
    if recipe not in RECIPES:
        raise NinferError(f"unknown recipe {recipe!r}", f"choose one of {', '.join(RECIPES)}")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise NinferError(f"{folder}: no config.json", "point at a Hugging Face checkpoint folder")
    try:
        cfg = text_config(json.loads(cfg_path.read_text()))
    except ValueError as e:
        raise NinferError(f"{cfg_path}: not valid JSON ({e})") from None
    if not str(cfg.get("model_type", "")).startswith("qwen3_5"):
        raise NinferError(f"{cfg_path}: model_type {cfg.get('model_type')!r} is not a Qwen3.5 architecture",
                          "GGUF files of other architectures convert with `ninfer convert FILE.gguf`")
    args = ModelArgs.from_config(cfg)
    moe = args.is_moe
    entries, has_mtp = [], False
    for shard in (SafetensorsFile(p) for p in _shards(folder)):
        for hf_name in shard.tensors:
            dummy = np.broadcast_to(np.zeros((), shard.dtype(hf_name)), shard.shape(hf_name))
            try:
                outs = hf_to_logical(hf_name, dummy, args)
            except (ValueError, IndexError) as e:
                raise NinferError(f"{shard.path}: tensor {hf_name}: {e}", "is this a Qwen3.5 checkpoint?") from None
            for name, a in outs:
                has_mtp |= name.startswith("mtp/")
                entries.append((name, choose_format(recipe, name, a.shape, moe=moe, n_layers=args.num_hidden_layers),
                                tuple(a.shape), shard, hf_name))
    if has_mtp and not args.mtp_num_hidden_layers:
        args = ModelArgs.from_config({**cfg, "mtp_num_hidden_layers": 1})
    want = logical_shapes(args, mtp=has_mtp)
    got = {n: s for n, _, s, _, _ in entries}
    missing = sorted(set(want) - set(got))
    if missing:
        raise NinferError(f"{folder}: checkpoint lacks {len(missing)} parameters, e.g. {missing[0]}",
                          "download every shard of the checkpoint")
    for n, s in got.items():
        if n not in want or tuple(want[n]) != s:
            raise NinferError(f"{folder}: parameter {n} has shape {list(s)}, config says {list(want.get(n, ()))}",
                              "config.json and the weights disagree")
    order = {n: i for i, n in enumerate(want)}
    entries.sort(key=lambda e: order[e[0]])
    blobs, roles = _resources(folder)
    comps = {"text": {"config": cfg, "resources": roles}}
    if has_mtp:
        comps["mtp"] = {"config": {"architectures": ["Qwen3_5MoeMTP" if moe else "Qwen3_5MTP"]}, "target": "text"}
    return comps, entries, blobs, args


def convert(folder, out, recipe: str = "groupwise-int", *, split_limit: int = DEFAULT_SPLIT_LIMIT,
            progress=None, name: str | None = None) -> Path:
    """Convert a Qwen3.5 checkpoint folder to a v3 artifact at `out`.

    progress: optional callable(done_bytes, total_bytes, parameter_name)."""
    from engine.models.qwen3_5 import hf_to_logical

    folder = Path(folder)
    comps, entries, blobs, args = plan(folder, recipe)
    # outputs of partly consumed source tensors; an entry goes once all its outputs are written
    # (logical order may alternate between two sources, e.g. fused gate_up and down experts)
    pending: dict = {}

    def loader(logical, fmt, shard, hf_name):
        def load():
            key = (str(shard.path), hf_name)
            if key not in pending:
                pending[key] = dict(hf_to_logical(hf_name, shard.array(hf_name), args))
            outs = pending[key]
            arr = outs.pop(logical)
            if not outs:
                del pending[key]
            return _as_source(np.asarray(arr), fmt)
        return load

    backends = [b for b in ("mtp",) if b in comps]
    uses = [{"parameter": n, "input": inp, "activation_policy": "A16Only"}
            for n, *_ in entries for inp in inputs_of(n, backends)]
    tensors = [(n, fmt, formats.ROW_SPLIT if fmt in formats.GROUPWISE else formats.CONTIGUOUS, shape,
                loader(n, fmt, shard, hf)) for n, fmt, shape, shard, hf in entries]
    return write_artifact(out, comps, tensors, blobs, uses=uses, metadata={"name": name or folder.name},
                          provenance={"imported_from": {"format": "safetensors", "folder": folder.name},
                                      "recipe": recipe},
                          split_limit=split_limit, progress=progress)


from_hf = convert


def source_bytes(folder) -> int:
    """Bytes of tensor data in a checkpoint folder (for throughput figures)."""
    return sum(p.stat().st_size for p in _shards(Path(folder)))

