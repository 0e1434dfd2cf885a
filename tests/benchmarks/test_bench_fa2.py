"""FlashAttention-2 benchmarks: the FA2 forward kernels, and FA2 forward + backward, beside torch (fp32).

Implementations (``extra_info["algorithm"]``): ``flash2`` is ``flash_attn_func(..., algorithm="flash2")``
with its default kernels (on a GPU the tensor-core ones: the 3xTF32 forward,
:mod:`numba_flash.tensorcore.fa2_forward_tf32`, and for forward + backward the 3xTF32 backward,
:mod:`numba_flash.tensorcore.fa2_backward_tf32`); ``flash2_ffma`` ``variant="fast"``: the register-blocked FFMA
forward (:mod:`numba_flash.fast.fa2_forward`) and its FFMA backward. (The grids of b7c3ad5 and before have
``flash2_tc`` rows, ``variant="tensorcore"``, for the 3xTF32 pair, while ``"auto"`` trained with the FFMA pair.)

The FA2 paper's convention (section 4.1): 16k tokens (``batch = 16384 // N``), hidden 2048 (32 heads at
d = 64, 16 at d = 128), N = 512 ... 16384, causal and not. Forward FLOPs ``4 b h N^2 d`` (halved when
causal); forward + backward 3.5x that, on the same grid (issue #15's cells). ``extra_info`` holds, per row: algorithm,
N, d, batch, nheads, causal, pass, time_ms (median), tflops, pct_sgemm (of the cuBLAS SGEMM rate measured in the same
run), extra_mem_bytes (peak device memory beyond inputs and outputs), device, and for the Numba kernels
their registers, shared memory (static + dynamic) and theoretical occupancy.

On a GPU torch's naive attention (TF32 off) and SDPA's memory-efficient backend run in the same session
as anchors. In the simulator one tiny shape runs once: functional only.

Run (GPU, from the repository root; produces docs/results/fa2_<device>.json and .png, committed, and a .jsonl
record, not committed)::

    bash bench/gpu/run_benchmarks.sh docs/results fa2

which runs ``python3 -m pytest tests/benchmarks/test_bench_fa2.py -p no:xdist --benchmark-enable
--benchmark-json=docs/results/fa2_h200.json`` and ``python3 -m bench.plot_fa2`` on the JSON.
"""

from __future__ import annotations

from numba_flash import registry
from numba_flash._launch import check_attention_args
from numba_flash.runtime import resources as _inspect

import pytest

from bench import common as bu

TORCH_IMPLS = ("torch_naive", "sdpa_mem_efficient") if bu.ON_GPU else ()
#: the Numba FA2 implementations and the forward kernel variant each one runs
NUMBA_IMPLS = {"flash2": "auto", "flash2_ffma": "fast"} if bu.ON_GPU else {"flash2": "auto"}
#: the forward + backward implementations: "auto" (the 3xTF32 pair on a GPU) and the FFMA pair
FWDBWD_IMPLS = {"flash2": "auto", "flash2_ffma": "fast"} if bu.ON_GPU else {"flash2": "auto"}
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384) if bu.ON_GPU else (bu.SIM_SHAPE["seqlen"],)
HEADDIMS = bu.HEADDIMS if bu.ON_GPU else (bu.SIM_SHAPE["headdim"],)
FWDBWD_SEQLENS = (1024, 2048, 4096, 8192, 16384) if bu.ON_GPU else (bu.SIM_SHAPE["seqlen"],)


def _forward_call(impl, q, k, v, causal):
    variants = {**NUMBA_IMPLS, **FWDBWD_IMPLS}
    if impl in variants:
        if bu.ON_GPU:
            from numba_flash import flash_attn_func

            return lambda: flash_attn_func(q, k, v, causal=causal, algorithm="flash2", variant=variants[impl])
        from numba_flash import attention_numpy

        return lambda: attention_numpy(q, k, v, causal=causal, algorithm="flash2", variant=variants[impl])
    if impl == "torch_naive":
        return lambda: bu.torch_naive_attention(q, k, v, causal=causal)
    return lambda: bu.torch_sdpa_mem_efficient(q, k, v, causal=causal)


