"""Per-cell speed ratios of a committed benchmark JSON: a baseline's time over ours, cell by cell.

The issues' "done when" lines ask for every grid cell at or above 1.0x SDPA memory-efficient (and, for half inputs,
a ratio against SDPA flash). This prints those ratios from the pytest-benchmark JSON that
``bench/gpu/run_benchmarks.sh`` commits (``docs/results/fa2_<dev>.json``, ``half_<dev>.json``), one table per
(dtype, pass) with a row per (d, causal) and a column per N, and counts the cells below 1.0x, so that a closing note's
numbers come from a command, not from reading a plot::

    python -m bench.ratios docs/results/half_h100.json [--ours flash2] [--baseline sdpa_mem_efficient] [--min-n 1024]

A ratio is ``baseline time / our time`` (above 1: we are faster), both medians of the same run. Cells where either
side has no time (out of memory, skipped) are left out.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

from bench import _plot


def cell_ratios(rows, ours: str, baseline: str, min_n: int = 0) -> dict:
    """``{(dtype, pass, d, causal): {N: ratio}}`` of the rows of one benchmark JSON
    (:func:`bench._plot.benchmark_rows`)."""
    times = {}
    for r in rows:
        if r.get("shape", "fa2_grid") != "fa2_grid" or r["N"] < min_n:
            continue
        key = (r.get("dtype") or "float32", r.get("pass_", "forward"), r["d"], bool(r["causal"]), r["N"])
        times[(r["algorithm"],) + key] = r["time_ms"]
    out = defaultdict(dict)
    for (alg, *key), t in times.items():
        if alg != ours:
            continue
        base = times.get((baseline, *key))
        if base is not None and t > 0:
            dtype, pas, d, causal, n = key
            out[(dtype, pas, d, causal)][n] = base / t
    return dict(out)


def format_tables(ratios: dict, ours: str, baseline: str) -> str:
    """The ratio tables and the count of cells below 1.0x, as printed by ``python -m bench.ratios``."""
    lines = []
    for dtype, pas in sorted({(k[0], k[1]) for k in ratios}):
        keys = sorted(k for k in ratios if k[:2] == (dtype, pas))
        ns = sorted({n for k in keys for n in ratios[k]})
        lines.append(f"## {dtype} {pas}: {baseline} time / {ours} time")
        lines.append(f"{'d':>4} {'causal':>6} " + " ".join(f"{n:>7}" for n in ns))
        for k in keys:
            lines.append(
                f"{k[2]:>4} {int(k[3]):>6} "
                + " ".join(f"{ratios[k][n]:7.2f}" if n in ratios[k] else f"{'':>7}" for n in ns)
            )
        lines.append("")
    cells = [v for k in ratios for v in ratios[k].values()]
    below = sum(v < 1.0 for v in cells)
    lines.append(
        f"{below} of {len(cells)} cells below 1.0x {baseline}"
        + (f"; range {min(cells):.2f}-{max(cells):.2f}" if cells else "")
    )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.ratios``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="a pytest-benchmark JSON of run_benchmarks.sh (fa2_<dev>.json, half_<dev>.json)")
    ap.add_argument("--ours", default="flash2", help="our implementation's name in the JSON (default flash2)")
    ap.add_argument("--baseline", default="sdpa_mem_efficient", help="the implementation to divide by ours")
    ap.add_argument("--min-n", type=int, default=0, help="leave out cells with N below this")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    rows, prov = _plot.benchmark_rows(args.json)
    commit = re.search(r"commit (\w+)", prov.get("command", ""))
    print(
        f"# {args.json}: {prov.get('device', '?')}, {prov.get('date_utc', '?')}, commit "
        f"{commit.group(1) if commit else '?'}"
    )
    print(format_tables(cell_ratios(rows, args.ours, args.baseline, args.min_n), args.ours, args.baseline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
