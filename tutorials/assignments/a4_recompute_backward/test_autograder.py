"""Autograder for assignment 4 (FA1 Algorithm 4 backward kernel, one head, Numba). Test names are the claims.

Correctness runs on either backend: ``dQ, dK, dV`` against the float64 gradients of standard attention
(FA1 Algorithm 3), by the error rule with mult 3 (as for gradients in flash-attn's tests) and the
float32 standard backward as the yardstick. The forward's ``O, l, m`` are the float64 oracle's,
rounded to float32 (what assignment 3's kernel returns). The IO budget is Theorem 5's accounting
(Algorithm 4 lines 7, 10, 21, 24) made per element on :class:`grading.CountingArray` s (simulator).

Run: ``python -m pytest tutorials/assignments/a4_recompute_backward [--impl solution]``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from .. import grading

f32 = np.float32
NAMES = "Q K V O dO l m dQ dK dV".split()


def tiles(impl):
    BR, BC = impl.BR, impl.BC
    for name, b in (("BR", BR), ("BC", BC)):
        assert isinstance(b, int) and 2 <= b <= 64, f"{name} must be an int in [2, 64], got {b!r}"
    return BR, BC


def problem(rng, N, d):
    """Float32 Q, K, V, dO and the forward's O, l, m (float64 oracle rounded to float32)."""
    Q, K, V, dO = (rng.standard_normal((N, d)).astype(f32) for _ in range(4))
    tau = 1.0 / math.sqrt(d)
    O64, m64, l64, _ = grading.attention64(Q, K, V, tau)
    return dict(Q=Q, K=K, V=V, O=O64.astype(f32), dO=dO, l=l64.astype(f32), m=m64.astype(f32)), tau


def run(impl, p, tau, wrap=None):
    """Launch on NaN-poisoned dQ, dK, dV (optionally wrapping every array); return the arrays by name."""
    N, d = p["Q"].shape
    arrays = dict(p, dQ=grading.poisoned((N, d)), dK=grading.poisoned((N, d)), dV=grading.poisoned((N, d)))
    if wrap is not None:
        arrays = {k: wrap(v, k) for k, v in arrays.items()}
    a = arrays
    impl.flash_backward(a["Q"], a["K"], a["V"], a["O"], a["dO"], a["l"], a["m"], tau, a["dQ"], a["dK"], a["dV"])
    return arrays


def check_gradients(got, p, tau):
    ref = grading.attention_backward64(p["Q"], p["K"], p["V"], p["dO"], tau)
    naive = grading.attention_backward_naive32(p["Q"], p["K"], p["V"], p["dO"], tau)
    for name, g, r, n in zip(("dQ", "dK", "dV"), got, ref, naive):
        grading.assert_error_rule(g, r, n, mult=3, what=name)


@pytest.mark.parametrize("case", ["ragged", "smaller-than-a-tile", "one-tile-wide-head"])
def test_gradients_equal_standard_backward(impl, rng, case):
    BR, BC = tiles(impl)
    N, d = {"ragged": (2 * max(BR, BC) + 3, 5), "smaller-than-a-tile": (3, 7), "one-tile-wide-head": (BC + 1, 16)}[case]
    p, tau = problem(rng, N, d)
    a = run(impl, p, tau)
    check_gradients((a["dQ"], a["dK"], a["dV"]), p, tau)


_COUNTED = {}
_RACES = {}


def counted_launch(impl):
    """One launch on counting arrays, cached per implementation: N = 3 BC + 2 (Tc = 4), d = 5."""
    if not grading.simulator():
        pytest.skip("IO budgets are counted through the CUDA simulator")
    if id(impl) not in _COUNTED:
        BR, BC = tiles(impl)
        N, d = 3 * BC + 2, 5
        p, tau = problem(np.random.default_rng(20224), N, d)
        with grading.record_shared_memory() as smem, grading.shared_memory_races() as races:
            g = run(impl, p, tau, wrap=grading.CountingArray)
        _RACES[id(impl)] = list(races)
        check_gradients((g["dQ"].data, g["dK"].data, g["dV"].data), p, tau)
        _COUNTED[id(impl)] = (g, max(smem, default=0), dict(N=N, d=d, BR=BR, BC=BC, Tc=math.ceil(N / BC)))
    return _COUNTED[id(impl)]


