"""FA1 Algorithm 3: the standard attention backward pass, which materializes P, dP and dS in HBM.

Paper: Dao et al., "FlashAttention", Algorithm 3 (Appendix B.2). This is the backward pass of standard
attention (Algorithm 0): every N x N matrix (the forward's ``P``, then ``dP`` and ``dS``) is written to
HBM and read back, which costs Theta(Nd + N^2) HBM accesses (Theorem 5). FlashAttention's Algorithm 4
(:mod:`numba_flash_reference.alg4_backward`) computes the same gradients with Theta(N^2 d^2 / M).

What a reader learns here
-------------------------
The gradient of ``O = (P o Z) V`` with ``P = softmax(S)``, ``S = tau Q K^T`` (masked), ``Z`` the dropout
scale matrix (``1/(1-p)`` where kept, 0 where dropped; ``Z = 1`` without dropout), for an upstream
gradient ``dO``:

* ``dV = (P o Z)^T dO`` and ``dP = (dO V^T) o Z`` (the chain rule through the elementwise ``o Z``);
* the softmax Jacobian of row i is ``diag(p) - p p^T``, so
  ``dS_ij = P_ij (dP_ij - D_i)`` with ``D_i = sum_l P_il dP_il`` (line 3 below);
* ``dQ = tau dS K`` and ``dK = tau dS^T Q``.

Algorithm 4 replaces ``D_i = rowsum(P o dP)`` (a length-N reduction) by ``rowsum(dO o O)`` (length d):
``sum_l P_il Z_il (dO_i . v_l) = dO_i . sum_l (P o Z)_il v_l = dO_i . O_i``. This module keeps the
paper's line-3 form on purpose, so comparing it with Algorithm 4 also checks that identity.

Semantics are those of :func:`numba_flash_reference.alg0_standard.standard_attention` (see
:mod:`numba_flash_reference.common`): scale ``tau``, bottom-right causal mask, counter-hash dropout with
``bh = batch * nheads + head``, ``seqlen_q != seqlen_k``, GQA/MQA, and fully masked rows (``P = 0``, so
all their gradients are 0, never NaN). Under GQA the ``G = nheads / nheads_k`` query heads of a group
share one K, V: their gradients ``dK, dV`` are summed, i.e. the group's query heads act as ``G * s_q``
extra rows of one attention problem.

Loop structure: for every batch ``b`` and KV head ``hk`` (with its ``G`` query heads), lines 1-5 run
once over whole matrices. Nothing is tiled; the "SRAM" holds whatever one line needs.

HBM accesses (what ``counter`` counts)
--------------------------------------
With ``counter=HBMCounter()`` the HBM-resident arrays are :class:`~numba_flash_reference.hbm.HBMArray`
s and every load/store below is counted (element counts; per batch, per KV head with ``G`` query heads,
``N_q = seqlen_q``, ``N_k = seqlen_k``):

=======  ====================================================  =================================
line     reads                                                 writes
=======  ====================================================  =================================
L1       ``P`` G*N_q*N_k, ``dO`` G*N_q*d                        ``dV`` N_k*d
L2       ``dO`` G*N_q*d, ``V`` N_k*d                            ``dP`` G*N_q*N_k
L3       ``P`` G*N_q*N_k, ``dP`` G*N_q*N_k                      ``dS`` G*N_q*N_k
L4       ``dS`` G*N_q*N_k, ``K`` N_k*d                          ``dQ`` G*N_q*d
L5       ``dS`` G*N_q*N_k, ``Q`` G*N_q*d                        ``dK`` N_k*d
=======  ====================================================  =================================

Per query head (``G = 1``) that is ``7 N_q N_k`` accesses to N x N matrices plus
``4 N_q d + 4 N_k d`` to N x d ones: Theta(Nd + N^2). Not counted: making ``P`` (it is the forward's
output, Algorithm 0 line 2, already in HBM when Algorithm 3 starts) and the dropout matrix ``Z``, which
is regenerated from the seed as Algorithm 4 line 14 does (``# Dev:`` below).

Run it::

    >>> import numpy as np
    >>> from numba_flash_reference.alg3_backward import standard_backward
    >>> q, k, v, dout = np.random.default_rng(0).standard_normal((4, 1, 5, 2, 4))
    >>> dq, dk, dv = standard_backward(dout, q, k, v, causal=True)
    >>> dq.shape, dk.shape
    ((1, 5, 2, 4), (1, 5, 2, 4))
"""

from __future__ import annotations

import numpy as np

from .alg0_standard import masked_scores, row_softmax
from .common import check_qkv, default_scale, dropout_scale_matrix, dropout_threshold
from .hbm import hbm


def check_grad_inputs(q, dout, out=None, **stats):
    """Validate the backward pass's extra inputs against ``q`` (b, s_q, h, d).

    ``dout`` and ``out`` must have the shape of ``q``; each named statistic in ``stats`` (``l``, ``m``,
    ``L``) must be ``(b, h, s_q)``. Shared by the backward references.
    """
    b, s_q, h, _ = np.shape(q)
    for name, x in (("dout", dout), ("out", out)):
        if x is not None and np.shape(x) != np.shape(q):
            raise ValueError(f"{name} must have the shape of q {np.shape(q)}, got {np.shape(x)}")
    for name, x in stats.items():
        if np.shape(x) != (b, h, s_q):
            raise ValueError(f"{name} must have shape (batch, nheads, seqlen_q) = {(b, h, s_q)}, got {np.shape(x)}")


