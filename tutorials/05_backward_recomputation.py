"""Tutorial 05: the backward pass by recomputation (FA1 Algorithm 4).

Paper: Dao et al., "FlashAttention" (FA1), section 3.1 ("Recomputation"), Appendix B.2 (the gradient
derivation, eq. 4: the D trick), Algorithms 3 and 4, Theorem 5. Run it (a few seconds in the
simulator)::

    python tutorials/05_backward_recomputation.py

What you learn
--------------
1. The gradients of attention in five lines, checked against finite differences.
2. The D trick: ``D_i = rowsum(P_i: * dP_i:)``, a length-N reduction over a whole row of ``P``, equals
   ``dO_i . O_i``, a length-d dot product of things the backward pass already has.
3. Recomputation: the forward saves only ``O`` and one number per row, ``L = m + log l``; the backward
   rebuilds any tile ``P_ij = exp(S_ij - L_i)`` exactly. O(N) saved instead of O(N^2).
4. The trade: recomputation *adds* FLOPs (one more matmul per tile) and still moves fewer bytes
   (Theorem 5), which is why FlashAttention's backward is faster (FA1 Figure 2: 75.2 vs 66.6 GFLOPs,
   yet 7.3 vs 41.7 ms).
5. numba-flash's Algorithm 4 kernel agrees with the float64 oracle to three times the error of a
   float32 standard backward.

Read alongside: ``reference/alg3_backward.py``, ``reference/alg4_backward.py``,
``numba_flash/alg4_backward.py`` (region ``[doc:alg4-inner-loop]``). Next: assignment
``assignments/a4_recompute_backward``.
"""

import math
import sys
from pathlib import Path

import numba_flash
from numba_flash_reference import io_model
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward
from numba_flash_reference.alg4_backward import flash_backward

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for assignments.grading when run from elsewhere
from assignments.grading import assert_error_rule, attention_backward_naive32


def section(title):
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}")


def attention(Q, K, V, tau):
    """One head, float64: (O, P, L)."""
    S = tau * Q @ K.T
    m = S.max(axis=1)
    E = np.exp(S - m[:, None])
    l = E.sum(axis=1)
    P = E / l[:, None]
    return P @ V, P, m + np.log(l)


# [doc:tut05-gradients]
def gradients(Q, K, V, dO, tau):
    """FA1 Appendix B.2 for one head: the gradients of sum(dO * O), O = softmax(tau Q K^T) V."""
    O, P, _ = attention(Q, K, V, tau)
    dV = P.T @ dO  # O = P V
    dP = dO @ V.T
    D = np.sum(P * dP, axis=1)  # softmax Jacobian diag(p) - p p^T, row by row ...
    dS = P * (dP - D[:, None])  # ... gives dS_ij = P_ij (dP_ij - D_i)
    dQ = tau * dS @ K  # S = tau Q K^T
    dK = tau * dS.T @ Q
    return dQ, dK, dV


# [/doc:tut05-gradients]


