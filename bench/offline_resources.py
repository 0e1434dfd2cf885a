"""Offline sm_90 resource report of the fast kernels: registers, spills, local memory, SASS size.

No GPU is needed. Each fast kernel is compiled for its DEFAULT configuration (``config_for(d)``, the
GPU's default features: shuffles, 16-byte loads, prefetch, dropout off; for the
tensor-core forward ``fa2_forward_tc_kernel`` with ``SIM=False`` and its default
prefetch) at d = 64 and d = 128, causal and not (the 3xTF32 backward's causal rows with its key-block order,
``HEAVY_FIRST``, as its plan launches them; before 2026-11-27's commit that added this sentence they compiled it off):

1. ``cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))`` (NVVM 13) gives the PTX;
2. cuda.core's ``Linker`` (nvJitLink, verbose) runs ptxas and reports registers, spill stores / loads
   and the stack frame (local memory);
3. ``nvdisasm`` disassembles the cubin; the SASS instruction count is the number of instruction
   lines (``/*0a30*/ ...;``) of the kernel, and ``SASS sha256`` the first 12 hex digits of the hash of
   those lines (addresses included, mangled symbol names left out: they hash the Python closure): equal
   hashes mean the same machine code.

A refactor that must not change what the GPU executes (for example moving register-tile code into
the device-function factories of :mod:`numba_flash.fast._regtile`) must leave every row of this table
identical (the hash column makes that an exact check, not only a count). Run it before and after and
``diff`` the outputs. From the repository root::

    PYTHONPATH=/tmp/cu13site LD_LIBRARY_PATH=/tmp/cu13site/nvidia/cu13/lib \
        NVDISASM=/tmp/cu13site/nvidia/cu13/bin/nvdisasm .venv/bin/python -m bench.offline_resources > after.txt

For "before" without touching the working tree, this file also runs by path (it imports nothing from
the ``bench`` package): put a copy of the old ``numba_flash`` package first on ``PYTHONPATH`` and run
it from outside the repository::

    cd /tmp && PYTHONPATH=/tmp/old_pkg:/tmp/cu13site LD_LIBRARY_PATH=/tmp/cu13site/nvidia/cu13/lib \
        /path/to/.venv/bin/python /path/to/repo/bench/offline_resources.py > before.txt

A full run (24 compiles, one process each) takes about 5-6 minutes on 2 cores.

Toolchain, in one command (seen working 2026-11-25 on the 2-core CPU machine, about 300 MB; one ``pip install``
for all: a second ``--target`` install into the same folder replaces its ``nvidia/`` tree)::

    python3 -m pip install -q --target /tmp/cu13site "cuda-toolkit[cudart,nvvm,nvrtc]==13.*" \
        "nvidia-nvjitlink>=13,<14" "nvidia-cuda-nvdisasm>=13,<14"

What it needs (CPU only, pip packages installed to private ``--target`` directories): ``nvidia-nvvm``,
``nvidia-nvjitlink`` and ``cuda-toolkit`` runtime bits on ``PYTHONPATH``/``LD_LIBRARY_PATH``, ``cuda-core``
importable, ``nvdisasm`` (``nvidia-cuda-nvdisasm``) found through ``$NVDISASM``, ``PATH`` or the
default ``/tmp/cu13b/nvidia/cu13/bin/nvdisasm``. When any piece is missing the script prints why and
exits with status 0 (a skip, not a failure). ``--kernel NAME`` (repeatable) restricts the report to
``alg1_forward_fast``, ``fa2_forward_fast``, ``fa2_forward_tc``, ``fa2_forward_half_f16``,
``fa2_forward_half_bf16``, ``alg4_backward_fast``,
``fa2_backward_fast``, ``fa2_backward_fast_dq``, ``fa2_backward_half_f16``, ``fa2_backward_half_bf16`` or
``fa2_backward_half_dq_bf16``, ``fa2_backward_tf32`` or ``fa2_backward_tf32_dq`` (the names of the table; the modules
are ``numba_flash/fast/alg1_forward.py`` ...); ``--d`` picks head dims; ``--sass-dir DIR`` keeps each kernel's
disassembly there (to find spill stores, ``STL``, and the loops they sit in).

``--half-tiling NW,MW,BC,CP`` (repeatable) compiles the half forward (``fa2_forward_half_f16`` / ``_bf16``) and
the 3xTF32 forward (``fa2_forward_tc``; ``CP`` 1 there where ``d % 4 == 0``) at that tiling instead of its default:
``NW`` warps of ``MW`` m16 tiles (``Br = 16 MW NW``), key block ``BC``, ``CP`` 1 for the cp.async pipeline
(``CP_ASYNC``; where ``d % 8 == 0``, as ``plan``) or 0 for the register path with prefetch; ``tiling`` in the table says
which ran. For the half backward (``fa2_backward_half_f16`` / ``_bf16``) the four numbers are ``NW,MW,BR,CP``: warps,
key m16 tiles per warp (``Bc = 16 MW NW``), query rows per step and ``CP`` 1 for the ``cp.async`` stages of Q_i, dO_i
(``CP_ASYNC``); the same for the 3xTF32 backward (``fa2_backward_tf32``). E.g. the d = 128 candidates::

    cd /tmp && PYTHONPATH=/work/main:/tmp/cu13site LD_LIBRARY_PATH=/tmp/cu13site/nvidia/cu13/lib \
        NVDISASM=/tmp/cu13site/nvidia/cu13/bin/nvdisasm .venv/bin/python /work/main/bench/offline_resources.py \
        --kernel fa2_forward_half_bf16 --d 128 --half-tiling 8,1,64,0 --half-tiling 4,2,64,1
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

KERNELS = (
    "alg1_forward_fast",
    "fa2_forward_fast",
    "fa2_forward_tc",
    "fa2_forward_half_f16",
    "fa2_forward_half_bf16",
    "alg4_backward_fast",
    "fa2_backward_fast",
    "fa2_backward_fast_dq",
    "fa2_backward_half_f16",
    "fa2_backward_half_bf16",
    "fa2_backward_half_dq_bf16",
    "fa2_backward_tf32",
    "fa2_backward_tf32_dq",
)
#: the kernels ``--half-tiling`` applies to (the others compile at their default tiling only)
TAKES_TILING = (
    "fa2_forward_tc",
    "fa2_forward_half_f16",
    "fa2_forward_half_bf16",
    "fa2_backward_half_f16",
    "fa2_backward_half_bf16",
    "fa2_backward_tf32",
)


def _gpu_backend() -> None:
    """Compile for the GPU even without one: set before anything imports ``numba.cuda`` (see
    numba_flash.runtime.backend)."""
    os.environ.setdefault("NUMBA_FLASH_BACKEND", "gpu")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"


def _skip(why: str) -> None:
    print(f"offline_resources: SKIPPED ({why})")
    sys.exit(0)


def _nvdisasm() -> str | None:
    if os.environ.get("NVDISASM"):  # an explicit choice is used or nothing
        return os.environ["NVDISASM"] if os.path.exists(os.environ["NVDISASM"]) else None
    for cand in (shutil.which("nvdisasm"), "/tmp/cu13b/nvidia/cu13/bin/nvdisasm"):
        if cand and os.path.exists(cand):
            return cand
    return None


def _toolchain() -> str:
    """The nvdisasm path, after a trivial kernel went through NVVM, nvJitLink and nvdisasm; else skip."""
    try:
        from cuda.core import Linker, LinkerOptions, ObjectCode
        from numba import cuda, float32
    except Exception as exc:  # pragma: no cover - depends on the machine
        _skip(f"numba-cuda / cuda.core not importable: {exc}")
    nvd = _nvdisasm()
    if nvd is None:
        _skip("nvdisasm not found (set NVDISASM or install nvidia-cuda-nvdisasm)")

    def probe(x):
        x[0] = float32(1.0)

    try:
        ptx, _ = cuda.compile_ptx(probe, (float32[:],), cc=(9, 0))
        cubin = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch="sm_90")).link("cubin")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
            fh.write(cubin.code)
            fh.flush()
            subprocess.run([nvd, "-c", fh.name], capture_output=True, check=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _skip(f"offline toolchain (NVVM, NVRTC, nvJitLink, nvdisasm) not usable: {first}; see the module docstring")
    return nvd


def _signatures():
    from numba import types

    f32, f64, i64, u32 = types.float32, types.float64, types.int64, types.uint32
    a4, a3 = types.Array(f32, 4, "A"), types.Array(f32, 3, "A")
    w4 = types.Array(types.int32, 4, "A")  # half words (fa2_forward_half)
    return {
        # gQ, gK, gV, gO, gl, gm, glse, scale_log2, group, causal_offset, seed, threshold, dropout_scale
        "alg1_forward_fast": (a4,) * 4 + (a3,) * 3 + (f32, i64, i64, i64, i64, f32),
        # gQ, gK, gV, gO, gL, gm, gl, scale_log2, group, causal_offset, seed, threshold, dropout_scale
        "fa2_forward_fast": (a4,) * 4 + (a3,) * 3 + (f64, i64, i64, i64, i64, f64),
        # gQ, gK, gV, gO, gL, gm, gl, scale_log2, group, causal_offset, seed, threshold, dropout_scale (as the FFMA
        # kernel)
        "fa2_forward_tc": (a4,) * 4 + (a3,) * 3 + (f64, i64, i64, i64, i64, f64),
        # the same with q, k, v, out as int32 arrays of half words
        "fa2_forward_half_f16": (w4,) * 4 + (a3,) * 3 + (f64, i64, i64, i64, i64, f64),
        "fa2_forward_half_bf16": (w4,) * 4 + (a3,) * 3 + (f64, i64, i64, i64, i64, f64),
        # gQ, gK, gV, gO, gdO, gm, gl, gDs, gdQ, gdK, gdV, tau, group, causal_offset, seed, threshold, dropout_scale
        "alg4_backward_fast": (a4,) * 5 + (a3,) * 3 + (a4,) * 3 + (f32, i64, i64, u32, u32, f32),
        # gQ, gK, gV, gdO, gm, gl, gD, gdQ, gdK, gdV, tau, c1, group, causal_offset, seed, threshold, dropout_scale
        "fa2_backward_fast": (a4,) * 4 + (a3,) * 3 + (a4,) * 3 + (f64, f64, i64, i64, i64, i64, f64),
        # gQ, gK, gV, gdO, gm, gl, gD, gdQ, tau, c1, group, causal_offset, seed, threshold, dropout_scale
        "fa2_backward_fast_dq": (a4,) * 4 + (a3,) * 3 + (a4,) + (f64, f64, i64, i64, i64, i64, f64),
        # the same with q, k, v, dO, dK, dV as half words (dQ float32 for the atomics; half words in the dQ kernel)
        "fa2_backward_half_f16": (w4,) * 4 + (a3,) * 3 + (a4, w4, w4) + (f64, f64, i64, i64, i64, i64, f64),
        "fa2_backward_half_bf16": (w4,) * 4 + (a3,) * 3 + (a4, w4, w4) + (f64, f64, i64, i64, i64, i64, f64),
        "fa2_backward_half_dq_bf16": (w4,) * 4 + (a3,) * 3 + (w4,) + (f64, f64, i64, i64, i64, i64, f64),
        # the 3xTF32 backward: float32 gQ, gK, gV, gdO, gm, gl, gD, gdQ, gdK, gdV and the same scalars
        "fa2_backward_tf32": (a4,) * 4 + (a3,) * 3 + (a4,) * 3 + (f64, f64, i64, i64, i64, i64, f64),
        # its deterministic dQ kernel: as the FFMA one's
        "fa2_backward_tf32_dq": (a4,) * 4 + (a3,) * 3 + (a4,) + (f64, f64, i64, i64, i64, i64, f64),
    }


def _features(module) -> dict:
    """``module``'s default features, with those of ``--features`` over them."""
    return {**module.default_features(), **json.loads(os.environ.get("NUMBA_FLASH_OFFLINE_FEATURES", "{}"))}


