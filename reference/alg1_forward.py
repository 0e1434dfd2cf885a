"""FA1 Algorithm 1: the tiled forward pass, line by line, with O, l and m living in HBM.

Paper: Dao et al., "FlashAttention", Algorithm 1 (section 3.1), the simplified forward pass: no scale,
no mask, no dropout (those are Algorithm 2, :mod:`numba_flash_reference.alg2_forward`).

What a reader learns
--------------------
* **The loop order of FA1.** The *outer* loop runs over key/value blocks ``K_j, V_j`` (line 5), the
  *inner* loop over query blocks ``Q_i`` (line 7). Each ``K_j, V_j`` is read from HBM once, but every
  inner step reads ``Q_i, O_i, l_i, m_i`` (line 8) and writes ``O_i, l_i, m_i`` back (lines 12-13): the
  running output and statistics make ``Tc`` round trips through HBM. That is the ``Theta(N^2 d^2 / M)``
  of Theorem 2 (``Tc = ceil(N / Bc)`` passes over ``Q`` and ``O``, ``Bc = Theta(M / d)``), and the traffic
  FlashAttention-2 later removes by swapping the loops (:mod:`numba_flash_reference.fa2_forward`).
* **Online softmax** (:mod:`numba_flash_reference.online_softmax`): line 10 summarizes a tile by its row
  max ``m_tilde`` and row sum ``l_tilde``, line 11 merges them with the running ``(m_i, l_i)``, line 12
  merges the outputs. The stored ``O`` is always *normalized*: each step un-normalizes it (times
  ``l_i``), moves it to the new max (times ``exp(m_i - m_new)``), adds the tile's contribution and
  divides by ``l_new``. After the last ``j`` the result is exactly ``softmax(Q K^T) V`` (Theorem 1).

Loop structure and memory
-------------------------
For each (batch, query head) ``Tc x Tr`` tile steps; ``Tr = ceil(s_q / Br)`` and ``Tc = ceil(s_k / Bc)``,
and the last row/column block may be ragged (shorter). "HBM" arrays are ``q, k, v, O, l, m``; when a
:class:`~numba_flash_reference.hbm.HBMCounter` is passed they are wrapped with
:func:`~numba_flash_reference.hbm.hbm` so that every load and store below is counted.

SRAM budget (elements) of one inner step: ``K_j, V_j``: ``2 Bc d``; ``Q_i, O_i``: ``2 Br d``;
``l_i, m_i``: ``2 Br``; ``S_ij`` / ``P_tilde``: ``Br Bc``. Line 1's ``Bc = ceil(M / 4d)``,
``Br = min(Bc, d)`` make each of these ``O(M)`` (about ``M/2 + M/2 + M/4`` in all): Theorem 2 needs only
``Theta(M)``, which is what the factor 4 buys.

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg1_forward import flash_forward_alg1
    >>> from numba_flash_reference.alg0_standard import standard_attention
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 10, 2, 4))
    >>> out = flash_forward_alg1(q, k, v, Br=3, Bc=4)
    >>> bool(np.allclose(out.O, standard_attention(q, k, v, softmax_scale=1.0).O))
    True
"""

from __future__ import annotations

import numpy as np

from .alg0_standard import AttentionResult
from .common import block_sizes, check_qkv, default_scale, kv_head, logsumexp_from_stats, seq_blocks
from .hbm import hbm


