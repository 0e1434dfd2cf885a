"""The course cannot rot: every script runs, every autograder grades what it claims, the handout leaks nothing.

Claims checked (``tutorials/README.md`` and ``docs/instructors.rst`` explain the material):

* each step-by-step tutorial ``tutorials/0N_*.py`` runs to the end as a user runs it (its asserts
  hold), in a fresh process, on this session's backend;
* ``python -m numba_flash handout DIR`` writes the students' handout: every assignment's README, stub,
  autograder and data, the grading toolkit, and no solution (no file named after one, none with a
  solution's content or a quarter of its answer lines, no package module);
* FROM THAT HANDOUT, the autograders pass on course staff's solutions (supplied apart, through
  ``NUMBA_FLASH_SOLUTIONS``) and fail every test they run on the students' stubs, so no autograder
  test passes without an implementation (the only tests not run are the GPU-only ones);
* the autograders are not vacuous beyond that: one-line bugs in the solutions fail the correctness
  tests; right values computed the wrong way (redundant loads, no causal skipping, no atomics, a
  stream held in memory) pass the correctness tests and fail the budget tests; a missing barrier
  fails the race test;
* a submission that imports numba-flash (the 20-line wrapper that once passed a1, the reference that
  once passed a4) is rejected, with the reason, for a1 and a4; the guard's three layers (static
  check, import wall, call tripwire) each catch what they claim;
* ``tutorials/grade_class.py`` grades two fake submission folders into JUnit XML reports and a CSV.

The autograders run as course staff and students run them (``python -m pytest ... --impl ...``), one
pytest process per implementation set, in Numba's CUDA simulator (the IO budgets are counted
through it), with the outcome of every test read back from a JUnit XML report.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
import textwrap
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TUTORIALS = REPO / "tutorials"
ASSIGNMENTS = TUTORIALS / "assignments"
SOLUTIONS = TUTORIALS / "solutions"
SCRIPTS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))
NAMES = (
    "a1_online_softmax",
    "a2_tiled_matmul",
    "a3_flash_forward",
    "a4_recompute_backward",
    "a5_fa2_forward",
    "a6_fa2_backward",
    "a7_block_sparse",
    "a8_dropout",
    "a9_bug_hunt",
    "a10_perf_lab",
)


def _run(cmd, env=None, cwd=REPO, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return (
        proc,
        f"$ {' '.join(map(str, cmd))}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-4000:]}",
    )


def test_all_five_tutorial_scripts_are_found():
    """Guards the parametrization below: an empty glob would otherwise run no tutorial at all."""
    assert [p.name[:2] for p in SCRIPTS] == ["01", "02", "03", "04", "05"], [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_tutorial_script_runs_and_its_checks_hold(script):
    """The script exits 0 (its asserts hold) in a fresh process, on the same backend as this session."""
    proc, log = _run([sys.executable, str(script)])  # inherits NUMBA_ENABLE_CUDASIM as numba_flash chose it
    assert proc.returncode == 0, log
    assert proc.stdout.startswith("backend: "), log  # every step says where it ran


def test_every_assignment_is_listed_here_and_has_its_files():
    found = sorted(p.name for p in ASSIGNMENTS.iterdir() if (p / "test_autograder.py").is_file())
    assert sorted(NAMES) == found, f"assignments on disk {found}; update NAMES"
    for name in NAMES:
        for f in ("README.md", "__init__.py", "stub.py", "test_autograder.py"):
            assert (ASSIGNMENTS / name / f).is_file(), f"{name}/{f} is missing"
        assert (SOLUTIONS / name / "solution.py").is_file(), f"solutions/{name}/solution.py is missing"
        assert not list((ASSIGNMENTS / name).glob("*solution*")), f"{name}: a solution sits beside the stub"


def test_perf_lab_script_skips_cleanly_without_a_gpu():
    """a10's lab needs a GPU for its measurements; in the simulator it says so, names the commands, and exits 0."""
    if not __import__("numba_flash").is_simulator():
        pytest.skip("on a GPU the lab measures; the autograder's GPU test runs it")
    proc, log = _run([sys.executable, str(ASSIGNMENTS / "a10_perf_lab" / "lab.py")])
    assert proc.returncode == 0, log
    assert "skipped" in proc.stdout and "ncu --csv" in proc.stdout, log


