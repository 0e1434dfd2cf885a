"""A refactor's check on the GPU: the FA2 grid's per-cell ratios of a baseline tree against this tree's.

``bash bench/gpu/grid_ab.sh BASE_TREE OUTDIR`` runs the fa2 and half grids of a baseline checkout and of this
tree in the same session on the same GPU (our kernels and SDPA's, alternating trees grid by grid), then this
module compares them: for each cell, ``new ratio / old ratio``, where a ratio is SDPA's time over ours in that
tree's own run (:func:`bench.ratios.cell_ratios`), so that the machine's drift between the two runs reaches both
sides of each ratio alike. A cell is within the rule when that quotient is within ``--tolerance`` of 1::

    python -m bench.grid_ab OUTDIR/base/fa2_h100.json OUTDIR/new/fa2_h100.json [--tolerance 0.05]

Exit status 1 when a cell is outside the tolerance (or no cell is common to both files).
"""

from __future__ import annotations

import argparse

from bench import _plot
from bench.ratios import cell_ratios


def compare(old: dict, new: dict) -> dict:
    """``{(dtype, pass, d, causal, N): new ratio / old ratio}`` over the cells both have."""
    return {
        (*key, n): new[key][n] / old[key][n]
        for key in sorted(set(old) & set(new))
        for n in sorted(set(old[key]) & set(new[key]))
    }


def format_report(quotients: dict, old: dict, new: dict, tolerance: float, baseline: str) -> str:
    """One line per cell (old ratio, new ratio, quotient, a mark outside the tolerance) and a summary line."""
    lines = [f"{'dtype':>8} {'pass':>16} {'d':>4} {'causal':>6} {'N':>6} {'old':>6} {'new':>6} {'new/old':>8}"]
    for (dtype, pas, d, causal, n), q in quotients.items():
        mark = "" if abs(q - 1) <= tolerance else "  OUTSIDE"
        key = (dtype, pas, d, causal)
        lines.append(
            f"{dtype:>8} {pas:>16} {d:>4} {int(causal):>6} {n:>6} {old[key][n]:6.2f} {new[key][n]:6.2f} {q:8.3f}{mark}"
        )
    qs = list(quotients.values())
    outside = sum(abs(q - 1) > tolerance for q in qs)
    if qs:
        lines.append(
            f"{outside} of {len(qs)} cells outside {1 - tolerance:.2f}-{1 + tolerance:.2f}x "
            f"(ratios against {baseline}); new/old range {min(qs):.3f}-{max(qs):.3f}"
        )
    else:
        lines.append("no cell common to both files")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.grid_ab`` (the docs' commands are parsed by the tests)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the baseline tree's pytest-benchmark JSON")
    ap.add_argument("new", help="this tree's pytest-benchmark JSON of the same grid")
    ap.add_argument("--ours", default="flash2")
    ap.add_argument("--baseline", default="sdpa_mem_efficient")
    ap.add_argument("--tolerance", type=float, default=0.05)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    (old_rows, old_prov), (new_rows, new_prov) = _plot.benchmark_rows(args.old), _plot.benchmark_rows(args.new)
    for name, prov in (("old", old_prov), ("new", new_prov)):
        print(f"# {name}: {prov.get('device', '?')}, {prov.get('date_utc', '?')}, {prov.get('command', '?')}")
    old = cell_ratios(old_rows, args.ours, args.baseline)
    new = cell_ratios(new_rows, args.ours, args.baseline)
    quotients = compare(old, new)
    print(format_report(quotients, old, new, args.tolerance, args.baseline))
    return 0 if quotients and all(abs(q - 1) <= args.tolerance for q in quotients.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
