"""What the plot tools share: the command line, matplotlib without a display, the benchmark rows, TFLOP/s lines.

``plot_fa2`` and ``plot_half`` draw a grid of panels, one per (head dim, mask) and pass or dtype, each with one
TFLOP/s-against-N line per implementation; ``plot_results`` draws its own layout (memory too) and shares the
display-free pyplot. Every tool keeps its own ``STYLE`` (which implementations its JSON holds, and their labels).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def json_out_parser(doc: str) -> argparse.ArgumentParser:
    """``JSON -o/--out PNG``: the command line of a tool that plots one benchmark JSON (``doc``: its docstring)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("-o", "--out", required=True)
    return ap


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only: no display on a GPU machine or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def benchmark_rows(path) -> tuple[list[dict], dict]:
    """``(rows, provenance)`` of a pytest-benchmark JSON: the ``extra_info`` of every row that has a TFLOP/s
    value (a row that went out of memory has none), and ``machine_info["numba_flash"]``."""
    data = json.loads(Path(path).read_text())
    rows = [b["extra_info"] for b in data["benchmarks"] if b.get("extra_info", {}).get("tflops") is not None]
    return rows, data.get("machine_info", {}).get("numba_flash", {})


def draw_tflops(ax, rows, style: dict, keep) -> None:
    """One TFLOP/s-against-N line per implementation (``row["algorithm"]``) of the rows that ``keep(row)`` accepts,
    styled by ``style`` (an implementation it does not name is drawn with its name as the label); log2 N axis."""
    series = defaultdict(list)
    for r in rows:
        if keep(r):
            series[r["algorithm"]].append((r["N"], r["tflops"]))
    for alg, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], **style.get(alg, dict(label=alg)))
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)


def suptitle(what: str, prov: dict) -> str:
    """The figure title: what is plotted, then the device, date and versions of the run that measured it."""
    return (
        f"FlashAttention-2 in Numba vs torch, {what} - {prov.get('device', '?')}, {prov.get('date_utc', '')}, "
        f"numba {prov.get('numba', '?')}, torch {prov.get('torch', '?')}"
    )