# ------------------------------------------------------------------------------------------------
# Grading runs
# ------------------------------------------------------------------------------------------------
def grade(impl: str, tmp_path: Path, tutorials: Path = TUTORIALS, targets=None, env_extra=None) -> tuple[dict, str]:
    """Run the autograders (``targets``: paths or node ids, default all) on ``impl`` in the simulator.

    Returns ({(assignment, test id): outcome}, log).
    """
    report = tmp_path / f"junit-{abs(hash((impl, str(tutorials), str(targets))))}.xml"
    env = {
        **os.environ,
        "NUMBA_FLASH_BACKEND": "simulator",  # IO budgets are counted through the simulator
        "NUMBA_ENABLE_CUDASIM": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the autograders need no plugin; faster start
        "NUMBA_FLASH_IMPL": "",
        **(env_extra or {}),
    }
    targets = [str(tutorials / "assignments")] if targets is None else [str(t) for t in targets]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        f"--impl={impl}",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
    ]
    proc, log = _run(cmd, env=env, cwd=tutorials)
    assert report.exists(), log
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        assignment = parts[-2] if len(parts) >= 2 else parts[0]
        kids = {child.tag for child in case}
        outcome = (
            "failed"
            if "failure" in kids
            else "error"
            if "error" in kids
            else "skipped"
            if "skipped" in kids
            else "passed"
        )
        outcomes[(assignment, case.get("name"))] = outcome
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            MESSAGES[(assignment, case.get("name"))] = (bad.get("message") or "") + (bad.text or "")
    return outcomes, log


def by_assignment(outcomes):
    out = {name: {} for name in NAMES}
    for (assignment, test), outcome in outcomes.items():
        out.setdefault(assignment, {})[test] = outcome
    return out


GPU_ONLY = {("a10_perf_lab", "test_lab_script_measures_on_a_gpu")}
#: The failure message of every failed test of the last grading runs, by (assignment, test id).
MESSAGES: dict = {}


@pytest.fixture(scope="module")
def handout(tmp_path_factory) -> Path:
    """``python -m numba_flash handout DIR``, as course staff run it; returns DIR/tutorials."""
    dest = tmp_path_factory.mktemp("handout")
    proc, log = _run([sys.executable, "-m", "numba_flash", "handout", str(dest)])
    assert proc.returncode == 0, log
    assert "checked: no solution file" in proc.stdout, log
    return dest / "tutorials"


def test_handout_holds_every_assignment_and_no_solution(handout):
    from numba_flash import handout as ho

    for name in NAMES:
        for f in ("README.md", "__init__.py", "stub.py", "test_autograder.py"):
            assert (handout / "assignments" / name / f).is_file(), f"handout: {name}/{f} is missing"
    for f in (
        "conftest.py",
        "pytest.ini",
        "README.md",
        "grade_class.py",
        "assignments/grading.py",
        "assignments/guard.py",
        "assignments/a10_perf_lab/data/ncu_sample.csv",
    ):
        assert (handout / f).is_file(), f"handout: {f} is missing"
    assert (handout.parent / "README.md").is_file()
    files = [p.relative_to(handout) for p in handout.rglob("*") if p.is_file()]
    assert not [p for p in files if "solution" in str(p).lower()], "a file named after a solution is in the handout"
    assert not (handout / "solutions").exists()
    solution_texts = {p.read_text() for p in SOLUTIONS.rglob("*.py")}
    assert not [p for p in files if p.suffix == ".py" and (handout / p).read_text() in solution_texts], (
        "a solution's content is in the handout"
    )
    assert ho.leaks(handout, TUTORIALS) == []


def test_handout_check_catches_a_solution_under_another_name(handout, tmp_path):
    """The leak check is not vacuous: a solution renamed, or pasted into a tutorial, is reported."""
    from numba_flash import handout as ho

    leaky = tmp_path / "leaky"
    leaky.mkdir()
    (leaky / "notes.py").write_text((SOLUTIONS / "a5_fa2_forward" / "solution.py").read_text())
    stub = (ASSIGNMENTS / "a4_recompute_backward" / "stub.py").read_text()
    answer = (SOLUTIONS / "a4_recompute_backward" / "solution.py").read_text()
    (leaky / "a4_hint.py").write_text(stub + "\n" + answer[answer.index("@functools.cache") :])
    (leaky / "solution_key.txt").write_text("42")
    problems = "\n".join(ho.leaks(leaky, TUTORIALS))
    assert "notes.py: the same content as the solution of a5_fa2_forward" in problems, problems
    assert "a4_hint.py: holds" in problems and "a4_recompute_backward" in problems, problems
    assert "solution_key.txt: a path that names a solution" in problems, problems


def test_handout_command_refuses_to_overwrite_without_force(handout):
    proc, log = _run([sys.executable, "-m", "numba_flash", "handout", str(handout.parent)])
    assert proc.returncode == 1 and "exists" in proc.stdout, log


