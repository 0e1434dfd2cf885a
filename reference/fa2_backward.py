"""FA2 Algorithm 2: the FlashAttention-2 backward pass, from the logsumexp L and a D pre-pass.

Paper: Dao, "FlashAttention-2", Algorithm 2 ([FA2-ICLR] Appendix A). The math is FA1 Algorithm 4's
(:mod:`numba_flash_reference.alg4_backward`: ``dV = (P o Z)^T dO``, ``dP = (dO V^T) o Z``,
``dS = P o (dP - D)``, ``dQ = tau dS K``, ``dK = tau dS^T Q``); what changes is the schedule and what
the forward saved:

* **Only L = m + log l is saved** (FA2 Alg.1 L13), so line 11 recomputes ``P_ij = exp(S_ij - L_i)``:
  one subtraction instead of FA1's ``diag(l_i)^-1 exp(S_ij - m_i)``. A fully masked row has
  ``L_i = +inf`` and gets ``P = exp(-inf) = 0``, so no guard is needed and no NaN can appear.
* **D = rowsum(dO o O) is a pre-pass** (line 4), written to HBM once, so the main loop never loads O:
  FA1 recomputed ``D_i`` (line 19) on every one of the ``Tc`` passes.
* **Each column block j is independent** (line 5): in the kernel one thread block per ``j`` (times
  batch and head), with ``dK_j, dV_j`` accumulated on chip. Row blocks ``i`` are visited by every
  ``j``, so ``dQ_i`` is shared: the kernel adds ``dS_ij K_j`` into it with atomic adds (line 15). This
  serial reference does a read-modify-write instead, which gives the same sum.
* **Causal block skipping** (FA2 section 3.1, as the FA2 forward does): for column block ``j`` the loop
  starts at the first row block that sees any of its keys; the elementwise mask is applied only to
  blocks the diagonal crosses.

The paper's pseudocode leaves out the scale ``tau`` and dropout; we carry both exactly as FA1
Algorithm 4 does (``tau`` at lines 10, 15, 16; ``Z_ij`` regenerated from the seed at lines 12-13), so
the result equals :func:`numba_flash_reference.alg3_backward.standard_backward` with the semantics of
:mod:`numba_flash_reference.common` (bottom-right causal mask, counter-hash dropout, GQA/MQA: ``dK, dV``
summed over the ``G`` query heads of a group, which run as ``G * Tr`` row blocks inside the ``j`` loop).

Loop structure (per batch and KV head)::

    D = rowsum(dO o O)                  # L4   pre-pass over all rows, D to HBM
    for j in 1..Tc:                     # L5   independent (one thread block each in a kernel)
        load K_j, V_j; dK_j = dV_j = 0  # L6-L7
        for i in first_i(j)..Tr:        # L8   (first_i = 1 unless causal)
            load Q_i, dO_i, L_i, D_i    # L9
            S, P, dV_j +=, dP, dS       # L10-L14
            dQ_i += tau dS K_j          # L15  atomic add in a kernel
            dK_j += tau dS^T Q_i        # L16
        write dK_j, dV_j                # L18

SRAM budget: ``K_j, V_j, dK_j, dV_j`` 4 Bc d; ``Q_i, dO_i`` 2 Br d (``dQ_i`` is added to HBM, not
held); ``S/P`` and ``dP/dS`` 2 Br Bc; ``L_i, D_i`` 2 Br elements.

HBM accesses (what ``counter`` counts)
--------------------------------------
With ``counter=HBMCounter()`` the arrays Q, K, V, O, dO, L, D, dQ, dK, dV are
:class:`~numba_flash_reference.hbm.HBMArray` s; counts in elements, per batch and KV head with ``G``
query heads. ``n_blocks`` is the number of visited (i, j) blocks summed over ``j`` (``Tr * Tc``
without causal), and ``rows(i)`` is the number of rows in block ``i``:

=======  ===================================================  =========================================
line     reads                                                writes
=======  ===================================================  =========================================
L4       ``O`` G*N_q*d, ``dO`` G*N_q*d                         ``D`` G*N_q
L6       ``K`` N_k*d, ``V`` N_k*d (each K_j, V_j once)         --
L9       ``Q, dO`` d*rows(i); ``L, D`` rows(i), per visit      --
L15      ``dQ`` d*rows(i) per visit                            ``dQ`` d*rows(i) per visit
L18      --                                                   ``dK`` N_k*d, ``dV`` N_k*d
=======  ===================================================  =========================================

Without causal the L9/L15 totals are ``G*Tc*N_q*d`` for each of Q, dO, dQ-read, dQ-write and
``G*Tc*N_q`` for L and D. Departures from the paper's line 9 (``# Dev:`` in the code): ``O_i`` is not
loaded (the pre-pass made ``D_i``, the only thing the loop needed from ``O``), and ``dQ_i`` is loaded at
line 15, where the atomic add reads it, not at line 9. Not counted: line 3's zero-initialisation of
dQ (an allocation).

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg0_standard import standard_attention
    >>> from numba_flash_reference.fa2_backward import fa2_backward
    >>> q, k, v, dout = np.random.default_rng(0).standard_normal((4, 1, 9, 2, 5))
    >>> fwd = standard_attention(q, k, v, causal=True)
    >>> dq, dk, dv = fa2_backward(dout, q, k, v, fwd.O, fwd.L, causal=True, Br=4, Bc=3)
    >>> dk.shape
    (1, 9, 2, 5)
"""

