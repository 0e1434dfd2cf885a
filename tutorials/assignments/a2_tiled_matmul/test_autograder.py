"""Autograder for assignment 2 (tiled matmul in Numba CUDA). Each test name is the claim it grades.

Correctness runs on either backend. The IO and SRAM budgets are counted in Numba's CUDA simulator:
A, B and C are :class:`grading.CountingArray` s, so every global-memory element the kernel loads or
stores is counted (one launch, shared by those tests). Shapes are ragged multiples of the student's
``TILE`` so that edge handling is always exercised.

Run: ``python -m pytest tutorials/assignments/a2_tiled_matmul [--impl solution]``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from .. import grading

f32 = np.float32


def inputs(rng, m, k, n):
    return rng.standard_normal((m, k)).astype(f32), rng.standard_normal((k, n)).astype(f32)


def check_tile(impl):
    T = impl.TILE
    assert isinstance(T, int) and T >= 4 and T * T <= 1024, (
        f"TILE must be an int with 4 <= TILE and TILE^2 <= 1024, got {T!r}"
    )
    return T


@pytest.mark.parametrize("shape", [(3, 5, 2), (13, 21, 10)], ids=["smaller-than-a-tile", "ragged"])
def test_matmul_equals_float64_product(impl, rng, shape):
    m, k, n = shape
    A, B = inputs(rng, m, k, n)
    C = grading.poisoned((m, n))
    impl.matmul(A, B, C)
    grading.assert_error_rule(C, A.astype(np.float64) @ B, grading.matmul_naive32(A, B), what="C")


_COUNTED = {}
_RACES = {}


def counted_launch(impl):
    """One launch on counting arrays (cached per implementation): shapes 2T+3 x 2T+5 x 3T+3."""
    if not grading.simulator():
        pytest.skip("IO budgets are counted through the CUDA simulator")
    if id(impl) not in _COUNTED:
        T = check_tile(impl)
        m, k, n = 2 * T + 3, 2 * T + 5, 3 * T + 3
        A, B = inputs(np.random.default_rng(20221), m, k, n)
        gA, gB, gC = (
            grading.CountingArray(A, "A"),
            grading.CountingArray(B, "B"),
            grading.CountingArray(grading.poisoned((m, n)), "C"),
        )
        with grading.record_shared_memory() as smem, grading.shared_memory_races() as races:
            impl.matmul(gA, gB, gC)
        _RACES[id(impl)] = list(races)
        grading.assert_error_rule(
            gC.data, A.astype(np.float64) @ B, grading.matmul_naive32(A, B), what="C (counted launch)"
        )
        _COUNTED[id(impl)] = (gA, gB, gC, max(smem, default=0), (m, k, n, T))
    return _COUNTED[id(impl)]


@pytest.mark.simulator_only
def test_each_element_of_A_is_read_at_most_ceil_n_over_TILE_times(impl):
    gA, _, _, _, (m, k, n, T) = counted_launch(impl)
    budget = math.ceil(n / T)  # one read per block column of the grid; the naive kernel needs n
    assert gA.reads.min() >= 1, "some element of A is never read"
    assert gA.reads.max() <= budget, f"{gA.describe()}; budget {budget} (= ceil(n / TILE)) per element"
    assert gA.writes.sum() == 0, "A is an input: never write it"


@pytest.mark.simulator_only
def test_each_element_of_B_is_read_at_most_ceil_m_over_TILE_times(impl):
    _, gB, _, _, (m, k, n, T) = counted_launch(impl)
    budget = math.ceil(m / T)  # one read per block row of the grid; the naive kernel needs m
    assert gB.reads.min() >= 1, "some element of B is never read"
    assert gB.reads.max() <= budget, f"{gB.describe()}; budget {budget} (= ceil(m / TILE)) per element"
    assert gB.writes.sum() == 0, "B is an input: never write it"


@pytest.mark.simulator_only
def test_each_element_of_C_is_written_exactly_once_and_never_read(impl):
    _, _, gC, _, _ = counted_launch(impl)
    assert np.all(gC.writes == 1) and gC.reads.sum() == 0, f"{gC.describe()}; expected exactly one write each, no reads"


@pytest.mark.simulator_only
def test_shared_memory_holds_two_tiles_at_most(impl):
    _, _, _, smem, (_, _, _, T) = counted_launch(impl)
    budget = 2 * T * T * 4  # sA and sB, float32
    assert 0 < smem <= budget, (
        f"shared memory per block: {smem} bytes; budget: two TILE x TILE float32 tiles = {budget} bytes"
    )


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
    """One cuda.shared.array per line, every barrier commented with '# Sync:', and barriers exist."""
    problems = grading.kernel_source_problems(impl.matmul_kernel)
    assert not problems, "\n".join(problems)
    assert grading.count_calls(impl.matmul_kernel, "cuda.syncthreads") >= 1, (
        "tiles shared by a block need cuda.syncthreads()"
    )
    assert grading.count_calls(impl.matmul_kernel, "cuda.shared.array") >= 1, "stage the tiles in cuda.shared.array"
