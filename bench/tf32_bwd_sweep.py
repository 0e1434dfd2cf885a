"""3xTF32 backward sweep for one GPU call: check and time tilings of :mod:`numba_flash.tensorcore.fa2_backward_tf32`.

For each tiling ``(NW, MW, Br)`` (warps of 16 keys, key tiles per warp, query rows per step) and feature set,
at d = 64 and 128:

1. checks the gradients after the 3xTF32 forward on a ragged causal GQA shape against torch float64 (the
   error rule: at most 3x the error of torch float32 with TF32 off, :func:`bench.fa2_bwd_sweep.check_backward`);
2. reads registers, SRAM, local memory and theoretical occupancy of the main kernel;
3. times the backward alone (pre-pass + main kernel) on the FA2 convention (16k tokens, hidden 2048) beside
   the FFMA backward (:mod:`numba_flash.fast.fa2_backward`, the tensor-core variant's float32 backward before
   this kernel) on the same forward outputs; FLOPs = 2.5x the forward's;
4. times forward + backward through ``flash_attn_func`` (``variant="tensorcore"`` at the default tiling and
   ``"fast"``) beside SDPA's memory-efficient backend and torch naive attention (fp32, TF32 off), the cells
   of issue #15.

All kernels are compiled first; ``--wait-pid`` then waits for that process (a pytest run started beside it)
to exit, so compilation overlaps the tests but the timings do not. Run on a GPU machine::

    source bench/gpu/setup_env.sh
    python3 -m bench.tf32_bwd_sweep --out $OUT/tf32_bwd_sweep.json

``--dry-run`` lists each tiling's threads and SRAM without running anything (works in the simulator).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback

from numba_flash._launch import Allocator, check_attention_args
from numba_flash.fast import fa2_backward as fa2_backward_fast
from numba_flash.runtime import resources as _inspect
from numba_flash.tensorcore import fa2_backward_tf32 as T
from numba_flash.tensorcore import fa2_forward_tf32

from bench import common as bu
from bench.fa2_bwd_sweep import check_backward, emit, failed

#: d -> name -> ((NW, MW, Br) or None for the default, features); "ffma" is the FFMA backward's default.
#: The ``-cp`` rows load Q_i, dO_i by ``cp.async`` into two SRAM stages (``CP_ASYNC``); at d = 128 the default
#: 8 x 1 x 32 does not fit two stages (236 KB), so its candidates are 8 x 1 x 16 and 4 x 1 x 32 (offline sm_90:
#: no spill, 16/20 B; ``docs/results/sweeps/offline_tf32_bwd_cp_async.txt``, last in the tree at e0e5a9b).
CP = {"CP_ASYNC": True}
#: The default tiling with the causal blocks in their launch order (``HEAVY_FIRST`` off), beside the default.
DEFAULT_ORDER = {
    "default": (None, {}),
    "default-hf0": (None, {"HEAVY_FIRST": False}),
    "default-hf1": (None, {"HEAVY_FIRST": True}),
}
#: S in the order of the forward's ``WIDE`` (the forward then runs with it too), and at d = 128 the default tiling with
#: two cp.async stages, which fits with WIDE's unpadded rows (225 KB; 236 KB padded)
WIDE = {"default-wide": (None, {"WIDE": True}), "default-nowide": (None, {"WIDE": False})}
#: The default tiling with line 15's k steps two or four to a pass of its loop (``DQ_UNROLL``), beside one
DQ_UNROLL = {f"default-dqu{u}": (None, {"DQ_UNROLL": u}) for u in (1, 2, 4)}
#: line 6's K_j, V_j through registers (the former load) or by cp.async (KV_ASYNC, 2026-11-27)
KV_ASYNC = {f"default-kv{int(a)}": (None, {"KV_ASYNC": a}) for a in (False, True)}
#: Q_i, dO_i split into their tf32 parts once per step in SRAM (SPLIT_QDO, 2026-11-28: WIDE only, so d = 128) or by
#: every warp
SPLIT_QDO = {f"default-sq{int(a)}": (None, {"SPLIT_QDO": a, "QDO_PAIRS": False}) for a in (False, True)}
#: ... with its parts as the A-fragment quads of row pairs (QDO_PAIRS, 2026-11-28)
SPLIT_QDO["default-sq1-pairs"] = (None, {"SPLIT_QDO": True, "QDO_PAIRS": True})
TILINGS = {
    64: {
        "ffma": ("ffma", {}),
        "8x1-Br64": ((8, 1, 64), {}),
        "8x1-Br32": ((8, 1, 32), {}),
        "4x1-Br32": ((4, 1, 32), {}),
        "8x1-Br64-cp": ((8, 1, 64), CP),
        "4x1-Br32-cp": ((4, 1, 32), CP),
        "8x1-Br32-cp": ((8, 1, 32), CP),
        **DEFAULT_ORDER,
        **WIDE,
        **DQ_UNROLL,
        **KV_ASYNC,
    },
    128: {
        "ffma": ("ffma", {}),
        "8x1-Br16": ((8, 1, 16), {}),
        "4x1-Br16": ((4, 1, 16), {}),
        "8x1-Br32": ((8, 1, 32), {}),
        "8x1-Br16-cp": ((8, 1, 16), CP),
        "4x1-Br32-cp": ((4, 1, 32), CP),
        **DEFAULT_ORDER,
        **WIDE,
        **DQ_UNROLL,
        **KV_ASYNC,
        **SPLIT_QDO,
        "8x1-Br32-cp-wide": ((8, 1, 32), {**CP, "WIDE": True}),
        "8x1-Br16-cp-wide": ((8, 1, 16), {**CP, "WIDE": True}),
        "4x1-Br32-cp-wide": ((4, 1, 32), {**CP, "WIDE": True}),
    },
}


def _config(cfg, d):
    return None if cfg is None else (*cfg, 8 * ((d + 7) // 8))


def run_backward(cfg, feats, q, k, v, dout, causal):
    """The 3xTF32 forward's outputs, and the backward callable of a tiling (or of the FFMA kernel). A tiling with
    ``WIDE`` set runs after the forward with the same ``WIDE`` (the order its S must follow)."""
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    alloc = Allocator(q)
    kq, kk, kv, kdo = (alloc.to_kernel(x) for x in (q, k, v, dout))
    fwd = fa2_forward_tf32.forward(
        kq, kk, kv, prob, alloc, features={"WIDE": feats["WIDE"]} if "WIDE" in feats else None
    )

    def bwd():
        if cfg == "ffma":
            return fa2_backward_fast.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc)
        return T.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, config=_config(cfg, prob.headdim), features=feats)

    return bwd, alloc


def resources(cfg, feats, prob):
    """regs / SRAM / local / occupancy of the tiling's main kernel (after it ran once)."""
    if cfg == "ffma":
        main, _, _, _, nt, nbytes = fa2_backward_fast.plan(prob)
    else:
        main, _, _, _, (nt, _), (nbytes, _) = T.plan(prob, config=_config(cfg, prob.headdim), features=feats)
    res = _inspect.kernel_resources(main)
    smem = (res["shared_mem_per_block"] or 0) + nbytes
    return dict(
        threads=nt,
        regs=res["regs_per_thread"],
        smem=smem,
        local=res["local_mem_per_thread"],
        **_inspect.theoretical_occupancy(res["regs_per_thread"], smem, nt),
    )