def _forward_tiling(module, d: int, tiling=None):
    """``(NW, MW, BC, DP, features, PREFETCH, CP_ASYNC)`` of the 3xTF32 or half forward ``module`` at head dim ``d``,
    as its ``plan`` chooses them: the default tiling, or ``tiling = (NW, MW, BC, CP)`` (``--half-tiling``)."""
    f = _features(module)
    NW, MW, BC, DP = module.config_for(d)
    if tiling is not None:
        NW, MW, BC, cp = tiling
        f["CP_ASYNC"] = bool(cp)
    cp_async = bool(f["CP_ASYNC"]) and module.cp_async_ok(d)
    prefetch = f["PREFETCH"] if f["PREFETCH"] is not None else DP <= 64
    return NW, MW, BC, DP, f, bool(prefetch) and not cp_async, cp_async


def _backward_tiling(config, cp_async, tiling=None):
    """``(NW, MW, BR, DP, cp_async)`` of a backward: its default ``config`` and ``CP_ASYNC``, or ``tiling``
    ``(NW, MW, BR, CP)``: warps, key m16 tiles per warp (``Bc = 16 MW NW``), query rows per step, cp.async 1/0."""
    if tiling is None:
        return (*config, bool(cp_async))
    NW, MW, BR, cp = tiling
    return NW, MW, BR, config[3], bool(cp)


