"""The (batch, head) of a thread block: the one grid decode every kernel uses.

FA2's kernels (and the pre-pass, Algorithm 0 and Algorithm 3) run a grid ``(n_x, y, z)`` made by
:func:`numba_flash._launch.bh_grid`: ``batch * nheads`` blocks folded over grid y and z, because y stops at
65535. FA1's Algorithms 1, 4 and 5 run one block per (batch, head) along x. Both decode their index here;
a kernel that gets ``b >= batch`` is past ``batch * nheads`` in the last z slab of the fold and returns.
"""

from __future__ import annotations

from numba import cuda


@cuda.jit(device=True, inline=True)
def folded_batch_head(nheads):
    """``(bh, b, h)`` of this block, ``bh = b * nheads + h`` folded over grid y, z (``y <= 65535``)."""
    bh = cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z
    b = bh // nheads
    return bh, b, bh % nheads


@cuda.jit(device=True, inline=True)
def batch_head(nheads):
    """``(bh, b, h)`` of this block, one block per (batch, head) along grid x (FA1's grid)."""
    bh = cuda.blockIdx.x
    b = bh // nheads
    return bh, b, bh % nheads
