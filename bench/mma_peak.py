"""Peak rates of the arithmetic a fast fp32 attention kernel could use, measured on this GPU.

Before writing a tensor-core attention kernel, measure what each instruction can give from Numba:
``mma.sync`` through inline PTX (:mod:`numba_flash.tensorcore.ptx`) for the FP64 tensor-core shapes and TF32,
against plain FP32 FFMA. Each warp runs 2 to 8 independent accumulator chains (so the loop is
throughput-bound, not latency-bound) for ``ITERS`` iterations; 8 warps per block, 8 blocks per SM.
Prints one JSON line per instruction (TFLOP/s counting 2 FLOPs per multiply-add), with the device.
The output of one H200 run was ``docs/results/sweeps/mma_peak_h200.jsonl``, last in the tree at e0e5a9b.

    python3 -m bench.mma_peak > mma_peak.jsonl            # GPU only, from the repository root
"""

from __future__ import annotations

import argparse
import json
import sys

from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import ptx

import numpy as np
from numba import cuda, float32, float64, uint32

ITERS = 4096
THREADS = 256


@cuda.jit
def k_dmma884(x, out, n):
    a = x[cuda.threadIdx.x]
    c0 = (a, a)
    c1 = (a, a)
    c2 = (a, a)
    c3 = (a, a)
    for _ in range(n):
        c0 = ptx.dmma_m8n8k4_asm((a,), (a,), c0)
        c1 = ptx.dmma_m8n8k4_asm((a,), (a,), c1)
        c2 = ptx.dmma_m8n8k4_asm((a,), (a,), c2)
        c3 = ptx.dmma_m8n8k4_asm((a,), (a,), c3)
    out[cuda.grid(1)] = c0[0] + c1[0] + c2[0] + c3[0] + c0[1] + c1[1] + c2[1] + c3[1]


@cuda.jit
def k_dmma1688(x, out, n):
    a = x[cuda.threadIdx.x]
    c0 = (a, a, a, a)
    c1 = (a, a, a, a)
    c2 = (a, a, a, a)
    c3 = (a, a, a, a)
    for _ in range(n):
        c0 = ptx.dmma_m16n8k8_asm((a, a, a, a), (a, a), c0)
        c1 = ptx.dmma_m16n8k8_asm((a, a, a, a), (a, a), c1)
        c2 = ptx.dmma_m16n8k8_asm((a, a, a, a), (a, a), c2)
        c3 = ptx.dmma_m16n8k8_asm((a, a, a, a), (a, a), c3)
    out[cuda.grid(1)] = c0[0] + c1[1] + c2[2] + c3[3]


@cuda.jit
def k_dmma16816(x, out, n):
    a = x[cuda.threadIdx.x]
    c0 = (a, a, a, a)
    c1 = (a, a, a, a)
    for _ in range(n):
        c0 = ptx.dmma_m16n8k16_asm((a, a, a, a, a, a, a, a), (a, a, a, a), c0)
        c1 = ptx.dmma_m16n8k16_asm((a, a, a, a, a, a, a, a), (a, a, a, a), c1)
    out[cuda.grid(1)] = c0[0] + c1[1]


@cuda.jit
def k_tf32(x, out, n):
    a = float32(x[cuda.threadIdx.x])
    u = uint32(cuda.threadIdx.x)
    c0 = (a, a, a, a)
    c1 = (a, a, a, a)
    c2 = (a, a, a, a)
    c3 = (a, a, a, a)
    for _ in range(n):
        c0 = ptx.tf32_m16n8k8_asm((u, u, u, u), (u, u), c0)
        c1 = ptx.tf32_m16n8k8_asm((u, u, u, u), (u, u), c1)
        c2 = ptx.tf32_m16n8k8_asm((u, u, u, u), (u, u), c2)
        c3 = ptx.tf32_m16n8k8_asm((u, u, u, u), (u, u), c3)
    out[cuda.grid(1)] = float64(c0[0] + c1[1] + c2[2] + c3[3])


@cuda.jit
def k_ffma(x, out, n):
    a = float32(x[cuda.threadIdx.x])
    b = float32(1.0000001)
    c0 = a
    c1 = a + 1
    c2 = a + 2
    c3 = a + 3
    c4 = a + 4
    c5 = a + 5
    c6 = a + 6
    c7 = a + 7
    for _ in range(n):
        for _r in range(8):
            c0 = c0 * b + a
            c1 = c1 * b + a
            c2 = c2 * b + a
            c3 = c3 * b + a
            c4 = c4 * b + a
            c5 = c5 * b + a
            c6 = c6 * b + a
            c7 = c7 * b + a
    out[cuda.grid(1)] = float64(c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7)


# name: (kernel, multiply-adds per warp per loop iteration)
CASES = {
    "dmma.m8n8k4.f64": (k_dmma884, 4 * 8 * 8 * 4),
    "dmma.m16n8k8.f64": (k_dmma1688, 4 * 16 * 8 * 8),
    "dmma.m16n8k16.f64": (k_dmma16816, 2 * 16 * 8 * 16),
    "mma.m16n8k8.tf32": (k_tf32, 4 * 16 * 8 * 8),
    "ffma.f32": (k_ffma, 32 * 8 * 8),
}


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.mma_peak``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=ITERS, help=f"loop iterations per timed launch (default {ITERS})")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if _backend.is_simulator():
        print("mma_peak needs a GPU: the simulator cannot execute inline PTX")
        return 1
    dev = cuda.get_current_device()
    sms = dev.MULTIPROCESSOR_COUNT
    blocks = sms * 8
    x = cuda.to_device(np.random.default_rng(0).standard_normal(THREADS) * 1e-3)
    out = cuda.device_array(blocks * THREADS)
    start, stop = cuda.event(), cuda.event()
    for name, (kern, fma_per_warp_iter) in CASES.items():
        kern[blocks, THREADS](x, out, 8)  # compile + warm up
        cuda.synchronize()
        times = []
        for _ in range(5):
            start.record()
            kern[blocks, THREADS](x, out, args.iters)
            stop.record()
            stop.synchronize()
            times.append(cuda.event_elapsed_time(start, stop))
        ms = sorted(times)[len(times) // 2]
        flops = 2.0 * fma_per_warp_iter * args.iters * blocks * THREADS // 32
        print(
            json.dumps(
                {
                    "instr": name,
                    "ms": round(ms, 3),
                    "tflops": round(flops / ms / 1e9, 1),
                    "device": dev.name.decode() if isinstance(dev.name, bytes) else dev.name,
                    "sms": sms,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
