#!/usr/bin/env bash
# The whole test suite on a GPU machine (gpu- and slow-marked tests included), plus the demo.
# Usage, from the repository root: bash bench/gpu/run_suite.sh [OUTDIR [PART]]
#   PART (default all): all | main (every test but tests/benchmarks) | benchmarks (tests/benchmarks, each benchmark
#   run once as a functional test) | kernels (tests/kernels) | kernels_a | kernels_b | others (main without tests/kernels): main took 575 s
#   with 14 workers on an H100 at 6a6bd8a and was cut at 99 % by the device tool's 10-minute call, so kernels and
#   others split it in two calls. On an H100 at b7c3ad5 the whole suite took more than 10 minutes with 14 workers
#   (2321 tests; 617 of them in tests/benchmarks, at real shapes), more than one call of the device tool may run:
#   there, run `main` and `benchmarks` in two calls.
#   kernels_a / kernels_b: tests/kernels in two calls, b the 3xTF32 backward's files and the three others that the
#   cut `kernels` run at 50079fe (570 s, 12 workers, H200) reached last (SLOW_KERNEL_FILES below), a the rest: with
#   `others`, the main suite at one commit in three calls of the device tool.
#   NUMBA_FLASH_SUITE_WORKERS: pytest-xdist workers (default 8; 14 hit CUDA out-of-memory once on an 80 GB card at
#   1ee8f65, and ran clean at b7c3ad5).
# Writes OUTDIR/gpu_suite[_PART].log (pytest's verbose report, the device in its header) and, for all and main,
# OUTDIR/gpu_demo.log. Exit status: pytest's.
set -uo pipefail
out="${1:-${OUT:-.}}"
part="${2:-all}"
SLOW_KERNEL_FILES=(tests/kernels/test_fa2_kernels.py tests/kernels/test_half_ex2_ftz.py tests/kernels/test_half_red2.py
  tests/kernels/test_tf32_backward.py tests/kernels/test_tf32_backward_cp_async.py tests/kernels/test_tf32_backward_dq_unroll.py
  tests/kernels/test_tf32_backward_kv_async.py tests/kernels/test_tf32_backward_split_qdo.py tests/kernels/test_tf32_backward_wide.py)
case "$part" in
  all) sel=(); log="$out/gpu_suite.log" ;;
  main) sel=(--ignore=tests/benchmarks); log="$out/gpu_suite_main.log" ;;
  benchmarks) sel=(tests/benchmarks); log="$out/gpu_suite_benchmarks.log" ;;
  kernels) sel=(tests/kernels); log="$out/gpu_suite_kernels.log" ;;
  kernels_a) sel=(tests/kernels "${SLOW_KERNEL_FILES[@]/#/--ignore=}"); log="$out/gpu_suite_kernels_a.log" ;;
  kernels_b) sel=("${SLOW_KERNEL_FILES[@]}"); log="$out/gpu_suite_kernels_b.log" ;;
  others) sel=(--ignore=tests/benchmarks --ignore=tests/kernels); log="$out/gpu_suite_others.log" ;;
  *) echo "run_suite: unknown PART '$part' (all, main, benchmarks, kernels, kernels_a, kernels_b, others)" >&2; exit 2 ;;
esac
mkdir -p "$out"
source bench/gpu/setup_env.sh || exit 1
workers="${NUMBA_FLASH_SUITE_WORKERS:-8}"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit ${NUMBA_FLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}: pytest -n $workers -v -rfEX ${sel[*]}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
} > "$log" 2>&1
python3 -m pytest -n "$workers" -v -rfEX -p no:cacheprovider --durations=10 "${sel[@]}" >> "$log" 2>&1
rc=$?
tail -n 15 "$log"
if [ "$part" = all ] || [ "$part" = main ] || [ "$part" = others ]; then
  python3 -m numba_flash demo 2>&1 | tee "$out/gpu_demo.log"
fi
exit "$rc"
