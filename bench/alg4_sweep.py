"""Algorithm 4 tile sweep for one GPU call: check and time the readable recomputation backward over (Br, Bc, threads).

For each head dimension (d = 64 and 128, the FA2 convention: 16k tokens, hidden 2048, N = 4096 by
default) it runs the readable FA1 forward once, then for each candidate tiling of the *readable*
:mod:`numba_flash.alg4_backward` (48 KB of static shared memory)

1. checks dQ, dK, dV against the standard backward (Algorithm 3) on the same inputs (max error
   relative to the largest gradient entry; both are float32, so ~1e-6 is agreement);
2. records registers per thread, static shared memory and the median time of the backward alone;

and times, in the same process, the other pieces of a training step: the readable FA1 forward, the
standard forward and backward, and torch's naive attention and SDPA memory-efficient (fp32) forward +
backward. Prints a table and writes it as JSON (``--json``). The committed benchmark is
``tests/benchmarks/test_bench_backward.py``; this is the block-size sweep behind the readable
kernel's defaults (llm.c style). Its output of one H200 run was ``docs/results/sweeps/alg4_sweep_h200.log``, last in
the tree at e0e5a9b (``git show e0e5a9b:docs/results/sweeps/alg4_sweep_h200.log``).

Run on a GPU machine, from the repository root::

    python3 -m bench.alg4_sweep --json alg4_sweep.json

``--dry-run`` lists the candidate tilings and their shared memory without running anything (works
in the simulator).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from numba_flash import alg0_standard, alg1_forward, alg3_backward, alg4_backward
from numba_flash._launch import STATIC_SMEM_BYTES, Allocator, check_attention_args
from numba_flash.runtime import resources as _inspect

from bench import common as bu

#: (Br, Bc, threads) candidates of the readable Algorithm 4 kernel per head dimension.
D64 = [(32, 32, 256), (16, 48, 256), (32, 32, 512)]
D128 = [(16, 24, 256), (16, 16, 256), (16, 24, 512)]


def candidates(d: int):
    return D64 if d <= 64 else D128


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max())


def dry_run(dims, seqlen):
    """Each candidate's SRAM and the launch it compiles to, without running anything."""
    for d in dims:
        prob = bu.fa2_problem(seqlen, d)
        for Br, Bc, nt in candidates(d):
            cfg = alg4_backward.Alg4Config(Br, Bc, d, nt)
            fits = cfg.sram_bytes <= STATIC_SMEM_BYTES
            launch = alg4_backward.compiled_kernels(prob, (Br, Bc), num_threads=nt)[0] if fits else None
            print(
                f"d={d} Br={Br} Bc={Bc} threads={nt}: {cfg.sram_bytes} B SRAM"
                + (
                    f", {launch.name}, {launch.blocks} blocks of {launch.threads} threads"
                    if fits
                    else " (over 48 KB: skipped)"
                )
            )
    return 0


