"""``python -m numba_flash handout DIR``: write what students get, and check that it holds no answer.

The course material lives in ``tutorials/`` of a numba-flash checkout: the step-by-step scripts, and
per assignment a README, the student's ``stub.py``, the autograder (``test_autograder.py``) and its
data, plus the grading toolkit (``assignments/grading.py``, ``assignments/guard.py``) and pytest's
configuration. Course staff's solutions live apart, in ``tutorials/solutions/<assignment>/solution.py``
(also the staff's README there), and never go into the handout.

:func:`write_handout` copies ``tutorials/`` to ``DIR/tutorials`` without

* the ``solutions/`` folder, caches (``__pycache__``, ``.pytest_cache``, ``*.pyc``), and any file or
  folder whose name contains ``solution``;

then :func:`leaks` checks the result against the solutions it knows, and the command fails (and
removes nothing it did not write) if any of these hold:

* a path in the handout names a solution, or a package folder (``numba_flash``, ``reference``,
  ``numba_flash_reference``) was copied: the handout ships no package module at all (students
  install numba-flash itself, and the autograders reject submissions that use it);
* a file has the same content as a solution (whitespace aside);
* a file contains a quarter or more of a solution's *answer lines*: the lines of the solution that
  its stub does not have (non-blank, not comments, at least 12 characters). That catches a solution
  pasted into a tutorial or renamed, without flagging the launcher code a stub shares with its
  solution.

The handout's graders still need numba-flash installed (``pip install numba-flash[test]``, or this
repository): the backend choice and the float64 references come from it; the guard keeps submissions
from using it.

Usage::

    python -m numba_flash handout handout/                  # from a checkout of numba-flash
    python -m numba_flash handout handout/ --source path/to/tutorials --force
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

#: Folders and files never copied into a handout.
EXCLUDED_DIRS = frozenset({"solutions", "__pycache__", ".pytest_cache"})
EXCLUDED_SUFFIXES = frozenset({".pyc", ".pyo"})
#: Package folders that must never appear in a handout.
PACKAGE_DIRS = frozenset({"numba_flash", "reference", "numba_flash_reference"})
#: A handout file holding this fraction of a solution's answer lines is a leak.
LEAK_FRACTION = 0.25

STUDENT_README = """\
# FlashAttention course: handout

This folder holds the course's tutorials and assignments (stubs, autograders, data). Install
numba-flash first (it provides the kernels the tutorials read, the NumPy references and the backend
choice; no GPU is needed):

```bash
python -m pip install "numba-flash[test]"     # or: pip install -e "<numba-flash checkout>[test]"
```

Then, from this folder:

```bash
python tutorials/01_memory_hierarchy.py                       # the step-by-step tutorials
python -m pytest tutorials/assignments/a1_online_softmax      # grade your work on one assignment
cd tutorials && python -m pytest                              # every assignment
```

