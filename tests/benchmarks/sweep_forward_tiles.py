"""Tile sweep of the FA1 forward kernel on a GPU (llm.c style), beside the standard path's launches.

For one FA2-convention shape (16k tokens, hidden 2048) it times :mod:`numba_flash.alg1_forward` over
block sizes (Br, Bc) and thread layouts (TY, TX) that fit numba-cuda's 48 KB of static shared memory,
and the three launches of :mod:`numba_flash.alg0_standard` one by one, and prints one row each with
time, TFLOP/s, registers, shared memory and theoretical occupancy. This is how the defaults of
``alg1_forward`` were chosen; it is not part of the test suite.

Usage (GPU)::

    python tests/benchmarks/sweep_forward_tiles.py --seqlen 4096 --headdim 64 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_utils as bu

from numba_flash import _inspect, alg0_standard, alg1_forward
from numba_flash._launch import Allocator, check_attention_args
from numba_flash._matmul import MatmulTiles, matmul, matmul_kernel

#: (Br, Bc, (TY, TX), shuffles) candidates per head dim; the default rule's choice comes first.
CANDIDATES = {
    64: [(None, None, (8, 16), True), (32, 48, (16, 16), True), (32, 48, (32, 16), True), (16, 64, (16, 16), True),
         (32, 32, (32, 16), True), (16, 64, (8, 16), True), (24, 48, (8, 16), False), (16, 64, (4, 32), True)],
    128: [(None, None, (8, 16), True), (16, 24, (16, 16), True), (16, 24, (16, 8), True), (16, 16, (16, 16), True),
          (8, 32, (8, 32), True)],
}


def sweep(seqlen, headdim, repeats=5):
    torch = bu.torch_or_none()
    shape = bu.fa2_shape(seqlen, headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=1)
    prob = check_attention_args(q, k, v)
    flops = bu.flops_forward(b, h, n, n, d)
    ref = bu.torch_naive_attention(q, k, v)
    rows = []

    def record(name, seconds, fl, kernel=None, threads=None, blocks=None, err=None, **extra):
        row = dict(name=name, N=n, d=d, batch=b, nheads=h, ms=seconds * 1e3, tflops=bu.tflops(fl, seconds), max_err_vs_torch=err, **extra)
        if kernel is not None:
            row.update(_inspect.kernel_report(kernel, threads, grid_blocks=blocks))
        rows.append(row)
        print(f"{name:44s} {row['ms']:9.2f} ms {row['tflops']:6.2f} TFLOP/s  regs={row.get('regs_per_thread')} "
              f"smem={row.get('shared_mem_per_block')} occ={row.get('occupancy')} err={err}", flush=True)

    for Br, Bc, threads, shuffles in CANDIDATES.get(d, CANDIDATES[64][:1]):
        bs = None if Br is None else (Br, Bc)
        try:
            alg1_forward.choose_block_sizes(d, block_sizes=bs, threads=threads, shuffles=shuffles)
        except ValueError as exc:
            print(f"skip {bs} {threads}: {exc}")
            continue
        state = {}

        def fa1():
            alloc = Allocator(q)
            fwd, kern, tiles, _ = alg1_forward.launch(alloc.to_kernel(q), alloc.to_kernel(k), alloc.to_kernel(v), prob, alloc,
                                                      block_sizes=bs, threads=threads, shuffles=shuffles)
            state.update(kern=kern, tiles=tiles, out=alloc.result(fwd.out))
            return fwd

        t = bu.time_median(fa1, warmup=1, repeats=repeats)
        err = float((state["out"] - ref).abs().max())
        record(f"flash1 tiles={state['tiles']} threads={threads} shfl={int(shuffles)}", t, flops, state["kern"],
               threads[0] * threads[1], b * h, err, tiles=list(state["tiles"]), layout=list(threads), shuffles=shuffles)

    # The standard path, whole and launch by launch.
    t = bu.time_median(lambda: alg0_standard.forward(q, k, v, prob, Allocator(q)), warmup=1, repeats=repeats)
    alloc = Allocator(q)
    out = alloc.result(alg0_standard.forward(q, k, v, prob, alloc).out)
    record("standard (3 launches)", t, flops, err=float((out - ref).abs().max()))
    S = torch.empty((b, h, n, n), device="cuda")
    m, l, lse = (torch.empty((b, h, n), device="cuda") for _ in range(3))
    o = torch.empty_like(q)
    t_qk = bu.time_median(lambda: matmul(q, k, S, a_layout="bshd", b_layout="bshd", c_layout="bhst", trans_b=True,
                                         alpha=prob.softmax_scale), warmup=1, repeats=repeats)
    kernels = alg0_standard.compiled_kernels(prob)
    record("  standard L1: S = tau QK^T", t_qk, flops / 2, kernels[0][1], kernels[0][2], kernels[0][3])
    for tiles in (MatmulTiles(16, 16, 4, 4, 16, max_registers=128), MatmulTiles(16, 16, 4, 4, 8), MatmulTiles(16, 16, 8, 4, 8, max_registers=255)):
        t_v = bu.time_median(lambda: matmul(q, k, S, a_layout="bshd", b_layout="bshd", c_layout="bhst", trans_b=True,
                                            alpha=prob.softmax_scale, tiles=tiles), warmup=1, repeats=repeats)
        kv = matmul_kernel("bshd", False, "bshd", True, "bhst", False, False, False, tiles)
        record(f"  variant S = tau QK^T {tiles}", t_v, flops / 2, kv, tiles.threads, kernels[0][3] * 64 // tiles.BM)
        t_v = bu.time_median(lambda: matmul(S, v, o, a_layout="bhst", b_layout="bshd", c_layout="bshd", tiles=tiles), warmup=1, repeats=repeats)
        kv = matmul_kernel("bhst", False, "bshd", False, "bshd", False, False, False, tiles)
        record(f"  variant O = PV {tiles}", t_v, flops / 2, kv, tiles.threads, kernels[2][3] * 64 // tiles.BM)
    sm = alg0_standard.row_softmax_kernel(alg0_standard.SOFTMAX_THREADS, alg0_standard.SOFTMAX_ROWS)
    grid = (-(-n // alg0_standard.SOFTMAX_ROWS), b * h)
    t_sm = bu.time_median(lambda: sm[grid, (alg0_standard.SOFTMAX_THREADS, alg0_standard.SOFTMAX_ROWS)](S, m, l, lse),
                          warmup=1, repeats=repeats)
    record("  standard L2: P = softmax(S)", t_sm, 0.0, kernels[1][1], kernels[1][2], kernels[1][3],
           gb_per_s=3 * S.numel() * 4 / t_sm / 1e9)
    t_pv = bu.time_median(lambda: matmul(S, v, o, a_layout="bhst", b_layout="bshd", c_layout="bshd"), warmup=1, repeats=repeats)
    record("  standard L3: O = PV", t_pv, flops / 2, kernels[2][1], kernels[2][2], kernels[2][3])
    del S
    bu.free_memory()
    record("torch naive", bu.time_median(lambda: bu.torch_naive_attention(q, k, v), warmup=1, repeats=repeats), flops)
    record("torch SDPA mem-efficient", bu.time_median(lambda: bu.torch_sdpa_mem_efficient(q, k, v), warmup=1, repeats=repeats), flops)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, nargs="+", default=[4096])
    ap.add_argument("--headdim", type=int, nargs="+", default=[64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not bu.ON_GPU:
        raise SystemExit("needs a GPU")
    torch = bu.torch_or_none()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = [dict(sgemm_tflops=bu.sgemm_tflops(), **bu.provenance())]
    print(f"cuBLAS SGEMM: {rows[0]['sgemm_tflops']:.1f} TFLOP/s  [{rows[0]['device']}]")
    for d in args.headdim:
        for n in args.seqlen:
            rows += sweep(n, d, args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
