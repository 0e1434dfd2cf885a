"""Assignment 7, solution (course staff): block-sparse FlashAttention forward (FA1 Algorithm 5), one head.

Paper: Dao et al., "FlashAttention", Algorithm 5 (Appendix D.1) and Proposition 4. Algorithm 1's loops
(K/V tiles outside, query tiles inside, O, l, m round trips through HBM), with one line added: the inner
step runs only ``if M_ij != 0`` (line 8). A zero tile costs no FLOP and no HBM access, so the row-side
traffic is proportional to the number of non-zero tiles. Departure from the paper: line 6 loads
``K_j, V_j`` only when column ``j`` of the mask has a non-zero tile (the paper loads them always; both
give Proposition 4's ``Theta(N d + N^2 d^2 s / M)``).

Launch geometry: as assignment 3, ONE thread block of ``BR`` threads for the head; thread ``t`` owns
row ``t`` of every query tile. The block mask ``(Tr, Tc)`` is read from HBM by every thread as needed.

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
    """The block-sparse forward kernel specialized for head dimension ``D``."""

    @cuda.jit
    def block_sparse_kernel(Q, K, V, block_mask, O, l, m, tau):
        """FA1 Algorithm 5 for one head: attention restricted to the tiles ``(i, j)`` with ``block_mask[i, j] != 0``.

        ==========================  ==============  ==================
        paper symbol                variable        memory space
        ==========================  ==============  ==================
        Q, K, V, O, l, m            same names      global (HBM)
        M (Tr x Tc)                 block_mask      global (HBM)
        K_j, V_j (Bc x d)           sK_j, sV_j      shared (SRAM)
        Q_i, O_i (Br x d)           sQ_i, sO_i      shared (SRAM), row t per thread
        P~_ij (Br x Bc)             sP              shared (SRAM), row t per thread
        ==========================  ==============  ==================
        """
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sQ_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sO_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sP = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        t = cuda.threadIdx.x
        N = Q.shape[0]
        tau32 = float32(tau)
        Tr = (N + BR - 1) // BR
        Tc = (N + BC - 1) // BC

        # Alg.5 L2: O = 0, l = 0, m = -inf in HBM (rows whose tiles are all zero keep these: O = 0, no NaN)
        for row in range(t, N, BR):
            for c in range(D):
                O[row, c] = 0.0  # HBM write: d per row
            l[row] = 0.0
            m[row] = -math.inf
        # Alg.5 L5: for j = 1..Tc
        for j in range(Tc):
            used = False
            for i in range(Tr):
                if block_mask[i, j] != 0:
                    used = True
            if used:  # Dev: an all-zero column of the mask needs no K_j, V_j (the paper loads them anyway)
                # Alg.5 L6: load K_j, V_j together
                for r in range(t, BC, BR):
                    if j * BC + r < N:
                        for c in range(D):
                            sK_j[r, c] = K[j * BC + r, c]  # HBM read: Bc*d, at most once in all
                            sV_j[r, c] = V[j * BC + r, c]  # HBM read: Bc*d
            cuda.syncthreads()  # Sync: K_j, V_j complete in SRAM before L10 and L15 read them
            n_j = min(BC, N - j * BC)
            # Alg.5 L7: for i = 1..Tr
            for i in range(Tr):
                row = i * BR + t
                # Alg.5 L8: if M_ij != 0 (a zero tile: no FLOP, no HBM access)
                if block_mask[i, j] != 0 and row < N:
                    # Alg.5 L9: load Q_i, O_i, l_i, m_i (row t)
                    for c in range(D):
                        sQ_i[t, c] = Q[row, c]  # HBM read: d per row, once per non-zero tile
                        sO_i[t, c] = O[row, c]  # HBM read: d per row
                    l_i = l[row]
                    m_i = m[row]
                    # Alg.5 L10: S_ij = tau Q_i K_j^T (row t), the row max of L12 folded in
                    m_tilde = float32(-math.inf)
                    for cc in range(n_j):
                        s = float32(0.0)
                        for c in range(D):
                            s += sQ_i[t, c] * sK_j[cc, c]
                        s *= tau32
                        sP[t, cc] = s
                        m_tilde = max(m_tilde, s)
                    # Alg.5 L12: P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)
                    l_tilde = float32(0.0)
                    for cc in range(n_j):
                        p = math.exp(sP[t, cc] - m_tilde)
                        sP[t, cc] = p
                        l_tilde += p
                    # Alg.5 L13: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
                    m_new = max(m_i, m_tilde)
                    alpha = math.exp(m_i - m_new)  # 0 on the row's first non-zero tile
                    beta = math.exp(m_tilde - m_new)
                    l_new = alpha * l_i + beta * l_tilde
                    # Alg.5 L15: write O_i (Alg.1 L12 with P~_ij V_j)
                    for c in range(D):
                        pv = float32(0.0)
                        for cc in range(n_j):
                            pv += sP[t, cc] * sV_j[cc, c]
                        O[row, c] = (alpha * l_i * sO_i[t, c] + beta * pv) / l_new  # HBM write: d per row
                    # Alg.5 L16: write l_i, m_i
                    l[row] = l_new
                    m[row] = m_new
            cuda.syncthreads()  # Sync: every thread is done with K_j, V_j before L6 overwrites them

    return block_sparse_kernel


def block_sparse_forward(Q, K, V, block_mask, O, l, m, tau):
    """Run FA1 Algorithm 5 on one head: one block of ``BR`` threads; ``block_mask`` is ``(ceil(N/BR), ceil(N/BC))``."""
    make_kernel(Q.shape[1])[1, BR](Q, K, V, block_mask, O, l, m, tau)