def test_autograders_pass_on_the_solutions_from_the_handout(handout, tmp_path):
    """Graded from the handout itself, with the solutions supplied apart (NUMBA_FLASH_SOLUTIONS)."""
    outcomes, log = grade("solution", tmp_path, tutorials=handout, env_extra={"NUMBA_FLASH_SOLUTIONS": str(SOLUTIONS)})
    per = by_assignment(outcomes)
    assert set(per) == set(NAMES), f"unexpected assignments {set(per) - set(NAMES)}\n{log}"
    for name in NAMES:
        assert len(per[name]) >= 6, f"{name}: only {len(per[name])} tests collected\n{log}"
        bad = {t: o for t, o in per[name].items() if o != "passed" and (name, t) not in GPU_ONLY}
        assert not bad, f"{name}: {bad}\n{log}"


def test_autograders_fail_every_test_they_run_on_the_stubs_in_the_handout(handout, tmp_path):
    outcomes, log = grade("stub", tmp_path, tutorials=handout)
    per = by_assignment(outcomes)
    for name in NAMES:
        assert per[name], f"{name}: no tests collected\n{log}"
        passing = [t for t, o in per[name].items() if o not in ("failed", "error") and (name, t) not in GPU_ONLY]
        assert not passing, f"{name}: these tests do not fail on the stub (vacuous?): {passing}\n{log}"
    for key in GPU_ONLY:
        assert outcomes.get(key) == "skipped", (
            f"{key}: {outcomes.get(key)}; GPU-only tests are skipped in the simulator"
        )
    for name in NAMES:
        if name != "a9_bug_hunt":  # the bug hunt's stub runs (its kernels are broken, not missing)
            assert any("NotImplementedError" in MESSAGES.get((name, t), "") for t in per[name]), (
                f"{name}: no test fails on NotImplementedError\n{log}"
            )


# ------------------------------------------------------------------------------------------------
# Typical mistakes. Mutants are the solutions with one line changed (or a short file). Each round is
# one pytest run over the named tests only, with at most one mutant per assignment.
# ------------------------------------------------------------------------------------------------
def _mutate(name: str, old: str, new: str) -> str:
    source = (SOLUTIONS / name / "solution.py").read_text()
    assert source.count(old) == 1, f"solutions/{name}/solution.py changed: update this mutant ({old!r})"
    return source.replace(old, new)


NAIVE_MATMUL = """
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
"""

# (assignment, make mutant, tests that must pass, tests that must fail)
WRONG_VALUES = [
    # FA2.1 L10 without the rescale of the running accumulator
    (
        "a1_online_softmax",
        lambda: _mutate("a1_online_softmax", "acc_new = alpha[:, None] * acc + P @ V_j", "acc_new = acc + P @ V_j"),
        [],
        [
            "test_absorb_keeps_an_unnormalized_accumulator",
            "test_absorb_then_finalize_equals_softmax_attention[ragged-blocks]",
        ],
    ),
    # the output store has no bounds guard: ragged edges write outside C
    (
        "a2_tiled_matmul",
        lambda: _mutate(
            "a2_tiled_matmul", "    if row < m and col < n:\n        C[row, col] = acc", "    C[row, col] = acc"
        ),
        [],
        ["test_matmul_equals_float64_product[ragged]", "test_matmul_equals_float64_product[smaller-than-a-tile]"],
    ),
    # Alg.1 L12 without the rescale of the old output to the new max
    (
        "a3_flash_forward",
        lambda: _mutate("a3_flash_forward", "(alpha * l_i * sO_i[t, c] + beta * pv)", "(l_i * sO_i[t, c] + beta * pv)"),
        [],
        ["test_forward_equals_standard_attention[ragged]", "test_large_scores_do_not_overflow"],
    ),
    # Alg.4 L13 without diag(l_i)^-1: P is not normalized
    (
        "a4_recompute_backward",
        lambda: _mutate(
            "a4_recompute_backward", "p = math.exp(s * tau32 - m_i) / l_i", "p = math.exp(s * tau32 - m_i)"
        ),
        [],
        [
            "test_gradients_equal_standard_backward[ragged]",
            "test_gradients_equal_standard_backward[one-tile-wide-head]",
        ],
    ),
    # FA2.1 L10 without e^(m_i - m_new)
    (
        "a5_fa2_forward",
        lambda: _mutate("a5_fa2_forward", "rO[c] = alpha * rO[c] + pv", "rO[c] = rO[c] + pv"),
        [],
        ["test_forward_equals_standard_attention[ragged]", "test_causal_forward_equals_masked_attention[ragged]"],
    ),
    # FA2.2 L15 without tau, in the atomic variant only
    (
        "a6_fa2_backward",
        lambda: _mutate(
            "a6_fa2_backward",
            "cuda.atomic.add(dQ, (i * BR + r, c), tau32 * acc)",
            "cuda.atomic.add(dQ, (i * BR + r, c), acc)",
        ),
        ["test_gradients_are_within_three_times_the_float32_error[ragged-deterministic]"],
        ["test_gradients_are_within_three_times_the_float32_error[ragged-atomic]"],
    ),
    # Alg.5 L8 forgotten: every tile computed
    (
        "a7_block_sparse",
        lambda: _mutate("a7_block_sparse", "if block_mask[i, j] != 0 and row < N:", "if row < N:"),
        ["test_forward_equals_attention_with_the_expanded_block_mask[dense]"],
        ["test_forward_equals_attention_with_the_expanded_block_mask[half]"],
    ),
    # the backward hashes (col, row) instead of (row, col): a different mask than the forward's
    (
        "a8_dropout",
        lambda: _mutate(
            "a8_dropout",
            "dropout_keep(seed, i * BR + r, key, threshold)",
            "dropout_keep(seed, key, i * BR + r, threshold)",
        ),
        ["test_forward_applies_the_mask_of_the_counter_hash[ragged]"],
        ["test_backward_regenerates_the_forward_mask"],
    ),
    # Kbyte read as 1024 bytes
    (
        "a10_perf_lab",
        lambda: _mutate("a10_perf_lab", '"Kbyte": 10**3', '"Kbyte": 2**10'),
        [],
        ["test_parse_ncu_csv_sums_the_launches_of_each_kernel_in_bytes"],
    ),
]

