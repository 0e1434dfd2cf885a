"""FA1 Algorithm 5: block-sparse FlashAttention forward, line by line.

Paper: Dao et al., "FlashAttention", Algorithm 5 (Appendix D.1) and Proposition 4.

Block-sparse attention is attention with a mask that is constant on tiles: a block mask
``M_block`` in ``{0, 1}^(Tr x Tc)`` says which (query block, key block) tiles exist, and the
element mask is ``M~[k, l] = M_block[k // Br, l // Bc]`` (0 means the score is ``-inf``). Algorithm 5
is Algorithm 2 (:mod:`numba_flash_reference.alg2_forward`) with one line added: ``if M_ij != 0`` around
the inner step (line 8). A zero tile is never touched, so it costs no FLOPs and **no HBM access**:
``Q_i, O_i, l_i, m_i`` are neither read nor written for it.

What a reader learns
--------------------
* Why the speed-up is proportional to the sparsity (Proposition 4): the HBM accesses are
  ``Theta(N d + N^2 d^2 s / M)`` with ``s`` the fraction of non-zero blocks. The ``N d`` term remains
  because ``K, V`` are loaded (line 6) whatever the mask (and ``O`` must be output); the ``N^2`` term
  is paid only per non-zero tile. :mod:`numba_flash_reference.io_model` counts it.
* Rows whose blocks are all zero see no key: they keep ``m = -inf``, ``l = 0`` and output ``O = 0``.

The mask may be shared by all heads (shape ``(Tr, Tc)``) or given per (batch, head): any shape that
broadcasts to ``(b, h, Tr, Tc)``. The causal mask and dropout of Algorithm 2 still apply inside the
non-zero tiles. Loop structure and SRAM budget are those of Algorithm 1; the block sizes are inputs
(Algorithm 5 has no line 1; by default they come from the same formula,
:func:`~numba_flash_reference.common.block_sizes`).

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg5_block_sparse import flash_forward_alg5, expand_block_mask
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 8, 1, 4))
    >>> mask = np.array([[1, 0], [1, 1]])          # Tr = Tc = 2 with Br = Bc = 4
    >>> out = flash_forward_alg5(q, k, v, mask, Br=4, Bc=4)
    >>> expand_block_mask(mask, 8, 8, 4, 4).shape
    (8, 8)
"""

from __future__ import annotations

import numpy as np

from .alg2_forward import FlashResult
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


def broadcast_block_mask(block_mask, b, h, Tr, Tc) -> np.ndarray:
    """The block mask as a boolean (b, h, Tr, Tc) array (shared masks broadcast over batch and heads)."""
    mask = np.asarray(block_mask)
    if mask.ndim < 2 or mask.shape[-2:] != (Tr, Tc):
        raise ValueError(f"block_mask must end in (Tr, Tc) = ({Tr}, {Tc}), got shape {mask.shape}")
    try:
        return np.broadcast_to(mask != 0, (b, h, Tr, Tc))
    except ValueError as e:
        raise ValueError(f"block_mask of shape {mask.shape} does not broadcast to (b, h, Tr, Tc) = {(b, h, Tr, Tc)}") from e


def expand_block_mask(block_mask, s_q, s_k, Br, Bc) -> np.ndarray:
    """The element mask M~[k, l] = M_block[k // Br, l // Bc] (boolean, ``(..., s_q, s_k)``)."""
    mask = np.asarray(block_mask) != 0
    rows = np.arange(s_q) // Br
    cols = np.arange(s_k) // Bc
    return mask[..., rows[:, None], cols[None, :]]


