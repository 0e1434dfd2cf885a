"""Assignment 5, solution (course staff): the FlashAttention-2 forward kernel (FA2 Algorithm 1), one head.

Paper: Dao, "FlashAttention-2", Algorithm 1 and section 3.1.1 (causal masking): the outer loop is over
query tiles, and each is an independent thread block (section 3.2: parallelism over the sequence).
Each block loads ``Q_i`` once, keeps the running ``m, l`` and an un-normalized accumulator on chip,
streams every ``K_j, V_j`` it needs, and writes ``O_i`` and the logsumexp ``L_i`` once. With the causal
mask, tiles entirely above the diagonal are skipped (never loaded), and only the tiles the diagonal
crosses are masked element by element.

Launch geometry: grid ``Tr = ceil(N / BR)`` blocks of ``BR`` threads; thread ``t`` of block ``i`` owns
query row ``i BR + t``: its row of ``S``, ``P~``, its ``m, l`` and accumulator (registers). The threads
load ``K_j, V_j`` together and share them.

SRAM (float32 elements): ``K_j, V_j``: ``2 BC D``; ``Q_i``: ``BR D``; ``P~``: ``BR BC``. The accumulator
``O_i`` (``D`` per thread) is in registers (a ``cuda.local.array``).

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
    """The FA2 forward kernel specialized for head dimension ``D``."""

    @cuda.jit
    def flash2_forward_kernel(Q, K, V, O, L, tau, causal):
        """FA2 Algorithm 1 for one head, one query tile per block; ``causal``: key ``c`` visible to row ``r`` iff ``c <=
        r``.

        ==========================  ==============  ==================
        paper symbol                variable        memory space
        ==========================  ==============  ==================
        Q, K, V (N x d), O, L       same names      global (HBM)
        Q_i (Br x d)                sQ_i            shared (SRAM)
        K_j, V_j (Bc x d)           sK_j, sV_j      shared (SRAM)
        P~_i^(j) (Br x Bc)          sP              shared (SRAM), row t per thread
        O_i^(j) (row t)             rO              registers (local array)
        m_i^(j), l_i^(j) (row t)    m_i, l_i        registers
        ==========================  ==============  ==================
        """
        sQ_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sP = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM: S, then P~, row t per thread
        rO = cuda.local.array(D, float32)  # (d,) registers: the un-normalized accumulator of row t
        i = cuda.blockIdx.x  # FA2.1 L3: this block's query tile
        t = cuda.threadIdx.x
        N = Q.shape[0]
        row = i * BR + t
        tau32 = float32(tau)

        # FA2.1 L4: load Q_i (row t) into SRAM, once
        if row < N:
            for c in range(D):
                sQ_i[t, c] = Q[row, c]  # HBM read: d per row, once in all
        # FA2.1 L5: O_i = 0, l_i = 0, m_i = -inf on chip
        for c in range(D):
            rO[c] = 0.0
        l_i = float32(0.0)
        m_i = float32(-math.inf)
        Tc = (N + BC - 1) // BC
        if causal:
            # Dev: causal block skipping: key tiles past this tile's last row are entirely masked, never loaded
            last_row = min(N, (i + 1) * BR) - 1
            Tc = min(Tc, last_row // BC + 1)
        # FA2.1 L6: for j = 1..Tc (inner loop over K/V tiles)
        for j in range(Tc):
            # FA2.1 L7: load K_j, V_j together (thread t: tile rows t, t + BR, ...)
            for r in range(t, BC, BR):
                if j * BC + r < N:
                    for c in range(D):
                        sK_j[r, c] = K[j * BC + r, c]  # HBM read: Bc*d per tile, Tr times in all
                        sV_j[r, c] = V[j * BC + r, c]  # HBM read: Bc*d per tile
            cuda.syncthreads()  # Sync: K_j, V_j complete in SRAM before L8 and L10 read them
            n_j = min(BC, N - j * BC)
            if row < N:
                # FA2.1 L8: S = tau Q_i K_j^T (row t); the row max of L9 folded in
                m_tilde = float32(-math.inf)
                for cc in range(n_j):
                    s = float32(0.0)
                    for c in range(D):
                        s += sQ_i[t, c] * sK_j[cc, c]
                    s *= tau32
                    if causal and j * BC + cc > row:
                        s = -math.inf  # Dev: the elementwise causal mask (only diagonal tiles have such entries)
                    sP[t, cc] = s
                    m_tilde = max(m_tilde, s)
                # FA2.1 L9: m_new = max(m_i, rowmax S); P~ = exp(S - m_new); l_new = e^(m_i - m_new) l_i + rowsum P~
                m_new = max(m_i, m_tilde)  # finite: tile 0 always holds key 0, visible to every row
                alpha = math.exp(m_i - m_new)  # 0 at j = 1 (m_i = -inf)
                l_tilde = float32(0.0)
                for cc in range(n_j):
                    p = math.exp(sP[t, cc] - m_new)  # masked: exp(-inf) = 0
                    sP[t, cc] = p
                    l_tilde += p
                l_i = alpha * l_i + l_tilde
                # FA2.1 L10: O_i = diag(e^(m_i - m_new)) O_i + P~ V_j (un-normalized)
                for c in range(D):
                    pv = float32(0.0)
                    for cc in range(n_j):
                        pv += sP[t, cc] * sV_j[cc, c]
                    rO[c] = alpha * rO[c] + pv
                m_i = m_new
            cuda.syncthreads()  # Sync: every thread is done with K_j, V_j before L7 overwrites them
        if row < N:
            # FA2.1 L12: O_i = diag(l_i)^-1 O_i: the one division per element, at the end
            for c in range(D):
                rO[c] = rO[c] / l_i
            # FA2.1 L13: L_i = m_i + log(l_i), the logsumexp the backward pass needs
            L_i = m_i + math.log(l_i)
            # FA2.1 L14: write O_i to HBM, once
            for c in range(D):
                O[row, c] = rO[c]  # HBM write: d per row, once in all
            # FA2.1 L15: write L_i to HBM
            L[row] = L_i  # HBM write: 1 per row

    return flash2_forward_kernel


def flash2_forward(Q, K, V, O, L, tau, causal=False):
    """Run FA2 Algorithm 1 on one head: grid ``ceil(N / BR)`` blocks of ``BR`` threads."""
    N = Q.shape[0]
    make_kernel(Q.shape[1])[(N + BR - 1) // BR, BR](Q, K, V, O, L, tau, causal)
