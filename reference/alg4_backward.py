"""FA1 Algorithm 4: the FlashAttention backward pass, recomputing S and P block by block.

Paper: Dao et al., "FlashAttention", Algorithm 4 (Appendix B.4), Theorem 5. The forward pass
(Algorithm 2) saved only ``O`` and the row statistics ``l, m`` (O(N) extra memory). The backward pass
recomputes each score block ``S_ij`` and probability block ``P_ij`` on chip from ``Q_i, K_j`` and the
*final* ``l_i, m_i``, regenerates the dropout mask ``Z_ij`` from the seed, and never writes an N x N
matrix to HBM: Theta(N^2 d^2 / M) HBM accesses instead of Algorithm 3's Theta(Nd + N^2).

The derivation in four lines
----------------------------
With ``S = tau Q K^T`` (masked), ``P = softmax(S)`` (row-wise), ``O = (P o Z) V`` and upstream ``dO``:

1. ``dV = (P o Z)^T dO`` and ``dP = (dO V^T) o Z`` (chain rule through the dropout scale ``Z``).
2. Softmax Jacobian ``diag(p) - p p^T`` per row: ``dS_ij = P_ij (dP_ij - D_i)``, ``D_i = sum_l P_il dP_il``.
3. **D trick** (eq. 4): ``D_i = sum_l P_il Z_il (dO_i . v_l) = dO_i . O_i``, a length-d dot product
   that needs only the saved ``O``; it holds with dropout because ``O`` is built from ``P o Z``.
4. ``dQ = tau dS K`` and ``dK = tau dS^T Q``. Each of ``dV_j, dK_j`` sums over all row blocks ``i``
   (accumulated on chip), while ``dQ_i`` sums over all column blocks ``j`` (accumulated in HBM).

**Recomputation** (line 13): ``P_ij = diag(l_i)^-1 exp(S_ij - m_i)`` is the exact softmax because
``l_i, m_i`` are the forward's *final* statistics (no online rescaling is needed in the backward pass).
A fully masked row has ``l_i = 0, m_i = -inf``: we take ``P_ij = 0`` there (no NaN), so its gradients
are 0, as in flash-attn.

Loop structure (the paper's, one (batch, KV head) at a time)::

    for j in 1..Tc:                  # L6  outer: K_j, V_j stay on chip, dK~_j, dV~_j accumulate there
        load K_j, V_j; dK~_j = dV~_j = 0
        for i in 1..Tr:              # L9  inner: everything row-indexed comes from HBM
            load Q_i, O_i, dO_i, dQ_i, l_i, m_i
            recompute S_ij, P_ij, Z_ij; dV~_j += ..., dQ_i += ... (written back), dK~_j += ...
        write dK_j, dV_j

GQA/MQA: the ``G = nheads / nheads_k`` query heads sharing KV head ``hk`` run inside the ``j`` loop, as
``G * Tr`` row blocks, so ``K_j, V_j`` are still read once and ``dK_j, dV_j`` (summed over the group)
written once. The causal mask is applied elementwise on every block (line 12, the paper's generic
``mask``); FA1 does not skip fully masked blocks (that is FA2's optimisation, see
:mod:`numba_flash_reference.fa2_backward`), so the IO counts below do not depend on ``causal``.

SRAM budget
-----------
On chip at once (elements): ``K_j, V_j, dK~_j, dV~_j``: 4 Bc d; ``Q_i, O_i, dO_i, dQ_i``: 4 Br d;
``S_ij/P_ij`` and ``dP_ij/dS_ij`` (each pair can share a buffer; ``Z_ij`` is regenerated per element):
2 Br Bc; ``l_i, m_i, D_i``: 3 Br. With Algorithm 1 line 1's ``Bc = ceil(M/4d)``, ``Br = min(Bc, d)`` this
is at most about 2.5 M, i.e. Theta(M), which is all Theorem 5 needs; a kernel picks tiles that fit its
real SRAM (block sizes are arguments here).

HBM accesses (what ``counter`` counts)
--------------------------------------
With ``counter=HBMCounter()`` the arrays Q, K, V, O, dO, l, m, dQ, dK, dV are
:class:`~numba_flash_reference.hbm.HBMArray` s and every load/store below is counted, in elements, on
every block (ragged tail blocks count their true size). Per batch and KV head, with ``G`` query heads,
``Tc = ceil(N_k / Bc)``, ``Tr = ceil(N_q / Br)``:

=======  =============================================================  ==================================
line     reads                                                          writes
=======  =============================================================  ==================================
L7       ``K`` N_k*d, ``V`` N_k*d (each K_j, V_j once)                   --
L10      ``Q, O, dO, dQ`` G*Tc*N_q*d each; ``l, m`` G*Tc*N_q each        --
L21      --                                                             ``dQ`` G*Tc*N_q*d
L24      --                                                             ``dK`` N_k*d, ``dV`` N_k*d
=======  =============================================================  ==================================

Total per query head (G = 1): ``2 N_k d + Tc (4 N_q d + 2 N_q) + Tc N_q d + 2 N_k d`` =
Theta(N d Tc) = Theta(N^2 d^2 / M) (Theorem 5). Not counted: line 5's zero-initialisation of dQ, dK, dV
(an allocation, like the forward's line 2; Theorem 5's count leaves it out too) and the seed (line 1).

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg0_standard import standard_attention
    >>> from numba_flash_reference.alg4_backward import flash_backward
    >>> q, k, v, dout = np.random.default_rng(0).standard_normal((4, 1, 9, 2, 5))
    >>> fwd = standard_attention(q, k, v, causal=True)
    >>> dq, dk, dv = flash_backward(dout, q, k, v, fwd.O, fwd.l, fwd.m, causal=True, Br=4, Bc=3)
    >>> dq.shape
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


def recompute_probabilities(S_ij, l_i, m_i):
    """Alg.4 L13: ``P_ij = diag(l_i)^-1 exp(S_ij - m_i)`` from the forward's final statistics.

    A fully masked row (``m_i = -inf``, ``l_i = 0``) gives ``P_ij = 0``: ``m`` is replaced by 0 so that
    ``exp(-inf - 0) = 0`` (not ``exp(-inf + inf) = NaN``) and ``1 / l`` by 0.
    """
    m_safe = np.where(np.isfinite(m_i), m_i, 0.0)
    inv_l = np.zeros_like(l_i)
    np.divide(1.0, l_i, out=inv_l, where=l_i > 0)
    return np.exp(S_ij - m_safe[:, None]) * inv_l[:, None]


def flash_backward(
    dout,
    q,
    k,
    v,
    out,
    l,
    m,
    softmax_scale=None,
    causal=False,
    dropout_p=0.0,
    seed=0,
    M=None,
    Br=None,
    Bc=None,
    counter=None,
):
    """FA1 Algorithm 4: gradients by recomputation, tile by tile, in float64.

    Parameters
    ----------
    dout : array_like, (b, s_q, h, d)
        dO, the upstream gradient of the output.
    q, k, v : array_like, (b, s_q, h, d) and (b, s_k, h_k, d)
        The forward pass's inputs.
    out : array_like, (b, s_q, h, d)
        O, the forward pass's output (with dropout: built from ``P o Z``).
    l, m : array_like, (b, h, s_q)
        The forward's final row statistics (sum and max of the *undropped* scores), e.g.
        ``standard_attention(...).l`` and ``.m``; fully masked rows have ``l = 0``, ``m = -inf``.
    softmax_scale : float, optional
        tau; default 1/sqrt(d).
    causal : bool
        Bottom-right aligned causal mask.
    dropout_p : float in [0, 1)
        Dropout probability of the forward pass.
    seed : int
        Dropout seed of the forward pass (``R`` of Algorithm 4).
    M, Br, Bc : int, optional
        SRAM size in elements and block sizes (:func:`numba_flash_reference.common.block_sizes`).
    counter : HBMCounter, optional
        Count HBM loads/stores (table in the module docstring).

    Returns
    -------
    dq, dk, dv : ndarray, float64
        Same layouts as ``q``, ``k``, ``v``; ``dk``, ``dv`` are summed over each GQA group.
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    check_grad_inputs(q, dout, out, l=l, m=m)
    dropout_threshold(dropout_p)  # validates p
    q, k, v, dout, out, l, m = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout, out, l, m))
    tau = default_scale(d, softmax_scale)
    G = h // h_k  # query heads per KV head (1 without GQA/MQA)

    # Alg.4 L1: set the PRNG state to R. Here R is the seed: Z_ij is a pure function of
    # (seed, bh, row, col) (common.dropout_scale_matrix), so nothing else needs restoring.
    # Alg.4 L2: block sizes, as in Alg.1 L1 (or given)
    Br, Bc = block_sizes(d, M, Br, Bc)
    # Alg.4 L3: split Q into Tr blocks Q_i (Br x d), K and V into Tc blocks K_j, V_j (Bc x d)
    row_blocks = seq_blocks(s_q, Br)  # Tr ranges; the last may be ragged
    col_blocks = seq_blocks(s_k, Bc)  # Tc ranges
    gQ, gK, gV = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V")
    # Alg.4 L4: split O, dO (Tr blocks of Br x d) and l, m (Tr blocks of Br): same row ranges
    gO, gdO = hbm(out, counter, "O"), hbm(dout, counter, "dO")
    gl, gm = hbm(l, counter, "l"), hbm(m, counter, "m")
    # Alg.4 L5: dQ = 0, dK = dV = 0 in HBM (an allocation: not counted)
    dq = np.zeros((b, s_q, h, d))
    dk = np.zeros((b, s_k, h_k, d))
    dv = np.zeros((b, s_k, h_k, d))
    gdQ, gdK, gdV = hbm(dq, counter, "dQ"), hbm(dk, counter, "dK"), hbm(dv, counter, "dV")

    for bi in range(b):
        for hk in range(h_k):
            # Alg.4 L6: outer loop over the K/V blocks
            for cols in col_blocks:
                cj = slice(cols.start, cols.stop)
                # Alg.4 L7: load K_j, V_j into SRAM
                K_j = gK[bi, cj, hk]  # (Bc, d) SRAM; HBM read: Bc*d
                V_j = gV[bi, cj, hk]  # (Bc, d) SRAM; HBM read: Bc*d
                # Alg.4 L8: dK~_j = dV~_j = 0 on chip
                dK_tilde_j = np.zeros((len(cols), d))  # (Bc, d) SRAM
                dV_tilde_j = np.zeros((len(cols), d))  # (Bc, d) SRAM

                # [doc:ref-alg4-inner-loop]
                # Dev: GQA/MQA: the G query heads sharing K_j, V_j are G * Tr more row blocks of this loop
                for hi in range(hk * G, (hk + 1) * G):
                    bh = bi * h + hi  # the dropout hash's head index (the query head)
                    # Alg.4 L9: inner loop over the Q blocks
                    for rows in row_blocks:
                        ri = slice(rows.start, rows.stop)
                        # Alg.4 L10: load Q_i, O_i, dO_i, dQ_i, l_i, m_i into SRAM
                        Q_i = gQ[bi, ri, hi]  # (Br, d); HBM read: Br*d
                        O_i = gO[bi, ri, hi]  # (Br, d); HBM read: Br*d
                        dO_i = gdO[bi, ri, hi]  # (Br, d); HBM read: Br*d
                        dQ_i = gdQ[bi, ri, hi]  # (Br, d); HBM read: Br*d
                        l_i = gl[bi, hi, ri]  # (Br,); HBM read: Br
                        m_i = gm[bi, hi, ri]  # (Br,); HBM read: Br
                        # Alg.4 L11: S_ij = tau Q_i K_j^T
                        S_ij = tau * (Q_i @ K_j.T)  # (Br, Bc)
                        # Alg.4 L12: S_ij^masked = mask(S_ij); here the bottom-right causal mask
                        if causal:
                            S_ij = np.where(causal_mask(s_q, s_k, rows, cols), S_ij, -np.inf)
                        # Alg.4 L13: P_ij = diag(l_i)^-1 exp(S_ij^masked - m_i), the exact softmax
                        P_ij = recompute_probabilities(S_ij, l_i, m_i)
                        # Alg.4 L14: Z_ij regenerated from the seed: 1/(1-p) where kept, 0 where dropped
                        Z_ij = dropout_scale_matrix(seed, bh, rows, cols, dropout_p)
                        # Alg.4 L15: P_ij^dropped = P_ij o Z_ij
                        P_dropped_ij = P_ij * Z_ij
                        # Alg.4 L16: dV~_j += (P_ij^dropped)^T dO_i
                        dV_tilde_j += P_dropped_ij.T @ dO_i
                        # Alg.4 L17: dP_ij^dropped = dO_i V_j^T
                        dP_dropped_ij = dO_i @ V_j.T
                        # Alg.4 L18: dP_ij = dP_ij^dropped o Z_ij
                        dP_ij = dP_dropped_ij * Z_ij
                        # Alg.4 L19: D_i = rowsum(dO_i o O_i), the D trick (length d, not N)
                        D_i = np.sum(dO_i * O_i, axis=1)
                        # Alg.4 L20: dS_ij = P_ij o (dP_ij - D_i)
                        dS_ij = P_ij * (dP_ij - D_i[:, None])
                        # Alg.4 L21: dQ_i <- dQ_i + tau dS_ij K_j, written back on every (i, j)
                        gdQ[bi, ri, hi] = dQ_i + tau * (dS_ij @ K_j)  # HBM write: Br*d
                        # Alg.4 L22: dK~_j += tau dS_ij^T Q_i
                        dK_tilde_j += tau * (dS_ij.T @ Q_i)
                # [/doc:ref-alg4-inner-loop]

                # Alg.4 L24: write dK_j <- dK~_j, dV_j <- dV~_j to HBM
                gdK[bi, cj, hk] = dK_tilde_j  # HBM write: Bc*d
                gdV[bi, cj, hk] = dV_tilde_j  # HBM write: Bc*d

    # Alg.4 L26: return dQ, dK, dV
    return dq, dk, dv
