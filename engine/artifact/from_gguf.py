"""GGUF file -> v3 `.ninfer`, through the `gguf` package.

GGUF quant types are dequantized with gguf's own `dequantize`, then stored under a recipe:
by default fp32 for models under 1B parameters (they then reproduce the GGUF reference exactly),
bf16 above. Architecture quirks (llama.cpp's q/k row permutation, names) live in the model files'
loaders (`engine.models.llama.weights_from_gguf`); this module plans, encodes and writes.
The tokenizer travels as `tokenizer.json` (built by the text front end) when the vocabulary is
byte-level BPE, and always as raw `gguf_tokenizer.json` metadata; `tokenizer.chat_template`
becomes `chat_template.jinja`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from engine.artifact import formats
from engine.artifact.upgrade_rules import inputs_of
from engine.artifact.writer import DEFAULT_SPLIT_LIMIT, write_artifact
from engine.errors import NinferError

RECIPES = ("fp32", "bf16", "q8", "groupwise-int")
SMALL_MODEL_PARAMS = 1_000_000_000
_TOKENIZER_KEYS = ("model", "pre", "tokens", "token_type", "merges", "scores", "bos_token_id", "eos_token_id",
                   "padding_token_id", "unknown_token_id", "add_bos_token", "add_eos_token")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def open_reader(path):
    """A gguf.GGUFReader, or a NinferError naming the file when it is not a readable GGUF."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise NinferError(f"{path}: no such file", "check the path")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError... on damaged files
        raise NinferError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})",
                          "re-download the file") from None


def architecture(reader) -> str:
    return str(_field(reader, "general.architecture", ""))


def _mapper(arch: str, path: Path):
    """(config_from_gguf, weights_from_gguf) of the model file that knows this architecture."""
    if arch == "llama":
        from engine.models import llama

        return llama.config_from_gguf, llama.weights_from_gguf
    if arch in ("qwen35", "qwen35moe"):
        from engine.models import qwen3_5

        if hasattr(qwen3_5, "weights_from_gguf"):
            return qwen3_5.config_from_gguf, qwen3_5.weights_from_gguf
        from engine.artifact import gguf_qwen35

        return gguf_qwen35.config_from_gguf, gguf_qwen35.weights_from_gguf
    raise NinferError(f"{path}: GGUF architecture {arch!r} is not supported",
                      "ninfer imports llama (SmolLM2) and qwen35/qwen35moe GGUF files")


def _shape_only_reader(reader):
    """A stand-in reader whose tensors are zero-cost F32 broadcasts of the right shapes: running the
    model file's mapping over it yields names and shapes without dequantizing anything."""
    import gguf

    tensors = []
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        data = np.broadcast_to(np.zeros((), np.float32), shape)
        tensors.append(SimpleNamespace(name=t.name, shape=t.shape, tensor_type=gguf.GGMLQuantizationType.F32, data=data))
    return SimpleNamespace(fields=reader.fields, tensors=tensors)


def default_recipe(n_params: int) -> str:
    return "fp32" if n_params < SMALL_MODEL_PARAMS else "bf16"


def choose_format(recipe: str, name: str, shape: tuple, moe: bool) -> str:
    if recipe in ("fp32", "bf16"):
        return "fp32" if recipe == "fp32" or name.endswith(("gdn/a_log", "gdn/dt_bias")) else "bf16"
    from engine.artifact.from_hf import choose_format as hf_choose

    fmt = hf_choose(recipe, name, shape, moe=moe)
    if name.startswith("text/layers/") and fmt in formats.GROUPWISE and "/attention/" not in name \
            and "/gdn/" not in name and "/mlp/" not in name and "/moe/" not in name:
        return "bf16"
    return fmt


