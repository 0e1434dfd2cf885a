"""Autograder for assignment 6 (FA2 Algorithm 2 backward kernels, atomic and deterministic). Test names are the claims.

Correctness runs on either backend: ``dQ, dK, dV`` against the float64 gradients of standard attention
by the error rule with mult 3 (flash-attn's rule for gradients: the kernel's error against float64 is
at most 3 times that of a naive float32 backward), and ``D`` by the rule with mult 2. The forward's
``O`` and ``L`` are the float64 oracle's, rounded to float32. The IO budget is FA2.2's accounting
(:func:`numba_flash_reference.io_model.io_fa2_backward`) made per element on counting arrays in the
simulator, with atomics counted apart from plain reads and writes.

Run: ``python -m pytest tutorials/assignments/a6_fa2_backward [--impl solution]``.
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


def problem(rng, N, d):
    Q, K, V, dO = (rng.standard_normal((N, d)).astype(f32) for _ in range(4))
    tau = 1.0 / math.sqrt(d)
    O64, _, _, L64 = grading.attention64(Q, K, V, tau)
    return dict(Q=Q, K=K, V=V, O=O64.astype(f32), dO=dO, L=L64.astype(f32)), tau


def run(impl, p, tau, deterministic, wrap=None):
    N, d = p["Q"].shape
    BR, BC = tiles(impl)
    arrays = dict(
        p, D=grading.poisoned(N), dQ=grading.poisoned((N, d)), dK=grading.poisoned((N, d)), dV=grading.poisoned((N, d))
    )
    if deterministic:
        arrays["dQ_partial"] = grading.poisoned((math.ceil(N / BC), N, d))
    if wrap is not None:
        arrays = {k: wrap(v, k) for k, v in arrays.items()}
    a = arrays
    impl.flash2_backward(
        a["Q"], a["K"], a["V"], a["O"], a["dO"], a["L"], tau, a["D"], a["dQ"], a["dK"], a["dV"], a.get("dQ_partial")
    )
    return arrays


def check(a, p, tau):
    def data(x):
        return getattr(x, "data", x)

    D64 = np.sum(p["dO"].astype(np.float64) * p["O"], axis=1)
    D32 = np.sum(p["dO"] * p["O"], axis=1, dtype=f32)
    grading.assert_error_rule(data(a["D"]), D64, D32, what="D = rowsum(dO o O)")
    ref = grading.attention_backward64(p["Q"], p["K"], p["V"], p["dO"], tau)
    naive = grading.attention_backward_naive32(p["Q"], p["K"], p["V"], p["dO"], tau)
    for name, r, n in zip(("dQ", "dK", "dV"), ref, naive):
        grading.assert_error_rule(data(a[name]), r, n, mult=3, what=name)


@pytest.mark.parametrize("variant", ["atomic", "deterministic"])
@pytest.mark.parametrize("case", ["ragged", "smaller-than-a-tile"])
def test_gradients_are_within_three_times_the_float32_error(impl, rng, case, variant):
    BR, BC = tiles(impl)
    N, d = {"ragged": (2 * max(BR, BC) + 3, 5), "smaller-than-a-tile": (3, 7)}[case]
    p, tau = problem(rng, N, d)
    check(run(impl, p, tau, variant == "deterministic"), p, tau)


def test_gradients_of_a_one_tile_wide_head(impl, rng):
    BR, BC = tiles(impl)
    p, tau = problem(rng, BC + 1, 16)
    check(run(impl, p, tau, False), p, tau)


_COUNTED = {}
_RACES = {}


def counted_launch(impl, deterministic):
    """One launch on counting arrays per (implementation, variant): N = 3 max(BR, BC) + 2, d = 5."""
    if not grading.simulator():
        pytest.skip("IO budgets are counted through the CUDA simulator")
    key = (id(impl), deterministic)
    if key not in _COUNTED:
        BR, BC = tiles(impl)
        N, d = 3 * max(BR, BC) + 2, 5
        p, tau = problem(np.random.default_rng(20226), N, d)
        with grading.record_shared_memory() as smem, grading.shared_memory_races() as races:
            g = run(impl, p, tau, deterministic, wrap=grading.CountingArray)
        _RACES[key] = list(races)
        check(g, p, tau)
        _COUNTED[key] = (
            g,
            max(smem, default=0),
            dict(N=N, d=d, BR=BR, BC=BC, Tc=math.ceil(N / BC), Tr=math.ceil(N / BR)),
        )
    return _COUNTED[key]


def exactly(a, reads=0, writes=0, atomics=0):
    ok = np.all(a.reads == reads) and np.all(a.writes == writes) and np.all(a.atomics == atomics)
    assert ok, f"{a.describe()}; expected exactly {reads} reads, {writes} writes, {atomics} atomics per element"


@pytest.mark.simulator_only
def test_D_is_a_prepass_over_O_and_dO(impl):
    """FA2.2 L4: O is read exactly once in all (only by the pre-pass); D written once, then read Tc times."""
    g, _, s = counted_launch(impl, deterministic=False)
    exactly(g["O"], reads=1)
    exactly(g["D"], reads=s["Tc"], writes=1)


@pytest.mark.simulator_only
def test_K_V_are_read_once_and_dK_dV_written_once(impl):
    """FA2.2 L6 and L18: one thread block per column block j owns K_j, V_j, dK_j, dV_j."""
    g, _, _ = counted_launch(impl, deterministic=False)
    exactly(g["K"], reads=1)
    exactly(g["V"], reads=1)
    exactly(g["dK"], writes=1)
    exactly(g["dV"], writes=1)


@pytest.mark.simulator_only
def test_Q_dO_L_are_read_once_per_column_block(impl):
    """FA2.2 L9: every column block streams every query tile: Tc reads per element (dO: Tc + 1 with the pre-pass)."""
    g, _, s = counted_launch(impl, deterministic=False)
    exactly(g["Q"], reads=s["Tc"])
    exactly(g["L"], reads=s["Tc"])
    exactly(g["dO"], reads=s["Tc"] + 1)


@pytest.mark.simulator_only
def test_atomic_variant_adds_into_dQ_once_per_column_block(impl):
    """FA2.2 L15 with atomics: each dQ element receives exactly Tc atomic adds, and is never read or written otherwise
    (but zeroed once)."""
    g, _, s = counted_launch(impl, deterministic=False)
    a = g["dQ"]
    assert np.all(a.atomics == s["Tc"]) and a.reads.sum() == 0 and np.all(a.writes <= 1), (
        f"{a.describe()}; expected Tc = {s['Tc']} atomic adds per element, no reads, at most 1 write (dQ = 0)"
    )


@pytest.mark.simulator_only
def test_deterministic_variant_uses_no_atomics_and_sums_partials_once(impl):
    """Deterministic: block j stores its dQ_i contributions in its own slice of dQ_partial (no atomics), and a
    reduction reads each partial once and writes dQ once, in a fixed order."""
    g, _, s = counted_launch(impl, deterministic=True)
    atomics = {name: int(a.atomics.sum()) for name, a in g.items() if a.atomics.sum()}
    assert not atomics, f"the deterministic variant uses atomics: {atomics}"
    exactly(g["dQ_partial"], reads=1, writes=1)
    exactly(g["dQ"], writes=1)


@pytest.mark.simulator_only
def test_shared_memory_fits_the_tiles_of_fa2_backward(impl):
    """SRAM: K_j, V_j (2 Bc d), Q_i, dO_i (2 Br d), dS (Br Bc), a few rows of statistics."""
    _, smem, s = counted_launch(impl, deterministic=False)
    BR, BC, D = s["BR"], s["BC"], s["d"]
    budget = 4 * ((2 * BC + 2 * BR) * D + BR * BC + 8 * (BR + BC))
    assert 0 < smem <= budget, f"shared memory per block: {smem} bytes; budget {budget} bytes (BR={BR}, BC={BC}, D={D})"


@pytest.mark.simulator_only
def test_no_shared_memory_races(impl):
    """Every barrier where it must be: no two threads touch one shared element between the same two barriers.

    The counted launch runs with every shared array watched (:func:`grading.shared_memory_races`): a
    missing ``cuda.syncthreads()`` is caught even when the simulator's threads happen to run in a
    harmless order (on a GPU: ``compute-sanitizer --tool racecheck``).
    """
    counted_launch(impl, deterministic=False)
    races = _RACES[(id(impl), False)]
    assert not races, "shared-memory races (a barrier is missing or misplaced):\n" + "\n".join(races[:5])


def test_kernel_source_follows_the_house_rules(impl):
    """One cuda.shared.array per line, '# Sync:' on every barrier, barriers exist, paper tags present."""
    for deterministic in (False, True):
        kernel = impl.make_kernel(4, deterministic)
        problems = grading.kernel_source_problems(kernel)
        assert not problems, "\n".join(problems)
        assert grading.count_calls(kernel, "cuda.syncthreads") >= 2, (
            "the tiles are shared by the block: they need barriers"
        )
        missing = grading.missing_tags(kernel, "FA2.2", (6, 9, 10, 11, 12, 13, 14, 15, 16, 18))
        assert not missing, f"tag the lines where these steps start: {missing}"
