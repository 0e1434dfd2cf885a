"""Autograder for assignment 8 (attention dropout with a counter-based RNG, forward and backward). Test names are the
claims.

The student's keep bit is read back through their own device function (:func:`grading.keep_mask`: a
grader kernel calls ``dropout_keep(seed, row, col, threshold)`` for every element). The forward is then
checked against float64 attention with that mask (``Z = keep / (1 - p)`` on ``P`` before ``@ V``, the
statistics undropped: FA1 Alg.2 L13-L15), and the backward against the float64 gradients with the
SAME mask: a backward that does not regenerate the forward's mask fails. Statistical claims on the
mask use bounds of 5 standard deviations (a correct hash fails about once in 3 million runs).

Run: ``python -m pytest tutorials/assignments/a8_dropout [--impl solution]``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from .. import grading

f32 = np.float32
P_DROP = 0.3
SEED = 20228
MASK_N = 48  # the mask is sampled on MASK_N x MASK_N elements


def tiles(impl):
    BR, BC = impl.BR, impl.BC
    for name, b in (("BR", BR), ("BC", BC)):
        assert isinstance(b, int) and 2 <= b <= 64, f"{name} must be an int in [2, 64], got {b!r}"
    return BR, BC


def threshold(p):
    return int(math.floor(p * 4294967296.0))


_MASKS = {}


def mask(impl, seed, p=P_DROP, n=MASK_N):
    key = (id(impl), seed, p, n)
    if key not in _MASKS:
        _MASKS[key] = grading.keep_mask(impl.module.dropout_keep, seed, n, n, threshold(p), "a8_dropout: dropout_keep")
    return _MASKS[key]


def problem(rng, N, d):
    Q, K, V, dO = (rng.standard_normal((N, d)).astype(f32) for _ in range(4))
    return Q, K, V, dO, 1.0 / math.sqrt(d)


def forward(impl, Q, K, V, tau, p, seed, wrap=None):
    N, d = Q.shape
    arrays = dict(Q=Q, K=K, V=V, O=grading.poisoned((N, d)), L=grading.poisoned(N))
    if wrap is not None:
        arrays = {k: wrap(v, k) for k, v in arrays.items()}
    a = arrays
    impl.dropout_forward(a["Q"], a["K"], a["V"], a["O"], a["L"], tau, p, seed)
    return arrays


def backward(impl, Q, K, V, O, dO, L, tau, p, seed):
    N, d = Q.shape
    D, dQ, dK, dV = grading.poisoned(N), grading.poisoned((N, d)), grading.poisoned((N, d)), grading.poisoned((N, d))
    impl.dropout_backward(Q, K, V, O, dO, L, tau, p, seed, D, dQ, dK, dV)
    return dQ, dK, dV


def check_forward(O, L, Q, K, V, tau, Z):
    O64, _, _, L64 = grading.attention_full64(Q, K, V, tau, None, Z)
    O32, _, _, L32 = grading.attention_full_naive32(Q, K, V, tau, None, Z)
    grading.assert_error_rule(O, O64, O32, what="O (dropout on P before P V)")
    grading.assert_error_rule(L, L64, L32, what="L (from the undropped statistics)")


def check_backward(grads, Q, K, V, dO, tau, Z):
    ref = grading.attention_backward_full64(Q, K, V, dO, tau, None, Z)
    naive = grading.attention_backward_full_naive32(Q, K, V, dO, tau, None, Z)
    for name, g, r, n in zip(("dQ", "dK", "dV"), grads, ref, naive):
        grading.assert_error_rule(g, r, n, mult=3, what=f"{name} (with the forward's mask)")


def test_keep_rate_is_one_minus_p(impl):
    """Each element is kept with probability 1 - p: the kept fraction of 48 x 48 elements is within 5 sigma."""
    for p in (P_DROP, 0.75):
        keep = mask(impl, SEED, p)
        n = keep.size
        sigma = math.sqrt(n * p * (1 - p))
        kept = int(keep.sum())
        assert abs(kept - n * (1 - p)) <= 5 * sigma, (
            f"p = {p}: kept {kept} of {n}, expected {n * (1 - p):.0f} +- {5 * sigma:.0f}"
        )


def test_mask_depends_on_the_seed_and_has_no_row_or_column_pattern(impl):
    """Two seeds, two neighbouring rows, two neighbouring columns: each pair agrees as often as independent bits
    would."""
    a, b = mask(impl, SEED), mask(impl, SEED + 1)
    q = 1 - P_DROP
    expected = q * q + P_DROP * P_DROP  # P(two independent bits agree)
    for what, x, y in (
        ("seeds s and s + 1", a, b),
        ("rows r and r + 1", a[:-1], a[1:]),
        ("columns c and c + 1", a[:, :-1], a[:, 1:]),
        ("rows r and r + 2", a[:-2], a[2:]),
    ):
        n = x.size
        agree = int((x == y).sum())
        sigma = math.sqrt(n * expected * (1 - expected))
        assert abs(agree - n * expected) <= 5 * sigma, (
            f"{what}: the masks agree on {agree} of {n} elements, independent bits would on {n * expected:.0f} +- "
            f"{5 * sigma:.0f}"
        )


def test_p_zero_is_attention_without_dropout(impl, rng):
    BR, BC = tiles(impl)
    Q, K, V, dO, tau = problem(rng, 2 * max(BR, BC) + 3, 5)
    a = forward(impl, Q, K, V, tau, 0.0, SEED)
    check_forward(a["O"], a["L"], Q, K, V, tau, None)
    check_backward(backward(impl, Q, K, V, a["O"], dO, a["L"], tau, 0.0, SEED), Q, K, V, dO, tau, None)


@pytest.mark.parametrize("case", ["ragged", "smaller-than-a-tile"])
def test_forward_applies_the_mask_of_the_counter_hash(impl, rng, case):
    """Alg.2 L13-L15: l from the undropped P~, O from P~ o Z with Z = hash(seed, row, col) >= threshold, / (1 - p)."""
    BR, BC = tiles(impl)
    N = 2 * max(BR, BC) + 3 if case == "ragged" else 3
    Q, K, V, dO, tau = problem(rng, N, 5)
    Z = mask(impl, SEED)[:N, :N] / (1 - P_DROP)
    a = forward(impl, Q, K, V, tau, P_DROP, SEED)
    check_forward(a["O"], a["L"], Q, K, V, tau, Z)


def test_backward_regenerates_the_forward_mask(impl, rng):
    """Alg.4 L1, L14-L18: the gradients are those of the forward's dropped attention: same seed, same mask, never
    stored."""
    BR, BC = tiles(impl)
    N = 2 * max(BR, BC) + 3
    Q, K, V, dO, tau = problem(rng, N, 5)
    Z = mask(impl, SEED)[:N, :N] / (1 - P_DROP)
    a = forward(impl, Q, K, V, tau, P_DROP, SEED)
    check_forward(a["O"], a["L"], Q, K, V, tau, Z)
    check_backward(backward(impl, Q, K, V, a["O"], dO, a["L"], tau, P_DROP, SEED), Q, K, V, dO, tau, Z)


@pytest.mark.simulator_only
def test_dropout_adds_no_hbm_traffic_to_the_forward(impl):
    """The mask is computed on chip from (seed, row, col): Q once, K and V Tr times, O and L once, as without
    dropout."""
    BR, BC = tiles(impl)
    N, d = 2 * max(BR, BC) + 3, 4
    Q, K, V, _, tau = problem(np.random.default_rng(20228), N, d)
    g = forward(impl, Q, K, V, tau, P_DROP, SEED, wrap=grading.CountingArray)
    Tr = math.ceil(N / BR)
    checks = (("Q", 1, 0), ("K", Tr, 0), ("V", Tr, 0), ("O", 0, 1), ("L", 0, 1))
    for name, reads, writes in checks:
        a = g[name]
        assert np.all(a.reads == reads) and np.all(a.writes == writes), (
            f"{a.describe()}; expected {reads} reads and {writes} writes per element"
        )
    check_forward(g["O"].data, g["L"].data, Q, K, V, tau, mask(impl, SEED)[:N, :N] / (1 - P_DROP))


def test_kernel_source_follows_the_house_rules(impl):
    fwd, bwd = impl.make_forward(4), impl.make_backward(4)
    for kernel, tag in ((fwd, "Alg.2"), (bwd, "Alg.4")):
        problems = grading.kernel_source_problems(kernel)
        assert not problems, "\n".join(problems)
        assert grading.count_calls(kernel, "cuda.syncthreads") >= 2, "shared tiles need barriers"
        missing = grading.missing_tags(kernel, tag, (14,))
        assert not missing, f"tag the line where the dropout mask is applied: {missing}"
