"""Assignment 4: FA1 Algorithm 4, the recomputation backward pass, as a Numba kernel for one head.  <-- your file.

Read first: ``tutorials/05_backward_recomputation.py``, FA1 Appendix B.2 and Algorithm 4, and your
assignment 3 (its kernel produced the ``O, l, m`` this one consumes).

The task: the gradients ``dQ, dK, dV`` of ``O = softmax(tau Q K^T) V`` for an upstream gradient ``dO``,
for one head, ``(N, d)`` float32 arrays, WITHOUT the N x N matrix ``P``: every tile
``P_ij = diag(l_i)^-1 exp(tau Q_i K_j^T - m_i)`` is recomputed on chip from ``Q_i``, ``K_j`` and the
forward's final row statistics ``l, m`` (line 13). No mask, no dropout (lines 12, 14, 15, 18 are
identities). The loops are the paper's: the OUTER loop over key/value tiles ``j`` (line 6) keeps
``K_j, V_j`` and the accumulators ``dK~_j, dV~_j`` in SRAM; the INNER loop over query tiles ``i``
(line 9) loads ``Q_i, O_i, dO_i, dQ_i, l_i, m_i`` (line 10) and writes ``dQ_i`` back at every step
(line 21). ``dQ, dK, dV`` arrive full of NaN: initialize ``dQ`` (line 5), write every element.

Launch geometry (given below): ONE thread block for the head, ``BR`` threads. Suggested ownership:
thread ``t`` owns query row ``t`` of the tile for lines 10-21 (its row of ``S, P, dP, dS`` and of
``dQ_i``); after a barrier, thread ``t`` owns key rows ``t, t + BR, ...`` of ``dK~_j, dV~_j`` for
lines 16 and 22, which sum over the tile's query rows (read ``P_ij``, ``dS_ij``, ``Q_i``, ``dO_i`` from
SRAM).

Graded (``python -m pytest tutorials/assignments/a4_recompute_backward``), for ragged N and odd d:

* ``dQ, dK, dV`` equal the float64 gradients, to three times the error of a float32 standard backward;
* IO budget (Theorem 5, per element, simulator), ``Tc = ceil(N / BC)``: K, V read exactly once;
  dK, dV written exactly once and never read; Q, O, dO, l, m read at most ``Tc`` times; dQ read at
  most ``Tc`` times and written at most ``Tc + 1`` times, without atomics;
* shared memory per block at most ``4 ((4 BC + 2 BR) D + 2 BR BC + 8 BR)`` bytes;
* house style: one ``cuda.shared.array`` per line, ``# Sync:`` on every barrier, tags ``# Alg.4 L7:``,
  ``L10``, ``L11``, ``L13``, ``L16``, ``L17``, ``L19``, ``L20``, ``L21``, ``L22``, ``L24``.

Hint: ``D_i = rowsum(P_i: o dP_i:)`` is a sum over the WHOLE row, not over the tile; the D trick
(eq. 4) gives it from ``dO_i`` and ``O_i`` (line 19). Do not import numba-flash: the autograder rejects
a submission that uses the package.
"""

from __future__ import annotations

import functools
import math  # noqa: F401  (math.exp)

from numba import cuda, float32  # noqa: F401

BR = 8  # rows of a query tile Q_i = threads per block (the autograder reads it; 2 <= BR <= 64)
BC = 8  # rows of a key/value tile K_j, V_j (2 <= BC <= 64)


@functools.cache
def make_kernel(D):
    """The FA1 backward kernel specialized for head dimension ``D`` (shared tiles need constant shapes)."""

    @cuda.jit
    def flash_backward_kernel(Q, K, V, O, dO, l, m, tau, dQ, dK, dV):
        """FA1 Algorithm 4 for one head.

        Shared tiles you will want (one declaration per line): ``sK_j, sV_j, sdK_j, sdV_j`` ``(BC, D)``;
        ``sQ_i, sdO_i`` ``(BR, D)``; ``sP_ij, sdS_ij`` ``(BR, BC)``.
        """
        # TODO Alg.4 L5:  dQ = 0 in HBM
        # TODO Alg.4 L6:  for j in range(Tc):
        # TODO Alg.4 L7-L8:   load K_j, V_j; dK~_j = dV~_j = 0 in SRAM; barrier
        # TODO Alg.4 L9:      for i in range(Tr):   (this thread's row: i * BR + t, if < N)
        # TODO Alg.4 L10:         load Q_i, O_i, dO_i, l_i, m_i (and L19: D_i)
        # TODO Alg.4 L11-L20:     S_ij, P_ij, dP_ij, dS_ij (this thread's row)
        # TODO Alg.4 L21:         dQ_i += tau dS_ij K_j, read-modify-write in HBM
        #                         barrier
        # TODO Alg.4 L16, L22:    dV~_j += P_ij^T dO_i, dK~_j += tau dS_ij^T Q_i (this thread's key rows)
        #                         barrier
        # TODO Alg.4 L24:     write dK_j, dV_j; barrier before the next j
        raise NotImplementedError("a4: flash_backward_kernel")

    return flash_backward_kernel


def flash_backward(Q, K, V, O, dO, l, m, tau, dQ, dK, dV):
    """Run FA1 Algorithm 4 on one head. Given: one block of ``BR`` threads; the arrays go to the kernel as they are."""
    make_kernel(Q.shape[1])[1, BR](Q, K, V, O, dO, l, m, tau, dQ, dK, dV)
