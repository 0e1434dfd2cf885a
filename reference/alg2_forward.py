"""FA1 Algorithm 2: the full FlashAttention forward pass (scale, mask, dropout), line by line.

Paper: Dao et al., "FlashAttention", Algorithm 2 (Appendix B.3). It is Algorithm 1
(:mod:`numba_flash_reference.alg1_forward`) with three additions inside the inner loop:

* line 10: the softmax scale ``tau`` (default ``1/sqrt(d)``);
* line 11: the mask, here flash-attn's *bottom-right aligned causal* mask
  (:func:`~numba_flash_reference.common.causal_mask`), applied per tile, elementwise;
* line 14: dropout on the tile ``P~_ij`` with the counter-hash keep-mask of
  :func:`~numba_flash_reference.common.dropout_scale_matrix`. The paper's "PRNG state R" (line 1) is
  the integer ``seed``: the mask of entry ``(row, col)`` of head ``bh`` is a pure function of
  ``(seed, bh, row, col)``, so the backward pass regenerates it instead of storing it.

What a reader learns
--------------------
* Where each addition enters the recurrence. The statistics ``m, l`` are computed from the
  **undropped** ``P~_ij`` (line 13), dropout only touches what is multiplied into ``V_j`` (line 15);
  so ``l`` is still the softmax normalizer and ``O = dropout(softmax(S)) V``.
* How to survive masked rows. A tile row that the causal mask hides entirely has ``m~_ij = -inf``;
  a query row that sees no key at all (``s_q > s_k``) keeps ``m_i = -inf``, ``l_i = 0`` to the end.
  ``exp(-inf - (-inf))`` would be NaN, so the rescale factors go through
  :func:`~numba_flash_reference.online_softmax.rescale` (0 there) and ``O_i`` is divided only where
  ``l_new > 0``: fully masked rows give ``O = 0``, ``m = -inf``, ``l = 0``, ``L = +inf``, never NaN.

Loop structure, HBM traffic and SRAM budget are those of Algorithm 1: outer loop over ``Tc`` key/value
blocks, inner over ``Tr`` query blocks, ``O_i, l_i, m_i`` read and rewritten at every inner step.
Algorithm 2 skips no tile (FlashAttention-2 does, see :mod:`numba_flash_reference.fa2_forward`), so
its HBM accesses equal Algorithm 1's with or without the causal mask. The SRAM adds ``Br Bc`` for the
dropout tile ``Z_ij`` (recomputed from the hash, never loaded).

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg2_forward import flash_forward_alg2
    >>> from numba_flash_reference.alg0_standard import standard_attention
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 9, 2, 5))
    >>> out = flash_forward_alg2(q, k, v, causal=True, dropout_p=0.2, seed=7, Br=2, Bc=4)
    >>> ref = standard_attention(q, k, v, causal=True, dropout_p=0.2, seed=7)
    >>> bool(np.allclose(out.O, ref.O) and np.allclose(out.L, ref.L))
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .alg0_standard import AttentionResult
from .common import (
    block_sizes,
    causal_mask,
    check_qkv,
    default_scale,
    dropout_scale_matrix,
    dropout_threshold,
    kv_head,
    logsumexp_from_stats,
    seq_blocks,
)
from .hbm import hbm
from .online_softmax import rescale


@dataclass
class FlashResult(AttentionResult):
    """What FA1 Algorithms 2 and 5 return (line 19 / line 20): ``O, l, m`` and the PRNG state ``R``.

    O: (b, s_q, h, d); m, l, L: (b, h, s_q); ``seed`` is R. ``L = m + log l`` is derived from the
    returned ``m, l`` after the algorithm (flash-attn's ``softmax_lse``).
    """

    seed: int = 0


def flash_forward_alg2(
    q, k, v, softmax_scale=None, causal=False, dropout_p=0.0, seed=0, M=None, Br=None, Bc=None, counter=None
):
    """FA1 Algorithm 2 on (b, s, h, d) inputs, in float64.

    Parameters
    ----------
    q : array_like, (b, s_q, h, d)
    k, v : array_like, (b, s_k, h_k, d)
        ``h`` a multiple of ``h_k`` (GQA/MQA).
    softmax_scale : float, optional
        tau (line 10); default ``1/sqrt(d)``.
    causal : bool
        Bottom-right aligned causal mask (line 11).
    dropout_p : float in [0, 1)
        Dropout probability (line 14).
    seed : int
        The PRNG state R of line 1 (the counter-hash seed).
    M : int, optional
        SRAM size in elements (line 2); ``Br``, ``Bc`` override the block sizes.
    counter : HBMCounter, optional
        Count every HBM load and store.

    Returns
    -------
    FlashResult
        ``O, m, l, L, seed``.

    Notes
    -----
    Symbol table (paper symbol -> variable -> memory space):

    ==========================  ======================  ==========================
    Q, K, V, O, l, m            gQ, gK, gV, gO, gl, gm  HBM (counted when wrapped)
    R                           seed                    host integer (O(1), not counted)
    Q_i, O_i, l_i, m_i          Q_i, O_i, l_i, m_i      SRAM copies (rows of block i)
    K_j, V_j                    K_j, V_j                SRAM copies (rows of block j)
    S_ij, S_ij^masked           S_ij, S_masked          SRAM (Br x Bc)
    P~_ij, P~_ij^dropped        P_tilde, P_dropped      SRAM (Br x Bc)
    Z_ij (dropout scale)        Z_ij                    SRAM, regenerated from (seed, bh, row, col)
    m~_ij, l~_ij                m_tilde, l_tilde        SRAM (Br,)
    m_i^new, l_i^new            m_new, l_new            SRAM (Br,)
    ==========================  ======================  ==========================
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    tau = default_scale(d, softmax_scale)
    dropout_threshold(dropout_p)  # validates 0 <= p < 1

    # Alg.2 L1: initialize the PRNG state R and save it to HBM  (R is the integer seed: nothing to store per element)
    R = int(seed)
    # Alg.2 L2: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)  (overridable)
    Br, Bc = block_sizes(d, M, Br, Bc)

    # Alg.2 L3: in HBM, O = (0) N x d, l = (0) N, m = (-inf) N
    # (an allocation, not counted as accesses, here and in the backward references; a kernel skips it
    # by treating the first visit of each row block specially)
    O = np.zeros((b, s_q, h, d))
    l = np.zeros((b, h, s_q))
    m = np.full((b, h, s_q), -np.inf)
    gQ, gK, gV = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V")
    gO, gl, gm = hbm(O, counter, "O"), hbm(l, counter, "l"), hbm(m, counter, "m")

    # Alg.2 L4: split Q into Tr blocks Q_i (Br x d), K and V into Tc blocks K_j, V_j (Bc x d)
    row_blocks = [slice(r.start, r.stop) for r in seq_blocks(s_q, Br)]  # Tr; the last may be ragged
    col_blocks = [slice(c.start, c.stop) for c in seq_blocks(s_k, Bc)]  # Tc
    # Alg.2 L5: O_i, l_i, m_i are the row blocks of O, l, m that match Q_i

    # Dev: the paper's algorithm is for one head; every (batch, query head) runs it independently.
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            bh = bi * h + hi  # the dropout hash's head index (query head)
            # Alg.2 L6: for j = 1..Tc
            for cols in col_blocks:
                # Alg.2 L7: load K_j, V_j from HBM to SRAM
                K_j = gK[bi, cols, hk]  # HBM read: Bc*d
                V_j = gV[bi, cols, hk]  # HBM read: Bc*d
                # Alg.2 L8: for i = 1..Tr
                for rows in row_blocks:
                    # [doc:ref-alg2-inner-loop]
                    # Alg.2 L9: load Q_i, O_i, l_i, m_i from HBM to SRAM
                    Q_i = gQ[bi, rows, hi]  # HBM read: Br*d
                    O_i = gO[bi, rows, hi]  # HBM read: Br*d
                    l_i = gl[bi, hi, rows]  # HBM read: Br
                    m_i = gm[bi, hi, rows]  # HBM read: Br
                    # Alg.2 L10: S_ij = tau Q_i K_j^T  (Br x Bc)
                    S_ij = tau * (Q_i @ K_j.T)
                    # Alg.2 L11: S_ij^masked = mask(S_ij)  (causal, bottom-right aligned; -inf where hidden)
                    if causal:
                        visible = causal_mask(s_q, s_k, range(rows.start, rows.stop), range(cols.start, cols.stop))
                        S_masked = np.where(visible, S_ij, -np.inf)
                    else:
                        S_masked = S_ij
                    # Alg.2 L12: m~_ij = rowmax(S^masked), P~_ij = exp(S^masked - m~_ij), l~_ij = rowsum(P~_ij)
                    m_tilde = S_masked.max(axis=1)  # -inf on a tile row the mask hides entirely
                    m_tilde_safe = np.where(np.isfinite(m_tilde), m_tilde, 0.0)  # Dev: avoids -inf - -inf
                    P_tilde = np.exp(S_masked - m_tilde_safe[:, None])  # masked entries: exp(-inf) = 0
                    l_tilde = P_tilde.sum(axis=1)
                    # Alg.2 L13: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
                    # (undropped P~)
                    m_new = np.maximum(m_i, m_tilde)
                    alpha = rescale(m_i, m_new)  # Dev: 0 instead of NaN where m_new = -inf (row unseen so far)
                    beta = rescale(m_tilde, m_new)
                    l_new = alpha * l_i + beta * l_tilde
                    # Alg.2 L14: P~_ij^dropped = dropout(P~_ij, p_drop)  (Z_ij regenerated from R; kept / (1 - p))
                    if dropout_p > 0.0:
                        Z_ij = dropout_scale_matrix(
                            R, bh, range(rows.start, rows.stop), range(cols.start, cols.stop), dropout_p
                        )
                        P_dropped = P_tilde * Z_ij
                    else:
                        P_dropped = P_tilde
                    # Alg.2 L15: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~^dropped
                    # V_j)
                    numerator = (alpha * l_i)[:, None] * O_i + beta[:, None] * (P_dropped @ V_j)
                    gO[bi, rows, hi] = numerator / np.where(l_new > 0, l_new, 1.0)[:, None]  # HBM write: Br*d
                    # Alg.2 L16: l_i <- l_new, m_i <- m_new
                    gl[bi, hi, rows] = l_new  # HBM write: Br
                    gm[bi, hi, rows] = m_new  # HBM write: Br
                    # [/doc:ref-alg2-inner-loop]
                # Alg.2 L17: end for (i)
            # Alg.2 L18: end for (j)

    # Alg.2 L19: return O, l, m, R
    return FlashResult(O=O, m=m, l=l, L=logsumexp_from_stats(m, l), seed=R)