def check(tilings, d, log):
    """:func:`bench.fa2_bwd_sweep.check_backward` of the tilings (the 3x rule against torch float64)."""
    return check_backward(
        {name: functools.partial(run_backward, cfg, feats) for name, (cfg, feats) in tilings.items()}, d, log
    )


def time_backward(tilings, n, d, causal, repeats, rows, log, rounds=1):
    """Time every tiling's backward alone on one cell, ``rounds`` times over, the tilings alternating (each row
    records its ``round``: the pairs of one process, compiled once, as ``--rounds`` asks). Round r starts from the r-th
    tiling (since 2026-11-27; before, every round in the same order), so no tiling always runs first: a variant's place
    weighs on its time (identical kernels 0.2-4.6 % apart by place on an H100, the performance log's ``SPLIT_KV``)."""
    import torch

    shape = bu.fa2_shape(n, d)
    b, h = shape["batch"], shape["nheads"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d)
    dout = torch.randn_like(q)
    flops = bu.flops_backward(b, h, n, n, d, causal)
    items = list(tilings.items())
    for rnd, (name, (cfg, feats)) in (
        (r, items[(r - 1 + i) % len(items)]) for r in range(1, rounds + 1) for i in range(len(items))
    ):
        row = dict(pass_="bwd", impl=name, N=n, d=d, batch=b, nheads=h, causal=causal, round=rnd)
        try:
            bwd, alloc = run_backward(cfg, feats, q, k, v, dout, causal)
            med, lo, hi = bu.cuda_time_ms(bwd, warmup=1, repeats=repeats)
            row.update(ms=med, ms_min=lo, ms_max=hi, tflops=bu.tflops(flops, med * 1e-3))
            row.update(resources(cfg, feats, check_attention_args(q, k, v, 0.0, None, causal, 0)))
        except Exception as exc:
            failed(row, log, f"bwd {name} N={n} d={d} causal={causal}", exc)
        emit(row, rows, _line)


