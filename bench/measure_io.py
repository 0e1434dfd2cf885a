"""``python -m numba_flash io --measure``: DRAM bytes measured with Nsight Compute beside the IO model.

For every algorithm (standard, FlashAttention, FlashAttention-2, block-sparse) and kernel variant,
on FA1 Figure 2's GPT-2 medium shape (batch 64, 16 heads, N = 1024, d = 64, fp32) forward and
backward, and on a forward sweep over N at a fixed number of tokens, one call runs under ``ncu``
(:mod:`bench.ncu`) and the DRAM bytes read and written by all its kernels are put beside:

* the IO model's count at the tiles the kernels use (:func:`bench.common.model_count`; for block-sparse
  the kernels' exact count, and the paper's beside it),
* the compulsory traffic (inputs read once, outputs written once: no algorithm can do with less),
* the bytes of K and V of one head, against the L2 size recorded from the device.

Where the model counts re-reads (FA1's passes over O, FA2's passes over K and V) and the data re-read
is small enough to stay in the L2 between uses, DRAM sees less than the model: the model counts
accesses to "HBM" with no cache in between. Where the re-read data is too large for the L2, or the
re-reads are far apart in time, measured and model agree. The sweep over N is there to show both.

Run on a GPU (from the repository root)::

    python -m numba_flash io --measure --out docs/results/io_measured.json            # everything
    python -m numba_flash io --measure --part gpt2 --out docs/results/io_measured.json  # one part
    python -m numba_flash io --measure --dry-run                                       # list the cases

Parts write into the same file (cases already there are replaced). In the simulator the command prints
one line and exits with status 2 (``--dry-run`` works everywhere).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import common

GPT2 = {"batch": 64, "nheads": 16, "N": 1024, "d": 64}
#: The forward sweep: 16k tokens at 16 heads up to N = 16384 (K, V of one head: 0.5 to 8 MiB), then
#: N = 65536 at 4 heads and N = 131072 at 2 heads (32 and 64 MiB per head: about and above an H100's or
#: H200's 50 MB L2).
SWEEP = [
    {"batch": 16, "nheads": 16, "N": 1024, "d": 64},
    {"batch": 4, "nheads": 16, "N": 4096, "d": 64},
    {"batch": 1, "nheads": 16, "N": 16384, "d": 64},
    {"batch": 1, "nheads": 4, "N": 65536, "d": 64},
    {"batch": 1, "nheads": 2, "N": 131072, "d": 64},
]
#: Largest N at which the sweep runs standard attention (N x N matrices) and FA1 (one block per head).
SWEEP_MAX_N = {"standard": 16384, "flash1": 16384}
PARTS = ("gpt2", "sweep")


def _mask_spec(pattern: str, N: int):
    Tr = -(-N // common.BLOCK_SPARSE_TILES[0])
    mask = common.block_mask(pattern, Tr, Tr)
    return {"pattern": pattern, "density": float(mask.mean())}, mask.astype(int).tolist()


def cases(parts=PARTS, only=None) -> list[dict]:
    """The measured cases of the chosen parts (and algorithms), in run order."""
    out = []
    algs = [a for a in common.ALGORITHMS if not only or a in only]
    if "gpt2" in parts:
        for alg in algs:
            for variant in common.VARIANTS[alg]:
                for pass_ in ("forward", "backward"):
                    if pass_ == "backward" and (alg, variant) in common.FORWARD_ONLY:
                        continue
                    patterns = ("butterfly", "dense") if alg == "block-sparse" else (None,)
                    for pattern in patterns:
                        spec = {"part": "gpt2", "algorithm": alg, "variant": variant, "pass": pass_, **GPT2}
                        if pattern:
                            spec["mask_info"], spec["mask"] = _mask_spec(pattern, GPT2["N"])
                        out.append(spec)
    if "sweep" in parts:
        for shape in SWEEP:
            for alg, variant in (("standard", None), ("flash1", "fast"), ("flash2", "fast"), ("flash2", "tensorcore")):
                if alg not in algs or shape["N"] > SWEEP_MAX_N.get(alg, 1 << 30):
                    continue
                out.append({"part": "sweep", "algorithm": alg, "variant": variant, "pass": "forward", **shape})
    return out


def case_key(c: dict) -> tuple:
    return (
        c["part"],
        c["algorithm"],
        c.get("variant"),
        c["pass"],
        c["batch"],
        c["nheads"],
        c["N"],
        c["d"],
        (c.get("mask_info") or {}).get("pattern"),
    )


def complete(spec: dict, measured: dict, l2_bytes=None) -> dict:
    """One result row: the case, what ncu measured, the model at the kernels' tiles, the context."""
    import numpy as np

    alg, pass_, b, h, N, d = spec["algorithm"], spec["pass"], spec["batch"], spec["nheads"], spec["N"], spec["d"]
    tiles = {}
    for p in ("forward", "backward") if pass_ == "fwd+bwd" else (pass_,):
        t = measured.get(f"tiles_{p}")
        tiles[p] = list(t) if t else (list(common.tiles(alg, spec.get("variant"), p, d)[0] or []) or None)
    mask = np.asarray(spec["mask"], bool) if spec.get("mask") is not None else None
    row = {k: v for k, v in spec.items() if k != "mask"}
    row["tiles"] = tiles
    row["tiles_source"] = measured.get("tiles_source")
    try:
        row.update(
            common.model_count(
                alg,
                pass_,
                b,
                h,
                N,
                d,
                tile=tiles.get("forward") or tiles.get("backward"),
                bwd_tile=tiles.get("backward"),
                mask=mask,
            )
        )
    except Exception as exc:  # a model that cannot be evaluated is reported, not fatal
        row["model_error"] = f"{type(exc).__name__}: {exc}"
    row["compulsory_bytes"] = common.compulsory_bytes(pass_, b, h, N, d)
    row["kv_bytes_per_head"] = 2 * N * d * common.ITEMSIZE
    row["l2_bytes"] = l2_bytes
    for key in ("dram_read_bytes", "dram_write_bytes", "dram_bytes", "kernels", "error"):
        if measured.get(key) is not None:
            row[key] = measured[key]
    if row.get("dram_bytes") and row.get("model_bytes"):
        row["measured_over_model"] = row["dram_bytes"] / row["model_bytes"]
        row["measured_over_compulsory"] = row["dram_bytes"] / row["compulsory_bytes"]
    return row


