"""Assignment 4, solution (course staff): FA1 Algorithm 4, the recomputation backward pass, for one head.

Paper: Dao et al., "FlashAttention", Algorithm 4 (Appendix B.4) and Theorem 5, without mask and
dropout (lines 12, 14, 15 and 18 are then identities), with the forward's statistics passed as the
logsumexp ``L = m + log l`` (FlashAttention-2's convention), so line 13 reads ``P_ij = exp(S_ij - L_i)``.

What it shows: the backward pass never sees ``P``. Each tile ``P_ij`` is *recomputed* from ``Q_i``,
``K_j`` and the saved ``L_i``; ``D_i = rowsum(dO_i * O_i)`` (the D trick, a length-d dot product instead
of the length-N ``rowsum(P * dP)``) comes from tiles already loaded. Only O(N) extra memory: no
N x N array exists at any time.

Arrays named ``g...`` are in "HBM": the autograder passes
:class:`numba_flash_reference.hbm.HBMArray` s that count every ``x[...]`` load and ``x[...] = y``
store. Everything else is "on chip" and free.

Kept by course staff: ``stub.py`` is the student's copy.
"""

from __future__ import annotations

import numpy as np


def flash_backward(gQ, gK, gV, gO, gdO, gL, tau, Br, Bc, gdQ, gdK, gdV):
    """Gradients of ``O = softmax(tau Q K^T) V`` for one head, tile by tile (FA1 Algorithm 4).

    Parameters
    ----------
    gQ : array, (N, d)
        Q in HBM (an ``HBMArray`` or a NumPy array: index it, never iterate it).
    gK, gV : array, (N_k, d)
        K, V in HBM.
    gO, gdO : array, (N, d)
        The forward's output O and the upstream gradient dO, in HBM.
    gL : array, (N,)
        The forward's logsumexp ``L = m + log l`` per row, in HBM.
    tau : float
        The softmax scale.
    Br, Bc : int
        Tile sizes: ``Q_i`` has ``Br`` rows, ``K_j, V_j`` have ``Bc`` rows (the last may be ragged).
    gdQ : array, (N, d)
        dQ in HBM, already zero (Alg.4 L5): accumulate into it.
    gdK, gdV : array, (N_k, d)
        dK, dV in HBM, full of NaN: write every element once.
    """
    N, N_k = gQ.shape[0], gK.shape[0]
    # Alg.4 L3-L4: split Q, O, dO, dQ, L into Tr row blocks and K, V into Tc column blocks
    row_blocks = [slice(r, min(r + Br, N)) for r in range(0, N, Br)]
    col_blocks = [slice(c, min(c + Bc, N_k)) for c in range(0, N_k, Bc)]
    # Alg.4 L6: for j = 1..Tc (outer loop over K/V tiles)
    for cj in col_blocks:
        # Alg.4 L7: load K_j, V_j (each element of K and V is read once in all)
        K_j = gK[cj]  # (Bc, d) SRAM; HBM read: Bc*d
        V_j = gV[cj]  # (Bc, d) SRAM; HBM read: Bc*d
        # Alg.4 L8: dK~_j = dV~_j = 0 on chip
        dK_j = np.zeros_like(K_j)
        dV_j = np.zeros_like(V_j)
        # Alg.4 L9: for i = 1..Tr (inner loop over Q tiles)
        for ri in row_blocks:
            # Alg.4 L10: load Q_i, O_i, dO_i, dQ_i, L_i
            Q_i = gQ[ri]  # (Br, d); HBM read: Br*d
            O_i = gO[ri]  # (Br, d); HBM read: Br*d
            dO_i = gdO[ri]  # (Br, d); HBM read: Br*d
            dQ_i = gdQ[ri]  # (Br, d); HBM read: Br*d
            L_i = gL[ri]  # (Br,); HBM read: Br
            # Alg.4 L11: S_ij = tau Q_i K_j^T
            S_ij = tau * (Q_i @ K_j.T)  # (Br, Bc)
            # Alg.4 L13: P_ij = diag(l_i)^-1 exp(S_ij - m_i) = exp(S_ij - L_i): the exact softmax, recomputed
            P_ij = np.exp(S_ij - L_i[:, None])
            # Alg.4 L16: dV~_j += P_ij^T dO_i
            dV_j += P_ij.T @ dO_i
            # Alg.4 L17: dP_ij = dO_i V_j^T
            dP_ij = dO_i @ V_j.T
            # Alg.4 L19: D_i = rowsum(dO_i o O_i), the D trick (= rowsum(P_i: o dP_i:) over the WHOLE row)
            D_i = np.sum(dO_i * O_i, axis=1)
            # Alg.4 L20: dS_ij = P_ij o (dP_ij - D_i)
            dS_ij = P_ij * (dP_ij - D_i[:, None])
            # Alg.4 L21: dQ_i <- dQ_i + tau dS_ij K_j, written back to HBM on every (i, j)
            gdQ[ri] = dQ_i + tau * (dS_ij @ K_j)  # HBM write: Br*d
            # Alg.4 L22: dK~_j += tau dS_ij^T Q_i
            dK_j += tau * (dS_ij.T @ Q_i)
        # Alg.4 L24: write dK_j, dV_j to HBM
        gdK[cj] = dK_j  # HBM write: Bc*d
        gdV[cj] = dV_j  # HBM write: Bc*d
