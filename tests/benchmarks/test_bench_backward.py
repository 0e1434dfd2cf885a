"""Forward + backward benchmarks: standard (Algorithms 0 + 3) vs FlashAttention (Algorithms 1-2 + 4).

One training step of attention: ``out = attention(q, k, v)`` then ``dq, dk, dv`` for an upstream
gradient, through :func:`numba_flash.flash_attn_func`'s autograd Function (which saves only q, k, v,
out and O(N) statistics per head):

* ``standard``: Algorithm 0 forward (S, P in HBM), Algorithm 3 backward (P recomputed into HBM from
  the saved statistics, then dP and dS in HBM), every product the shared tiled matmul;
* ``flash1``: FA1 forward (Algorithms 1-2), FA1 recomputation backward (Algorithm 4).

The sweep follows the FA2 paper's convention (16k tokens, hidden 2048: 32 heads at d = 64, 16 at
d = 128), non-causal, fp32. ``extra_info`` holds, per (implementation, N, d): the median time of
forward + backward, TFLOP/s counted as the papers do (forward ``4 b h N^2 d``, backward 2.5x that,
so a step is 3.5x the forward), the forward-only median measured in the same test and the backward
time by difference, % of the cuBLAS SGEMM rate measured in the same run, and the peak device memory
beyond inputs, output, gradients and the O(N) statistics. On a GPU torch's naive attention and SDPA's
memory-efficient backend (fp32, TF32 off) run in the same session as anchors.

In the simulator one tiny shape runs once per implementation: functional only.

Run (GPU, from the repository root; the committed results)::

    bash bench/gpu/run_benchmarks.sh docs/results backward

which runs, once per head dimension, ``NUMBA_FLASH_BENCH_HEADDIMS=64 python3 -m pytest
tests/benchmarks/test_bench_backward.py -p no:xdist --benchmark-enable
--benchmark-json=docs/results/backward_d64_h200.json`` (then 128), and plots both JSON files into
``backward_h200.png`` with ``python3 -m bench.plot_results``.
"""

from __future__ import annotations

import os

from numba_flash import registry
from numba_flash._launch import check_attention_args
from numba_flash.runtime import resources as _inspect

import numpy as np
import pytest

from bench import common as bu

NUMBA_IMPLS = ("standard", "flash1")
TORCH_IMPLS = ("torch_naive", "sdpa_mem_efficient") if bu.ON_GPU else ()
#: Sequence lengths per head dimension. At 16k tokens the FA1 grid (one block per (batch, head)) has
#: b * h = 2**21 / (N d) blocks: at d = 128 fewer blocks than an H100/H200 has SMs from N = 8192 on,
#: and a single step takes seconds there, so the d = 128 sweep stops at N = 4096.
SEQLENS = {64: (512, 1024, 2048, 4096, 8192, 16384), 128: (512, 1024, 2048, 4096)}
#: NUMBA_FLASH_BENCH_HEADDIMS=64 (comma-separated) runs a subset, e.g. one JSON per head dimension.
_dims = os.environ.get("NUMBA_FLASH_BENCH_HEADDIMS")
HEADDIMS = tuple(int(x) for x in _dims.split(",")) if _dims else bu.HEADDIMS
CASES = (
    [(n, d) for d in HEADDIMS for n in SEQLENS[d]] if bu.ON_GPU else [(bu.SIM_SHAPE["seqlen"], bu.SIM_SHAPE["headdim"])]
)
#: What a line of the plot is (plot_results.py reads ``label``).
LABELS = {
    "standard": "Numba standard (Alg. 0 + Alg. 3)",
    "flash1": "Numba FlashAttention (Alg. 2 + Alg. 4)",
    "torch_naive": "torch naive, autograd (fp32)",
    "sdpa_mem_efficient": "torch SDPA mem-efficient (fp32)",
}
#: A training step is a forward (1x) plus a backward (2.5x the forward's FLOPs).
STEP_FLOP_FACTOR = 3.5


