"""FA1 Algorithm 0: standard attention, the oracle every other algorithm is checked against.

Paper: Dao et al., "FlashAttention", Algorithm 0 (section 2.2). Standard attention materializes the
N x N score matrix ``S`` and probability matrix ``P`` in HBM, reads them back, and only then forms
``O = P V``. That traffic (Theta(Nd + N^2) accesses, Theorem 2) is what FlashAttention removes.

This reference computes in float64 with the full semantics of FA1 Algorithm 2 and flash-attn's
``flash_attn_func`` (scale, bottom-right causal mask, dropout from the counter hash, GQA/MQA,
``seqlen_q != seqlen_k``); see :mod:`numba_flash_reference.common`. It is deliberately plain: one
(batch, head) at a time, whole matrices, no tiling.

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg0_standard import standard_attention
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 5, 2, 4))
    >>> standard_attention(q, k, v).O.shape
    (1, 5, 2, 4)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import causal_mask, check_qkv, default_scale, dropout_scale_matrix, kv_head, logsumexp_from_stats
from .hbm import hbm


@dataclass
class AttentionResult:
    """Output and row statistics, in flash-attn's layouts.

    O: (b, s_q, h, d); m, l, L: (b, h, s_q); S, P: (b, h, s_q, s_k) when requested (P undropped).
    """

    O: np.ndarray
    m: np.ndarray
    l: np.ndarray
    L: np.ndarray
    S: np.ndarray | None = None
    P: np.ndarray | None = None


def masked_scores(Q, K, tau, causal):
    """S = tau Q K^T with masked entries set to -inf (one head, float64)."""
    S = tau * (Q @ K.T)
    if causal:
        S = np.where(causal_mask(Q.shape[0], K.shape[0]), S, -np.inf)
    return S


def row_softmax(S):
    """P = softmax(S) by rows, plus the statistics m = rowmax(S), l = rowsum(exp(S - m)).

    A row whose entries are all -inf gets P = 0, m = -inf, l = 0 (no NaN).
    """
    m = S.max(axis=1)
    m_safe = np.where(np.isfinite(m), m, 0.0)  # a fully masked row: exp(-inf - 0) = 0
    E = np.exp(S - m_safe[:, None])
    l = E.sum(axis=1)
    P = E / np.where(l > 0, l, 1.0)[:, None]
    return P, m, l


def standard_attention(
    q, k, v, softmax_scale=None, causal=False, dropout_p=0.0, seed=0, return_matrices=False, counter=None
):
    """Algorithm 0 with Algorithm 2's semantics, in float64.

    Parameters
    ----------
    q, k, v : array_like, (b, s_q, h, d) and (b, s_k, h_k, d)
    softmax_scale : float, optional. tau; default 1/sqrt(d).
    causal : bool. Bottom-right aligned causal mask.
    dropout_p : float in [0, 1). Dropout on P with the counter-hash mask of ``seed``.
    seed : int. Dropout seed (see :mod:`numba_flash_reference.common`).
    return_matrices : bool. Also return S (masked, scaled) and P (undropped).
    counter : HBMCounter, optional. Count the HBM traffic of Algorithm 0 as the paper does: Q, K, V
        read once, S and P written and read back, O written (the statistics m, l, L are the oracle's
        extras and are not counted; the dropout mask is recomputed from the hash, not stored).

    Returns
    -------
    AttentionResult
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    tau = default_scale(d, softmax_scale)
    O = np.zeros((b, s_q, h, d))
    m = np.zeros((b, h, s_q))
    l = np.zeros((b, h, s_q))
    S_all = np.zeros((b, h, s_q, s_k)) if return_matrices else None
    P_all = np.zeros((b, h, s_q, s_k)) if return_matrices else None
    gq, gk, gv, gO = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V"), hbm(O, counter, "O")
    gS = hbm(np.empty((s_q, s_k)), counter, "S")  # the N x N matrices in HBM (one head at a time)
    gP = hbm(np.empty((s_q, s_k)), counter, "P")
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            # Alg.0 L1: S = QK^T (scaled and masked as in Alg.2 L10-L11), written to HBM
            Q, K = gq[bi, :, hi], gk[bi, :, hk]  # HBM read: 2Nd
            S = masked_scores(Q, K, tau, causal)
            gS[...] = S  # HBM write: N^2
            # Alg.0 L2: P = softmax(S), written to HBM
            P, m[bi, hi], l[bi, hi] = row_softmax(gS[...])  # HBM read: N^2
            gP[...] = P  # HBM write: N^2
            # Alg.0 L3: O = PV, written to HBM
            P_used, V = gP[...], gv[bi, :, hk]  # HBM read: N^2 + Nd
            if dropout_p > 0.0:
                # Dev: dropout on P as in Alg.2 L14, with the counter-hash mask (statistics stay undropped)
                P_used = P_used * dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p)
            gO[bi, :, hi] = P_used @ V  # HBM write: Nd
            if return_matrices:
                S_all[bi, hi], P_all[bi, hi] = S, P
    # Alg.0 L4: return O
    return AttentionResult(O=O, m=m, l=l, L=logsumexp_from_stats(m, l), S=S_all, P=P_all)