def time_fwd_bwd(n, d, causal, repeats, rows, log):
    from numba_flash import flash_attn_func

    import torch

    shape = bu.fa2_shape(n, d)
    b, h = shape["batch"], shape["nheads"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=n + d, requires_grad=True)
    dout = torch.randn_like(q)
    flops = bu.flops_forward(b, h, n, n, d, causal) * 3.5

    def step(f):
        def run():
            for x in (q, k, v):
                x.grad = None
            f().backward(dout)

        return run

    impls = {
        "flash2-tensorcore": lambda: flash_attn_func(q, k, v, causal=causal, algorithm="flash2", variant="tensorcore"),
        "flash2-fast": lambda: flash_attn_func(q, k, v, causal=causal, algorithm="flash2", variant="fast"),
        "sdpa_mem_efficient": lambda: bu.torch_sdpa_mem_efficient(q, k, v, causal=causal),
        "torch_naive": lambda: bu.torch_naive_attention(q, k, v, causal=causal),
    }
    for name, f in impls.items():
        row = dict(pass_="fwd+bwd", impl=name, N=n, d=d, batch=b, nheads=h, causal=causal)
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            med, lo, hi = bu.cuda_time_ms(step(f), warmup=1, repeats=repeats)
            row.update(ms=med, ms_min=lo, ms_max=hi, tflops=bu.tflops(flops, med * 1e-3))
        except Exception as exc:
            row.update(error=f"{type(exc).__name__}: {str(exc)[:200]}")
            if not bu.is_oom(exc):
                log.append(f"fwd+bwd {name} N={n} d={d}: {traceback.format_exc()[-1500:]}")
        rows.append(row)
        print(_line(row), flush=True)
        bu.free_memory()


def _line(r):
    head = f"{r['pass_']:8} {r['impl']:20} {r['N']:>6} {r['d']:>4} {int(r['causal'])}" + (
        f" r{r['round']}" if "round" in r else ""
    )
    if "error" in r:
        return f"{head} ERROR {r['error'][:100]}"
    extra = (
        f" regs {r['regs']} smem {r['smem'] / 1024:.1f}KB local {r['local']} blocks/SM {r.get('blocks_per_sm')}"
        if "regs" in r
        else ""
    )
    return f"{head} {r['ms']:9.3f} ms {r['tflops']:6.2f} TFLOP/s{extra}"