def flash_forward_alg1(q, k, v, M=None, Br=None, Bc=None, counter=None, softmax_scale=1.0):
    """FA1 Algorithm 1 on (b, s, h, d) inputs, in float64.

    Parameters
    ----------
    q : array_like, (b, s_q, h, d)
    k, v : array_like, (b, s_k, h_k, d)
        ``h`` a multiple of ``h_k`` (GQA/MQA: query head ``h`` reads KV head ``h // (h / h_k)``).
    M : int, optional
        SRAM size in elements for line 1 (default :data:`~numba_flash_reference.common.DEFAULT_SRAM_ELEMENTS`).
    Br, Bc : int, optional
        Block sizes overriding line 1.
    counter : HBMCounter, optional
        Count every HBM load and store (see :mod:`numba_flash_reference.io_model`).
    softmax_scale : float or None
        Algorithm 1 computes ``S = Q K^T`` unscaled, hence the default 1.0; pass ``None`` for
        ``1/sqrt(d)`` (what :func:`~numba_flash_reference.alg0_standard.standard_attention` uses by default).

    Returns
    -------
    AttentionResult
        ``O`` (b, s_q, h, d) and the final ``m``, ``l`` and ``L = m + log l`` (b, h, s_q).

    Notes
    -----
    Symbol table (paper symbol -> variable -> memory space):

    ==========================  ======================  ==========================
    Q, K, V, O, l, m            gQ, gK, gV, gO, gl, gm  HBM (counted when wrapped)
    Q_i, O_i, l_i, m_i          Q_i, O_i, l_i, m_i      SRAM copies (rows of block i)
    K_j, V_j                    K_j, V_j                SRAM copies (rows of block j)
    S_ij, P~_ij                 S_ij, P_tilde           SRAM (Br x Bc)
    m~_ij, l~_ij                m_tilde, l_tilde        SRAM (Br,)
    m_i^new, l_i^new            m_new, l_new            SRAM (Br,)
    ==========================  ======================  ==========================
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    tau = default_scale(d, softmax_scale)  # Dev: not in Algorithm 1; 1.0 (no scaling) by default

    # Alg.1 L1: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)  (overridable)
    Br, Bc = block_sizes(d, M, Br, Bc)

    # Alg.1 L2: in HBM, O = (0) N x d, l = (0) N, m = (-inf) N
    # (an allocation, not counted as accesses, here and in the backward references; a kernel skips it
    # by treating the first visit of each row block specially)
    O = np.zeros((b, s_q, h, d))
    l = np.zeros((b, h, s_q))
    m = np.full((b, h, s_q), -np.inf)
    gQ, gK, gV = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V")
    gO, gl, gm = hbm(O, counter, "O"), hbm(l, counter, "l"), hbm(m, counter, "m")

    # Alg.1 L3: split Q into Tr = ceil(N / Br) blocks Q_i (Br x d), K and V into Tc = ceil(N / Bc) blocks
    row_blocks = [slice(r.start, r.stop) for r in seq_blocks(s_q, Br)]  # Tr of them; the last may be ragged
    col_blocks = [slice(c.start, c.stop) for c in seq_blocks(s_k, Bc)]  # Tc of them
    # Alg.1 L4: O_i, l_i, m_i are the row blocks of O, l, m that match Q_i (same slices)

    # Dev: the paper's algorithm is for one head; every (batch, query head) runs it independently.
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            # Alg.1 L5: for j = 1..Tc (outer loop over K/V blocks)
            for cols in col_blocks:
                # Alg.1 L6: load K_j, V_j from HBM to SRAM
                K_j = gK[bi, cols, hk]  # HBM read: Bc*d
                V_j = gV[bi, cols, hk]  # HBM read: Bc*d
                # Alg.1 L7: for i = 1..Tr (inner loop over Q blocks)
                for rows in row_blocks:
                    # [doc:ref-alg1-inner-loop]
                    # Alg.1 L8: load Q_i, O_i, l_i, m_i from HBM to SRAM
                    Q_i = gQ[bi, rows, hi]  # HBM read: Br*d
                    O_i = gO[bi, rows, hi]  # HBM read: Br*d
                    l_i = gl[bi, hi, rows]  # HBM read: Br
                    m_i = gm[bi, hi, rows]  # HBM read: Br
                    # Alg.1 L9: S_ij = Q_i K_j^T  (Br x Bc)
                    S_ij = tau * (Q_i @ K_j.T)
                    # Alg.1 L10: m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)
                    m_tilde = S_ij.max(axis=1)
                    P_tilde = np.exp(S_ij - m_tilde[:, None])
                    l_tilde = P_tilde.sum(axis=1)
                    # Alg.1 L11: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
                    m_new = np.maximum(m_i, m_tilde)
                    alpha = np.exp(m_i - m_new)  # 0 at j = 1, where m_i = -inf (and l_i = 0, O_i = 0)
                    beta = np.exp(m_tilde - m_new)
                    l_new = alpha * l_i + beta * l_tilde
                    # Alg.1 L12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
                    gO[bi, rows, hi] = ((alpha * l_i)[:, None] * O_i + beta[:, None] * (P_tilde @ V_j)) / l_new[
                        :, None
                    ]  # HBM write: Br*d
                    # Alg.1 L13: l_i <- l_new, m_i <- m_new
                    gl[bi, hi, rows] = l_new  # HBM write: Br
                    gm[bi, hi, rows] = m_new  # HBM write: Br
                    # [/doc:ref-alg1-inner-loop]
                # Alg.1 L14: end for (i)
            # Alg.1 L15: end for (j)

    # Alg.1 L16: return O  (l and m too, for the tests and the backward pass)
    return AttentionResult(O=O, m=m, l=l, L=logsumexp_from_stats(m, l))
