"""Autograder for assignment 9 (the bug hunt). Each test is the one that catches one kernel's bug.

The kernels are small and self-contained; the references are float64 computations here and the
yardsticks their float32 twins (error rule). The missing-barrier bug gives right values in the
simulator (its threads seldom interleave the way warps do), so that test runs the launch under
:func:`grading.shared_memory_races`, which flags two threads touching one shared element between the
same two barriers, whatever order they ran in. On a GPU, ``compute-sanitizer --tool racecheck`` does
the same job.

Run: ``python -m pytest tutorials/assignments/a9_bug_hunt [--impl solution]``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from .. import grading

f32 = np.float32
KERNELS = ("row_softmax", "split_k_decode", "causal_rows", "row_logsumexp", "attention_with_lse")


def softmax_rows(S, dtype):
    S = np.asarray(S, dtype)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def logsumexp_rows(S, dtype):
    S = np.asarray(S, dtype)
    m = S.max(axis=1)
    return m + np.log(np.exp(S - m[:, None]).sum(axis=1))


def test_row_softmax_is_exact_even_for_very_negative_rows(impl, rng):
    """FA1 Alg.1 L2: the running max starts at -inf. Rows of scores around -1000 must not underflow to 0/0."""
    S = (3 * rng.standard_normal((6, 13))).astype(f32)
    S[3:] -= f32(1000.0)  # rows 3-5: every score near -1000; exp(s - 0) underflows, exp(s - max) does not
    P = grading.poisoned(S.shape)
    impl.row_softmax(S, P)
    grading.assert_error_rule(P, softmax_rows(S, np.float64), softmax_rows(S, f32), what="P")


def test_split_k_decode_equals_attention(impl, rng):
    """FA2 Alg.1 L10 / FA1 Alg.1 L12: partial states at different maxima are rescaled to the common max before they
    add."""
    D = impl.D
    Q, K, V = (rng.standard_normal((n, D)).astype(f32) for n in (5, 37, 37))
    tau = 1.0
    O = grading.poisoned((5, D))
    impl.split_k_decode(Q, K, V, O, tau)
    grading.assert_error_rule(
        O, grading.attention64(Q, K, V, tau)[0], grading.attention_naive32(Q, K, V, tau)[0], what="O"
    )


def test_causal_rows_equal_masked_attention(impl, rng):
    """FA2 section 3.1.1: query r sees keys 0..r (its own key included); row 0 sees exactly one."""
    D = impl.D
    Q, K, V = (rng.standard_normal((11, D)).astype(f32) for _ in range(3))
    tau = 1.0 / math.sqrt(D)
    O = grading.poisoned((11, D))
    impl.causal_rows(Q, K, V, O, tau)
    vis = grading.causal_visible(11)
    grading.assert_error_rule(
        O,
        grading.attention_full64(Q, K, V, tau, vis)[0],
        grading.attention_full_naive32(Q, K, V, tau, vis)[0],
        what="O",
    )


@pytest.mark.simulator_only
def test_row_logsumexp_is_right_and_free_of_shared_memory_races(impl, rng):
    """Every step of a shared-memory tree reduction ends with a barrier: no two threads touch one element between
    barriers."""
    S = (3 * rng.standard_normal((4, 29))).astype(f32)
    L = grading.poisoned(4)
    with grading.shared_memory_races() as races:
        impl.row_logsumexp(S, L)
    assert not races, "shared-memory races (a barrier is missing):\n" + "\n".join(races[:5])
    grading.assert_error_rule(L, logsumexp_rows(S, np.float64), logsumexp_rows(S, f32), what="L")


def test_attention_with_lse_returns_the_logsumexp(impl, rng):
    """FA2 Alg.1 L13: L = m + log(l), the statistic the backward recomputes P from (P = exp(S - L))."""
    D = impl.D
    Q, K, V = (rng.standard_normal((7, D)).astype(f32) for _ in range(3))
    tau = 1.0 / math.sqrt(D)
    O, L = grading.poisoned((7, D)), grading.poisoned(7)
    impl.attention_with_lse(Q, K, V, O, L, tau)
    O64, _, _, L64 = grading.attention_full64(Q, K, V, tau)
    O32, _, _, L32 = grading.attention_full_naive32(Q, K, V, tau)
    grading.assert_error_rule(O, O64, O32, what="O")
    grading.assert_error_rule(L, L64, L32, what="L")


def test_every_bug_is_explained_in_findings(impl):
    """A fix without a diagnosis is half the job: one or two sentences per kernel (at least 60 characters)."""
    findings = getattr(impl, "FINDINGS", {})
    short = [k for k in KERNELS if len(str(findings.get(k, "")).strip()) < 60]
    assert not short, f"FINDINGS has no real explanation for: {short}"
