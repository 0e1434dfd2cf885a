"""The tutorials cannot rot: every script runs with its checks, every autograder grades what it claims.

Claims checked (``tutorials/README.md`` explains the material):

* each step-by-step tutorial ``tutorials/0N_*.py`` runs to the end as a user runs it
  (``python tutorials/0N_*.py``, in a fresh process, on this session's backend); the scripts assert
  their own claims (counted IO equals the closed form, the kernel passes the error rule, ...);
* the autograders pass on course staff's solutions, and fail EVERY test on the students' stubs (which
  raise NotImplementedError), so no autograder test passes without an implementation;
* the autograders are not vacuous beyond that: typical wrong implementations fail the correctness
  tests, and *correct but over-budget* ones (no shared-memory tiles, redundant loads, a materialized
  N x N matrix, a stream read twice) pass the correctness tests and fail the budget tests.

The autograders run as course staff and students run them (``python -m pytest tutorials/assignments
--impl ...``), one pytest process per implementation, in Numba's CUDA simulator (the IO budgets are
counted through it), with the outcome of every test read back from a JUnit XML report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TUTORIALS = REPO / "tutorials"
ASSIGNMENTS = TUTORIALS / "assignments"
SCRIPTS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))
NAMES = ("a1_online_softmax", "a2_tiled_matmul", "a3_flash_forward", "a4_recompute_backward")


def _run(cmd, env=None, timeout=600):
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, f"$ {' '.join(map(str, cmd))}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def test_all_five_tutorial_scripts_are_found():
    """Guards the parametrization below: an empty glob would otherwise run no tutorial at all."""
    assert [p.name[:2] for p in SCRIPTS] == ["01", "02", "03", "04", "05"], [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_tutorial_script_runs_and_its_checks_hold(script):
    """The script exits 0 (its asserts hold) in a fresh process, on the same backend as this session."""
    proc, log = _run([sys.executable, str(script)])  # inherits NUMBA_ENABLE_CUDASIM as numba_flash chose it
    assert proc.returncode == 0, log
    assert proc.stdout.startswith("backend: "), log  # every step says where it ran


def grade(impl: str, tmp_path: Path) -> tuple[dict, str]:
    """Run every autograder on ``impl`` in the simulator; return ({(assignment, test id): outcome}, log)."""
    report = tmp_path / f"junit-{Path(impl).name}.xml"
    env = {
        **os.environ,
        "NUMBA_FLASH_BACKEND": "simulator",  # IO budgets are counted through the simulator
        "NUMBA_ENABLE_CUDASIM": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the autograders need no plugin; faster start
        "NUMBA_FLASH_IMPL": "",
    }
    cmd = [sys.executable, "-m", "pytest", str(ASSIGNMENTS), "--impl", impl, "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    proc, log = _run(cmd, env=env)
    assert report.exists(), log
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        assignment = case.get("classname", "").split(".")[-2] if "." in case.get("classname", "") else case.get("classname")
        kids = {child.tag for child in case}
        outcome = "failed" if "failure" in kids else "error" if "error" in kids else "skipped" if "skipped" in kids else "passed"
        outcomes[(assignment, case.get("name"))] = outcome
    return outcomes, log


def by_assignment(outcomes):
    out = {name: {} for name in NAMES}
    for (assignment, test), outcome in outcomes.items():
        out.setdefault(assignment, {})[test] = outcome
    return out


def test_autograders_pass_on_the_solutions(tmp_path):
    outcomes, log = grade("solution", tmp_path)
    per = by_assignment(outcomes)
    for name in NAMES:
        assert len(per[name]) >= 6, f"{name}: only {len(per[name])} tests collected\n{log}"
        bad = {t: o for t, o in per[name].items() if o != "passed"}
        assert not bad, f"{name}: {bad}\n{log}"
    assert set(per) == set(NAMES), f"unexpected assignments {set(per) - set(NAMES)}"


def test_autograders_fail_every_test_on_the_stubs(tmp_path):
    outcomes, log = grade("stub", tmp_path)
    per = by_assignment(outcomes)
    for name in NAMES:
        assert per[name], f"{name}: no tests collected\n{log}"
        passing = [t for t, o in per[name].items() if o not in ("failed", "error")]
        assert not passing, f"{name}: these tests do not fail on the stub (vacuous?): {passing}\n{log}"
    assert "NotImplementedError" in log


# ------------------------------------------------------------------------------------------------
# Typical mistakes. "Wrong values" mutants are the solutions with one line changed; "over budget"
# mutants compute the right values the wrong way. Each must fail the named tests.
# ------------------------------------------------------------------------------------------------
def _mutate(name: str, old: str, new: str) -> str:
    source = (ASSIGNMENTS / name / "solution.py").read_text()
    assert source.count(old) == 1, f"{name}/solution.py changed: update this mutant ({old!r})"
    return source.replace(old, new)


WRONG_VALUES = {
    # the merged sum forgets to move each part to the new max
    "a1_online_softmax": lambda: _mutate("a1_online_softmax", "l = a1 * l1 + a2 * l2", "l = l1 + l2"),
    # the output store has no bounds guard: ragged edges write outside C
    "a2_tiled_matmul": lambda: _mutate("a2_tiled_matmul", "    if row < m and col < n:\n        C[row, col] = acc", "    C[row, col] = acc"),
    # Alg.1 L12 without the rescale of the old output to the new max
    "a3_flash_forward": lambda: _mutate("a3_flash_forward", "(alpha * l_i * sO_i[t, c] + beta * pv)", "(l_i * sO_i[t, c] + beta * pv)"),
    # D_i from the current tile only: rowsum(P_ij * dP_ij) is not the whole row's sum
    "a4_recompute_backward": lambda: _mutate("a4_recompute_backward", "D_i = np.sum(dO_i * O_i, axis=1)", "D_i = np.sum(P_ij * dP_ij, axis=1)"),
}

NAIVE_MATMUL = '''
import numba_flash  # noqa: F401
from numba import cuda, float32

TILE = 8


@cuda.jit
def matmul_kernel(A, B, C):
    col, row = cuda.grid(2)
    if row < C.shape[0] and col < C.shape[1]:
        acc = float32(0.0)
        for p in range(A.shape[1]):
            acc += A[row, p] * B[p, col]
        C[row, col] = acc


def matmul(A, B, C):
    grid = ((B.shape[1] + TILE - 1) // TILE, (A.shape[0] + TILE - 1) // TILE)
    matmul_kernel[grid, (TILE, TILE)](A, B, C)
'''

MATERIALIZED_BACKWARD = '''
import numpy as np


def flash_backward(gQ, gK, gV, gO, gdO, gL, tau, Br, Bc, gdQ, gdK, gdV):
    Q, K, V, dO = gQ[:], gK[:], gV[:], gdO[:]
    S = tau * (Q @ K.T)  # N x N
    P = np.exp(S - S.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    dP = dO @ V.T
    dS = P * (dP - (P * dP).sum(axis=1, keepdims=True))
    gdQ[:] = tau * (dS @ K)
    gdK[:] = tau * (dS.T @ Q)
    gdV[:] = P.T @ dO
'''

OVER_BUDGET = {
    # keeps every block: the stream is held in memory (and could be read twice)
    "a1_online_softmax": lambda: _mutate("a1_online_softmax", "for S_j, V_j in blocks:", "for S_j, V_j in list(blocks):"),
    # one thread per output, straight from global memory: right values, n reads per element of A
    "a2_tiled_matmul": lambda: textwrap.dedent(NAIVE_MATMUL),
    # every thread loads the whole K_j, V_j tile itself: right values, BR reads per element
    "a3_flash_forward": lambda: _mutate("a3_flash_forward", "for r in range(t, BC, BR):", "for r in range(BC):"),
    # Algorithm 3 in disguise: right values, N x N matrices in memory
    "a4_recompute_backward": lambda: textwrap.dedent(MATERIALIZED_BACKWARD),
}


def _write(folder: Path, mutants: dict) -> Path:
    folder.mkdir()
    for name, make in mutants.items():
        (folder / f"{name}.py").write_text(make())
    return folder


def test_autograders_reject_wrong_values(tmp_path):
    outcomes, log = grade(str(_write(tmp_path / "wrong_values", WRONG_VALUES)), tmp_path)
    per = by_assignment(outcomes)
    must_fail = {
        "a1_online_softmax": ["test_merge_of_two_blocks_equals_the_summary_of_the_whole_row", "test_online_attention_equals_softmax_attention[ragged-blocks]"],
        "a2_tiled_matmul": ["test_matmul_equals_float64_product[ragged]", "test_matmul_equals_float64_product[smaller-than-a-tile]"],
        "a3_flash_forward": ["test_forward_equals_standard_attention[ragged]", "test_large_scores_do_not_overflow"],
        "a4_recompute_backward": ["test_gradients_equal_standard_backward[ragged-Br<Bc]", "test_gradients_equal_standard_backward[ragged-Br>Bc]"],
    }
    for name, tests in must_fail.items():
        for t in tests:
            assert per[name].get(t) == "failed", f"{name}: {t} is {per[name].get(t)!r}, expected 'failed'\n{log}"


def test_autograders_reject_right_values_over_budget(tmp_path):
    outcomes, log = grade(str(_write(tmp_path / "over_budget", OVER_BUDGET)), tmp_path)
    per = by_assignment(outcomes)
    expected = {
        "a1_online_softmax": (
            ["test_online_attention_equals_softmax_attention[ragged-blocks]"],
            ["test_online_attention_reads_each_block_once_and_keeps_only_the_current_one"],
        ),
        "a2_tiled_matmul": (
            ["test_matmul_equals_float64_product[ragged]", "test_each_element_of_C_is_written_exactly_once_and_never_read"],
            [
                "test_each_element_of_A_is_read_at_most_ceil_n_over_TILE_times",
                "test_each_element_of_B_is_read_at_most_ceil_m_over_TILE_times",
                "test_shared_memory_holds_two_tiles_at_most",
            ],
        ),
        "a3_flash_forward": (
            ["test_forward_equals_standard_attention[ragged]", "test_each_Q_element_is_read_at_most_Tc_times"],
            ["test_each_K_and_V_element_is_read_exactly_once"],
        ),
        "a4_recompute_backward": (
            ["test_gradients_equal_standard_backward[ragged-Br<Bc]", "test_K_and_V_are_read_once_and_dK_dV_written_once"],
            ["test_no_N_by_N_array_is_ever_allocated"],
        ),
    }
    for name, (must_pass, must_fail) in expected.items():
        for t in must_pass:
            assert per[name].get(t) == "passed", f"{name}: {t} is {per[name].get(t)!r}, expected 'passed' (right values)\n{log}"
        for t in must_fail:
            assert per[name].get(t) == "failed", f"{name}: {t} is {per[name].get(t)!r}, expected 'failed' (over budget)\n{log}"
