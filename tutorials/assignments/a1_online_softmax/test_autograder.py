"""Autograder for assignment 1 (FA2's running softmax state and the split-KV combine). Test names are the claims.

Inputs are float32 (as a kernel would see them). References are computed here in float64, directly
over the whole row; the yardstick of the error rule (:func:`grading.assert_error_rule`) is the same
direct computation in float32: working block by block may cost a few more rounding steps than that,
never more than twice its error plus a few ulps.

Run: ``python -m pytest tutorials/assignments/a1_online_softmax [--impl solution]``.
"""

from __future__ import annotations

import numpy as np
import pytest

from .. import grading

f32 = np.float32


def make_row_problem(rng, rows, n, d, scale=3.0):
    """Scores S (rows, n) with spread ``scale`` and values V (n, d), float32, never zero."""
    S = (scale * rng.standard_normal((rows, n))).astype(f32)
    V = rng.standard_normal((n, d)).astype(f32)
    return S, V


def direct(S, V, dtype):
    """``(m, l, acc, O, L)`` of the whole row computed directly in ``dtype`` (masked rows: -inf, 0, 0, 0, -inf)."""
    S, V = np.asarray(S, dtype), np.asarray(V, dtype)
    m = S.max(axis=1)
    m_safe = np.where(np.isfinite(m), m, 0).astype(dtype)
    E = np.exp(S - m_safe[:, None])
    l = E.sum(axis=1)
    acc = E @ V
    O = acc / np.where(l > 0, l, 1).astype(dtype)[:, None]
    with np.errstate(divide="ignore"):
        L = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(dtype)
    return m, l, acc, O, L


def assert_result(got, S, V, what):
    """``(O, L)`` against the float64 reference, by the error rule."""
    O, L = (np.asarray(x) for x in got)
    *_, O64, L64 = direct(S, V, np.float64)
    *_, O32, L32 = direct(S, V, f32)
    grading.assert_error_rule(O, O64, O32, what=f"{what}: O")
    grading.assert_error_rule(L, L64, L32, what=f"{what}: L (the logsumexp m + log l)")


def blocks_of(S, V, Bc):
    return [(S[:, j : j + Bc].copy(), V[j : j + Bc].copy()) for j in range(0, S.shape[1], Bc)]


def run_blocks(impl, S, V, Bc):
    state = impl.init_state(S.shape[0], V.shape[1])
    for S_j, V_j in blocks_of(S, V, Bc):
        state = impl.absorb(state, S_j, V_j)
    return state


def test_init_state_is_the_empty_row(impl):
    """FA2.1 L5: m = -inf, l = 0, acc = 0, in float32."""
    m, l, acc = (np.asarray(x) for x in impl.init_state(4, 3))
    assert m.shape == (4,) and l.shape == (4,) and acc.shape == (4, 3), f"shapes {m.shape}, {l.shape}, {acc.shape}"
    assert np.all(m == -np.inf) and np.all(l == 0) and np.all(acc == 0), "expected m = -inf, l = 0, acc = 0"
    assert m.dtype == f32 and l.dtype == f32 and acc.dtype == f32, "keep float32, as a kernel would"


def test_absorb_keeps_an_unnormalized_accumulator(impl, rng):
    """FA2.1 L9-L10: after the blocks, m is the row max, l = rowsum(exp(S - m)), acc = exp(S - m) V (no division)."""
    S, V = make_row_problem(rng, rows=7, n=11, d=3)
    m, l, acc = (np.asarray(x) for x in run_blocks(impl, S, V, Bc=4))
    m64, l64, acc64, *_ = direct(S, V, np.float64)
    m32, l32, acc32, *_ = direct(S, V, f32)
    np.testing.assert_array_equal(m, m64, err_msg="m must be exactly the row max (a max rounds nothing)")
    grading.assert_error_rule(l, l64, l32, what="l")
    grading.assert_error_rule(acc, acc64, acc32, what="acc (un-normalized: exp(S - m) V, divided by nothing)")


