"""The online-softmax merge identity (FA1 section 3.1): softmax one block at a time, exactly.

Paper: Dao et al., "FlashAttention", section 3.1 ("Tiling"); the same identity drives FA1 Algorithm 1
lines 10-12 and FlashAttention-2 Algorithm 1 lines 9-10.

What a reader learns here
-------------------------
Softmax couples a whole row: every probability is divided by the sum over the row. Yet it can be
computed block by block, keeping only two numbers per row, because of this identity. For a vector x,
let ``m(x) = max_k x_k``, ``f(x) = exp(x - m(x))`` and ``l(x) = sum_k f(x)_k``, so
``softmax(x) = f(x) / l(x)``. Split ``x = [x1, x2]``. Then, with ``m = max(m1, m2)``::

    m(x) = max(m(x1), m(x2))
    f(x) = [ exp(m1 - m) f(x1),  exp(m2 - m) f(x2) ]
    l(x) = exp(m1 - m) l(x1) + exp(m2 - m) l(x2)

and for the attention output of the row, ``o = softmax(x) V``, split the same way
(``o1 = softmax(x1) V1``, ``o2 = softmax(x2) V2``, both normalized)::

    o = ( exp(m1 - m) l1 o1 + exp(m2 - m) l2 o2 ) / l                         (normalized, FA1)
    o_tilde = exp(m1 - m) o_tilde1 + exp(m2 - m) o_tilde2,  o = o_tilde / l    (un-normalized, FA2)

The state ``(m, l, o)`` of a block is therefore a *summary* that can be merged with any other block's
summary, in any grouping (the merge is associative and commutative), and the result is the exact
softmax of the concatenation, up to floating-point rounding. FA1 Algorithm 1 line 11 is this merge
for ``(m, l)`` and line 12 for the normalized ``o``; FA2 keeps ``o`` un-normalized and divides once.

Masked entries and empty blocks
-------------------------------
A masked score is ``-inf``. A block whose row is entirely ``-inf`` (or has no columns) has the
identity state ``m = -inf, l = 0, o = 0``: merging with it changes nothing. The only care needed is
``exp(m_old - m_new)`` when both are ``-inf`` (``-inf - -inf`` is NaN): :func:`rescale` returns 0
there, which is right because the quantity it multiplies (``l`` or ``o``) is 0.

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.online_softmax import softmax_state, merge
    >>> rng = np.random.default_rng(0)
    >>> x, V = rng.standard_normal(7), rng.standard_normal((7, 3))
    >>> s1, s2 = softmax_state(x[:3], V[:3]), softmax_state(x[3:], V[3:])
    >>> s = merge(s1.m, s1.l, s2.m, s2.l, s1.o, s2.o)
    >>> bool(np.allclose(s.o, np.exp(x - x.max()) @ V / np.exp(x - x.max()).sum()))
    True
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class SoftmaxState(NamedTuple):
    """The summary of a block of columns of each row: ``m`` (rows,), ``l`` (rows,), ``o`` (rows, d) or None."""

    m: np.ndarray
    l: np.ndarray
    o: np.ndarray | None = None


def rescale(m_old, m_new):
    """``exp(m_old - m_new)``, with 0 where ``m_new = -inf`` (then ``m_old = -inf`` too).

    This is the factor that moves a running sum from the old max to the new one (FA1 Alg.1 L11,
    FA2 Alg.1 L9-L10). It is at most 1 because ``m_new >= m_old``.
    """
    m_old = np.asarray(m_old, dtype=np.float64)
    m_new = np.asarray(m_new, dtype=np.float64)
    finite = np.isfinite(m_new)
    # exp(-inf - (-inf)) would be NaN; the sum it scales is 0 in that case, so 0 is exact.
    return np.where(finite, np.exp(m_old - np.where(finite, m_new, 0.0)), 0.0)


def softmax_stats(x):
    """``(m, l)`` of each row of ``x`` (last axis): ``m = max x``, ``l = sum exp(x - m)``.

    A row that is empty or entirely ``-inf`` gives ``m = -inf``, ``l = 0``.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    m = x.max(axis=-1)
    m_safe = np.where(np.isfinite(m), m, 0.0)  # an all -inf row: exp(-inf - 0) = 0, no NaN
    l = np.exp(x - m_safe[..., None]).sum(axis=-1)
    return m, l


def softmax_state(x, v=None):
    """The summary ``(m, l, o)`` of scores ``x`` (rows, n) and values ``v`` (n, d).

    ``o = softmax(x) v`` is *normalized* (FA1's convention); rows with no visible column give
    ``o = 0``. Without ``v`` only ``(m, l)`` are returned (``o`` is None).
    """
    x = np.asarray(x, dtype=np.float64)
    m, l = softmax_stats(x)
    if v is None:
        return SoftmaxState(m, l, None)
    v = np.asarray(v, dtype=np.float64)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    f = np.exp(x - m_safe[..., None])
    o = (f @ v) / np.where(l > 0, l, 1.0)[..., None]
    return SoftmaxState(m, l, o)


# [doc:ref-online-softmax-merge]
def merge(m1, l1, m2, l2, o1=None, o2=None, normalized=True):
    """Merge two partial states of the same rows into the state of the concatenated columns.

    Parameters
    ----------
    m1, l1, m2, l2 : array_like, (rows,)
        Row max and row sum of ``exp(x - m)`` of each part.
    o1, o2 : array_like, (rows, d), optional
        Each part's output: ``softmax(x_part) V_part`` if ``normalized`` (FA1 Alg.1 L12), or
        ``exp(x_part - m_part) V_part`` if not (FA2 Alg.1 L10).
    normalized : bool
        Which convention ``o1``, ``o2`` and the returned ``o`` follow.

    Returns
    -------
    SoftmaxState
        ``m = max(m1, m2)``, ``l = e^{m1-m} l1 + e^{m2-m} l2`` and the merged ``o`` (None if not given).
    """
    m = np.maximum(m1, m2)
    a1, a2 = rescale(m1, m), rescale(m2, m)  # each <= 1: the parts move to the common max
    l = a1 * l1 + a2 * l2
    if o1 is None or o2 is None:
        return SoftmaxState(m, l, None)
    if normalized:
        # un-normalize each part (times l_part), rescale, add, renormalize by the merged l
        num = (a1 * l1)[..., None] * o1 + (a2 * l2)[..., None] * o2
        o = num / np.where(l > 0, l, 1.0)[..., None]
    else:
        o = a1[..., None] * o1 + a2[..., None] * o2
    return SoftmaxState(m, l, o)


# [/doc:ref-online-softmax-merge]


def merge_states(s1: SoftmaxState, s2: SoftmaxState, normalized=True) -> SoftmaxState:
    """:func:`merge` on two :class:`SoftmaxState` s."""
    return merge(s1.m, s1.l, s2.m, s2.l, s1.o, s2.o, normalized=normalized)


def identity_state(rows: int, d: int | None = None) -> SoftmaxState:
    """The state of an empty block, ``m = -inf, l = 0, o = 0``: the neutral element of :func:`merge`."""
    o = None if d is None else np.zeros((rows, d))
    return SoftmaxState(np.full(rows, -np.inf), np.zeros(rows), o)
