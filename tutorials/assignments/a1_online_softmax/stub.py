"""Assignment 1: the online-softmax merge, in NumPy.  <-- your file: fill in the three TODOs.

Read first: ``tutorials/02_online_softmax.py`` and FA1 section 3.1 (Algorithm 1 lines 10-12).

A row of scores ``x`` and the values ``V`` it attends to are summarized by three things:

* ``m = max(x)``                       (the row max)
* ``l = sum(exp(x - m))``              (the softmax denominator, taken at that max)
* ``o = softmax(x) @ V``               (the row's output, *normalized*)

Split the columns into two blocks. Knowing only the two blocks' summaries, you can compute the summary
of the whole row, exactly. Doing that block after block is the *online softmax* that lets
FlashAttention compute attention without ever holding a full row of scores.

Rules: NumPy only; keep the dtype you are given (the autograder passes float32, like a kernel); a
masked score is ``-inf``, and a row whose scores in a block are all ``-inf`` has ``m = -inf``,
``l = 0``, ``o = 0`` (never NaN). Grade yourself with::

    python -m pytest tutorials/assignments/a1_online_softmax
"""

from __future__ import annotations

import numpy as np  # noqa: F401  (you will need it)


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

    Hints
    -----
    Subtract the row max before ``exp`` (scores of 1000 are legal). For a fully masked row,
    ``-inf - (-inf)`` is NaN: subtract 0 instead of ``m`` there (``np.where``).
    """
    # TODO: FA1 Alg.1 L10: m~ = rowmax(S_j), P~ = exp(S_j - m~), l~ = rowsum(P~); then o = P~ V_j / l~
    raise NotImplementedError("a1: block_state")


def merge(state1, state2):
    """Merge the summaries of two column blocks of the same rows into that of their concatenation.

    Parameters
    ----------
    state1, state2 : tuple (m, l, o)
        As returned by :func:`block_state` or :func:`merge`.

    Returns
    -------
    tuple (m, l, o)
        The summary of the concatenated columns.

    Hints
    -----
    Write each part's sum at the new max: ``exp(m_part - m_new) * l_part``. ``o`` is normalized, so
    un-normalize each part first (times its ``l``), add, and normalize by the merged ``l``.
    """
    # TODO: FA1 Alg.1 L11 (m_new, l_new) and L12 (o)
    raise NotImplementedError("a1: merge")


def online_attention(blocks):
    """``softmax(S) V`` from column blocks ``(S_j, V_j)`` that arrive one at a time.

    Parameters
    ----------
    blocks : iterable of (S_j, V_j)
        Consume it once, in order, keeping no more than the current block (the autograder checks).

    Returns
    -------
    tuple (m, l, o)
        The summary of all blocks: ``o`` is the attention output of every row.
    """
    # TODO: FA1 Alg.1 L5 (the loop over blocks) with L10-L12 inside
    raise NotImplementedError("a1: online_attention")
