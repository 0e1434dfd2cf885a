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
and of the forward kernel module on arrays converted once (no synchronization inside), and a cProfile of
each, by cumulative and by own time.

``--host`` instead times the forward alone at N = 1024 (d = 64 and 128; bf16 through the half kernel, float32
through the 3xTF32 kernel) two ways: the kernel module's ``forward`` on arrays converted once (what the
kernel and its launch cost) and ``flash_attn_func`` (plus the API's checks, conversions and the torch custom
op). For each, the median of 50 synchronized calls, the host time per call of 50 back-to-back calls, the
wall time of those calls once synchronized, and CUDA events around them: where the host time per call is as
large as the total, the GPU waits for the host. Then the host time of one ``cuda.as_cuda_array`` (with and
without ``sync``) and of one ``check_attention_args``.

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
    return dict(
        fwd=_median_ms(f, torch),
        bwd=_median_ms(bonly, torch),
        fb=_median_ms(fb, torch),
        fb_sync=_median_ms(fb_sync, torch),
        bwd_host=th,
    )


def probe(torch):
    """The table of the module docstring, one line per (d, causal, N)."""
    from numba_flash import flash_attn_func
    from numba_flash.tensorcore import fa2_forward_half as H

    real = H.default_features
    for d in (64, 128):
        for causal in (False, True):
            for N in (1024, 4096):
                b, h = 16384 // N, 2048 // d
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (
                    torch.randn(b, N, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                    for _ in range(3)
                )
                dout = torch.randn_like(q)
                res = {}
                for cp in (True, False):
                    H.default_features = lambda cp=cp: {**real(), "CP_ASYNC": cp}
                    try:
                        res[cp] = _passes(torch, flash_attn_func, q, k, v, dout, causal)
                    finally:
                        H.default_features = real
                print(
                    f"d={d} causal={causal} N={N}: "
                    + " || ".join(
                        f"cp={int(cp)} " + " ".join(f"{k}={v:.2f}" for k, v in r.items()) for cp, r in res.items()
                    ),
                    flush=True,
                )


def profile(torch):
    """Host time per call of each pass at N = 1024, d = 64 (bf16), and a cProfile of 20 calls of each, by
    cumulative and by own time: the backward and forward through ``flash_attn_func``, and the forward kernel
    module on arrays converted once (``kernel-level``, what the module's plan, allocations and launch cost)."""
    import cProfile
    import pstats

    from numba_flash import flash_attn_func
    from numba_flash._launch import Allocator, check_attention_args
    from numba_flash.tensorcore import fa2_forward_half

    N, d, b, h = 1024, 64, 16, 32
    q, k, v = (torch.randn(b, N, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    out = flash_attn_func(q, k, v)
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    alloc = Allocator(q)
    kq, kk, kv = (alloc.to_words(x) for x in (q, k, v))

    def bonly():
        for x in (q, k, v):
            x.grad = None
        out.backward(dout, retain_graph=True)

    def fonly():
        return flash_attn_func(q, k, v)

    def kernel_level():
        return fa2_forward_half.forward(kq, kk, kv, prob, alloc)

    for fn, name in ((bonly, "backward"), (fonly, "forward"), (kernel_level, "forward kernel-level")):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        th = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
        tg = (time.perf_counter() - t0) / 20
        print(f"{name}: host per call {1e3 * th:.3f} ms, with GPU {1e3 * tg:.3f} ms", flush=True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        for order, n in (("cumulative", 45), ("tottime", 25)):
            print(f"--- {name}: cProfile of 20 calls by {order}", flush=True)
            pstats.Stats(pr).sort_stats(order).print_stats(n)


def _host_timings(fn, torch, n=50):
    """One ``--host`` line: synced median, host time per call, loop total and CUDA-event time per call (ms)."""
    synced = _median_ms(fn, torch, n)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    tot = (time.perf_counter() - t0) / n * 1e3
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return f"synced {synced:.3f}  host-loop {host:.3f}  loop-total {tot:.3f}  events {e0.elapsed_time(e1) / n:.3f} ms"


def host(torch):
    """The ``--host`` table of the module docstring."""
    import os

    from numba_flash import flash_attn_func
    from numba_flash._launch import Allocator, check_attention_args
    from numba_flash.tensorcore import fa2_forward_half, fa2_forward_tf32

    from numba import cuda

    print(
        "NUMBA_CUDA_ARRAY_INTERFACE_SYNC =", os.environ.get("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "(default)"), flush=True
    )
    for dt, mod, conv in (
        (torch.bfloat16, fa2_forward_half, "to_words"),
        (torch.float32, fa2_forward_tf32, "to_kernel"),
    ):
        for d in (64, 128):
            N, b, h = 1024, 16, 2048 // d
            q, k, v = (torch.randn(b, N, h, d, device="cuda", dtype=dt) for _ in range(3))
            prob = check_attention_args(q, k, v, 0.0, None, False, 0)
            alloc = Allocator(q)
            kq, kk, kv = (getattr(alloc, conv)(x) for x in (q, k, v))
            kernel_level = _host_timings(lambda: mod.forward(kq, kk, kv, prob, alloc), torch)  # noqa: B023
            print(f"{dt} d={d} N={N} kernel-level  ", kernel_level, flush=True)
            api_level = _host_timings(lambda: flash_attn_func(q, k, v), torch)  # noqa: B023
            print(f"{dt} d={d} N={N} flash_attn_func", api_level, flush=True)
    x = torch.randn(16, 1024, 32, 64, device="cuda").view(torch.int32)
    for sync in (True, False):
        t0 = time.perf_counter()
        for _ in range(1000):
            cuda.as_cuda_array(x, sync=sync)
        print(f"as_cuda_array sync={sync}: {(time.perf_counter() - t0):.3f} ms per call", flush=True)
    t0 = time.perf_counter()
    for _ in range(1000):
        check_attention_args(q, k, v, 0.0, None, False, 0)
    print(f"check_attention_args: {(time.perf_counter() - t0):.3f} ms per call")


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.short_seq_probe``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--profile", action="store_true", help="host time per call and a cProfile at N = 1024, d = 64")
    how.add_argument(
        "--host",
        action="store_true",
        help="the forward at N = 1024: kernel level against flash_attn_func, host and GPU",
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from bench import common as bu

    if not bu.ON_GPU:
        print("short_seq_probe needs a GPU")
        return 1
    import torch

    (profile if args.profile else host if args.host else probe)(torch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
