"""Sweep of the fast FA1 forward kernel (:mod:`numba_flash.fast.alg1_forward`) on a GPU, for the log.

For one FA2-convention shape (16k tokens, hidden 2048) it times tilings of the fast kernel (workers,
rows per lane, S-chunk width, chunks per K/V block, register cap) and the readable kernel, and prints
one JSON row each: ms, TFLOP/s, registers, local memory, dynamic SRAM, max error against torch's
naive attention. Not part of the test suite; numbers go to docs/notes/performance-log.md.

Usage (GPU)::

    python tests/benchmarks/sweep_fa1_fast.py --seqlen 4096 --headdim 64 [--causal]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_utils as bu

from numba_flash import _inspect, alg1_forward, alg1_forward_fast
from numba_flash._launch import Allocator, check_attention_args

#: (label, config (NW, WS, TM, TPR, BCC, NCH, DP without DP), MAXREG); None config = the default.
CANDIDATES = {
    64: [("default", None, None), ("Bc 64 (NCH 1)", (8, 32, 8, 8, 64, 1), None), ("TM 4, Br 16", (8, 32, 4, 8, 64, 2), None),
         ("TM 4, 12 warps, cap 168", (12, 32, 4, 8, 64, 2), 168), ("4 warps", (4, 32, 8, 8, 64, 2), None)],
    128: [("default", None, None), ("Bc 64 (NCH 2)", (8, 32, 4, 8, 32, 2), None)],
}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--headdim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--readable", action="store_true", help="also time the readable kernel")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only-default", action="store_true", help="time the default tiling only")
    args = ap.parse_args(argv)
    shape = bu.fa2_shape(args.seqlen, args.headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=1)
    prob = check_attention_args(q, k, v, causal=args.causal)
    alloc = Allocator(q)
    qk, kk, vk = (alloc.to_kernel(x) for x in (q, k, v))
    flops = bu.flops_forward(b, h, n, n, d, args.causal)
    ref = bu.torch_naive_attention(q, k, v, causal=args.causal)
    rows = [("readable", None, None, "readable")] if args.readable else []
    cands = CANDIDATES.get(d, CANDIDATES[64][:1])
    rows = [(lbl, cfg, mr, "fast") for lbl, cfg, mr in (cands[:1] if args.only_default else cands)] + rows
    for label, cfg, maxreg, variant in rows:
        try:
            if variant == "readable":
                fn = lambda: alg1_forward.forward(qk, kk, vk, prob, alloc, variant="readable")  # noqa: E731
                attrs = {}
            else:
                config = None if cfg is None else (*cfg, alg1_forward_fast._round_up(d, 4 * cfg[3]))
                feats = {"MAXREG": maxreg}
                fn = lambda: alg1_forward_fast.forward(qk, kk, vk, prob, alloc, config=config, features=feats)  # noqa: E731
                kernel, grid, nt, nbytes, used = alg1_forward_fast.plan(prob, None, config, feats)
                fn()
                bu.synchronize()
                attrs = dict(_inspect.kernel_resources(kernel), config=used, dyn_smem_kb=nbytes / 1024, threads=nt)
            t = bu.time_median(fn, warmup=1, repeats=args.repeats)
            out = alloc.result(fn().out)
            err = float((out - ref).abs().max())
            row = dict(label=label, variant=variant, N=n, d=d, causal=args.causal, ms=t * 1e3, tflops=bu.tflops(flops, t), max_err_vs_torch=err, **attrs)
        except Exception as exc:  # keep sweeping
            row = dict(label=label, variant=variant, N=n, d=d, causal=args.causal, error=f"{type(exc).__name__}: {exc}"[:300])
        print(json.dumps(row, default=str), flush=True)


if __name__ == "__main__":
    main()
