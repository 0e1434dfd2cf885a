"""Assignment 3, solution (course staff): FA1 Algorithm 1, the tiled forward pass, for one head.

Paper: Dao et al., "FlashAttention", Algorithm 1 (no mask, no dropout), with the scale ``tau`` of
Algorithm 2 line 10. The loops are the paper's: the outer loop over key/value tiles ``K_j, V_j``
(line 5), the inner loop over query tiles ``Q_i`` (line 7); the running output ``O`` and statistics
``l, m`` live in HBM and make one round trip per outer step (lines 8 and 12-13), which is what
Theorem 2 counts.

Launch geometry: one thread block for the head (FA1 runs one block per (batch, head)), ``BR`` threads.
Thread ``t`` owns row ``t`` of every query tile: it loads its row of ``Q_i`` and ``O_i``, computes its row
of ``S_ij`` and ``P~_ij``, its row statistics and its row of the new ``O_i``, so the row max and row sum
need no communication between threads. The threads share ``K_j, V_j``: they load those tiles together
(one row each in turn), hence the two barriers per outer step.

SRAM budget (float32 elements): ``K_j, V_j``: ``2 BC D``; ``Q_i, O_i``: ``2 BR D``; ``S_ij``/``P~_ij``:
``BR BC``. At ``BR = BC = 8, D = 16``: 768 elements, 3 KB.

Kept by course staff: ``stub.py`` is the student's copy.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

BR = 8  # rows of a query tile Q_i = threads per block (one thread per row)
BC = 8  # rows of a key/value tile K_j, V_j


@functools.cache
def make_kernel(D):
    """The FA1 forward kernel specialized for head dimension ``D`` (shared tiles need constant shapes)."""

    @cuda.jit
    def flash_forward_kernel(Q, K, V, O, l, m, tau):
        """FA1 Algorithm 1 for one head: ``O = softmax(tau Q K^T) V`` with final row statistics ``l, m``.

        ==========================  ==============  ==================
        paper symbol                variable        memory space
        ==========================  ==============  ==================
        Q, K, V (N x d)             Q, K, V         global (HBM)
        O (N x d), l, m (N)         O, l, m         global (HBM)
        K_j, V_j (Bc x d)           sK_j, sV_j      shared (SRAM)
        Q_i, O_i (Br x d)           sQ_i, sO_i      shared (SRAM), row t per thread
        S_ij, P~_ij (Br x Bc)       sS_ij           shared (SRAM), row t per thread
        l_i, m_i (row t)            l_i, m_i        registers
        m~_ij, l~_ij, m_new, l_new  same names      registers
        ==========================  ==============  ==================
        """
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sQ_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sO_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sS_ij = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM: S_ij, then P~_ij in place
        t = cuda.threadIdx.x
        N = Q.shape[0]
        tau32 = float32(tau)

        # Alg.1 L1: block sizes are the module constants BR, BC (chosen to fit, not from M)
        # Alg.1 L2: O = 0, l = 0, m = -inf in HBM; thread t initializes the rows it will own
        for row in range(t, N, BR):
            for c in range(D):
                O[row, c] = 0.0  # HBM write: d per row
            l[row] = 0.0  # HBM write: 1 per row
            m[row] = -math.inf  # HBM write: 1 per row
        # (no barrier needed: every later read of O, l, m[row] is by the thread that wrote it)
        # Alg.1 L3-L4: Tr = ceil(N / Br) row blocks, Tc = ceil(N / Bc) column blocks
        Tr = (N + BR - 1) // BR
        Tc = (N + BC - 1) // BC

        # Alg.1 L5: for j = 1..Tc (outer loop over K/V tiles)
        for j in range(Tc):
            # Alg.1 L6: load K_j, V_j into SRAM, together: thread t loads tile rows t, t + BR, ...
            for r in range(t, BC, BR):
                if j * BC + r < N:
                    for c in range(D):
                        sK_j[r, c] = K[j * BC + r, c]  # HBM read: Bc*d per tile, each element once
                        sV_j[r, c] = V[j * BC + r, c]  # HBM read: Bc*d per tile
            cuda.syncthreads()  # Sync: K_j, V_j are complete in SRAM before L9 and L12 read them
            n_j = min(BC, N - j * BC)  # Dev: the last tile may be ragged; only its n_j rows exist

            # Alg.1 L7: for i = 1..Tr (inner loop over Q tiles); thread t owns row t of each
            for i in range(Tr):
                row = i * BR + t
                if row < N:  # Dev: rows past N in a ragged last tile do nothing
                    # Alg.1 L8: load Q_i, O_i, l_i, m_i (this thread's row) from HBM
                    for c in range(D):
                        sQ_i[t, c] = Q[row, c]  # HBM read: d per row, Tc times in all
                        sO_i[t, c] = O[row, c]  # HBM read: d per row
                    l_i = l[row]  # HBM read: 1
                    m_i = m[row]  # HBM read: 1
                    # Alg.1 L9: S_ij = tau Q_i K_j^T (row t); the row max of L10 is folded in
                    m_tilde = float32(-math.inf)
                    for cc in range(n_j):
                        s = float32(0.0)
                        for c in range(D):
                            s += sQ_i[t, c] * sK_j[cc, c]
                        s *= tau32
                        sS_ij[t, cc] = s
                        m_tilde = max(m_tilde, s)
                    # Alg.1 L10: P~_ij = exp(S_ij - m~_ij) (each <= 1), l~_ij = rowsum(P~_ij)
                    l_tilde = float32(0.0)
                    for cc in range(n_j):
                        p = math.exp(sS_ij[t, cc] - m_tilde)
                        sS_ij[t, cc] = p
                        l_tilde += p
                    # Alg.1 L11: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
                    m_new = max(m_i, m_tilde)
                    alpha = math.exp(m_i - m_new)  # 0 at j = 1 (m_i = -inf, and l_i = 0, O_i = 0)
                    beta = math.exp(m_tilde - m_new)
                    l_new = alpha * l_i + beta * l_tilde
                    # Alg.1 L12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
                    for c in range(D):
                        pv = float32(0.0)
                        for cc in range(n_j):
                            pv += sS_ij[t, cc] * sV_j[cc, c]
                        O[row, c] = (alpha * l_i * sO_i[t, c] + beta * pv) / l_new  # HBM write: d per row
                    # Alg.1 L13: l_i <- l_new, m_i <- m_new in HBM
                    l[row] = l_new  # HBM write: 1
                    m[row] = m_new  # HBM write: 1
            cuda.syncthreads()  # Sync: every thread is done with K_j, V_j before L6 overwrites them

    return flash_forward_kernel


def flash_forward(Q, K, V, O, l, m, tau):
    """Run FA1 Algorithm 1 on one head: ``Q, K, V (N, d)`` float32 in; ``O (N, d)``, ``l, m (N,)`` out.

    One block of ``BR`` threads (FA1: one thread block per head). The arrays go to the kernel as they
    are (NumPy arrays, device arrays, or the autograder's counting arrays in the simulator).
    """
    make_kernel(Q.shape[1])[1, BR](Q, K, V, O, l, m, tau)