@pytest.mark.parametrize("n, Bc", [(19, 4), (5, 8)], ids=["ragged-blocks", "one-block"])
def test_absorb_then_finalize_equals_softmax_attention(impl, rng, n, Bc):
    """FA2.1 L12-L13: O = acc / l once at the end, L = m + log l."""
    S, V = make_row_problem(rng, rows=6, n=n, d=5)
    assert_result(impl.finalize(run_blocks(impl, S, V, Bc)), S, V, "finalize")


def test_fully_masked_rows_give_zero_output_and_minus_inf_logsumexp(impl, rng):
    """Masked scores are -inf: no NaN anywhere; a row that sees no key at all has O = 0, L = -inf."""
    S, V = make_row_problem(rng, rows=6, n=8, d=3)
    S[:3, 5:] = -np.inf  # rows 0-2: the second block is entirely masked
    S[4:, :] = -np.inf  # rows 4-5: no visible key
    assert_result(impl.finalize(run_blocks(impl, S, V, Bc=5)), S, V, "masked rows")


def test_scores_of_a_thousand_do_not_overflow(impl, rng):
    """exp(1000) overflows float32 and float64: only ever exponentiate score - running max <= 0."""
    S, V = make_row_problem(rng, rows=5, n=9, d=3, scale=1000.0)
    assert_result(impl.finalize(run_blocks(impl, S, V, Bc=3)), S, V, "large scores")


def partials(impl, S, V, cuts):
    """(O_k, L_k) of each key range [cuts[k], cuts[k+1]) computed with the student's own state functions."""
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        out.append(impl.finalize(run_blocks(impl, S[:, a:b], V[a:b], Bc=3)))
    return out


def test_combining_split_kv_partials_equals_attention_over_all_keys(impl, rng):
    """FA2 section 4.2 (split-KV): partial (O_k, L_k) over disjoint key ranges combine exactly, in any order."""
    S, V = make_row_problem(rng, rows=6, n=17, d=4)
    parts = partials(impl, S, V, [0, 5, 6, 17])
    assert_result(impl.combine(parts), S, V, "combine of 3 splits")
    perm = np.r_[6:17, 5:6, 0:5]  # the same keys in the order of the reversed parts
    assert_result(impl.combine(parts[::-1]), S[:, perm], V[perm], "combine in reverse order")


def test_combine_skips_empty_splits_and_keeps_fully_masked_rows_empty(impl, rng):
    """A split in which a row sees no key (L_k = -inf) adds nothing; no key at all: O = 0, L = -inf."""
    S, V = make_row_problem(rng, rows=5, n=12, d=3)
    S[:2, 4:8] = -np.inf  # rows 0-1: the middle split is empty
    S[4, :] = -np.inf  # row 4: empty everywhere
    parts = partials(impl, S, V, [0, 4, 8, 12])
    assert_result(impl.combine(parts), S, V, "combine with empty splits")


def test_combine_of_large_logsumexps_does_not_overflow(impl, rng):
    """Partials with L_k around 1000: exp(L_k) overflows, exp(L_k - max L) does not."""
    S, V = make_row_problem(rng, rows=4, n=10, d=3, scale=1000.0)
    assert_result(impl.combine(partials(impl, S, V, [0, 3, 10])), S, V, "combine, large scores")


def test_online_attention_reads_each_block_once_and_keeps_only_the_current_one(impl, rng):
    """The IO budget of a streaming softmax: one pass over the blocks, O(1) blocks in memory.

    When block j is handed out, blocks j-2 and older must be garbage (only the previous block, still
    bound to the loop variables, may be alive).
    """
    S, V = make_row_problem(rng, rows=4, n=24, d=3)
    stream = grading.BlockStream(S, V, Bc=4)
    result = impl.online_attention(stream)
    assert not stream.problems, "; ".join(stream.problems)
    assert stream.handed == 6, f"every block must be consumed: {stream.handed} of 6 were requested"
    assert_result(result, S, V, "online_attention")
