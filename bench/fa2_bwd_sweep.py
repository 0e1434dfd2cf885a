"""FA2 backward sweep for one GPU call: check, inspect and time tile/feature variants of the fast backward.

For each variant of :mod:`numba_flash.fast.fa2_backward` (and the readable backward as the baseline) it

1. checks the gradients on a ragged causal GQA shape against torch float64 (the error rule: at most
   3x the error of torch float32 with TF32 off), NaN-poisoned outputs;
2. reads registers, shared memory, local memory and theoretical occupancy of the main kernel;
3. times the backward alone (pre-pass + main kernel (+ dQ kernel when deterministic)) with CUDA events
   on the FA2 benchmark convention (16k tokens, hidden 2048), FLOPs = 2.5x the forward's, and reports
   TFLOP/s and % of the cuBLAS SGEMM rate measured in the same run;
4. times forward + backward of flash2 (``flash_attn_func(...).backward`` with the default kernels and
   with ``variant="fast"``; the fast FFMA forward + the readable backward through the kernel modules)
   beside torch's naive fp32 attention and SDPA's memory-efficient backend.

All variants are compiled first (one tiny launch each); with ``--wait-pid`` the timing then waits for
that process (e.g. a pytest run started beside it) to exit, so compilation overlaps the tests but the
timings do not.

Run on a GPU machine from the repository root::

    source bench/gpu/setup_env.sh
    python3 -m bench.fa2_bwd_sweep --out $OUT/fa2_bwd_sweep.json

``--dry-run`` lists each variant's tiling, threads and shared memory without running anything (works
in the simulator). No output of this sweep is committed yet: the numbers of its first run ("Run B1")
are in ``docs/notes/performance-log.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import traceback

from numba_flash import fa2_backward
from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.fast import fa2_backward as fa2_backward_fast
from numba_flash.fast import fa2_forward as fa2_forward_fast
from numba_flash.runtime import resources as _inspect

from bench import common as bu

# Names describe today's code: in run B1 the d <= 64 default was 64 x 64, so B1's "fast", "fast-det"
# are "fast-64x64", "fast-64x64-det" here, and B1's "fast-Bc128" is today's default "fast" (see bench/README.md);
# B1's "fast-r128" (a 128-register cap, the kernels' MAXREG) last lived in commit 6c5fdf8.
#: name -> (config (NT, Br, Bc) or None for the default, or "readable"; features; deterministic)
VARIANTS_D64 = {
    "readable": ("readable", {}, False),
    "fast": (None, {}, False),  # Br 64 x Bc 128, 256 threads
    "fast-det": (None, {}, True),
    "fast-64x64": ((256, 64, 64), {}, False),
    "fast-64x64-det": ((256, 64, 64), {}, True),
}
VARIANTS_D128 = {
    "fast": (None, {}, False),  # Br 64 x Bc 64, 256 threads
    "fast-det": (None, {}, True),
    "fast-Br32": ((256, 32, 64), {}, False),
}
#: Variants timed with the causal mask too (the others only without it).
CAUSAL_TOO = ("readable", "fast", "fast-det", "fast-64x64", "fast-64x64-det")


def _config(cfg, d):
    if cfg is None or cfg == "readable":
        return cfg
    NT, BR, BC = cfg
    return (NT, BR, BC, 16 * ((d + 15) // 16))


def run_backward(cfg, feats, det, q, k, v, dout, causal, dropout_p=0.0, seed=0):
    """Fast FFMA forward, then the backward callable of a variant, on torch CUDA tensors: ``(bwd, alloc)``."""
    prob = check_attention_args(q, k, v, dropout_p, None, causal, seed)
    alloc = Allocator(q)
    kq, kk, kv, kdo = (alloc.to_kernel(x) for x in (q, k, v, dout))
    fwd = fa2_forward_fast.forward(kq, kk, kv, prob, alloc)

    def bwd():
        if cfg == "readable":
            return fa2_backward.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, deterministic=det)
        return fa2_backward_fast.backward(
            kdo,
            kq,
            kk,
            kv,
            fwd.out,
            fwd,
            prob,
            alloc,
            deterministic=det,
            config=_config(cfg, prob.headdim),
            features=feats,
        )

    return bwd, alloc


def plan_variant(cfg, feats, det, prob):
    """(main kernel, dQ kernel or None, tile "BrxBc", threads per block, dynamic SRAM bytes), not launched."""
    if cfg == "readable":
        launches = fa2_backward.compiled_kernels(prob, deterministic=det)
        Br, Bc = fa2_backward.choose_block_sizes(prob)
        return launches[0].dispatcher, launches[1].dispatcher if det else None, f"{Br}x{Bc}", launches[0].threads, 0
    main, grid, dqk, grid_dq, NT, nbytes = fa2_backward_fast.plan(
        prob, config=_config(cfg, prob.headdim), features=feats, deterministic=det
    )
    c = _config(cfg, prob.headdim) or fa2_backward_fast.config_for(prob.headdim)
    return main, dqk, f"{c[1]}x{c[2]}", NT, nbytes


def dry_run(headdims, seqlen, names):
    """Each variant's tiling, threads and dynamic SRAM on this backend, without launching anything."""
    for d in headdims:
        for name, (cfg, feats, det) in _select(d, names).items():
            for causal in (False, True) if name in CAUSAL_TOO else (False,):
                _, dqk, tile, threads, nbytes = plan_variant(cfg, feats, det, bu.fa2_problem(seqlen, d, causal))
                print(
                    f"d={d} N={seqlen} causal={int(causal)} {name:22} tile {tile:>6} threads {threads:>4} "
                    f"dynamic SRAM {nbytes / 1024:6.1f} KB{' + dQ kernel' if dqk is not None else ''}"
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


def resources(cfg, feats, det, q, k, v, causal):
    """regs / smem (static + dynamic) / local / occupancy of the variant's main kernel (after it ran once)."""
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    main, dqk, tile, threads, nbytes = plan_variant(cfg, feats, det, prob)
    res = _inspect.kernel_resources(main)
    smem = (res["shared_mem_per_block"] or 0) + nbytes
    occ = _inspect.theoretical_occupancy(res["regs_per_thread"], smem, threads)
    out = dict(
        tile=tile, threads=threads, regs=res["regs_per_thread"], smem=smem, local=res["local_mem_per_thread"], **occ
    )
    if dqk is not None:
        r2 = _inspect.kernel_resources(dqk)
        out.update(dq_regs=r2["regs_per_thread"], dq_local=r2["local_mem_per_thread"])
    return out


def torch_grads(q, k, v, dout, causal, dtype):
    from numba_flash_reference.common import causal_mask

    import torch

    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    G = h // h_k
    xs = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    kk, vv = xs[1].repeat_interleave(G, dim=2), xs[2].repeat_interleave(G, dim=2)
    S = torch.einsum("bihd,bjhd->bhij", xs[0], kk) / math.sqrt(d)
    if causal:
        S = S.masked_fill(~torch.tensor(causal_mask(s_q, s_k), device=q.device), float("-inf"))
    P = torch.softmax(S, -1).nan_to_num(0.0)
    torch.einsum("bhij,bjhd->bihd", P, vv).backward(dout.to(dtype))
    return [x.grad for x in xs]


def check_backward(makers, d, log):
    """Max error of each gradient (and of torch float32's) against torch float64 on a ragged causal GQA shape.

    ``makers``: name -> ``make(q, k, v, dout, causal) -> (bwd, alloc)``, the backward callable of one variant and
    its allocator (``run_backward`` here, :func:`bench.tf32_bwd_sweep.run_backward` there). The rule: at most 3x
    torch float32's error (TF32 off), plus the float32 ulp floor.
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(d)
    b, s_q, s_k, h, h_k = 1, 777, 1029, 4, 2
    q = torch.randn(b, s_q, h, d, device="cuda", generator=gen)
    k = torch.randn(b, s_k, h_k, d, device="cuda", generator=gen)
    v = torch.randn(b, s_k, h_k, d, device="cuda", generator=gen)
    dout = torch.randn(b, s_q, h, d, device="cuda", generator=gen)
    ref = torch_grads(q, k, v, dout, True, torch.float64)
    naive = torch_grads(q, k, v, dout, True, torch.float32)
    out = {}
    for name, make in makers.items():
        try:
            bwd, alloc = make(q, k, v, dout, True)
            with poison_outputs():
                grads = [alloc.result(g) for g in bwd()]
            res = []
            for g, r, n in zip(grads, ref, naive):
                err = float((g.double() - r).abs().max())
                base = float((n.double() - r).abs().max())
                res.append(
                    dict(
                        err=err,
                        naive32_err=base,
                        ok=bool(math.isfinite(err) and err <= 3 * base + 4 * 1.19e-7 * max(1.0, float(r.abs().max()))),
                    )
                )
            out[name] = res
        except Exception as exc:
            out[name] = [dict(err=float("nan"), naive32_err=float("nan"), ok=False)]
            log.append(f"check {name} d={d}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
    return out


def check(variants, d, log):
    """:func:`check_backward` of this sweep's variants ``(cfg, feats, deterministic)``."""
    return check_backward(
        {name: functools.partial(run_backward, cfg, feats, det) for name, (cfg, feats, det) in variants.items()}, d, log
    )


def time_backward(variants, n, d, causals, repeats, sgemm, rows, log, interleave=False):
    """Time each variant's backward at ``n`` (the causal rows for :data:`CAUSAL_TOO`); append the rows. ``interleave``:
    all of one mask's variants in rounds of one call each (:func:`bench.common.cuda_time_ms_interleaved`), not one after
    another (where a variant's place in the list weighed on its time: ``docs/notes/performance-log.md``,
    ``SPLIT_KV``)."""
    import torch

    shape = bu.fa2_shape(n, d)
    b, h = shape["batch"], shape["nheads"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d)
    dout = torch.randn_like(q)
    for causal in causals:
        flops = bu.flops_backward(b, h, n, n, d, causal)
        ready = {}  # name -> (row, the backward call, its allocator, cfg, feats, det)
        for name, (cfg, feats, det) in variants.items():
            if causal and name not in CAUSAL_TOO:
                continue
            row = dict(pass_="bwd", impl=name, N=n, d=d, batch=b, nheads=h, causal=causal, interleaved=bool(interleave))
            try:
                bwd, alloc = run_backward(cfg, feats, det, q, k, v, dout, causal)
                if interleave:
                    bwd()  # Dev: the one warm-up call, here: a backward that raises is reported, not timed in the
                    # rounds
                ready[name] = (row, bwd, alloc, cfg, feats, det)
                if not interleave:
                    _time_one(
                        ready.pop(name),
                        bu.cuda_time_ms(bwd, warmup=1, repeats=2 if cfg == "readable" else repeats),
                        flops,
                        sgemm,
                        q,
                        k,
                        v,
                        causal,
                        rows,
                        log,
                    )
            except Exception as exc:
                failed(row, log, f"{name} N={n} d={d} causal={causal}", exc)
                ready.pop(name, None)
                emit(row, rows, _line)
        if ready:
            timed = bu.cuda_time_ms_interleaved({name: r[1] for name, r in ready.items()}, warmup=0, repeats=repeats)
            for name, r in ready.items():
                _time_one(r, timed[name], flops, sgemm, q, k, v, causal, rows, log)
    del q, k, v, dout
    bu.free_memory()


def _time_one(ready, timing, flops, sgemm, q, k, v, causal, rows, log):
    """One row of :func:`time_backward` from its ``(median, min, max)`` timing; printed and appended."""
    row, _, _, cfg, feats, det = ready
    med, lo, hi = timing
    rate = bu.tflops(flops, med * 1e-3)
    row.update(ms=med, ms_min=lo, ms_max=hi, tflops=rate, pct_sgemm=100 * rate / sgemm)
    try:
        row.update(resources(cfg, feats, det, q, k, v, causal))
    except Exception as exc:
        failed(row, log, f"{row['impl']} N={row['N']} d={row['d']} causal={causal}", exc)
    emit(row, rows, _line)


def failed(row, log, what, exc):
    """Record the exception ``exc`` of the cell ``what`` in its ``row`` and, with its traceback, in ``log``."""
    row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
    log.append(f"{what}: {traceback.format_exc()[-1500:]}")


def emit(row, rows, line):
    """Append ``row``, print it (``line``: the sweep's row format) and free the cell's device memory."""
    rows.append(row)
    print(line(row), flush=True)
    bu.free_memory()


def readable_backward_step(q, k, v, dout):
    """Forward + backward with the fast FFMA forward and the *readable* backward, through the kernel modules.

    ``flash_attn_func``'s ``variant=`` picks one variant for both passes (or the pass's "auto"), so this
    pairing is run without autograd: the same kernels and launches as the autograd step, minus its glue.
    """
    prob = check_attention_args(q, k, v)

    def step():
        alloc = Allocator(q)
        kq, kk, kv, kdo = (alloc.to_kernel(x) for x in (q, k, v, dout))
        fwd = fa2_forward_fast.forward(kq, kk, kv, prob, alloc)
        return fa2_backward.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc)

    return step