def warm_up(tilings, d, log):
    """Compile every tiling (causal and not) and the flash_attn_func paths with one tiny launch each."""
    from numba_flash import flash_attn_func

    import torch

    q = torch.randn(1, 70, 2, d, device="cuda", requires_grad=True)
    k = torch.randn(1, 70, 1, d, device="cuda", requires_grad=True)
    dout = torch.randn(1, 70, 2, d, device="cuda")
    for causal in (False, True):
        for name, (cfg, feats) in tilings.items():
            try:
                run_backward(cfg, feats, q.detach(), k.detach(), k.detach(), dout, causal)[0]()
            except Exception as exc:
                log.append(f"warm-up {name} d={d}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
        for variant in ("tensorcore", "fast"):
            kk = k.repeat_interleave(2, dim=2).detach().requires_grad_(True)
            flash_attn_func(q, kk, kk, causal=causal, algorithm="flash2", variant=variant).backward(dout)
    torch.cuda.synchronize()


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.tf32_bwd_sweep``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--tilings", nargs="*", default=None, help="names to keep (default: all of TILINGS)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time the backward cells this many times over, the tilings alternating, round r from the r-th (one "
        "compilation)",
    )
    ap.add_argument(
        "--no-fwdbwd", action="store_true", help="skip the flash_attn_func / SDPA / naive forward+backward cells"
    )
    ap.add_argument(
        "--wait-pid", type=int, default=None, help="compile first, then wait for this process to exit before timing"
    )
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "tf32_bwd_sweep.json"))
    ap.add_argument("--dry-run", action="store_true", help="list each tiling's threads and SRAM; run nothing")
    return ap


def _select(d, names):
    tilings = dict(TILINGS[64 if d <= 64 else 128])
    return {k: v for k, v in tilings.items() if not names or k in names}


def main(argv=None):
    args = parser().parse_args(argv)
    if args.dry_run:
        for d in args.headdims:
            for name, (cfg, feats) in _select(d, args.tilings).items():
                if cfg == "ffma":
                    continue
                prob = bu.fa2_problem(args.seqlens[0], d)
                _, _, _, _, (nt, _), (nbytes, _) = T.plan(prob, config=_config(cfg, d), features=feats)
                print(f"d={d} {name:14} threads {nt:>4} dynamic SRAM {nbytes / 1024:6.1f} KB")
        return 0
    if not bu.ON_GPU:
        print("tf32_bwd_sweep needs a GPU (or --dry-run)")
        return 1
    t0 = time.time()
    rows, log, checks = [], [], {}
    for d in args.headdims:
        warm_up(_select(d, args.tilings), d, log)
        print(f"[{time.time() - t0:.0f}s] d={d} compiled", flush=True)
    if args.wait_pid:
        while os.path.exists(f"/proc/{args.wait_pid}"):
            time.sleep(1)
        print(f"[{time.time() - t0:.0f}s] waited for pid {args.wait_pid}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save():  # after every cell: a run cut short by a time limit keeps what it measured
        result = dict(provenance=bu.provenance(), checks={str(k): v for k, v in checks.items()}, rows=rows, errors=log)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1, default=str)

    for d in args.headdims:
        tilings = _select(d, args.tilings)
        checks[d] = check(tilings, d, log)
        for name, res in checks[d].items():
            print(
                f"check d={d} {name:14} "
                + " ".join(("ok" if r["ok"] else "FAIL") + f"({r['err']:.1e}/{r['naive32_err']:.1e})" for r in res),
                flush=True,
            )
        for n in args.seqlens:
            for causal in (False, True):
                time_backward(tilings, n, d, causal, args.repeats, rows, log, args.rounds)
                if not args.no_fwdbwd:
                    time_fwd_bwd(n, d, causal, args.repeats, rows, log)
                save()
        print(f"[{time.time() - t0:.0f}s] d={d} timed", flush=True)
    save()
    for e in log:
        print("ERROR:", e[-800:])
    print(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
