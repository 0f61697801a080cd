#!/bin/bash
# Local compile check of cuda/*.cu for sm_90 and sm_86 (no GPU needed). Venv with NVRTC at ${NVRTC_VENV:-/tmp/nvrtcenv}.
V=${NVRTC_VENV:-/tmp/nvrtcenv}
[ -d "$V" ] || { python3 -m venv "$V" && "$V/bin/pip" install -q nvidia-cuda-nvrtc nvidia-cuda-runtime; }
N=$(ls -d "$V"/lib/python3*/site-packages/nvidia/cu13)
cd "$(dirname "$0")/.." && NVRTC_LIB=$N/lib/libnvrtc.so.13 CUDA_INCLUDE=$N/include PYTHONPATH=. ${PY:-.venv/bin/python} dev/nvrtc_check.py "$@"
