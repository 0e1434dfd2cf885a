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

The backward pass
-----------------
The paper gives no numbered block-sparse backward; FlashAttention's own block-sparse kernels run
Algorithm 4 with the same test around its inner step. :func:`flash_backward_alg5` is exactly that:
Algorithm 4 line by line (the tags are ``Alg.4``), with ``if M_ij != 0`` around lines 10-22, so a
zero tile again costs no FLOP and no HBM access, and the gradients equal those of dense attention
under the expanded mask. :func:`io_alg5_backward` counts its HBM accesses in closed form.

The butterfly pattern
---------------------
FA1 §3.3 uses "a fixed butterfly sparsity pattern" without printing it. :func:`butterfly_block_mask`
is the *flat block butterfly* of Pixelated Butterfly (Chen, Dao et al., ICLR 2022, the pattern the
authors' block-sparse experiments build on): the union of the supports of the butterfly factors,
i.e. block ``(i, j)`` is non-zero iff ``i XOR j`` is 0 or a power of two, optionally with a few
global rows and columns. With all ``log2 T`` factors a row has ``1 + log2 T`` non-zero blocks, a
density of about ``log2(T) / T``: the ``s = N^-1 log N`` case of Proposition 4.

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg5_block_sparse import flash_forward_alg5, expand_block_mask
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 8, 1, 4))
    >>> mask = np.array([[1, 0], [1, 1]])          # Tr = Tc = 2 with Br = Bc = 4
    >>> out = flash_forward_alg5(q, k, v, mask, Br=4, Bc=4)
    >>> expand_block_mask(mask, 8, 8, 4, 4).shape
    (8, 8)
    >>> butterfly_block_mask(4).astype(int)
    array([[1, 1, 1, 0],
           [1, 1, 0, 1],
           [1, 0, 1, 1],
           [0, 1, 1, 1]])
