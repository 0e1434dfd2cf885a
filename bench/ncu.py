"""One measured call under Nsight Compute: DRAM bytes read and written by every kernel it launches.

How a case is measured (:func:`measure`): a child process (``python -m bench.ncu --child SPEC``) builds
the inputs, runs the call twice outside any NVTX range (JIT compilation, allocator warm-up), then once
inside the range :data:`RANGE`; ``ncu`` profiles only the kernels launched inside that range
(``--nvtx --nvtx-include RANGE/``) and reports ``dram__bytes_read.sum`` and ``dram__bytes_write.sum``
per kernel, which are summed. ncu's defaults stay: ``--cache-control all`` flushes the caches before
each profiled kernel, so each kernel starts with a cold L2, and kernel replay restores memory between
passes. ``--clock-control none`` leaves the GPU's clocks alone (bytes do not depend on them).

One ncu run per case keeps the attribution of kernels to cases trivial; the price is a process start
and JIT compilation per case.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

from . import common

RANGE = "numba_flash_measure"
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
#: Multipliers of the units ncu may print (``--print-units base`` asks for bytes).
UNITS = {
    "byte": 1,
    "bytes": 1,
    "b": 1,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


def find_ncu() -> str | None:
    """``$NCU``, ``ncu`` on the PATH, or the CUDA toolkit's (``/usr/local/cuda*/bin/ncu``)."""
    if os.environ.get("NCU"):
        return os.environ["NCU"] if os.path.exists(os.environ["NCU"]) else None
    for cand in [
        shutil.which("ncu"),
        "/usr/local/cuda/bin/ncu",
        *sorted(glob.glob("/usr/local/cuda-*/bin/ncu"), reverse=True),
    ]:
        if cand and os.path.exists(cand):
            return cand
    return None


def ncu_version(ncu: str) -> str | None:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
        return out.strip().splitlines()[-1] if out.strip() else None
    except Exception:
        return None


def ncu_args(log_file: str, base_units: bool = True) -> list[str]:
    """The ncu options (without the executable and the profiled command)."""
    args = [
        "--csv",
        "--metrics",
        ",".join(METRICS),
        "--nvtx",
        "--nvtx-include",
        f"{RANGE}/",
        "--clock-control",
        "none",
        "--log-file",
        log_file,
    ]
    return args + (["--print-units", "base"] if base_units else [])


def _value(text: str) -> float:
    return float(text.replace(",", "").strip())


def parse_csv(text: str) -> list[dict]:
    """Per-kernel DRAM bytes from ncu's CSV report: ``[{"id", "kernel", "read", "write"}, ...]``.

    Lines before the header (``"ID","Process ID",...``) and after the table (``==PROF==`` messages,
    program output) are ignored; values may carry thousands separators; units are converted to bytes.
    """
    lines = text.splitlines()
    start = next((n for n, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    table = [lines[start]] + [ln for ln in lines[start + 1 :] if ln.startswith('"')]
    kernels: dict = {}
    for row in csv.DictReader(io.StringIO("\n".join(table))):
        name = row.get("Metric Name")
        if name not in METRICS:
            continue
        unit = (row.get("Metric Unit") or "byte").strip().lower()
        if unit not in UNITS:
            raise ValueError(f"ncu reported {name} in unknown unit {row.get('Metric Unit')!r}")
        k = kernels.setdefault(
            row.get("ID"), {"id": row.get("ID"), "kernel": row.get("Kernel Name"), "read": 0.0, "write": 0.0}
        )
        k["read" if name == METRICS[0] else "write"] += _value(row["Metric Value"]) * UNITS[unit]
    return list(kernels.values())


def measure(spec: dict, ncu: str, timeout: float = 1800) -> dict:
    """Run one case under ncu; returns its DRAM bytes, per-kernel rows, the child's meta data and errors."""
    with tempfile.TemporaryDirectory() as tmp:
        log, meta_path = os.path.join(tmp, "ncu.csv"), os.path.join(tmp, "meta.json")
        child = [sys.executable, "-m", "bench.ncu", "--child", json.dumps(spec), "--meta-out", meta_path]
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(common.ROOT), os.environ.get("PYTHONPATH", "")) if p)
        )
        result = {}
        for base_units in (True, False):  # an ncu too old for --print-units: retry without it
            cmd = [ncu, *ncu_args(log, base_units), *child]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.ROOT, env=env, timeout=timeout)
            except subprocess.TimeoutExpired:
                return {
                    "error": f"timed out after {timeout:.0f} s under ncu",
                    "kernels": [],
                    "dram_read_bytes": None,
                    "dram_write_bytes": None,
                    "dram_bytes": None,
                }
            if proc.returncode != 0 and base_units and "print-units" in (proc.stderr + proc.stdout):
                continue
            break
        text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else proc.stdout
        kernels = parse_csv(text) or parse_csv(proc.stdout)
        meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
        result.update(meta)
        result["kernels"] = kernels
        result["dram_read_bytes"] = sum(k["read"] for k in kernels) if kernels else None
        result["dram_write_bytes"] = sum(k["write"] for k in kernels) if kernels else None
        result["dram_bytes"] = (result["dram_read_bytes"] + result["dram_write_bytes"]) if kernels else None
        if proc.returncode != 0 or not kernels or meta.get("error"):
            tail = (meta.get("error") or "") + "\n" + (proc.stderr or "")[-1500:] + (text or "")[-1500:]
            result["error"] = f"ncu exit {proc.returncode}; {len(kernels)} kernel(s) profiled: " + tail.strip()
        return result


