"""FA2 forward variant sweep for one GPU call: build, check and time kernel variants and sizes, print a table.

For each variant of the FA2 forward (the readable kernel, tilings / features of the fast FFMA kernel
:mod:`numba_flash.fast.fa2_forward` and of the tensor-core kernel :mod:`numba_flash.tensorcore.fa2_forward_tf32`)
it

1. checks correctness on a few ragged shapes against torch float64 (the error rule: at most 2x the
   error of torch float32 with TF32 off), NaN-poisoned outputs;
2. reads registers, shared memory, local memory and theoretical occupancy of the compiled kernel;
3. times the forward with CUDA events (median of ``--repeats`` after warm-up) on the FA2 benchmark
   convention (16k tokens, hidden 2048), and reports TFLOP/s and % of the cuBLAS SGEMM rate measured
   in the same run, beside torch's naive fp32 attention and SDPA's memory-efficient backend;
4. optionally times forward + backward of flash2 (``--fwdbwd``) against the same torch baselines.

Run on a GPU machine from the repository root::

    source bench/gpu/setup_env.sh
    python3 -m bench.fa2_sweep --seqlens 4096 --headdims 64 128 --out $OUT/fa2_sweep.json

The JSON holds every row plus provenance; the table printed last is the summary. ``--dry-run``
lists each variant's tiling, threads and shared memory without running anything (works in the
simulator). The sweeps behind the defaults were ``docs/results/sweeps/fa2_sweep_h200_*.json`` and
``sweep_tc*_h200.json``, last in the tree at e0e5a9b; ``bench/README.md`` says which variant produced which documented
number.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

from numba_flash import fa2_forward
from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.fast import fa2_forward as fa2_forward_fast
from numba_flash.runtime import resources as _inspect
from numba_flash.tensorcore import fa2_forward_tf32

import numpy as np

from bench import common as bu

# Variant names describe today's code: the defaults changed between the sweeps (last in the tree at e0e5a9b), and a
# name there meant "the default at the time" (e.g. ``fast`` was 64 x 64 in fa2_sweep_h200_run1/2.json,
# ``tc`` staged only O in sweep_tc2_h200.json). bench/README.md maps those rows to the names below.
#: name -> (config (NT, TM, TPR, Bc) or None for the default / "readable", features)
#: the default tiling with line 4's Q_i through registers (the former load) or by cp.async (Q_ASYNC, 2026-11-27)
Q_ASYNC = {f"tc-cp-q{int(a)}": (("tc", None), {"CP_ASYNC": True, "Q_ASYNC": a}) for a in (False, True)}
#: the default tiling with causal warps skipping the key blocks none of their rows sees (WARP_SKIP, 2026-11-27) or not
WARP_SKIP = {f"tc-ws{int(a)}": (("tc", None), {"WARP_SKIP": a}) for a in (False, True)}
#: the default tiling with K_j, V_j split into tf32 parts by every warp or once per block in SRAM (SPLIT_KV, 2026-11-27)
SPLIT_KV = {f"tc-skv{int(a)}": (("tc", None), {"SPLIT_KV": a}) for a in (False, True)}
#: the default tiling with line 10's rescale of O as its own FMUL or in the first 8-key step's add, one FFMA
#: (RESCALE_FMA, 2026-11-28; it acts only where STAGE_O_STEP is on: MW = 2 at d > 64)
RESCALE_FMA = {f"tc-fma{int(a)}": (("tc", None), {"RESCALE_FMA": a}) for a in (False, True)}
VARIANTS_D64 = {
    "readable": ("readable", {}),
    "fast": (None, {}),  # Br 128 x Bc 64, TM 8, 128 threads
    "fast-noprefetch": (None, {"PREFETCH": False}),
    "fast-novec": (None, {"VEC": False}),
    "fast-noshfl": (None, {"SHFL": False}),
    "fast-noreverse": (None, {"REVERSE": False}),
    "fast-64x64": ((128, 4, 8, 64), {}),  # the default of sweep run 2 ("fast" there)
    "fast-64x64-noprefetch": ((128, 4, 8, 64), {"PREFETCH": False}),  # "fast-noprefetch" of run 2
    "fast-Br128-nt256": ((256, 4, 8, 64), {}),
    "fast-TM2-nt256": ((256, 2, 8, 64), {}),
    "fast-TM8-Br128": ((128, 8, 8, 64), {}),
    # tensor cores (3xTF32, numba_flash.tensorcore.fa2_forward_tf32): ("tc", (NW, MW, Bc)) or ("tc", None) = its default
    "tc": (("tc", None), {}),  # S and O staged (the default; "tc-stageS" of sweep_tc2)
    "tc-noprefetch": (("tc", None), {"PREFETCH": False}),
    "tc-MW1": (("tc", (4, 1, 64)), {}),
    "tc-Bc32": (("tc", (4, 2, 32)), {}),
    "tc-NW8-MW1": (("tc", (8, 1, 64)), {}),
    # cp.async K_j, V_j into two SRAM stages (CP_ASYNC; offline sm_90: 4x2x64 252 registers without the register
    # path's 108-byte spill, 4x2x32 218, 8x1x64 161)
    "tc-cp": (("tc", None), {"CP_ASYNC": True}),
    "tc-cp-Bc32": (("tc", (4, 2, 32)), {"CP_ASYNC": True}),
    "tc-cp-NW8-MW1": (("tc", (8, 1, 64)), {"CP_ASYNC": True}),
    "tc-cp-ostep": (("tc", None), {"CP_ASYNC": True, "STAGE_O_STEP": True}),
    # short causal sequences: smaller query blocks (Br 64: more blocks, less tail) or 8 warps of MW = 1
    "tc-cp-4x1x32": (("tc", (4, 1, 32)), {"CP_ASYNC": True}),
    "tc-cp-8x1x32": (("tc", (8, 1, 32)), {"CP_ASYNC": True}),
    "tc-cp-wide": (("tc", None), {"CP_ASYNC": True, "WIDE": True}),  # 16-byte fragment loads (2026-11-27; 248
    # registers)
    # causal: every head's heaviest query blocks first (HEAVY_FIRST, 2026-11-27) or each head's in turn
    "tc-cp-hf": (("tc", None), {"CP_ASYNC": True, "HEAVY_FIRST": True}),
    "tc-cp-perhead": (("tc", None), {"CP_ASYNC": True, "HEAVY_FIRST": False}),
    **Q_ASYNC,
    **WARP_SKIP,
}
VARIANTS_D128 = {
    "readable": ("readable", {}),
    "fast": (None, {}),  # Br 64 x Bc 32, TM 4, 128 threads
    "fast-TM2-nt256": ((256, 2, 8, 32), {}),
    "tc": (("tc", None), {}),  # 8 warps, Br 128 x Bc 32 ("tc-NW8-Bc32" of sweep_tc2)
    "tc-Bc32": (("tc", (4, 1, 32)), {}),  # "tc-Bc32-stageS" of sweep_tc2
    # cp.async K_j, V_j into two SRAM stages (CP_ASYNC; offline sm_90: 8x1x32 222 registers against 250; 4x1x32
    # fits two blocks per SM)
    "tc-cp": (("tc", None), {"CP_ASYNC": True}),
    "tc-cp-64x32": (("tc", (4, 1, 32)), {"CP_ASYNC": True}),
    # MW = 2 on the cp.async path: each K/V B fragment read from SRAM serves two m16 tiles (half the K/V reads per
    # MMA of the default 8 x 1 x 32), one block per SM (151 KB of SRAM)
    "tc-cp-MW2": (("tc", (4, 2, 32)), {"CP_ASYNC": True}),
    # STAGE_O_STEP (line 10 staged per 8-key step: no staged rT, the registers MW = 2 needs; offline sm_90 in the
    # performance log's section "3xTF32 forward: O staged per key step")
    "tc-cp-ostep": (("tc", None), {"CP_ASYNC": True, "STAGE_O_STEP": True}),
    "tc-cp-MW2-ostep": (("tc", (4, 2, 32)), {"CP_ASYNC": True, "STAGE_O_STEP": True}),
    "tc-cp-NW8-MW2-Bc16-ostep": (("tc", (8, 2, 16)), {"CP_ASYNC": True, "STAGE_O_STEP": True}),  # Br 256, 186 KB
    "tc-cp-NW8-MW1-Bc32": (("tc", (8, 1, 32)), {"CP_ASYNC": True}),  # the cp.async default before 8 x 2 x 16
    # Br = 64, Bc = 16 with STAGE_O_STEP: 71.5 KB of SRAM and, offline sm_90, 166 registers (168 causal; 222 without
    # STAGE_O_STEP): three blocks of 4 warps per SM, 12 warps where every d = 128 default has 8 (2026-11-26)
    "tc-cp-4x1x16-ostep": (("tc", (4, 1, 16)), {"CP_ASYNC": True, "STAGE_O_STEP": True}),
    # WIDE: 16-byte fragment loads with the dot products' terms reordered, Q_i / K_j swizzled (2026-11-27; offline
    # sm_90: 8 x 2 x 16 254 registers, 8 x 1 x 32 174, 4 x 1 x 32 178-181, no spill; LDS per key block a third)
    "tc-cp-wide": (("tc", None), {"CP_ASYNC": True, "WIDE": True}),
    "tc-cp-8x2x16-wide": (("tc", (8, 2, 16)), {"CP_ASYNC": True, "STAGE_O_STEP": True, "WIDE": True}),
    "tc-cp-8x1x32-wide": (("tc", (8, 1, 32)), {"CP_ASYNC": True, "WIDE": True}),
    "tc-cp-4x1x32-wide": (("tc", (4, 1, 32)), {"CP_ASYNC": True, "WIDE": True}),
    # causal: every head's heaviest query blocks first (HEAVY_FIRST, 2026-11-27) or each head's in turn, at the causal
    # default (4 x 1 x 32) and at 8 x 2 x 16 (Br = 256: the longest blocks, the most to gain from the order)
    "tc-cp-4x1x32-wide-hf": (("tc", (4, 1, 32)), {"CP_ASYNC": True, "WIDE": True, "HEAVY_FIRST": True}),
    "tc-cp-4x1x32-wide-perhead": (("tc", (4, 1, 32)), {"CP_ASYNC": True, "WIDE": True, "HEAVY_FIRST": False}),
    "tc-cp-8x2x16-wide-hf": (
        ("tc", (8, 2, 16)),
        {"CP_ASYNC": True, "STAGE_O_STEP": True, "WIDE": True, "HEAVY_FIRST": True},
    ),
    "tc-cp-8x2x16-wide-perhead": (
        ("tc", (8, 2, 16)),
        {"CP_ASYNC": True, "STAGE_O_STEP": True, "WIDE": True, "HEAVY_FIRST": False},
    ),
    # 4 warps of MW = 2 with Bc = 16 (Br = 128): 8 x 2 x 16's warps (255 registers, no spill, offline sm_90) in blocks
    # half as tall, 107 KB of SRAM: two blocks per SM, whose prologues and epilogues overlap (2026-11-27)
    "tc-cp-4x2x16": (("tc", (4, 2, 16)), {"CP_ASYNC": True}),
    # SPLIT_KV needs 221.5 KB of SRAM at Br = 256 (one block per SM, as without it): the causal tiling from 4k, here
    # timed below 4k against the causal default there (2026-11-27)
    "tc-cp-8x2x16-skv1": (("tc", (8, 2, 16)), {"CP_ASYNC": True, "SPLIT_KV": True}),
    **Q_ASYNC,
    **WARP_SKIP,
    **SPLIT_KV,
    **RESCALE_FMA,
}


def _is_tc(cfg):
    return isinstance(cfg, tuple) and cfg and cfg[0] == "tc"


def _tc_config(cfg, d):
    return None if cfg[1] is None else (*cfg[1], fa2_forward_tf32.config_for(d)[3])


def _config(cfg, d):
    if cfg is None or cfg == "readable":
        return cfg
    NT, TM, TPR, Bc = cfg
    return (NT, TM, TPR, Bc, fa2_forward_fast._padded_d(d, TPR))


def plan_variant(cfg, feats, prob):
    """(compiled kernel, tile "BrxBc", threads per block, dynamic SRAM bytes) of a variant, not launched."""
    d = prob.headdim
    if cfg == "readable":
        launch = fa2_forward.compiled_kernels(prob)[0]
        Br, Bc = fa2_forward.choose_block_sizes(prob)
        return launch.dispatcher, f"{Br}x{Bc}", launch.threads, 0
    if _is_tc(cfg):
        config = _tc_config(cfg, d)
        kernel, grid, NT, nbytes = fa2_forward_tf32.plan(prob, config=config, features=feats)
        t = config or fa2_forward_tf32.tiling(prob, None, feats)  # (NW, MW, Bc, DP)
        return kernel, f"{16 * t[1] * t[0]}x{t[-2]}", NT, nbytes
    kernel, grid, NT, nbytes = fa2_forward_fast.plan(prob, config=_config(cfg, d), features=feats)
    c = _config(cfg, d) or fa2_forward_fast.config_for(d)
    return kernel, f"{(c[0] // c[2]) * c[1]}x{c[3]}", NT, nbytes


def run_variant(name, cfg, feats, q, k, v, causal=False, dropout_p=0.0, seed=0):
    """One forward of a variant on torch CUDA tensors; returns (out, lse) torch tensors."""
    prob = check_attention_args(q, k, v, dropout_p, None, causal, seed)
    alloc = Allocator(q)
    kq, kk, kv = (alloc.to_kernel(x) for x in (q, k, v))
    if cfg == "readable":
        fwd = fa2_forward.forward(kq, kk, kv, prob, alloc)
    elif _is_tc(cfg):
        fwd = fa2_forward_tf32.forward(kq, kk, kv, prob, alloc, config=_tc_config(cfg, prob.headdim), features=feats)
    else:
        fwd = fa2_forward_fast.forward(kq, kk, kv, prob, alloc, config=_config(cfg, prob.headdim), features=feats)
    return alloc.result(fwd.out), alloc.result(fwd.lse)


def kernel_resources(name, cfg, feats, q, k, v, causal):
    """regs / smem (static + dynamic) / local / occupancy of the variant's compiled kernel (after it ran once)."""
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    kernel, tile, threads, nbytes = plan_variant(cfg, feats, prob)
    res = _inspect.kernel_resources(kernel)
    smem = (res["shared_mem_per_block"] or 0) + nbytes
    occ = _inspect.theoretical_occupancy(res["regs_per_thread"], smem, threads)
    return dict(
        tile=tile, threads=threads, regs=res["regs_per_thread"], smem=smem, local=res["local_mem_per_thread"], **occ
    )