OVER_BUDGET = [
    # keeps every block: the stream is held in memory
    (
        "a1_online_softmax",
        lambda: _mutate("a1_online_softmax", "for S_j, V_j in blocks:", "for S_j, V_j in list(blocks):"),
        ["test_absorb_then_finalize_equals_softmax_attention[ragged-blocks]"],
        ["test_online_attention_reads_each_block_once_and_keeps_only_the_current_one"],
    ),
    # one thread per output, straight from global memory
    (
        "a2_tiled_matmul",
        lambda: textwrap.dedent(NAIVE_MATMUL),
        ["test_matmul_equals_float64_product[ragged]", "test_each_element_of_C_is_written_exactly_once_and_never_read"],
        [
            "test_each_element_of_A_is_read_at_most_ceil_n_over_TILE_times",
            "test_each_element_of_B_is_read_at_most_ceil_m_over_TILE_times",
            "test_shared_memory_holds_two_tiles_at_most",
        ],
    ),
    # every thread loads the whole K_j, V_j tile itself
    (
        "a3_flash_forward",
        lambda: _mutate("a3_flash_forward", "for r in range(t, BC, BR):", "for r in range(BC):"),
        ["test_forward_equals_standard_attention[ragged]", "test_each_Q_element_is_read_at_most_Tc_times"],
        ["test_each_K_and_V_element_is_read_exactly_once"],
    ),
    # every thread loads (and zeroes) the whole K/V tile: BR reads per element
    (
        "a4_recompute_backward",
        lambda: _mutate(
            "a4_recompute_backward",
            "            for r in range(t, BC, BR):\n                for c in range(D):\n                    if r < "
            "n_j:",
            "            for r in range(BC):\n                for c in range(D):\n                    if r < n_j:",
        ),
        ["test_gradients_equal_standard_backward[ragged]"],
        ["test_K_and_V_are_read_once_and_dK_dV_written_once"],
    ),
    # causal without tile skipping: the elementwise mask alone gives the right values
    (
        "a5_fa2_forward",
        lambda: _mutate("a5_fa2_forward", "Tc = min(Tc, last_row // BC + 1)", "Tc = Tc"),
        ["test_causal_forward_equals_masked_attention[ragged]"],
        ["test_causal_launch_skips_the_tiles_above_the_diagonal"],
    ),
    # a plain read-modify-write instead of the atomic add: right in the simulator (blocks run in turn), a race on a GPU
    (
        "a6_fa2_backward",
        lambda: _mutate(
            "a6_fa2_backward", "cuda.atomic.add(dQ, (i * BR + r, c), tau32 * acc)", "dQ[i * BR + r, c] += tau32 * acc"
        ),
        ["test_gradients_are_within_three_times_the_float32_error[ragged-atomic]"],
        ["test_atomic_variant_adds_into_dQ_once_per_column_block"],
    ),
    # Q_i is read for zero tiles too
    (
        "a7_block_sparse",
        lambda: _mutate(
            "a7_block_sparse",
            "                row = i * BR + t\n",
            "                row = i * BR + t\n                if row < N:\n                    s = Q[row, 0]  # an "
            "extra load\n",
        ),
        ["test_forward_equals_attention_with_the_expanded_block_mask[half]"],
        ["test_row_side_is_read_once_per_nonzero_tile"],
    ),
    # the probe reads every element twice
    (
        "a10_perf_lab",
        lambda: _mutate("a10_perf_lab", "dst[k] = src[k]  #", "dst[k] = src[k] + 0 * src[k]  #"),
        ["test_copy_kernel_copies_any_length[longer-than-the-grid]"],
        ["test_copy_kernel_reads_and_writes_each_element_exactly_once"],
    ),
]

