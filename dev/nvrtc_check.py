"""Compile the CUDA module for sm_90 with NVRTC on a machine without a GPU: syntax, registers, spills.

    pip install nvidia-cuda-nvrtc   # into any venv; then
    pip install nvidia-cuda-runtime  # for cuda_fp16.h
    PYTHONPATH=. NVRTC_LIB=.../nvidia/cu13/lib/libnvrtc.so.13 CUDA_INCLUDE=.../nvidia/cu13/include python dev/nvrtc_check.py [-v]

Catches compile errors before spending device time; with -v prints ptxas register/spill lines;
`--cubin PATH` writes the sm_90 cubin (dev/sass_mix.sh counts a kernel's instructions by opcode).
"""
from __future__ import annotations

import ctypes
import os
import sys

from engine.ops import kernels


def main() -> int:
    if int(os.environ.get("NVRTC_ARCH", "90")) < 80:  # (the experimental GEMVs and module_tc need sm_80)
        return compile_one(kernels._source(), kernels._names(), "--cubin" in sys.argv)
    rc = 0
    if "--tc" not in sys.argv:  # --tc: the tensor-core GDN module alone
        rc = compile_one(kernels._source(), kernels._names() + kernels._names(experimental=True), "--cubin" in sys.argv)
        # the GEMVs with weight loads through L1 (module_ldg)
        rc |= compile_one(kernels._source(("gemv_decode.cu", "gemv.cu", "gemv_variants.cu"), ldg=True), list(kernels.LDG_NAMES), False)
    # the tensor-core GDN module (its own: mma.h); TC_INCLUDE names a toolkit include dir that has crt/mma.h
    tc_names = [f"gdn_chunk_scan_tc<{rb}{q1}>" for rb in kernels.GDN_SCAN_TC_RB for q1 in ("", ", 1")]
    rc_tc = compile_one(kernels._source(kernels.TC_SOURCES), tc_names, "--tc" in sys.argv and "--cubin" in sys.argv,
                        os.environ.get("TC_INCLUDE", "/usr/local/cuda/include"))
    return rc or rc_tc


def compile_one(source: str, names: list, cubin: bool, extra_include: str | None = None) -> int:
    lib = ctypes.CDLL(os.environ.get("NVRTC_LIB", "libnvrtc.so.13"))
    prog = ctypes.c_void_p()
    src = source.encode()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"ninfer.cu", 0, None, None)
    assert rc == 0, rc
    for n in names:
        assert lib.nvrtcAddNameExpression(prog, n.encode()) == 0
    opts = [b"-std=c++17", ("-arch=sm_" + os.environ.get("NVRTC_ARCH", "90")).encode()]  # NVRTC_ARCH=75: a Turing build
    inc = os.environ.get("CUDA_INCLUDE")
    if inc:
        opts.append(b"-I" + inc.encode())
    if extra_include:
        opts.append(b"-I" + extra_include.encode())
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
    print("compile", "OK" if rc == 0 else f"FAILED rc={rc}", f"({len(names)} name expressions)")
    if rc == 0 and cubin:
        out = sys.argv[sys.argv.index("--cubin") + 1]
        n = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetCUBIN(prog, buf)
        with open(out, "wb") as f:
            f.write(buf.raw)
        print("cubin written to", out, "(cuobjdump -sass to read it)")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
