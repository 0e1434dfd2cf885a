"""Assignment 7: block-sparse FlashAttention forward (FA1 Algorithm 5), one head.  <-- your file.

Read first: FA1 Appendix D.1 (Algorithm 5), section 3.3 and Proposition 4; your assignment 3 (this is
Algorithm 1 with one more line).

The task: attention restricted to a block pattern. ``block_mask`` is a ``(Tr, Tc)`` int32 array
(``Tr = ceil(N / BR)``, ``Tc = ceil(N / BC)``) in HBM; query ``r`` may see key ``c`` iff
``block_mask[r // BR, c // BC] != 0``. Write ``O`` and the final row statistics ``l, m`` (as in
assignment 3) with FA1's loop order, and run the inner step only ``if block_mask[i, j] != 0`` (line
8): a zero tile costs no FLOP and no HBM access. A row whose tiles are all zero keeps line 2's values:
``O = 0, l = 0, m = -inf`` (never NaN). You may skip loading ``K_j, V_j`` when column ``j`` of the mask
is all zero (the paper loads them anyway; both fit the budget).

Launch geometry (given below): ONE block of ``BR`` threads for the head, as in assignment 3.

Graded (``python -m pytest tutorials/assignments/a7_block_sparse``):

* ``O, l, m`` equal the float64 reference with the expanded element mask (random and dense masks;
  an empty query tile; an unused key tile), to twice the float32 error;
* IO per element (simulator): Q, O, l, m of a row read at most once per non-zero tile of its query
  tile; O, l, m written at most once per non-zero tile plus once (line 2); K, V read at most once, and
  exactly once where a non-zero tile uses them; the row-side total is at most the dense launch's
  times the (row-weighted) fraction of non-zero tiles, plus line 2's writes (Proposition 4);
* shared memory per block at most ``4 ((2 BC + 2 BR) D + BR BC + 8 BR)`` bytes;
* house style; tags ``# Alg.5 L6:``, ``L8``, ``L9``, ``L10``, ``L12``, ``L13``, ``L15``, ``L16``.
"""

from __future__ import annotations

import functools
import math  # noqa: F401

from numba import cuda, float32  # noqa: F401

BR = 8  # rows of a query tile Q_i = threads per block (the autograder reads it; 2 <= BR <= 64)
BC = 8  # rows of a key/value tile K_j, V_j (2 <= BC <= 64)


@functools.cache
def make_kernel(D):
    """The block-sparse forward kernel specialized for head dimension ``D``."""

    @cuda.jit
    def block_sparse_kernel(Q, K, V, block_mask, O, l, m, tau):
        """FA1 Algorithm 5 for one head."""
        # TODO Alg.5 L2:  O = 0, l = 0, m = -inf in HBM
        # TODO Alg.5 L5:  for j in range(Tc):
        # TODO Alg.5 L6:      load K_j, V_j (if any tile of column j is non-zero); barrier
        # TODO Alg.5 L7:      for i in range(Tr):
        # TODO Alg.5 L8:          if block_mask[i, j] != 0 (and this thread's row < N):
        # TODO Alg.5 L9-L16:          Algorithm 1 lines 8-13 (as in assignment 3)
        #                     barrier before the next j overwrites K_j, V_j
        raise NotImplementedError("a7: block_sparse_kernel")

    return block_sparse_kernel


def block_sparse_forward(Q, K, V, block_mask, O, l, m, tau):
    """Run FA1 Algorithm 5 on one head. Given: one block of ``BR`` threads."""
    make_kernel(Q.shape[1])[1, BR](Q, K, V, block_mask, O, l, m, tau)
