"""``python -m numba_flash demo``: standard attention vs FlashAttention on the current backend.

Runs FA1 Algorithm 0 (standard, S and P in device memory), Algorithms 1-2 (tiled) and FA2 Algorithm 1
on the same random inputs and prints, for each, the max error against the float64 oracle (and the float32-naive
error for scale), the median time, and the extra memory the call needed beyond its inputs and its
output O (the O(N) statistics m, l, L count as extra). With torch on a GPU the memory is torch's
measured peak; otherwise it is what the kernel module allocated (workspaces and statistics). The backend banner comes
first: in Numba's CUDA simulator the times are those of Python threads, so only the error and memory columns mean
anything there.

Defaults: ``b=1, h=2, N=64, d=16`` in the simulator (a few seconds); ``b=4, h=16, N=2048, d=64`` on
a GPU. Every size can be given on the command line (``--batch --nheads --seqlen --headdim``), and
``--variant`` picks which kernel of each algorithm runs (``auto``, ``readable``, ``fast``,
``tensorcore``; an algorithm without that variant runs its ``auto`` kernel). The table's ``kernel``
column names the module that ran.
"""

from __future__ import annotations

import time

from numba_flash_reference.alg0_standard import standard_attention

import numpy as np

from . import _launch, describe, registry
from ._launch import Allocator, check_attention_args
from .runtime import backend as _backend
from .runtime import cost as _cost

SIM_DEFAULTS = dict(batch=1, nheads=2, seqlen=64, headdim=16, repeats=1)
GPU_DEFAULTS = dict(batch=4, nheads=16, seqlen=2048, headdim=64, repeats=10)
ALGORITHMS = (
    ("standard", "Alg. 0, standard (S, P in HBM)"),
    ("flash1", "Alg. 1-2, FlashAttention (tiled)"),
    ("flash2", "FA2 Alg. 1, FlashAttention-2"),
)


def _sizes(args) -> dict:
    defaults = SIM_DEFAULTS if _backend.is_simulator() else GPU_DEFAULTS
    out = {}
    for key, default in defaults.items():
        value = getattr(args, key, None)
        out[key] = default if value is None else int(value)
        if out[key] < 1:
            raise SystemExit(f"--{key} must be >= 1, got {value}")
    out["causal"] = bool(getattr(args, "causal", False))
    return out


def _torch_cuda():
    if _backend.is_simulator():
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class _CountingAllocator(Allocator):
    """An Allocator that adds up the bytes a kernel module allocates (outputs and workspaces)."""

    def __init__(self, like):
        super().__init__(like)
        self.bytes = 0

    def full(self, shape, value, dtype=np.float32):
        self.bytes += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return super().full(shape, value, dtype)

    def empty(self, shape, dtype=np.float32):
        if not _launch._POISON:  # when poisoning, empty() allocates through full(), which counts
            self.bytes += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return super().empty(shape, dtype)


def _numpy_call(q, k, v, causal, kernel):
    """One call through the kernel module with a counting allocator: (out, bytes allocated)."""
    prob = check_attention_args(q, k, v, causal=causal)
    _cost.warn_if_slow(kernel, prob)  # e.g. --seqlen 1024 in the simulator: say so before minutes pass
    alloc = _CountingAllocator(q)
    fwd = kernel.module.forward(alloc.to_kernel(q), alloc.to_kernel(k), alloc.to_kernel(v), prob, alloc)
    return alloc.result(fwd.out), alloc.bytes


def forward_kernel(algorithm: str, variant: str, prob) -> registry.Kernel:
    """The forward kernel the demo runs on ``prob``: ``variant`` where the algorithm has it, else its ``auto``
    kernel."""
    if variant != "auto" and (algorithm, "forward", variant) not in registry.KERNELS:
        variant = "auto"
    return registry.resolve(algorithm, "forward", variant, prob)