def _kernel(name: str, d: int, causal: bool, tiling=None):
    """The dispatcher of ``name`` in its default configuration at head dim ``d`` (dropout off); ``tiling``
    ``(NW, MW, BC, CP)``: the half or 3xTF32 forward at that tiling (see ``--half-tiling``)."""
    from numba_flash.fast import _plan
    from numba_flash.fast import alg1_forward as A1
    from numba_flash.fast import alg4_backward as A4
    from numba_flash.fast import fa2_backward as B2
    from numba_flash.fast import fa2_forward as F2
    from numba_flash.tensorcore import fa2_backward_half as HB
    from numba_flash.tensorcore import fa2_backward_tf32 as TB
    from numba_flash.tensorcore import fa2_forward_half as H
    from numba_flash.tensorcore import fa2_forward_tf32 as TC

    if name == "alg1_forward_fast":
        f = A1.default_features()
        return A1.alg1_forward_fast_kernel(*A1.config_for(d), causal, False, f["SHFL"], f["VEC"])
    if name == "fa2_forward_fast":
        f = F2.default_features()
        return F2.fa2_forward_fast_kernel(
            *F2.config_for(d), causal, False, f["SHFL"], f["VEC"], f["REVERSE"], f["PREFETCH"]
        )
    if name == "fa2_forward_tc":
        NW, MW, BC, DP, f, prefetch, cp_async = _forward_tiling(TC, d, tiling)
        o_step, wide = TC.stage_o_step(f["STAGE_O_STEP"], MW, DP), TC.wide_on(f["WIDE"], DP, cp_async)
        split_kv = TC.split_kv_on(f["SPLIT_KV"], wide, (NW, MW, BC))
        return TC.fa2_forward_tc_kernel(
            NW,
            MW,
            BC,
            DP,
            causal,
            False,
            prefetch,
            False,
            cp_async,
            o_step,
            wide,
            causal and bool(f["HEAVY_FIRST"]),
            _plan.async_on(f["Q_ASYNC"], cp_async),
            TC.warp_skip_on(f["WARP_SKIP"], causal, False, DP),
            split_kv,
            TC.rescale_fma_on(f["RESCALE_FMA"], o_step, causal, (NW, MW, BC)),
        )
    if name.startswith("fa2_forward_half_"):
        NW, MW, BC, DP, f, prefetch, cp_async = _forward_tiling(H, d, tiling)
        return H.fa2_forward_half_kernel(
            NW, MW, BC, DP, causal, False, prefetch, False, name.rsplit("_", 1)[1], cp_async, bool(f["EX2_FTZ"])
        )
    if name == "alg4_backward_fast":
        f = A4.default_features()
        return A4.alg4_backward_fast_kernel(*A4.config_for(d), causal, False, False, f["VEC"])
    if name.startswith("fa2_backward_half_dq_"):
        NW, MW, BC, DP = H.config_for(d)
        return HB.fa2_backward_half_dq_kernel(
            NW,
            MW,
            BC,
            DP,
            causal,
            False,
            HB.default_features()["PREFETCH"],
            False,
            "bf16",
            bool(_features(HB)["LSE_P"]),
            bool(_features(HB)["EX2_FTZ"]),
        )
    if name.startswith("fa2_backward_half_"):
        NW, MW, BR, DP, cp_async = _backward_tiling(HB.config_for(d), HB.default_features()["CP_ASYNC"], tiling)
        red2 = _features(HB)["RED2"]
        red2 = True if red2 is None else bool(red2)  # None: as HB.plan on compute capability 9.0
        return HB.fa2_backward_half_kernel(
            NW,
            MW,
            BR,
            DP,
            causal,
            False,
            True,
            HB.default_features()["PREFETCH"],
            False,
            name.rsplit("_", 1)[1],
            bool(_features(HB)["LSE_P"]),
            red2,
            cp_async and H.cp_async_ok(d),
            bool(_features(HB)["EX2_FTZ"]),
        )  # LSE_P: the FROM_LSE kernel, as HB.plan
    if name.startswith("fa2_backward_tf32"):
        w = _features(TB)["WIDE"]  # None: as the default forward on aligned K, V (TB.plan)
        DP = 8 * ((d + 7) // 8)
        wide = TC.wide_on(_features(TC)["WIDE"], DP, TC.cp_async_ok(d)) if w is None else bool(w) and TC.wide_ok(DP)
        if name == "fa2_backward_tf32_dq":
            return TB.fa2_backward_tf32_dq_kernel(*TB.dq_config(d), causal, False, False, False, wide)
        NW, MW, BR, DP, cp_async = _backward_tiling(
            TB.config_for(d, None, causal), TB.features_for(d, {"WIDE": wide})["CP_ASYNC"], tiling
        )
        red2 = d % 2 == 0  # as TB.plan on compute capability 9.0
        # Dev: SPLIT_QDO None as the plan resolves it from SPLIT_QDO_SEQLEN query rows (every backward cell of the grid)
        split_qdo = TB.split_qdo_on(
            _features(TB)["SPLIT_QDO"], cp_async and TC.cp_async_ok(d), wide, TB.SPLIT_QDO_SEQLEN
        )
        return TB.fa2_backward_tf32_kernel(
            NW,
            MW,
            BR,
            DP,
            causal,
            False,
            True,
            False,
            False,
            red2,
            cp_async and TC.cp_async_ok(d),
            causal and bool(_features(TB)["HEAVY_FIRST"]),
            wide,
            TB.dq_unroll_for(DP, 16 * MW * NW, _features(TB)["DQ_UNROLL"]),
            TB.kv_async_for(DP, cp_async and TC.cp_async_ok(d), _features(TB)["KV_ASYNC"]),
            split_qdo,
            TB.qdo_pairs_on(_features(TB)["QDO_PAIRS"], split_qdo),
        )
    f = B2.default_features()
    if name == "fa2_backward_fast":
        return B2.fa2_backward_fast_kernel(*B2.config_for(d), causal, False, True, f["VEC"], f["PREFETCH"])
    if name == "fa2_backward_fast_dq":
        return B2.fa2_backward_fast_dq_kernel(*B2.config_for(d), causal, False, f["VEC"], f["PREFETCH"])
    raise ValueError(name)


def resources(name: str, d: int, causal: bool, nvdisasm: str, tiling=None) -> dict:
    """Compile, link and disassemble one kernel: ``{regs, spill_st, spill_ld, stack, sass, v4}``."""
    from cuda.core import Linker, LinkerOptions, ObjectCode
    from numba import cuda

    k = _kernel(name, d, causal, tiling)
    ptx, _ = cuda.compile_ptx(k.py_func, _signatures()[name], cc=(9, 0), fastmath=False)
    lk = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch="sm_90", verbose=True))
    cubin = lk.link("cubin")
    log = lk.get_info_log()
    regs = re.findall(r"Used (\d+) registers", log)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.findall(r"(\d+) bytes stack frame", log)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin.code)
        fh.flush()
        sass = subprocess.run([nvdisasm, "-c", fh.name], capture_output=True, text=True, check=True).stdout
    if os.environ.get("NUMBA_FLASH_OFFLINE_SASS_DIR"):  # --sass-dir: keep the disassembly to read
        tag = "_".join(map(str, tiling)) if tiling else "default"
        with open(
            os.path.join(os.environ["NUMBA_FLASH_OFFLINE_SASS_DIR"], f"{name}_d{d}_c{int(causal)}_{tag}.sass"), "w"
        ) as fh:
            fh.write(sass)
    # the mangled kernel name (relative-address operands) carries a hash of the closure: not machine code
    instr = [
        re.sub(r"_ZN\w+", "<sym>", line.strip())
        for line in sass.splitlines()
        if re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+\S", line)
    ]
    n_sass = len(instr)
    loops = sass_loops(sass)
    return {
        "regs": int(regs[-1]) if regs else -1,
        "spill_st": int(spill[-1][0]) if spill else -1,
        "spill_ld": int(spill[-1][1]) if spill else -1,
        "stack": int(stack[-1]) if stack else -1,
        "sass": n_sass,
        "v4": ptx.count("ld.shared.v4.f32"),
        "sha": hashlib.sha256("\n".join(instr).encode()).hexdigest()[:12],
        "loops": loops,
    }


