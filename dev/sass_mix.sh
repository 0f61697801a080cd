#!/bin/bash
# Opcode mix of one kernel's SASS (sm_90), offline: dev/sass_mix.sh 'gemv_rsILi1ELi1ELi1ELi2E' [cubin]
V=${NVRTC_VENV:-/tmp/nvrtcenv}
N=$(ls -d "$V"/lib/python3*/site-packages/nvidia/cu13)
C=${2:-/tmp/ninfer_sm90.cubin}
[ -f "$C" ] || "$(dirname "$0")/nvrtc_check.sh" --cubin "$C" >/dev/null
"$N/bin/cuobjdump" -sass "$C" | awk -v k="$1" '/Function :/ {on = index($0, k) > 0} on' \
  | grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z][A-Z0-9_.]*' | awk '{print $NF}' | sed 's/\..*//' \
  | sort | uniq -c | sort -rn | head -${TOP:-25}
