"""Assignment 6: the FlashAttention-2 backward kernels (FA2 Algorithm 2), atomic and deterministic, one head.  <-- your
file.

Read first: FA2 (ICLR version) Appendix A, Algorithm 2, and section 3.2 (the backward pass is
parallelized over column blocks); ``tutorials/05_backward_recomputation.py``; your assignment 4.

The task: ``dQ, dK, dV`` of ``O = softmax(tau Q K^T) V`` for an upstream gradient ``dO``, for one head,
``(N, d)`` float32, from the forward's ``O`` and logsumexp ``L`` (assignment 5), in three kernels:

1. ``make_preprocess(D)``: FA2.2 L3-L4, a separate pre-pass: ``D_vec = rowsum(dO o O)`` (length N)
   to HBM, and ``dQ = 0`` when ``zero_dQ`` (the atomic variant accumulates into it).
2. ``make_kernel(D, deterministic)``: FA2.2 L5-L18. Grid: one block per key/value tile ``j``
   (``BC`` threads). The block loads ``K_j, V_j`` once, keeps ``dK_j, dV_j`` on chip, and for every
   query tile ``i`` loads ``Q_i, dO_i, L_i, D_i`` (line 9), recomputes ``P = exp(tau S - L_i)``
   (line 11: no ``m``, no ``l``), accumulates ``dV_j`` (12), ``dP`` (13), ``dS`` (14), ``dK_j`` (16), and
   adds ``tau dS K_j`` into ``dQ_i`` (15). ``dQ_i`` sums over ``j``, and the ``j`` are different blocks:
   * ``deterministic=False``: ``cuda.atomic.add`` into ``dQ`` (fast; the order of the additions, hence
     the last bits of dQ, may change from run to run on a GPU);
   * ``deterministic=True``: store into block ``j``'s own slice ``dQ_partial[j]`` (plain stores, no
     atomics); a third kernel sums the slices.
3. ``make_reduce(D)``: ``dQ = sum_j dQ_partial[j]``, in the fixed order ``j = 0, 1, ...``.

Writes ``dK_j, dV_j`` once (line 18). ``D_vec, dQ, dK, dV`` (and ``dQ_partial``) arrive full of NaN.
Include ``tau`` in ``dQ`` and ``dK`` (the paper leaves the scale out). No mask, no dropout.

Graded (``python -m pytest tutorials/assignments/a6_fa2_backward``), ``Tc = ceil(N / BC)``:

* ``dQ, dK, dV`` within 3x the float32 error (both variants), ``D`` within 2x;
* IO per element (simulator): O read once (pre-pass only); D written once, read ``Tc`` times; K, V
  read once; dK, dV written once; Q, L read ``Tc`` times, dO ``Tc + 1``; atomic variant: ``Tc`` atomic
  adds per dQ element and nothing else (but one zeroing write); deterministic: no atomics anywhere,
  each ``dQ_partial`` element written once and read once, dQ written once;
* shared memory per block at most ``4 ((2 BC + 2 BR) D + BR BC + 8 (BR + BC))`` bytes;
* house style in the main kernel, both variants; tags ``# FA2.2 L6:``, ``L9``-``L16``, ``L18``.
"""

from __future__ import annotations

import functools
import math  # noqa: F401

import numpy as np
from numba import cuda, float32  # noqa: F401

BR = 8  # rows of a query tile Q_i (the autograder reads it; 2 <= BR <= 64)
BC = 8  # rows of a key/value tile K_j = threads per block of the main kernel (2 <= BC <= 64)


@functools.cache
def make_preprocess(D):
    """FA2.2 L3-L4: ``D_vec[row] = rowsum(dO[row] * O[row])``; if ``zero_dQ``, ``dQ[row] = 0``."""

    @cuda.jit
    def preprocess_kernel(O, dO, D_vec, dQ, zero_dQ):
        # TODO FA2.2 L4 (and L3 when zero_dQ): one thread per row
        raise NotImplementedError("a6: preprocess_kernel")

    return preprocess_kernel


@functools.cache
def make_kernel(D, deterministic):
    """The FA2 backward kernel for head dimension ``D``; ``deterministic`` chooses how line 15 accumulates dQ."""

    @cuda.jit
    def flash2_backward_kernel(Q, K, V, dO, L, D_vec, tau, dQ, dQ_partial, dK, dV):
        """FA2 Algorithm 2, lines 5-18, for column block ``j = cuda.blockIdx.x``."""
        # TODO FA2.2 L6:  load K_j (SRAM), V_j;  L7: dK_j = dV_j = 0 on chip
        # TODO FA2.2 L8:  for i in range(Tr):
        # TODO FA2.2 L9:      load Q_i, dO_i, L_i, D_i together; barrier
        # TODO FA2.2 L10-L14, L16:  S, P = exp(tau S - L_i), dV_j, dP, dS (to SRAM), dK_j
        #                     barrier
        # TODO FA2.2 L15:     dQ_i += tau dS K_j: cuda.atomic.add(dQ, ...) or dQ_partial[j, ...] = ...
        #                     barrier
        # TODO FA2.2 L18: write dK_j, dV_j
        raise NotImplementedError("a6: flash2_backward_kernel")

    return flash2_backward_kernel


@functools.cache
def make_reduce(D):
    """Deterministic variant: ``dQ[row] = sum_j dQ_partial[j, row]`` in the order ``j = 0..Tc-1``."""

    @cuda.jit
    def reduce_kernel(dQ_partial, dQ):
        # TODO one thread per row
        raise NotImplementedError("a6: reduce_kernel")

    return reduce_kernel


def flash2_backward(Q, K, V, O, dO, L, tau, D_vec, dQ, dK, dV, dQ_partial=None):
    """FA2's backward on one head (given). ``dQ_partial`` of shape ``(ceil(N / BC), N, d)``: the deterministic
    variant."""
    N, d = Q.shape
    deterministic = dQ_partial is not None
    rows = (N + BR - 1) // BR
    make_preprocess(d)[rows, BR](O, dO, D_vec, dQ, not deterministic)
    workspace = dQ_partial if deterministic else np.zeros((1, 1, 1), np.float32)  # unused by the atomic variant
    make_kernel(d, deterministic)[(N + BC - 1) // BC, BC](Q, K, V, dO, L, D_vec, tau, dQ, workspace, dK, dV)
    if deterministic:
        make_reduce(d)[rows, BR](dQ_partial, dQ)
