"""Turn pytest-benchmark JSON from the benchmark files into a PNG plot (committed with the JSON).

Usage (from the repository root; needs matplotlib, ``pip install -e ".[plot]"``)::

    python -m bench.plot_results docs/results/forward_h200.json -o docs/results/forward_h200.png

One column per head dimension; top row TFLOP/s against N (with the SGEMM rate measured in the same run
as a dashed line), bottom row peak extra device memory against N (log scale). Every implementation
found in the JSON (``extra_info["algorithm"]``) is one line; runs that went out of memory are marked
with an x on the N axis. The device, date and versions come from the JSON's machine_info.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from bench import _plot

STYLE = {
    "standard": dict(color="tab:red", marker="o", label="Numba standard (Alg. 0)"),
    "flash1": dict(color="tab:blue", marker="s", label="Numba FlashAttention (Alg. 1-2)"),
    "flash2": dict(color="tab:green", marker="^", label="Numba FlashAttention-2"),
    "torch_naive": dict(color="tab:gray", marker="v", label="torch naive (fp32)"),
    "sdpa_mem_efficient": dict(color="tab:purple", marker="D", label="torch SDPA mem-efficient (fp32)"),
}


def load(paths):
    rows, machine = [], {}
    for p in paths:
        if str(p).endswith(".jsonl"):  # the incremental record of bench.common.record_jsonl
            lines = [json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()]
            for rec in lines:
                if "provenance" in rec:
                    machine = {
                        "numba_flash": dict(rec["provenance"], sgemm_tflops_4096_fp32=rec.get("sgemm_tflops_4096_fp32"))
                    }
                else:
                    rows.append(rec)
            continue
        data = json.loads(Path(p).read_text())
        machine = data.get("machine_info", {}) or machine
        for bench in data.get("benchmarks", []):
            info = dict(bench.get("extra_info", {}))
            info.setdefault("time_ms", (bench.get("stats") or {}).get("median", float("nan")) * 1e3)
            rows.append(info)
    return rows, machine


def plot(rows, machine, out, what="forward"):
    plt = _plot.pyplot()
    dims = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(2, len(dims), figsize=(6.2 * len(dims), 8.2), squeeze=False)
    prov = machine.get("numba_flash", {})
    sgemm = prov.get("sgemm_tflops_4096_fp32")
    for col, d in enumerate(dims):
        series = defaultdict(list)
        for r in rows:
            if r["d"] == d:
                series[r["algorithm"]].append(r)
        ax_t, ax_m = axes[0][col], axes[1][col]
        for alg, pts in sorted(series.items()):
            style = dict(STYLE.get(alg, dict(label=alg)))
            if pts[0].get("label"):  # a benchmark may name its line (e.g. forward + backward algorithms)
                style["label"] = pts[0]["label"]
            ok = sorted((p for p in pts if p.get("tflops") is not None and not p.get("oom")), key=lambda p: p["N"])
            oom = [p["N"] for p in pts if p.get("oom")]
            ax_t.plot([p["N"] for p in ok], [p["tflops"] for p in ok], **style)
            mem = [(p["N"], p["extra_mem_bytes"]) for p in ok if p.get("extra_mem_bytes")]
            if mem:
                ax_m.plot([m[0] for m in mem], [m[1] / 2**20 for m in mem], **style)
            if oom:
                ax_t.plot(oom, [0] * len(oom), "x", color=style.get("color"), markersize=10)
        if sgemm:
            ax_t.axhline(sgemm, ls="--", color="black", lw=1, label=f"cuBLAS SGEMM {sgemm:.1f}")
        ax_t.set_title(f"{what}, d = {d} (batch x N = 16k, hidden 2048)")
        ax_t.set_ylabel("TFLOP/s (fp32)")
        ax_m.set_ylabel("peak extra device memory (MiB)")
        ax_m.set_yscale("log")
        for ax in (ax_t, ax_m):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length N")
            ax.grid(True, alpha=0.3)
        ax_t.legend(fontsize=8)
    fig.suptitle(
        f"{prov.get('device', '?')} | {prov.get('date_utc', '')} | numba {prov.get('numba', '?')}, "
        f"torch {prov.get('torch', '?')}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.plot_results``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="pytest-benchmark JSON file(s) or the .jsonl record of a run")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--title", default="forward", help="what the plot shows (forward, backward, ...)")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    rows, machine = load(args.json)
    if not rows:
        raise SystemExit("no benchmarks in the JSON")
    print(plot(rows, machine, args.output, args.title))


if __name__ == "__main__":
    main()
