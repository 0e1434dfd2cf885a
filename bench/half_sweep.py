"""Tiling sweep of the fp16/bf16 FA2 forward (:mod:`numba_flash.tensorcore.fa2_forward_half`) or, with ``--backward``,
backward (:mod:`numba_flash.tensorcore.fa2_backward_half`) for one GPU call.

For each tiling ``(NW, MW, Bc, PREFETCH)`` (backward: ``(NW, MW, Br, PREFETCH, RED2, CP_ASYNC)``, ``Bc = 16 MW NW``) at
each head dim (forward: the tilings of :data:`TILINGS` with the default cp.async pipeline, then those of
:data:`REGISTER_TILINGS` on the register path, ``CP_ASYNC=False``) it

1. checks correctness on a ragged causal GQA shape: the error against torch float64 at most 2x that of
   torch's naive attention in the same half dtype (NaN-poisoned outputs; backward: each gradient at most
   3x naive autograd's error);
2. reads registers, local memory (spills) and shared memory of the compiled kernel;
3. times the forward with CUDA events (median of ``--repeats`` after warm-up; ``--calls K``: each timing the mean of
   K back-to-back calls, the kernels' time where a call's host work is shorter than them) on the FA2 benchmark
   convention (16k tokens, hidden 2048) beside torch SDPA's flash, cuDNN and memory-efficient backends
   in the same dtype, in the same process.

Run on a GPU machine from the repository root::

    source bench/gpu/setup_env.sh
    python3 -m bench.half_sweep --seqlens 1024 4096 --out $OUT/half_sweep.json
    python3 -m bench.half_sweep --backward --seqlens 1024 4096 --out $OUT/half_bwd_sweep.json

The JSON holds every row and the provenance; the table printed last is the summary.
"""

from __future__ import annotations

import argparse
import json

from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.runtime import resources as _inspect
from numba_flash.tensorcore import fa2_backward_half as HB
from numba_flash.tensorcore import fa2_forward_half as H

from bench import common as bu

#: head dim -> tilings (NW, MW, Bc, PREFETCH) run with the module's default features (the cp.async pipeline at
#: d % 8 == 0, where PREFETCH does nothing: the two stages prefetch); the first is the module's default tiling.
#: MW = 2 at d = 128 fits the registers only with cp.async (bench/offline_resources.py --half-tiling).
TILINGS = {
    64: [(4, 2, 64, False), (4, 2, 32, False), (4, 1, 64, False), (8, 1, 64, False), (4, 1, 128, False)],
    128: [(4, 2, 32, False), (8, 1, 64, False), (4, 2, 64, False), (8, 1, 32, False), (4, 1, 64, False)],
}

#: head dim -> tilings (NW, MW, Bc, PREFETCH) run on the register path (``CP_ASYNC=False``): the default tiling
#: as it was before cp.async, the baseline of the comparison
REGISTER_TILINGS = {
    64: [(4, 2, 32, True)],
    128: [(8, 1, 64, True)],
}


def forward_tilings(d: int) -> list[tuple]:
    """The forward rows of one head dim: ``(NW, MW, Bc, PREFETCH, CP_ASYNC)``."""
    return [(*t, True) for t in TILINGS[d]] + [(*t, False) for t in REGISTER_TILINGS[d]]


#: head dim -> backward tilings (NW, MW, Br, PREFETCH, RED2, CP_ASYNC); the first is the module's default
#: (:func:`numba_flash.tensorcore.fa2_backward_half.default_features`: cp.async, RED2 None = its policy, on sm_90 off
#: only for causal at d = 128), which ``--default-only`` runs. The register-path rows (CP_ASYNC False) were the default
#: before the cp.async rows, which offline (sm_90) drop the spills (d = 64: 28/36 B -> 0, d = 128: 72/84 B -> 12/12 B
#: non-causal, 44/76 -> 4/4 causal) and 8-10 % of the SASS instructions; until 2026-11-26 a register-path row stood
#: first, so ``--default-only`` ran it (the first LSE_P pairs, ``docs/results/sweeps/lse_p_h100_5d25ee7_*``,
#: last in the tree at e0e5a9b).
BWD_TILINGS = {
    64: [
        (8, 1, 64, True, None, True),
        (8, 1, 64, True, True, False),
        (8, 1, 64, True, False, False),
        (8, 1, 32, True, True, False),
        (4, 1, 64, True, True, False),
        (8, 1, 64, True, False, True),
        (4, 1, 64, True, True, True),
    ],
    128: [
        (8, 1, 32, True, None, True),
        (8, 1, 32, True, True, False),
        (8, 1, 32, True, False, False),
        (8, 1, 32, False, True, False),
        (8, 1, 16, False, True, False),
        (8, 1, 32, True, True, True),
        (8, 1, 32, True, False, True),
    ],
}