def dry_run(headdims, seqlens, causals, names):
    """Each variant's tiling, threads and dynamic SRAM on this backend, without launching anything."""
    for d in headdims:
        for name, (cfg, feats) in _select(d, names).items():
            for n in seqlens:
                for causal in causals:
                    prob = bu.fa2_problem(n, d, causal)
                    try:
                        _, tile, threads, nbytes = plan_variant(cfg, feats, prob)
                    except ValueError as exc:  # Dev: e.g. SPLIT_KV's 221.5 KB plus the simulator's exchange scratch
                        print(f"d={d} N={n} causal={int(causal)} {name:28} does not fit this backend: {exc}")
                        continue
                    print(
                        f"d={d} N={n} causal={int(causal)} {name:28} tile {tile:>7} threads {threads:>4} dynamic SRAM "
                        f"{nbytes / 1024:6.1f} KB"
                    )
    return 0


def _select(d, names):
    variants = dict(VARIANTS_D64 if d <= 64 else VARIANTS_D128)
    if names:
        unknown = sorted(set(names) - set(variants))
        if unknown:
            raise SystemExit(f"unknown variant(s) at d={d}: {unknown}; known: {sorted(variants)}")
        variants = {k: v for k, v in variants.items() if k in names}
    return variants


def torch_reference(q, k, v, causal, dropout_p, seed, dtype):
    from numba_flash_reference.common import causal_mask, dropout_scale_matrix

    import torch

    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    G = h // h_k
    q, k, v = (x.to(dtype) for x in (q, k, v))
    kk, vv = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    S = torch.einsum("bihd,bjhd->bhij", q, kk) / math.sqrt(d)
    if causal:
        S = S.masked_fill(~torch.tensor(causal_mask(s_q, s_k), device=q.device), float("-inf"))
    P = torch.softmax(S, -1).nan_to_num(0.0)
    if dropout_p > 0:
        Z = np.stack(
            [
                np.stack(
                    [dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p) for hi in range(h)]
                )
                for bi in range(b)
            ]
        )
        P = P * torch.tensor(Z, device=q.device, dtype=dtype)
    return torch.einsum("bhij,bjhd->bihd", P, vv)