MISSING_BARRIER = [
    # no barrier between the last read of K_j, V_j and the next tile's load
    (
        "a5_fa2_forward",
        lambda: _mutate(
            "a5_fa2_forward",
            "            cuda.syncthreads()  # Sync: every thread is done with K_j, V_j before L7 overwrites them\n",
            "",
        ),
        [],
        ["test_no_shared_memory_races"],
    ),
    (
        "a3_flash_forward",
        lambda: _mutate(
            "a3_flash_forward",
            "            cuda.syncthreads()  # Sync: every thread is done with K_j, V_j before L6 overwrites them\n",
            "",
        ),
        [],
        ["test_no_shared_memory_races"],
    ),
]

# The cheats that once passed: a1 as a wrapper of the package's online softmax, a4 as a call of its Algorithm 4.
CHEAT_A1 = """
import numpy as np
from numba_flash_reference.online_softmax import identity_state, merge, softmax_state


def init_state(rows, d, dtype=np.float32):
    s = identity_state(rows, d)
    return s.m.astype(dtype), s.l.astype(dtype), s.o.astype(dtype)


def absorb(state, S_j, V_j):
    b = softmax_state(S_j, V_j)
    s = merge(state[0], state[1], b.m, b.l, state[2], b.o * b.l[:, None], normalized=False)
    return s.m.astype(np.float32), s.l.astype(np.float32), s.o.astype(np.float32)


def finalize(state):
    m, l, acc = state
    return acc / np.where(l > 0, l, 1)[:, None], np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf)
"""

CHEAT_A4 = """
import importlib
import numpy as np

BR = 8
BC = 8
_alg4 = importlib.import_module("numba_flash_" + "reference.alg4_backward")


def make_kernel(D):
    return None


def flash_backward(Q, K, V, O, dO, l, m, tau, dQ, dK, dV):
    shape = lambda x: np.asarray(x, np.float64)[None, :, None, :]
    g = _alg4.flash_backward(shape(dO), shape(Q), shape(K), shape(V), shape(O), np.asarray(l)[None, None], np.asarray(m)[None, None], softmax_scale=tau)
    for out, x in zip((dQ, dK, dV), g):
        out[...] = x[0, :, 0]
"""  # noqa: E501  (a submission's source, as a student would write it)


# The red team (issue "The suite and the course a student can trust"): sys, importlib and threading reached
# through numba's own modules, the tripwire switched off, the import wall taken out of meta_path, the package
# imported by a computed name. Once it passed a1 (10/10), a3 (10/10) and a4 (9/9); each must now fail.
RED_TEAM_PREAMBLE = """
import numba
import numpy as np

_sys = numba.core.config.sys
_imp = numba.core.caching.importlib
_thr = numba.core.compiler_lock.threading


def _unguarded(name):
    _sys.setprofile(None)
    _thr.setprofile(None)
    _sys.meta_path[:] = [f for f in _sys.meta_path if "Wall" not in type(f).__name__]
    return _imp.import_module("numba_" + "flash_reference." + name)
"""
RED_TEAM = {
    "a1_online_softmax": RED_TEAM_PREAMBLE
    + CHEAT_A1.replace("from numba_flash_reference.online_softmax import identity_state, merge, softmax_state\n", "")
    .replace("    s = identity_state(rows, d)", "    s = _unguarded('online_softmax').identity_state(rows, d)")
    .replace(
        "    b = softmax_state(S_j, V_j)\n    s = merge(",
        "    ref = _unguarded('online_softmax')\n    b = ref.softmax_state(S_j, V_j)\n    s = ref.merge(",
    ),
    "a3_flash_forward": RED_TEAM_PREAMBLE
    + """
BR = 8
BC = 8


def make_kernel(D):
    return None


def flash_forward(Q, K, V, O, l, m, tau):
    r = _unguarded("alg1_forward").flash_forward_alg1(np.asarray(Q, np.float64)[None, :, None, :],
                                                     np.asarray(K, np.float64)[None, :, None, :],
                                                     np.asarray(V, np.float64)[None, :, None, :], softmax_scale=tau)
    O[...] = r.O[0, :, 0]
    l[...] = r.l[0, 0]
    m[...] = r.m[0, 0]
""",
    "a4_recompute_backward": RED_TEAM_PREAMBLE
    + CHEAT_A4.replace("import importlib\n", "")
    .replace('_alg4 = importlib.import_module("numba_flash_" + "reference.alg4_backward")\n', "")
    .replace("_alg4.flash_backward(", "_unguarded('alg4_backward').flash_backward("),
}


