"""Assignment 4: FA1 Algorithm 4, the recomputation backward pass, for one head, in NumPy.  <-- your file.

Read first: ``tutorials/05_backward_recomputation.py`` and FA1 Algorithm 4 (Appendix B.4).

The task: the gradients ``dQ, dK, dV`` of ``O = softmax(tau Q K^T) V`` for an upstream gradient ``dO``,
WITHOUT the N x N matrix ``P``: the forward pass saved only ``O`` and the logsumexp ``L = m + log l`` per
row, so you recompute each tile ``P_ij = exp(tau Q_i K_j^T - L_i)`` from ``Q_i``, ``K_j`` and ``L_i``
(line 13). No mask, no dropout (lines 12, 14, 15, 18 are identities).

HBM is modelled: every argument named ``g...`` is an :class:`numba_flash_reference.hbm.HBMArray` that
counts each element you load (``x = gQ[rows]``) or store (``gdQ[rows] = x``). What you load is a copy,
"on chip": work on it with NumPy as you like, and store results explicitly. Use ``.shape``, slices and
indexing on the ``g...`` arrays (no ``len``, no iteration).

Graded (``python -m pytest tutorials/assignments/a4_recompute_backward``), for ragged N and tiles:

* ``dQ, dK, dV`` equal the float64 gradients, to three times the error of a float32 standard backward;
* IO budget (Theorem 5's count, per array), with ``Tc = ceil(N_k / Bc)``: K and V read exactly once
  each; Q, O, dO, dQ read at most ``Tc N d`` times in all, L at most ``Tc N``; dQ written at most
  ``Tc N d``; dK and dV written exactly ``N_k d`` (once each);
* memory: no N x N array, ever (peak extra memory is bounded by a few dozen tiles, at N = 1000).

Hint: ``D_i = rowsum(P_i: o dP_i:)`` needs a whole row of ``P``; the D trick (eq. 4 of the paper) gives
the same number from ``dO_i`` and ``O_i``, which you have already loaded at line 10.
"""

from __future__ import annotations

import numpy as np  # noqa: F401  (you will need it)


def flash_backward(gQ, gK, gV, gO, gdO, gL, tau, Br, Bc, gdQ, gdK, gdV):
    """Gradients of ``O = softmax(tau Q K^T) V`` for one head, tile by tile (FA1 Algorithm 4).

    Parameters
    ----------
    gQ : array, (N, d)
        Q in HBM.
    gK, gV : array, (N_k, d)
        K, V in HBM.
    gO, gdO : array, (N, d)
        The forward's output O and the upstream gradient dO, in HBM.
    gL : array, (N,)
        The forward's logsumexp ``L = m + log l`` per row, in HBM.
    tau : float
        The softmax scale.
    Br, Bc : int
        Tile sizes: ``Q_i`` has ``Br`` rows, ``K_j, V_j`` have ``Bc`` rows (the last may be ragged).
    gdQ : array, (N, d)
        dQ in HBM, already zero (Alg.4 L5): accumulate into it.
    gdK, gdV : array, (N_k, d)
        dK, dV in HBM, full of NaN: write every element once.
    """
    # TODO Alg.4 L6:  for each column block j:  load K_j, V_j (L7); dK~_j = dV~_j = 0 (L8)
    # TODO Alg.4 L9:      for each row block i:  load Q_i, O_i, dO_i, dQ_i, L_i (L10)
    #                         S_ij (L11), P_ij (L13), dV~_j (L16), dP_ij (L17), D_i (L19), dS_ij (L20),
    #                         write dQ_i (L21), dK~_j (L22)
    # TODO Alg.4 L24:     write dK_j, dV_j
    raise NotImplementedError("a4: flash_backward")