def main():
    print(f"backend: {numba_flash.describe()}")
    rng = np.random.default_rng(0)
    N, d = 12, 4
    tau = 1 / math.sqrt(d)
    Q, K, V, dO = rng.standard_normal((4, N, d))

    section("1. The gradients, checked against central finite differences")
    grads = gradients(Q, K, V, dO, tau)

    def loss(Q, K, V):
        return float(np.sum(dO * attention(Q, K, V, tau)[0]))

    h = 1e-6
    for name, X, G in zip(("dQ", "dK", "dV"), (Q, K, V), grads):
        worst = 0.0
        for idx in [(0, 0), (5, 2), (N - 1, d - 1)]:
            Xp, Xm = X.copy(), X.copy()
            Xp[idx] += h
            Xm[idx] -= h
            args_p = [Xp if Y is X else Y for Y in (Q, K, V)]
            args_m = [Xm if Y is X else Y for Y in (Q, K, V)]
            fd = (loss(*args_p) - loss(*args_m)) / (2 * h)
            worst = max(worst, abs(fd - G[idx]))
        print(f"{name}: max |analytic - finite difference| over 3 entries = {worst:.1e}")
        assert worst < 1e-7  # central differences with h = 1e-6: O(h^2) truncation + O(eps / h) rounding

    section("2. The D trick: rowsum(P * dP) = dO . O  (FA1 eq. 4)")
    O, P, L = attention(Q, K, V, tau)
    dP = dO @ V.T
    D_row = np.sum(P * dP, axis=1)  # needs a whole row of P: N numbers per row
    D_trick = np.sum(dO * O, axis=1)  # needs dO_i and O_i: d numbers per row
    # sum_j P_ij dP_ij = sum_j P_ij (dO_i . v_j) = dO_i . sum_j P_ij v_j = dO_i . O_i
    print(f"max |rowsum(P * dP) - rowsum(dO * O)| = {np.abs(D_row - D_trick).max():.1e}")
    assert np.allclose(D_row, D_trick, rtol=0, atol=1e-13)

    section("3. Recomputation: P_ij = exp(S_ij - L_i) from one saved number per row")
    S = tau * Q @ K.T
    P_recomputed = np.exp(S - L[:, None])  # L = m + log l: exp(S - m) / l in one exp
    print(f"max |exp(S - L) - softmax(S)| = {np.abs(P_recomputed - P).max():.1e}")
    assert np.allclose(P_recomputed, P, rtol=0, atol=1e-15)
    # ... and any tile of it, from Q_i, K_j and L_i alone:
    rows, cols = slice(4, 8), slice(6, 12)
    P_tile = np.exp(tau * Q[rows] @ K[cols].T - L[rows, None])
    assert np.allclose(P_tile, P[rows, cols], rtol=0, atol=1e-15)
    print("what the forward must save per head, fp16: P (standard) vs L (FlashAttention)")
    for n in (1024, 4096, 16384):
        print(f"  N = {n:>6}: P = {n * n * 2 / 2**20:>8.1f} MiB   L = {n * 4 / 2**10:>5.0f} KiB (fp32)")

    section("4. The trade: more FLOPs, fewer HBM accesses (Theorem 5)")
    n, dd, M = 1024, 64, 98304  # GPT-2 medium's head (FA1 Fig. 2) and ~A100-sized SRAM in elements
    std, fa = io_model.io_alg3_backward(n, dd), io_model.io_alg4_backward(n, dd, M=M)
    flops_std = 4 * 2 * n * n * dd  # dV, dP, dQ, dK: four N x N x d matmuls
    flops_fa = 5 * 2 * n * n * dd  # plus recomputing S = Q K^T
    print(
        f"N = {n}, d = {dd}, M = {M:,}: standard backward {flops_std / 1e9:.2f} GFLOP, {std.total / 1e6:.1f} M "
        "accesses; "
        f"FlashAttention {flops_fa / 1e9:.2f} GFLOP (+25%), {fa.total / 1e6:.1f} M accesses "
        f"({std.total / fa.total:.1f}x fewer)"
    )
    assert flops_fa > flops_std and fa.total < std.total
    # Counted on the references' real loops (small N so that it runs in a blink):
    q, k, v, do = rng.standard_normal((4, 1, 64, 1, 8))
    _, counted_std = io_model.count_io(standard_backward, do, q, k, v)
    fwd = standard_attention(q, k, v)
    _, counted_fa = io_model.count_io(flash_backward, do, q, k, v, fwd.O, fwd.l, fwd.m, Br=16, Bc=16)
    assert counted_std == io_model.io_alg3_backward(64, 8) and counted_fa == io_model.io_alg4_backward(
        64, 8, Br=16, Bc=16
    )
    print(
        f"counted at N = 64, d = 8, 16 x 16 tiles: Algorithm 3 touches {sorted(counted_std.by_name)}; "
        f"Algorithm 4 touches {sorted(counted_fa.by_name)} (no P, dP, dS)"
    )

    section("5. numba-flash's Algorithm 4 kernel against the float64 oracle")
    q, k, v, do = (rng.standard_normal((1, 20, 2, 8)).astype(np.float32) for _ in range(4))
    out, stats = numba_flash.attention_numpy(q, k, v, algorithm="flash1", block_sizes=(8, 8), return_stats=True)
    dq, dk, dv = numba_flash.attention_backward_numpy(do, q, k, v, out, stats)
    ref = standard_backward(do, q, k, v)  # float64, tau = 1/sqrt(d)
    naive = [
        np.stack(g, axis=1)[None]
        for g in zip(
            *(
                attention_backward_naive32(q[0, :, h], k[0, :, h], v[0, :, h], do[0, :, h], 1 / math.sqrt(8))
                for h in range(2)
            )
        )
    ]
    for name, got, r, nv in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, naive):
        err = assert_error_rule(got, r, nv, mult=3, what=name)
        print(f"{name}: max error {err:.1e} (float32 standard backward: {np.abs(nv - r).max():.1e})")

    print("\nNext: assignments/a4_recompute_backward: write Algorithm 4 for one head, graded on Theorem 5's budget.")


if __name__ == "__main__":
    main()
