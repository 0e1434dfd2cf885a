"""Tutorial 02: the online softmax, and the merge identity that makes FlashAttention exact.

Paper: Dao et al., "FlashAttention" (FA1), section 3.1 ("Tiling") and Algorithm 1 lines 10-12;
Dao, "FlashAttention-2", Algorithm 1 lines 9-10 (the un-normalized variant); Milakov & Gimelshein,
"Online normalizer calculation for softmax" (2018). Run it (seconds, no GPU needed)::

    python tutorials/02_online_softmax.py

What you learn
--------------
1. Softmax couples a whole row (every entry is divided by the row's sum), and the "safe" softmax
   needs the row max before anything can be exponentiated: three passes over the row.
2. The online softmax keeps a running max ``m`` and a running sum ``l`` and fixes ``l`` up whenever
   the max grows: one pass.
3. The same fix-up merges *whole summaries* ``(m, l, o)`` of two blocks of columns, where
   ``o = softmax(x) V`` is the block's attention output. The merge is exact, associative and
   commutative, and an all-masked block is its identity. That is FA1 Algorithm 1 lines 10-12, and
   why tiled attention equals standard attention (Theorem 1).

Read alongside: ``reference/online_softmax.py``. Next: ``03_first_numba_kernel.py``; assignment
``assignments/a1_online_softmax``.
"""

import numba_flash  # backend choice first, as everywhere in numba-flash (this tutorial runs no kernel)
from numba_flash_reference.online_softmax import identity_state, merge, merge_states, softmax_state

import numpy as np


def section(title):
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}")