#: features added to every row's (``--features``), e.g. ``{"EX2_FTZ": True}``
EXTRA_FEATURES: dict = {}


def _bwd_features(tiling) -> dict:
    """The half backward's features of a BWD_TILINGS row (and ``--features``)."""
    return {"PREFETCH": tiling[3], "RED2": tiling[4], "CP_ASYNC": tiling[5], **EXTRA_FEATURES}


def _features(tiling) -> dict:
    """The half forward's features of a TILINGS row (and ``--features``)."""
    return {"PREFETCH": tiling[3], "CP_ASYNC": tiling[4], **EXTRA_FEATURES}


def _call(q, k, v, causal, tiling):
    NW, MW, Bc = tiling[:3]
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    cfg = (NW, MW, Bc, H.config_for(prob.headdim)[3])

    def run():
        alloc = Allocator(q)
        fwd = H.forward(
            alloc.to_words(q), alloc.to_words(k), alloc.to_words(v), prob, alloc, config=cfg, features=_features(tiling)
        )
        return alloc.result(fwd.out, q.dtype)

    return run, prob, cfg


def _call_bwd(q, k, v, causal, tiling):
    """The half forward, then the backward with ``tiling``: ``(run, prob, cfg)``, ``run() -> (dq, dk, dv)``."""
    NW, MW, Br = tiling[:3]
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    cfg = (NW, MW, Br, H.config_for(prob.headdim)[3])
    feats = _bwd_features(tiling)
    dout = q.detach().clone().normal_()

    def run():
        alloc = Allocator(q)
        kq, kk, kv = (alloc.to_words(x) for x in (q, k, v))
        fwd = H.forward(kq, kk, kv, prob, alloc)
        grads = HB.backward(alloc.to_words(dout), kq, kk, kv, fwd.out, fwd, prob, alloc, config=cfg, features=feats)
        return tuple(alloc.result(x, q.dtype) for x in grads)

    run.dout = dout
    return run, prob, cfg