def _measure(fn, repeats, torch):
    """(last output, median seconds, extra bytes) of fn().

    With torch on a GPU, ``fn`` returns the output and the extra memory is torch's peak allocation
    during the call (measured); otherwise ``fn`` returns (output, bytes the kernel module allocated).
    """
    if torch is not None:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()  # warm-up: compiles the kernels
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
    else:
        out, extra = fn()  # warm-up (compiles on a GPU)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = fn()
        if torch is not None:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        out = res if torch is not None else res[0]
    return out, float(np.median(times)), extra


def _fmt_bytes(n) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def run(args) -> int:
    """Entry point of ``python -m numba_flash demo`` (``args`` from :mod:`numba_flash.cli`)."""
    print(describe())
    sz = _sizes(args)
    b, h, n, d, reps, causal = sz["batch"], sz["nheads"], sz["seqlen"], sz["headdim"], sz["repeats"], sz["causal"]
    print(f"batch={b} nheads={h} seqlen={n} headdim={d} causal={causal} float32, {reps} timed repeat(s)")
    variant = registry.check_variant(getattr(args, "variant", None))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, n, h, d)).astype(np.float32) for _ in range(3))
    prob = check_attention_args(q, k, v, causal=causal)
    kernels = {alg: forward_kernel(alg, variant, prob) for alg, _ in ALGORITHMS}
    ref = standard_attention(q, k, v, causal=causal).O
    naive_err = float(np.max(np.abs(_naive32(q, k, v, causal) - ref)))
    torch = _torch_cuda()
    if torch is not None:
        from .api import flash_attn_func

        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
        io = b * n * h * d * 4  # the output O; the O(N) statistics (lse, m, l) count as extra

        def make(alg):
            return lambda: flash_attn_func(tq, tk, tv, causal=causal, algorithm=alg, variant=kernels[alg].variant)
    else:
        io = b * n * h * d * 4

        def make(alg):
            return lambda: _numpy_call(q, k, v, causal, kernels[alg])

    rows = []
    for alg, label in ALGORITHMS:
        out, t, extra = _measure(make(alg), reps, torch)
        out = out.cpu().numpy() if torch is not None else out
        err = float(np.max(np.abs(out.astype(np.float64) - ref)))
        rows.append((label, err, t, max(0, extra - io), kernels[alg]))
    header = (
        f"{'algorithm':34s} {'max |err| vs float64':>21s} {'time':>11s} {'extra memory':>13s}  {'variant':10s} kernel"
    )
    print(header)
    print("-" * len(header))
    for label, err, t, extra, kern in rows:
        print(f"{label:34s} {err:21.2e} {t * 1e3:8.2f} ms {_fmt_bytes(extra):>13s}  {kern.variant:10s} {kern.path}")
    print(f"{'(float32 naive NumPy, for scale)':34s} {naive_err:21.2e}")
    if _backend.is_simulator():
        print("Simulator: times are Python threads (functional only); extra memory = what the kernel module allocates.")
    else:
        t_std = rows[0][2]
        ratios = ", ".join(f"{label.split(',')[0]}: {t_std / t:.2f}x" for label, _, t, _, _ in rows[1:])
        print(f"time of standard / time of tiled ({ratios}); extra memory O(N^2) vs O(N)")
    return 0


def _naive32(q, k, v, causal):
    """Plain float32 NumPy attention (the error scale of a float32 computation)."""
    f = np.float32
    b, n, h, d = q.shape
    out = np.empty_like(q)
    tau = f(1.0 / np.sqrt(d))
    mask = np.tril(np.ones((n, n), bool)) if causal else None
    for bi in range(b):
        for hi in range(h):
            s = (q[bi, :, hi] @ k[bi, :, hi].T) * tau
            if mask is not None:
                s = np.where(mask, s, f(-np.inf))
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[bi, :, hi] = (p / p.sum(axis=1, keepdims=True)) @ v[bi, :, hi]
    return out
