"""Backward error against the logit scale, for every (algorithm, variant): the table of docs/backward.rst.

For each logit scale ``s`` (``q`` scaled by ``s``: scores ``tau q.k`` of standard deviation ``s``),
each (algorithm, variant) runs its forward and backward through the API on fresh tiny inputs (the
simulator's sizes: b = 1, N = 24, 2 heads, d = 32, causal) and the script prints, per gradient, the
worst ratio over the trials of its error against the float64 oracle to the error of a float32
standard backward (the error rule allows 3, plus a few-ulp floor), and whether the rule held.

Run from the repository root (simulator, a few minutes on 2 cores; on a GPU it runs the GPU kernels)::

    NUMBA_ENABLE_CUDASIM=1 python -m bench.logit_scale > docs/results/logit_scale_sim.csv

For "before" numbers, run this file by path with an older checkout first on ``PYTHONPATH`` (it imports
only the public API and ``tests/attn_testing.py``)::

    cd /old/checkout && NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=. python /repo/bench/logit_scale.py > before.csv
"""

from __future__ import annotations

import argparse
import sys

from numba_flash import attention_backward_numpy, attention_numpy, registry
from numba_flash.runtime import backend as _backend
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np

from tests.attn_testing import max_err, naive_attention_backward_float32, ulp_floor


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,4,16,64,256")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--pairs", default=None, help="algorithm:variant,... (default: every registered pair)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    sys.setswitchinterval(1e-3)
    pairs = sorted({(k.algorithm, k.variant) for k in registry.variants()})
    if args.pairs:
        pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
    print(f"# backend: {_backend.describe()}; b=1, N={args.n}, h=2, d={args.d}, causal; worst of {args.trials} trials")
    print("algorithm,variant,scale,dq_ratio,dk_ratio,dv_ratio,rule_holds")
    for algorithm, variant in pairs:
        for scale in (float(s) for s in args.scales.split(",")):
            worst = {"dq": 0.0, "dk": 0.0, "dv": 0.0}
            holds = True
            for t in range(args.trials):
                rng = np.random.default_rng(7919 * t + 17)
                q, k, v = (rng.standard_normal((1, args.n, 2, args.d)).astype(np.float32) for _ in range(3))
                q = (q * np.float32(scale)).astype(np.float32)
                dout = rng.standard_normal(q.shape).astype(np.float32)
                out, st = attention_numpy(q, k, v, causal=True, algorithm=algorithm, variant=variant, return_stats=True)
                got = attention_backward_numpy(dout, q, k, v, out, st)
                ref = standard_backward(dout, q, k, v, causal=True)
                naive = naive_attention_backward_float32(dout, q, k, v, causal=True)
                for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
                    err, base = max_err(g, r), max_err(n, r)
                    worst[name] = max(worst[name], err / base if base > 0 else float("inf"))
                    holds &= bool(np.all(np.isfinite(g))) and err <= 3.0 * base + ulp_floor(r)
            print(
                f"{algorithm},{variant},{scale:g},"
                f"{worst['dq']:.2f},{worst['dk']:.2f},{worst['dv']:.2f},{'yes' if holds else 'no'}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