"""

from __future__ import annotations

import numpy as np

from .alg2_forward import FlashResult
from .alg3_backward import check_grad_inputs
from .alg4_backward import recompute_probabilities
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
from .io_model import IOCount
from .online_softmax import rescale


def broadcast_block_mask(block_mask, b, h, Tr, Tc) -> np.ndarray:
    """The block mask as a boolean (b, h, Tr, Tc) array (shared masks broadcast over batch and heads)."""
    mask = np.asarray(block_mask)
    if mask.ndim < 2 or mask.shape[-2:] != (Tr, Tc):
        raise ValueError(f"block_mask must end in (Tr, Tc) = ({Tr}, {Tc}), got shape {mask.shape}")
    try:
        return np.broadcast_to(mask != 0, (b, h, Tr, Tc))
    except ValueError as e:
        raise ValueError(
            f"block_mask of shape {mask.shape} does not broadcast to (b, h, Tr, Tc) = {(b, h, Tr, Tc)}"
        ) from e


def butterfly_block_mask(
    Tr: int, Tc: int | None = None, n_factors: int | None = None, global_blocks: int = 0
) -> np.ndarray:
    """The fixed flat block butterfly pattern, a boolean ``(Tr, Tc)`` block mask.

    Block ``(i, j)`` is non-zero iff ``i' XOR j`` is 0 or ``2^k`` with ``k < n_factors``, where
    ``i' = floor(i Tc / Tr)`` maps row block ``i`` onto the diagonal (``i' = i`` when ``Tr = Tc``).
    This is the union of the supports of the first ``n_factors`` butterfly factor matrices (each
    pairs index ``i`` with ``i XOR 2^k``), as in Pixelated Butterfly's flat block butterfly.

    Parameters
    ----------
    Tr, Tc : int
        Row and column blocks (``Tc`` defaults to ``Tr``).
    n_factors : int, optional
        How many butterfly factors to take (default: all, ``ceil(log2 Tc)``). Each adds one block per
        row: ``1 + n_factors`` non-zero blocks per row (fewer where ``i' XOR 2^k >= Tc``).
    global_blocks : int
        The first ``global_blocks`` block rows and columns are dense (global tokens).

    Every row has its diagonal block, so no row of blocks is empty.

    >>> butterfly_block_mask(8, n_factors=2).sum(axis=1).tolist()
    [3, 3, 3, 3, 3, 3, 3, 3]
    >>> m = butterfly_block_mask(16)          # all 4 factors: 5 blocks per row
    >>> float(m.mean())
    0.3125
    """
    Tc = Tr if Tc is None else int(Tc)
    Tr = int(Tr)
    if Tr < 1 or Tc < 1:
        raise ValueError(f"Tr and Tc must be >= 1, got ({Tr}, {Tc})")
    all_factors = max(0, (Tc - 1).bit_length())  # ceil(log2 Tc)
    n_factors = all_factors if n_factors is None else int(n_factors)
    if not 0 <= n_factors <= all_factors:
        raise ValueError(f"n_factors must be in [0, {all_factors}] for Tc = {Tc}, got {n_factors}")
    if not 0 <= int(global_blocks) <= max(Tr, Tc):
        raise ValueError(f"global_blocks must be in [0, {max(Tr, Tc)}], got {global_blocks}")
    rows = (np.arange(Tr) * Tc) // Tr  # i' = floor(i Tc / Tr)
    x = rows[:, None] ^ np.arange(Tc)[None, :]
    mask = x == 0
    for k in range(n_factors):
        mask |= x == (1 << k)
    g = int(global_blocks)
    mask[:g, :] = True
    mask[:, :g] = True
    return mask


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
                        Z_ij = dropout_scale_matrix(
                            R, bh, range(rows.start, rows.stop), range(cols.start, cols.stop), dropout_p
                        )
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


def flash_backward_alg5(
    dout,
    q,
    k,
    v,
    out,
    l,
    m,
    block_mask,
    softmax_scale=None,
    causal=False,
    dropout_p=0.0,
    seed=0,
    M=None,
    Br=None,
    Bc=None,
    counter=None,
):
    """Block-sparse backward: FA1 Algorithm 4 with Algorithm 5's test around the inner step, in float64.

    Parameters
    ----------
    dout, q, k, v, out, l, m, softmax_scale, causal, dropout_p, seed, M, Br, Bc, counter
        As in :func:`numba_flash_reference.alg4_backward.flash_backward` (``l, m`` are the statistics
        :func:`flash_forward_alg5` returned).
    block_mask : array_like
        The forward's block mask (broadcastable to ``(b, h, Tr, Tc)``).

    Returns
    -------
    dq, dk, dv : ndarray, float64
        Gradients of dense attention under the expanded mask; ``dk, dv`` summed over GQA groups.
        Keys that no non-zero tile sees get exactly zero ``dk, dv``.

    Notes
    -----
    Loops and HBM accesses are Algorithm 4's (:mod:`numba_flash_reference.alg4_backward`), paid only
    for non-zero tiles: :func:`io_alg5_backward` is the closed form. Symbol table: as in Algorithm 4,
    plus ``M`` -> ``mask[bi, hi]``.
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    check_grad_inputs(q, dout, out, l=l, m=m)
    dropout_threshold(dropout_p)
    q, k, v, dout, out, l, m = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout, out, l, m))
    tau = default_scale(d, softmax_scale)
    G = h // h_k

    # Alg.4 L1: set the PRNG state to R (the seed: Z_ij is a pure function of (seed, bh, row, col))
    # Alg.4 L2: block sizes, as in Alg.1 L1 (or given; Algorithm 5 takes them as inputs)
    Br, Bc = block_sizes(d, M, Br, Bc)
    # Alg.4 L3: split Q into Tr blocks Q_i, K and V into Tc blocks K_j, V_j
    row_blocks = seq_blocks(s_q, Br)
    col_blocks = seq_blocks(s_k, Bc)
    mask = broadcast_block_mask(block_mask, b, h, len(row_blocks), len(col_blocks))
    gQ, gK, gV = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V")
    # Alg.4 L4: split O, dO and l, m into Tr blocks (the row ranges of Q_i)
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
            for j, cols in enumerate(col_blocks):
                cj = slice(cols.start, cols.stop)
                # Alg.4 L7: load K_j, V_j into SRAM (whatever column j of the mask holds, as Alg.5 L6)
                K_j = gK[bi, cj, hk]  # HBM read: Bc*d
                V_j = gV[bi, cj, hk]  # HBM read: Bc*d
                # Alg.4 L8: dK~_j = dV~_j = 0 on chip
                dK_tilde_j = np.zeros((len(cols), d))
                dV_tilde_j = np.zeros((len(cols), d))
                for hi in range(hk * G, (hk + 1) * G):  # Dev: GQA, the group's query heads (as alg4_backward)
                    bh = bi * h + hi
                    # Alg.4 L9: inner loop over the Q blocks
                    for i, rows in enumerate(row_blocks):
                        if not mask[bi, hi, i, j]:  # Dev: Alg.5 L8's test around Algorithm 4's inner step
                            continue
                        ri = slice(rows.start, rows.stop)
                        # Alg.4 L10: load Q_i, O_i, dO_i, dQ_i, l_i, m_i into SRAM
                        Q_i = gQ[bi, ri, hi]  # HBM read: Br*d
                        O_i = gO[bi, ri, hi]  # HBM read: Br*d
                        dO_i = gdO[bi, ri, hi]  # HBM read: Br*d
                        dQ_i = gdQ[bi, ri, hi]  # HBM read: Br*d
                        l_i = gl[bi, hi, ri]  # HBM read: Br
                        m_i = gm[bi, hi, ri]  # HBM read: Br
                        # Alg.4 L11: S_ij = tau Q_i K_j^T
                        S_ij = tau * (Q_i @ K_j.T)
                        # Alg.4 L12: S_ij^masked = mask(S_ij) (the causal mask; the block mask is 1 on this tile)
                        if causal:
                            S_ij = np.where(causal_mask(s_q, s_k, rows, cols), S_ij, -np.inf)
                        # Alg.4 L13: P_ij = diag(l_i)^-1 exp(S_ij^masked - m_i)
                        P_ij = recompute_probabilities(S_ij, l_i, m_i)
                        # Alg.4 L14: Z_ij regenerated from the seed
                        Z_ij = dropout_scale_matrix(seed, bh, rows, cols, dropout_p)
                        # Alg.4 L15: P_ij^dropped = P_ij o Z_ij
                        P_dropped_ij = P_ij * Z_ij
                        # Alg.4 L16: dV~_j += (P_ij^dropped)^T dO_i
                        dV_tilde_j += P_dropped_ij.T @ dO_i
                        # Alg.4 L17: dP_ij^dropped = dO_i V_j^T
                        dP_dropped_ij = dO_i @ V_j.T
                        # Alg.4 L18: dP_ij = dP_ij^dropped o Z_ij
                        dP_ij = dP_dropped_ij * Z_ij
                        # Alg.4 L19: D_i = rowsum(dO_i o O_i)
                        D_i = np.sum(dO_i * O_i, axis=1)
                        # Alg.4 L20: dS_ij = P_ij o (dP_ij - D_i)
                        dS_ij = P_ij * (dP_ij - D_i[:, None])
                        # Alg.4 L21: dQ_i <- dQ_i + tau dS_ij K_j, written back
                        gdQ[bi, ri, hi] = dQ_i + tau * (dS_ij @ K_j)  # HBM write: Br*d
                        # Alg.4 L22: dK~_j += tau dS_ij^T Q_i
                        dK_tilde_j += tau * (dS_ij.T @ Q_i)
                # Alg.4 L24: write dK_j <- dK~_j, dV_j <- dV~_j to HBM
                gdK[bi, cj, hk] = dK_tilde_j  # HBM write: Bc*d
                gdV[bi, cj, hk] = dV_tilde_j  # HBM write: Bc*d

    # Alg.4 L26: return dQ, dK, dV
    return dq, dk, dv


