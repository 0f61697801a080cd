"""`--baseline transformers`: the same benchmark protocol over a Hugging Face model of the same geometry.

Weights are random (speed does not depend on their values once stops are off), bf16 on CUDA and fp32
on CPU, built straight on the device. torch and transformers are optional: everything here imports
them lazily and turns their absence into a NinferError.
"""
from __future__ import annotations

import numpy as np

from engine.errors import NinferError


class TransformersEngine:
    """reset / prefill / decode_greedy / info over `AutoModelForCausalLM` with its own cache."""

    def __init__(self, model, torch, device: str, note: str):
        self.model, self.torch, self.device, self.note = model, torch, device, note
        self.past = None
        self.position = 0
        import inspect  # noqa: PLC0415

        self.new_cache_name = "cache" in inspect.signature(model.forward).parameters

    def reset(self) -> None:
        self.past = None
        self.position = 0

    def _forward(self, ids):
        # transformers >= 5.2x names the cache argument `cache`; older releases `past_key_values`
        key = "cache" if self.new_cache_name else "past_key_values"
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{key: self.past})
        past = getattr(out, "cache", None)
        self.past = past if past is not None else out.past_key_values
        return out.logits[0, -1]

    def prefill(self, token_ids) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            ids = torch.tensor([list(token_ids)], device=self.device)
            logits = self._forward(ids)
            self.position += ids.shape[1]
            return logits.float().cpu().numpy()

    def decode_step(self, token_id: int) -> np.ndarray:
        return self.prefill([token_id])

    def decode_greedy(self, first_token: int, n: int) -> list[int]:
        """n greedy steps; the argmax stays on the device until the end (one sync, like our engine)."""
        torch = self.torch
        with torch.inference_mode():
            tok = torch.tensor([[first_token]], device=self.device)
            out = []
            for _ in range(n):
                tok = self._forward(tok).argmax(-1).view(1, 1)
                out.append(tok)
            self.position += n
            return torch.cat(out, 1)[0].tolist()

    def info(self) -> dict:
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return {"backend": f"torch {self.torch.__version__}", "weight_bytes": int(params)}

    def memory_probe(self):
        """Peak bytes torch allocated on the GPU; on CPU the process's peak RSS (as for our engine)."""
        if self.device.startswith("cuda"):
            return _TorchMemory(self.torch)
        from engine.bench import MemoryProbe  # noqa: PLC0415

        return MemoryProbe("cpu")


class _TorchMemory:
    def __init__(self, torch):
        self.torch = torch

    def reset(self) -> None:
        self.torch.cuda.reset_peak_memory_stats()

    def sample(self) -> int:
        return int(self.torch.cuda.max_memory_allocated())


def check_available() -> None:
    """Raise the NinferError of a missing torch/transformers now, before any test runs."""
    import importlib.util  # noqa: PLC0415

    for name in ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            raise NinferError(
                f"--baseline transformers needs torch and transformers ({name} is not installed)",
                "pip install torch 'transformers>=5.2', or leave --baseline out",
            )


def preload(hf_config: dict) -> None:
    """Import torch, transformers and the modeling module of `hf_config`'s model class now, in a fresh
    process: on the lent H200 machines `import torch` after our CUDA engine has run can read junk from the
    image's files ("source code string cannot contain null bytes" at torch/_utils_internal.py), while the
    same imports in a fresh process work."""
    _, transformers = _imports()
    config, _ = baseline_config(hf_config)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # noqa: PLC0415

    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # resolving the class imports its module


def _imports():
    try:
        import torch  # noqa: PLC0415
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise NinferError(
            f"--baseline transformers needs torch and transformers ({e.name} is not installed)",
            "pip install torch 'transformers>=5.2', or leave --baseline out",
        ) from None
    return torch, transformers


def _fast_path_note(model_type: str) -> str:
    if not model_type.startswith("qwen3_5"):
        return ""
    import importlib.util  # noqa: PLC0415

    have = [m for m in ("fla", "causal_conv1d") if importlib.util.find_spec(m)]
    return "GDN fast path: " + ("+".join(have) if have else "none (transformers' torch fallback)")


def baseline_config(hf_config: dict):
    """(transformers config, its model type) of `hf_config`'s text model."""
    _, transformers = _imports()
    if "text_config" in hf_config and "hidden_size" not in hf_config:  # multimodal wrapper: run the text model
        hf_config = dict(hf_config["text_config"])
    cfg = {k: v for k, v in hf_config.items() if k not in ("architectures", "transformers_version")}
    model_type = str(cfg.pop("model_type", "llama"))
    if model_type in ("qwen3_5", "qwen3_5_moe"):
        model_type += "_text"
    cfg.pop("token_domain", None)
    try:
        config = transformers.AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError) as e:
        raise NinferError(
            f"transformers {transformers.__version__} does not know model type {model_type!r} ({e})",
            "install transformers >= 5.2",
        ) from None
    return config, model_type


def build_baseline(hf_config: dict, *, device: str, memory_margin: float = 0.9) -> TransformersEngine:
    """A random-init transformers model of `hf_config` (bf16 on CUDA when `device` is gpu, else fp32 CPU)."""
    torch, transformers = _imports()
    transformers.logging.set_verbosity_error()  # the fallback-kernel notices would bury the table
    config, model_type = baseline_config(hf_config)
    use_cuda = device == "gpu" and torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if use_cuda else ("cpu", torch.float32)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
    need = n_params * (2 if use_cuda else 4)
    if use_cuda:
        free, _ = torch.cuda.mem_get_info()
        if need > memory_margin * free:
            raise NinferError(
                f"the transformers baseline needs {need / 2**30:.1f} GiB of GPU memory, "
                f"{free / 2**30:.1f} GiB is free",
                "run the baseline on a larger GPU or leave --baseline out",
            )
    torch.manual_seed(0)
    with torch.device(dev):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    note = _fast_path_note(model_type)
    eng = TransformersEngine(model, torch, dev, note)
    eng.dtype = str(dtype).replace("torch.", "")
    eng.version = transformers.__version__
    return eng
