"""FlashAttention-2 Algorithm 2 line 4: the D pre-pass, shared by both FA2 backward kernels.

``D_i = rowsum(dO_i o O_i)`` is computed by one small kernel before the main backward kernel, so the
main loop never loads ``O`` (FA1 Algorithm 4 recomputed ``D_i`` inside every pass, line 19).
"""

from __future__ import annotations

from numba import cuda, float32

from .._launch import Problem, bh_grid, ceil_div
from ..runtime import smem as _smem
from .grid import folded_batch_head

#: Threads per block of the pre-pass: one per query row.
PREPASS_THREADS = 128


@cuda.jit
def preprocess_kernel(gO, gdO, gD):
    """D = rowsum(dO o O): thread per row; grid (ceil(N_q / 128), b h). gD is (b, h, N_q)."""
    nheads = gO.shape[2]
    _, b, h = folded_batch_head(nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
    row = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if row < gO.shape[1] and b < gO.shape[0]:
        # [doc:fa2-bwd-preprocess]
        # FA2.2 L4: D_i = rowsum(dO_i o O_i), written to HBM (a separate pre-pass)
        acc = float32(0.0)
        for x in range(gO.shape[3]):
            acc += gdO[b, row, h, x] * gO[b, row, h, x]  # HBM read: 2d per row
        gD[b, h, row] = acc  # HBM write: 1 per row
        # [/doc:fa2-bwd-preprocess]


def row_dot(out, dout, prob: Problem, alloc):
    """D (b, h, N_q) float32: launches :func:`preprocess_kernel` and returns its output."""
    delta = alloc.empty((prob.batch, prob.nheads, prob.seqlen_q))
    grid = bh_grid(ceil_div(prob.seqlen_q, PREPASS_THREADS), prob.batch * prob.nheads)
    # preprocess_kernel[grid, PREPASS_THREADS](out, dout, delta), through the launch that skips numba's per-launch host work
    _smem.launch(preprocess_kernel, grid, PREPASS_THREADS, 0, out, dout, delta)
    return delta


def allocate_grads(prob: Problem, alloc, deterministic: bool):
    """(dQ, dK, dV) of an FA2 backward: dQ zeroed for the atomic adds (the deterministic kernel writes
    every row, so it gets an empty array); dK, dV empty (each column block writes its own rows)."""
    shape_q = (prob.batch, prob.seqlen_q, prob.nheads, prob.headdim)
    shape_k = (prob.batch, prob.seqlen_k, prob.nheads_k, prob.headdim)
    dq = alloc.empty(shape_q) if deterministic else alloc.zeros(shape_q)
    return dq, alloc.empty(shape_k), alloc.empty(shape_k)