def _fwd_and_step(impl, q, k, v, g):
    """(forward only, forward + backward) callables for one implementation (without the synchronize)."""
    if impl in NUMBA_IMPLS:
        if bu.ON_GPU:
            from numba_flash import flash_attn_func

            import torch

            def fwd():
                return flash_attn_func(q, k, v, algorithm=impl)

            def step():
                out = flash_attn_func(q, k, v, algorithm=impl)
                return torch.autograd.grad(out, (q, k, v), g)

            return fwd, step
        from numba_flash import attention_backward_numpy, attention_numpy

        def step_np():
            out, stats = attention_numpy(q, k, v, algorithm=impl, return_stats=True)
            return attention_backward_numpy(g, q, k, v, out, stats)

        return (lambda: attention_numpy(q, k, v, algorithm=impl)), step_np
    import torch

    attn = bu.torch_naive_attention if impl == "torch_naive" else bu.torch_sdpa_mem_efficient

    def step_t():
        return torch.autograd.grad(attn(q, k, v), (q, k, v), g)

    return (lambda: attn(q, k, v)), step_t


def kernel_info(impl, q, k, v) -> dict:
    """Registers / shared memory / occupancy of the FA1 forward and backward kernels (flash1 only)."""
    if impl != "flash1":
        return {}
    prob = check_attention_args(q, k, v)
    info = {}
    for kernel in registry.resolve_pair(impl, "auto", prob):  # what flash_attn_func(algorithm=impl) runs
        for name, disp, threads, blocks in kernel.module.compiled_kernels(prob):
            info[name] = _inspect.kernel_report(disp, threads, grid_blocks=blocks)
    return {"kernels": info}


@pytest.mark.parametrize(("seqlen", "headdim"), CASES)
@pytest.mark.parametrize("impl", NUMBA_IMPLS + TORCH_IMPLS)
def test_bench_forward_backward(benchmark, impl, seqlen, headdim, sgemm_tflops):
    shape = bu.fa2_shape(seqlen, headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    benchmark.group = f"forward+backward d={d} N={n}"
    benchmark.extra_info.update(
        algorithm=impl,
        label=LABELS[impl],
        N=n,
        d=d,
        batch=b,
        nheads=h,
        causal=False,
        device=bu.device_name(),
        functional_only=not bu.ON_GPU,
        measured="forward+backward",
    )
    bu.free_memory()
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, requires_grad=bu.ON_GPU)
    if bu.ON_GPU:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        g = torch.randn_like(q)
    else:
        g = np.random.default_rng(n).standard_normal(q.shape).astype(np.float32)
    fwd, step = _fwd_and_step(impl, q, k, v, g)
    qkv_bytes = b * n * h * d * 4
    stats_bytes = 3 * b * h * n * 4 if impl in NUMBA_IMPLS else b * h * n * 4  # (lse, m, l) or SDPA's lse
    io_bytes = 4 * qkv_bytes + stats_bytes  # out, dq, dk, dv and the O(N) statistics
    try:
        extra = bu.peak_extra_memory(step, io_bytes=io_bytes)  # also the warm-up that compiles
        rounds = 3 if n >= 4096 else 5
        benchmark.pedantic(bu.synced(step), rounds=rounds, warmup_rounds=1, iterations=1)
        fwd_s = bu.time_median(fwd, warmup=1, repeats=rounds) if bu.ON_GPU else None
    except Exception as exc:
        if not bu.is_oom(exc):
            raise
        benchmark.extra_info.update(oom=True, error=str(exc)[:200], tflops=None, time_ms=None)
        bu.record_jsonl(dict(benchmark.extra_info))
        bu.free_memory()
        pytest.skip(f"{impl} at N={n}, d={d}: out of device memory")
    benchmark.extra_info["extra_mem_bytes"] = extra
    benchmark.extra_info.update(kernel_info(impl, q, k, v))
    stats = getattr(benchmark, "stats", None)
    if stats is not None and bu.ON_GPU:
        t = stats.stats.median
        flops = STEP_FLOP_FACTOR * bu.flops_forward(b, h, n, n, d)
        rate = bu.tflops(flops, t)
        bwd_s = t - fwd_s
        benchmark.extra_info.update(
            time_ms=t * 1e3,
            tflops=rate,
            fwd_ms=fwd_s * 1e3,
            bwd_ms=bwd_s * 1e3,
            bwd_tflops=bu.tflops(bu.flops_backward(b, h, n, n, d), bwd_s),
            pct_sgemm=100 * rate / sgemm_tflops if sgemm_tflops else None,
            sgemm_tflops=sgemm_tflops,
        )
    else:
        benchmark.extra_info.update(time_ms=None, tflops=None, pct_sgemm=None)
    bu.record_jsonl(dict(benchmark.extra_info))
