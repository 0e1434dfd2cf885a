"""Autograder for assignment 7 (block-sparse FlashAttention forward, FA1 Algorithm 5). Test names are the claims.

Correctness runs on either backend: ``O, l, m`` against the float64 oracle with the element mask
``visible[r, c] = M[r // BR, c // BC] != 0`` (rows with no visible key: ``O = 0, l = 0, m = -inf``).
The IO budget is Proposition 4's, per element (:func:`numba_flash_reference.io_model.io_alg5_block_sparse`):
the row side (Q, O, l, m) is paid only for non-zero tiles, so the traffic scales with the fraction of
non-zero blocks; K and V are read at most once.

Run: ``python -m pytest tutorials/assignments/a7_block_sparse [--impl solution]``.
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


def block_mask(rng, Tr, Tc, density):
    """A random 0/1 mask (int32) with the last row block and column block 1 empty, the rest at ``density``."""
    M = (rng.random((Tr, Tc)) < density).astype(np.int32)
    M[min(1, Tr - 1), 0] = 1  # at least one tile
    M[Tr - 1, :] = 0  # a query tile that sees nothing: O = 0, l = 0, m = -inf
    if Tc > 1:
        M[:, 1] = 0  # a key tile no query sees
    return M


def visible_of(M, N, BR, BC):
    return M[np.arange(N)[:, None] // BR, np.arange(N)[None, :] // BC] != 0


def run(impl, Q, K, V, M, tau, wrap=None):
    N, d = Q.shape
    arrays = dict(Q=Q, K=K, V=V, O=grading.poisoned((N, d)), l=grading.poisoned(N), m=grading.poisoned(N))
    if wrap is not None:
        arrays = {k: wrap(v, k) for k, v in arrays.items()}
    a = arrays
    impl.block_sparse_forward(a["Q"], a["K"], a["V"], M, a["O"], a["l"], a["m"], tau)
    return arrays


def check(O, l, m, Q, K, V, M, tau, BR, BC):
    vis = visible_of(M, Q.shape[0], BR, BC)
    O64, m64, l64, _ = grading.attention_full64(Q, K, V, tau, vis)
    O32, m32, l32, _ = grading.attention_full_naive32(Q, K, V, tau, vis)
    grading.assert_error_rule(O, O64, O32, what="O")
    grading.assert_error_rule(m, m64, m32, what="m (-inf for rows that see no tile)")
    grading.assert_error_rule(l, l64, l32, what="l (0 for rows that see no tile)")


@pytest.mark.parametrize("density", [0.5, 1.0], ids=["half", "dense"])
def test_forward_equals_attention_with_the_expanded_block_mask(impl, rng, density):
    BR, BC = tiles(impl)
    N, d = 3 * max(BR, BC) + 3, 5
    Tr, Tc = math.ceil(N / BR), math.ceil(N / BC)
    M = np.ones((Tr, Tc), np.int32) if density == 1.0 else block_mask(rng, Tr, Tc, density)
    Q, K, V = (rng.standard_normal((N, d)).astype(f32) for _ in range(3))
    tau = 1.0 / math.sqrt(d)
    a = run(impl, Q, K, V, M, tau)
    check(a["O"], a["l"], a["m"], Q, K, V, M, tau, BR, BC)


def test_query_tiles_with_no_nonzero_block_output_zero(impl, rng):
    """A row that sees no key: O = 0, l = 0, m = -inf (Alg.5 L2's values, untouched), never NaN."""
    BR, BC = tiles(impl)
    N, d = 2 * max(BR, BC) + 1, 3
    Tr, Tc = math.ceil(N / BR), math.ceil(N / BC)
    M = np.zeros((Tr, Tc), np.int32)
    M[0, Tc - 1] = 1
    Q, K, V = (rng.standard_normal((N, d)).astype(f32) for _ in range(3))
    a = run(impl, Q, K, V, M, 0.5)
    check(a["O"], a["l"], a["m"], Q, K, V, M, 0.5, BR, BC)


_COUNTED = {}
_RACES = {}


def counted_launch(impl, density):
    """One launch on counting arrays per (implementation, density): N = 4 max(BR, BC) + 2, d = 4."""
    if not grading.simulator():
        pytest.skip("IO budgets are counted through the CUDA simulator")
    key = (id(impl), density)
    if key not in _COUNTED:
        BR, BC = tiles(impl)
        N, d = 4 * max(BR, BC) + 2, 4
        Tr, Tc = math.ceil(N / BR), math.ceil(N / BC)
        rng = np.random.default_rng(20227)
        M = np.ones((Tr, Tc), np.int32) if density == 1.0 else block_mask(rng, Tr, Tc, density)
        Q, K, V = (rng.standard_normal((N, d)).astype(f32) for _ in range(3))
        with grading.record_shared_memory() as smem, grading.shared_memory_races() as races:
            g = run(impl, Q, K, V, M, 0.5, wrap=grading.CountingArray)
        _RACES[key] = list(races)
        check(g["O"].data, g["l"].data, g["m"].data, Q, K, V, M, 0.5, BR, BC)
        nnz_row = np.repeat((M != 0).sum(axis=1), BR)[:N]  # non-zero tiles in each row's query tile
        col_used = np.repeat((M != 0).any(axis=0), BC)[:N]  # key rows whose tile column is used
        _COUNTED[key] = (
            g,
            max(smem, default=0),
            dict(N=N, d=d, BR=BR, BC=BC, Tc=Tc, nnz_row=nnz_row, col_used=col_used, M=M),
        )
    return _COUNTED[key]


@pytest.mark.simulator_only
def test_row_side_is_read_once_per_nonzero_tile(impl):
    """Alg.5 L8-L9: Q_i, O_i, l_i, m_i are loaded only for the non-zero tiles of their row (Prop. 4's N^2 s term)."""
    g, _, s = counted_launch(impl, density=0.4)
    for name in ("Q", "O", "l", "m"):
        a = g[name]
        reads = a.reads if a.reads.ndim == 1 else a.reads.max(axis=1)
        over = np.nonzero(reads > s["nnz_row"])[0]
        assert over.size == 0, (
            f"{a.describe()}; row {over[0]} read {reads[over[0]]} times, its query tile has {s['nnz_row'][over[0]]} "
            "non-zero blocks"
        )


@pytest.mark.simulator_only
def test_O_l_m_are_written_once_per_nonzero_tile_plus_initialization(impl):
    """Alg.5 L2 and L15-L16: one write to initialize, then one per non-zero tile of the row."""
    g, _, s = counted_launch(impl, density=0.4)
    for name in ("O", "l", "m"):
        a = g[name]
        writes = a.writes if a.writes.ndim == 1 else a.writes.max(axis=1)
        assert np.all(writes >= 1), (
            f"{a.describe()}; every row must be written (rows with no tile: O = 0, l = 0, m = -inf)"
        )
        over = np.nonzero(writes > s["nnz_row"] + 1)[0]
        assert over.size == 0, (
            f"{a.describe()}; row {over[0]} written {writes[over[0]]} times, budget {s['nnz_row'][over[0]] + 1}"
        )


@pytest.mark.simulator_only
def test_K_and_V_are_read_at_most_once(impl):
    """Alg.5 L6: K_j, V_j at most once each (the paper loads them for every j; skipping an unused column is allowed)."""
    g, _, s = counted_launch(impl, density=0.4)
    for name in "KV":
        a = g[name]
        assert a.reads.max() <= 1 and a.writes.sum() == 0, f"{a.describe()}; budget 1 read per element"
        needed = s["col_used"]
        assert np.all(a.reads[needed] == 1), f"{a.describe()}; keys of used tiles must be loaded"


@pytest.mark.simulator_only
def test_traffic_scales_with_the_fraction_of_nonzero_blocks(impl):
    """Proposition 4: the row-side traffic is the dense launch's times the fraction of non-zero tiles, plus the N d
    term.

    The fraction is weighted by rows (``W / (Tc N)`` with ``W = sum over non-zero tiles of |rows_i|``,
    io_model's ``W``: a ragged last query tile has fewer rows).
    """
    sparse, _, s = counted_launch(impl, density=0.4)
    dense, _, _ = counted_launch(impl, density=1.0)

    def row_side(g):
        return sum(int(g[n].reads.sum() + g[n].writes.sum()) for n in ("Q", "O", "l", "m"))

    N, d = s["N"], s["d"]
    frac = s["nnz_row"].sum() / (s["Tc"] * N)
    init = N * (d + 2)  # Alg.5 L2's writes, paid whatever the mask
    got, full = row_side(sparse), row_side(dense)
    bound = frac * (full - init) + init
    assert got <= bound, (
        f"row-side traffic {got} elements at a fraction {frac:.2f} of the tiles; dense {full}: budget {bound:.0f}"
    )


@pytest.mark.simulator_only
def test_shared_memory_fits_the_tiles_of_alg5(impl):
    _, smem, s = counted_launch(impl, density=0.4)
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
    counted_launch(impl, density=0.4)
    races = _RACES[(id(impl), 0.4)]
    assert not races, "shared-memory races (a barrier is missing or misplaced):\n" + "\n".join(races[:5])


def test_kernel_source_follows_the_house_rules(impl):
    kernel = impl.make_kernel(4)
    problems = grading.kernel_source_problems(kernel)
    assert not problems, "\n".join(problems)
    assert grading.count_calls(kernel, "cuda.syncthreads") >= 2, (
        "K_j and V_j are shared by the block: they need barriers"
    )
    missing = grading.missing_tags(kernel, "Alg.5", (6, 8, 9, 10, 12, 13, 15, 16))
    assert not missing, f"tag the lines where these steps start: {missing}"
