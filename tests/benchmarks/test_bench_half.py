"""Half-precision benchmarks: the fp16/bf16 FA2 forward (and forward + backward) beside torch's attention kernels.

Implementations (``extra_info["algorithm"]``), all in the inputs' half dtype and in the same session:

* ``flash2``: ``flash_attn_func(..., algorithm="flash2")`` with its default kernels: on a GPU the half
  forward of :mod:`numba_flash.tensorcore.fa2_forward_half` and the half backward of
  :mod:`numba_flash.tensorcore.fa2_backward_half` (both ``mma.sync.m16n8k16``, no upcast);
* ``sdpa_flash`` (FA2's own CUDA kernels), ``sdpa_cudnn`` (cuDNN's fused attention), ``sdpa_mem_efficient``
  (xformers' CUTLASS kernel): ``scaled_dot_product_attention`` with one backend forced;
* ``torch_naive``: ``softmax(q k^T * scale) v`` in the half dtype (the N x N matrices in HBM): the
  standard attention of the tiled-vs-standard comparison, forward and forward + backward.

The FA2 paper's convention (section 4.1): 16k tokens (``batch = 16384 // N``), hidden 2048, N = 512 ...
16384, d = 64 and 128, causal and not, bfloat16 and float16 (``extra_info["shape"] = "fa2_grid"``); and FA1's
Figure 2 (left) shape as the paper ran it, fp16 forward + backward at batch 64, 16 heads, N = 1024, d = 64
(``"fa1_figure2"``). Forward FLOPs ``4 b h N^2 d`` (halved when
causal); forward + backward 3.5x that. ``extra_info`` per row: algorithm, dtype, N, d, batch, nheads,
causal, pass, time_ms (median), tflops, extra_mem_bytes, device.

Run (GPU, from the repository root; produces docs/results/half_<device>.json and .png, committed, and a .jsonl
record, not committed)::

    bash bench/gpu/run_benchmarks.sh docs/results half

In the simulator one tiny float16 shape runs once: functional only.
"""

from __future__ import annotations

import pytest

from bench import common as bu

SDPA_IMPLS = {"sdpa_flash": "flash", "sdpa_cudnn": "cudnn", "sdpa_mem_efficient": "efficient"}
IMPLS = ("flash2", *SDPA_IMPLS, "torch_naive") if bu.ON_GPU else ("flash2",)
DTYPES = ("bfloat16", "float16") if bu.ON_GPU else ("float16",)
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384) if bu.ON_GPU else (bu.SIM_SHAPE["seqlen"],)
HEADDIMS = bu.HEADDIMS if bu.ON_GPU else (bu.SIM_SHAPE["headdim"],)
FWDBWD_SEQLENS = (1024, 2048, 4096, 8192, 16384) if bu.ON_GPU else (bu.SIM_SHAPE["seqlen"],)


def _forward_call(impl, q, k, v, causal):
    if impl == "flash2":
        if bu.ON_GPU:
            from numba_flash import flash_attn_func

            return lambda: flash_attn_func(q, k, v, causal=causal, algorithm="flash2")
        from numba_flash import attention_numpy

        return lambda: attention_numpy(q, k, v, causal=causal, algorithm="flash2", variant="tensorcore")
    if impl == "torch_naive":
        return lambda: bu.torch_naive_attention(q, k, v, causal=causal)
    return lambda: bu.torch_sdpa(q, k, v, causal, SDPA_IMPLS[impl])


def _record(benchmark, flops):
    stats = getattr(benchmark, "stats", None)
    if stats is not None and bu.ON_GPU:
        t = stats.stats.median
        benchmark.extra_info.update(time_ms=t * 1e3, tflops=bu.tflops(flops, t))
    else:
        benchmark.extra_info.update(time_ms=None, tflops=None)
    bu.record_jsonl(dict(benchmark.extra_info))