def sass_loops(sass: str, min_len: int = 50) -> list[dict]:
    """The loops of a kernel's SASS (``nvdisasm -c`` text): every backward branch to a label, with the
    instructions between the label and the branch, of at least ``min_len``: ``{instr, HMMA, LDS, STS}``
    counts, in the order of their branches (an inner loop before the loop around it, which counts it once).

    Static counts of one pass through the body: with the trip counts they give the instructions a warp
    issues per pass of the loop around (``--loops``).
    """
    lines = sass.splitlines()
    labels = {m.group(1): n for n, line in enumerate(lines) if (m := re.match(r"^\s*(\.L_x_\d+):", line))}
    out = []
    for n, line in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if not m or labels.get(m.group(1), n) >= n:
            continue
        body = [
            re.sub(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P[T0-9]+\s+)?", "", x)
            for x in lines[labels[m.group(1)] : n + 1]
            if re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+\S", x)
        ]
        if len(body) >= min_len:
            ops = [b.split()[0].split(".")[0] for b in body]
            out.append({"instr": len(body), **{k: ops.count(k) for k in ("HMMA", "LDS", "STS")}})
    return out


def _one(name: str, d: int, causal: bool, nvd: str, tiling=None) -> dict:
    """:func:`resources` in a fresh interpreter: the machine code must not depend on what was compiled before.

    (Numba's mangled names and ptxas' tie-breaking depend on the process history: in one process, a
    kernel compiled after others can get a different but equivalent register assignment.)
    """
    # the same way this process was started: ``-m bench.offline_resources`` from the root, or by path
    how = ["-m", __spec__.name] if __spec__ is not None and __spec__.name else [os.path.abspath(__file__)]
    cmd = [sys.executable, *how, "--one", name, str(d), "1" if causal else "0"]
    if tiling is not None:
        cmd += ["--half-tiling", ",".join(str(int(x)) for x in tiling)]
    env = dict(os.environ, NVDISASM=nvd)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{name} d={d} causal={causal}: compile failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tiling(text: str) -> tuple[int, int, int, int]:
    """``"NW,MW,BC,CP"`` -> a tuple of four ints (``--half-tiling``)."""
    parts = tuple(int(x) for x in text.split(","))
    if len(parts) != 4 or parts[3] not in (0, 1):
        raise argparse.ArgumentTypeError(f"expected NW,MW,BC,CP with CP 0 or 1, got {text!r}")
    return parts


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.offline_resources``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="kernel(s) to report (default: all)")
    ap.add_argument("--d", type=int, action="append", help="head dim(s) (default: 64 and 128)")
    ap.add_argument("--sass-dir", metavar="DIR", help="also write each kernel's disassembly (nvdisasm -c) to DIR")
    ap.add_argument(
        "--features",
        metavar="JSON",
        help="features of the 3xTF32 and half forwards and backwards over their defaults, "
        "e.g. '{\"EX2_FTZ\": true}' (the table does not say: name the run)",
    )
    ap.add_argument("--loops", action="store_true", help="also print each loop's instruction counts (sass_loops)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles at once (one process each)")
    ap.add_argument("--one", nargs=3, metavar=("KERNEL", "D", "CAUSAL"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--half-tiling",
        action="append",
        type=_tiling,
        metavar="NW,MW,BC,CP",
        help="half or 3xTF32 forward at this tiling (repeatable): warps, m16 tiles per warp, key block, cp.async 1/0; "
        "the half backward: warps, key m16 tiles per warp, query rows per step, cp.async of Q_i, dO_i 1/0",
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.features:
        json.loads(args.features)  # a clear error here rather than in every child
        os.environ["NUMBA_FLASH_OFFLINE_FEATURES"] = args.features
    if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
        os.environ["NUMBA_FLASH_OFFLINE_SASS_DIR"] = os.path.abspath(args.sass_dir)
    _gpu_backend()
    if args.one:
        name, d, causal = args.one
        tiling = args.half_tiling[0] if args.half_tiling else None
        print(json.dumps(resources(name, int(d), causal == "1", os.environ["NVDISASM"], tiling)))
        return 0
    nvd = _toolchain()
    cases = [
        (name, d, causal, t)
        for name in args.kernel or KERNELS
        for d in args.d or (64, 128)
        for t in (args.half_tiling or [None] if name in TAKES_TILING else [None])
        for causal in (False, True)
    ]
    tcol = " tiling NW,MW,BC,CP" if args.half_tiling else ""
    print(
        f"{'kernel':<22} {'d':>4} {'causal':>6} {'regs':>5} {'spill st/ld B':>14} {'stack B':>8} {'SASS':>6} "
        f"{'LDS.v4 (ptx)':>12}  SASS sha256{tcol}"
    )
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = pool.map(lambda c: _one(c[0], c[1], c[2], nvd, c[3]), cases)
        for (name, d, causal, t), r in zip(cases, results):
            print(
                f"{name:<22} {d:>4} {str(causal):>6} {r['regs']:>5} "
                f"{str(r['spill_st']) + '/' + str(r['spill_ld']):>14} "
                f"{r['stack']:>8} {r['sass']:>6} {r['v4']:>12}  {r['sha']}"
                + (f" {','.join(map(str, t))}" if t else ""),
                flush=True,
            )
            if args.loops:
                for lp in r["loops"]:
                    print(
                        f"    loop: {lp['instr']:>5} instructions, HMMA {lp['HMMA']:>3}, LDS {lp['LDS']:>3}, STS "
                        f"{lp['STS']:>3}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
