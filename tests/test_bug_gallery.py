"""The mutation check: every bug of the gallery, planted in a copy of the kernels, makes the suite fail.

:mod:`tools.bugs` lists classic FlashAttention bugs as small edits of the readable kernels. For
each one, this module plants it in a temporary copy of ``numba_flash/`` and ``reference/`` and runs the
few tests the entry names, in a fresh pytest process that imports the copy (``-x``, single process);
the bug must make one of them **fail** (exit code 1, a test failure, not a collection or usage error).
A control run first runs every one of those tests on the *unmutated* copy and requires them all to
pass: otherwise a broken harness (a test id that no longer exists, a copy that does not import) would
look like a caught bug. A bug that survives fails the suite, so a change that weakens a test (or a
kernel change that moves the text a bug edits) is seen at once.

Simulator entries run on every machine (in the simulator, even on a GPU machine). GPU-only entries (a
race between thread blocks, which the simulator cannot show) are ``gpu``-marked and run with the GPU
suite, or by hand: ``python -m numba_flash bugs --run-all --gpu``.
"""

from __future__ import annotations

import pytest

from tools import bugs

SIM_BUGS = bugs.selected(gpu=False)
GPU_BUGS = bugs.selected(gpu=True)


def _explain(res: bugs.RunResult) -> str:
    return "\n".join(res.output.strip().splitlines()[-25:])


def test_gallery_has_at_least_12_documented_bugs_with_unique_names():
    assert len(bugs.GALLERY) >= 12
    assert len({b.name for b in bugs.GALLERY}) == len(bugs.GALLERY)
    for b in bugs.GALLERY:
        assert b.title and b.lesson and b.caught_by and b.paper and b.tests and b.edits, b.name
        assert all(t.startswith("tests/") and "::" in t for t in b.tests), b.name


@pytest.mark.parametrize("bug", bugs.GALLERY, ids=[b.name for b in bugs.GALLERY])
def test_every_bug_applies_to_the_current_source_exactly_once(bug):
    """Each edit's original text is in today's kernel exactly once, and the result still compiles: a
    kernel change that moves the text fails here, loudly, instead of planting nothing."""
    root = bugs.repo_root()
    text = (root / bug.file).read_text(encoding="utf-8")
    mutated = bugs.mutate(text, bug)
    assert mutated != text
    compile(mutated, bug.file, "exec")


def test_every_test_the_gallery_relies_on_runs_in_the_simulators_quick_tier():
    from quick_tier import QUICK

    tiered_out = []
    for t in (t for b in bugs.GALLERY for t in b.tests):
        test, _, case = t.partition("[")
        if test in QUICK and case[:-1] not in QUICK[test]:
            tiered_out.append(t)
    assert not tiered_out, f"skipped in the simulator without --runslow, so a planted bug would survive: {tiered_out}"


def test_a_bug_whose_text_is_gone_raises_instead_of_planting_nothing():
    gone = bugs.Bug(
        "gone",
        "t",
        "numba_flash/fa2_forward.py",
        "FA2.1 L5",
        (bugs.Edit("no such text", "x"),),
        "l",
        ("tests/x.py::t",),
        "c",
    )
    with pytest.raises(bugs.MutationError, match="is not in"):
        bugs.mutate("m_i = 0", gone)
    twice = bugs.Bug("twice", "t", "f.py", "p", (bugs.Edit("a", "b"),), "l", ("tests/x.py::t",), "c")
    with pytest.raises(bugs.MutationError, match="occurs 2 times"):
        bugs.mutate("a a", twice)


def test_unmutated_copy_passes_every_test_the_gallery_relies_on():
    res = bugs.run_bug(None, bugs.control_tests(SIM_BUGS))
    assert res.returncode == 0, f"the control run failed (exit code {res.returncode}):\n{_explain(res)}"


@pytest.mark.parametrize("bug", SIM_BUGS, ids=[b.name for b in SIM_BUGS])
def test_suite_catches_the_planted_bug_in_the_simulator(bug):
    res = bugs.run_bug(bug)
    assert res.failed, (
        f"bug {bug.name!r} survived: {', '.join(bug.tests)} "
        + ("all passed" if res.returncode == 0 else f"did not run (exit code {res.returncode})")
        + f"\n{_explain(res)}"
    )
    assert res.failures[0][0] in bug.tests, res.failures


@pytest.mark.gpu
def test_unmutated_copy_passes_the_gpu_bugs_tests_on_gpu():
    res = bugs.run_bug(None, bugs.control_tests(GPU_BUGS), "gpu")
    assert res.returncode == 0, _explain(res)


@pytest.mark.gpu
@pytest.mark.parametrize("bug", GPU_BUGS, ids=[b.name for b in GPU_BUGS])
def test_suite_catches_the_planted_bug_on_gpu(bug):
    res = bugs.run_bug(bug)
    assert res.failed, f"bug {bug.name!r} survived on the GPU:\n{_explain(res)}"