CHECK_SHAPES = [  # (b, s_q, s_k, h, h_k, d, causal, p)
    (2, 1000, 1000, 4, 2, 64, True, 0.0),
    (1, 777, 1029, 4, 4, 64, False, 0.1),
    (1, 1029, 513, 3, 1, 128, True, 0.0),
]


def check(variants, d, log):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for shape in CHECK_SHAPES:
        b, s_q, s_k, h, h_k, dd, causal, p = shape
        if dd != d:
            continue
        gen = torch.Generator(device="cuda").manual_seed(s_q + s_k)
        q = torch.randn(b, s_q, h, d, device="cuda", generator=gen)
        k = torch.randn(b, s_k, h_k, d, device="cuda", generator=gen)
        v = torch.randn(b, s_k, h_k, d, device="cuda", generator=gen)
        ref = torch_reference(q, k, v, causal, p, 7, torch.float64)
        naive_err = float((torch_reference(q, k, v, causal, p, 7, torch.float32).double() - ref).abs().max())
        for name, (cfg, feats) in variants.items():
            if name not in ("readable", "fast") and not name.startswith("tc") and (causal is not True or p > 0):
                continue  # Dev: other variants are checked on the causal shape only (fewer compilations)
            try:
                with poison_outputs():
                    o, lse = run_variant(name, cfg, feats, q, k, v, causal, p, 7)
                err = float((o.double() - ref).abs().max())
                ok = math.isfinite(err) and err <= 2 * naive_err + 4 * 1.19e-7 * float(ref.abs().max())
            except Exception as exc:  # keep sweeping; report
                err, ok = float("nan"), False
                log.append(f"{name} {shape}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
            out.setdefault(name, []).append(dict(shape=shape, err=err, naive32_err=naive_err, ok=bool(ok)))
    return out


def time_forward(variants, seqlens, d, causals, repeats, sgemm, rows, log, baselines=True, interleave=False, calls=1):
    for n in seqlens:
        shape = bu.fa2_shape(n, d)
        b, h = shape["batch"], shape["nheads"]
        q, k, v = bu.make_inputs(b, h, n, d, seed=n + d)
        for causal in causals:
            _time_forward_one(variants, q, k, v, causal, repeats, sgemm, rows, log, baselines, interleave, calls)
        del q, k, v
        bu.free_memory()


def _time_forward_one(variants, q, k, v, causal, repeats, sgemm, rows, log, baselines, interleave=False, calls=1):
    """Time every variant (and the torch baselines) on one input and one mask; append the rows. ``interleave``: in
    rounds (:func:`bench.common.cuda_time_ms_interleaved`) instead of one after another. ``calls``: each timing spans
    that many back-to-back calls (the kernels' time, the host's work hidden behind the queue; 1: one call, host work
    included)."""
    import torch

    b, n, h, d = q.shape
    flops = bu.flops_forward(b, h, n, n, d, causal)
    impls = {
        name: (lambda cfg=cfg, feats=feats, name=name: run_variant(name, cfg, feats, q, k, v, causal))
        for name, (cfg, feats) in variants.items()
    }
    if baselines:
        impls["torch_naive"] = lambda: bu.torch_naive_attention(q, k, v, causal=causal)
        impls["sdpa_mem_efficient"] = lambda: bu.torch_sdpa_mem_efficient(q, k, v, causal=causal)
    torch.backends.cuda.matmul.allow_tf32 = False
    timed, failed = {}, {}
    if interleave:  # Dev: a first call each (one of the two warm-up calls): one that raises is reported, not timed
        for name, fn in impls.items():
            try:
                fn()
            except Exception as exc:
                failed[name] = exc
        timed = bu.cuda_time_ms_interleaved(
            {m: f for m, f in impls.items() if m not in failed}, warmup=1, repeats=repeats, calls=calls
        )
    for name, fn in impls.items():
        row = dict(
            pass_="forward",
            impl=name,
            N=n,
            d=d,
            batch=b,
            nheads=h,
            causal=causal,
            interleaved=bool(interleave),
            calls=calls,
        )
        try:
            if name in failed:
                raise failed[name]
            reps = repeats if name != "readable" else max(3, repeats // 3)
            med, lo, hi = timed[name] if interleave else bu.cuda_time_ms(fn, warmup=2, repeats=reps, calls=calls)
            rate = bu.tflops(flops, med * 1e-3)
            row.update(ms=med, ms_min=lo, ms_max=hi, tflops=rate, pct_sgemm=100 * rate / sgemm)
            if name in variants:
                cfg, feats = variants[name]
                row.update(kernel_resources(name, cfg, feats, q, k, v, causal))
        except Exception as exc:
            row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
            log.append(f"{name} N={n} d={d} causal={causal}: {traceback.format_exc()[-1500:]}")
        rows.append(row)
        bu.free_memory()


def time_fwd_bwd(seqlens, d, causals, repeats, sgemm, rows, log):
    for n in seqlens:
        shape = bu.fa2_shape(n, d)
        b, h = shape["batch"], shape["nheads"]
        q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, requires_grad=True)
        for causal in causals:
            _time_fwd_bwd_one(q, k, v, causal, repeats, sgemm, rows, log)
        del q, k, v
        bu.free_memory()


def _time_fwd_bwd_one(q, k, v, causal, repeats, sgemm, rows, log):
    """flash2 (variant "auto"), deterministic flash2 and the torch baselines, forward + backward."""
    from numba_flash import flash_attn_func

    import torch

    b, n, h, d = q.shape
    dout = torch.randn_like(q)
    flops = bu.flops_forward(b, h, n, n, d, causal) * 3.5
    impls = {
        "flash2": lambda: flash_attn_func(q, k, v, causal=causal, algorithm="flash2"),
        "flash2-deterministic": lambda: flash_attn_func(q, k, v, causal=causal, algorithm="flash2", deterministic=True),
        "torch_naive": lambda: bu.torch_naive_attention(q, k, v, causal=causal),
        "sdpa_mem_efficient": lambda: bu.torch_sdpa_mem_efficient(q, k, v, causal=causal),
    }
    for name, f in impls.items():
        row = dict(pass_="fwd+bwd", impl=name, N=n, d=d, batch=b, nheads=h, causal=causal)

        def step(f=f):
            for x in (q, k, v):
                x.grad = None
            f().backward(dout)

        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            med, lo, hi = bu.cuda_time_ms(step, warmup=1, repeats=max(3, repeats // 3))
            rate = bu.tflops(flops, med * 1e-3)
            row.update(ms=med, ms_min=lo, ms_max=hi, tflops=rate, pct_sgemm=100 * rate / sgemm)
        except Exception as exc:
            row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
            log.append(f"fwd+bwd {name} N={n}: {traceback.format_exc()[-1500:]}")
        rows.append(row)
        bu.free_memory()


def table(rows):
    lines = [
        f"{'pass':8} {'impl':20} {'N':>6} {'d':>4} {'c':>1} {'ms':>9} {'TF/s':>6} {'%sg':>5} {'tile':>7} {'thr':>4} "
        f"{'regs':>4} {'smemKB':>6} {'lmem':>4} {'blk/SM':>6} {'occ':>5}"
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"{r['pass_']:8} {r['impl']:20} {r['N']:>6} {r['d']:>4} {int(r['causal'])} ERROR {r['error'][:80]}"
            )
            continue
        lines.append(
            f"{r['pass_']:8} {r['impl']:20} {r['N']:>6} {r['d']:>4} {int(r['causal'])} {r['ms']:9.3f} "
            f"{r['tflops']:6.2f} {r['pct_sgemm']:5.1f} "
            f"{r.get('tile', ''):>7} {r.get('threads', ''):>4} "
            f"{r.get('regs', '') if r.get('regs') is not None else '':>4} "
            f"{(r['smem'] / 1024) if r.get('smem') else 0:6.1f} "
            f"{r.get('local', '') if r.get('local') is not None else '':>4} "
            f"{r.get('blocks_per_sm', ''):>6} {r.get('occupancy', 0) or 0:5.2f}"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.fa2_sweep``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096])
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", choices=["both", "no", "yes"], default="both")
    ap.add_argument(
        "--variants", nargs="*", default=None, help="names to keep (default: all; see VARIANTS_D64 / VARIANTS_D128)"
    )
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="time the variants (and baselines) in rounds, one call each, not one after another",
    )
    ap.add_argument(
        "--calls",
        type=int,
        default=1,
        help="back-to-back calls per timing (more than 1: the kernels' time, "
        "the host's work hidden behind the launch queue; 1: one call, the host's work before its launch included)",
    )
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument(
        "--no-baselines", action="store_true", help="do not time torch's naive attention and SDPA beside the variants"
    )
    ap.add_argument("--fwdbwd", type=int, nargs="*", default=[], help="seqlens for flash2 fwd+bwd at d=64")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fa2_sweep.json"))
    ap.add_argument("--dry-run", action="store_true", help="list each variant's tiling, threads and SRAM; run nothing")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]
    if args.dry_run:
        return dry_run(args.headdims, args.seqlens, causals, args.variants)
    if args.calls < 1:
        raise SystemExit(f"fa2_sweep: --calls must be at least 1, got {args.calls}")
    if not bu.ON_GPU:
        print("fa2_sweep needs a GPU (or --dry-run)")
        return 1
    t0 = time.time()
    sgemm = bu.sgemm_tflops()
    print(f"device: {bu.device_name()}  SGEMM fp32 (4096^3, TF32 off): {sgemm:.1f} TFLOP/s", flush=True)
    rows, log, checks = [], [], {}
    for d in args.headdims:
        variants = _select(d, args.variants)
        if not args.no_check:
            checks[d] = check(variants, d, log)
            for name, res in checks[d].items():
                print(
                    f"check d={d} {name:20} "
                    + " ".join(("ok" if r["ok"] else "FAIL") + f"({r['err']:.1e}/{r['naive32_err']:.1e})" for r in res),
                    flush=True,
                )
        time_forward(
            variants,
            args.seqlens,
            d,
            causals,
            args.repeats,
            sgemm,
            rows,
            log,
            baselines=not args.no_baselines,
            interleave=args.interleave,
            calls=args.calls,
        )
        print(f"[{time.time() - t0:.0f}s] d={d} timed", flush=True)
    if args.fwdbwd:
        time_fwd_bwd(args.fwdbwd, 64, (False,), args.repeats, sgemm, rows, log)
    result = dict(
        provenance=bu.provenance(),
        sgemm_tflops=sgemm,
        checks={str(k): v for k, v in checks.items()},
        rows=rows,
        errors=log,
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    for e in log:
        print("ERROR:", e[-600:])
    print(table(rows))
    print(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