def tokenizer_resources(reader, path: Path) -> tuple[dict, dict, dict]:
    """(blobs by object id, role -> object id, extra config fields) for the text component."""
    blobs, roles = {}, {}
    raw = {k: _field(reader, f"tokenizer.ggml.{k}") for k in _TOKENIZER_KEYS}
    raw = {k: v for k, v in raw.items() if v is not None}
    if raw.get("tokens") is None:
        raise NinferError(f"{path}: GGUF has no tokenizer (tokenizer.ggml.tokens)", "use a GGUF with its vocabulary")
    blobs["text/gguf_tokenizer.json"] = json.dumps(raw, ensure_ascii=False).encode("utf-8")
    roles["gguf_tokenizer.json"] = "text/gguf_tokenizer.json"
    tok_config = {}
    try:
        from engine.text.tokenizer import tokenizer_config_from_gguf, tokenizer_json_from_gguf

        tok_config = tokenizer_config_from_gguf(reader)
        blobs["text/tokenizer.json"] = tokenizer_json_from_gguf(reader).encode("utf-8")
        roles["tokenizer.json"] = "text/tokenizer.json"
    except (ImportError, NinferError):
        pass  # not byte-level BPE: the raw metadata above still carries the vocabulary
    template = _field(reader, "tokenizer.chat_template")
    tok_config.pop("chat_template", None)
    if tok_config:
        blobs["text/tokenizer_config.json"] = json.dumps(tok_config, ensure_ascii=False).encode("utf-8")
        roles["tokenizer_config.json"] = "text/tokenizer_config.json"
    if template:
        blobs["text/chat_template.jinja"] = str(template).encode("utf-8")
        roles["chat_template.jinja"] = "text/chat_template.jinja"
    extra = {}
    for key, cfg_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        if key in raw:
            extra[cfg_key] = int(raw[key])
    return blobs, roles, extra


def plan(path, recipe: str | None = None):
    """(reader, config, recipe, [(name, fmt, shape)], resources, roles) for a GGUF file."""
    path = Path(path)
    if recipe is not None and recipe not in RECIPES:
        raise NinferError(f"unknown recipe {recipe!r}", f"choose one of {', '.join(RECIPES)}")
    reader = open_reader(path)
    arch = architecture(reader)
    config_fn, weights_fn = _mapper(arch, path)
    try:
        config = dict(config_fn(reader))
        shapes = [(n, tuple(a.shape)) for n, a in weights_fn(_shape_only_reader(reader))]
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise NinferError(f"{path}: GGUF metadata is incomplete for {arch} ({type(e).__name__}: {e})",
                          "re-download the file") from None
    if not shapes:
        raise NinferError(f"{path}: GGUF holds no tensors this importer knows")
    n_params = sum(math.prod(s) for _, s in shapes)
    recipe = recipe or default_recipe(n_params)
    blobs, roles, extra = tokenizer_resources(reader, path)
    for k, v in extra.items():
        config.setdefault(k, v)
    moe = bool(config.get("num_experts"))
    entries = [(n, choose_format(recipe, n, s, moe), s) for n, s in shapes]
    return reader, config, recipe, entries, blobs, roles


def convert(src, out, recipe: str | None = None, *, split_limit: int = DEFAULT_SPLIT_LIMIT, progress=None,
            name: str | None = None) -> Path:
    """Convert a GGUF file to a v3 artifact at `out`; recipe None picks fp32 under 1B parameters, else bf16.

    progress: optional callable(done_bytes, total_bytes, parameter_name)."""
    src = Path(src)
    reader, config, recipe, entries, blobs, roles = plan(src, recipe)
    _, weights_fn = _mapper(architecture(reader), src)
    stream = iter(weights_fn(reader))

    def loader(expected: str, fmt: str):
        def load():
            got, arr = next(stream)
            if got != expected:
                raise NinferError(f"{src}: tensor order changed while reading ({got} != {expected})")
            return np.asarray(arr, dtype=np.float32)
        return load

    tensors = [(n, fmt, formats.ROW_SPLIT if fmt in formats.GROUPWISE else formats.CONTIGUOUS, s, loader(n, fmt))
               for n, fmt, s in entries]
    comps = {"text": {"config": config, "resources": roles}}
    if any(n.startswith("mtp/") for n, _, _ in entries):
        moe = bool(config.get("num_experts"))
        comps["mtp"] = {"config": {"architectures": ["Qwen3_5MoeMTP" if moe else "Qwen3_5MTP"]}, "target": "text"}
    uses = [{"parameter": n, "input": inp, "activation_policy": "A16Only"}
            for n, _, _ in entries for inp in inputs_of(n, [b for b in ("mtp",) if b in comps])]
    meta_name = name or str(_field(reader, "general.name", "") or src.stem)
    return write_artifact(out, comps, tensors, blobs, uses=uses, metadata={"name": meta_name},
                          provenance={"imported_from": {"format": "gguf", "file": src.name,
                                                        "architecture": architecture(reader)}, "recipe": recipe},
                          split_limit=split_limit, progress=progress)


from_gguf = convert