@pytest.mark.simulator_only
def test_K_and_V_are_read_once_and_dK_dV_written_once(impl):
    """Alg.4 L7 and L24: the K/V side moves through HBM exactly once (Theorem 5's 4 N d)."""
    g, _, _ = counted_launch(impl)
    for name in "KV":
        a = g[name]
        assert np.all(a.reads == 1) and a.writes.sum() == 0, f"{a.describe()}; expected exactly 1 read each, no writes"
    for name in ("dK", "dV"):
        a = g[name]
        assert np.all(a.writes == 1) and a.reads.sum() == 0, (
            f"{a.describe()}; expected exactly 1 write each, no reads (accumulate in SRAM)"
        )


@pytest.mark.simulator_only
def test_row_side_inputs_are_read_at_most_Tc_times(impl):
    """Alg.4 L10: Q_i, O_i, dO_i, l_i, m_i are loaded once per outer step, Tc passes in all."""
    g, _, s = counted_launch(impl)
    for name in ("Q", "O", "dO", "l", "m"):
        a = g[name]
        assert a.reads.min() >= 1 and a.reads.max() <= s["Tc"], (
            f"{a.describe()}; budget Tc = {s['Tc']} reads per element"
        )
        assert a.writes.sum() == 0, f"{name} is an input: never write it"


@pytest.mark.simulator_only
def test_dQ_makes_at_most_Tc_round_trips_through_HBM(impl):
    """Alg.4 L5 and L21: dQ_i is read, updated and written back once per outer step (plus the zeroing)."""
    g, _, s = counted_launch(impl)
    a = g["dQ"]
    assert a.reads.max() <= s["Tc"], f"{a.describe()}; budget Tc = {s['Tc']} reads per element"
    assert a.writes.min() >= 1 and a.writes.max() <= s["Tc"] + 1, (
        f"{a.describe()}; budget Tc + 1 = {s['Tc'] + 1} writes per element"
    )
    assert a.atomics.sum() == 0, "one block owns the head: dQ needs no atomics here (FA2's backward does)"


@pytest.mark.simulator_only
def test_shared_memory_fits_the_tiles_of_alg4(impl):
    """SRAM: K_j, V_j, dK~_j, dV~_j (4 Bc d), Q_i, dO_i (2 Br d), P_ij, dS_ij (2 Br Bc), a few rows of statistics."""
    _, smem, s = counted_launch(impl)
    BR, BC, D = s["BR"], s["BC"], s["d"]
    budget = 4 * ((4 * BC + 2 * BR) * D + 2 * BR * BC + 8 * BR)
    assert 0 < smem <= budget, f"shared memory per block: {smem} bytes; budget {budget} bytes (BR={BR}, BC={BC}, D={D})"


@pytest.mark.simulator_only
def test_no_shared_memory_races(impl):
    """Every barrier where it must be: no two threads touch one shared element between the same two barriers.

    The counted launch runs with every shared array watched (:func:`grading.shared_memory_races`): a
    missing ``cuda.syncthreads()`` is caught even when the simulator's threads happen to run in a
    harmless order (on a GPU: ``compute-sanitizer --tool racecheck``).
    """
    counted_launch(impl)
    races = _RACES[id(impl)]
    assert not races, "shared-memory races (a barrier is missing or misplaced):\n" + "\n".join(races[:5])


def test_kernel_source_follows_the_house_rules(impl):
    """One cuda.shared.array per line, '# Sync:' on every barrier, barriers exist, paper tags present."""
    kernel = impl.make_kernel(4)
    problems = grading.kernel_source_problems(kernel)
    assert not problems, "\n".join(problems)
    assert grading.count_calls(kernel, "cuda.syncthreads") >= 2, (
        "K_j, V_j and the row tiles are shared by the block: they need barriers"
    )
    missing = grading.missing_tags(kernel, "Alg.4", (7, 10, 11, 13, 16, 17, 19, 20, 21, 22, 24))
    assert not missing, f"tag the lines where these steps start: {missing}"
