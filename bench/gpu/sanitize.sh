#!/usr/bin/env bash
# NVIDIA compute-sanitizer over every kernel, forward and backward (the workload: bench/sanitize.py).
# Usage, from the repository root on a GPU machine:  bash bench/gpu/sanitize.sh OUTDIR
# Runs memcheck, racecheck, synccheck and initcheck (TOOLS="memcheck racecheck" runs a subset), one
# process per tool, and writes OUTDIR/sanitize_<tool>.log for each and OUTDIR/sanitize_summary.txt.
# Exits non-zero if any tool reports an error (--error-exitcode 1) or the workload computes a wrong
# result or skips a registered kernel (bench/sanitize.py exits 1). memcheck is the slowest: minutes.
# Environment: COMPUTE_SANITIZER (default /usr/local/cuda/bin/compute-sanitizer), PYTHON (python3),
# SANITIZE_ARGS (extra arguments of bench/sanitize.py, e.g. --check), SANITIZE_NO_SETUP=1 (the
# environment is ready: do not source bench/gpu/setup_env.sh, which installs numpy 2.4 from .whl/).
set -uo pipefail
out="${1:?usage: bash bench/gpu/sanitize.sh OUTDIR}"
mkdir -p "$out"
if [ -z "${SANITIZE_NO_SETUP:-}" ]; then  # numpy 2.4 + numba-flash on the path (bench/gpu/README.md)
  # shellcheck disable=SC1091
  source bench/gpu/setup_env.sh || { echo "sanitize: bench/gpu/setup_env.sh failed" >&2; exit 2; }
fi
sanitizer="${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}"
[ -x "$sanitizer" ] || sanitizer="$(command -v compute-sanitizer || true)"
[ -n "$sanitizer" ] || { echo "compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2; exit 2; }
summary="$out/sanitize_summary.txt"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit ${NUMBA_FLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  "$sanitizer" --version | tail -1
} > "$summary"
status=0
for tool in ${TOOLS:-memcheck racecheck synccheck initcheck}; do
  log="$out/sanitize_$tool.log"
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$sanitizer" --tool "$tool" --error-exitcode 1 "${PYTHON:-python3}" -m bench.sanitize ${SANITIZE_ARGS:-} > "$log" 2>&1
  rc=$?
  line="$tool: exit $rc in $(( $(date +%s) - start )) s; $(grep -E '^========= (ERROR SUMMARY|RACECHECK SUMMARY)' "$log" | tail -1)"
  echo "$line" | tee -a "$summary"
  [ "$rc" -eq 0 ] || status=1
done
echo "sanitize: $([ "$status" -eq 0 ] && echo "no errors" || echo "ERRORS (see the logs)")" | tee -a "$summary"
exit "$status"