def io_alg5_backward(N, d, block_mask, M=None, Br=None, Bc=None, N_k=None, b=1, h=1, h_k=None) -> IOCount:
    """HBM accesses of :func:`flash_backward_alg5`: Algorithm 4's, with the per-tile terms paid only
    for non-zero tiles.

    With ``W = sum over non-zero tiles (i, j) of |rows_i|`` (over all batches and query heads):
    reads ``K, V`` ``b h_k Nk d`` each (line 7, every ``j``), ``Q, O, dO, dQ`` ``W d`` each and ``l, m``
    ``W`` each (line 10); writes ``dQ`` ``W d`` (line 21) and ``dK, dV`` ``b h_k Nk d`` each (line 24).
    An all-ones mask gives :func:`numba_flash_reference.io_model.io_alg4_backward` exactly.
    """
    Nq = int(N)
    Nk = Nq if N_k is None else int(N_k)
    h_k = h if h_k is None else int(h_k)
    Br, Bc = block_sizes(d, M, Br, Bc)
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
    mask = np.broadcast_to(np.asarray(block_mask) != 0, (b, h, Tr, Tc))
    row_sizes = np.array([len(r) for r in seq_blocks(Nq, Br)], dtype=np.int64)
    W = int((mask.sum(axis=3) * row_sizes).sum())
    kv = b * h_k * Nk * d
    return IOCount.from_by_name(
        {
            "K": (kv, 0),
            "V": (kv, 0),  # L7
            "Q": (W * d, 0),
            "O": (W * d, 0),
            "dO": (W * d, 0),
            "dQ": (W * d, W * d),  # L10, L21
            "l": (W, 0),
            "m": (W, 0),  # L10
            "dK": (0, kv),
            "dV": (0, kv),  # L24
        }
    )
