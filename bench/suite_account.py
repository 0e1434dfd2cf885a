"""Which tests of a GPU suite ran, in one or more pytest logs: counts by outcome, and the collected tests no log
reports.

A GPU suite larger than one call of the device tool runs in parts (``bench/gpu/run_suite.sh``'s parts, then the tests a
cut part did not reach, by node id). This reads the parts' verbose logs (``pytest -v``, with or without pytest-xdist)
and a collection (``pytest --collect-only -q``, one node id a line) and says, per test, whether some log reports its
outcome. So "the suite ran at commit X" is a count from a command, and the tests left unrun are named.

Run from the repository root::

    python -m bench.suite_account OUT/gpu_suite_kernels_a.log OUT/gpu_suite_kernels_b.log --collected ids.txt

(``collected.txt``: ``pytest --collect-only -q tests/kernels``; the run at 3c239e5 read
``docs/results/gpu_runs/gpu_suite_kernels_*_h200_3c239e5*.log`` and ``gpu_collect_kernels_h200_3c239e5.txt``, last in
the tree at e0e5a9b)

Exit status: 0 when every collected test has an outcome and none failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
#: ``[gw3] [ 42%] PASSED tests/x.py::t[a b]`` (pytest-xdist) and ``tests/x.py::t[a b] PASSED [ 42%]`` or
#: ``tests/x.py::t SKIPPED (reason) [ 42%]`` (one process)
_ALT = "|".join(OUTCOMES)
_XDIST = re.compile(r"^\[gw\d+\] \[ *\d+%\] (" + _ALT + r") (.+?)\s*$")
_PLAIN = re.compile(r"^(\S.*?::.+?) (" + _ALT + r")(?: \(.*\))?\s+\[ *\d+%\]\s*$")  # Dev: -v adds "(reason)" to a skip


def outcomes(lines) -> dict:
    """Node id -> the outcomes the log lines report for it (in order; a test rerun in a second log has two)."""
    got: dict = {}
    for line in lines:
        m = _XDIST.match(line)
        if m:
            got.setdefault(m.group(2), []).append(m.group(1))
            continue
        m = _PLAIN.match(line)
        if m:
            got.setdefault(m.group(1), []).append(m.group(2))
    return got


def account(reported: dict, collected=None) -> dict:
    """Counts by final outcome (a test's last report), the failed ids (FAILED, ERROR, and XPASS: an expected failure
    that passed), and, given the ``collected`` ids, those no log reports and those reported but not collected."""
    final = {k: v[-1] for k, v in reported.items()}
    out = {
        "counts": Counter(final.values()),
        "failed": sorted(k for k, v in final.items() if v in ("FAILED", "ERROR", "XPASS")),
    }
    if collected is not None:
        ids = set(collected)
        out["unrun"] = sorted(ids - set(final))
        out["extra"] = sorted(set(final) - ids)
    return out


def _lines(paths):
    """The lines of the files ``paths``, one file after another."""
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            yield from fh


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", help="pytest -v logs, in the order they ran (a later report of a test wins)")
    p.add_argument(
        "--collected", action="append", default=[], help="pytest --collect-only -q output (node ids); repeatable"
    )
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    reported = outcomes(_lines(args.logs))
    collected = None
    if args.collected:
        collected = []
        for path in args.collected:
            with open(path, encoding="utf-8") as fh:
                collected += [line.strip() for line in fh if "::" in line]
    got = account(reported, collected)
    print(
        f"reported: {sum(got['counts'].values())} tests in {len(args.logs)} logs: "
        + ", ".join(f"{n} {k.lower()}" for k, n in sorted(got["counts"].items()))
    )
    for k in got["failed"]:
        print(f"  failed: {k}")
    if collected is not None:
        print(
            f"collected: {len(set(collected))}; no outcome in any log: {len(got['unrun'])}; reported but not "
            "collected: "
            f"{len(got['extra'])}"
        )
        for k in got["unrun"]:
            print(f"  unrun: {k}")
        for k in got["extra"]:
            print(f"  not collected: {k}")
    return 1 if got["failed"] or (collected is not None and got["unrun"]) else 0


if __name__ == "__main__":
    sys.exit(main())
