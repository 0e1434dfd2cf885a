"""Plot the FA2 benchmark JSON (tests/benchmarks/test_bench_fa2.py) as one PNG.

Usage (from the repository root; needs matplotlib, ``pip install -e ".[plot]"``)::

    python -m bench.plot_fa2 docs/results/fa2_h200.json -o docs/results/fa2_h200.png

Panels: TFLOP/s against N for (d = 64, 128) x (non-causal, causal), the forward in the top row and
forward + backward in the bottom one. Each implementation (``extra_info["algorithm"]``) is a line; the dashed line is
the cuBLAS SGEMM rate measured in the same run. Device, date and versions come from the JSON's machine_info.
"""

from __future__ import annotations

import argparse

from bench import _plot

STYLE = {
    "flash2": dict(color="tab:green", marker="^", label="Numba FA2 default (fwd: 3xTF32; training: FFMA pair)"),
    "flash2_tc": dict(color="tab:cyan", marker="s", label="Numba FA2 tensor-core pair (3xTF32 fwd + bwd)"),
    "flash2_ffma": dict(color="tab:olive", marker="o", label="Numba FA2 (fast FFMA kernel)"),
    "torch_naive": dict(color="tab:gray", marker="v", label="torch naive (fp32, TF32 off)"),
    "sdpa_mem_efficient": dict(color="tab:purple", marker="D", label="torch SDPA mem-efficient (fp32)"),
}


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.plot_fa2``."""
    return _plot.json_out_parser(__doc__)


def main(argv=None):
    args = parser().parse_args(argv)
    plt = _plot.pyplot()
    rows, prov = _plot.benchmark_rows(args.json)
    sgemm = prov.get("sgemm_tflops_4096_fp32")
    cells = [(64, False), (64, True), (128, False), (128, True)]
    panels = [(pas, d, causal) for pas in ("forward", "fwd+bwd") for d, causal in cells]
    fig, grid = plt.subplots(2, len(cells), figsize=(4.4 * len(cells), 8.0), sharey=True)
    axes = list(grid.flat)
    for ax, (pas, d, causal) in zip(axes, panels):
        _plot.draw_tflops(
            ax,
            rows,
            STYLE,
            lambda r, pas=pas, d=d, causal=causal: (
                r.get("pass_") == pas and r["d"] == d and bool(r["causal"]) == causal
            ),
        )
        if sgemm:
            ax.axhline(sgemm, ls="--", color="k", lw=0.8, label=f"cuBLAS SGEMM {sgemm:.0f}")
        ax.set_title(f"{pas}, d={d}{', causal' if causal else ''}")
        ax.set_xlabel("sequence length N (batch = 16k / N)")
    for row in grid:
        row[0].set_ylabel("TFLOP/s (fp32)")
    handles = {}  # one legend for the figure, below the panels (every implementation once)
    for ax in axes:
        for hnd, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, hnd)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 6), fontsize=8)
    fig.suptitle(_plot.suptitle("fp32", prov), fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
