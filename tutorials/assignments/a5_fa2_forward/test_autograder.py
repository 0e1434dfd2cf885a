"""Autograder for assignment 5 (FA2 Algorithm 1 forward kernel, one head, causal option). Test names are the claims.

Correctness runs on either backend: ``O`` and the logsumexp ``L`` against the float64 oracle (standard
attention, with the causal mask where asked), by the error rule with float32 standard attention as the
yardstick. The IO budget is FA2's accounting (:func:`numba_flash_reference.io_model.io_fa2_forward`)
made per element on :class:`grading.CountingArray` s in the simulator, including causal block
skipping: row tile ``i`` (last row ``r``) needs key tiles ``0 .. floor(r / BC)`` only.

Run: ``python -m pytest tutorials/assignments/a5_fa2_forward [--impl solution]``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from .. import grading

f32 = np.float32


def tiles(impl):
    BR, BC = impl.BR, impl.BC
    for name, b in (("BR", BR), ("BC", BC)):
        assert isinstance(b, int) and 2 <= b <= 64, f"{name} must be an int in [2, 64], got {b!r}"
    return BR, BC


def qkv(rng, N, d):
    return tuple(rng.standard_normal((N, d)).astype(f32) for _ in range(3))


def run(impl, Q, K, V, tau, causal, wrap=None):
    N, d = Q.shape
    arrays = dict(Q=Q, K=K, V=V, O=grading.poisoned((N, d)), L=grading.poisoned(N))
    if wrap is not None:
        arrays = {k: wrap(v, k) for k, v in arrays.items()}
    a = arrays
    impl.flash2_forward(a["Q"], a["K"], a["V"], a["O"], a["L"], tau, causal)
    return arrays


def check_outputs(O, L, Q, K, V, tau, causal):
    visible = grading.causal_visible(Q.shape[0]) if causal else None
    O64, _, _, L64 = grading.attention_full64(Q, K, V, tau, visible)
    O32, _, _, L32 = grading.attention_full_naive32(Q, K, V, tau, visible)
    grading.assert_error_rule(O, O64, O32, what="O")
    grading.assert_error_rule(L, L64, L32, what="L (the logsumexp m + log l)")


@pytest.mark.parametrize("case", ["ragged", "smaller-than-a-tile", "one-tile-wide-head"])
def test_forward_equals_standard_attention(impl, rng, case):
    BR, BC = tiles(impl)
    N, d = {"ragged": (2 * max(BR, BC) + 3, 5), "smaller-than-a-tile": (3, 7), "one-tile-wide-head": (BC + 1, 16)}[case]
    Q, K, V = qkv(rng, N, d)
    tau = 1.0 / math.sqrt(d)
    a = run(impl, Q, K, V, tau, False)
    check_outputs(a["O"], a["L"], Q, K, V, tau, False)


@pytest.mark.parametrize("case", ["ragged", "tile-multiple"])
def test_causal_forward_equals_masked_attention(impl, rng, case):
    """Query r sees keys 0..r (FA2 section 3.1.1): row 0 sees one key, the diagonal tiles are masked inside."""
    BR, BC = tiles(impl)
    N = 2 * max(BR, BC) + 3 if case == "ragged" else 2 * BR * BC // math.gcd(BR, BC)
    Q, K, V = qkv(rng, N, 5)
    tau = 1.0 / math.sqrt(5)
    a = run(impl, Q, K, V, tau, True)
    check_outputs(a["O"], a["L"], Q, K, V, tau, True)


def test_large_scores_do_not_overflow(impl, rng):
    """Scores of several hundred, exact in float32: exp is only ever taken of (score - running max) <= 0."""
    BR, BC = tiles(impl)
    N, d = BC + 2, 3
    Q, K = (rng.integers(-4, 5, size=(N, d)).astype(f32) for _ in range(2))
    V = rng.standard_normal((N, d)).astype(f32)
    tau = 16.0
    a = run(impl, Q, K, V, tau, False)
    check_outputs(a["O"], a["L"], Q, K, V, tau, False)


_COUNTED = {}
_RACES = {}


def counted_launch(impl, causal):
    """One launch on counting arrays per (implementation, causal): N = 3 max(BR, BC) + 2, d = 5."""
    if not grading.simulator():
        pytest.skip("IO budgets are counted through the CUDA simulator")
    key = (id(impl), causal)
    if key not in _COUNTED:
        BR, BC = tiles(impl)
        N, d = 3 * max(BR, BC) + 2, 5
        Q, K, V = qkv(np.random.default_rng(20225), N, d)
        tau = 1.0 / math.sqrt(d)
        with grading.record_shared_memory() as smem, grading.shared_memory_races() as races:
            g = run(impl, Q, K, V, tau, causal, wrap=grading.CountingArray)
        _RACES[key] = list(races)
        check_outputs(g["O"].data, g["L"].data, Q, K, V, tau, causal)
        Tr = math.ceil(N / BR)
        # per key c: block skipping allows the row tiles whose last row reaches c's key tile ...
        last_rows = [min(N, (i + 1) * BR) - 1 for i in range(Tr)]
        allowed = np.array([sum(1 for r in last_rows if (c // BC) <= r // BC) for c in range(N)])
        # ... and correctness needs at least the row tiles that hold a row >= c
        needed = np.array([sum(1 for r in last_rows if r >= c) for c in range(N)])
        _COUNTED[key] = (g, max(smem, default=0), dict(N=N, d=d, BR=BR, BC=BC, Tr=Tr, allowed=allowed, needed=needed))
    return _COUNTED[key]


@pytest.mark.simulator_only
def test_each_Q_element_is_read_once_and_O_and_L_written_once(impl):
    """FA2.1 L4, L14, L15: Q_i is loaded once and O_i, L_i stored once; O never travels back (unlike FA1)."""
    g, _, _ = counted_launch(impl, causal=False)
    a = g["Q"]
    assert np.all(a.reads == 1) and a.writes.sum() == 0, f"{a.describe()}; expected exactly 1 read each, no writes"
    for name in "OL":
        a = g[name]
        assert np.all(a.writes == 1) and a.reads.sum() == 0, f"{a.describe()}; expected exactly 1 write each, no reads"


@pytest.mark.simulator_only
def test_each_K_and_V_element_is_read_exactly_Tr_times(impl):
    """FA2.1 L7: every query tile streams all of K and V: Tr cooperative loads per element, no more."""
    g, _, s = counted_launch(impl, causal=False)
    for name in "KV":
        a = g[name]
        assert np.all(a.reads == s["Tr"]) and a.writes.sum() == 0, (
            f"{a.describe()}; expected exactly Tr = {s['Tr']} reads each"
        )


@pytest.mark.simulator_only
def test_causal_launch_skips_the_tiles_above_the_diagonal(impl):
    """FA2 section 3.1.1: a key tile entirely above a query tile's last row is never loaded (about half of K, V)."""
    g, _, s = counted_launch(impl, causal=True)
    for name in "KV":
        a = g[name]
        per_key = a.reads.min(axis=1)  # the reads of key c's row (every element of a row is loaded together)
        assert np.all(a.reads.max(axis=1) == per_key), f"{a.describe()}; elements of one key row are read unequally"
        over = np.nonzero(per_key > s["allowed"])[0]
        assert over.size == 0, (
            f"{a.describe()}; key {over[0]} read {per_key[over[0]]} times, block skipping allows "
            f"{s['allowed'][over[0]]}"
        )
        under = np.nonzero(per_key < s["needed"])[0]
        assert under.size == 0, (
            f"{a.describe()}; key {under[0]} read {per_key[under[0]]} times, but {s['needed'][under[0]]} query tiles "
            "need it"
        )
    g0, _, _ = counted_launch(impl, causal=False)
    print(f"K reads: causal {int(g['K'].reads.sum())}, non-causal {int(g0['K'].reads.sum())}")


