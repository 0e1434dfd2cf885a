"""GQA/MQA: summing the per-query-head dK, dV of a group into their shared K/V head.

Used by both FA1 Algorithm 4 backward kernels (readable and fast): their grid has one block per
*query* head, so under grouped-query attention (``nheads = G * nheads_k``) each block writes its
partial ``dK, dV`` to an O(N)-per-head scratch array and :func:`group_sum` adds each group of ``G``
in a fixed order (deterministic, no atomics).
"""

from __future__ import annotations

from numba import cuda, float32

from .._launch import Problem, bh_grid, ceil_div
from ..runtime import backend as _backend


@cuda.jit
def group_sum_kernel(gdK_h, gdV_h, gdK, gdV, s_k, d, nheads_k, group):
    """dK[b, :, hk] = sum_g dK_h[b, :, hk*G + g] (and dV): the GQA/MQA reduction over a group."""
    idx = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    bhk = cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z  # b*h_k folded over grid y, z (y <= 65535)
    bi = bhk // nheads_k
    hk = bhk - bi * nheads_k
    if idx < s_k * d and bi < gdK.shape[0]:
        col = idx // d
        c = idx - col * d
        acc_k = float32(0.0)
        acc_v = float32(0.0)
        for g in range(group):
            acc_k += gdK_h[bi, col, hk * group + g, c]  # HBM read: G*N*d
            acc_v += gdV_h[bi, col, hk * group + g, c]
        gdK[bi, col, hk, c] = acc_k  # HBM write: N*d
        gdV[bi, col, hk, c] = acc_v


def per_head_grads(dk, dv, prob: Problem, alloc):
    """Where a per-query-head kernel writes dK, dV: ``dk, dv`` themselves when G = 1, else scratch."""
    if prob.group == 1:
        return dk, dv
    shape = (prob.batch, prob.seqlen_k, prob.nheads, prob.headdim)
    return alloc.empty(shape), alloc.empty(shape)


def group_sum(dk_h, dv_h, dk, dv, prob: Problem) -> None:
    """Launch :func:`group_sum_kernel` (nothing to do when G = 1: the kernel wrote dk, dv directly)."""
    if prob.group == 1:
        return
    nt = 64 if _backend.is_simulator() else 256  # the simulator runs each thread as a Python thread
    grid = bh_grid(ceil_div(prob.seqlen_k * prob.headdim, nt), prob.batch * prob.nheads_k)
    group_sum_kernel[grid, nt](dk_h, dv_h, dk, dv, prob.seqlen_k, prob.headdim, prob.nheads_k, prob.group)