from __future__ import annotations

import numpy as np

from .alg3_backward import check_grad_inputs
from .common import (
    block_sizes,
    causal_mask,
    check_qkv,
    default_scale,
    dropout_scale_matrix,
    dropout_threshold,
    seq_blocks,
)
from .hbm import hbm


def first_visible_row_block(col_start: int, s_q: int, s_k: int, Br: int) -> int:
    """Index of the first row block that sees key column ``col_start`` under the causal mask.

    Row ``r`` sees column ``c`` iff ``c <= r + s_k - s_q`` (bottom-right aligned), so the first row
    that sees the block's first (leftmost) column is ``max(0, col_start - (s_k - s_q))``; every
    earlier row block is fully masked for this column block. The result may be ``>= Tr`` (no row sees
    the block; then the loop is empty and ``dK_j = dV_j = 0``).
    """
    return max(0, col_start - (s_k - s_q)) // Br


def fa2_backward(
    dout,
    q,
    k,
    v,
    out,
    L,
    softmax_scale=None,
    causal=False,
    dropout_p=0.0,
    seed=0,
    M=None,
    Br=None,
    Bc=None,
    counter=None,
):
    """FA2 Algorithm 2: gradients from the logsumexp ``L``, column block by column block, in float64.

    Parameters
    ----------
    dout : array_like, (b, s_q, h, d)
        dO, the upstream gradient of the output.
    q, k, v : array_like, (b, s_q, h, d) and (b, s_k, h_k, d)
        The forward pass's inputs.
    out : array_like, (b, s_q, h, d)
        O, the forward pass's output (with dropout: built from ``P o Z``).
    L : array_like, (b, h, s_q)
        The forward's logsumexp ``m + log l`` of the undropped scores; ``+inf`` on fully masked rows
        (e.g. ``standard_attention(...).L``).
    softmax_scale : float, optional
        tau; default 1/sqrt(d).
    causal : bool
        Bottom-right aligned causal mask; fully masked blocks are skipped.
    dropout_p : float in [0, 1)
        Dropout probability of the forward pass.
    seed : int
        Dropout seed of the forward pass.
    M, Br, Bc : int, optional
        SRAM size in elements and block sizes (:func:`numba_flash_reference.common.block_sizes`;
        FA2 takes ``Br, Bc`` as inputs).
    counter : HBMCounter, optional
        Count HBM loads/stores (table in the module docstring).

    Returns
    -------
    dq, dk, dv : ndarray, float64
        Same layouts as ``q``, ``k``, ``v``; ``dk``, ``dv`` are summed over each GQA group.
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    check_grad_inputs(q, dout, out, L=L)
    dropout_threshold(dropout_p)  # validates p
    q, k, v, dout, out, L = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout, out, L))
    tau = default_scale(d, softmax_scale)
    G = h // h_k  # query heads per KV head (1 without GQA/MQA)
    Br, Bc = block_sizes(d, M, Br, Bc)
    offset = s_k - s_q  # causal: row r sees column c iff c <= r + offset

    # FA2.2 L1: split Q into Tr blocks Q_i (Br x d), K and V into Tc blocks K_j, V_j (Bc x d)
    row_blocks = seq_blocks(s_q, Br)  # Tr ranges; the last may be ragged
    col_blocks = seq_blocks(s_k, Bc)  # Tc ranges
    gQ, gK, gV = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V")
    # FA2.2 L2: split O, dO (Tr blocks) and L (Tr blocks): same row ranges
    gO, gdO, gL = hbm(out, counter, "O"), hbm(dout, counter, "dO"), hbm(L, counter, "L")
    # FA2.2 L3: dQ = 0 in HBM; dK, dV split into Tc blocks (allocations: not counted)
    dq = np.zeros((b, s_q, h, d))
    dk = np.zeros((b, s_k, h_k, d))
    dv = np.zeros((b, s_k, h_k, d))
    gdQ, gdK, gdV = hbm(dq, counter, "dQ"), hbm(dk, counter, "dK"), hbm(dv, counter, "dV")
    gD = hbm(np.zeros((b, h, s_q)), counter, "D")  # (b, h, N_q) HBM

    # [doc:ref-fa2-bwd-preprocess]
    # FA2.2 L4: D = rowsum(dO o O), a separate pre-pass; write D to HBM
    for bi in range(b):
        for hi in range(h):
            dO = gdO[bi, :, hi]  # HBM read: N_q*d
            O = gO[bi, :, hi]  # HBM read: N_q*d
            gD[bi, hi] = np.sum(dO * O, axis=1)  # HBM write: N_q
    # [/doc:ref-fa2-bwd-preprocess]

    for bi in range(b):
        for hk in range(h_k):
            # FA2.2 L5: loop over column blocks j; each is independent (one thread block in a kernel)
            for cols in col_blocks:
                cj = slice(cols.start, cols.stop)
                # FA2.2 L6: load K_j, V_j into SRAM
                K_j = gK[bi, cj, hk]  # (Bc, d) SRAM; HBM read: Bc*d
                V_j = gV[bi, cj, hk]  # (Bc, d) SRAM; HBM read: Bc*d
                # FA2.2 L7: dK_j = dV_j = 0 on chip
                dK_j = np.zeros((len(cols), d))  # (Bc, d) SRAM
                dV_j = np.zeros((len(cols), d))  # (Bc, d) SRAM
                # Dev: causal block skipping (FA2 section 3.1): row blocks before this one see no key of K_j
                i_first = first_visible_row_block(cols.start, s_q, s_k, Br) if causal else 0

                # [doc:ref-fa2-bwd-inner-loop]
                # Dev: GQA/MQA: the G query heads sharing K_j, V_j are G * Tr more row blocks of this loop
                for hi in range(hk * G, (hk + 1) * G):
                    bh = bi * h + hi  # the dropout hash's head index (the query head)
                    # FA2.2 L8: loop over row blocks i
                    for rows in row_blocks[i_first:]:
                        ri = slice(rows.start, rows.stop)
                        # FA2.2 L9: load Q_i, dO_i, L_i, D_i into SRAM
                        # Dev: no O_i (the L4 pre-pass made D_i from it); dQ_i is read at L15, by the add
                        Q_i = gQ[bi, ri, hi]  # (Br, d); HBM read: Br*d
                        dO_i = gdO[bi, ri, hi]  # (Br, d); HBM read: Br*d
                        L_i = gL[bi, hi, ri]  # (Br,); HBM read: Br
                        D_i = gD[bi, hi, ri]  # (Br,); HBM read: Br
                        # FA2.2 L10: S_ij = tau Q_i K_j^T (the paper omits tau)
                        S_ij = tau * (Q_i @ K_j.T)  # (Br, Bc)
                        # Dev: the causal mask, elementwise only on blocks the diagonal crosses
                        if causal and cols.stop - 1 > rows.start + offset:
                            S_ij = np.where(causal_mask(s_q, s_k, rows, cols), S_ij, -np.inf)
                        # FA2.2 L11: P_ij = exp(S_ij - L_i); L_i = +inf on a fully masked row gives P = 0
                        P_ij = np.exp(S_ij - L_i[:, None])
                        # FA2.2 L12: dV_j += P_ij^T dO_i; with dropout P_ij o Z_ij (Z_ij regenerated, as FA1 L14-L16)
                        Z_ij = dropout_scale_matrix(seed, bh, rows, cols, dropout_p)
                        dV_j += (P_ij * Z_ij).T @ dO_i
                        # FA2.2 L13: dP_ij = dO_i V_j^T; with dropout times Z_ij (as FA1 L17-L18)
                        dP_ij = (dO_i @ V_j.T) * Z_ij
                        # FA2.2 L14: dS_ij = P_ij o (dP_ij - D_i)
                        dS_ij = P_ij * (dP_ij - D_i[:, None])
                        # FA2.2 L15: dQ_i += tau dS_ij K_j. A kernel does this with atomic adds, because
                        # all column blocks j (thread blocks) add into the same dQ_i; here a read-modify-write.
                        dQ_i = gdQ[bi, ri, hi]  # HBM read: Br*d
                        gdQ[bi, ri, hi] = dQ_i + tau * (dS_ij @ K_j)  # HBM write: Br*d
                        # FA2.2 L16: dK_j += tau dS_ij^T Q_i
                        dK_j += tau * (dS_ij.T @ Q_i)
                # [/doc:ref-fa2-bwd-inner-loop]

                # FA2.2 L18: write dK_j, dV_j to HBM
                gdK[bi, cj, hk] = dK_j  # HBM write: Bc*d
                gdV[bi, cj, hk] = dV_j  # HBM write: Bc*d

    # FA2.2 L20: return dQ, dK, dV
    return dq, dk, dv
