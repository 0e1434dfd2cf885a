"""Forward benchmarks: standard attention (Algorithm 0) vs FlashAttention (Algorithms 1-2).

The sweep follows the FA2 paper's convention (16k tokens, hidden 2048: 32 heads at d = 64, 16 at
d = 128) over N = 256 ... 16384, non-causal, fp32. For each (implementation, N, d) it records, in
pytest-benchmark's ``extra_info``: time (the benchmark's median), TFLOP/s (``4 b h N^2 d``), % of the
cuBLAS SGEMM rate measured in the same run, the peak device memory beyond inputs and outputs, and for
the Numba kernels their registers, shared memory and theoretical occupancy. On a GPU torch's naive
attention and SDPA's memory-efficient backend (both fp32) run in the same session as anchors.

In the simulator one tiny shape runs once per implementation: functional only.

Run (GPU, from the repository root; produces the committed results ``docs/results/forward_<device>.json``
and ``.png``, and a ``.jsonl`` record that is not committed): ``bash bench/gpu/run_benchmarks.sh docs/results forward``.
"""

from __future__ import annotations

from numba_flash import registry
from numba_flash._launch import check_attention_args
from numba_flash.runtime import resources as _inspect

import pytest

from bench import common as bu

NUMBA_IMPLS = ("standard", "flash1")
TORCH_IMPLS = ("torch_naive", "sdpa_mem_efficient") if bu.ON_GPU else ()
SEQLENS = bu.SEQLENS if bu.ON_GPU else (bu.SIM_SHAPE["seqlen"],)
HEADDIMS = bu.HEADDIMS if bu.ON_GPU else (bu.SIM_SHAPE["headdim"],)


def _call(impl, q, k, v):
    """The function a round times (without the synchronize)."""
    if impl in NUMBA_IMPLS:
        if bu.ON_GPU:
            from numba_flash import flash_attn_func

            return lambda: flash_attn_func(q, k, v, algorithm=impl)
        from numba_flash import attention_numpy

        return lambda: attention_numpy(q, k, v, algorithm=impl)
    if impl == "torch_naive":
        return lambda: bu.torch_naive_attention(q, k, v)
    return lambda: bu.torch_sdpa_mem_efficient(q, k, v)


def kernel_info(impl, q, k, v) -> dict:
    """Registers / shared memory / local memory / occupancy of each kernel an implementation launches."""
    if impl not in NUMBA_IMPLS:
        return {}
    prob = check_attention_args(q, k, v)
    info = {}
    for name, disp, threads, blocks in registry.resolve(impl, "forward", "auto", prob).module.compiled_kernels(prob):
        info[name] = _inspect.kernel_report(disp, threads, grid_blocks=blocks)
    return {"kernels": info}


@pytest.mark.parametrize("headdim", HEADDIMS)
@pytest.mark.parametrize("seqlen", SEQLENS)
@pytest.mark.parametrize("impl", NUMBA_IMPLS + TORCH_IMPLS)
def test_bench_forward(benchmark, impl, seqlen, headdim, sgemm_tflops):
    shape = bu.fa2_shape(seqlen, headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    benchmark.group = f"forward d={d} N={n}"
    benchmark.extra_info.update(
        algorithm=impl,
        N=n,
        d=d,
        batch=b,
        nheads=h,
        causal=False,
        device=bu.device_name(),
        functional_only=not bu.ON_GPU,
    )
    bu.free_memory()
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d)
    fn = _call(impl, q, k, v)
    io_bytes = b * n * h * d * 4 + (b * h * n * 4 if impl in NUMBA_IMPLS else 0)  # O (and lse)
    bu.time_or_skip_oom(benchmark, fn, 3 if n >= 4096 else 5, io_bytes, f"{impl} at N={n}, d={d}")
    benchmark.extra_info.update(kernel_info(impl, q, k, v))
    stats = getattr(benchmark, "stats", None)
    if stats is not None and bu.ON_GPU:
        t = stats.stats.median
        rate = bu.tflops(bu.flops_forward(b, h, n, n, d), t)
        benchmark.extra_info.update(
            time_ms=t * 1e3,
            tflops=rate,
            pct_sgemm=100 * rate / sgemm_tflops if sgemm_tflops else None,
            sgemm_tflops=sgemm_tflops,
        )
    else:
        benchmark.extra_info.update(time_ms=None, tflops=None, pct_sgemm=None)
    bu.record_jsonl(dict(benchmark.extra_info))
