"""Assignment 4, solution (course staff): FA1 Algorithm 4, the recomputation backward, as one Numba kernel.

Paper: Dao et al., "FlashAttention", Algorithm 4 (Appendix B.4) and Theorem 5, without mask and
dropout (lines 12, 14, 15 and 18 are identities). The forward's statistics are FA1's ``l, m`` (the
outputs of assignment 3), so line 13 reads ``P_ij = diag(l_i)^-1 exp(S_ij - m_i)``.

Launch geometry: ONE thread block for the head (FA1's parallelism), ``BR`` threads. The paper's loops
run inside the block: the outer loop over key/value tiles ``j`` keeps ``K_j, V_j`` and the accumulators
``dK~_j, dV~_j`` in SRAM; the inner loop over query tiles ``i`` streams ``Q_i, O_i, dO_i, dQ_i, l_i, m_i``.
Two ownerships per inner step:

* thread ``t`` owns query row ``t`` of the tile for lines 10-21: its row of ``S_ij, P_ij, dP_ij,
  dS_ij`` and its row of ``dQ_i``, read-modify-written in HBM (line 21), which needs no atomics because
  one block owns the whole head;
* after a barrier, thread ``t`` owns key rows ``t, t + BR, ...`` of ``dK~_j, dV~_j`` for lines 16 and 22
  (a sum over the tile's query rows, read from SRAM).

SRAM (float32 elements): ``K_j, V_j, dK~_j, dV~_j``: ``4 BC D``; ``Q_i, dO_i``: ``2 BR D``;
``P_ij, dS_ij``: ``2 BR BC``. At ``BR = BC = 8, D = 16``: 896 elements, 3.5 KB.

Kept by course staff, never in the handout.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

BR = 8  # rows of a query tile Q_i = threads per block
BC = 8  # rows of a key/value tile K_j, V_j


@functools.cache
def make_kernel(D):
    """The FA1 backward kernel specialized for head dimension ``D``."""

    @cuda.jit
    def flash_backward_kernel(Q, K, V, O, dO, l, m, tau, dQ, dK, dV):
        """FA1 Algorithm 4 for one head.

        ==============================  ================  ======================
        paper symbol                    variable          memory space
        ==============================  ================  ======================
        Q, K, V, O, dO (N x d), l, m    same names        global (HBM)
        dQ, dK, dV (N x d)              same names        global (HBM)
        K_j, V_j (Bc x d)               sK_j, sV_j        shared (SRAM)
        dK~_j, dV~_j (Bc x d)           sdK_j, sdV_j      shared (SRAM)
        Q_i, dO_i (Br x d)              sQ_i, sdO_i       shared (SRAM), row t per thread
        P_ij, dS_ij (Br x Bc)           sP_ij, sdS_ij     shared (SRAM), row t per thread
        l_i, m_i, D_i (row t)           l_i, m_i, D_i     registers
        ==============================  ================  ======================
        """
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sdK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM: dK~_j
        sdV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM: dV~_j
        sQ_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sdO_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sP_ij = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        sdS_ij = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        t = cuda.threadIdx.x
        N = Q.shape[0]
        tau32 = float32(tau)
        Tr = (N + BR - 1) // BR
        Tc = (N + BC - 1) // BC

        # Alg.4 L5: dQ = 0 in HBM (each thread zeroes the rows it will own)
        for row in range(t, N, BR):
            for c in range(D):
                dQ[row, c] = 0.0  # HBM write: d per row
        # Alg.4 L6: for j = 1..Tc (outer loop over K/V tiles)
        for j in range(Tc):
            n_j = min(BC, N - j * BC)  # Dev: the last tile may be ragged
            # Alg.4 L7-L8: load K_j, V_j together (thread t: tile rows t, t + BR, ...); dK~_j = dV~_j = 0 in SRAM
            for r in range(t, BC, BR):
                for c in range(D):
                    if r < n_j:
                        sK_j[r, c] = K[j * BC + r, c]  # HBM read: Bc*d per tile, once in all
                        sV_j[r, c] = V[j * BC + r, c]  # HBM read: Bc*d per tile
                    sdK_j[r, c] = 0.0
                    sdV_j[r, c] = 0.0
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before L11 and L17 read them
            # Alg.4 L9: for i = 1..Tr (inner loop over Q tiles)
            for i in range(Tr):
                row = i * BR + t
                if row < N:
                    # Alg.4 L10: load Q_i, dO_i (to SRAM: line 22 and 16 share them), O_i (only for D_i), l_i, m_i
                    D_i = float32(0.0)
                    for c in range(D):
                        sQ_i[t, c] = Q[row, c]  # HBM read: d per row, Tc times in all
                        sdO_i[t, c] = dO[row, c]  # HBM read: d per row
                        # Alg.4 L19: D_i = rowsum(dO_i o O_i), formed while loading (the D trick)
                        D_i += sdO_i[t, c] * O[row, c]  # HBM read: d per row
                    l_i = l[row]  # HBM read: 1
                    m_i = m[row]  # HBM read: 1
                    for cc in range(BC):
                        if cc < n_j:
                            # Alg.4 L11: S_ij = tau Q_i K_j^T (row t)
                            s = float32(0.0)
                            for c in range(D):
                                s += sQ_i[t, c] * sK_j[cc, c]
                            # Alg.4 L13: P_ij = diag(l_i)^-1 exp(S_ij - m_i): the forward's final statistics
                            p = math.exp(s * tau32 - m_i) / l_i
                            # Alg.4 L17: dP_ij = dO_i V_j^T (row t)
                            dp = float32(0.0)
                            for c in range(D):
                                dp += sdO_i[t, c] * sV_j[cc, c]
                            # Alg.4 L20: dS_ij = P_ij o (dP_ij - D_i)
                            sP_ij[t, cc] = p
                            sdS_ij[t, cc] = p * (dp - D_i)
                        else:
                            sP_ij[t, cc] = 0.0  # Dev: keys past N contribute nothing
                            sdS_ij[t, cc] = 0.0
                    # Alg.4 L21: dQ_i <- dQ_i + tau dS_ij K_j, read-modify-write in HBM on every (i, j)
                    for c in range(D):
                        acc = float32(0.0)
                        for cc in range(n_j):
                            acc += sdS_ij[t, cc] * sK_j[cc, c]
                        dQ[row, c] = dQ[row, c] + tau32 * acc  # HBM read + write: d per row
                else:
                    for cc in range(BC):  # Dev: rows past N contribute nothing to dK~_j, dV~_j
                        sP_ij[t, cc] = 0.0
                        sdS_ij[t, cc] = 0.0
                    for c in range(D):
                        sQ_i[t, c] = 0.0
                        sdO_i[t, c] = 0.0
                cuda.syncthreads()  # Sync: P_ij, dS_ij, Q_i, dO_i of every row in SRAM before L16 and L22 sum over rows
                # Alg.4 L16: dV~_j += P_ij^T dO_i; thread t owns key rows t, t + BR, ... of the tile
                for r in range(t, n_j, BR):
                    for c in range(D):
                        acc_v = float32(0.0)
                        acc_k = float32(0.0)
                        for rr in range(BR):
                            acc_v += sP_ij[rr, r] * sdO_i[rr, c]
                            acc_k += sdS_ij[rr, r] * sQ_i[rr, c]
                        sdV_j[r, c] += acc_v
                        # Alg.4 L22: dK~_j += tau dS_ij^T Q_i
                        sdK_j[r, c] += tau32 * acc_k
                cuda.syncthreads()  # Sync: L16 and L22 done reading P, dS, Q_i, dO_i before the next i overwrites them
            # Alg.4 L24: write dK_j, dV_j to HBM (each thread the key rows it accumulated)
            for r in range(t, n_j, BR):
                for c in range(D):
                    dK[j * BC + r, c] = sdK_j[r, c]  # HBM write: Bc*d per tile, once in all
                    dV[j * BC + r, c] = sdV_j[r, c]  # HBM write: Bc*d per tile
            cuda.syncthreads()  # Sync: dK~_j, dV~_j written out and K_j, V_j done before the next j reloads them

    return flash_backward_kernel


def flash_backward(Q, K, V, O, dO, l, m, tau, dQ, dK, dV):
    """Run FA1 Algorithm 4 on one head: one block of ``BR`` threads; the arrays go to the kernel as they are."""
    make_kernel(Q.shape[1])[1, BR](Q, K, V, O, dO, l, m, tau, dQ, dK, dV)
