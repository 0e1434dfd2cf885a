"""Grade a class: one autograder run per submission folder, a JUnit XML report each, and one CSV of scores.

Course staff run it on a folder that holds one folder per student, each with that student's files
named after the assignments (``a1_online_softmax.py``, ... or ``a1_online_softmax/solution.py``)::

    submissions/
        alice/a1_online_softmax.py  alice/a5_fa2_forward.py  ...
        bob/a1_online_softmax.py    ...

    python tutorials/grade_class.py submissions/ --out grades/
    python tutorials/grade_class.py submissions/ --out grades/ --assignments a1_online_softmax a5_fa2_forward --jobs 2

For each student it runs, in a fresh process and in Numba's CUDA simulator (the IO budgets are counted
there; results do not depend on the machine)::

    python -m pytest tutorials/assignments[/<assignment> ...] --impl=submissions/<student> \\
        --junitxml=grades/<student>.xml -p no:cacheprovider -q

and writes ``grades/grades.csv`` (student, assignment, passed, failed, errors, skipped, score), where
score = passed / (tests run); a missing file gives 0 with the reason "no implementation to grade", a
submission the guard rejects (it imports or calls numba-flash, or the grader) gives 0 with the guard's
reason. Each student's full pytest output is kept in ``grades/<student>.log``.

Add ``--timeout SECONDS`` to bound a run (an infinite loop in a kernel), ``--jobs N`` to grade N
students at a time (each run is one process; the simulator is CPU-bound).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parent
ASSIGNMENTS = TUTORIALS / "assignments"


def assignment_names() -> list[str]:
    return sorted(
        (p.name for p in ASSIGNMENTS.iterdir() if (p / "test_autograder.py").is_file()),
        key=lambda n: int(n[1:].split("_")[0]),
    )


def grade_one(student: Path, out: Path, assignments: list[str], timeout: float | None) -> tuple[str, dict]:
    """Run the autograders on one student's folder; return (student, {assignment: counts})."""
    report = out / f"{student.name}.xml"
    targets = [str(ASSIGNMENTS / a) for a in assignments]
    env = {
        **os.environ,
        "NUMBA_FLASH_BACKEND": "simulator",
        "NUMBA_ENABLE_CUDASIM": "1",
        "NUMBA_FLASH_IMPL": "",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        f"--impl={student}",
        f"--junitxml={report}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    try:
        proc = subprocess.run(cmd, cwd=TUTORIALS, env=env, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"timed out after {timeout} s\n{exc.stdout or ''}"
    (out / f"{student.name}.log").write_text(f"$ {' '.join(cmd)}\n{log}")
    counts = {a: dict(passed=0, failed=0, errors=0, skipped=0, reason="") for a in assignments}
    if not report.is_file():
        for a in assignments:
            counts[a]["reason"] = "no report (the run crashed or timed out; see the log)"
        return student.name, counts
    for case in ET.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        name = next((p for p in parts if p in counts), None)
        if name is None:
            continue
        kids = {child.tag: child for child in case}
        key = (
            "failed"
            if "failure" in kids
            else "errors"
            if "error" in kids
            else "skipped"
            if "skipped" in kids
            else "passed"
        )
        counts[name][key] += 1
        bad = kids.get("failure") if "failure" in kids else kids.get("error")
        if bad is not None and not counts[name]["reason"]:
            message = (bad.get("message") or "").strip()
            for hint in ("no implementation to grade", "rejected before it runs", "while it was graded"):
                if hint in message or hint in (bad.text or ""):
                    counts[name]["reason"] = (
                        " ".join(line.strip() for line in message.splitlines()[:2])[:300] if message else hint
                    )
                    break
    return student.name, counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Grade every student folder under SUBMISSIONS with the course's autograders."
    )
    p.add_argument("submissions", type=Path, help="a folder with one folder per student")
    p.add_argument(
        "--out", type=Path, default=Path("grades"), help="where the JUnit XML reports, logs and grades.csv go"
    )
    p.add_argument("--assignments", nargs="+", default=None, help="grade only these assignments (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="students graded at a time")
    p.add_argument("--timeout", type=float, default=None, help="seconds per student before the run is stopped")
    args = p.parse_args(argv)
    known = assignment_names()
    assignments = args.assignments or known
    unknown = sorted(set(assignments) - set(known))
    if unknown:
        p.error(f"unknown assignments {unknown}; known: {known}")
    students = sorted(d for d in args.submissions.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not students:
        p.error(f"no student folders in {args.submissions}")
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(
            pool.map(lambda s: grade_one(s.resolve(), args.out.resolve(), assignments, args.timeout), students)
        )
    rows = []
    for student, counts in results:
        for a in assignments:
            c = counts[a]
            run = c["passed"] + c["failed"] + c["errors"]
            rows.append(dict(student=student, assignment=a, **c, score=round(c["passed"] / run, 3) if run else 0.0))
    with open(args.out / "grades.csv", "w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=["student", "assignment", "passed", "failed", "errors", "skipped", "score", "reason"]
        )
        writer.writeheader()
        writer.writerows(rows)
    width = max(len(s) for s, _ in results)
    print(f"{'student':<{width}}  " + "  ".join(a.split("_")[0] for a in assignments))
    for student, _ in results:
        scores = [r["score"] for r in rows if r["student"] == student]
        print(
            f"{student:<{width}}  "
            + "  ".join(f"{s:.2f}".rjust(len(a.split("_")[0])) for s, a in zip(scores, assignments))
        )
    print(f"wrote {args.out / 'grades.csv'} and one JUnit XML report per student in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