def test_the_static_check_rejects_the_red_team_gadgets(guard):
    for name, source in RED_TEAM.items():
        problems = "\n".join(guard.static_problems(source))
        for gadget in ("'sys'", "'importlib'", "'threading'", "'setprofile'", "'meta_path'"):
            assert f"attribute {gadget} is not allowed" in problems, (name, gadget, problems)


def test_the_red_team_submissions_fail_every_autograder_test_they_run(tmp_path):
    folder = tmp_path / "red_team"
    folder.mkdir()
    for name, text in RED_TEAM.items():
        (folder / f"{name}.py").write_text(text)
    outcomes, log = grade(str(folder), tmp_path, targets=[ASSIGNMENTS / name for name in RED_TEAM])
    per = by_assignment(outcomes)
    for name in RED_TEAM:
        assert len(per[name]) >= 6, f"{name}: {per[name]}\n{log}"
        passing = [t for t, o in per[name].items() if o not in ("failed", "error")]
        assert not passing, f"the {name} red-team submission passes {passing}\n{log}"


def _round(tmp_path, label, cases, extra_targets=(), extra_files=None):
    folder = tmp_path / label
    folder.mkdir()
    targets = list(extra_targets)
    for name, make, must_pass, must_fail in cases:
        (folder / f"{name}.py").write_text(make())
        targets += [f"{ASSIGNMENTS / name / 'test_autograder.py'}::{t}" for t in must_pass + must_fail]
    for name, text in (extra_files or {}).items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text))
    outcomes, log = grade(str(folder), tmp_path, targets=targets)
    per = by_assignment(outcomes)
    for name, _, must_pass, must_fail in cases:
        for t in must_pass:
            assert per[name].get(t) == "passed", (
                f"{label} {name}: {t} is {per[name].get(t)!r}, expected 'passed' (right values)\n{log}"
            )
        for t in must_fail:
            assert per[name].get(t) == "failed", (
                f"{label} {name}: {t} is {per[name].get(t)!r}, expected 'failed'\n{log}"
            )
    return per, log


def test_autograders_reject_wrong_values(tmp_path):
    _round(tmp_path, "wrong_values", WRONG_VALUES)


def test_autograders_reject_right_values_over_budget(tmp_path):
    _round(tmp_path, "over_budget", OVER_BUDGET)


def test_a_missing_barrier_fails_the_race_test_and_cheats_of_a1_and_a4_are_rejected(tmp_path):
    """One run: two kernels without their second barrier, and the two cheats that once passed a1 and a4."""
    per, log = _round(
        tmp_path,
        "barrier_and_cheats",
        MISSING_BARRIER,
        extra_targets=[ASSIGNMENTS / "a1_online_softmax", ASSIGNMENTS / "a4_recompute_backward"],
        extra_files={"a1_online_softmax": CHEAT_A1, "a4_recompute_backward": CHEAT_A4},
    )
    for name in ("a1_online_softmax", "a4_recompute_backward"):
        assert len(per[name]) >= 6, f"{name}: {per[name]}\n{log}"
        passing = [t for t, o in per[name].items() if o not in ("failed", "error")]
        assert not passing, f"the {name} cheat passes {passing}\n{log}"
    a1 = "\n".join(MESSAGES.get(("a1_online_softmax", t), "") for t in per["a1_online_softmax"])
    a4 = "\n".join(MESSAGES.get(("a4_recompute_backward", t), "") for t in per["a4_recompute_backward"])
    assert "import of 'numba_flash_reference.online_softmax'" in a1 and "your own code" in a1, a1[:3000]
    assert "import of 'importlib' is not allowed" in a4 and "names the package" in a4, a4[:3000]


