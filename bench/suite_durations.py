"""The test suite's duration per file, from a pytest JUnit XML, and the quick tier of the simulator it suggests.

Record a run (two workers, as the README's command)::

    python -m pytest -n 2 --junitxml=/tmp/suite.xml
    python -m bench.suite_durations /tmp/suite.xml --out docs/results/suite_durations.json

The results file holds the wall time per file summed over its tests (seconds of one worker), the
number of tests that ran and were skipped, and the provenance (machine, versions, commit), so that a
file that grows is visible in the diff of the next record.

``--plan`` prints the rule of ``tests/quick_tier.py`` applied to the run: for each test of
``tests/kernels/`` (barrier and grid-limit tests excepted) whose cases took 15 s or more in all, one case per
kernel (the ids' kernel tokens: readable, fast, tensorcore0..2, fp16, bf16, atomic, deterministic, the
algorithm), the cheapest, and every case of a readable kernel; for the head-dim test the d = 256 cases. The other cases
are the exhaustive tier: skipped in the simulator unless ``--runslow``, always run on a GPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import xml.etree.ElementTree as ET

#: Tokens of a parametrize id that name a kernel (or a kernel's mode): the quick tier keeps one case of each.
KERNEL_TOKENS = frozenset(
    {"readable", "fast", "standard", "flash1", "flash2", "fp16", "bf16", "atomic", "deterministic"}
)
_TENSORCORE = re.compile(r"tensorcore\d*$")
PLAN_MIN_SECONDS = 15.0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", help="the JUnit XML of a pytest run (--junitxml)")
    ap.add_argument("--out", help="write the per-file record (JSON) here")
    ap.add_argument("--plan", action="store_true", help="print the quick tier this run suggests (tests/quick_tier.py)")
    return ap


def _path(classname: str) -> str:
    parts = classname.split(".")
    if parts[-1][:1].isupper():  # a test class
        parts = parts[:-1]
    return "/".join(parts) + ".py"


def cases(junit: str) -> list[dict]:
    """One dict per test case of the XML: ``path``, ``function``, ``id`` (the parametrize id or ""), ``seconds``,
    ``skipped``."""
    out = []
    for tc in ET.parse(junit).iter("testcase"):
        name = tc.get("name")
        function, _, rest = name.partition("[")
        out.append(
            {
                "path": _path(tc.get("classname")),
                "function": function,
                "id": rest[:-1] if rest else "",
                "seconds": float(tc.get("time") or 0.0),
                "skipped": tc.find("skipped") is not None,
            }
        )
    return out


def per_file(rows) -> dict:
    files = collections.defaultdict(lambda: {"seconds": 0.0, "ran": 0, "skipped": 0})
    for r in rows:
        f = files[r["path"]]
        f["seconds"] += r["seconds"]
        f["skipped" if r["skipped"] else "ran"] += 1
    return {
        k: {**v, "seconds": round(v["seconds"], 2)} for k, v in sorted(files.items(), key=lambda kv: -kv[1]["seconds"])
    }


def _kernel_key(case_id: str) -> tuple:
    return tuple(t for t in case_id.split("-") if t in KERNEL_TOKENS or _TENSORCORE.match(t))


def plan(rows) -> dict[str, list[str]]:
    """The quick tier the run suggests: ``"path::function"`` -> the ids kept in the simulator (rule: module doc)."""
    tests = collections.defaultdict(list)
    for r in rows:
        if r["id"] and not r["skipped"]:
            tests[(r["path"], r["function"])].append(r)
    keep = {}
    for (path, function), rs in tests.items():
        if (
            not path.startswith("tests/kernels/")
            or "barriers" in path
            or "launch_limits" in path
            or len(rs) < 2
            or sum(r["seconds"] for r in rs) < PLAN_MIN_SECONDS
        ):
            continue
        if "head_dims" in path:
            kept = sorted(r["id"] for r in rs if r["id"].startswith("256-"))
        else:
            by = collections.defaultdict(list)
            for r in rs:
                by[_kernel_key(r["id"])].append(r)
            kept = {min(g, key=lambda r: r["seconds"])["id"] for g in by.values()}
            # every case of a readable kernel stays (they cost a second or less, and the bug gallery's tests are among
            # them)
            kept = sorted(kept | {r["id"] for r in rs if "readable" in r["id"].split("-")})
        if len(kept) < len(rs):
            keep[f"{path}::{function}"] = kept
    return dict(sorted(keep.items()))


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    rows = cases(args.junit)
    files = per_file(rows)
    total = sum(f["seconds"] for f in files.values())
    for path, f in list(files.items())[:25]:
        print(f"{f['seconds']:8.1f} s {f['ran']:5d} ran {f['skipped']:4d} skipped  {path}")
    print(f"{total:8.1f} s in {len(files)} files (summed over the workers)")
    if args.out:
        from bench import common

        record = {
            "provenance": common.provenance(),
            "junit": args.junit,
            "total_seconds": round(total, 1),
            "files": files,
        }
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")
        print(f"wrote {args.out}")
    if args.plan:
        keep = plan(rows)
        saved = sum(
            r["seconds"]
            for r in rows
            if f"{r['path']}::{r['function']}" in keep and r["id"] not in keep[f"{r['path']}::{r['function']}"]
        )
        print(
            f"\n# quick tier: {len(keep)} tests, {saved:.0f} s of {total:.0f} s to the exhaustive tier", file=sys.stderr
        )
        print(json.dumps(keep, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
