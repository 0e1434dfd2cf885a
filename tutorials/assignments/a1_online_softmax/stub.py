"""Assignment 1: FlashAttention-2's running softmax state, and the split-KV combine, in NumPy.  <-- your file.

Read first: ``tutorials/02_online_softmax.py`` (sections 3-6) and FA2 Algorithm 1 (lines 5, 9, 10, 12,
13); FA2 (ICLR version) section 4.2 for the split-KV combine.

A row of attention scores is consumed one block of columns at a time. FlashAttention-2 keeps, per row,

* ``m``   the running max of the scores seen so far,
* ``l``   the running sum of ``exp(score - m)``,
* ``acc`` the running ``sum_k exp(score_k - m) V_k``: *un-normalized* (FA1 divided by ``l`` at every
  step; FA2 divides once, at the end, because a division costs 16x a matmul FLOP on an A100).

At the end, ``O = acc / l`` and the logsumexp ``L = m + log l`` is all the backward pass needs.

The same logsumexp lets attention over a long key sequence be split across workers (split-KV, the
decoding kernels of FA2 section 4.2): each worker returns ``(O_k, L_k)`` for its keys, and the
results combine exactly.

Rules: NumPy only, float32 in and out (like a kernel). A masked score is ``-inf``; a row that has seen
no visible score has ``m = -inf, l = 0, acc = 0``, and finalizes to ``O = 0, L = -inf``, never NaN.
Grade yourself with::

    python -m pytest tutorials/assignments/a1_online_softmax
"""

from __future__ import annotations

import numpy as np


def init_state(rows, d, dtype=np.float32):
    """FA2.1 L5: the state of ``rows`` rows that have seen nothing: ``(m, l, acc)``.

    Returns ``m = -inf`` (rows,), ``l = 0`` (rows,), ``acc = 0`` (rows, d), all of ``dtype``.
    """
    # TODO FA2.1 L5
    raise NotImplementedError("a1: init_state")


def absorb(state, S_j, V_j):
    """FA2.1 L9-L10: fold one block of scores ``S_j (rows, Bc)`` and values ``V_j (Bc, d)`` into ``state``.

    Returns the new ``(m, l, acc)``: ``m_new = max(m, rowmax(S_j))``,
    ``l_new = exp(m - m_new) l + rowsum(exp(S_j - m_new))``,
    ``acc_new = exp(m - m_new) acc + exp(S_j - m_new) V_j``. No division.

    Hints: every ``exp`` argument must be ``<= 0`` (scores of 1000 are legal). ``-inf - (-inf)`` is
    NaN: where ``m_new = -inf`` subtract 0 instead (``np.where(np.isfinite(m_new), m_new, 0)``).
    """
    # TODO FA2.1 L9 (m, P~, l) and L10 (acc)
    raise NotImplementedError("a1: absorb")


def finalize(state):
    """FA2.1 L12-L13: ``(O, L)`` with ``O = acc / l`` (rows, d) and ``L = m + log l`` (rows,).

    A row with ``l = 0`` (nothing visible) gives ``O = 0`` and ``L = -inf``.
    """
    # TODO FA2.1 L12-L13
    raise NotImplementedError("a1: finalize")


def combine(parts):
    """Split-KV combine: ``(O, L)`` over all keys from a list of ``(O_k, L_k)`` over disjoint key ranges.

    ``L = log(sum_k exp(L_k))`` and ``O = sum_k exp(L_k - L) O_k``. Compute the first without
    overflow (``L_k`` may be 1000); a part with ``L_k = -inf`` contributes nothing; if every part is
    ``-inf`` for a row, that row's result is ``O = 0, L = -inf``.
    """
    # TODO the logsumexp of the L_k, then the weighted sum of the O_k
    raise NotImplementedError("a1: combine")


def online_attention(blocks):
    """``(O, L)`` of attention over column blocks ``(S_j, V_j)`` that arrive one at a time.

    ``blocks`` is an iterable: consume it once, in order, keeping no more than the current block (the
    autograder checks). Use your three functions above (FA2.1 L5, the loop of L6 with L9-L10, L12-L13).
    """
    # TODO
    raise NotImplementedError("a1: online_attention")