def _check_inputs(d, dtype, torch):
    """q, k, v of the correctness check: ragged (777 queries, 1029 keys), GQA (4 query heads, 2 KV heads), batch 2."""
    g = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(2, 777, 4, d, device="cuda", generator=g).to(dtype)
    k, v = (torch.randn(2, 1029, 2, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    return q, k, v


def check_bwd(tiling, d, dtype, torch):
    """max over dq, dk, dv of error / (3 x naive-in-dtype autograd error) on a ragged causal GQA shape (<= 1 passes)."""
    q, k, v = _check_inputs(d, dtype, torch)
    run, _, _ = _call_bwd(q, k, v, True, tiling)
    with poison_outputs():
        got = run()
    worst = 0.0
    grads = {}
    for dt in (torch.float64, dtype):
        xs = [x.detach().to(dt).requires_grad_(True) for x in (q, k, v)]
        bu.torch_naive_attention(*xs, causal=True).backward(run.dout.to(dt))
        grads[dt] = [x.grad.double() for x in xs]
    for x, r, n in zip(got, grads[torch.float64], grads[dtype]):
        worst = max(worst, float((x.double() - r).abs().max()) / (3 * float((n - r).abs().max())))
    return worst


def check(tiling, d, dtype, torch):
    """max error / (2 x naive-in-dtype error) on a ragged causal GQA shape (<= 1 passes)."""
    q, k, v = _check_inputs(d, dtype, torch)
    run, _, _ = _call(q, k, v, True, tiling)
    with poison_outputs():
        out = run()
    ref = bu.torch_naive_attention(q.double(), k.double(), v.double(), causal=True)
    naive = bu.torch_naive_attention(q, k, v, causal=True)
    err = float((out.double() - ref).abs().max())
    base = float((naive.double() - ref).abs().max())
    return err / (2 * base)


def _sdpa_call(q, k, v, causal, backend, backward):
    """SDPA with one backend: the forward, or (``backward``) forward + backward with a fixed dO."""
    if not backward:
        return lambda: bu.torch_sdpa(q, k, v, causal, backend)
    dout = q.detach().clone().normal_()

    def step():
        for x in (q, k, v):
            x.grad = None
        bu.torch_sdpa(q, k, v, causal, backend).backward(dout)

    return step


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.half_sweep``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument(
        "--calls",
        type=int,
        default=1,
        help="back-to-back calls per timing (bench.common.cuda_time_ms): with "
        "10 or so, short sequences time the kernels rather than one call's host work",
    )
    ap.add_argument("--backward", action="store_true", help="sweep the backward's tilings (forward + backward timed)")
    ap.add_argument(
        "--features", metavar="JSON", help="features over every row's, e.g. '{\"EX2_FTZ\": true}' (in each row)"
    )
    ap.add_argument(
        "--default-only", action="store_true", help="only the first tiling of each head dim (the module's default)"
    )
    ap.add_argument("--out")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="list each tiling's threads and SRAM; run nothing (works in the simulator)",
    )
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    EXTRA_FEATURES.clear()
    EXTRA_FEATURES.update(json.loads(args.features or "{}"))
    if args.dry_run and args.backward:
        for d in args.headdims:
            DP = HB.config_for(d)[3]
            for NW, MW, Br, pf, red2, cp in BWD_TILINGS[d]:
                cp = cp and H.cp_async_ok(d)
                print(
                    f"backward d={d} NW={NW} MW={MW} Br={Br} Bc={16 * NW * MW} prefetch={pf} red2={red2} "
                    f"cp_async={cp}: {32 * NW} "
                    f"threads, {4 * HB.smem_words(NW, MW, Br, DP, 2 if cp else 1)} B dynamic SRAM"
                )
        return 0
    if args.dry_run:
        for d in args.headdims:
            DP = H.config_for(d)[3]
            for NW, MW, Bc, pf, cp in forward_tilings(d):
                cp = cp and H.cp_async_ok(d)
                print(
                    f"d={d} NW={NW} MW={MW} Br={16 * NW * MW} Bc={Bc} prefetch={pf}: cp_async={cp}, {32 * NW} threads, "
                    f"{4 * H.smem_words(NW, MW, Bc, DP, H.kv_stages(cp))} B dynamic SRAM"
                )
        return 0
    import torch

    dtype = getattr(torch, args.dtype)
    tilings, call, plan, chk = (
        (BWD_TILINGS, _call_bwd, HB.plan, check_bwd)
        if args.backward
        else ({d: forward_tilings(d) for d in TILINGS}, _call, H.plan, check)
    )
    tag = "half bwd" if args.backward else "half"
    rows = []
    for d in args.headdims:
        for n in args.seqlens:
            shape = bu.fa2_shape(n, d)
            b, h = shape["batch"], shape["nheads"]
            q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, dtype=args.dtype, requires_grad=args.backward)
            for causal in (False, True):
                flops = bu.flops_forward(b, h, n, n, d, causal) * (3.5 if args.backward else 1.0)
                cands = [
                    ("sdpa_" + be, _sdpa_call(q, k, v, causal, be, args.backward), None)
                    for be in ("flash", "cudnn", "efficient")
                ]
                cands += [
                    (
                        f"{tag} NW{t[0]} MW{t[1]} {'Br' if args.backward else 'Bc'}{t[2]} pf{int(t[3])}"
                        + (
                            f" red2{'-' if t[4] is None else int(t[4])} cp{int(t[5])}"
                            if args.backward
                            else f" cp{int(t[4])}"
                        ),
                        None,
                        t,
                    )
                    for t in (tilings[d][:1] if args.default_only else tilings[d])
                ]
                for name, fn, tiling in cands:
                    row = dict(impl=name, N=n, d=d, batch=b, nheads=h, causal=causal, dtype=args.dtype)
                    if tiling is not None and EXTRA_FEATURES:
                        row["features"] = dict(EXTRA_FEATURES)
                    try:
                        if tiling is not None:
                            fn, prob, cfg = call(q, k, v, causal, tiling)
                            feats = _bwd_features(tiling) if args.backward else _features(tiling)
                            kernel = plan(prob, config=cfg, features=feats)[0]
                            fn()  # compile
                            res = _inspect.kernel_resources(kernel)
                            row.update(
                                regs=res["regs_per_thread"],
                                local=res["local_mem_per_thread"],
                                err_over_bound=chk(tiling, d, dtype, torch)
                                if n == args.seqlens[0] and not causal
                                else None,
                            )
                        med, lo, hi = bu.cuda_time_ms(fn, warmup=2, repeats=args.repeats, calls=args.calls)
                        row.update(time_ms=med, tflops=bu.tflops(flops, med / 1e3), calls_per_timing=args.calls)
                    except Exception as exc:  # a tiling that does not fit is a row, not the end of the sweep
                        row.update(error=f"{type(exc).__name__}: {str(exc)[:200]}")
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"provenance": bu.provenance(), "rows": rows}, fh, indent=1)
    print("\nimpl                          d      N causal      ms  TFLOP/s  regs local err/bound")
    for r in rows:
        if "time_ms" in r:
            e = r.get("err_over_bound")
            print(
                f"{r['impl']:28s} {r['d']:4d} {r['N']:6d} {int(r['causal']):6d} {r['time_ms']:7.3f} {r['tflops']:8.1f} "
                f"{r.get('regs', ''):>5} {r.get('local', ''):>5} {'' if e is None else f'{e:.2f}'}"
            )
        else:
            print(f"{r['impl']:28s} {r['d']:4d} {r['N']:6d} {int(r['causal']):6d} {r.get('error')}")
    return 0


if __name__ == "__main__":
    main()