# Dev: impl on top varies fastest: a cell's implementations run back to back, under the same machine state
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("headdim", HEADDIMS)
@pytest.mark.parametrize("seqlen", SEQLENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bench_half_forward(benchmark, impl, dtype, seqlen, headdim, causal):
    shape = bu.fa2_shape(seqlen, headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    benchmark.group = f"half forward {dtype} d={d} N={n} causal={causal}"
    benchmark.extra_info.update(
        algorithm=impl,
        dtype=dtype,
        pass_="forward",
        N=n,
        d=d,
        batch=b,
        nheads=h,
        causal=causal,
        shape="fa2_grid",
        device=bu.device_name(),
        functional_only=not bu.ON_GPU,
    )
    bu.free_memory()
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, dtype=dtype)
    bu.time_or_skip_oom(
        benchmark, _forward_call(impl, q, k, v, causal), bu.grid_rounds(n, False), b * n * h * d * 2, impl
    )
    _record(benchmark, bu.flops_forward(b, h, n, n, d, causal))


# Dev: impl on top varies fastest: a cell's implementations run back to back, under the same machine state
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("headdim", HEADDIMS)
@pytest.mark.parametrize("seqlen", FWDBWD_SEQLENS)
@pytest.mark.parametrize("dtype", DTYPES[:1])
def test_bench_half_forward_backward(benchmark, impl, dtype, seqlen, headdim, causal):
    """Forward + backward, bfloat16, causal and not (torch naive: the standard attention, tiled vs standard)."""
    shape = bu.fa2_shape(seqlen, headdim)
    _forward_backward(
        benchmark, impl, dtype, shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"], causal
    )


#: FA1 Figure 2 (left), "as the paper ran it": GPT-2 medium's attention, batch 64, 16 heads, N = 1024, d = 64,
#: forward + backward in fp16 (the paper: standard 41.7 ms, FlashAttention 7.3 ms on an A100).
PAPER_SHAPE = (
    {"batch": 64, "nheads": 16, "seqlen": 1024, "headdim": 64}
    if bu.ON_GPU
    else {"batch": 1, "nheads": 1, "seqlen": bu.SIM_SHAPE["seqlen"], "headdim": bu.SIM_SHAPE["headdim"]}
)


@pytest.mark.parametrize("impl", IMPLS)
def test_bench_half_tiled_vs_standard_at_the_fa1_figure2_shape(benchmark, impl):
    """Tiled (ours, SDPA's) against standard attention (torch naive) in fp16 at the paper's Figure 2 shape."""
    s = PAPER_SHAPE
    _forward_backward(
        benchmark, impl, "float16", s["batch"], s["nheads"], s["seqlen"], s["headdim"], False, shape="fa1_figure2"
    )


def _forward_backward(benchmark, impl, dtype, b, h, n, d, causal, shape="fa2_grid"):
    """Time forward + backward of ``impl`` (in the simulator: one functional call of our kernels)."""
    benchmark.group = f"half fwd+bwd {dtype} d={d} N={n} causal={causal}" + ("" if shape == "fa2_grid" else f" {shape}")
    benchmark.extra_info.update(
        algorithm=impl,
        dtype=dtype,
        pass_="fwd+bwd",
        N=n,
        d=d,
        batch=b,
        nheads=h,
        causal=causal,
        shape=shape,
        device=bu.device_name(),
        functional_only=not bu.ON_GPU,
    )
    if not bu.ON_GPU:
        from numba_flash import attention_backward_numpy, attention_numpy

        import numpy as np

        q, k, v = bu.make_inputs(b, h, n, d, dtype=dtype)

        def step():
            out, st = attention_numpy(
                q, k, v, causal=causal, algorithm="flash2", variant="tensorcore", return_stats=True
            )
            return attention_backward_numpy(np.ones_like(q), q, k, v, out, st)

        benchmark.pedantic(step, rounds=1, iterations=1)
        _record(benchmark, 0.0)
        return
    import torch

    bu.free_memory()
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, requires_grad=True, dtype=dtype)
    dout = torch.randn_like(q)
    fwd = _forward_call(impl, q, k, v, causal)

    def step():
        for x in (q, k, v):
            x.grad = None
        fwd().backward(dout)

    bu.time_or_skip_oom(benchmark, step, bu.grid_rounds(n, True), 0, impl)
    _record(benchmark, 3.5 * bu.flops_forward(b, h, n, n, d, causal))
