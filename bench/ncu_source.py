"""Where a kernel's warps wait, from Nsight Compute's source page: stall samples by reason, by SASS opcode, by loop.

``bench/gpu/run_pending.sh ncu_src`` profiles one kernel with Nsight Compute's source counters and exports the source
page as CSV (``ncu --import REPORT --page source --csv --print-source sass``): one row per SASS instruction with its
warp-state samples (all of them, and per stall reason: ``stall_wait``, ``stall_math``, ``stall_barrier``, ...) and how
many times it executed. This reads that CSV (or its ``.gz``) and prints three tables, so that a statement such as "the
S loop takes 39 % of the samples" comes from a command, not from reading 4000 rows:

* the stall reasons, each a share of all samples;
* the SASS opcodes (``HMMA``, ``FADD``, ...; the mnemonic before its first dot), each with its share of the samples, of
  the executed instructions, and its top three stall reasons;
* the kernel's *regions*: runs of consecutive instructions that executed the same number of times (a loop body, or a
  straight stretch between two branches), those with at least ``--min-share`` of the samples, by samples. A region's
  execution count divided by the kernel's count of one known region (say the key-block loop) gives its trip count.

Run from the repository root::

    python -m bench.ncu_source REPORT.csv.gz [--min-share 0.01]

(e.g. ``run_pending.sh ncu_src``'s report of the causal d = 128 forward at N = 512 on an H200,
``docs/results/ncu/ncu_src_causal_fwd_d128_n512_h200_f203c6f.csv.gz``, last in the tree at e0e5a9b:
``git show e0e5a9b:docs/results/ncu/ncu_src_causal_fwd_d128_n512_h200_f203c6f.csv.gz > REPORT.csv.gz``)
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
from collections import Counter, defaultdict

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_rows(path: str) -> list[dict]:
    """The instruction rows of a source-page CSV (``.gz`` read as gzip): dicts of the header's columns. The page opens
    with a line naming the kernel, then the header; rows without an address are skipped."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        text = fh.read()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return [r for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))) if r.get("Address")]


def opcode(source: str) -> str:
    """The mnemonic of one SASS line without its modifiers and predicate: ``@P0 HMMA.1688.F32.TF32 R4, ...`` is
    ``HMMA``."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def stall_columns(rows: list[dict]) -> list[str]:
    """The per-reason sample columns (``stall_*``, the all-samples ones, not the "(Not Issued)" ones)."""
    return [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c] if rows else []


def summarize(rows: list[dict], min_share: float = 0.01) -> dict:
    """``{"samples", "executed", "reasons": [(reason, share)], "opcodes": [(op, sample share, executed share,
    [(reason, share of the op's samples)])], "regions": [(first, last, executed each, sample share, first source)]}``,
    each list by share, largest first (regions below ``min_share`` of the samples left out)."""
    reasons = stall_columns(rows)
    total = sum(_number(r[SAMPLES]) for r in rows)
    executed = sum(_number(r[EXECUTED]) for r in rows)
    by_reason, by_op, op_exec = Counter(), Counter(), Counter()
    op_reason = defaultdict(Counter)
    regions = []
    for i, r in enumerate(rows):
        n, e, op = _number(r[SAMPLES]), _number(r[EXECUTED]), opcode(r.get("Source", ""))
        by_op[op] += n
        op_exec[op] += e
        for c in reasons:
            v = _number(r[c])
            by_reason[c] += v
            op_reason[op][c] += v
        if regions and regions[-1][2] == e:
            regions[-1][1] = i
            regions[-1][3] += n
        else:
            regions.append([i, i, e, n, r.get("Source", "").strip()])
    share = (lambda v: v / total) if total else (lambda v: 0.0)
    return {
        "samples": total,
        "executed": executed,
        "reasons": [(c.removeprefix("stall_"), share(v)) for c, v in by_reason.most_common()],
        "opcodes": [
            (
                op,
                share(v),
                op_exec[op] / executed if executed else 0.0,
                [(c.removeprefix("stall_"), x / v if v else 0.0) for c, x in op_reason[op].most_common(3)],
            )
            for op, v in by_op.most_common()
        ],
        "regions": sorted(
            ((a, b, e, share(n), src) for a, b, e, n, src in regions if share(n) >= min_share), key=lambda g: -g[3]
        ),
    }


def report(summary: dict, top: int = 16) -> str:
    """The three tables of :func:`summarize` as text."""
    out = [
        f"samples {summary['samples']:,.0f}, instructions executed {summary['executed']:,.0f}",
        "",
        "stall reason         share of samples",
    ]
    out += [f"{name:20s} {s * 100:6.1f} %" for name, s in summary["reasons"] if s >= 0.001]
    out += ["", "opcode      samples  executed  top stall reasons (share of the opcode's samples)"]
    for op, s, e, tops in summary["opcodes"][:top]:
        out.append(
            f"{op:10s} {s * 100:6.1f} %  {e * 100:6.1f} %  " + ", ".join(f"{n} {x * 100:.0f} %" for n, x in tops)
        )
    out += ["", "region (SASS rows)  instructions  executed each  samples  first instruction"]
    for a, b, e, s, src in summary["regions"]:
        out.append(f"{a:6d}-{b:<6d}       {b - a + 1:6d}  {e:13,.0f}  {s * 100:5.1f} %  {src[:60]}")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.ncu_source``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "csv", help="Nsight Compute's source page as CSV (--page source --csv --print-source sass), or .csv.gz"
    )
    ap.add_argument("--min-share", type=float, default=0.01, help="regions with at least this share of the samples")
    ap.add_argument("--top", type=int, default=16, help="opcodes to print")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    print(report(summarize(read_rows(args.csv), args.min_share), args.top))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
