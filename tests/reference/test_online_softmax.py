"""The online-softmax merge identity (FA1 section 3.1) is exact: merging block summaries gives the softmax
of the whole row, in any grouping.

Tolerance: every quantity is a float64 sum of at most a few dozen terms of size <= 1 (after the max
is subtracted), each rounded once or twice; its error is a few tens of ulps, ~1e-14 relative. The
bound used, 1e-12 relative to the largest magnitude, is two orders above that and ten orders below
what a wrong merge (a missing rescale, the wrong max) produces.
"""

from numba_flash_reference.online_softmax import (
    identity_state,
    merge,
    merge_states,
    rescale,
    softmax_state,
    softmax_stats,
)

import numpy as np
import pytest

RTOL = 1e-12


def assert_close(a, b, what=""):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert not np.isnan(a).any(), f"{what}: NaN"
    np.testing.assert_array_equal(np.isinf(a), np.isinf(b), err_msg=f"{what}: -inf pattern differs")
    fin = np.isfinite(b)
    scale = max(1.0, float(np.max(np.abs(b[fin]))) if fin.any() else 1.0)
    np.testing.assert_allclose(a[fin], b[fin], rtol=0, atol=RTOL * scale, err_msg=what)


def direct_state(x, V):
    """softmax(x) V, max and sum computed in one go (the definition)."""
    m = x.max(axis=1)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    f = np.exp(x - m_safe[:, None])
    l = f.sum(axis=1)
    o = (f @ V) / np.where(l > 0, l, 1.0)[:, None]
    return m, l, o


def scores_with_masked_entries(rng, rows, n):
    """Random scores with -inf entries, one fully masked row and one row masked except its last column."""
    x = 3.0 * rng.standard_normal((rows, n))
    x[rng.random((rows, n)) < 0.3] = -np.inf
    x[0, :] = -np.inf
    x[1, :-1] = -np.inf
    return x


@pytest.mark.parametrize("normalized", [True, False])
def test_online_softmax_merge_is_exact(rng, normalized):
    rows, n, d = 6, 23, 5
    x = scores_with_masked_entries(rng, rows, n)
    V = rng.standard_normal((n, d))
    m_ref, l_ref, o_ref = direct_state(x, V)
    for k in range(n + 1):  # every split point, including empty parts (k = 0 and k = n)
        s1, s2 = softmax_state(x[:, :k], V[:k]), softmax_state(x[:, k:], V[k:])
        if not normalized:  # FA2's convention: o_tilde = exp(x - m) V = l * o
            s1 = s1._replace(o=s1.l[:, None] * s1.o)
            s2 = s2._replace(o=s2.l[:, None] * s2.o)
        s = merge(s1.m, s1.l, s2.m, s2.l, s1.o, s2.o, normalized=normalized)
        o = s.o if normalized else s.o / np.where(s.l > 0, s.l, 1.0)[:, None]
        assert_close(s.m, m_ref, f"m, split at {k}")
        assert_close(s.l, l_ref, f"l, split at {k}")
        assert_close(o, o_ref, f"o, split at {k}")
    # the fully masked row is the identity state: m = -inf, l = 0, o = 0
    assert s.m[0] == -np.inf and s.l[0] == 0.0 and np.all(o[0] == 0.0)


def test_merge_is_associative_and_commutative(rng):
    rows, n, d = 5, 30, 4
    x = scores_with_masked_entries(rng, rows, n)
    V = rng.standard_normal((n, d))
    for _ in range(20):
        a, b = sorted(rng.choice(np.arange(n + 1), size=2, replace=False))
        parts = [softmax_state(x[:, s], V[s]) for s in (slice(0, a), slice(a, b), slice(b, n))]
        left = merge_states(merge_states(parts[0], parts[1]), parts[2])
        right = merge_states(parts[0], merge_states(parts[1], parts[2]))
        swapped = merge_states(parts[2], merge_states(parts[1], parts[0]))
        for got in (right, swapped):
            assert_close(got.m, left.m, "m")
            assert_close(got.l, left.l, "l")
            assert_close(got.o, left.o, "o")
        assert_close(left.o, direct_state(x, V)[2], "o vs direct")


def test_block_by_block_accumulation_equals_softmax(rng):
    """Folding columns in one block at a time (what Algorithm 1 does per row) gives softmax(x) V."""
    rows, n, d = 4, 37, 3
    x = 5.0 * rng.standard_normal((rows, n))  # a wide range, so the running max changes often
    V = rng.standard_normal((n, d))
    for block in (1, 2, 5, 8, n):
        state = identity_state(rows, d)
        for s in range(0, n, block):
            state = merge_states(state, softmax_state(x[:, s : s + block], V[s : s + block]))
        m_ref, l_ref, o_ref = direct_state(x, V)
        assert_close(state.o, o_ref, f"block {block}")
        assert_close(state.l, l_ref, f"block {block}")


def test_stats_of_masked_and_empty_rows_are_the_identity():
    m, l = softmax_stats(np.full((2, 4), -np.inf))
    assert np.all(m == -np.inf) and np.all(l == 0.0)
    m, l = softmax_stats(np.zeros((3, 0)))
    assert m.shape == (3,) and np.all(m == -np.inf) and np.all(l == 0.0)


def test_rescale_is_at_most_one_and_never_nan():
    m_old = np.array([-np.inf, -np.inf, -1.0, 2.0])
    m_new = np.array([-np.inf, 0.5, 3.0, 2.0])
    a = rescale(m_old, m_new)
    assert not np.isnan(a).any()
    np.testing.assert_array_equal(a[:2], [0.0, 0.0])
    np.testing.assert_allclose(a[2:], [np.exp(-4.0), 1.0], rtol=1e-15)
    assert np.all(a <= 1.0)