# ------------------------------------------------------------------------------------------------
# The guard, layer by layer (in this process)
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def guard():
    spec = importlib.util.spec_from_file_location("course_guard_under_test", ASSIGNMENTS / "guard.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "source, reason",
    [
        ("import numba_flash", "import of 'numba_flash'"),
        ("from numba_flash_reference.online_softmax import merge", "import of 'numba_flash_reference.online_softmax'"),
        ("import numba_flash.api as api", "import of 'numba_flash.api'"),
        ("from assignments import grading", "import of 'assignments'"),
        ("import importlib", "import of 'importlib' is not allowed"),
        ("import torch", "import of 'torch' is not allowed"),
        ("import sys", "import of 'sys' is not allowed"),
        ("from . import helper", "relative import"),
        ("m = __import__('math')", "'__import__' is not allowed"),
        ("x = eval('1')", "'eval' is not allowed"),
        ("f = getattr(len, 'x')", "'getattr' is not allowed"),
        ("def f():\n    return f.__globals__", "attribute '__globals__'"),
        ("x = ().__class__.__base__", "attribute '__class__'"),
        ("name = 'numba_flash_reference'", "names the package"),
    ],
    ids=lambda v: v if len(v) < 30 else v[:30],
)
def test_static_check_rejects_imports_and_dynamic_loading(guard, source, reason):
    problems = guard.static_problems(source)
    assert any(reason in p for p in problems), problems


def test_static_check_accepts_every_stub_and_solution(guard):
    for path in [*ASSIGNMENTS.glob("*/stub.py"), *SOLUTIONS.glob("*/solution.py")]:
        assert guard.static_problems(path.read_text(), str(path)) == [], path


def test_static_check_misses_a_name_built_from_pieces_but_the_import_wall_stops_it(guard):
    """What the static check cannot see (a module name assembled at run time) meets the import wall."""
    import importlib

    assert guard.static_problems("name = 'numba' + '_fl' + 'ash'") == []  # no forbidden string, no forbidden name
    import numba_flash_reference  # noqa: F401  (loaded before the window, as in a grading run)

    with guard.GUARD:
        with pytest.raises(ImportError, match="cannot be imported while a submission is graded"):
            importlib.import_module("numba" + "_flash_reference.online_softmax")
        assert "numba_flash_reference" not in sys.modules
    assert "numba_flash_reference" in sys.modules  # restored after the window


def test_call_tripwire_rejects_package_code_reached_without_an_import(guard):
    """A function handed a package function (here through a closure made outside the window) is caught when it calls
    it."""
    from numba_flash_reference.online_softmax import softmax_state

    def make():
        hidden = softmax_state

        def block_summary(S, V):
            return hidden(S, V)

        return block_summary

    module = types.ModuleType("cheat_module")
    module.block_summary = make()
    module.block_summary.__module__ = "cheat_module"
    guarded = guard.GuardedModule(module, "a1_online_softmax")
    import numpy as np

    with pytest.raises(guard.SubmissionRejected, match="softmax_state"):
        guarded.block_summary(np.ones((2, 3)), np.ones((3, 2)))


def test_call_tripwire_rejects_the_graders_own_oracles(guard):
    @guard.oracle
    def reference_answer():
        return 42

    module = types.ModuleType("cheat_oracle")

    def answer():
        return reference_answer()

    answer.__module__ = "cheat_oracle"
    module.answer = answer
    with pytest.raises(guard.SubmissionRejected, match="reference_answer"):
        guard.GuardedModule(module, "a3_flash_forward").answer()


def test_guarded_results_are_materialized_inside_the_window(guard):
    """A lazy array-like whose __array__ calls the package is converted inside the window, and caught."""
    from numba_flash_reference.online_softmax import softmax_stats

    class Lazy:
        def __array__(self, dtype=None, copy=None):
            import numpy as np

            return np.asarray(softmax_stats(np.ones((2, 3)))[0])

    module = types.ModuleType("cheat_lazy")

    def result():
        return Lazy()

    result.__module__ = "cheat_lazy"
    module.result = result
    with pytest.raises(guard.SubmissionRejected, match="softmax_stats"):
        guard.GuardedModule(module, "a1_online_softmax").result()


