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


# The prologues of the fast kernels: this block's heads and the problem's sizes, read from the arrays
# ``gQ (b, s_q, h, d)``, ``gK (b, s_k, h_k, d)``. A kernel that gets ``b >= gQ.shape[0]`` returns.


@cuda.jit(device=True, inline=True)
def folded_query_head(gQ, gK):
    """``(nheads, b, h, s_q, s_k, d)`` of a query-block grid (FA2's forward, the fast dQ kernel): query head ``h`` of
    batch ``b`` (:func:`folded_batch_head`). The kernel forms ``hk = h // group`` after its ``b`` test: formed here,
    before the test, the division changed the d = 64 fast forward's machine code."""
    nheads = gQ.shape[2]
    _, b, h = folded_batch_head(nheads)
    return nheads, b, h, gQ.shape[1], gK.shape[1], gQ.shape[3]


@cuda.jit(device=True, inline=True)
def folded_kv_head(gQ, gK):
    """``(nheads, b, hk, s_q, s_k, d)`` of a key-block grid (FA2's backward): key/value head ``hk`` of batch ``b``
    (:func:`folded_batch_head` over ``b * h_k``)."""
    _, b, hk = folded_batch_head(gK.shape[2])
    return gQ.shape[2], b, hk, gQ.shape[1], gK.shape[1], gQ.shape[3]


@cuda.jit(device=True, inline=True)
def query_head(gQ, gK, group):
    """``(bh, b, h, hk, s_q, s_k, d)`` of FA1's grid (:func:`batch_head`): ``bh = b * nheads + h`` (also the
    dropout hash's head index), key/value head ``hk = h // group`` (GQA/MQA)."""
    bh, b, h = batch_head(gQ.shape[2])
    return bh, b, h, h // group, gQ.shape[1], gK.shape[1], gQ.shape[3]