def time_fwd_bwd(seqlens, d, repeats, sgemm, rows, log):
    for n in seqlens:
        shape = bu.fa2_shape(n, d)
        b, h = shape["batch"], shape["nheads"]
        q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, requires_grad=True)
        _time_fwd_bwd_one(q, k, v, repeats, sgemm, rows, log)
        del q, k, v
        bu.free_memory()


def _time_fwd_bwd_one(q, k, v, repeats, sgemm, rows, log):
    from numba_flash import flash_attn_func

    import torch

    b, n, h, d = q.shape
    dout = torch.randn_like(q)
    flops = bu.flops_forward(b, h, n, n, d) * 3.5

    def autograd_step(f):
        def step():
            for x in (q, k, v):
                x.grad = None
            f().backward(dout)

        return step

    steps = {  # name -> (step, repeats)
        "flash2": (autograd_step(lambda: flash_attn_func(q, k, v, algorithm="flash2")), repeats),
        "flash2-fast": (autograd_step(lambda: flash_attn_func(q, k, v, algorithm="flash2", variant="fast")), repeats),
        "flash2-deterministic": (
            autograd_step(lambda: flash_attn_func(q, k, v, algorithm="flash2", deterministic=True)),
            repeats,
        ),
        "torch_naive": (autograd_step(lambda: bu.torch_naive_attention(q, k, v)), repeats),
        "sdpa_mem_efficient": (autograd_step(lambda: bu.torch_sdpa_mem_efficient(q, k, v)), repeats),
    }
    if n == 4096:  # the readable backward takes half a second a step: one size only
        steps["flash2-readable-bwd"] = (readable_backward_step(q, k, v, dout), 2)
    for name, (step, reps) in steps.items():
        row = dict(pass_="fwd+bwd", impl=name, N=n, d=d, batch=b, nheads=h, causal=False)
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            med, lo, hi = bu.cuda_time_ms(step, warmup=1, repeats=reps)
            rate = bu.tflops(flops, med * 1e-3)
            row.update(ms=med, ms_min=lo, ms_max=hi, tflops=rate, pct_sgemm=100 * rate / sgemm)
        except Exception as exc:
            failed(row, log, f"fwd+bwd {name} N={n}", exc)
        emit(row, rows, _line)


