#!/usr/bin/env bash
# The whole test suite on a GPU machine (gpu- and slow-marked tests included), plus the demo.
# Usage, from the repository root: bash bench/gpu/run_suite.sh [OUTDIR]
# Writes OUTDIR/gpu_suite.log (pytest's report with the device in its header) and OUTDIR/gpu_demo.log.
# Exit status: pytest's.
set -uo pipefail
out="${1:-${OUT:-.}}"
mkdir -p "$out"
source bench/gpu/setup_env.sh || exit 1
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit ${NUMBA_FLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
} > "$out/gpu_suite.log" 2>&1
python3 -m pytest -n 8 -q -rfE -p no:cacheprovider --durations=10 2>&1 | tee -a "$out/gpu_suite.log"
rc=${PIPESTATUS[0]}
python3 -m numba_flash demo 2>&1 | tee "$out/gpu_demo.log"
exit "$rc"
