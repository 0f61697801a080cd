"""Compile the CUDA modules with NVRTC on a machine without a GPU: syntax, registers, spills, for sm_90 and sm_86.

    dev/nvrtc_check.sh                       # every instantiation some plan can take, for sm_90 and sm_86
    dev/nvrtc_check.sh --plan qwen3.6-27b    # only that geometry's plan (its own GPU class and kv: --gpu, --kv)
    NVRTC_ARCH=86 dev/nvrtc_check.sh -v      # one architecture, with ptxas' register/spill lines

NVRTC comes from the nvidia-cuda-nvrtc wheel (tests/test_nvrtc_compile.py runs the same check in CI where it is
installed); `--cubin PATH` writes the main module's cubin (dev/sass_mix.sh counts a kernel's instructions by opcode).
"""
from __future__ import annotations

import ctypes
import os
import sys

from engine.gpu import kernel_names
from engine.gpu import launch as kernels


def names_for(argv) -> tuple[list[str], str, str]:
    """(the main module's names, the tensor-core module's names, what they are) from the command line."""
    if "--plan" not in argv:
        names = kernel_names.all_names()
        return [n for n in names if not n.startswith("gdn_chunk_scan_tc<")], \
            [n for n in names if n.startswith("gdn_chunk_scan_tc<")], "every plan"
    from engine.config import ModelArgs  # noqa: PLC0415
    from engine.gpu.plan import plan_for_recipe  # noqa: PLC0415
    from engine.synthetic import GEOMETRIES  # noqa: PLC0415

    geometry = argv[argv.index("--plan") + 1]
    gpu = argv[argv.index("--gpu") + 1] if "--gpu" in argv else "sm_90"
    kv = argv[argv.index("--kv") + 1] if "--kv" in argv else "int8"
    cfg, recipe = GEOMETRIES[geometry]
    plan = plan_for_recipe(ModelArgs.from_config(cfg), recipe, kv, gpu)
    tc = [n for n in plan.kernels if n.startswith("gdn_chunk_scan_tc<")]
    return [n for n in plan.kernels if n not in tc], tc, f"the {geometry} plan on {gpu}, {kv} KV"


def main(argv=sys.argv) -> int:
    main_names, tc_names, what = names_for(argv)
    archs = [os.environ["NVRTC_ARCH"]] if os.environ.get("NVRTC_ARCH") else ["90", "86"]
    rc = 0
    for arch in archs:
        print(f"sm_{arch}: {what}")
        rc |= compile_one(kernels._source(), main_names, arch, "--cubin" in argv)
        rc |= compile_one(kernels._source(kernels.TC_SOURCES), tc_names, arch, False)
    return rc


def compile_one(source: str, names: list, arch: str, cubin: bool) -> int:
    lib = ctypes.CDLL(os.environ.get("NVRTC_LIB", "libnvrtc.so.13"))
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"ninfer.cu", 0, None, None)
    assert rc == 0, rc
    for n in names:
        assert lib.nvrtcAddNameExpression(prog, n.encode()) == 0
    opts = [b"-std=c++17", f"-arch=sm_{arch}".encode()]
    inc = os.environ.get("CUDA_INCLUDE")
    if inc:
        opts.append(b"-I" + inc.encode())
    if "-v" in sys.argv:
        opts.append(b"-Xptxas=-v")
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    if "-v" in sys.argv or rc != 0:
        print(text)
    print("  compile", "OK" if rc == 0 else f"FAILED rc={rc}", f"({len(names)} name expressions)")
    if rc == 0 and cubin:
        out = sys.argv[sys.argv.index("--cubin") + 1]
        n = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetCUBIN(prog, buf)
        with open(out, "wb") as f:
            f.write(buf.raw)
        print("  cubin written to", out, "(cuobjdump -sass to read it)")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
