"""Sweep of the fast FA1 forward kernel (:mod:`numba_flash.fast.alg1_forward`) on a GPU, for the log.

For one FA2-convention shape (16k tokens, hidden 2048) it times tilings of the fast kernel (workers,
rows per lane, S-chunk width, chunks per K/V block, register cap) and, with ``--readable``, the
readable kernel :mod:`numba_flash.alg1_forward`, and prints one JSON row each: ms, TFLOP/s,
registers, local memory, dynamic SRAM, max error against torch's naive attention (``--json`` also
writes the rows, with provenance, to a file). Not part of the test suite; its numbers are in
``docs/notes/performance-log.md`` ("FA1 forward, fast twin").

Usage (GPU, from the repository root)::

    python3 -m bench.sweep_fa1_fast --seqlen 4096 --headdim 64 [--causal] [--readable]

``--dry-run`` lists the candidate tilings and their shared memory without running anything (works
in the simulator, where the kernel's tiling is the simulator's).
"""

from __future__ import annotations

import argparse
import json
import sys

from numba_flash import alg1_forward
from numba_flash._launch import Allocator, check_attention_args
from numba_flash.fast import alg1_forward as alg1_forward_fast
from numba_flash.runtime import resources as _inspect

from bench import common as bu

#: (label, config (NW, WS, TM, TPR, BCC, NCH) without DP); None config = the default. (A "TM 4, 12 warps, cap 168"
#: candidate with a 168-register cap, the kernel's MAXREG, last lived in commit 6c5fdf8.)
CANDIDATES = {
    64: [
        ("default", None),
        ("Bc 64 (NCH 1)", (8, 32, 8, 8, 64, 1)),
        ("TM 4, Br 16", (8, 32, 4, 8, 64, 2)),
        ("4 warps", (4, 32, 8, 8, 64, 2)),
    ],
    128: [("default", None), ("Bc 64 (NCH 2)", (8, 32, 4, 8, 32, 2))],
}


def _config(cfg, d):
    """The full tiling (with the padded head dim DP) of a candidate, or None for the default."""
    return None if cfg is None else (*cfg, alg1_forward_fast._round_up(d, 4 * cfg[3]))


def _candidates(d, only_default):
    cands = CANDIDATES.get(d, CANDIDATES[64][:1])
    return cands[:1] if only_default else cands


def dry_run(seqlen, d, causal, only_default):
    prob = bu.fa2_problem(seqlen, d, causal)
    for label, cfg in _candidates(d, only_default):
        kernel, grid, nt, nbytes, used = alg1_forward_fast.plan(prob, None, _config(cfg, d))
        print(
            f"d={d} N={seqlen} causal={int(causal)} {label:26} config {used} threads {nt} dynamic SRAM "
            f"{nbytes / 1024:.1f} KB, {grid[0]} blocks"
        )
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.sweep_fa1_fast``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--headdim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--readable", action="store_true", help="also time the readable kernel")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only-default", action="store_true", help="time the default tiling only")
    ap.add_argument("--json", default=None, help="also write the rows (and provenance) to this file")
    ap.add_argument("--dry-run", action="store_true", help="list the candidates' tiling and SRAM; run nothing")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    if args.dry_run:
        return dry_run(args.seqlen, args.headdim, args.causal, args.only_default)
    if not bu.ON_GPU:
        print("sweep_fa1_fast needs a GPU (or --dry-run)")
        return 1
    shape = bu.fa2_shape(args.seqlen, args.headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=1)
    prob = check_attention_args(q, k, v, causal=args.causal)
    alloc = Allocator(q)
    qk, kk, vk = (alloc.to_kernel(x) for x in (q, k, v))
    flops = bu.flops_forward(b, h, n, n, d, args.causal)
    ref = bu.torch_naive_attention(q, k, v, causal=args.causal)
    runs = [(lbl, cfg, "fast") for lbl, cfg in _candidates(d, args.only_default)]
    if args.readable:
        runs.append(("readable", None, "readable"))
    rows = []
    for label, cfg, variant in runs:
        try:
            if variant == "readable":

                def fn():
                    return alg1_forward.forward(qk, kk, vk, prob, alloc)

                attrs = {}
            else:
                config = _config(cfg, d)

                def fn(config=config):
                    return alg1_forward_fast.forward(qk, kk, vk, prob, alloc, config=config)

                kernel, grid, nt, nbytes, used = alg1_forward_fast.plan(prob, None, config)
                fn()
                bu.synchronize()
                attrs = dict(_inspect.kernel_resources(kernel), config=used, dyn_smem_kb=nbytes / 1024, threads=nt)
            t = bu.time_median(fn, warmup=1, repeats=args.repeats)
            out = alloc.result(fn().out)
            err = float((out - ref).abs().max())
            row = dict(
                label=label,
                variant=variant,
                N=n,
                d=d,
                causal=args.causal,
                ms=t * 1e3,
                tflops=bu.tflops(flops, t),
                max_err_vs_torch=err,
                **attrs,
            )
        except Exception as exc:  # keep sweeping
            row = dict(
                label=label, variant=variant, N=n, d=d, causal=args.causal, error=f"{type(exc).__name__}: {exc}"[:300]
            )
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                dict(provenance=bu.provenance(), sgemm_tflops=bu.sgemm_tflops(), rows=rows), fh, indent=1, default=str
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
