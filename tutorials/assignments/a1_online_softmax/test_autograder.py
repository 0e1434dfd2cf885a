"""Autograder for assignment 1 (online-softmax merge). Each test name is the claim it grades.

Inputs are float32 (as a kernel would see them). The reference is the float64 summary of
:mod:`numba_flash_reference.online_softmax`; the yardstick is the same summary computed directly, in
float32, over the whole row (:func:`grading.assert_error_rule`): merging block summaries may cost a
few more rounding steps than that, never more than twice its error plus a few ulps.

Run: ``python -m pytest tutorials/assignments/a1_online_softmax [--impl solution]``.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from numba_flash_reference.online_softmax import softmax_state

from .. import grading

f32 = np.float32


def make_row_problem(rng, rows, n, d, scale=3.0):
    """Scores S (rows, n) with spread ``scale`` and values V (n, d), float32, never zero."""
    S = (scale * rng.standard_normal((rows, n))).astype(f32)
    V = rng.standard_normal((n, d)).astype(f32)
    return S, V


def naive32(S, V):
    """The summary (m, l, o) of the whole row computed directly in float32: the error yardstick."""
    S, V = np.asarray(S, f32), np.asarray(V, f32)
    m = S.max(axis=1)
    m_safe = np.where(np.isfinite(m), m, f32(0))
    P = np.exp(S - m_safe[:, None])
    l = P.sum(axis=1)
    return m, l, (P @ V) / np.where(l > 0, l, f32(1))[:, None]


def assert_summary(got, S, V, what):
    """(m, l, o) against the float64 reference: m exactly (a max rounds nothing), l and o by the error rule."""
    m, l, o = (np.asarray(x) for x in got)
    ref = softmax_state(S, V)
    m32, l32, o32 = naive32(S, V)
    np.testing.assert_array_equal(m, ref.m, err_msg=f"{what}: m must be exactly the row max")
    grading.assert_error_rule(l, ref.l, l32, what=f"{what}: l")
    grading.assert_error_rule(o, ref.o, o32, what=f"{what}: o")


def test_block_state_is_the_softmax_summary_of_the_block(impl, rng):
    S, V = make_row_problem(rng, rows=7, n=5, d=3)
    assert_summary(impl.block_state(S, V), S, V, "block_state")


def test_merge_of_two_blocks_equals_the_summary_of_the_whole_row(impl, rng):
    S, V = make_row_problem(rng, rows=9, n=11, d=4)
    merged = impl.merge(impl.block_state(S[:, :4], V[:4]), impl.block_state(S[:, 4:], V[4:]))
    assert_summary(merged, S, V, "merge")


def test_merging_in_any_order_gives_the_same_softmax(impl, rng):
    """The merge is associative and commutative: a tree of merges (split-K, FA2 decoding) is exact too."""
    S, V = make_row_problem(rng, rows=6, n=13, d=3)
    a, b, c = (impl.block_state(S[:, s], V[s]) for s in (slice(0, 3), slice(3, 8), slice(8, 13)))
    assert_summary(impl.merge(impl.merge(a, b), c), S, V, "(a + b) + c")
    assert_summary(impl.merge(a, impl.merge(b, c)), S, V, "a + (b + c)")
    # merging c first moves the blocks' columns; the row's softmax is the same set of terms
    perm = np.r_[8:13, 3:8, 0:3]
    assert_summary(impl.merge(c, impl.merge(b, a)), S[:, perm], V[perm], "c + (b + a)")


def test_a_fully_masked_block_is_the_identity_of_merge(impl, rng):
    """Rows masked in one block keep the other block's summary; rows masked everywhere give m=-inf, l=0, o=0."""
    S, V = make_row_problem(rng, rows=6, n=8, d=3)
    S[:3, 5:] = -np.inf  # rows 0-2: the second block is fully masked
    S[4:, :] = -np.inf  # rows 4-5: no visible score at all
    merged = impl.merge(impl.block_state(S[:, :5], V[:5]), impl.block_state(S[:, 5:], V[5:]))
    m, l, o = (np.asarray(x) for x in merged)
    assert np.all(m[4:] == -np.inf) and np.all(l[4:] == 0) and np.all(o[4:] == 0), "fully masked rows: m=-inf, l=0, o=0"
    assert_summary((m[:4], l[:4], o[:4]), S[:4], V, "rows with masked entries")


def test_scores_of_a_thousand_do_not_overflow(impl, rng):
    """exp(1000) overflows in float32 and float64: the row max must be subtracted before exp."""
    S, V = make_row_problem(rng, rows=5, n=9, d=3, scale=1000.0)
    merged = impl.merge(impl.block_state(S[:, :6], V[:6]), impl.block_state(S[:, 6:], V[6:]))
    assert_summary(merged, S, V, "large scores")


@pytest.mark.parametrize("n, Bc", [(19, 4), (5, 8)], ids=["ragged-blocks", "one-block"])
def test_online_attention_equals_softmax_attention(impl, rng, n, Bc):
    S, V = make_row_problem(rng, rows=6, n=n, d=5)
    blocks = ((S[:, j : j + Bc].copy(), V[j : j + Bc].copy()) for j in range(0, n, Bc))
    assert_summary(impl.online_attention(blocks), S, V, "online_attention")


def test_online_attention_reads_each_block_once_and_keeps_only_the_current_one(impl, rng):
    """The IO budget of a streaming softmax: one pass over the blocks, O(1) blocks in memory.

    When block j is handed out, blocks j-2 and older must be garbage (only the previous block, still
    bound to the loop variables, may be alive).
    """
    S, V = make_row_problem(rng, rows=4, n=24, d=3)
    Bc, alive, handed = 4, [], [0]

    def blocks():
        for j in range(0, S.shape[1], Bc):
            gc.collect()
            kept = [k for k, ref in enumerate(alive[:-1]) if ref() is not None]
            assert not kept, f"blocks {kept} are still referenced when block {len(alive)} is requested"
            S_j, V_j = S[:, j : j + Bc].copy(), V[j : j + Bc].copy()
            alive.append(weakref.ref(S_j))
            handed[0] += 1
            yield S_j, V_j
            del S_j, V_j

    result = impl.online_attention(blocks())
    assert handed[0] == S.shape[1] // Bc, "every block must be consumed"
    assert_summary(result, S, V, "online_attention")