def command_line(ncu: str = "ncu") -> str:
    """The ncu command as a string (for the results file's provenance)."""
    return " ".join([ncu, *ncu_args("LOG"), "python -m bench.ncu --child SPEC"])


# ----------------------------------------------------------------------------------------------
# The child: one case, its measured call inside the NVTX range
# ----------------------------------------------------------------------------------------------
def tc_forward_with_features(spec: dict):
    """The call of a case whose spec names ``features``: the 3xTF32 forward's kernel module with those features over its
    defaults (``flash_attn_func`` takes none), as ``bench.fa2_sweep`` runs its variants; ``block_sizes`` as there. Only
    ``{"algorithm": "flash2", "variant": "tensorcore", "pass": "forward"}`` takes features (ValueError otherwise).
    ``run_pending.sh ncu_split_kv`` profiles ``SPLIT_KV`` off and on this way."""
    if (spec["algorithm"], spec.get("variant"), spec["pass"]) != ("flash2", "tensorcore", "forward"):
        raise ValueError(
            "features: only the flash2 tensorcore forward takes them, got "
            f"{spec['algorithm']!r} / {spec.get('variant')!r} / {spec['pass']!r}"
        )
    from numba_flash.tensorcore import fa2_forward_tf32

    from bench.fa2_sweep import run_variant

    q, k, v = common.make_inputs(spec["batch"], spec["nheads"], spec["N"], spec["d"], as_torch=True)
    bs = spec.get("block_sizes")  # Dev: (Br, Bc) as flash_attn_func takes them; fa2_sweep's tc variants name (NW, MW,
    # Bc)
    cfg = ("tc", None) if bs is None else ("tc", fa2_forward_tf32.config_for(spec["d"], tuple(bs))[:3])
    feats, causal = dict(spec["features"]), bool(spec.get("causal", False))
    return lambda: run_variant("ncu", cfg, feats, q, k, v, causal)


#: The ``algorithm`` of a case that profiles torch SDPA's memory-efficient forward, the kernel the float32 grid compares
#: ours with (``run_pending.sh ncu_sdpa_short``)
SDPA = "sdpa_mem_efficient"


def sdpa_forward(spec: dict):
    """The call of a case whose ``algorithm`` is :data:`SDPA`: torch SDPA's memory-efficient forward on the case's
    inputs (``bench.common.torch_sdpa_mem_efficient``, as the grid and ``bench.fa2_sweep`` time it), without grad. Its
    tiling is torch's: ncu's launch statistics report it. Only the forward (ValueError for another ``pass``)."""
    if spec["pass"] != "forward":
        raise ValueError(f"{SDPA}: only the forward pass is profiled, got pass {spec['pass']!r}")
    import torch

    q, k, v = common.make_inputs(
        spec["batch"], spec["nheads"], spec["N"], spec["d"], dtype=spec.get("dtype", "float32"), as_torch=True
    )
    causal = bool(spec.get("causal", False))

    def fn():
        with torch.no_grad():
            return common.torch_sdpa_mem_efficient(q, k, v, causal=causal)

    return fn


def run_child(spec: dict) -> dict:
    """Build the case, warm it up, run it once inside :data:`RANGE`; return meta data for the parent."""
    import numpy as np
    import torch

    alg, variant, pass_ = spec["algorithm"], spec.get("variant"), spec["pass"]
    b, h, N, d = spec["batch"], spec["nheads"], spec["N"], spec["d"]
    mask = np.asarray(spec["mask"], dtype=bool) if spec.get("mask") is not None else None
    if alg == SDPA:
        fn = sdpa_forward(spec)
    elif spec.get("features") is not None:
        fn = tc_forward_with_features(spec)
    else:
        fn = common.prepare(
            alg,
            variant,
            pass_,
            b,
            h,
            N,
            d,
            mask=mask,
            block_sizes=spec.get("block_sizes"),
            dtype=spec.get("dtype", "float32"),
            causal=bool(spec.get("causal", False)),
        )
    for _ in range(int(spec.get("warmup", 2))):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(RANGE)
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    meta = {"ok": True}
    for p in ("forward", "backward") if pass_ == "fwd+bwd" else (pass_,):
        if alg == SDPA:
            tile, src = None, "torch SDPA's own (ncu's launch statistics)"
        elif spec.get("block_sizes") is not None:
            tile, src = tuple(spec["block_sizes"]), "argument"
        elif spec.get("causal"):  # Dev: causal defaults depend on N (the 3xTF32 forward's): not introspected here
            tile, src = None, "causal default (not introspected: give block_sizes)"
        else:
            tile, src = common.tiles(alg, variant, p, d)
        meta[f"tiles_{p}"], meta["tiles_source"] = (list(tile) if tile else None), src
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="child process of bench.ncu.measure (run under ncu)")
    ap.add_argument("--child", required=True, help="the case, as JSON")
    ap.add_argument("--meta-out", required=True)
    args = ap.parse_args(argv)
    try:
        meta = run_child(json.loads(args.child))
    except Exception as exc:  # reported to the parent, which records it beside the case
        meta = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    with open(args.meta_out, "w") as fh:
        json.dump(meta, fh)
    return 0 if meta.get("ok") else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