# ------------------------------------------------------------------------------------------------
# Grading a class
# ------------------------------------------------------------------------------------------------
def test_grade_class_script_grades_two_submission_folders(tmp_path):
    subs = tmp_path / "submissions"
    (subs / "alice").mkdir(parents=True)
    (subs / "bob").mkdir()
    (subs / "alice" / "a1_online_softmax.py").write_text((SOLUTIONS / "a1_online_softmax" / "solution.py").read_text())
    (subs / "alice" / "a10_perf_lab.py").write_text((ASSIGNMENTS / "a10_perf_lab" / "stub.py").read_text())
    (subs / "bob" / "a1_online_softmax.py").write_text(textwrap.dedent(CHEAT_A1))
    out = tmp_path / "grades"
    cmd = [
        sys.executable,
        str(TUTORIALS / "grade_class.py"),
        str(subs),
        "--out",
        str(out),
        "--assignments",
        "a1_online_softmax",
        "a10_perf_lab",
        "--jobs",
        "2",
    ]
    proc, log = _run(cmd)
    assert proc.returncode == 0, log
    for student in ("alice", "bob"):
        root = ET.parse(out / f"{student}.xml").getroot()
        assert root.iter("testcase"), f"{student}: empty JUnit report"
    rows = {(r["student"], r["assignment"]): r for r in csv.DictReader(open(out / "grades.csv"))}
    assert float(rows["alice", "a1_online_softmax"]["score"]) == 1.0, rows
    assert float(rows["alice", "a10_perf_lab"]["score"]) == 0.0, rows  # the stub: every test run fails
    assert (
        float(rows["bob", "a1_online_softmax"]["score"]) == 0.0
        and "rejected" in rows["bob", "a1_online_softmax"]["reason"]
    ), rows
    assert "no implementation to grade" in rows["bob", "a10_perf_lab"]["reason"], rows


# The sandbox (assignments/sandbox.py): a1, a3 and a4 are graded in a worker process whose audit hook refuses
# every route to the package. These submissions are loaded past the static check, as if it had missed their
# gadgets; each reaches for the package's online softmax in another way, and each graded call must be refused.
_REFERENCE_FILE = REPO / "reference" / "online_softmax.py"
SANDBOX_RED_TEAM = {
    "import by a computed name": """
import importlib
def init_state(rows, d, dtype=None):
    return importlib.import_module("numba_flash_" + "reference.online_softmax").identity_state(rows, d)
""",
    "the red team's gadgets": RED_TEAM["a1_online_softmax"],
    "read and run the source": f"""
def init_state(rows, d, dtype=None):
    ns = {{}}
    with open({str(_REFERENCE_FILE)!r}) as f:
        exec(f.read(), ns)
    return ns["identity_state"](rows, d)
""",
    "unpickle a reference": """
import pickle
def init_state(rows, d, dtype=None):
    return pickle.loads(b"cnumba_flash_reference.online_softmax\\nidentity_state\\n.")(rows, d)
""",
    "another process": """
import subprocess, sys
def init_state(rows, d, dtype=None):
    code = "from numba_flash_reference.online_softmax import identity_state as s; print(s(2, 3).m)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
""",
    "a file for later": """
def init_state(rows, d, dtype=None):
    with open("sitecustomize.py", "w") as f:
        f.write("import numba_flash")
    return None
""",
}


@pytest.fixture(scope="module")
def course():
    sys.path.insert(0, str(TUTORIALS))
    try:
        from assignments import guard as course_guard
        from assignments import sandbox

        yield types.SimpleNamespace(guard=course_guard, sandbox=sandbox)
    finally:
        sys.path.remove(str(TUTORIALS))


@pytest.mark.parametrize("route", sorted(SANDBOX_RED_TEAM))
def test_the_sandbox_refuses_every_route_to_the_package_past_the_static_check(course, tmp_path, route):
    path = tmp_path / "a1_online_softmax.py"
    path.write_text(SANDBOX_RED_TEAM[route])
    impl = course.sandbox.SandboxedModule(path, "_red_team_a1", "a1_online_softmax")
    with pytest.raises(course.guard.SubmissionRejected, match="the sandbox refuses"):
        impl.init_state(4, 8)
    assert not (tmp_path / "sitecustomize.py").exists()


def test_the_sandbox_grades_the_solution_and_brings_back_what_a_call_wrote(course, tmp_path):
    path = tmp_path / "a1_online_softmax.py"
    path.write_text(
        "import numpy as np\n"
        "def fill(out, counted):\n"
        "    out[...] = 7.0\n"
        "    counted[1] = counted[0]\n"
        "    return out.sum()\n"
        "def bad(n):\n"
        "    raise ValueError(f'n must be even, got {n}')\n"
    )
    import numpy as np
    from assignments.probes import CountingArray

    impl = course.sandbox.SandboxedModule(path, "_sandboxed_fill", "a1_online_softmax")
    out, counted = np.zeros(3, np.float32), CountingArray(np.arange(4.0), "c")
    assert impl.fill(out, counted) == 21.0
    assert out.tolist() == [7.0, 7.0, 7.0], "an output array written in the worker is written here"
    assert counted.data.tolist() == [0.0, 0.0, 2.0, 3.0]
    assert (int(counted.reads.sum()), int(counted.writes.sum())) == (1, 1), "a probe's counts come back"
    with pytest.raises(ValueError, match="n must be even, got 3"):  # the submission's own exception, by type
        impl.bad(3)
