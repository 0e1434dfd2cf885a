"""FA2 backward sweep for one GPU call: check, inspect and time tile/feature variants of the fast backward.

For each variant of :mod:`numba_flash.fast.fa2_backward` (and the readable backward as the baseline) it

1. checks the gradients on a ragged causal GQA shape against torch float64 (the error rule: at most
   3x the error of torch float32 with TF32 off), NaN-poisoned outputs;
2. reads registers, shared memory, local memory and theoretical occupancy of the main kernel;
3. times the backward alone (pre-pass + main kernel (+ dQ kernel when deterministic)) with CUDA events
   on the FA2 benchmark convention (16k tokens, hidden 2048), FLOPs = 2.5x the forward's, and reports
   TFLOP/s and % of the cuBLAS SGEMM rate measured in the same run;
4. times forward + backward (``flash_attn_func(...).backward``) of flash2 with the fast and the readable
   backward beside torch's naive fp32 attention and SDPA's memory-efficient backend.

All variants are compiled first (one tiny launch each); with ``--wait-pid`` the timing then waits for
that process (e.g. a pytest run started beside it) to exit, so compilation overlaps the tests but the
timings do not.

Run on a GPU machine from the repository root::

    source tests/gpu/setup_env.sh
    python3 tests/benchmarks/fa2_bwd_sweep.py --out $OUT/fa2_bwd_sweep.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_utils as bu

from numba_flash import _inspect, fa2_backward, fa2_backward_fast, fa2_forward
from numba_flash._launch import Allocator, check_attention_args, poison_outputs

#: name -> (config (NT, Br, Bc) or None for the default, or "readable"; features; deterministic)
VARIANTS_D64 = {
    "readable": ("readable", {}, False),
    "fast": (None, {}, False),
    "fast-det": (None, {}, True),
    "fast-r128": (None, {"MAXREG": 128}, False),
    "fast-nopf-r128": (None, {"MAXREG": 128, "PREFETCH": False}, False),
    "fast-Bc128": ((256, 64, 128), {}, False),
}
VARIANTS_D128 = {
    "fast": (None, {}, False),
    "fast-det": (None, {}, True),
    "fast-Br32": ((256, 32, 64), {}, False),
}


def _config(cfg, d):
    if cfg is None or cfg == "readable":
        return cfg
    NT, BR, BC = cfg
    return (NT, BR, BC, 16 * ((d + 15) // 16))


def run_backward(cfg, feats, det, q, k, v, dout, causal, dropout_p=0.0, seed=0):
    """Fast forward, then one backward of a variant, on torch CUDA tensors; returns (dq, dk, dv) and the backward callable."""
    prob = check_attention_args(q, k, v, dropout_p, None, causal, seed)
    alloc = Allocator(q)
    kq, kk, kv, kdo = (alloc.to_kernel(x) for x in (q, k, v, dout))
    fwd = fa2_forward.forward(kq, kk, kv, prob, alloc)

    def bwd():
        if cfg == "readable":
            return fa2_backward.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, deterministic=det, variant="readable")
        return fa2_backward_fast.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, deterministic=det, config=_config(cfg, prob.headdim), features=feats)

    return bwd, alloc


def resources(cfg, feats, det, q, k, v, causal):
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    if cfg == "readable":
        Br, Bc, Tr, Tc = fa2_backward._split(prob, None)
        disp = fa2_backward.fa2_backward_kernel(Br, Bc, prob.headdim, causal, False, True)
        res = _inspect.kernel_resources(disp)
        occ = _inspect.theoretical_occupancy(res["regs_per_thread"], res["shared_mem_per_block"], Bc)
        return dict(tile=f"{Br}x{Bc}", threads=Bc, regs=res["regs_per_thread"], smem=res["shared_mem_per_block"], local=res["local_mem_per_thread"], **occ)
    main, grid, dqk, grid_dq, NT, nbytes = fa2_backward_fast.plan(prob, config=_config(cfg, prob.headdim), features=feats, deterministic=det)
    res = _inspect.kernel_resources(main)
    smem = (res["shared_mem_per_block"] or 0) + nbytes
    occ = _inspect.theoretical_occupancy(res["regs_per_thread"], smem, NT)
    c = _config(cfg, prob.headdim) or fa2_backward_fast.config_for(prob.headdim)
    out = dict(tile=f"{c[1]}x{c[2]}", threads=NT, regs=res["regs_per_thread"], smem=smem, local=res["local_mem_per_thread"], **occ)
    if dqk is not None:
        r2 = _inspect.kernel_resources(dqk)
        out.update(dq_regs=r2["regs_per_thread"], dq_local=r2["local_mem_per_thread"])
    return out


def torch_grads(q, k, v, dout, causal, dtype):
    import torch
    from numba_flash_reference.common import causal_mask

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


def check(variants, d, log):
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
    for name, (cfg, feats, det) in variants.items():
        try:
            bwd, alloc = run_backward(cfg, feats, det, q, k, v, dout, True)
            with poison_outputs():
                grads = [alloc.result(g) for g in bwd()]
            res = []
            for g, r, n in zip(grads, ref, naive):
                err = float((g.double() - r).abs().max())
                base = float((n.double() - r).abs().max())
                res.append(dict(err=err, naive32_err=base, ok=bool(math.isfinite(err) and err <= 3 * base + 4 * 1.19e-7 * max(1.0, float(r.abs().max())))))
            out[name] = res
        except Exception as exc:
            out[name] = [dict(err=float("nan"), naive32_err=float("nan"), ok=False)]
            log.append(f"check {name} d={d}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
    return out


def time_backward(variants, n, d, causals, repeats, sgemm, rows, log):
    import torch

    shape = bu.fa2_shape(n, d)
    b, h = shape["batch"], shape["nheads"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d)
    dout = torch.randn_like(q)
    for causal in causals:
        flops = bu.flops_backward(b, h, n, n, d, causal)
        for name, (cfg, feats, det) in variants.items():
            if causal and name not in ("fast", "fast-det", "fast-r128", "readable"):
                continue
            row = dict(pass_="bwd", impl=name, N=n, d=d, batch=b, nheads=h, causal=causal)
            try:
                bwd, alloc = run_backward(cfg, feats, det, q, k, v, dout, causal)
                reps = 2 if cfg == "readable" else repeats
                med, lo, hi = bu.cuda_time_ms(bwd, warmup=1, repeats=reps)
                rate = bu.tflops(flops, med * 1e-3)
                row.update(ms=med, ms_min=lo, ms_max=hi, tflops=rate, pct_sgemm=100 * rate / sgemm)
                row.update(resources(cfg, feats, det, q, k, v, causal))
            except Exception as exc:
                row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                log.append(f"{name} N={n} d={d} causal={causal}: {traceback.format_exc()[-1500:]}")
            rows.append(row)
            print(_line(row), flush=True)
            bu.free_memory()
    del q, k, v, dout
    bu.free_memory()


def time_fwd_bwd(seqlens, d, repeats, sgemm, rows, log):
    import torch

    from numba_flash import flash_attn_func

    for n in seqlens:
        shape = bu.fa2_shape(n, d)
        b, h = shape["batch"], shape["nheads"]
        q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, requires_grad=True)
        dout = torch.randn_like(q)
        flops = bu.flops_forward(b, h, n, n, d) * 3.5
        impls = {
            "flash2": ("fast", lambda: flash_attn_func(q, k, v, algorithm="flash2")),
            "flash2-deterministic": ("fast", lambda: flash_attn_func(q, k, v, algorithm="flash2", deterministic=True)),
            "flash2-readable-bwd": ("readable", lambda: flash_attn_func(q, k, v, algorithm="flash2")),
            "torch_naive": (None, lambda: bu.torch_naive_attention(q, k, v)),
            "sdpa_mem_efficient": (None, lambda: bu.torch_sdpa_mem_efficient(q, k, v)),
        }
        for name, (bv, f) in impls.items():
            if bv == "readable" and n != 4096:
                continue
            row = dict(pass_="fwd+bwd", impl=name, N=n, d=d, batch=b, nheads=h, causal=False)

            def step(f=f):
                for x in (q, k, v):
                    x.grad = None
                f().backward(dout)

            try:
                torch.backends.cuda.matmul.allow_tf32 = False
                if bv is not None:
                    fa2_backward.VARIANT = bv
                med, lo, hi = bu.cuda_time_ms(step, warmup=1, repeats=2 if bv == "readable" else repeats)
                rate = bu.tflops(flops, med * 1e-3)
                row.update(ms=med, ms_min=lo, ms_max=hi, tflops=rate, pct_sgemm=100 * rate / sgemm)
            except Exception as exc:
                row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                log.append(f"fwd+bwd {name} N={n}: {traceback.format_exc()[-1500:]}")
            finally:
                fa2_backward.VARIANT = "fast"
            rows.append(row)
            print(_line(row), flush=True)
            bu.free_memory()
        del q, k, v
        bu.free_memory()


def _line(r):
    if "error" in r:
        return f"{r['pass_']:8} {r['impl']:22} {r['N']:>6} {r['d']:>4} {int(r['causal'])} ERROR {r['error'][:100]}"
    return (f"{r['pass_']:8} {r['impl']:22} {r['N']:>6} {r['d']:>4} {int(r['causal'])} {r['ms']:9.3f} {r['tflops']:6.2f} {r['pct_sgemm']:5.1f} "
            f"{r.get('tile', ''):>7} {r.get('threads', ''):>4} {r.get('regs', '') if r.get('regs') is not None else '':>4} "
            f"{(r['smem'] / 1024) if r.get('smem') else 0:6.1f} {r.get('local', '') if r.get('local') is not None else '':>4} "
            f"{r.get('blocks_per_sm', ''):>6} {r.get('occupancy', 0) or 0:5.2f}")


def warm_up(variants, d, log):
    """Compile every variant (causal and not) with one tiny launch."""
    import torch

    q = torch.randn(1, 70, 2, d, device="cuda")
    k = torch.randn(1, 70, 1, d, device="cuda")
    dout = torch.randn_like(q)
    for name, (cfg, feats, det) in variants.items():
        for causal in (False, True):
            if causal and name not in ("fast", "fast-det", "fast-r128", "readable"):
                continue
            try:
                bwd, alloc = run_backward(cfg, feats, det, q, k, k, dout, causal)
                bwd()
            except Exception as exc:
                log.append(f"warm-up {name} d={d}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
    torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fwdbwd", type=int, nargs="*", default=[1024, 4096], help="seqlens for fwd+bwd at d=64")
    ap.add_argument("--wait-pid", type=int, default=None, help="compile first, then wait for this process to exit before timing")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fa2_bwd_sweep.json"))
    args = ap.parse_args(argv)
    if not bu.ON_GPU:
        print("fa2_bwd_sweep needs a GPU")
        return 1
    t0 = time.time()
    rows, log, checks = [], [], {}
    table = {d: (VARIANTS_D64 if d <= 64 else VARIANTS_D128) for d in args.headdims}
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
            print(f"check d={d} {name:16} " + " ".join(("ok" if r["ok"] else "FAIL") + f"({r['err']:.1e}/{r['naive32_err']:.1e})" for r in res), flush=True)
        time_backward(variants, args.seqlen, d, (False, True), args.repeats, sgemm, rows, log)
        print(f"[{time.time() - t0:.0f}s] d={d} timed", flush=True)
    if args.fwdbwd:
        time_fwd_bwd(args.fwdbwd, 64, args.repeats, sgemm, rows, log)
    result = dict(provenance=bu.provenance(), sgemm_tflops=sgemm, checks={str(k): v for k, v in checks.items()}, rows=rows, errors=log)
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
