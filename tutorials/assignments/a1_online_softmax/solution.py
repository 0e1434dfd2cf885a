"""Assignment 1, solution (course staff): the online-softmax merge, in NumPy.

Paper: Dao et al., "FlashAttention", section 3.1 and Algorithm 1 lines 10-12 (the merge identity of
:mod:`numba_flash_reference.online_softmax`). A row's softmax-weighted sum ``o = softmax(x) V`` is
summarized by ``(m, l, o)``; two summaries of the same rows merge into the summary of the concatenated
columns, exactly. Kept by course staff: ``stub.py`` is the student's copy.
"""

from __future__ import annotations

import numpy as np


def _finite_or_zero(m):
    """``m`` with ``-inf`` (a row that saw no visible score) replaced by 0, so ``exp(x - m)`` is never NaN."""
    return np.where(np.isfinite(m), m, 0)


def block_state(S_j, V_j):
    """The summary ``(m, l, o)`` of one column block.

    Parameters
    ----------
    S_j : ndarray, (rows, Bc)
        Scores of the block (``-inf`` where masked).
    V_j : ndarray, (Bc, d)
        The block's values.

    Returns
    -------
    m : ndarray, (rows,)
        ``rowmax(S_j)`` (``-inf`` for a fully masked row).
    l : ndarray, (rows,)
        ``rowsum(exp(S_j - m))`` (0 for a fully masked row).
    o : ndarray, (rows, d)
        ``softmax(S_j) V_j``, normalized (0 for a fully masked row).
    """
    S_j, V_j = np.asarray(S_j), np.asarray(V_j)
    # Alg.1 L10: m~ = rowmax(S), P~ = exp(S - m~) (every entry <= 1: no overflow), l~ = rowsum(P~)
    m = S_j.max(axis=1)
    P = np.exp(S_j - _finite_or_zero(m)[:, None])
    l = P.sum(axis=1)
    o = (P @ V_j) / np.where(l > 0, l, 1)[:, None]
    return m, l, o


def merge(state1, state2):
    """Merge the summaries of two column blocks of the same rows into that of their concatenation.

    Parameters
    ----------
    state1, state2 : tuple (m, l, o)
        As returned by :func:`block_state` or :func:`merge`.

    Returns
    -------
    tuple (m, l, o)
        ``m = max(m1, m2)``, ``l = e^(m1 - m) l1 + e^(m2 - m) l2``,
        ``o = (e^(m1 - m) l1 o1 + e^(m2 - m) l2 o2) / l``.
    """
    m1, l1, o1 = state1
    m2, l2, o2 = state2
    # Alg.1 L11: m_new = max(m1, m2); each part moves to the new max by a factor exp(m_part - m_new) <= 1
    m = np.maximum(m1, m2)
    a1 = np.exp(m1 - _finite_or_zero(m))  # both -inf (no visible score yet): exp(-inf) = 0, not NaN
    a2 = np.exp(m2 - _finite_or_zero(m))
    l = a1 * l1 + a2 * l2
    # Alg.1 L12: un-normalize each part (times l_part), rescale, add, normalize by the merged l
    o = ((a1 * l1)[:, None] * o1 + (a2 * l2)[:, None] * o2) / np.where(l > 0, l, 1)[:, None]
    return m, l, o


def online_attention(blocks):
    """``softmax(S) V`` from column blocks ``(S_j, V_j)`` that arrive one at a time.

    Parameters
    ----------
    blocks : iterable of (S_j, V_j)
        Consumed once, in order; at most the current block is kept.

    Returns
    -------
    tuple (m, l, o)
        The summary of all blocks: ``o`` is the attention output of every row.
    """
    state = None
    for S_j, V_j in blocks:
        block = block_state(S_j, V_j)
        state = block if state is None else merge(state, block)
    if state is None:
        raise ValueError("online_attention needs at least one block")
    return state
