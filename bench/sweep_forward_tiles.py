"""Tile sweep of the readable FA1 forward kernel on a GPU (llm.c style), beside the standard path's launches.

For one FA2-convention shape (16k tokens, hidden 2048) it times the readable
:mod:`numba_flash.alg1_forward` over block sizes (Br, Bc) and thread layouts (TY, TX) that fit
numba-cuda's 48 KB of static shared memory, and the three launches of :mod:`numba_flash.alg0_standard`
one by one (with a few alternative GEMM tilings), and prints one row each with time, TFLOP/s,
registers, shared memory and theoretical occupancy. This is how the defaults of the readable
``alg1_forward`` were chosen; it is not part of the test suite, and no output of it is committed.

Usage (GPU, from the repository root)::

    python3 -m bench.sweep_forward_tiles --seqlen 4096 --headdim 64 [--json out.json]

``--dry-run`` lists the candidate tiles and their shared memory without running anything (works in
the simulator).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from numba_flash import alg0_standard, alg1_forward
from numba_flash._launch import Allocator, check_attention_args
from numba_flash._matmul import MatmulTiles, matmul, matmul_kernel
from numba_flash.runtime import resources as _inspect

from bench import common as bu

#: (Br, Bc, (TY, TX), shuffles) candidates per head dim; the default rule's choice comes first.
CANDIDATES = {
    64: [
        (None, None, (8, 16), True),
        (32, 48, (16, 16), True),
        (32, 48, (32, 16), True),
        (16, 64, (16, 16), True),
        (32, 32, (32, 16), True),
        (16, 64, (8, 16), True),
        (24, 48, (8, 16), False),
        (16, 64, (4, 32), True),
    ],
    128: [
        (None, None, (8, 16), True),
        (16, 24, (16, 16), True),
        (16, 24, (16, 8), True),
        (16, 16, (16, 16), True),
        (8, 32, (8, 32), True),
    ],
}
#: Alternative tilings of the standard path's two GEMMs.
GEMM_TILES = (MatmulTiles(16, 16, 4, 4, 8),)


def candidates(d):
    return CANDIDATES.get(d, CANDIDATES[64][:1])


def dry_run(seqlens, headdims):
    for d in headdims:
        for Br, Bc, threads, shuffles in candidates(d):
            bs = None if Br is None else (Br, Bc)
            try:
                tiles = alg1_forward.paper_block_sizes(d, block_sizes=bs, threads=threads, shuffles=shuffles)
            except ValueError as exc:
                print(f"d={d} {bs} threads={threads}: skipped ({exc})")
                continue
            kb = 4 * alg1_forward.sram_footprint(*tiles, d, threads, shuffles) / 1024
            print(f"d={d} tiles={tiles} threads={threads} shfl={int(shuffles)}: {kb:.1f} KB SRAM")
        for n in seqlens:
            prob = bu.fa2_problem(n, d)
            for launch in alg0_standard.compiled_kernels(prob):
                print(f"d={d} N={n} standard {launch.name}: {launch.blocks} blocks of {launch.threads} threads")
    return 0


def sweep(seqlen, headdim, repeats=5):
    shape = bu.fa2_shape(seqlen, headdim)
    b, h, n, d = shape["batch"], shape["nheads"], shape["seqlen"], shape["headdim"]
    q, k, v = bu.make_inputs(b, h, n, d, seed=1)
    prob = check_attention_args(q, k, v)
    flops = bu.flops_forward(b, h, n, n, d)
    ref = bu.torch_naive_attention(q, k, v)
    rows = []

    def record(name, seconds, fl, kernel=None, threads=None, blocks=None, err=None, **extra):
        row = dict(
            name=name,
            N=n,
            d=d,
            batch=b,
            nheads=h,
            ms=seconds * 1e3,
            tflops=bu.tflops(fl, seconds),
            max_err_vs_torch=err,
            **extra,
        )
        if kernel is not None:
            row.update(_inspect.kernel_report(kernel, threads, grid_blocks=blocks))
        rows.append(row)
        print(
            f"{name:44s} {row['ms']:9.2f} ms {row['tflops']:6.2f} TFLOP/s  regs={row.get('regs_per_thread')} "
            f"smem={row.get('shared_mem_per_block')} occ={row.get('occupancy')} err={err}",
            flush=True,
        )

    for Br, Bc, threads, shuffles in candidates(d):
        bs = None if Br is None else (Br, Bc)
        try:
            alg1_forward.paper_block_sizes(d, block_sizes=bs, threads=threads, shuffles=shuffles)
        except ValueError as exc:
            print(f"skip {bs} {threads}: {exc}")
            continue
        state = {}

        def fa1(bs=bs, threads=threads, shuffles=shuffles, state=state):
            alloc = Allocator(q)
            fwd, kern, tiles, _ = alg1_forward.launch(
                alloc.to_kernel(q),
                alloc.to_kernel(k),
                alloc.to_kernel(v),
                prob,
                alloc,
                block_sizes=bs,
                threads=threads,
                shuffles=shuffles,
            )
            state.update(kern=kern, tiles=tiles, out=alloc.result(fwd.out))
            return fwd

        t = bu.time_median(fa1, warmup=1, repeats=repeats)
        err = float((state["out"] - ref).abs().max())
        record(
            f"flash1 tiles={state['tiles']} threads={threads} shfl={int(shuffles)}",
            t,
            flops,
            state["kern"],
            threads[0] * threads[1],
            b * h,
            err,
            tiles=list(state["tiles"]),
            layout=list(threads),
            shuffles=shuffles,
        )

    # The standard path, whole and launch by launch.
    t = bu.time_median(lambda: alg0_standard.forward(q, k, v, prob, Allocator(q)), warmup=1, repeats=repeats)
    alloc = Allocator(q)
    out = alloc.result(alg0_standard.forward(q, k, v, prob, alloc).out)
    record("standard (3 launches)", t, flops, err=float((out - ref).abs().max()))
    _standard_launches(q, k, v, prob, flops, repeats, record)
    bu.free_memory()
    record("torch naive", bu.time_median(lambda: bu.torch_naive_attention(q, k, v), warmup=1, repeats=repeats), flops)
    record(
        "torch SDPA mem-efficient",
        bu.time_median(lambda: bu.torch_sdpa_mem_efficient(q, k, v), warmup=1, repeats=repeats),
        flops,
    )
    return rows


def _standard_launches(q, k, v, prob, flops, repeats, record):
    """Time Algorithm 0's three launches one by one (and alternative GEMM tilings) on an N x N buffer of its own."""
    torch = bu.torch_or_none()
    b, n, h, d = q.shape
    S = torch.empty((b, h, n, n), device="cuda")
    m, l, lse = (torch.empty((b, h, n), device="cuda") for _ in range(3))
    o = torch.empty_like(q)

    def qk(tiles=None):
        return matmul(
            q,
            k,
            S,
            a_layout="bshd",
            b_layout="bshd",
            c_layout="bhst",
            trans_b=True,
            alpha=prob.softmax_scale,
            tiles=tiles,
        )

    def pv(tiles=None):
        return matmul(S, v, o, a_layout="bhst", b_layout="bshd", c_layout="bshd", tiles=tiles)

    qk_launch, softmax_launch, pv_launch = alg0_standard.compiled_kernels(prob)
    t_qk = bu.time_median(qk, warmup=1, repeats=repeats)
    record("  standard L1: S = tau QK^T", t_qk, flops / 2, qk_launch.dispatcher, qk_launch.threads, qk_launch.blocks)
    for tiles in GEMM_TILES:
        t_v = bu.time_median(lambda tiles=tiles: qk(tiles), warmup=1, repeats=repeats)
        kv = matmul_kernel("bshd", False, "bshd", True, "bhst", False, False, False, tiles)
        record(f"  variant S = tau QK^T {tiles}", t_v, flops / 2, kv, tiles.threads, qk_launch.blocks * 64 // tiles.BM)
        t_v = bu.time_median(lambda tiles=tiles: pv(tiles), warmup=1, repeats=repeats)
        kv = matmul_kernel("bhst", False, "bshd", False, "bshd", False, False, False, tiles)
        record(f"  variant O = PV {tiles}", t_v, flops / 2, kv, tiles.threads, pv_launch.blocks * 64 // tiles.BM)
    sm = alg0_standard.row_softmax_kernel(alg0_standard.SOFTMAX_THREADS, alg0_standard.SOFTMAX_ROWS)
    grid = (-(-n // alg0_standard.SOFTMAX_ROWS), b * h)
    t_sm = bu.time_median(
        lambda: sm[grid, (alg0_standard.SOFTMAX_THREADS, alg0_standard.SOFTMAX_ROWS)](S, m, l, lse),
        warmup=1,
        repeats=repeats,
    )
    record(
        "  standard L2: P = softmax(S)",
        t_sm,
        0.0,
        softmax_launch.dispatcher,
        softmax_launch.threads,
        softmax_launch.blocks,
        gb_per_s=3 * S.numel() * 4 / t_sm / 1e9,
    )
    t_pv = bu.time_median(pv, warmup=1, repeats=repeats)
    record("  standard L3: O = PV", t_pv, flops / 2, pv_launch.dispatcher, pv_launch.threads, pv_launch.blocks)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.sweep_forward_tiles``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, nargs="+", default=[4096])
    ap.add_argument("--headdim", type=int, nargs="+", default=[64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the rows (first: provenance and the SGEMM rate) to this file")
    ap.add_argument("--dry-run", action="store_true", help="list the candidate tiles and their SRAM; run nothing")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    if args.dry_run:
        return dry_run(args.seqlen, args.headdim)
    if not bu.ON_GPU:
        print("sweep_forward_tiles needs a GPU (or --dry-run)")
        return 1
    torch = bu.torch_or_none()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = [dict(sgemm_tflops=bu.sgemm_tflops(), **bu.provenance())]
    print(f"cuBLAS SGEMM: {rows[0]['sgemm_tflops']:.1f} TFLOP/s  [{rows[0]['device']}]")
    for d in args.headdim:
        for n in args.seqlen:
            rows += sweep(n, d, args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
