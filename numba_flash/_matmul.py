"""Batched, head-aware matrix products in shared-memory tiles: the matmuls of standard attention.

Standard attention (FA1 Algorithm 0) and its backward pass (Algorithm 3) are sequences of matrix
products that read and write N x N matrices in HBM. For the comparison with FlashAttention to teach
anything, those products must be *decent* kernels, not strawmen: this module is one shared-memory
tiled, register-blocked kernel that every one of them uses.

What a reader learns
--------------------
* The classic GEMM tiling: a thread block computes a ``BM x BN`` tile of ``C``; it walks the reduction
  dimension in steps of ``BK``, staging a ``BM x BK`` slab of ``op(A)`` and a ``BK x BN`` slab of
  ``op(B)`` in shared memory; each thread accumulates an ``RM x RN`` register tile (outer products of
  an ``RM`` column of ``A`` and an ``RN`` row of ``B``), so every shared-memory load feeds several FMAs.
* How the attention layouts map onto "batched GEMM": each (batch, head) is one matrix product, read
  straight out of the ``(b, s, h, d)`` arrays through their strides (no transposed copies), with the
  GQA/MQA head mapping done in the index arithmetic.

API
---
:func:`matmul` computes, for every batch index ``bi`` and every head ``hc`` of ``C``::

    C[bi, hc] = alpha * sum_{g < G} op(A[bi, ha(g)]) @ op(B[bi, hb(g)])   (+ C[bi, hc] if accumulate)

* **Layouts.** Every operand is a 4-D array in one of two layouts, giving one matrix per (batch, head):
  ``"bshd"``: ``X[b, :, h, :]`` (rows = sequence positions, cols = head dim; q, k, v, o and their
  gradients); ``"bhst"``: ``X[b, h, :, :]`` (an N x N matrix per head; S, P, dP, dS). Any strides.
* **Transposes** (BLAS style): ``op(A) = A^T`` with ``trans_a=True``, the same for ``B``. Nothing is
  copied; the kernel swaps the two indices when it reads.
* **Heads (GQA/MQA).** ``kv_group = nheads // nheads_k``. An operand flagged ``*_kv=True`` holds key/value
  heads and is read at head ``hq // kv_group``; otherwise at query head ``hq``. With ``c_kv=False``
  ``C`` has one matrix per query head, ``hq = hc`` and ``G = 1``. With ``c_kv=True`` ``C`` has one per
  key/value head and the sum runs over the ``G = kv_group`` query heads ``hq = hc * G + g`` of its group:
  the GQA reduction of dK and dV.
* **Options.** ``alpha`` scales the product (tau); ``accumulate=True`` adds into ``C`` instead of
  overwriting it; ``causal_offset=o`` writes ``-inf`` at ``C[i, j]`` with ``j > i + o`` (the
  bottom-right aligned causal mask of :mod:`numba_flash_reference.common`, ``o = s_k - s_q``);
  ``dropout=(seed, threshold, p)`` multiplies every element of ``A`` *as it is loaded* by the
  counter-hash keep mask (``1 / (1 - p)`` where kept, 0 where dropped), keyed by the element's *stored*
  indices ``(row, col)`` and ``bh = bi * nheads + hq``: so ``A`` must be the ``(b, h, s_q, s_k)``
  probability matrix, transposed or not. The N x N mask itself is never stored.

The products of the two standard passes (``tau`` = softmax scale, ``o = s_k - s_q``)::

    S  = tau Q K^T   matmul(q, k, S, a_layout="bshd", b_layout="bshd", c_layout="bhst",
                            trans_b=True, b_kv=True, kv_group=g, alpha=tau, causal_offset=o)
    O  = P V         matmul(P, v, o, a_layout="bhst", b_layout="bshd", c_layout="bshd",
                            b_kv=True, kv_group=g, dropout=(seed, thr, p))
    dV = P^T dO      matmul(P, dout, dv, a_layout="bhst", b_layout="bshd", c_layout="bshd",
                            trans_a=True, c_kv=True, kv_group=g, dropout=(seed, thr, p))
    dP = dO V^T      matmul(dout, v, dP, a_layout="bshd", b_layout="bshd", c_layout="bhst",
                            trans_b=True, b_kv=True, kv_group=g)
    dQ = tau dS K    matmul(dS, k, dq, a_layout="bhst", b_layout="bshd", c_layout="bshd",
                            b_kv=True, kv_group=g, alpha=tau)
    dK = tau dS^T Q  matmul(dS, q, dk, a_layout="bhst", b_layout="bshd", c_layout="bshd",
                            trans_a=True, c_kv=True, kv_group=g, alpha=tau)

Launch geometry
---------------
Grid ``(ceil(N / BN) ceil(M / BM), batch * heads_of_C)``, the second dimension folded over grid y and z
when it exceeds 65535 (:func:`numba_flash._launch.bh_grid`); block ``TY x TX`` threads (flattened).
Thread ``(ty, tx)`` owns the ``RM x RN`` entries ``C[m0 + ty + TY*i, n0 + tx + TX*j]``: strided, so a
warp's stores are coalesced and its shared-memory reads are conflict-free or broadcasts. ``BM = TY*RM``,
``BN = TX*RN``. On a GPU the tile is 64 x 64 x 16 with 16 x 16 threads and 4 x 4 outputs per thread;
in the simulator 16 x 16 x 16 with 4 x 4 threads (fewer Python threads, same code).
Ragged edges (M, N or K not multiples of the tile) are zero-filled on load and guarded on store.

SRAM budget: ``BK * (BM + 1) + BK * (BN + 1)`` float32 (8.3 KB on a GPU): one padding column per slab,
so a slab can be written along either of its dimensions without bank conflicts.

Run it::

    >>> import numpy as np
    >>> from numba_flash._matmul import matmul
    >>> rng = np.random.default_rng(0)
    >>> q, k = (rng.standard_normal((1, 5, 2, 3)).astype(np.float32) for _ in range(2))
    >>> S = np.full((1, 2, 5, 5), np.nan, np.float32)
    >>> _ = matmul(q, k, S, a_layout="bshd", b_layout="bshd", c_layout="bhst", trans_b=True)
    >>> bool(np.allclose(S[0, 1], q[0, :, 1] @ k[0, :, 1].T, atol=1e-5))
    True
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from numba_flash_reference.common import dropout_threshold

import numpy as np
from numba import cuda, float32, uint64

from ._launch import bh_grid, ceil_div
from .device.dropout import head_key, keep, row_key
from .device.grid import folded_batch_head
from .runtime import backend as _backend

LAYOUTS = ("bshd", "bhst")


@dataclass(frozen=True)
class MatmulTiles:
    """Thread-block tile: ``TY x TX`` threads, each an ``RM x RN`` register tile; ``BK`` deep slabs."""

    TY: int
    TX: int
    RM: int
    RN: int
    BK: int

    @property
    def BM(self) -> int:
        return self.TY * self.RM

    @property
    def BN(self) -> int:
        return self.TX * self.RN

    @property
    def threads(self) -> int:
        return self.TY * self.TX

    @property
    def sram_bytes(self) -> int:
        """Static SRAM of one block: the (BK, BM+1) slab of op(A) and the (BK, BN+1) slab of op(B)."""
        return 4 * self.BK * ((self.BM + 1) + (self.BN + 1))


#: 64 x 64 x 16 tiles, 256 threads, 4 x 4 outputs per thread (a GPU).
GPU_TILES = MatmulTiles(TY=16, TX=16, RM=4, RN=4, BK=16)
#: 16 x 16 x 16 tiles, 16 threads (the simulator runs every thread as a Python thread).
SIM_TILES = MatmulTiles(TY=4, TX=4, RM=4, RN=4, BK=16)


def default_tiles() -> MatmulTiles:
    return SIM_TILES if _backend.is_simulator() else GPU_TILES


def _rows_cols(x, layout, trans):
    """(rows, cols) of op(X) for one (batch, head)."""
    n = (x.shape[1], x.shape[3]) if layout == "bshd" else (x.shape[2], x.shape[3])
    return (n[1], n[0]) if trans else n


def _heads(x, layout):
    return x.shape[2] if layout == "bshd" else x.shape[1]


@functools.cache
def matmul_kernel(a_layout, trans_a, b_layout, trans_b, c_layout, accumulate, causal, dropout, tiles: MatmulTiles):
    """Compile (once per option set) the tiled kernel for one combination of layouts and options."""
    TY, TX, RM, RN, BK = tiles.TY, tiles.TX, tiles.RM, tiles.RN, tiles.BK
    BM, BN, NT = tiles.BM, tiles.BN, tiles.threads
    if (BM * BK) % NT or (BK * BN) % NT:
        raise ValueError(f"tile {tiles} does not split evenly over its {NT} threads")
    BM_PAD, BN_PAD = BM + 1, BN + 1  # shared-array shapes must be compile-time constants
    A_LOADS = BM * BK // NT  # slab elements each thread loads
    B_LOADS = BK * BN // NT
    A_BHST = a_layout == "bhst"
    B_BHST = b_layout == "bhst"
    C_BHST = c_layout == "bhst"
    TRANS_A = bool(trans_a)
    TRANS_B = bool(trans_b)
    # Coalescing: consecutive threads load along the operand's contiguous (last) axis. For op(A) that
    # is k unless A is transposed; for op(B) it is n unless B is transposed.
    A_K_FASTEST = not TRANS_A
    B_K_FASTEST = TRANS_B
    ACCUMULATE, CAUSAL, DROPOUT = bool(accumulate), bool(causal), bool(dropout)
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline="always")
    def matrix(gX, BHST, bi, h):
        """The 2-D matrix of (batch bi, head h): a strided view, nothing copied."""
        if BHST:
            return gX[bi, h, :, :]
        return gX[bi, :, h, :]

    @cuda.jit(device=True, inline="always")
    def load(X, TRANS, row, col):
        """op(X)[row, col]: swap the indices when X is transposed."""
        if TRANS:
            return X[col, row]
        return X[row, col]

    @cuda.jit(device=True, inline="always")
    def slab_index(t, tid, BX, K_FASTEST):
        """(k, x) in a (BK, BX) slab of thread tid's t-th load: consecutive threads along k or along x."""
        e = tid + NT * t
        if K_FASTEST:
            return e % BK, e // BK
        return e // BX, e % BX

    @cuda.jit
    def kernel(gA, gB, gC, M, N, K, heads_c, G, a_div, b_div, alpha, causal_offset, seed, threshold, nheads_q, dropout_scale):
        sA = cuda.shared.array((BK, BM_PAD), float32)  # (BK, BM) slab of op(A), k-major; +1 column against bank conflicts
        sB = cuda.shared.array((BK, BN_PAD), float32)  # (BK, BN) slab of op(B)
        rC = cuda.local.array((RM, RN), float32)  # the thread's RM x RN outputs, in registers
        rA = cuda.local.array(RM, float32)
        rB = cuda.local.array(RN, float32)
        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        n_tiles = (N + BN - 1) // BN  # output tiles along N: grid x walks them fastest, then the M tiles
        m0 = (cuda.blockIdx.x // n_tiles) * BM
        n0 = (cuda.blockIdx.x % n_tiles) * BN
        _, bi, hc = folded_batch_head(heads_c)  # (batch, head of C), folded over grid y, z (y <= 65535)
        if bi >= gC.shape[0]:
            return  # past batch * heads_c in the last z slab of the fold
        for i in range(RM):
            for j in range(RN):
                rC[i, j] = 0.0
        for g in range(G):  # G = 1, or the query heads of a GQA group when C is per key/value head
            hq = hc * G + g
            ha = hq // a_div
            hb = hq // b_div
            mA = matrix(gA, A_BHST, bi, ha)
            mB = matrix(gB, B_BHST, bi, hb)
            k_bh = head_key(seed, bi * nheads_q + hq) if DROPOUT else uint64(0)
            for k0 in range(0, K, BK):
                for t in range(A_LOADS):  # HBM read: BM*BK
                    kk, mm = slab_index(t, tid, BM, A_K_FASTEST)
                    row = m0 + mm
                    col = k0 + kk
                    val = float32(0.0)
                    if row < M and col < K:
                        val = load(mA, TRANS_A, row, col)
                        if DROPOUT:  # keyed by the stored (query row, key col) of P
                            r = col if TRANS_A else row
                            c = row if TRANS_A else col
                            val = val * dropout_scale if keep(row_key(k_bh, r), c, threshold) else float32(0.0)
                    sA[kk, mm] = val
                for t in range(B_LOADS):  # HBM read: BK*BN
                    kk, nn = slab_index(t, tid, BN, B_K_FASTEST)
                    row = k0 + kk
                    col = n0 + nn
                    val = float32(0.0)
                    if row < K and col < N:
                        val = load(mB, TRANS_B, row, col)
                    sB[kk, nn] = val
                cuda.syncthreads()  # Sync: both slabs in SRAM before any thread multiplies them
                for kk in range(BK):
                    for i in range(RM):
                        rA[i] = sA[kk, ty + TY * i]
                    for j in range(RN):
                        rB[j] = sB[kk, tx + TX * j]
                    for i in range(RM):
                        for j in range(RN):
                            rC[i, j] += rA[i] * rB[j]
                cuda.syncthreads()  # Sync: every thread is done with the slabs before the next load overwrites them
        for i in range(RM):
            row = m0 + ty + TY * i
            for j in range(RN):
                col = n0 + tx + TX * j
                if row < M and col < N:
                    val = alpha * rC[i, j]
                    if CAUSAL and col > row + causal_offset:
                        val = NEG_INF
                    if C_BHST:
                        if ACCUMULATE:
                            val += gC[bi, hc, row, col]
                        gC[bi, hc, row, col] = val  # HBM write: BM*BN
                    else:
                        if ACCUMULATE:
                            val += gC[bi, row, hc, col]
                        gC[bi, row, hc, col] = val  # HBM write: BM*BN

    return kernel


def matmul(a, b, c, *, a_layout, b_layout, c_layout, trans_a=False, trans_b=False, a_kv=False, b_kv=False, c_kv=False, kv_group=1, alpha=1.0, accumulate=False, causal_offset=None, dropout=None, tiles=None):
    """``C = alpha * op(A) op(B)`` for every (batch, head), in place in ``c`` (see the module docstring).

    Parameters
    ----------
    a, b, c : float32 kernel arrays (NumPy in the simulator, device arrays on a GPU), 4-D, any strides.
    a_layout, b_layout, c_layout : ``"bshd"`` or ``"bhst"``.
    trans_a, trans_b : use ``A^T`` / ``B^T``.
    a_kv, b_kv, c_kv : the operand holds key/value heads (``c_kv``: sum over each GQA group).
    kv_group : query heads per key/value head (``nheads // nheads_k``).
    alpha : scale of the product.
    accumulate : add into ``c`` instead of overwriting it.
    causal_offset : int or None; write ``-inf`` where ``col > row + causal_offset``.
    dropout : ``(seed, threshold, p)`` or None; drop elements of ``A`` (a probability matrix) as loaded.
    tiles : :class:`MatmulTiles`, default :func:`default_tiles`.

    Returns
    -------
    c
    """
    for name, lay in (("a_layout", a_layout), ("b_layout", b_layout), ("c_layout", c_layout)):
        if lay not in LAYOUTS:
            raise ValueError(f"{name} must be one of {LAYOUTS}, got {lay!r}")
    M, K = _rows_cols(a, a_layout, trans_a)
    K2, N = _rows_cols(b, b_layout, trans_b)
    if K2 != K:
        raise ValueError(f"op(A) is {M} x {K} but op(B) is {K2} x {N}")
    if _rows_cols(c, c_layout, False) != (M, N):
        raise ValueError(f"C must be {M} x {N} per head, got {_rows_cols(c, c_layout, False)}")
    if causal_offset is not None and accumulate:
        raise ValueError("causal_offset writes -inf and cannot be combined with accumulate")
    batch = c.shape[0]
    heads_c = _heads(c, c_layout)
    G = kv_group if c_kv else 1
    nheads_q = heads_c * G
    if dropout is not None and dropout[2] > 0.0:
        seed, threshold, p = dropout
        use_dropout = True
        dropout_scale = np.float32(1.0 / (1.0 - p))
        threshold = int(threshold) if threshold is not None else dropout_threshold(p)
    else:
        seed, threshold, dropout_scale, use_dropout = 0, 0, np.float32(1.0), False
    tiles = default_tiles() if tiles is None else tiles
    kernel = matmul_kernel(a_layout, bool(trans_a), b_layout, bool(trans_b), c_layout, bool(accumulate), causal_offset is not None, use_dropout, tiles)
    grid = bh_grid(ceil_div(N, tiles.BN) * ceil_div(M, tiles.BM), batch * heads_c)
    kernel[grid, tiles.threads](
        a, b, c, M, N, K, heads_c, G,
        kv_group if a_kv else 1, kv_group if b_kv else 1,
        np.float32(alpha), 0 if causal_offset is None else int(causal_offset),
        np.uint32(seed), np.uint32(threshold), nheads_q, dropout_scale,
    )
    return c
