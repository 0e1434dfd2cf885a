"""Assignment 8: attention dropout with a counter-based RNG, in the forward and the backward kernels.  <-- your file.

Read first: FA1 Algorithm 2 (lines 1, 13-15) and Algorithm 4 (lines 1, 14-18): the forward drops
entries of ``P~`` after its statistics are taken, and the backward REGENERATES the same mask from the
seed ``R`` instead of storing an N x N mask; ``docs/dropout.rst``; your assignments 5 and 6.

The task, for one head, ``(N, d)`` float32:

1. ``dropout_keep(seed, row, col, threshold)``: a ``@cuda.jit(device=True)`` function that returns
   True iff element ``(row, col)`` survives: ``hash(seed, row, col) >= threshold``, where ``hash`` is a
   32-bit counter-based hash of your design (a pure function of its arguments: any thread of any
   kernel gets the same bit) and ``threshold = floor(p 2^32)``. Tip: a few rounds of an integer mixer
   (e.g. MurmurHash3's fmix32) chained over seed, row and column. In Numba keep every operand
   ``uint64`` (``numba.uint64``) and mask to 32 bits: mixing signed and unsigned integers gives floats.
2. ``make_forward(D)``: FA2's forward (your assignment 5, non-causal) with dropout: ``m`` and ``l``
   from the undropped ``P~`` (Alg.2 L13); ``P~ o Z`` with ``Z = keep / (1 - p)`` goes into
   ``O_i += P~ V_j`` (Alg.2 L14-L15). Output ``O`` and ``L = m + log l``.
3. ``make_preprocess(D)``, ``make_backward(D)``: FA2's backward (your assignment 6, atomic dQ) with
   the mask regenerated from the seed: ``dV_j += (P o Z)^T dO_i``, ``dP = (dO_i V_j^T) o Z``,
   ``dS = P o (dP - D_i)`` with ``D = rowsum(dO o O)`` (still valid with dropout, FA1 App. B.2).

The launchers (given) compute ``threshold`` and ``scale = 1 / (1 - p)``.

Graded (``python -m pytest tutorials/assignments/a8_dropout``):

* your mask (read through your ``dropout_keep``): keep rate ``1 - p`` within 5 sigma; two seeds,
  neighbouring rows and neighbouring columns agree as often as independent bits would;
* ``p = 0`` is attention without dropout; the forward equals float64 attention with YOUR mask; the
  backward equals the float64 gradients with the SAME mask (3x rule);
* dropout adds no HBM traffic to the forward (Q once, K and V ``Tr`` times, O and L once);
* house style; tags ``# Alg.2 L14:`` in the forward kernel and ``# Alg.4 L14:`` in the backward.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64  # noqa: F401

BR = 8  # rows of a query tile Q_i (the autograder reads it; 2 <= BR <= 64)
BC = 8  # rows of a key/value tile K_j (2 <= BC <= 64)


@cuda.jit(device=True)
def dropout_keep(seed, row, col, threshold):
    """True iff element (row, col) survives dropout: ``hash(seed, row, col) >= threshold`` (Alg.2 L14, Alg.4 L14)."""
    # TODO your counter-based hash
    raise NotImplementedError("a8: dropout_keep")


@functools.cache
def make_forward(D):
    """FA2 forward (non-causal) with dropout on P~ before P~ V_j."""

    @cuda.jit
    def dropout_forward_kernel(Q, K, V, O, L, tau, seed, threshold, scale):
        # TODO FA2.1 L4-L15 with Alg.2 L13-L15: statistics from P~, O from P~ o Z
        raise NotImplementedError("a8: dropout_forward_kernel")

    return dropout_forward_kernel


@functools.cache
def make_preprocess(D):
    """FA2.2 L3-L4: ``D_vec = rowsum(dO o O)`` and ``dQ = 0``; one thread per row."""

    @cuda.jit
    def preprocess_kernel(O, dO, D_vec, dQ):
        # TODO
        raise NotImplementedError("a8: preprocess_kernel")

    return preprocess_kernel


@functools.cache
def make_backward(D):
    """FA2 backward (atomic dQ) with the forward's mask regenerated from the seed (Alg.4 L14-L18)."""

    @cuda.jit
    def dropout_backward_kernel(Q, K, V, dO, L, D_vec, tau, seed, threshold, scale, dQ, dK, dV):
        # TODO FA2.2 L6-L18 with Alg.4 L14-L18
        raise NotImplementedError("a8: dropout_backward_kernel")

    return dropout_backward_kernel


def dropout_threshold(p):
    """The integer threshold ``floor(p 2^32)``: an element is kept iff its 32-bit hash is ``>= threshold``."""
    return int(math.floor(p * 4294967296.0))


def dropout_forward(Q, K, V, O, L, tau, p, seed):
    """FA2 forward with dropout ``p`` and counter-RNG ``seed`` (given): grid ``ceil(N / BR)`` blocks of ``BR``
    threads."""
    N = Q.shape[0]
    make_forward(Q.shape[1])[(N + BR - 1) // BR, BR](Q, K, V, O, L, tau, seed, dropout_threshold(p), 1.0 / (1.0 - p))


def dropout_backward(Q, K, V, O, dO, L, tau, p, seed, D_vec, dQ, dK, dV):
    """FA2 backward with the same dropout mask, regenerated from ``seed`` (given)."""
    N, d = Q.shape
    make_preprocess(d)[(N + BR - 1) // BR, BR](O, dO, D_vec, dQ)
    make_backward(d)[(N + BC - 1) // BC, BC](
        Q, K, V, dO, L, D_vec, tau, seed, dropout_threshold(p), 1.0 / (1.0 - p), dQ, dK, dV
    )
