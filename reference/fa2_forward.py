"""FlashAttention-2 Algorithm 1: the query-outer forward pass, line by line.

Paper: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
Algorithm 1 (section 3.1.1), with causal masking as in section 3.1.1 ("Causal masking").

What a reader learns (the three changes from FA1 Algorithm 1)
-------------------------------------------------------------
* **The loops are swapped.** The outer loop runs over query blocks ``Q_i`` (line 3) and the inner one
  over key/value blocks (line 6). ``O_i, l_i, m_i`` now live on chip for the whole inner loop: they
  never travel to HBM and back. ``K, V`` are re-read once per query block instead (``Tr`` passes).
  On a GPU each ``i`` is an independent thread block, which is FA2's sequence parallelism.
* **The accumulator is un-normalized.** Line 10 keeps ``O~_i = sum_j exp(S_ij - m_i) V_j`` and only
  rescales it by ``exp(m_old - m_new) <= 1`` when the max grows; line 12 divides by ``l_i`` once at the
  end. (The paper prints line 10 as ``diag(e^{m_old - m_new})^{-1}``: the inverse is a typo; the
  correct factor is ``e^{m_old - m_new}``, used here.)
* **Only L = m + log l is stored** (line 13), one number per row instead of two.

Causal masking (FA2 section 3.1.1): a tile whose every key column lies beyond every query row's
horizon is skipped entirely (no load, no FLOP); only tiles the diagonal crosses get the elementwise
mask; tiles entirely below the diagonal need none. The mask is flash-attn's bottom-right aligned one
(:func:`~numba_flash_reference.common.causal_mask`), so with ``s_q > s_k`` the first query blocks may
see no key at all: they output ``O = 0``, ``L = +inf``.

Dropout is not in FA2's Algorithm 1; it is added exactly as in FA1 Algorithm 2 line 14 (the same
counter-hash mask, statistics from the undropped ``P~``), so every forward reference agrees on it.

Loop structure and memory
-------------------------
For each (batch, query head): ``Tr`` outer steps, each with up to ``Tc`` inner steps. HBM: ``q, k, v``
(read) and ``O, L`` (written once per row). SRAM budget of one step: ``Q_i, O~_i``: ``2 Br d``;
``K_j, V_j``: ``2 Bc d``; ``S_ij, P~_ij``: ``Br Bc``; ``m_i, l_i``: ``2 Br``. The block sizes default to
FA1's formula (:func:`~numba_flash_reference.common.block_sizes`); FA2's kernels tune them by hand
(``{64, 128} x {64, 128}``).

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.fa2_forward import flash_forward_fa2
    >>> from numba_flash_reference.alg0_standard import standard_attention
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 11, 2, 4))
    >>> out = flash_forward_fa2(q, k, v, causal=True, Br=4, Bc=3)
    >>> bool(np.allclose(out.O, standard_attention(q, k, v, causal=True).O))
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .common import (
    block_sizes,
    causal_mask,
    check_qkv,
    default_scale,
    dropout_scale_matrix,
    dropout_threshold,
    kv_head,
    seq_blocks,
)
from .hbm import hbm
from .online_softmax import rescale


@dataclass
class FA2Result:
    """What FA2 Algorithm 1 returns (line 17): ``O`` (b, s_q, h, d) and ``L`` (b, h, s_q), float64."""

    O: np.ndarray
    L: np.ndarray


def causal_kv_blocks(rows: range | slice, s_q: int, s_k: int, Bc: int) -> int:
    """How many key blocks the query rows ``rows`` can see under the bottom-right causal mask.

    The last row ``r = rows.stop - 1`` sees keys ``0 .. r + s_k - s_q``; key block ``j`` is needed iff its
    first column ``j Bc`` is within that horizon, i.e. the first ``ceil(min(s_k, max(0, r + 1 + s_k - s_q)) / Bc)``
    blocks (FA2 section 3.1.1: the others are skipped).
    """
    visible_cols = min(s_k, max(0, rows.stop + s_k - s_q))
    return math.ceil(visible_cols / Bc)


def flash_forward_fa2(
    q, k, v, softmax_scale=None, causal=False, dropout_p=0.0, seed=0, M=None, Br=None, Bc=None, counter=None
):
    """FA2 Algorithm 1 on (b, s, h, d) inputs, in float64.

    Parameters
    ----------
    q : array_like, (b, s_q, h, d)
    k, v : array_like, (b, s_k, h_k, d)
        ``h`` a multiple of ``h_k`` (GQA/MQA: KV heads are indexed, never copied).
    softmax_scale : float, optional
        tau, default ``1/sqrt(d)`` (FA2's algorithm leaves it out; it multiplies ``S`` at line 8).
    causal : bool
        Bottom-right aligned causal mask, with FA2's block skipping.
    dropout_p : float in [0, 1)
        Dropout as in FA1 Algorithm 2 line 14.
    seed : int
        Dropout seed.
    M, Br, Bc : int, optional
        SRAM size in elements / block sizes (default from :func:`~numba_flash_reference.common.block_sizes`).
    counter : HBMCounter, optional
        Count every HBM load and store.

    Returns
    -------
    FA2Result
        ``O`` and ``L = m + log l`` (``+inf`` on rows that see no key, where ``O = 0``).

    Notes
    -----
    Symbol table (paper symbol -> variable -> memory space):

    ==============================  ==================  =========================================
    Q, K, V, O, L                   gQ, gK, gV, gO, gL  HBM (counted when wrapped)
    Q_i                             Q_i                 SRAM, loaded once per outer step
    K_j, V_j                        K_j, V_j            SRAM, loaded once per inner step
    S_i^(j), P~_i^(j)               S_ij, P_tilde       SRAM (Br x Bc)
    O_i^(j) (un-normalized)         O_i                 on chip (registers on a GPU), (Br x d)
    m_i^(j), l_i^(j)                m_i, l_i            on chip, (Br,)
    e^(m^(j-1) - m^(j))             alpha               on chip, (Br,)
    L_i                             L_i                 on chip until line 15
    ==============================  ==================  =========================================
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    tau = default_scale(d, softmax_scale)
    dropout_threshold(dropout_p)  # validates 0 <= p < 1
    Br, Bc = block_sizes(d, M, Br, Bc)

    # FA2.1 L1: split Q into Tr = ceil(N / Br) blocks Q_i (Br x d), K and V into Tc = ceil(N / Bc) blocks
    row_blocks = [slice(r.start, r.stop) for r in seq_blocks(s_q, Br)]  # Tr; the last may be ragged
    col_blocks = [slice(c.start, c.stop) for c in seq_blocks(s_k, Bc)]  # Tc
    # FA2.1 L2: split O (N x d) into Tr blocks O_i and L (N) into Tr blocks L_i  (outputs: nothing to initialize)
    O = np.full((b, s_q, h, d), np.nan)  # every element is written exactly once below
    L = np.full((b, h, s_q), np.nan)
    gQ, gK, gV = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V")
    gO, gL = hbm(O, counter, "O"), hbm(L, counter, "L")

    # Dev: the paper's algorithm is for one head; every (batch, query head) runs it independently.
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            bh = bi * h + hi
            # FA2.1 L3: for i = 1..Tr (outer loop over Q blocks; one thread block each on a GPU)
            for rows in row_blocks:
                n_r = rows.stop - rows.start
                # FA2.1 L4: load Q_i from HBM to SRAM
                Q_i = gQ[bi, rows, hi]  # HBM read: Br*d
                # FA2.1 L5: on chip, O_i^(0) = (0) Br x d, l_i^(0) = (0) Br, m_i^(0) = (-inf) Br
                O_i = np.zeros((n_r, d))
                l_i = np.zeros(n_r)
                m_i = np.full(n_r, -np.inf)
                # Dev: causal block skipping (FA2 section 3.1.1): key blocks past the last row's horizon are never
                # visited
                n_blocks = causal_kv_blocks(rows, s_q, s_k, Bc) if causal else len(col_blocks)
                # FA2.1 L6: for j = 1..Tc
                for cols in col_blocks[:n_blocks]:
                    # [doc:ref-fa2-inner-loop]
                    # FA2.1 L7: load K_j, V_j from HBM to SRAM
                    K_j = gK[bi, cols, hk]  # HBM read: Bc*d
                    V_j = gV[bi, cols, hk]  # HBM read: Bc*d
                    # FA2.1 L8: S_i^(j) = Q_i K_j^T  (times tau)
                    S_ij = tau * (Q_i @ K_j.T)
                    # Dev: elementwise causal mask only on tiles the diagonal crosses (last column beyond the first
                    # row's horizon)
                    if causal and cols.stop - 1 > rows.start + s_k - s_q:
                        visible = causal_mask(s_q, s_k, range(rows.start, rows.stop), range(cols.start, cols.stop))
                        S_ij = np.where(visible, S_ij, -np.inf)
                    # FA2.1 L9: m_i^(j) = max(m_i^(j-1), rowmax S), P~ = exp(S - m_i^(j)), l_i^(j) = e^(m^(j-1) - m^(j))
                    # l^(j-1) + rowsum P~
                    m_new = np.maximum(m_i, S_ij.max(axis=1))
                    m_new_safe = np.where(np.isfinite(m_new), m_new, 0.0)  # Dev: a row unseen so far keeps m = -inf; no
                    # NaN
                    P_tilde = np.exp(S_ij - m_new_safe[:, None])
                    alpha = rescale(m_i, m_new)  # e^(m_old - m_new) <= 1
                    l_i = alpha * l_i + P_tilde.sum(axis=1)  # from the undropped P~ (as FA1 Alg.2 L13)
                    if dropout_p > 0.0:
                        # Dev: dropout as in FA1 Alg.2 L14 (FA2's Algorithm 1 omits it)
                        Z_ij = dropout_scale_matrix(
                            seed, bh, range(rows.start, rows.stop), range(cols.start, cols.stop), dropout_p
                        )
                        P_tilde = P_tilde * Z_ij
                    # FA2.1 L10: O_i^(j) = diag(e^(m^(j-1) - m^(j))) O_i^(j-1) + P~ V_j  (no inverse: the paper's is a
                    # typo)
                    O_i = alpha[:, None] * O_i + P_tilde @ V_j
                    m_i = m_new
                    # [/doc:ref-fa2-inner-loop]
                # FA2.1 L11: end for (j)
                seen = l_i > 0  # rows that saw at least one key
                # FA2.1 L12: O_i = diag(l_i^(Tc))^-1 O_i^(Tc)  (the only division)
                O_i = O_i / np.where(seen, l_i, 1.0)[:, None]
                # FA2.1 L13: L_i = m_i^(Tc) + log(l_i^(Tc))  (+inf where the row saw no key)
                L_i = np.full(n_r, np.inf)
                L_i[seen] = m_i[seen] + np.log(l_i[seen])
                # FA2.1 L14: write O_i to HBM
                gO[bi, rows, hi] = O_i  # HBM write: Br*d
                # FA2.1 L15: write L_i to HBM
                gL[bi, hi, rows] = L_i  # HBM write: Br
            # FA2.1 L16: end for (i)

    # FA2.1 L17: return O, L
    return FA2Result(O=O, L=L)
