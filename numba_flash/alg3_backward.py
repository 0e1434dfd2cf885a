"""FA1 Algorithm 3 on the GPU: the standard attention backward pass, P, dP and dS in device memory.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 3 (Appendix B.2) and Theorem 5. The
float64 twin is :mod:`numba_flash_reference.alg3_backward`; the recomputation backward that this one
is the baseline for is :mod:`numba_flash.alg4_backward` (Algorithm 4).

What a reader learns
--------------------
The standard backward pass is five matrix products and one row-wise elementwise step, each a separate
kernel that reads its operands from HBM and writes its result back to HBM, three of them N x N per
head (``P``, ``dP``, ``dS``): Theta(N d + N^2) HBM accesses and Theta(N^2) extra memory per head. It is
built *fairly*: every product is the shared-memory tiled, register-blocked kernel of
:mod:`numba_flash._matmul` (the same one the standard forward uses), reading the ``(b, s, h, d)``
layouts through their strides, with GQA/MQA handled in the index arithmetic and the group sum of dK, dV
fused into the product. Its cost is the N x N traffic, not a weak kernel.

The passes (``tau`` = softmax scale, ``Z`` the dropout scale matrix, regenerated from the seed)::

    (Dev)  S = tau Q K^T (masked)          matmul            -> S_P   (b, h, s_q, s_k) HBM
    (Dev)  P = exp(S - m) / l              softmax_kernel    S_P -> S_P, in place
    L1     dV = (P o Z)^T dO               matmul (Z applied to P as it is loaded; group sum fused)
    L2     dP = dO V^T                     matmul            -> dP    (b, h, s_q, s_k) HBM
    L3     D_i = sum_l P_il dP_il Z_il,    ds_kernel         -> dS    (b, h, s_q, s_k) HBM
           dS = P o (dP o Z - D)
    L4     dQ = tau dS K                   matmul
    L5     dK = tau dS^T Q                 matmul (group sum fused)

Launch geometry: the products are :func:`numba_flash._matmul.matmul` launches (grid over output tiles
and (batch, head)); the two row kernels run one thread block per (query row, batch * head), ``NT``
threads striding over the row's ``s_k`` columns (coalesced), the dS kernel with a shared-memory tree
reduction for ``D_i``. SRAM: the matmul's slabs (8.3 KB) and ``NT`` floats for the reduction.

Peak extra memory: three ``(b, h, s_q, s_k)`` float32 matrices, ``12 b h s_q s_k`` bytes (25.8 GB at
b = 4, h = 32, N = 4096): the O(N^2) that Algorithm 4 removes.

Run it through the public API (``algorithm="standard"``; on a machine without a GPU this runs in
Numba's CUDA simulator)::

    >>> import numpy as np
    >>> from numba_flash import attention_numpy, attention_backward_numpy
    >>> q, k, v, do = np.random.default_rng(0).standard_normal((4, 1, 12, 2, 4)).astype(np.float32)
    >>> out, stats = attention_numpy(q, k, v, algorithm="standard", return_stats=True)
    >>> dq, dk, dv = attention_backward_numpy(do, q, k, v, out, stats)
    >>> dq.shape, dk.shape
    ((1, 12, 2, 4), (1, 12, 2, 4))

Tests: ``python -m pytest tests/kernels/test_backward_kernels.py tests/test_autograd.py -k standard``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from ._launch import KernelLaunch, bh_grid
from ._matmul import default_tiles, matmul, matmul_kernel
from .device.dropout import head_key, keep, row_key
from .device.grid import folded_batch_head
from .runtime import backend as _backend


def row_threads() -> int:
    """Threads per row of the two row kernels (the simulator runs each thread as a Python thread)."""
    return 8 if _backend.is_simulator() else 256


@functools.cache
def softmax_kernel(nt: int, from_lse: bool):
    """P = exp(S - m) / l row by row, in place over S: the forward's P (Algorithm 0 line 2), bit for bit
    when S, m, l are the standard forward's. ``from_lse``: only L = m + log l was saved, P = exp(S - L).
    A row that sees no key (l = 0, L = +inf) gets P = 0; a masked entry (S = -inf) gets exp(-inf) = 0."""
    NT = nt
    FROM_LSE = bool(from_lse)
    ZERO = float32(0.0)
    INF = float32(math.inf)

    @cuda.jit
    def kernel(gS_P, gm, gl, s_k, nheads):
        """Block (row, bh): NT threads stride over the row's columns. gS_P: (b, h, s_q, s_k) HBM."""
        row = cuda.blockIdx.x
        _, bi, hi = folded_batch_head(nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if bi >= gS_P.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        m_r = gm[bi, hi, row]  # HBM read: 1 (L when FROM_LSE)
        l_r = float32(1.0)
        if FROM_LSE:
            if m_r == INF:
                l_r = ZERO
        else:
            l_r = gl[bi, hi, row]  # HBM read: 1
        for col in range(cuda.threadIdx.x, s_k, NT):
            p = ZERO
            if l_r != ZERO:  # l = 0: the row sees no key; NaN statistics give NaN
                s = gS_P[bi, hi, row, col]  # HBM read: N
                p = math.exp(s - m_r) / l_r
            gS_P[bi, hi, row, col] = p  # HBM write: N

    return kernel


@functools.cache
def ds_kernel(nt: int, dropout: bool):
    """dS = P o (dP o Z - D) with D_i = sum_l P_il (dP o Z)_il: Algorithm 3 line 3, one row per block."""
    NT = nt
    DROPOUT = bool(dropout)
    ZERO = float32(0.0)

    @cuda.jit
    def kernel(gP, gdP, gdS, s_k, nheads, seed, threshold, dropout_scale):
        """Block (row, bh): partial sums of P o dP o Z over strided columns, a tree reduction, then dS."""
        sRed = cuda.shared.array(NT, float32)  # (NT,) SRAM: partial sums of D_i
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        bh, bi, hi = folded_batch_head(nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if bi >= gP.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        k_row = row_key(head_key(seed, bh), row)
        acc = ZERO
        for col in range(t, s_k, NT):
            z = float32(1.0)
            if DROPOUT:
                z = dropout_scale if keep(k_row, col, threshold) else ZERO
            acc += gP[bi, hi, row, col] * (gdP[bi, hi, row, col] * z)  # HBM read: 2N
        sRed[t] = acc
        cuda.syncthreads()  # Sync: every partial sum in SRAM before the tree reduction reads them
        stride = NT // 2
        while stride > 0:
            if t < stride:
                sRed[t] += sRed[t + stride]
            cuda.syncthreads()  # Sync: this level of the reduction is complete before the next reads it
            stride //= 2
        D_i = sRed[0]
        for col in range(t, s_k, NT):
            z = float32(1.0)
            if DROPOUT:
                z = dropout_scale if keep(k_row, col, threshold) else ZERO
            gdS[bi, hi, row, col] = gP[bi, hi, row, col] * (gdP[bi, hi, row, col] * z - D_i)  # HBM read: 2N, write: N

    return kernel


def choose_block_sizes(prob, block_sizes=None) -> tuple[int, int]:
    """The kernel contract's (Br, Bc): here the (BM, BN) output tile of the GEMMs (no (Br, Bc) tiling)."""
    t = default_tiles()
    return t.BM, t.BN


def sram_bytes(prob, block_sizes=None) -> int:
    """Static shared memory per block of the largest kernel (the GEMMs), in bytes."""
    return max(default_tiles().sram_bytes, 4 * row_threads())


def compiled_kernels(prob, block_sizes=None) -> list[KernelLaunch]:
    """The row kernels and the GEMMs one call launches, compiled for ``prob`` (not launched)."""
    t = default_tiles()
    b, s_q, s_k, h, d = prob.batch, prob.seqlen_q, prob.seqlen_k, prob.nheads, prob.headdim
    drop = prob.dropout_p > 0.0
    nt = row_threads()
    gemm = -(-s_q // t.BM) * b * h
    return [
        KernelLaunch("S = tau QK^T", matmul_kernel("bshd", False, "bshd", True, "bhst", False, prob.causal, False, t),
                     t.threads, -(-s_k // t.BN) * gemm),
        KernelLaunch("P = softmax(S)", softmax_kernel(nt, True), nt, s_q * b * h),
        KernelLaunch("dS = P o (dP - D)", ds_kernel(nt, drop), nt, s_q * b * h),
        KernelLaunch("dQ = tau dS K", matmul_kernel("bhst", False, "bshd", False, "bshd", False, False, False, t),
                     t.threads, -(-d // t.BN) * gemm),
    ]


def backward(dout, q, k, v, out, fwd, prob, alloc, block_sizes=None, deterministic=False):
    """FA1 Algorithm 3 on kernel arrays: ``(dq, dk, dv)`` through P, dP, dS in device memory.

    Symbol table (paper symbol -> variable -> memory space):

    ================  ================  ==========================================
    S, then P         S_P               HBM (b, h, s_q, s_k), P written over S
    dP                dP                HBM (b, h, s_q, s_k)
    dS                dS                HBM (b, h, s_q, s_k)
    D_i               sRed -> D_i       SRAM (NT,) tree reduction -> register
    Z_ij              z                 register (regenerated from the seed)
    dQ, dK, dV        dq, dk, dv        HBM
    tau               tau               host scalar, passed to the products
    ================  ================  ==========================================

    Parameters
    ----------
    dout, q, out : float32 kernel arrays, (b, s_q, h, d), any strides
    k, v : float32 kernel arrays, (b, s_k, h_k, d)
    fwd : :class:`~numba_flash._launch.ForwardOutput`: ``m, l`` (b, h, s_q) of the forward, or when they
        are None its logsumexp ``lse``
    prob : :class:`~numba_flash._launch.Problem`
    alloc : :class:`~numba_flash._launch.Allocator`
    block_sizes : ignored (the products use :mod:`numba_flash._matmul`'s tiles; there is no (Br, Bc))
    deterministic : accepted for the common signature; every pass here is deterministic

    Returns
    -------
    dq (b, s_q, h, d), dk, dv (b, s_k, h_k, d): float32 kernel arrays; dk, dv summed over GQA groups.
    """
    b, s_q, s_k, h, h_k, d = prob.batch, prob.seqlen_q, prob.seqlen_k, prob.nheads, prob.nheads_k, prob.headdim
    G, tau = prob.group, prob.softmax_scale
    nt = row_threads()
    use_dropout = prob.dropout_p > 0.0
    drop = (prob.seed, prob.threshold, prob.dropout_p) if use_dropout else None
    dropout_scale = np.float32(prob.dropout_scale)
    dq = alloc.empty((b, s_q, h, d))
    dk = alloc.empty((b, s_k, h_k, d))
    dv = alloc.empty((b, s_k, h_k, d))

    # Dev: Algorithm 3 starts from the forward's P in HBM. The autograd function saves only O(N) per
    # head (m, l, L), so P is first recomputed and materialized the way the standard forward made it:
    # S = tau Q K^T (masked) to HBM by the same tiled matmul, then P = exp(S - m) / l in place (the
    # forward's P bit for bit; exp(S - L) when only L was saved). This adds one product and one N x N
    # pass to the baseline; Algorithm 4 recomputes P too, but on chip.
    S_P = alloc.empty((b, h, s_q, s_k))  # (b, h, N, N) HBM: S, then P
    matmul(q, k, S_P, a_layout="bshd", b_layout="bshd", c_layout="bhst", trans_b=True, b_kv=True, kv_group=G,
           alpha=tau, causal_offset=prob.causal_offset if prob.causal else None)
    from_lse = fwd.m is None or fwd.l is None
    m, l = (fwd.lse, fwd.lse) if from_lse else (fwd.m, fwd.l)
    softmax_kernel(nt, from_lse)[bh_grid(s_q, b * h), nt](S_P, m, l, s_k, h)

    # [doc:alg3-backward]
    # Alg.3 L1: load P, dO; dV = (P o Z)^T dO (Z regenerated from the seed as P is loaded), summed over
    # each GQA group inside the product; write dV
    matmul(S_P, dout, dv, a_layout="bhst", b_layout="bshd", c_layout="bshd", trans_a=True, c_kv=True, kv_group=G, dropout=drop)
    # Alg.3 L2: load dO, V; dP = dO V^T; write dP (N x N). Z is applied at line 3, where dP is read.
    dP = alloc.empty((b, h, s_q, s_k))  # (b, h, N, N) HBM
    matmul(dout, v, dP, a_layout="bshd", b_layout="bshd", c_layout="bhst", trans_b=True, b_kv=True, kv_group=G)
    # Alg.3 L3: read P, dP; dS_ij = P_ij (dP_ij Z_ij - D_i), D_i = sum_l P_il dP_il Z_il; write dS (N x N)
    dS = alloc.empty((b, h, s_q, s_k))  # (b, h, N, N) HBM
    ds_kernel(nt, use_dropout)[bh_grid(s_q, b * h), nt](S_P, dP, dS, s_k, h, np.uint32(prob.seed), np.uint32(prob.threshold), dropout_scale)
    # Alg.3 L4: load dS, K; dQ = tau dS K; write dQ
    matmul(dS, k, dq, a_layout="bhst", b_layout="bshd", c_layout="bshd", b_kv=True, kv_group=G, alpha=tau)
    # Alg.3 L5: load dS, Q; dK = tau dS^T Q, summed over each GQA group inside the product; write dK
    matmul(dS, q, dk, a_layout="bhst", b_layout="bshd", c_layout="bshd", trans_a=True, c_kv=True, kv_group=G, alpha=tau)
    # [/doc:alg3-backward]
    # Alg.3 L6: return dQ, dK, dV
    return dq, dk, dv