def flash_forward_alg5(
    q, k, v, block_mask, softmax_scale=None, causal=False, dropout_p=0.0, seed=0, M=None, Br=None, Bc=None, counter=None
):
    """FA1 Algorithm 5 (block-sparse forward) on (b, s, h, d) inputs, in float64.

    Parameters
    ----------
    q : array_like, (b, s_q, h, d)
    k, v : array_like, (b, s_k, h_k, d)
    block_mask : array_like
        Non-zero where a (query block i, key block j) tile is computed; broadcastable to
        ``(b, h, Tr, Tc)`` with ``Tr = ceil(s_q / Br)``, ``Tc = ceil(s_k / Bc)``.
    softmax_scale, causal, dropout_p, seed, M, Br, Bc, counter
        As in :func:`~numba_flash_reference.alg2_forward.flash_forward_alg2`.

    Returns
    -------
    FlashResult
        ``O, m, l, L, seed``; equal to standard attention with the element mask
        :func:`expand_block_mask` (and the causal mask, if any) applied to ``S``.

    Notes
    -----
    Symbol table: as in Algorithm 2, plus ``M`` (the block mask) -> ``mask[bi, hi]`` (host, (Tr, Tc)).
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    tau = default_scale(d, softmax_scale)
    dropout_threshold(dropout_p)  # validates 0 <= p < 1
    Br, Bc = block_sizes(d, M, Br, Bc)  # Dev: Algorithm 5 takes Br, Bc as inputs; default from Alg.1 L1

    # Alg.5 L1: initialize the PRNG state R and save it to HBM  (the integer seed)
    R = int(seed)

    # Alg.5 L2: in HBM, O = (0) N x d, l = (0) N, m = (-inf) N
    # (an allocation, not counted as accesses, here and in the backward references; a kernel skips it
    # by treating the first visit of each row block specially)
    O = np.zeros((b, s_q, h, d))
    l = np.zeros((b, h, s_q))
    m = np.full((b, h, s_q), -np.inf)
    gQ, gK, gV = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V")
    gO, gl, gm = hbm(O, counter, "O"), hbm(l, counter, "l"), hbm(m, counter, "m")

    # Alg.5 L3: split Q into Tr blocks Q_i (Br x d), K and V into Tc blocks K_j, V_j (Bc x d)
    row_blocks = [slice(r.start, r.stop) for r in seq_blocks(s_q, Br)]
    col_blocks = [slice(c.start, c.stop) for c in seq_blocks(s_k, Bc)]
    # Alg.5 L4: O_i, l_i, m_i are the row blocks of O, l, m that match Q_i
    mask = broadcast_block_mask(block_mask, b, h, len(row_blocks), len(col_blocks))

    # Dev: the paper's algorithm is for one head; every (batch, query head) runs it independently.
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            bh = bi * h + hi
            # Alg.5 L5: for j = 1..Tc
            for j, cols in enumerate(col_blocks):
                # Alg.5 L6: load K_j, V_j from HBM to SRAM  (the paper loads them whatever column j of the mask holds)
                K_j = gK[bi, cols, hk]  # HBM read: Bc*d
                V_j = gV[bi, cols, hk]  # HBM read: Bc*d
                # Alg.5 L7: for i = 1..Tr
                for i, rows in enumerate(row_blocks):
                    # [doc:ref-alg5-block-skip]
                    # Alg.5 L8: if M_ij != 0 (a zero tile costs no FLOP and no HBM access)
                    if not mask[bi, hi, i, j]:
                        continue
                    # [/doc:ref-alg5-block-skip]
                    # Alg.5 L9: load Q_i, O_i, l_i, m_i from HBM to SRAM  (= Alg.2 L9)
                    Q_i = gQ[bi, rows, hi]  # HBM read: Br*d
                    O_i = gO[bi, rows, hi]  # HBM read: Br*d
                    l_i = gl[bi, hi, rows]  # HBM read: Br
                    m_i = gm[bi, hi, rows]  # HBM read: Br
                    # Alg.5 L10: S_ij = tau Q_i K_j^T  (= Alg.2 L10)
                    S_ij = tau * (Q_i @ K_j.T)
                    # Alg.5 L11: S_ij^masked = mask(S_ij)  (= Alg.2 L11; the block mask is 1 on this whole tile)
                    if causal:
                        visible = causal_mask(s_q, s_k, range(rows.start, rows.stop), range(cols.start, cols.stop))
                        S_masked = np.where(visible, S_ij, -np.inf)
                    else:
                        S_masked = S_ij
                    # Alg.5 L12: m~_ij, P~_ij, l~_ij from S^masked  (= Alg.2 L12)
                    m_tilde = S_masked.max(axis=1)
                    m_tilde_safe = np.where(np.isfinite(m_tilde), m_tilde, 0.0)  # Dev: avoids -inf - -inf
                    P_tilde = np.exp(S_masked - m_tilde_safe[:, None])
                    l_tilde = P_tilde.sum(axis=1)
                    # Alg.5 L13: m_new, l_new  (= Alg.2 L13, from the undropped P~)
                    m_new = np.maximum(m_i, m_tilde)
                    alpha = rescale(m_i, m_new)
                    beta = rescale(m_tilde, m_new)
                    l_new = alpha * l_i + beta * l_tilde
                    # Alg.5 L14: P~_ij^dropped = dropout(P~_ij, p_drop)  (= Alg.2 L14)
                    if dropout_p > 0.0:
                        Z_ij = dropout_scale_matrix(R, bh, range(rows.start, rows.stop), range(cols.start, cols.stop), dropout_p)
                        P_dropped = P_tilde * Z_ij
                    else:
                        P_dropped = P_tilde
                    # Alg.5 L15: write O_i  (= Alg.2 L15)
                    numerator = (alpha * l_i)[:, None] * O_i + beta[:, None] * (P_dropped @ V_j)
                    gO[bi, rows, hi] = numerator / np.where(l_new > 0, l_new, 1.0)[:, None]  # HBM write: Br*d
                    # Alg.5 L16: write l_i, m_i  (= Alg.2 L16)
                    gl[bi, hi, rows] = l_new  # HBM write: Br
                    gm[bi, hi, rows] = m_new  # HBM write: Br
                    # Alg.5 L17: end if
                # Alg.5 L18: end for (i)
            # Alg.5 L19: end for (j)

    # Alg.5 L20: return O, l, m, R
    return FlashResult(O=O, m=m, l=l, L=logsumexp_from_stats(m, l), seed=R)