def fast_kernel_info(q, k, v, causal, impl="flash2") -> dict:
    """Registers, SRAM (static + dynamic) and occupancy of the FA2 forward kernel ``impl`` runs."""
    if not bu.ON_GPU:
        return {}
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    kernel = registry.resolve("flash2", "forward", NUMBA_IMPLS[impl], prob)
    module = kernel.module
    label, cfg_key = {
        "tensorcore": ("FA2 forward (tensor cores, 3xTF32)", "config_NW_MW_Bc_DP"),
        "fast": ("FA2 forward (fast, FFMA)", "config_NT_TM_TPR_Bc_DP"),
    }[kernel.variant]
    # Dev: the tiling the plan launches: the 3xTF32 forward's default depends on causal and N (grids before 2026-11-27's
    # eighth session recorded config_for(d), the non-causal tiling, in the causal cells below 4k)
    cfg = module.tiling(prob)
    compiled, grid, threads, nbytes = module.plan(prob)
    res = _inspect.kernel_resources(compiled)
    smem = (res["shared_mem_per_block"] or 0) + nbytes
    occ = _inspect.theoretical_occupancy(res["regs_per_thread"], smem, threads)
    assert kernel.variant != "tensorcore" or threads == 32 * cfg[0], (
        f"recorded tiling {cfg}, launched {threads} threads"
    )
    return {
        "kernels": {
            label: {
                cfg_key: list(cfg),
                "threads_per_block": threads,
                "grid_blocks": grid[0] * grid[1],
                "regs_per_thread": res["regs_per_thread"],
                "smem_per_block": smem,
                "local_mem_per_thread": res["local_mem_per_thread"],
                **occ,
            }
        }
    }


def _record(benchmark, flops, sgemm_tflops):
    """Time, TFLOP/s and % of SGEMM into ``extra_info``; the row also goes to $NUMBA_FLASH_BENCH_JSONL."""
    stats = getattr(benchmark, "stats", None)
    if stats is not None and bu.ON_GPU:
        t = stats.stats.median
        rate = bu.tflops(flops, t)
        benchmark.extra_info.update(
            time_ms=t * 1e3,
            tflops=rate,
            pct_sgemm=100 * rate / sgemm_tflops if sgemm_tflops else None,
            sgemm_tflops=sgemm_tflops,
        )
    else:
        benchmark.extra_info.update(time_ms=None, tflops=None, pct_sgemm=None)
    bu.record_jsonl(dict(benchmark.extra_info))


# Dev: impl on top varies fastest: a cell's implementations run back to back, under the same machine state
@pytest.mark.parametrize("impl", tuple(NUMBA_IMPLS) + TORCH_IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("headdim", HEADDIMS)
@pytest.mark.parametrize("seqlen", SEQLENS)
def test_bench_fa2_forward(benchmark, impl, seqlen, headdim, causal, sgemm_tflops):
    shape = bu.fa2_shape(seqlen, headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    benchmark.group = f"fa2 forward d={d} N={n} causal={causal}"
    benchmark.extra_info.update(
        algorithm=impl,
        pass_="forward",
        N=n,
        d=d,
        batch=b,
        nheads=h,
        causal=causal,
        device=bu.device_name(),
        functional_only=not bu.ON_GPU,
    )
    bu.free_memory()
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d)
    fn = _forward_call(impl, q, k, v, causal)
    io_bytes = b * n * h * d * 4 + (b * h * n * 4 if impl in NUMBA_IMPLS else 0)
    bu.time_or_skip_oom(benchmark, fn, bu.grid_rounds(n, False), io_bytes, f"{impl} at N={n}, d={d}")
    if impl in NUMBA_IMPLS:
        benchmark.extra_info.update(fast_kernel_info(q, k, v, causal, impl))
    _record(benchmark, bu.flops_forward(b, h, n, n, d, causal), sgemm_tflops)


# Dev: impl on top varies fastest: a cell's implementations run back to back, under the same machine state
@pytest.mark.parametrize("impl", tuple(FWDBWD_IMPLS) + TORCH_IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("headdim", HEADDIMS)
@pytest.mark.parametrize("seqlen", FWDBWD_SEQLENS)
def test_bench_fa2_forward_backward(benchmark, impl, seqlen, headdim, causal, sgemm_tflops):
    """Forward + backward on the forward's grid (issue #15's fwd+bwd cells)."""
    shape = bu.fa2_shape(seqlen, headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    benchmark.group = f"fa2 fwd+bwd d={d} N={n} causal={causal}"
    benchmark.extra_info.update(
        algorithm=impl,
        pass_="fwd+bwd",
        N=n,
        d=d,
        batch=b,
        nheads=h,
        causal=causal,
        device=bu.device_name(),
        functional_only=not bu.ON_GPU,
    )
    if not bu.ON_GPU:
        from numba_flash import attention_backward_numpy, attention_numpy

        import numpy as np

        q, k, v = bu.make_inputs(b, h, n, d)
        dout = np.ones_like(q)

        def step():
            out, st = attention_numpy(q, k, v, causal=causal, algorithm="flash2", return_stats=True)
            return attention_backward_numpy(dout, q, k, v, out, st)

        benchmark.pedantic(step, rounds=1, iterations=1)
        _record(benchmark, 0.0, None)
        return
    import torch

    bu.free_memory()
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, requires_grad=True)
    dout = torch.randn_like(q)
    fwd = _forward_call(impl, q, k, v, causal)

    def step():
        for x in (q, k, v):
            x.grad = None
        fwd().backward(dout)

    bu.time_or_skip_oom(benchmark, step, bu.grid_rounds(n, True), 0, f"{impl} fwd+bwd at N={n}")
    _record(benchmark, 3.5 * bu.flops_forward(b, h, n, n, d, causal), sgemm_tflops)
