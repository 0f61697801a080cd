"""The generic GPU class's kernels compile offline: NVRTC (the nvidia-cuda-nvrtc wheel, no GPU needed) builds the
module with every instantiation the sm_86 plans of the published geometries take, for sm_86. The sm_90 build and
every instantiation: dev/nvrtc_check.sh."""
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _nvidia_dir():
    """The nvidia wheels' CUDA 13 directory (lib/libnvrtc.so.13, include/cuda_fp16.h), or None."""
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        d = Path(base) / "cu13"
        if (d / "lib" / "libnvrtc.so.13").exists() and (d / "include" / "cuda_fp16.h").exists():
            return d
    return None


@pytest.mark.skipif(_nvidia_dir() is None, reason="no NVRTC wheel (pip install nvidia-cuda-nvrtc nvidia-cuda-runtime)")
def test_generic_plans_compile_for_sm86(monkeypatch, capsys):
    from engine.config import ModelArgs
    from engine.gpu.plan import plan_for_recipe
    from engine.gpu import launch as kernels
    from engine.synthetic import GEOMETRIES

    d = _nvidia_dir()
    monkeypatch.setenv("NVRTC_LIB", str(d / "lib" / "libnvrtc.so.13"))
    monkeypatch.setenv("CUDA_INCLUDE", str(d / "include"))
    monkeypatch.delenv("NINFER_PLAN", raising=False)
    spec = importlib.util.spec_from_file_location("nvrtc_check", ROOT / "dev" / "nvrtc_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    names = []
    for cfg, recipe in GEOMETRIES.values():
        for kv in ("bf16", "int8"):
            names += plan_for_recipe(ModelArgs.from_config(cfg), recipe, kv, "sm_86").kernels
    names = list(dict.fromkeys(names))
    assert not any(n.startswith("gdn_chunk_scan_tc<") for n in names)  # (no chunked GDN on the 99 KB class)
    assert check.compile_one(kernels._source(), names, "86", False) == 0, capsys.readouterr().out
    assert check.compile_one(kernels._source(kernels.TC_SOURCES), [], "86", False) == 0, capsys.readouterr().out
    assert os.environ["NVRTC_LIB"]
