#!/usr/bin/env bash
# A refactor's GPU check: the fa2 and half grids of a baseline tree and of this tree, in one session on one GPU.
#   bash bench/gpu/grid_ab.sh BASE_TREE OUTDIR [NAME ...]      (NAME: fa2 half; default both)
# BASE_TREE: a checkout of the baseline commit (git archive SHA | tar -x -C DIR; its commit in
# NUMBA_FLASH_BASELINE_COMMIT). For each NAME the baseline's grid runs first, then this tree's, each with its own
# tests/benchmarks and package; only our kernels (flash2) and SDPA's time (NUMBA_FLASH_AB_SELECT, a pytest -k,
# overrides). Writes OUTDIR/base/NAME_<dev>.json, OUTDIR/new/NAME_<dev>.json and OUTDIR/grid_ab_NAME.txt, the
# per-cell comparison of python -m bench.grid_ab. Exit status: 1 when a run failed or a cell is outside 5 %.
set -uo pipefail
base="${1:?usage: grid_ab.sh BASE_TREE OUTDIR [NAME ...]}"
out="${2:?usage: grid_ab.sh BASE_TREE OUTDIR [NAME ...]}"
shift 2
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(fa2 half)
sel="${NUMBA_FLASH_AB_SELECT:-(flash2 and not ffma) or sdpa}"
mkdir -p "$out/base" "$out/new"
out="$(realpath "$out")"
source bench/gpu/setup_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/nf-baseline-site "$base" \
  >/dev/null || { echo "grid_ab: could not install the baseline tree $base" >&2; exit 1; }
dev="$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[1].lower())")"
commit="${NUMBA_FLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
rc=0
grid() {  # grid TREE_DIR OUT_JSON FILE EXTRA_PYTHONPATH COMMIT
  (cd "$1" && env PYTHONPATH="$4${PYTHONPATH:+:$PYTHONPATH}" NUMBA_FLASH_COMMIT="$5" \
    NUMBA_FLASH_BENCH_COMMAND="python3 -m pytest $3 -k '$sel' --benchmark-enable (bash bench/gpu/grid_ab.sh, commit $5)" \
    python3 -m pytest "$3" -k "$sel" -q -p no:xdist -p no:cacheprovider --benchmark-enable \
    --benchmark-json="$2" --benchmark-columns=median,rounds --benchmark-sort=name) || rc=1
}
for name in "${names[@]}"; do
  file="tests/benchmarks/test_bench_$name.py"
  grid "$base" "$out/base/${name}_$dev.json" "$file" /tmp/nf-baseline-site "${NUMBA_FLASH_BASELINE_COMMIT:-baseline}"
  grid . "$out/new/${name}_$dev.json" "$file" "" "$commit"
  python3 -m bench.grid_ab "$out/base/${name}_$dev.json" "$out/new/${name}_$dev.json" | tee "$out/grid_ab_$name.txt" || rc=1
  if [ "$name" = half ]; then  # the half grid is also read against SDPA's flash backend
    python3 -m bench.grid_ab --baseline sdpa_flash "$out/base/${name}_$dev.json" "$out/new/${name}_$dev.json" \
      | tee -a "$out/grid_ab_$name.txt" || rc=1
  fi
done
exit "$rc"
