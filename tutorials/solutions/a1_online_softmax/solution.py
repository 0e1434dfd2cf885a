"""Assignment 1, solution (course staff): FA2's running softmax state and the split-KV combine, in NumPy.

Paper: Dao, "FlashAttention-2", Algorithm 1 lines 5, 9-10 (the running state, with an *un-normalized*
accumulator), 12-13 (one division at the end, and the logsumexp ``L = m + log l``), and the split-KV
combine of FA2 (ICLR) section 4.2 / Flash-Decoding: partial results ``(O_k, L_k)`` over disjoint key
ranges merge into the result over all keys with ``L = logsumexp_k L_k``, ``O = sum_k exp(L_k - L) O_k``.

Everything is per row; ``-inf`` scores are masked. Kept by course staff, never in the handout.
"""

from __future__ import annotations

import numpy as np


def _safe(m):
    """``m`` with ``-inf`` (a row that saw no visible score) replaced by 0, so ``x - m`` is never NaN."""
    return np.where(np.isfinite(m), m, 0).astype(m.dtype)


def init_state(rows, d, dtype=np.float32):
    """FA2.1 L5: ``m = -inf``, ``l = 0``, ``acc = 0`` for ``rows`` rows and head dimension ``d``."""
    return np.full(rows, -np.inf, dtype), np.zeros(rows, dtype), np.zeros((rows, d), dtype)


def absorb(state, S_j, V_j):
    """FA2.1 L9-L10: fold one block of scores ``S_j (rows, Bc)`` and values ``V_j (Bc, d)`` into the state."""
    m, l, acc = state
    # FA2.1 L9: m_new = max(m, rowmax(S_j)); P~ = exp(S_j - m_new) <= 1; l_new = e^(m - m_new) l + rowsum(P~)
    m_new = np.maximum(m, S_j.max(axis=1))
    alpha = np.exp(m - _safe(m_new))  # e^(-inf - 0) = 0 while no score is visible: never NaN
    P = np.exp(S_j - _safe(m_new)[:, None])
    l_new = alpha * l + P.sum(axis=1)
    # FA2.1 L10: acc_new = diag(e^(m - m_new)) acc + P~ V_j   (un-normalized: no division here)
    acc_new = alpha[:, None] * acc + P @ V_j
    return m_new, l_new, acc_new


def finalize(state):
    """FA2.1 L12-L13: ``O = acc / l`` and ``L = m + log l``; a row that saw nothing gives ``O = 0, L = -inf``."""
    m, l, acc = state
    seen = l > 0
    O = acc / np.where(seen, l, 1)[:, None]
    with np.errstate(divide="ignore"):
        L = np.where(seen, m + np.log(np.where(seen, l, 1)), -np.inf).astype(m.dtype)
    return O, L


def combine(parts):
    """Split-KV combine: ``(O, L)`` over all keys from the ``(O_k, L_k)`` of disjoint key ranges."""
    Os = [np.asarray(O) for O, _ in parts]
    Ls = [np.asarray(L) for _, L in parts]
    M = Ls[0]
    for L_k in Ls[1:]:
        M = np.maximum(M, L_k)
    total = sum(np.exp(L_k - _safe(M)) for L_k in Ls)  # each term <= 1; 0 for an empty part
    seen = total > 0
    with np.errstate(divide="ignore"):
        L = np.where(seen, _safe(M) + np.log(np.where(seen, total, 1)), -np.inf).astype(M.dtype)
    O = sum(np.exp(L_k - _safe(L))[:, None] * O_k for O_k, L_k in zip(Os, Ls))
    return O.astype(Os[0].dtype), L


def online_attention(blocks):
    """``(O, L)`` of attention over column blocks ``(S_j, V_j)`` that arrive one at a time (one pass)."""
    state = None
    for S_j, V_j in blocks:
        if state is None:
            state = init_state(S_j.shape[0], V_j.shape[1], S_j.dtype)
        state = absorb(state, S_j, V_j)
    if state is None:
        raise ValueError("online_attention needs at least one block")
    return finalize(state)