def sweep_headdim(d, seqlen, repeats, rows):
    """Time the training-step pieces and every Algorithm 4 candidate at head dim ``d``; append to ``rows``."""
    import torch

    shape = bu.fa2_shape(seqlen, d)
    b, h, n = shape["batch"], shape["nheads"], shape["seqlen"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=d)
    g = torch.randn_like(q)
    prob = check_attention_args(q, k, v)
    alloc = Allocator(q)
    kq, kk, kv, kg = (alloc.to_kernel(x) for x in (q, k, v, g))
    f_fwd = bu.flops_forward(b, h, n, n, d)
    f_bwd = bu.flops_backward(b, h, n, n, d)

    def timed(name, fn, flops):
        bu.free_memory()
        try:
            t = bu.time_median(fn, warmup=1, repeats=repeats)
        except Exception as exc:  # OOM or a launch failure: record and go on
            print(f"d={d} {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            rows.append(dict(d=d, N=n, what=name, error=str(exc)[:200]))
            return None
        row = dict(d=d, N=n, batch=b, nheads=h, what=name, ms=t * 1e3, tflops=bu.tflops(flops, t))
        rows.append(row)
        print(f"d={d} N={n} b={b} h={h} {name:42s} {t * 1e3:9.2f} ms {row['tflops']:7.2f} TFLOP/s", flush=True)
        return row

    def alg4(Br, Bc, nt):
        return alg4_backward.backward(
            kg, kq, kk, kv, fwd1.out, fwd1, prob, Allocator(q), block_sizes=(Br, Bc), num_threads=nt
        )

    fwd1 = alg1_forward.forward(kq, kk, kv, prob, alloc)
    bu.synchronize()
    timed("flash1 forward (Alg. 1-2)", lambda: alg1_forward.forward(kq, kk, kv, prob, Allocator(q)), f_fwd)
    timed("standard forward (Alg. 0)", lambda: alg0_standard.forward(kq, kk, kv, prob, Allocator(q)), f_fwd)
    ref = alg3_backward.backward(kg, kq, kk, kv, fwd1.out, fwd1, prob, Allocator(q))
    bu.synchronize()
    ref_t = [torch.as_tensor(x, device="cuda").clone() for x in ref]
    del ref
    timed(
        "standard backward (Alg. 3)",
        lambda: alg3_backward.backward(kg, kq, kk, kv, fwd1.out, fwd1, prob, Allocator(q)),
        f_bwd,
    )
    bu.free_memory()
    for Br, Bc, nt in candidates(d):
        cfg = alg4_backward.Alg4Config(Br, Bc, d, nt)
        if cfg.sram_bytes > STATIC_SMEM_BYTES:
            print(f"skip ({Br}, {Bc}, {nt}): {cfg.sram_bytes} bytes of SRAM", flush=True)
            continue
        name = f"flash1 backward (Alg. 4) Br={Br} Bc={Bc} NT={nt}"
        t0 = time.perf_counter()
        got = alg4(Br, Bc, nt)
        bu.synchronize()
        compile_s = time.perf_counter() - t0
        errs = [rel_err(torch.as_tensor(x, device="cuda"), r) for x, r in zip(got, ref_t)]
        del got
        row = timed(name, lambda Br=Br, Bc=Bc, nt=nt: alg4(Br, Bc, nt), f_bwd)
        launch = alg4_backward.compiled_kernels(prob, (Br, Bc), num_threads=nt)[0]
        if row is not None:
            regs = _inspect.kernel_resources(launch.dispatcher)["regs_per_thread"]
            row.update(
                Br=Br, Bc=Bc, threads=nt, rel_err_vs_alg3=errs, smem=cfg.sram_bytes, compile_s=compile_s, regs=regs
            )
            print(
                f"      rel err vs Alg.3 {['%.1e' % e for e in errs]}  regs {regs}  smem {cfg.sram_bytes}  first call "
                f"{compile_s:.1f}s",
                flush=True,
            )
    for impl in ("torch_naive", "sdpa_mem_efficient"):
        qg, kg_, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
        attn = bu.torch_naive_attention if impl == "torch_naive" else bu.torch_sdpa_mem_efficient
        xs = (qg, kg_, vg)
        timed(f"{impl} forward", lambda attn=attn, xs=xs: attn(*xs), f_fwd)
        timed(f"{impl} forward+backward", lambda attn=attn, xs=xs: torch.autograd.grad(attn(*xs), xs, g), f_fwd + f_bwd)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.alg4_sweep``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--json", default=None, help="write the rows (and provenance) here after each head dimension")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dims", default="64,128", help="head dimensions, comma-separated")
    ap.add_argument("--dry-run", action="store_true", help="list the candidates and their SRAM; run nothing")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    dims = [int(x) for x in args.dims.split(",")]
    if args.dry_run:
        return dry_run(dims, args.seqlen)
    if not bu.ON_GPU:
        print("alg4_sweep needs a GPU (or --dry-run)")
        return 1
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    print(bu.provenance(), flush=True)
    sgemm = bu.sgemm_tflops()
    print(f"SGEMM 4096^3 fp32: {sgemm:.1f} TFLOP/s", flush=True)
    for d in dims:
        sweep_headdim(d, args.seqlen, args.repeats, rows)  # its tensors are freed when it returns
        bu.free_memory()
        if args.json:  # after every head dimension, so that a run cut short keeps what it measured
            with open(args.json, "w") as fh:
                json.dump(dict(provenance=bu.provenance(), sgemm_tflops=sgemm, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
