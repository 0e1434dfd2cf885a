"""FA1 Figure 2, reproduced with this project's kernels: one command, JSON + three PNGs.

* **left**: standard attention vs FlashAttention (and FlashAttention-2) on GPT-2 medium's attention
  shape (batch 64, 16 heads, N = 1024, d = 64), forward + backward: matrix-product GFLOP, DRAM bytes
  measured with Nsight Compute (:mod:`bench.ncu`) beside the IO model's count, and run time.
* **middle**: FlashAttention's forward with ``Bc`` from 16 to 512 (``Br`` fixed) on the same shape: DRAM
  bytes (measured and modelled: Theorem 2's ``Tc = N / Bc`` passes over Q and O) and run time.
* **right**: block-sparse FlashAttention (:mod:`numba_flash.alg5_block_sparse`), forward and forward +
  backward run time against the fraction of non-zero blocks, at N = 4096 (batch 16, 8 heads, d = 64,
  32 x 32 blocks, banded masks and the butterfly pattern), beside dense FlashAttention.

Everything is fp32 (the paper measured fp16 on an A100: compare shapes and ratios, not absolute
numbers). Run times are medians of CUDA-event timings after warm-up, in this process; DRAM bytes come
from separate ``ncu`` runs of the same calls (ncu serializes and replays kernels, so its runs are not
timed).

Run (from the repository root)::

    python -m bench.figure2 --out docs/results/figure2          # on a GPU: minutes (see the docs page)
    python -m bench.figure2 --panels left --out docs/results/figure2   # one panel; the others in the folder are kept
    python -m bench.figure2 --tiny --out /tmp/fig2              # anywhere, simulator sizes, no ncu: seconds

``--tiny`` runs the same code on tiny shapes (no ncu, timings meaningless) so that the script can be
tested end to end without a GPU. The docs page :doc:`figure2` renders ``figure2.json`` and the PNGs.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

from . import common

GPT2 = {"batch": 64, "nheads": 16, "N": 1024, "d": 64}
RIGHT = {"batch": 16, "nheads": 8, "N": 4096, "d": 64}
MIDDLE_BC = (16, 32, 64, 128, 256, 512)
MIDDLE_BR = 32
RIGHT_TILES = (32, 32)
RIGHT_DENSITIES = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32)
LEFT_ALGORITHMS = ("standard", "flash1", "flash2")

TINY = {
    "left": {"batch": 1, "nheads": 1, "N": 16, "d": 4},
    "middle": {"batch": 1, "nheads": 1, "N": 16, "d": 4},
    "middle_bc": (8, 16),
    "middle_br": 8,
    "right": {"batch": 1, "nheads": 1, "N": 32, "d": 4},
    "right_tiles": (8, 8),
    "right_densities": (1.0, 1 / 4),
}


class Runner:
    """Times calls in this process and measures their DRAM bytes under ncu (unless told not to)."""

    def __init__(self, tiny: bool, use_ncu: bool, repeats: int):
        from . import ncu as ncu_mod

        self.tiny = tiny
        self.repeats = 1 if tiny else repeats
        self.warmup = 0 if tiny else 2  # the simulator compiles nothing
        self.ncu = ncu_mod.find_ncu() if (use_ncu and not tiny and common.ON_GPU) else None
        self.why_not_measured = (
            None
            if self.ncu
            else (
                "tiny run (simulator sizes)"
                if tiny
                else "no GPU"
                if not common.ON_GPU
                else "ncu not found"
                if use_ncu
                else "--no-ncu"
            )
        )
        self._ncu_mod = ncu_mod

    def time(self, algorithm, variant, pass_, shape, **kw) -> dict:
        try:
            fn = common.prepare(algorithm, variant, pass_, **shape, **kw)
            if common.ON_GPU:  # CUDA-event time; a tiny simulator run has only the wall clock (functional only)
                return {"median_ms": common.cuda_time_ms(fn, warmup=self.warmup, repeats=self.repeats)[0]}
            return {"median_ms": 1e3 * common.time_median(fn, warmup=self.warmup, repeats=self.repeats)}
        except Exception as exc:  # e.g. tiles that do not fit the SRAM: recorded, the figure goes on
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            fn = None
            gc.collect()
            if common.ON_GPU:
                import torch

                torch.cuda.empty_cache()

    def bytes(self, algorithm, variant, pass_, shape, mask=None, block_sizes=None) -> dict:
        if self.ncu is None:
            return {"dram_bytes": None, "not_measured": self.why_not_measured}
        spec = {
            "algorithm": algorithm,
            "variant": variant,
            "pass": pass_,
            **shape,
            "mask": None if mask is None else np.asarray(mask).astype(int).tolist(),
            "block_sizes": None if block_sizes is None else list(block_sizes),
        }
        m = self._ncu_mod.measure(spec, self.ncu)
        return {
            k: m.get(k)
            for k in ("dram_read_bytes", "dram_write_bytes", "dram_bytes", "error", "tiles_forward", "tiles_backward")
        }


def _tiles(algorithm, variant, shape, measured=None):
    out = {}
    for p in ("forward", "backward"):
        t = (measured or {}).get(f"tiles_{p}")
        out[p] = list(t) if t else (list(common.tiles(algorithm, variant, p, shape["d"])[0] or []) or None)
    return out


def left_panel(run: Runner, shape: dict) -> dict:
    rows = []
    for alg in LEFT_ALGORITHMS:
        variant = None if alg == "standard" else common.default_variant(alg, "forward")
        bwd_variant = None if alg == "standard" else common.default_variant(alg, "backward")
        print(f"  left: {alg} ({variant}) ...", flush=True)
        fwd = run.time(alg, None, "forward", shape)
        both = run.time(alg, None, "fwd+bwd", shape)
        meas = run.bytes(alg, None, "fwd+bwd", shape)
        tiles = _tiles(alg, None, shape, meas)
        model = common.model_count(alg, "fwd+bwd", **shape, tile=tiles["forward"], bwd_tile=tiles["backward"])
        rows.append(
            {
                "algorithm": alg,
                "variant_forward": variant,
                "variant_backward": bwd_variant,
                "tiles": tiles,
                "gflop": common.matmul_flops(alg, "fwd+bwd", **shape) / 1e9,
                "forward_ms": fwd.get("median_ms"),
                "runtime_ms": both.get("median_ms"),
                "hbm_gb_measured": None if meas.get("dram_bytes") is None else meas["dram_bytes"] / 1e9,
                "hbm_read_gb_measured": None if meas.get("dram_read_bytes") is None else meas["dram_read_bytes"] / 1e9,
                "hbm_write_gb_measured": None
                if meas.get("dram_write_bytes") is None
                else meas["dram_write_bytes"] / 1e9,
                "hbm_gb_model": model["model_bytes"] / 1e9,
                "hbm_gb_compulsory": common.compulsory_bytes("fwd+bwd", **shape) / 1e9,
                "error": fwd.get("error") or both.get("error") or meas.get("error"),
                "not_measured": meas.get("not_measured"),
            }
        )
    return {"shape": shape, "pass": "fwd+bwd", "rows": rows}


def middle_panel(run: Runner, shape: dict, bcs, br) -> dict:
    variant = common.default_variant("flash1", "forward")
    rows = []
    for bc in bcs:
        print(f"  middle: Bc = {bc} ...", flush=True)
        bs = (br, bc)
        t = run.time("flash1", variant, "forward", shape, block_sizes=bs)
        meas = run.bytes("flash1", variant, "forward", shape, block_sizes=bs) if "error" not in t else {}
        model = common.model_count("flash1", "forward", **shape, tile=bs)
        rows.append(
            {
                "Br": br,
                "Bc": bc,
                "Tc": -(-shape["N"] // bc),
                "runtime_ms": t.get("median_ms"),
                "hbm_gb_measured": None if meas.get("dram_bytes") is None else meas["dram_bytes"] / 1e9,
                "hbm_gb_model": model["model_bytes"] / 1e9,
                "error": t.get("error") or meas.get("error"),
                "not_measured": meas.get("not_measured"),
            }
        )
    return {"shape": shape, "pass": "forward", "algorithm": "flash1", "variant": variant, "rows": rows}


def right_panel(run: Runner, shape: dict, tiles, densities) -> dict:
    T = -(-shape["N"] // tiles[0])
    masks = [("banded", dens, common.block_mask("banded", T, T, dens)) for dens in densities]
    masks.append(("butterfly", None, common.block_mask("butterfly", T, T)))
    rows = []
    for pattern, _, mask in masks:
        density = float(mask.mean())
        print(f"  right: {pattern} density {density:.3f} ...", flush=True)
        fwd = run.time("block-sparse", None, "forward", shape, mask=mask, block_sizes=tiles)
        both = run.time("block-sparse", None, "fwd+bwd", shape, mask=mask, block_sizes=tiles)
        model = common.model_count("block-sparse", "fwd+bwd", **shape, tile=tiles, bwd_tile=tiles, mask=mask)
        rows.append(
            {
                "pattern": pattern,
                "density": density,
                "forward_ms": fwd.get("median_ms"),
                "runtime_ms": both.get("median_ms"),
                "hbm_gb_model": model["model_bytes"] / 1e9,
                "gflop": common.matmul_flops("block-sparse", "fwd+bwd", **shape, density=density) / 1e9,
                "error": fwd.get("error") or both.get("error"),
            }
        )
    dense = run.time("flash1", None, "fwd+bwd", shape)
    dense_fwd = run.time("flash1", None, "forward", shape)
    return {
        "shape": shape,
        "pass": "fwd+bwd",
        "block_size": list(tiles),
        "rows": rows,
        "flash1_dense": {
            "variant": common.default_variant("flash1", "forward"),
            "runtime_ms": dense.get("median_ms"),
            "forward_ms": dense_fwd.get("median_ms"),
            "error": dense.get("error") or dense_fwd.get("error"),
        },
    }


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------
def plot(data: dict, out: Path) -> list[str]:
    """figure2_left.png, figure2_middle.png, figure2_right.png beside the JSON; [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  matplotlib not installed: no plots (pip install matplotlib)")
        return []
    label = "simulator, tiny run (functional only)" if data["tiny"] else data["provenance"].get("device", "?")
    written = []

    left = data.get("left")
    if left:
        rows = left["rows"]
        names = [r["algorithm"] for r in rows]
        fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
        series = [
            ("GFLOP (matmul)", [r["gflop"] for r in rows], None),
            ("HBM GB (fwd+bwd)", [r["hbm_gb_measured"] for r in rows], [r["hbm_gb_model"] for r in rows]),
            ("runtime fwd+bwd (ms)", [r["runtime_ms"] for r in rows], None),
        ]
        for ax, (title, vals, model) in zip(axes, series):
            x = np.arange(len(names))
            ax.bar(x, [v if v is not None else 0 for v in vals], color="tab:blue", label="measured" if model else None)
            if model:
                ax.scatter(x, model, color="tab:red", marker="_", s=400, label="IO model", zorder=3)
                ax.legend(fontsize=7)
            ax.set_xticks(x, names, fontsize=8)
            ax.set_title(title, fontsize=9)
        fig.suptitle(f"Figure 2 left: GPT-2 medium attention, {label}", fontsize=9)
        fig.tight_layout()
        written.append(_save(fig, out / "figure2_left.png", plt))

    mid = data.get("middle")
    if mid:
        rows = [r for r in mid["rows"] if r.get("runtime_ms") is not None]
        if rows:
            fig, ax = plt.subplots(figsize=(5, 3.4))
            bc = [r["Bc"] for r in rows]
            ax.plot(bc, [r["hbm_gb_model"] for r in rows], "o--", color="tab:red", label="HBM GB, IO model")
            if any(r["hbm_gb_measured"] is not None for r in rows):
                ax.plot(bc, [r["hbm_gb_measured"] for r in rows], "o-", color="tab:blue", label="HBM GB, measured")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("block size Bc")
            ax.set_ylabel("HBM GB (forward)")
            ax2 = ax.twinx()
            ax2.plot(bc, [r["runtime_ms"] for r in rows], "s-", color="tab:green", label="forward runtime (right axis)")
            ax2.set_ylabel("forward runtime (ms)")
            handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
            ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper right")
            ax.set_title(f"Figure 2 middle: FA1 forward, Br = {rows[0]['Br']}\n{label}", fontsize=8)
            fig.tight_layout()
            written.append(_save(fig, out / "figure2_middle.png", plt))

    right = data.get("right")
    if right:
        rows = [r for r in right["rows"] if r.get("runtime_ms") is not None]
        if rows:
            fig, ax = plt.subplots(figsize=(5, 3.4))
            dens = [r["density"] for r in rows]
            ax.plot(dens, [r["runtime_ms"] for r in rows], "o", color="tab:blue", label="block-sparse fwd+bwd")
            ax.plot(dens, [r["forward_ms"] for r in rows], "^", color="tab:cyan", label="block-sparse fwd")
            full = next((r["runtime_ms"] for r in rows if r["pattern"] == "banded" and r["density"] == 1.0), None)
            if full:
                xs = np.array(sorted(dens))
                ax.plot(xs, full * xs, ":", color="gray", label="proportional to density")
            fd = right.get("flash1_dense", {}).get("runtime_ms")
            if fd:
                ax.axhline(fd, color="tab:red", ls="--", label="FlashAttention (dense), fwd+bwd")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("fraction of non-zero blocks")
            ax.set_ylabel("runtime (ms)")
            ax.legend(fontsize=7)
            ax.set_title(f"Figure 2 right: block-sparse, N = {right['shape']['N']}\n{label}", fontsize=8)
            fig.tight_layout()
            written.append(_save(fig, out / "figure2_right.png", plt))
    return written


def _previous(path: Path, tiny: bool) -> dict:
    """An earlier results file in the same folder (same kind, same tiny-ness), else {}."""
    import json

    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return old if old.get("kind") == "numba_flash.figure2" and bool(old.get("tiny")) == bool(tiny) else {}


def _save(fig, path: Path, plt) -> str:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


# ----------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.figure2", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder: figure2.json and figure2_{left,middle,right}.png")
    ap.add_argument(
        "--tiny", action="store_true", help="tiny shapes, no ncu: a functional run that takes seconds (simulator)"
    )
    ap.add_argument("--panels", default="left,middle,right", help="comma-separated subset of left, middle, right")
    ap.add_argument("--no-ncu", action="store_true", help="do not measure DRAM bytes (timings and model only)")
    ap.add_argument("--repeats", type=int, default=10, help="timed repeats per call (median reported)")
    args = ap.parse_args(argv)
    panels = [p.strip() for p in args.panels.split(",") if p.strip()]
    bad = set(panels) - {"left", "middle", "right"}
    if bad:
        ap.error(f"unknown panel(s): {sorted(bad)}")
    if not args.tiny and not common.ON_GPU:
        print("bench.figure2 needs a CUDA GPU (this is Numba's CUDA simulator); use --tiny for a functional run")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Runner(args.tiny, not args.no_ncu, args.repeats)
    t0 = time.time()
    data = {
        "kind": "numba_flash.figure2",
        "version": 1,
        "tiny": bool(args.tiny),
        "provenance": common.provenance(),
        "hbm_measured_with": "ncu: " + run._ncu_mod.command_line(run.ncu) if run.ncu else None,
        "not_measured": run.why_not_measured,
        "dtype": "float32",
    }
    if run.ncu:
        data["provenance"]["ncu"] = run._ncu_mod.ncu_version(run.ncu)
    old = _previous(out / "figure2.json", args.tiny)
    for name in ("left", "middle", "right"):
        if name not in panels and name in old:  # panels run earlier into the same folder are kept
            data[name] = old[name]
    if "left" in panels:
        data["left"] = left_panel(run, TINY["left"] if args.tiny else GPT2)
    if "middle" in panels:
        data["middle"] = middle_panel(
            run,
            TINY["middle"] if args.tiny else GPT2,
            TINY["middle_bc"] if args.tiny else MIDDLE_BC,
            TINY["middle_br"] if args.tiny else MIDDLE_BR,
        )
    if "right" in panels:
        data["right"] = right_panel(
            run,
            TINY["right"] if args.tiny else RIGHT,
            TINY["right_tiles"] if args.tiny else RIGHT_TILES,
            TINY["right_densities"] if args.tiny else RIGHT_DENSITIES,
        )
    for name in panels:  # each panel says where and when it was measured (panels may come from separate runs)
        data[name]["provenance"] = {k: data["provenance"].get(k) for k in ("device", "date_utc", "commit", "command")}
    data["elapsed_s"] = round(time.time() - t0, 1)
    data["plots"] = []
    common.write_json(out / "figure2.json", data)
    data["plots"] = plot(data, out)
    common.write_json(out / "figure2.json", data)
    errors = [
        r.get("error")
        for p in ("left", "middle", "right")
        for r in (data.get(p) or {}).get("rows", [])
        if r.get("error")
    ]
    print(
        f"figure2: {len(panels)} panel(s) in {data['elapsed_s']} s -> {out / 'figure2.json'} "
        f"{', '.join(data['plots'])}" + (f"; {len(errors)} case(s) with errors (see the JSON)" if errors else "")
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
