"""Autograder for assignment 4 (FA1 Algorithm 4 backward, one head, NumPy). Test names are the claims.

The float64 reference is FA1 Algorithm 3 (:mod:`numba_flash_reference.alg3_backward`), which
materializes P; the yardstick of the error rule (mult 3, as for gradients in flash-attn's tests) is the
same standard backward computed in float32. The HBM budget is Theorem 5's count
(:func:`numba_flash_reference.io_model.io_alg4_backward`, with one logsumexp L in place of l and m),
checked per array name on :class:`numba_flash_reference.hbm.HBMArray` s. Memory is measured with
tracemalloc while the student's function runs.

Run: ``python -m pytest tutorials/assignments/a4_recompute_backward [--impl solution]``.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from numba_flash_reference.hbm import HBMCounter, hbm
from numba_flash_reference.io_model import io_alg4_backward

from .. import grading

f32 = np.float32


def problem(rng, N, d):
    """Float32 Q, K, V, dO, and the forward's O and L = m + log l (float64 oracle, rounded to float32)."""
    Q, K, V, dO = (rng.standard_normal((N, d)).astype(f32) for _ in range(4))
    tau = 1.0 / math.sqrt(d)
    O64, _, _, L64 = grading.attention64(Q, K, V, tau)
    return Q, K, V, dO, O64.astype(f32), L64.astype(f32), tau


def hbm_arguments(Q, K, V, dO, O, L, counter):
    """The student's HBM arguments (inputs, then outputs dQ = 0 and NaN-poisoned dK, dV) and the output arrays."""
    dQ, dK, dV = np.zeros(Q.shape, f32), grading.poisoned(K.shape), grading.poisoned(V.shape)
    names = "Q K V O dO L dQ dK dV".split()
    return [hbm(x, counter, name) for x, name in zip((Q, K, V, O, dO, L, dQ, dK, dV), names)], (dQ, dK, dV)


def run(impl, Q, K, V, dO, O, L, tau, Br, Bc, counter):
    """Call the student's function on HBM arrays; return (dQ, dK, dV)."""
    g, outputs = hbm_arguments(Q, K, V, dO, O, L, counter)
    impl.flash_backward(*g[:6], tau, Br, Bc, *g[6:])
    return outputs


@pytest.mark.parametrize(
    "N, d, Br, Bc",
    [(53, 7, 8, 16), (40, 4, 16, 8), (5, 3, 8, 8)],
    ids=["ragged-Br<Bc", "ragged-Br>Bc", "smaller-than-a-tile"],
)
def test_gradients_equal_standard_backward(impl, rng, N, d, Br, Bc):
    Q, K, V, dO, O, L, tau = problem(rng, N, d)
    got = run(impl, Q, K, V, dO, O, L, tau, Br, Bc, counter=HBMCounter())
    ref = grading.attention_backward64(Q, K, V, dO, tau)
    naive = grading.attention_backward_naive32(Q, K, V, dO, tau)
    for name, g, r, n in zip(("dQ", "dK", "dV"), got, ref, naive):
        grading.assert_error_rule(g, r, n, mult=3, what=name)


_COUNTED = {}


def counted_run(impl):
    """One run on counting HBM arrays (cached per implementation): N = 53, d = 7, Br = 8, Bc = 16 (Tc = 4)."""
    if id(impl) not in _COUNTED:
        N, d, Br, Bc = 53, 7, 8, 16
        Q, K, V, dO, O, L, tau = problem(np.random.default_rng(20224), N, d)
        counter = HBMCounter()
        got = run(impl, Q, K, V, dO, O, L, tau, Br, Bc, counter=counter)
        for name, g, r, n in zip(("dQ", "dK", "dV"), got, grading.attention_backward64(Q, K, V, dO, tau), grading.attention_backward_naive32(Q, K, V, dO, tau)):
            grading.assert_error_rule(g, r, n, mult=3, what=f"{name} (counted run)")
        _COUNTED[id(impl)] = (counter.by_name, io_alg4_backward(N, d, Br=Br, Bc=Bc).by_name, dict(N=N, d=d, Tc=math.ceil(N / Bc)))
    return _COUNTED[id(impl)]


def traffic(by_name, name):
    return by_name.get(name, (0, 0))


def test_K_and_V_are_read_once_and_dK_dV_written_once(impl):
    """Alg.4 L7 and L24: the K/V side moves through HBM exactly once (Theorem 5's 4 N d)."""
    counted, _, s = counted_run(impl)
    Nd = s["N"] * s["d"]
    for name, expected in (("K", (Nd, 0)), ("V", (Nd, 0)), ("dK", (0, Nd)), ("dV", (0, Nd))):
        assert traffic(counted, name) == expected, f"{name}: (reads, writes) = {traffic(counted, name)}, expected {expected}"


def test_row_side_traffic_is_at_most_Tc_passes(impl):
    """Alg.4 L10 and L21: Q, O, dO, dQ, L are loaded (and dQ stored) once per outer step, Tc passes in all."""
    counted, model, s = counted_run(impl)
    for name in ("Q", "O", "dO", "dQ"):
        budget = model[name]  # Tc N d reads (and Tc N d writes for dQ)
        r, w = traffic(counted, name)
        assert r <= budget[0] and w <= budget[1], f"{name}: (reads, writes) = {(r, w)}, budget {budget} (Tc = {s['Tc']})"
    r, w = traffic(counted, "L")
    assert r <= s["Tc"] * s["N"] and w == 0, f"L: (reads, writes) = {(r, w)}, budget ({s['Tc'] * s['N']}, 0)"


def test_no_N_by_N_array_is_ever_allocated(impl, rng):
    """O(N) extra memory (Theorem 5): at N = 1000 an N x N float32 array is 4 MB; the budget is a few dozen tiles."""
    N, d, Br, Bc = 1000, 8, 32, 32
    Q, K, V, dO, O, L, tau = problem(rng, N, d)
    g, (_, dK, _) = hbm_arguments(Q, K, V, dO, O, L, HBMCounter())  # HBM is allocated before measuring
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        impl.flash_backward(*g[:6], tau, Br, Bc, *g[6:])
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    budget = 32 * 8 * (Br * Bc + (Br + Bc) * d)  # 32 float64 tiles: S, P, dP, dS, Q_i, K_j, ... with room to spare
    assert peak <= budget, f"peak extra memory {peak / 1e3:.0f} KB > budget {budget / 1e3:.0f} KB (an N x N float32 array is {N * N * 4 / 1e6:.0f} MB)"
    assert np.all(np.isfinite(dK)), "dK has unwritten elements"
