"""A model of the causal forward's tail: how long the GPU takes to run the blocks in one order or the other.

No GPU is needed. Under a causal mask the forward's query block ``i`` (of ``Tr``) visits ``ceil((i + 1) Br / Bc)`` key
blocks, so the blocks' work differs up to ``Tr``-fold. A GPU starts the blocks in the order of their linear number,
each on the first free slot (``slots`` = SMs x blocks per SM). The model gives each block ``fixed + key blocks``
units of time (``fixed``: the per-block work that does not depend on ``i``, in key-block units) and runs list
scheduling, for two orders of the same blocks:

* **per head** (the kernels' order before ``HEAVY_FIRST``): head after head, each head's blocks from the last (the
  heaviest) down, so the heads that start last bring their heaviest blocks into the final wave;
* **heavy first** (:func:`numba_flash.fast._tiles.make_query_block_order` with ``HEAVY_FIRST``): every head's last
  block first, then every head's one before it ... (longest processing time first).

It prints, per tiling and N (the grid's 16k tokens: ``b N = 16384``, ``2048 / d`` heads), each order's makespan over
the perfect balance (total work / slots) and their ratio, the speed-up the model predicts for ``HEAVY_FIRST``. It knows
nothing of how co-resident blocks share an SM, so it bounds the gain rather than predicting it::

    python -m bench.block_order_model [--seqlens 1024 4096] [--fixed 2]
"""

from __future__ import annotations

import argparse
import heapq

#: (name, d, Br, Bc, blocks per SM) of the 3xTF32 forward's causal tilings (fa2_forward_tc.config_for; SRAM-bound)
TILINGS = (("d128 4x1x32", 128, 64, 32, 2), ("d128 8x2x16", 128, 256, 16, 1), ("d64 4x2x32", 64, 128, 32, 2))
SMS = 132  # H100 SXM


def makespan(works, slots: int) -> float:
    """List scheduling: each block, in order, on the slot that frees first; the time the last one ends."""
    free = [0.0] * slots
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def orders(n: int, d: int, br: int, bc: int, fixed: float):
    """(per-head order, heavy-first order) of the blocks' work at sequence length ``n``."""
    n_bh = (16384 // n) * (2048 // d)
    tr = -(-n // br)
    work = [fixed + -(-((i + 1) * br) // bc) for i in range(tr)]
    per_head = [work[tr - 1 - x] for _ in range(n_bh) for x in range(tr)]
    heavy_first = [work[tr - 1 - x] for x in range(tr) for _ in range(n_bh)]
    return per_head, heavy_first


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.block_order_model``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument(
        "--fixed", type=float, default=2.0, help="per-block work independent of i, in key blocks (default 2)"
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    print(f"{'tiling':12} {'N':>6} {'per head':>9} {'heavy 1st':>9} {'speed-up':>8}   (makespan / perfect balance)")
    for name, d, br, bc, per_sm in TILINGS:
        slots = SMS * per_sm
        for n in args.seqlens:
            per_head, heavy_first = orders(n, d, br, bc, args.fixed)
            ideal = sum(per_head) / slots
            a, b = makespan(per_head, slots), makespan(heavy_first, slots)
            print(f"{name:12} {n:>6} {a / ideal:9.3f} {b / ideal:9.3f} {a / b:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