def _line(r):
    if "error" in r:
        return f"{r['pass_']:8} {r['impl']:22} {r['N']:>6} {r['d']:>4} {int(r['causal'])} ERROR {r['error'][:100]}"
    return (
        f"{r['pass_']:8} {r['impl']:22} {r['N']:>6} {r['d']:>4} {int(r['causal'])} {r['ms']:9.3f} {r['tflops']:6.2f} "
        f"{r['pct_sgemm']:5.1f} "
        f"{r.get('tile', ''):>7} {r.get('threads', ''):>4} {r.get('regs', '') if r.get('regs') is not None else '':>4} "
        f"{(r['smem'] / 1024) if r.get('smem') else 0:6.1f} "
        f"{r.get('local', '') if r.get('local') is not None else '':>4} "
        f"{r.get('blocks_per_sm', ''):>6} {r.get('occupancy', 0) or 0:5.2f}"
    )


def warm_up(variants, d, log):
    """Compile every variant (causal and not) with one tiny launch."""
    import torch

    q = torch.randn(1, 70, 2, d, device="cuda")
    k = torch.randn(1, 70, 1, d, device="cuda")
    dout = torch.randn_like(q)
    for name, (cfg, feats, det) in variants.items():
        for causal in (False, True):
            if causal and name not in CAUSAL_TOO:
                continue
            try:
                bwd, alloc = run_backward(cfg, feats, det, q, k, k, dout, causal)
                bwd()
            except Exception as exc:
                log.append(f"warm-up {name} d={d}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
    torch.cuda.synchronize()


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.fa2_bwd_sweep``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument(
        "--variants", nargs="*", default=None, help="names to keep (default: all; see VARIANTS_D64 / VARIANTS_D128)"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="time a mask's variants in rounds, one call each, not one after another",
    )
    ap.add_argument(
        "--fwdbwd", type=int, nargs="*", default=[1024, 4096], help="seqlens for fwd+bwd at d=64 (none: skip)"
    )
    ap.add_argument(
        "--wait-pid", type=int, default=None, help="compile first, then wait for this process to exit before timing"
    )
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fa2_bwd_sweep.json"))
    ap.add_argument("--dry-run", action="store_true", help="list each variant's tiling, threads and SRAM; run nothing")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    if args.dry_run:
        return dry_run(args.headdims, args.seqlen, args.variants)
    if not bu.ON_GPU:
        print("fa2_bwd_sweep needs a GPU (or --dry-run)")
        return 1
    t0 = time.time()
    rows, log, checks = [], [], {}
    table = {d: _select(d, args.variants) for d in args.headdims}
    for d, variants in table.items():
        warm_up(variants, d, log)
        print(f"[{time.time() - t0:.0f}s] d={d} compiled", flush=True)
    if args.wait_pid:
        while os.path.exists(f"/proc/{args.wait_pid}"):
            time.sleep(1)
        print(f"[{time.time() - t0:.0f}s] waited for pid {args.wait_pid}", flush=True)
    sgemm = bu.sgemm_tflops()
    print(f"device: {bu.device_name()}  SGEMM fp32 (4096^3, TF32 off): {sgemm:.1f} TFLOP/s", flush=True)
    for d, variants in table.items():
        checks[d] = check(variants, d, log)
        for name, res in checks[d].items():
            print(
                f"check d={d} {name:22} "
                + " ".join(("ok" if r["ok"] else "FAIL") + f"({r['err']:.1e}/{r['naive32_err']:.1e})" for r in res),
                flush=True,
            )
        time_backward(variants, args.seqlen, d, (False, True), args.repeats, sgemm, rows, log, args.interleave)
        print(f"[{time.time() - t0:.0f}s] d={d} timed", flush=True)
    if args.fwdbwd:
        time_fwd_bwd(args.fwdbwd, 64, args.repeats, sgemm, rows, log)
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
        print("ERROR:", e[-800:])
    print("\n".join(_line(r) for r in rows))
    print(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