@pytest.mark.simulator_only
def test_shared_memory_fits_the_tiles_of_fa2(impl):
    """SRAM: K_j, V_j (2 Bc d), Q_i (Br d), S/P~ (Br Bc), and room for Br d more (e.g. an O_i tile) plus a few rows."""
    _, smem, s = counted_launch(impl, causal=False)
    BR, BC, D = s["BR"], s["BC"], s["d"]
    budget = 4 * ((2 * BC + 2 * BR) * D + BR * BC + 8 * BR)
    assert 0 < smem <= budget, f"shared memory per block: {smem} bytes; budget {budget} bytes (BR={BR}, BC={BC}, D={D})"


@pytest.mark.simulator_only
def test_no_shared_memory_races(impl):
    """Every barrier where it must be: no two threads touch one shared element between the same two barriers.

    The counted launch runs with every shared array watched (:func:`grading.shared_memory_races`): a
    missing ``cuda.syncthreads()`` is caught even when the simulator's threads happen to run in a
    harmless order (on a GPU: ``compute-sanitizer --tool racecheck``).
    """
    counted_launch(impl, causal=True)
    races = _RACES[(id(impl), True)]
    assert not races, "shared-memory races (a barrier is missing or misplaced):\n" + "\n".join(races[:5])


def test_kernel_source_follows_the_house_rules(impl):
    """One cuda.shared.array per line, '# Sync:' on every barrier, barriers exist, paper tags present."""
    kernel = impl.make_kernel(4)
    problems = grading.kernel_source_problems(kernel)
    assert not problems, "\n".join(problems)
    assert grading.count_calls(kernel, "cuda.syncthreads") >= 2, (
        "K_j and V_j are shared by the block: they need barriers"
    )
    missing = grading.missing_tags(kernel, "FA2.1", (4, 5, 7, 8, 9, 10, 12, 13, 14, 15))
    assert not missing, f"tag the lines where these steps start: {missing}"