def standard_backward(dout, q, k, v, softmax_scale=None, causal=False, dropout_p=0.0, seed=0, counter=None):
    """FA1 Algorithm 3 with Algorithm 2's semantics: gradients of standard attention, in float64.

    Parameters
    ----------
    dout : array_like, (b, s_q, h, d)
        dO, the upstream gradient of the output.
    q, k, v : array_like, (b, s_q, h, d) and (b, s_k, h_k, d)
        The forward pass's inputs.
    softmax_scale : float, optional
        tau; default 1/sqrt(d).
    causal : bool
        Bottom-right aligned causal mask.
    dropout_p : float in [0, 1)
        Dropout probability; the mask is regenerated from ``seed`` exactly as the forward made it.
    seed : int
        Dropout seed (see :mod:`numba_flash_reference.common`).
    counter : HBMCounter, optional
        Count HBM loads/stores (table in the module docstring).

    Returns
    -------
    dq, dk, dv : ndarray, float64
        Same layouts as ``q``, ``k``, ``v``; ``dk``, ``dv`` are summed over each GQA group.
    """
    b, s_q, s_k, h, h_k, d = check_qkv(q, k, v)
    check_grad_inputs(q, dout)
    dropout_threshold(dropout_p)  # validates p
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    tau = default_scale(d, softmax_scale)
    G = h // h_k  # query heads per KV head (1 without GQA/MQA)

    dq = np.zeros((b, s_q, h, d))
    dk = np.zeros((b, s_k, h_k, d))
    dv = np.zeros((b, s_k, h_k, d))
    gQ, gK, gV, gdO = hbm(q, counter, "Q"), hbm(k, counter, "K"), hbm(v, counter, "V"), hbm(dout, counter, "dO")
    gdQ, gdK, gdV = hbm(dq, counter, "dQ"), hbm(dk, counter, "dK"), hbm(dv, counter, "dV")

    for bi in range(b):
        for hk in range(h_k):
            heads = range(hk * G, (hk + 1) * G)  # the query heads that share K, V head hk
            # The forward's N x N matrices in HBM, one per query head of the group: P (Alg.0 L2) is
            # made here from uncounted Q, K (it is an input of Algorithm 3); dP and dS are filled below.
            P_fwd = np.stack([row_softmax(masked_scores(q[bi, :, hi], k[bi, :, hk], tau, causal))[0] for hi in heads])
            # Dev: Algorithm 3 has no dropout. Z is regenerated from the seed, as Alg.4 L14 does, and not
            # stored in HBM (a framework would store the mask or P o Z; neither is counted here).
            Z = np.stack([dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p) for hi in heads])
            gP = hbm(P_fwd, counter, "P")  # (G, N_q, N_k) HBM
            gdP = hbm(np.zeros((G, s_q, s_k)), counter, "dP")  # (G, N_q, N_k) HBM
            gdS = hbm(np.zeros((G, s_q, s_k)), counter, "dS")  # (G, N_q, N_k) HBM

            # [doc:ref-alg3-backward]
            # Alg.3 L1: load P, dO; dV = (P o Z)^T dO, summed over the group's query heads; write dV
            dV = np.zeros((s_k, d))
            for g, hi in enumerate(heads):
                P = gP[g]  # HBM read: N_q*N_k
                dO = gdO[bi, :, hi]  # HBM read: N_q*d
                dV += (P * Z[g]).T @ dO
            gdV[bi, :, hk] = dV  # HBM write: N_k*d

            # Alg.3 L2: load dO, V; dP = dO V^T (times Z: the gradient w.r.t. the undropped P); write dP
            V = gV[bi, :, hk]  # HBM read: N_k*d
            for g, hi in enumerate(heads):
                dO = gdO[bi, :, hi]  # HBM read: N_q*d
                gdP[g] = (dO @ V.T) * Z[g]  # HBM write: N_q*N_k

            # Alg.3 L3: read P, dP; dS_ij = P_ij (dP_ij - D_i) with D_i = sum_l P_il dP_il; write dS
            for g in range(G):
                P = gP[g]  # HBM read: N_q*N_k
                dP = gdP[g]  # HBM read: N_q*N_k
                D = np.sum(P * dP, axis=1)  # (N_q,): the softmax Jacobian's p^T dp, row by row
                gdS[g] = P * (dP - D[:, None])  # HBM write: N_q*N_k

            # Alg.3 L4: load dS, K; dQ = tau dS K; write dQ
            K = gK[bi, :, hk]  # HBM read: N_k*d
            for g, hi in enumerate(heads):
                dS = gdS[g]  # HBM read: N_q*N_k
                gdQ[bi, :, hi] = tau * (dS @ K)  # HBM write: N_q*d

            # Alg.3 L5: load dS, Q; dK = tau dS^T Q, summed over the group's query heads; write dK
            dK = np.zeros((s_k, d))
            for g, hi in enumerate(heads):
                dS = gdS[g]  # HBM read: N_q*N_k
                Q = gQ[bi, :, hi]  # HBM read: N_q*d
                dK += tau * (dS.T @ Q)
            gdK[bi, :, hk] = dK  # HBM write: N_k*d
            # [/doc:ref-alg3-backward]

    # Alg.3 L6: return dQ, dK, dV
    return dq, dk, dv
