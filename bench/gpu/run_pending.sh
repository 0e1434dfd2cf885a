#!/usr/bin/env bash
# The GPU measurements the performance log (docs/notes/performance-log.md) asks for next, in one call, from the
# repository root:
#   bash bench/gpu/run_pending.sh [OUTDIR]
# 0. tests/test_streams.py (stream order with torch side streams; written without a GPU);
# 1. the host probes of a short-sequence call: python -m bench.short_seq_probe --profile (with numba's default
#    CUDA-array-interface sync, then without it) and python -m bench.host_overhead (CUDA tensors);
# 2. the 3xTF32 forward's cp.async sweep that decides CP_ASYNC's default for float32 (fa2_sweep variants tc-cp*;
#    the prediction is in the log's section "3xTF32 forward: cp.async for K_j, V_j").
# Writes OUTDIR/pending_env.txt, streams_gpu.txt, profile_sync.txt, profile_nosync.txt, host_overhead_gpu.txt,
# tc_cp_d64.json/.log, tc_cp_d128.json/.log. About 8 minutes on an H100. Exit status: 0 when every step ran.
set -uo pipefail
out="${1:-${OUT:-.}}"
mkdir -p "$out"
source bench/gpu/setup_env.sh > "$out/pending_env.txt" 2>&1 || { cat "$out/pending_env.txt"; exit 1; }
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit ${NUMBA_FLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
} >> "$out/pending_env.txt" 2>&1
rc=0
step() {  # step NAME COMMAND...: run, log to OUTDIR/NAME, note a failure and go on
  local name="$1"
  shift
  echo "+ $*" | tee "$out/$name"
  "$@" >> "$out/$name" 2>&1 || { echo "run_pending: '$*' failed (see $name)" >&2; rc=1; }
}
step streams_gpu.txt python3 -m pytest -q -p no:cacheprovider -rfE tests/test_streams.py
step profile_sync.txt python3 -m bench.short_seq_probe --profile
step profile_nosync.txt env NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0 python3 -m bench.short_seq_probe --profile
step host_overhead_gpu.txt python3 -m bench.host_overhead
step tc_cp_d64.log python3 -m bench.fa2_sweep --seqlens 1024 4096 16384 --headdims 64 \
  --variants tc tc-cp tc-cp-Bc32 tc-cp-NW8-MW1 --out "$out/tc_cp_d64.json"
step tc_cp_d128.log python3 -m bench.fa2_sweep --seqlens 1024 4096 16384 --headdims 128 \
  --variants tc tc-cp tc-cp-64x32 --out "$out/tc_cp_d128.json"
tail -n 25 "$out/tc_cp_d64.log" "$out/tc_cp_d128.log"
exit "$rc"
