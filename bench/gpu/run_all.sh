#!/usr/bin/env bash
# One GPU call: the environment, the whole test suite (and the demo), then the committed benchmarks.
# Usage, from the repository root (.whl/ must hold the numpy 2.4 wheel, see bench/gpu/README.md):
#   bash bench/gpu/run_all.sh OUTDIR [NAME ...]      (NAME: forward backward fa2, default all three)
# Writes OUTDIR/gpu_suite.log and OUTDIR/gpu_demo.log (bench/gpu/run_suite.sh), OUTDIR/gpu_bench.log and
# OUTDIR/results/ (bench/gpu/run_benchmarks.sh: the files to copy to docs/results/ and commit).
# The benchmarks run after the suite, never beside it, so that their timings have the GPU alone.
# Exit status: the suite's if it failed, else the benchmarks'.
set -uo pipefail
out="${1:-${OUT:-.}}"
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$out/results"
source bench/gpu/setup_env.sh || exit 1
bash bench/gpu/run_suite.sh "$out"
suite=$?
bash bench/gpu/run_benchmarks.sh "$out/results" "$@" 2>&1 | tee "$out/gpu_bench.log"
benchmarks=${PIPESTATUS[0]}
echo "run_all: suite exit status $suite, benchmarks exit status $benchmarks"
[ "$suite" -ne 0 ] && exit "$suite"
exit "$benchmarks"
