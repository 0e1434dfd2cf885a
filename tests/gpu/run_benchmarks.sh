#!/usr/bin/env bash
# Produce the committed benchmark results (run on a GPU machine, from the repository root):
#   bash tests/gpu/run_benchmarks.sh [OUTDIR]        (default OUTDIR: docs/results)
# Each benchmark file writes <name>_<device>.json (pytest-benchmark JSON with our extra_info and
# provenance in machine_info) and a PNG made by tests/benchmarks/plot_results.py.
set -euo pipefail
out="${1:-docs/results}"
mkdir -p "$out"
if ! python3 -c "import numba_flash" 2>/dev/null; then
  source tests/gpu/setup_env.sh
fi
export NUMBA_FLASH_BENCH_COMMAND="bash tests/gpu/run_benchmarks.sh"
dev="$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[1].lower())" 2>/dev/null || echo gpu)"
for name in forward backward; do
  f="tests/benchmarks/test_bench_${name}.py"
  [ -f "$f" ] || continue
  rm -f "$out/${name}_${dev}.jsonl"
  NUMBA_FLASH_BENCH_JSONL="$out/${name}_${dev}.jsonl" python3 -m pytest "$f" -q -p no:xdist -p no:cacheprovider \
      --benchmark-enable --benchmark-json="$out/${name}_${dev}.json" --benchmark-columns=median,rounds --benchmark-sort=name
  python3 tests/benchmarks/plot_results.py "$out/${name}_${dev}.json" -o "$out/${name}_${dev}.png" --title "$name"
done
