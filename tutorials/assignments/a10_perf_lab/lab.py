"""Assignment 10's lab script: time and DRAM bytes of standard vs FlashAttention-2 attention, and a roofline.

Paper: FA1 section 2 and Figure 2 (left: standard attention moves ~9x the HBM bytes of FlashAttention),
Theorem 2; FA2 section 4.1 (FLOPs). It uses YOUR functions from ``stub.py`` (or ``--impl FILE``): the
copy kernel (memory roof), the FLOP and HBM models, the ncu parser and the roofline.

Run it on a machine with an NVIDIA GPU (and, for the DRAM bytes, Nsight Compute's ``ncu`` on the PATH)::

    python tutorials/assignments/a10_perf_lab/lab.py --out lab_out
    python tutorials/assignments/a10_perf_lab/lab.py --N 1024 2048 4096 --d 64 --bh 16 --out lab_out
    python tutorials/assignments/a10_perf_lab/lab.py --no-ncu            # timings only

Without a GPU (numba-flash runs in the CUDA simulator) it prints what it would do and exits 0: the
simulator's timings mean nothing and it has no DRAM counters.

What it does, per sequence length N and algorithm (``standard``: FA1 Algorithm 0; ``flash2``: FA2
Algorithm 1, both numba-flash's kernels through ``flash_attn_func``, float32, ``bh`` heads of dim d):

1. times one forward pass with CUDA events (after warm-up), median of ``--repeats``;
2. runs ``ncu --csv --print-units base --profile-from-start off --clock-control none --metrics
   dram__bytes_read.sum,dram__bytes_write.sum`` on a child (``lab.py --profile-one ALG N``) that does
   one forward pass between ``cuda.profile_start()`` and ``cuda.profile_stop()``, and reads the bytes
   with your ``parse_ncu_csv``;
3. compares them with your model (``standard_attention_hbm`` / ``fa2_forward_hbm``, 4 bytes per
   element, times ``bh``), and places the point (FLOPs / measured bytes, FLOPs / time) on the roofline
   of this GPU: your copy kernel's GB/s and cuBLAS SGEMM's FLOP/s (torch, TF32 off).

Writes ``OUT/results.json`` and, with matplotlib, ``OUT/roofline.png``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numba_flash

import numpy as np

HERE = Path(__file__).resolve().parent
ALGORITHMS = ("standard", "flash2")
NCU_METRICS = "dram__bytes_read.sum,dram__bytes_write.sum"


def load_student(path: Path):
    spec = importlib.util.spec_from_file_location("a10_student", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["a10_student"] = module
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", type=Path, default=HERE / "stub.py", help="your file (default: stub.py here)")
    p.add_argument("--N", type=int, nargs="+", default=[512, 1024, 2048, 4096], help="sequence lengths")
    p.add_argument("--d", type=int, default=64, help="head dimension")
    p.add_argument("--bh", type=int, default=16, help="batch x heads")
    p.add_argument(
        "--tiles",
        type=int,
        nargs=2,
        default=[32, 32],
        metavar=("BR", "BC"),
        help="FA2 tiles passed to the kernel and the model",
    )
    p.add_argument(
        "--variant",
        default=None,
        help="kernel variant, if this numba-flash's flash_attn_func takes variant= (e.g. readable)",
    )
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("lab_out"))
    p.add_argument("--no-ncu", action="store_true", help="skip the DRAM measurement")
    p.add_argument("--profile-one", nargs=2, metavar=("ALG", "N"), help=argparse.SUPPRESS)  # the ncu child
    return p.parse_args(argv)


def inputs(torch, N, args):
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, N, args.bh, args.d)  # (batch, seqlen, heads, headdim): bh heads of one batch element
    return [torch.randn(shape, device="cuda", dtype=torch.float32, generator=g) for _ in range(3)]


def forward(alg, q, k, v, args):
    import inspect

    from numba_flash import flash_attn_func

    extra = {}
    if args.variant is not None and "variant" in inspect.signature(flash_attn_func).parameters:
        extra["variant"] = args.variant
    sizes = tuple(args.tiles) if alg == "flash2" else None
    return flash_attn_func(q, k, v, algorithm=alg, block_sizes=sizes, **extra)


def time_forward(torch, alg, N, args) -> float:
    """Median seconds of one forward pass (CUDA events, two warm-up calls absorb JIT compilation)."""
    q, k, v = inputs(torch, N, args)
    for _ in range(2):
        forward(alg, q, k, v, args)
    torch.cuda.synchronize()
    times = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        forward(alg, q, k, v, args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def profile_one(args) -> int:
    """The ncu child: warm up, then one forward pass between profile_start and profile_stop."""
    import torch
    from numba import cuda

    alg, N = args.profile_one[0], int(args.profile_one[1])
    q, k, v = inputs(torch, N, args)
    forward(alg, q, k, v, args)
    torch.cuda.synchronize()
    cuda.profile_start()
    forward(alg, q, k, v, args)
    torch.cuda.synchronize()
    cuda.profile_stop()
    return 0


def ncu_bytes(student, alg, N, args):
    """DRAM (read, write) bytes of one forward pass, summed over its kernels, or None if ncu is unavailable."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None
    cmd = [
        ncu, "--csv", "--print-units", "base", "--profile-from-start", "off", "--clock-control", "none",
        "--metrics", NCU_METRICS, sys.executable, str(Path(__file__).resolve()), "--impl", str(args.impl),
        "--profile-one", alg, str(N), "--d", str(args.d), "--bh", str(args.bh), "--tiles", *map(str, args.tiles),
    ] + (["--variant", args.variant] if args.variant else [])  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    per_kernel = student.parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or not per_kernel:
        print(
            f"  ncu gave no counters for {alg} N={N} (rc {proc.returncode}); last lines:\n    "
            + "\n    ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        )
        return None
    return sum(r for r, _ in per_kernel.values()), sum(w for _, w in per_kernel.values())


def model_bytes(student, alg, N, args) -> int:
    if alg == "standard":
        r, w = student.standard_attention_hbm(N, args.d)
    else:
        r, w = student.fa2_forward_hbm(N, args.d, args.tiles[0], args.tiles[1])
    return 4 * (r + w) * args.bh


def copy_bandwidth(student) -> float:
    """Bytes per second of your copy kernel on 2^26 floats (read + write), best of 5."""
    from numba import cuda

    n = 1 << 26
    src = cuda.to_device(np.ones(n, np.float32))
    dst = cuda.device_array(n, np.float32)
    student.copy(src, dst, blocks=1024, threads=256)  # warm-up (JIT)
    cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, end = cuda.event(), cuda.event()
        start.record()
        student.copy(src, dst, blocks=1024, threads=256)
        end.record()
        end.synchronize()
        best = min(best, cuda.event_elapsed_time(start, end) / 1e3)
    return 2 * 4 * n / best


def sgemm_flops(torch) -> float:
    """FLOP/s of a 4096^3 float32 matmul (cuBLAS SGEMM, TF32 off): the compute roof for fp32 kernels."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 5 * 2 * 4096**3 / (start.elapsed_time(end) / 1e3)


def plot(rows, bw, peak, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    x = np.logspace(-1, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.loglog(x, np.minimum(peak, x * bw), "k-", label=f"roofline: {bw / 1e9:.0f} GB/s, {peak / 1e12:.1f} TFLOP/s")
    for alg, marker in (("standard", "o"), ("flash2", "s")):
        pts = [r for r in rows if r["algorithm"] == alg]
        xs = [r["intensity_measured"] or r["intensity_model"] for r in pts]
        ys = [r["achieved_flops"] for r in pts]
        ax.loglog(xs, ys, marker, label=alg)
        for r, xi, yi in zip(pts, xs, ys):
            ax.annotate(f"N={r['N']}", (xi, yi), fontsize=7)
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title("Attention forward on the roofline")
    ax.legend()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    if numba_flash.is_simulator():
        print(
            "lab: no GPU here (numba-flash runs in Numba's CUDA simulator, whose timings mean nothing and which has no "
            "DRAM\n"
            "counters): the measurement part of assignment 10 is skipped. The graded part runs anywhere:\n"
            "    python -m pytest tutorials/assignments/a10_perf_lab\n"
            "On a GPU this script would time standard and flash2 attention at N = "
            f"{args.N}, d = {args.d}, {args.bh} heads, and run\n"
            f"    ncu --csv --print-units base --profile-from-start off --clock-control none --metrics {NCU_METRICS} "
            "python lab.py --profile-one ALG N"
        )
        return 0
    if args.profile_one:
        return profile_one(args)
    import torch

    if not torch.cuda.is_available():
        print("lab: this torch has no CUDA; install a CUDA build of torch to run the lab (skipped).")
        return 0
    student = load_student(args.impl)
    args.out.mkdir(parents=True, exist_ok=True)
    use_ncu = not args.no_ncu and shutil.which("ncu") is not None
    if not args.no_ncu and not use_ncu:
        print("lab: ncu not found on the PATH: DRAM bytes are not measured (model only).")
    bw, peak = copy_bandwidth(student), sgemm_flops(torch)
    print(
        f"{numba_flash.describe()}\nmemory roof (your copy kernel): {bw / 1e9:.0f} GB/s; compute roof (SGEMM): "
        f"{peak / 1e12:.1f} TFLOP/s"
    )
    rows = []
    header = (
        f"{'alg':>9} {'N':>6} {'time ms':>9} {'model MB':>10} {'ncu MB':>10} {'ncu/model':>9} {'TFLOP/s':>8} "
        f"{'bound':>8}"
    )
    print(header)
    for N in args.N:
        for alg in ALGORITHMS:
            t = time_forward(torch, alg, N, args)
            flops = student.attention_flops(N, args.d, args.bh)
            model = model_bytes(student, alg, N, args)
            measured = ncu_bytes(student, alg, N, args) if use_ncu else None
            moved = sum(measured) if measured else model
            intensity, attainable, bound = student.roofline(flops, moved, peak, bw)
            rows.append(
                dict(
                    algorithm=alg, N=N, d=args.d, bh=args.bh, seconds=t, flops=flops, model_bytes=model,
                    ncu_read_bytes=measured[0] if measured else None, ncu_write_bytes=measured[1] if measured else None,
                    intensity_model=flops / model, intensity_measured=intensity if measured else None,
                    achieved_flops=flops / t, attainable_flops=attainable, bound=bound,
                )
            )  # fmt: skip
            ratio = f"{moved / model:9.2f}" if measured else f"{'-':>9}"
            ncu_mb = f"{moved / 1e6:10.1f}" if measured else f"{'-':>10}"
            print(
                f"{alg:>9} {N:>6} {t * 1e3:9.3f} {model / 1e6:10.1f} {ncu_mb} {ratio} {flops / t / 1e12:8.2f} "
                f"{bound:>8}"
            )
    result = dict(device=numba_flash.describe(), copy_bandwidth=bw, sgemm_flops=peak, tiles=args.tiles, rows=rows)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    drew = plot(rows, bw, peak, args.out / "roofline.png")
    print(
        f"wrote {args.out / 'results.json'}"
        + (f" and {args.out / 'roofline.png'}" if drew else " (no matplotlib: no plot)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