def _gb(x) -> str:
    return "-" if x is None else f"{x / 1e9:8.3f}"


def format_rows(rows: list[dict]) -> str:
    head = (
        f"{'part':<6} {'algorithm':<12} {'variant':<10} {'pass':<8} {'b':>3} {'h':>3} {'N':>6} {'tiles':>11} "
        f"{'read GB':>8} {'write GB':>8} {'model GB':>8} {'meas/model':>10} {'compuls. GB':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.get("tiles", {}).get(r["pass"]) if r["pass"] != "fwd+bwd" else None
        tiles = f"{t[0]}x{t[1]}" if t else "-"
        ratio = f"{r['measured_over_model']:10.2f}" if r.get("measured_over_model") else f"{'-':>10}"
        alg = r["algorithm"] + (f"/{r['mask_info']['pattern'][:4]}" if r.get("mask_info") else "")
        lines.append(
            f"{r['part']:<6} {alg:<12} {str(r.get('variant') or '-'):<10} {r['pass']:<8} {r['batch']:>3} "
            f"{r['nheads']:>3} "
            f"{r['N']:>6} {tiles:>11} {_gb(r.get('dram_read_bytes'))} {_gb(r.get('dram_write_bytes'))} "
            f"{_gb(r.get('model_bytes'))} {ratio} {_gb(r.get('compulsory_bytes')):>11}"
            + (f"  ERROR: {r['error'].splitlines()[0][:80]}" if r.get("error") else "")
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m numba_flash io --measure", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", default="io_measured.json", help="results file (JSON); parts merge into it")
    ap.add_argument(
        "--part",
        choices=(*PARTS, "all"),
        default="all",
        help="gpt2 (fwd and bwd, every variant), sweep (forward over N) or all",
    )
    ap.add_argument(
        "--only", action="append", choices=common.ALGORITHMS, help="measure only this algorithm (repeatable)"
    )
    ap.add_argument("--dry-run", action="store_true", help="list the cases and the ncu command; measure nothing")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per case under ncu")


def run(args) -> int:
    from . import ncu as ncu_mod

    parts = PARTS if args.part == "all" else (args.part,)
    todo = cases(parts, args.only)
    if args.dry_run:
        print(f"{len(todo)} case(s); each runs as: {ncu_mod.command_line()}")
        for c in todo:
            mask = (
                f" mask={c['mask_info']['pattern']} (density {c['mask_info']['density']:.3f})"
                if c.get("mask_info")
                else ""
            )
            print(
                f"  {c['part']:<6} {c['algorithm']:<12} {str(c.get('variant') or '-'):<10} {c['pass']:<8} "
                f"b={c['batch']} h={c['nheads']} N={c['N']} d={c['d']}{mask}"
            )
        return 0
    if not common.ON_GPU:
        print(
            "io --measure needs a CUDA GPU and Nsight Compute (ncu); this is Numba's CUDA simulator: nothing measured "
            "(try --dry-run to list the cases)"
        )
        return 2
    ncu = ncu_mod.find_ncu()
    if ncu is None:
        print("io --measure: Nsight Compute (ncu) not found; set NCU=/path/to/ncu or put ncu on the PATH")
        return 2
    prov = common.provenance()
    prov["ncu"] = ncu_mod.ncu_version(ncu)
    prov["ncu_command"] = ncu_mod.command_line(ncu)
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.exists() else {}
    rows = {case_key(r): r for r in old.get("results", [])}
    t0 = time.time()
    for n, spec in enumerate(todo, 1):
        print(
            f"[{n}/{len(todo)}] {spec['algorithm']} {spec.get('variant') or ''} {spec['pass']} N={spec['N']} ...",
            flush=True,
        )
        measured = ncu_mod.measure(spec, ncu, timeout=args.timeout)
        rows[case_key(spec)] = complete(spec, measured, prov.get("l2_bytes"))
        data = {"kind": "numba_flash.measured_io", "version": 1, "provenance": prov, "results": list(rows.values())}
        common.write_json(out, data)  # after every case: a long run that stops keeps what it measured
    print(format_rows([rows[case_key(s)] for s in todo]))
    print(f"{len(todo)} case(s) in {time.time() - t0:.0f} s; written to {out}")
    return 0 if all(not rows[case_key(s)].get("error") for s in todo) else 1


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
