"""Tutorial 04: the tiled FlashAttention forward pass (FA1 Algorithm 1), in NumPy and as a Numba kernel.

Paper: Dao et al., "FlashAttention" (FA1), Algorithm 1 (section 3.1), Theorem 1 (correctness) and
Theorem 2 (HBM accesses); Dao, "FlashAttention-2", Algorithm 1 (the swapped loops). Run it (a few
seconds in the simulator)::

    python tutorials/04_tiled_flash_forward.py

What you learn
--------------
1. Algorithm 1 line by line on a tiny problem, with Theorem 1's loop invariant checked after every
   outer step: after the key/value tiles ``1..j``, ``O`` holds exactly ``softmax(S[:, :cols]) V[:cols]``
   and ``m, l`` the max and sum of those columns. Tiling loses nothing.
2. The HBM traffic of that loop order: K and V are read once, but Q, O, l, m make ``Tc`` round trips
   (Theorem 2); FlashAttention-2's swapped loops make K and V travel ``Tr`` times instead and write O
   once.
3. Where each line of the paper lives in numba-flash's kernel (``numba_flash/alg1_forward.py``) and in
   its NumPy twin (``reference/alg1_forward.py``), and that the kernel agrees with the float64 oracle
   to twice the error of float32 standard attention.

Read alongside: ``reference/alg1_forward.py`` and ``numba_flash/alg1_forward.py`` (the regions marked
``[doc:alg1-outer-loop]`` and ``[doc:alg1-inner-loop]``). Next: ``05_backward_recomputation.py``;
assignment ``assignments/a3_flash_forward`` (write the kernel yourself, within Theorem 2's IO budget).
"""

import math
import re
import sys
from pathlib import Path

import numba_flash
from numba_flash_reference import io_model
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg1_forward import flash_forward_alg1
from numba_flash_reference.fa2_forward import flash_forward_fa2

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for assignments.grading when run from elsewhere
from assignments.grading import assert_error_rule, attention_naive32

REPO = Path(__file__).resolve().parent.parent


def section(title):
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}")


# [doc:tut04-alg1-numpy]
def algorithm1_with_invariant(Q, K, V, Br, Bc):
    """FA1 Algorithm 1 for one head (Q, K, V of shape (N, d)), checking Theorem 1's invariant as it goes."""
    N, d = Q.shape
    # Alg.1 L2: in HBM, O = 0, l = 0, m = -inf
    O, l, m = np.zeros((N, d)), np.zeros(N), np.full(N, -np.inf)
    # Alg.1 L3-L4: Tr row blocks of Br rows, Tc column blocks of Bc rows (the last of each may be short)
    rows = [slice(r, min(r + Br, N)) for r in range(0, N, Br)]
    cols = [slice(c, min(c + Bc, N)) for c in range(0, N, Bc)]
    for j, cj in enumerate(cols):  # Alg.1 L5: outer loop over K/V tiles
        K_j, V_j = K[cj], V[cj]  # Alg.1 L6: load K_j, V_j to SRAM
        for ri in rows:  # Alg.1 L7: inner loop over Q tiles
            Q_i, O_i, l_i, m_i = Q[ri], O[ri], l[ri], m[ri]  # Alg.1 L8: load from HBM
            S_ij = Q_i @ K_j.T  # Alg.1 L9
            m_tilde = S_ij.max(axis=1)  # Alg.1 L10
            P_tilde = np.exp(S_ij - m_tilde[:, None])
            l_tilde = P_tilde.sum(axis=1)
            m_new = np.maximum(m_i, m_tilde)  # Alg.1 L11
            l_new = np.exp(m_i - m_new) * l_i + np.exp(m_tilde - m_new) * l_tilde
            # Alg.1 L12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j)
            O[ri] = (
                (l_i * np.exp(m_i - m_new))[:, None] * O_i + np.exp(m_tilde - m_new)[:, None] * (P_tilde @ V_j)
            ) / l_new[:, None]
            l[ri], m[ri] = l_new, m_new  # Alg.1 L13
        # Theorem 1's invariant after outer step j: the attention over the columns seen so far
        seen = slice(0, cj.stop)
        S = Q @ K[seen].T
        P = np.exp(S - S.max(axis=1, keepdims=True))
        err = np.abs(O - (P / P.sum(axis=1, keepdims=True)) @ V[seen]).max()
        print(
            f"  after j = {j + 1}/{len(cols)} (keys 0..{cj.stop - 1}): max |O - softmax(S[:, :{cj.stop}]) "
            f"V[:{cj.stop}]| = {err:.1e}"
        )
        assert err < 1e-13 and np.abs(m - S.max(axis=1)).max() < 1e-13  # float64 rounding only
    return O, l, m


# [/doc:tut04-alg1-numpy]


def tag_lines(path, prefix="Alg.1"):
    """{paper line: first source line carrying the tag ``# <prefix> L<n>``} for one file."""
    found = {}
    tag = re.compile(r"(?:^|\s)#\s*" + re.escape(prefix) + r" L(\d+)(?:-L(\d+))?")  # a comment, not ``# ...`` in a
    # docstring
    for lineno, text in enumerate(Path(path).read_text().splitlines(), start=1):
        match = tag.search(text)
        if match:
            first = int(match.group(1))
            for n in range(first, int(match.group(2) or first) + 1):  # a range L3-L4 tags both lines
                found.setdefault(n, lineno)
    return found