def main():
    print(f"backend: {numba_flash.describe()}")
    rng = np.random.default_rng(0)

    # --------------------------------------------------------------------------------------------
    # 1. Why subtract the max. softmax(x)_k = exp(x_k) / sum_j exp(x_j) is mathematically unchanged by
    #    subtracting any constant from x; with the max, every exp is <= 1 and cannot overflow.
    #    float32 overflows at exp(88.7): attention scores of 100 are unusual but legal.
    # --------------------------------------------------------------------------------------------
    section("1. Safe softmax: three passes over the row")
    x = np.array([3.0, 100.0, 1.0, 99.0], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(x) / np.exp(x).sum()
    m = x.max()  # pass 1: the max
    l = np.exp(x - m).sum()  # pass 2: the sum at that max
    safe = np.exp(x - m) / l  # pass 3: normalize
    print(f"x = {x}\nnaive exp(x)/sum: {naive}   <- inf/inf = nan\nsafe:             {safe}")
    assert np.isnan(naive).any() and np.all(np.isfinite(safe))

    # --------------------------------------------------------------------------------------------
    # 2. Online softmax (one pass). Keep (m, l) for the prefix seen so far. When a new entry x_k
    #    arrives: m_new = max(m, x_k) and l_new = exp(m - m_new) * l + exp(x_k - m_new).
    #    exp(m - m_new) <= 1 moves the old sum to the new max. Start from m = -inf, l = 0:
    #    exp(-inf - x) = 0, so the first step needs no special case.
    # --------------------------------------------------------------------------------------------
    section("2. Online softmax: one pass, a running max and a running sum")
    x = rng.standard_normal(10) * 4
    m, l = -np.inf, 0.0
    for k, xk in enumerate(x):
        m_new = max(m, xk)
        l = np.exp(m - m_new) * l + np.exp(xk - m_new)
        m = m_new
        if k < 4:
            print(f"after x[{k}] = {xk:+.3f}: m = {m:+.3f}, l = {l:.6f}")
    print(f"...\nonline: m = {m:.6f}, l = {l:.12f}\nexact:  m = {x.max():.6f}, l = {np.exp(x - x.max()).sum():.12f}")
    assert m == x.max() and np.isclose(l, np.exp(x - x.max()).sum(), rtol=1e-14)

    # --------------------------------------------------------------------------------------------
    # 3. The merge identity. Split the columns of a row x = [x1, x2] and its values V = [V1; V2].
    #    Each block has a summary (m_b, l_b, o_b) with o_b = softmax(x_b) V_b. Then, m = max(m1, m2):
    #
    #        l = exp(m1 - m) l1 + exp(m2 - m) l2                          (FA1 Alg.1 L11)
    #        o = (exp(m1 - m) l1 o1 + exp(m2 - m) l2 o2) / l               (FA1 Alg.1 L12)
    #
    #    (o_b is normalized: multiply by l_b to get back exp(x_b - m_b) V_b, rescale both to the
    #    common max, add, normalize again.) Rows are independent, so this works for a block of rows.
    # --------------------------------------------------------------------------------------------
    section("3. Merging two blocks' summaries gives the softmax of the whole row, exactly")
    rows, n, d = 4, 12, 3
    S = rng.standard_normal((rows, n)) * 3  # scores of 4 query rows against 12 keys
    V = rng.standard_normal((n, d))
    whole = softmax_state(S, V)  # (m, l, o) over all 12 columns at once
    left, right = softmax_state(S[:, :5], V[:5]), softmax_state(S[:, 5:], V[5:])
    merged = merge(left.m, left.l, right.m, right.l, left.o, right.o)
    err = np.abs(merged.o - whole.o).max()
    print(f"max |o_merged - o_whole| = {err:.2e} (float64 rounding), m equal: {np.array_equal(merged.m, whole.m)}")
    assert err < 1e-13 and np.array_equal(merged.m, whole.m)

    # --------------------------------------------------------------------------------------------
    # 4. The merge is associative and commutative, so the blocks can be merged in ANY order or tree:
    #    left to right (FA1, FA2: one tile after another), or as a tree (split-K, FA2's decoding
    #    kernel that splits the KV cache across thread blocks and merges the partial results).
    # --------------------------------------------------------------------------------------------
    section("4. Any order, any tree")
    blocks = [softmax_state(S[:, j : j + 3], V[j : j + 3]) for j in range(0, n, 3)]  # 4 blocks of 3 columns
    sequential = blocks[0]
    for b in blocks[1:]:
        sequential = merge_states(sequential, b)
    tree = merge_states(merge_states(blocks[0], blocks[1]), merge_states(blocks[2], blocks[3]))
    backwards = merge_states(merge_states(blocks[3], blocks[2]), merge_states(blocks[1], blocks[0]))
    for name, s in (("left to right", sequential), ("tree", tree), ("reversed tree", backwards)):
        print(f"{name:>14}: max |o - o_whole| = {np.abs(s.o - whole.o).max():.1e}")
        assert np.allclose(s.o, whole.o, rtol=0, atol=1e-13)

    # --------------------------------------------------------------------------------------------
    # 5. Masked entries are -inf. A block in which a row sees no key has the summary
    #    (m = -inf, l = 0, o = 0): merging it changes nothing. The one trap is exp(-inf - (-inf)) = NaN
    #    when neither block saw a key yet; the factor multiplies l = 0 and o = 0, so use 0 there.
    # --------------------------------------------------------------------------------------------
    section("5. A fully masked block is the identity")
    masked = S.copy()
    masked[:, 5:] = -np.inf  # the right block is entirely masked for every row
    right_masked = softmax_state(masked[:, 5:], V[5:])
    print(f"masked block: m = {right_masked.m}, l = {right_masked.l}")
    merged = merge(left.m, left.l, right_masked.m, right_masked.l, left.o, right_masked.o)
    assert np.allclose(merged.o, left.o, rtol=0, atol=1e-15) and np.array_equal(merged.l, left.l)
    nothing = merge_states(identity_state(rows, d), identity_state(rows, d))
    assert np.all(nothing.m == -np.inf) and np.all(nothing.l == 0) and np.all(nothing.o == 0)  # no NaN
    print("merging with it returns the left block's summary; two empty blocks give m=-inf, l=0, o=0 (no NaN)")

    # --------------------------------------------------------------------------------------------
    # 6. FlashAttention-2's variant: keep o un-normalized (o~ = exp(x - m) V), rescale it by
    #    exp(m_old - m_new) at each step, divide by l only once at the end (FA2 Alg.1 L10, L12).
    #    Fewer divisions, same result: the division is a non-matmul FLOP, 16x dearer than a matmul
    #    FLOP on an A100 (FA2 section 3.1).
    # --------------------------------------------------------------------------------------------
    section("6. FA2: un-normalized accumulator, one division at the end")
    acc = identity_state(rows, d)
    for j in range(0, n, 3):
        Sj, Vj = S[:, j : j + 3], V[j : j + 3]
        mj = Sj.max(axis=1)
        Pj = np.exp(Sj - mj[:, None])
        acc = merge(acc.m, acc.l, mj, Pj.sum(axis=1), acc.o, Pj @ Vj, normalized=False)
    o_fa2 = acc.o / acc.l[:, None]  # FA2 Alg.1 L12: one division per row
    print(f"max |o_FA2 - o_whole| = {np.abs(o_fa2 - whole.o).max():.1e}")
    assert np.allclose(o_fa2, whole.o, rtol=0, atol=1e-13)

    print(
        "\nNext: assignments/a1_online_softmax asks you to write FA2's running state (absorb, finalize) and the "
        "split-KV combine."
    )


if __name__ == "__main__":
    main()
