"""Plot the half-precision benchmark JSON (tests/benchmarks/test_bench_half.py) as one PNG.

Usage (from the repository root; needs matplotlib, ``pip install -e ".[plot]"``)::

    python -m bench.plot_half docs/results/half_h100.json -o docs/results/half_h100.png

One row per (dtype, pass) in the JSON (forward in bfloat16 and float16, forward + backward in
bfloat16), four panels each: TFLOP/s against N for (d = 64, 128) x (non-causal, causal). Each
implementation is a line. Device,
date and versions come from the JSON's machine_info.
"""

from __future__ import annotations

import argparse

from bench import _plot

STYLE = {
    "flash2": dict(color="tab:green", marker="^", label="Numba FA2 (half, mma.m16n8k16)"),
    "sdpa_flash": dict(color="tab:red", marker="s", label="SDPA flash (FA2 CUDA)"),
    "sdpa_cudnn": dict(color="tab:blue", marker="o", label="SDPA cuDNN"),
    "sdpa_mem_efficient": dict(color="tab:purple", marker="D", label="SDPA mem-efficient"),
    "torch_naive": dict(color="tab:gray", marker="v", label="torch naive"),
}


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.plot_half``."""
    return _plot.json_out_parser(__doc__)


def main(argv=None):
    args = parser().parse_args(argv)
    plt = _plot.pyplot()
    rows, prov = _plot.benchmark_rows(args.json)
    rows = [r for r in rows if r.get("shape", "fa2_grid") == "fa2_grid"]  # the FA1 Figure 2 shape is a table, not a
    # line
    lines = [
        (dt, pas)
        for pas in ("forward", "fwd+bwd")
        for dt in ("bfloat16", "float16")
        if any(r["dtype"] == dt and r.get("pass_") == pas for r in rows)
    ]
    panels = [(64, False), (64, True), (128, False), (128, True)]
    fig, axes = plt.subplots(
        len(lines), len(panels), figsize=(4.0 * len(panels), 3.9 * len(lines)), sharey=True, squeeze=False
    )
    for axrow, (dt, pas) in zip(axes, lines):
        for ax, (d, causal) in zip(axrow, panels):
            _plot.draw_tflops(
                ax,
                rows,
                STYLE,
                lambda r, dt=dt, pas=pas, d=d, causal=causal: (
                    r["dtype"] == dt and r.get("pass_") == pas and r["d"] == d and bool(r["causal"]) == causal
                ),
            )
            ax.set_title(f"{dt} {pas}, d={d}{', causal' if causal else ''}", fontsize=9)
            ax.set_xlabel("N (batch = 16k / N)")
        axrow[0].set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(_plot.suptitle("half precision", prov), fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