Your work goes into each assignment's `stub.py`. Read `tutorials/README.md` first: the path through
the papers, what each assignment grades, and the rules (a submission that imports or calls
numba-flash for the graded part is rejected by the autograder).
"""


@dataclass
class HandoutReport:
    """What :func:`write_handout` wrote: the handout folder, the files copied and the paths left out."""

    root: Path
    copied: list = field(default_factory=list)
    excluded: list = field(default_factory=list)


def default_source() -> Path:
    """``tutorials/`` of the checkout this package was installed from (an editable install)."""
    here = Path(__file__).resolve().parent
    candidate = here.parent / "tutorials"
    if not (candidate / "assignments").is_dir():
        raise FileNotFoundError(
            f"no tutorials/ next to {here}: the handout is written from a checkout of numba-flash "
            "(pip install -e .), or pass --source path/to/tutorials"
        )
    return candidate


def _excluded(rel: Path) -> bool:
    return (
        any(part in EXCLUDED_DIRS for part in rel.parts)
        or any("solution" in part.lower() for part in rel.parts)
        or rel.suffix in EXCLUDED_SUFFIXES
    )


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def _answer_lines(solution: Path, stub: Path | None) -> set[str]:
    lines = {s for s in _lines(solution.read_text(encoding="utf-8")) if len(s) >= 12 and not s.startswith("#")}
    if stub is not None and stub.is_file():
        lines -= set(_lines(stub.read_text(encoding="utf-8")))
    return lines


def solution_files(source: Path) -> dict[str, Path]:
    """``{assignment: solution file}`` from ``source/solutions/<assignment>/*.py`` (and ``<assignment>.py``)."""
    root = Path(source) / "solutions"
    found = {}
    if root.is_dir():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            found[rel.parts[0] if len(rel.parts) > 1 else path.stem] = path
    return found


def leaks(handout: Path, source: Path) -> list[str]:
    """Reasons the handout folder ``handout`` (a copy of ``source``, i.e. of ``tutorials/``) leaks an answer."""
    handout, source = Path(handout), Path(source)
    problems = []
    solutions = solution_files(source)
    texts = {name: path.read_text(encoding="utf-8") for name, path in solutions.items()}
    normalized = {name: "\n".join(s for s in _lines(t) if s) for name, t in texts.items()}
    answers = {name: _answer_lines(path, source / "assignments" / name / "stub.py") for name, path in solutions.items()}
    for path in sorted(handout.rglob("*")):
        rel = path.relative_to(handout)
        if any("solution" in part.lower() for part in rel.parts):
            problems.append(f"{rel}: a path that names a solution")
        if path.is_dir() and path.name in PACKAGE_DIRS:
            problems.append(
                f"{rel}: a package folder in the handout (students install numba-flash; its modules answer exercises)"
            )
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        flat = "\n".join(s for s in _lines(text) if s)
        lines = set(_lines(text))
        for name in solutions:
            if flat == normalized[name]:
                problems.append(f"{rel}: the same content as the solution of {name}")
            elif answers[name]:
                shared = answers[name] & lines
                if len(shared) >= LEAK_FRACTION * len(answers[name]):
                    problems.append(
                        f"{rel}: holds {len(shared)} of the {len(answers[name])} answer lines of the solution of {name}"
                    )
    return problems


def write_handout(dest, source=None, force: bool = False) -> HandoutReport:
    """Copy ``source`` (default :func:`default_source`) to ``dest/tutorials`` without solutions; check it.

    Raises ``FileExistsError`` if ``dest/tutorials`` exists (unless ``force``) and ``RuntimeError``
    listing the leaks if the check fails.
    """
    source = default_source() if source is None else Path(source).resolve()
    dest = Path(dest)
    target = dest / "tutorials"
    if target.exists():
        if not force:
            raise FileExistsError(f"{target} exists (use --force to replace it)")
        shutil.rmtree(target)
    report = HandoutReport(root=dest)
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if _excluded(rel):
            if not any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):  # report the top of each excluded tree once
                report.excluded.append(rel)
            continue
        out = target / rel
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)
            report.copied.append(rel)
    (dest / "README.md").write_text(STUDENT_README, encoding="utf-8")
    problems = leaks(target, source)
    if problems:
        raise RuntimeError("the handout leaks answers:\n  " + "\n  ".join(problems))
    return report


def main(args) -> int:
    """The ``handout`` subcommand (``args.dir``, ``args.source``, ``args.force``)."""
    try:
        report = write_handout(args.dir, args.source, force=args.force)
    except (FileExistsError, FileNotFoundError, RuntimeError) as exc:
        print(f"handout: {exc}")
        return 1
    assignments = sorted({p.parts[1] for p in report.copied if len(p.parts) > 2 and p.parts[0] == "assignments"})
    print(
        f"wrote {len(report.copied)} files to {report.root / 'tutorials'} ({len(assignments)} assignments: "
        f"{', '.join(assignments)})"
    )
    print(
        "left out: " + ", ".join(str(p) for p in report.excluded if "__pycache__" not in p.parts) or "left out: nothing"
    )
    print("checked: no solution file, no solution content, no package module")
    return 0
