"""Time the fast FFMA backward with and without ``HEAD_SUMS`` on GQA shapes, on a GPU.

:mod:`numba_flash.fast.fa2_backward`'s ``HEAD_SUMS`` (the GQA default) adds each query head's ``dK_j, dV_j`` to the
group's sum in HBM at the head's last block instead of summing the whole group in one register: ``G - 1``
read-modify-writes of the block's ``Bc x d`` tiles more per block. For each head dim, group size and causal flag at
the grid's 16k tokens (b N = 16384, 2048 / d query heads), the backward alone (pre-pass and main kernel, after the
FFMA forward), off and on, alternating twice; each timing the median of 10, each of 5 back-to-back calls
(:func:`bench.common.cuda_time_ms`). Prints one line per (shape, setting) and the ratio off / on.

    python -m bench.head_sums_probe [--seqlens 1024 4096] [--headdims 64 128] [--groups 4 8]
"""

from __future__ import annotations

import argparse

from . import common as bu


def _backward(torch, n, d, group, causal, head_sums):
    """The fast backward's callable on one GQA shape, ``HEAD_SUMS`` as given."""
    from numba_flash._launch import Allocator, check_attention_args
    from numba_flash.fast import fa2_backward, fa2_forward

    h, b = 2048 // d, 16384 // n
    q, k, v = bu.make_inputs(b, h, n, d, nheads_k=h // group, seed=n + d + group)
    dout = torch.randn_like(q)
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    alloc = Allocator(q)
    kq, kk, kv, kdo = (alloc.to_kernel(x) for x in (q, k, v, dout))
    fwd = fa2_forward.forward(kq, kk, kv, prob, alloc)
    return lambda: fa2_backward.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, features={"HEAD_SUMS": head_sums})


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.head_sums_probe``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 8])
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    torch = bu.torch_or_none()
    if torch is None or not bu.ON_GPU:
        print("head_sums_probe needs a GPU")
        return 1
    print(bu.header_line(torch))
    for d in args.headdims:
        for n in args.seqlens:
            for group in args.groups:
                for causal in (False, True):
                    fns = {hs: _backward(torch, n, d, group, causal, hs) for hs in (False, True)}
                    for fn in fns.values():
                        fn()  # compile
                    times = {False: [], True: []}
                    for _ in range(2):
                        for hs in (False, True):
                            times[hs].append(bu.cuda_time_ms(fns[hs], warmup=1, repeats=10, calls=5)[0])
                    off, on = min(times[False]), min(times[True])
                    print(
                        f"d={d:4} N={n:6} group={group:2} causal={int(causal)}  off {off:8.3f} ms  on {on:8.3f} ms  "
                        f"off/on {off / on:.3f}",
                        flush=True,
                    )
                    bu.free_memory()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
