"""Short-sequence probe of the half FA2 pair: forward, backward and host time, cp.async on and off (one GPU call).

Why it exists: in the half grid at commit 4e97b6f, forward + backward at N = 1k-2k was slower than at
5a237bf although the forward got faster; this separates the passes. For each head dim (64, 128), mask and
N (1024, 4096), bf16, the FA2 convention (16k tokens, hidden 2048), with the forward's ``CP_ASYNC`` on and
off (``fa2_forward_half.default_features`` patched), it prints medians of 20 synchronized calls of

* ``fwd``: ``flash_attn_func`` (inputs that require grad);
* ``bwd``: ``out.backward(dout, retain_graph=True)`` on one saved forward;
* ``fb``: forward then backward, as the benchmark's fwd+bwd step; ``fb_sync``: the same with a
  ``torch.cuda.synchronize()`` between the passes (the backward's host work no longer overlaps the forward);
* ``bwd_host``: host milliseconds of the first backward call, unsynchronized (it includes compiling the
  backward the first time a head dim and mask are seen: read it only where it is small).

``--profile`` instead prints, at N = 1024, d = 64, the host time per call of 20 back-to-back calls of each pass
(no synchronization inside) and a cProfile of them (the functions with the most time of their own).

Run on a GPU machine::

    source bench/gpu/setup_env.sh
    python3 -m bench.short_seq_probe            # or --profile
"""

from __future__ import annotations

import argparse
import statistics
import time


def _median_ms(fn, torch, n=20):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def _passes(torch, flash_attn_func, q, k, v, dout, causal) -> dict:
    """One column of the table: fwd, bwd, fb, fb_sync medians and the first backward's host time (ms)."""
    def f():
        return flash_attn_func(q, k, v, causal=causal)

    def fb():
        for x in (q, k, v):
            x.grad = None
        f().backward(dout)

    out = f()

    def bonly():
        for x in (q, k, v):
            x.grad = None
        out.backward(dout, retain_graph=True)

    def fb_sync():
        for x in (q, k, v):
            x.grad = None
        o = f()
        torch.cuda.synchronize()
        o.backward(dout)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    bonly()
    th = 1e3 * (time.perf_counter() - t0)
    torch.cuda.synchronize()
    return dict(fwd=_median_ms(f, torch), bwd=_median_ms(bonly, torch), fb=_median_ms(fb, torch),
                fb_sync=_median_ms(fb_sync, torch), bwd_host=th)


def probe(torch):
    """The table of the module docstring, one line per (d, causal, N)."""
    from numba_flash import flash_attn_func
    from numba_flash.fast import fa2_forward_half as H

    real = H.default_features
    for d in (64, 128):
        for causal in (False, True):
            for N in (1024, 4096):
                b, h = 16384 // N, 2048 // d
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(b, N, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
                dout = torch.randn_like(q)
                res = {}
                for cp in (True, False):
                    H.default_features = (lambda cp=cp: {**real(), "CP_ASYNC": cp})
                    try:
                        res[cp] = _passes(torch, flash_attn_func, q, k, v, dout, causal)
                    finally:
                        H.default_features = real
                print(f"d={d} causal={causal} N={N}: " + " || ".join(
                    f"cp={int(cp)} " + " ".join(f"{k}={v:.2f}" for k, v in r.items()) for cp, r in res.items()), flush=True)


def profile(torch):
    """Host time per call of each pass at N = 1024, d = 64, and a cProfile of 20 calls."""
    import cProfile
    import pstats

    from numba_flash import flash_attn_func

    N, d, b, h = 1024, 64, 16, 32
    q, k, v = (torch.randn(b, N, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    out = flash_attn_func(q, k, v)

    def bonly():
        for x in (q, k, v):
            x.grad = None
        out.backward(dout, retain_graph=True)

    def fonly():
        return flash_attn_func(q, k, v)

    for fn, name in ((bonly, "backward"), (fonly, "forward")):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        th = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
        tg = (time.perf_counter() - t0) / 20
        print(f"{name}: host per call {1e3 * th:.3f} ms, with GPU {1e3 * tg:.3f} ms")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.short_seq_probe``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true", help="host time per call and a cProfile at N = 1024, d = 64")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from bench import _utils as bu

    if not bu.ON_GPU:
        print("short_seq_probe needs a GPU")
        return 1
    import torch

    (profile if args.profile else probe)(torch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
