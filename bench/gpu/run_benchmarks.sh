#!/usr/bin/env bash
# Produce the committed benchmark results on a GPU machine, from the repository root:
#   bash bench/gpu/run_benchmarks.sh [OUTDIR [NAME ...]]     (OUTDIR default docs/results; NAME: forward backward fa2 half, default all four)
# For each NAME, pytest-benchmark JSON (our extra_info per row, provenance under machine_info.numba_flash),
# a JSONL record written row by row (a run cut short keeps what it measured) and a PNG:
#   forward   tests/benchmarks/test_bench_forward.py   -> forward_<dev>.json/.jsonl/.png      (python -m bench.plot_results)
#   backward  tests/benchmarks/test_bench_backward.py  -> backward_d64_<dev>.json, backward_d128_<dev>.json (one run per
#             head dim), backward_<dev>.png of both                                              (python -m bench.plot_results)
#   fa2       tests/benchmarks/test_bench_fa2.py       -> fa2_<dev>.json/.jsonl/.png          (python -m bench.plot_fa2)
#   half      tests/benchmarks/test_bench_half.py      -> half_<dev>.json/.jsonl/.png         (python -m bench.plot_half)
# <dev> is the GPU's model in lower case (h200, h100). Exit status: 0 when every pytest run passed.
set -uo pipefail
out="${1:-docs/results}"
shift $(( $# > 0 ? 1 : 0 ))
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(forward backward fa2 half)
mkdir -p "$out"
if [ -z "${NUMBA_FLASH_ENV:-}" ] && ! python3 -c "import numba_flash, numba_flash_reference" 2>/dev/null; then
  source bench/gpu/setup_env.sh || exit 1
fi
commit="${NUMBA_FLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
dev="$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[1].lower())" 2>/dev/null || echo gpu)"
rc=0

bench() {  # bench STEM FILE [ENV=VALUE ...]: one pytest-benchmark run -> $out/STEM.json and .jsonl
  local stem="$1" file="$2"
  shift 2
  rm -f "$out/$stem.jsonl"
  env "$@" NUMBA_FLASH_BENCH_JSONL="$out/$stem.jsonl" \
      NUMBA_FLASH_BENCH_COMMAND="${*:+$* }python3 -m pytest $file --benchmark-enable --benchmark-json=$out/$stem.json (bash bench/gpu/run_benchmarks.sh, commit $commit)" \
      python3 -m pytest "$file" -q -p no:xdist -p no:cacheprovider \
      --benchmark-enable --benchmark-json="$out/$stem.json" --benchmark-columns=median,rounds --benchmark-sort=name || rc=1
}

plot() {  # plot TOOL ARGS...: a plot failure (e.g. no matplotlib) is reported, not fatal
  python3 -m "bench.$1" "${@:2}" || echo "run_benchmarks: bench.$1 failed; the JSON is still there" >&2
}

for name in "${names[@]}"; do
  case "$name" in
    forward)
      bench "forward_$dev" tests/benchmarks/test_bench_forward.py
      plot plot_results "$out/forward_$dev.json" -o "$out/forward_$dev.png" --title forward ;;
    backward)
      for d in 64 128; do
        bench "backward_d${d}_$dev" tests/benchmarks/test_bench_backward.py NUMBA_FLASH_BENCH_HEADDIMS=$d
      done
      plot plot_results "$out/backward_d64_$dev.json" "$out/backward_d128_$dev.json" -o "$out/backward_$dev.png" --title "forward + backward" ;;
    fa2)
      bench "fa2_$dev" tests/benchmarks/test_bench_fa2.py
      plot plot_fa2 "$out/fa2_$dev.json" -o "$out/fa2_$dev.png" ;;
    half)
      bench "half_$dev" tests/benchmarks/test_bench_half.py
      plot plot_half "$out/half_$dev.json" -o "$out/half_$dev.png" ;;
    *)
      echo "run_benchmarks: unknown benchmark '$name' (forward, backward, fa2, half)" >&2
      rc=2 ;;
  esac
done
exit "$rc"