def main():
    print(f"backend: {numba_flash.describe()}")
    rng = np.random.default_rng(0)

    section("1. Algorithm 1 step by step (N = 10, d = 4, Br = 3, Bc = 4: Tr = 4, Tc = 3, ragged tails)")
    Q, K, V = rng.standard_normal((3, 10, 4))
    O, l, m = algorithm1_with_invariant(Q, K, V, Br=3, Bc=4)
    ref = flash_forward_alg1(*(x[None, :, None, :] for x in (Q, K, V)), Br=3, Bc=4)  # the reference module
    oracle = standard_attention(*(x[None, :, None, :] for x in (Q, K, V)), softmax_scale=1.0)
    print(
        f"max |O - reference/alg1_forward| = {np.abs(O - ref.O[0, :, 0]).max():.1e}, "
        f"max |O - standard attention| = {np.abs(O - oracle.O[0, :, 0]).max():.1e}"
    )
    assert np.allclose(O, oracle.O[0, :, 0], rtol=0, atol=1e-13) and np.allclose(l, oracle.l[0, 0], rtol=1e-13)

    section("2. HBM traffic of the two loop orders (counted on the references, N = 64, d = 8, Br = Bc = 16)")
    N, d, Br, Bc = 64, 8, 16, 16
    q, k, v = rng.standard_normal((3, 1, N, 1, d))
    Tr, Tc = math.ceil(N / Br), math.ceil(N / Bc)
    _, fa1 = io_model.count_io(flash_forward_alg1, q, k, v, Br=Br, Bc=Bc)
    _, fa2 = io_model.count_io(flash_forward_fa2, q, k, v, Br=Br, Bc=Bc)
    print(f"{'array':>6} {'FA1 reads':>10} {'FA1 writes':>11} {'FA2 reads':>10} {'FA2 writes':>11}   (N d = {N * d})")
    for name in ("Q", "K", "V", "O", "l", "m", "L"):
        r1, w1 = fa1.by_name.get(name, (0, 0))
        r2, w2 = fa2.by_name.get(name, (0, 0))
        print(f"{name:>6} {r1:>10} {w1:>11} {r2:>10} {w2:>11}")
    # FA1 (K/V outer): K, V read once; Q and O read (and O written) once per outer step: Tc passes.
    assert (
        fa1.by_name["K"] == (N * d, 0)
        and fa1.by_name["Q"] == (Tc * N * d, 0)
        and fa1.by_name["O"] == (Tc * N * d, Tc * N * d)
    )
    # FA2 (Q outer): Q read once and O written once; K and V stream past every row block: Tr passes.
    assert fa2.by_name["Q"] == (N * d, 0) and fa2.by_name["K"] == (Tr * N * d, 0) and fa2.by_name["O"] == (0, N * d)
    print(
        f"FA1: {fa1.total} accesses; FA2: {fa2.total}. Both match the closed forms of reference/io_model.py:",
        fa1 == io_model.io_alg1_forward(N, d, Br=Br, Bc=Bc) and fa2 == io_model.io_fa2_forward(N, d, Br=Br, Bc=Bc),
    )

    section("3. The Numba kernel: where each line of Algorithm 1 lives")
    kernel_file, ref_file = REPO / "numba_flash" / "alg1_forward.py", REPO / "reference" / "alg1_forward.py"
    in_kernel, in_ref = tag_lines(kernel_file), tag_lines(ref_file)
    print(f"{'paper line':>10}  {'numba_flash/alg1_forward.py':>28}  {'reference/alg1_forward.py':>26}")
    for n in range(1, 17):
        if n in in_kernel or n in in_ref:
            print(f"{'Alg.1 L' + str(n):>10}  {in_kernel.get(n, '-'):>28}  {in_ref.get(n, '-'):>26}")
    assert all(n in in_kernel and n in in_ref for n in (6, 8, 9, 10, 11, 12, 13))

    # The kernel, through numba-flash's NumPy API: batch 1, 2 heads, N = 20 (ragged for 8 x 8 tiles), d = 8.
    q, k, v = (rng.standard_normal((1, 20, 2, 8)).astype(np.float32) for _ in range(3))
    out = numba_flash.attention_numpy(q, k, v, algorithm="flash1", block_sizes=(8, 8))
    tau = 1.0 / math.sqrt(8)
    oracle = standard_attention(q, k, v).O  # float64, tau = 1/sqrt(d)
    naive = np.stack([attention_naive32(q[0, :, h], k[0, :, h], v[0, :, h], tau)[0] for h in range(2)], axis=1)[None]
    err = assert_error_rule(out, oracle, naive, what="flash1 kernel output")
    print(
        f"\nkernel (algorithm='flash1', Br = Bc = 8) vs float64 oracle: max error {err:.1e} "
        f"(float32 standard attention: {np.abs(naive - oracle).max():.1e})"
    )

    print("\nNext: assignments/a3_flash_forward: write this kernel for one head, graded on Theorem 2's IO budget.")


if __name__ == "__main__":
    main()
