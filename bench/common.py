"""The one helper module of the benchmarks: provenance, inputs, timing, FLOPs, memory, baselines, cases and the IO
model.

Used by the pytest-benchmark suites (``tests/benchmarks/test_bench_*.py`` and their conftest) and by
the tools of this package (``python -m bench.fa2_sweep`` ...). It lives here, in the repository's
``bench`` package, rather than in ``numba_flash`` (it is measurement tooling, not part of the
installed library) or in ``tests/`` (the tools are not tests). Both sides import it as
``from bench import common``: the tools run as ``python -m bench.<tool>`` from the repository root,
which puts the root on ``sys.path``; pytest puts it there through ``pythonpath = ["."]`` in
``pyproject.toml``'s ``[tool.pytest.ini_options]`` (declared once, no ``sys.path`` edits in code).

Every benchmark follows the FlashAttention-2 convention (FA2 paper, section 4.1):
``batch * seqlen = 16384`` tokens and hidden size 2048, so ``nheads = 2048 // headdim`` (32 heads at
d = 64, 16 at d = 128). Forward FLOPs are ``4 * b * h * N^2 * d`` (halved when causal); the backward
is 2.5x the forward.

Timing (one core, :func:`_times_ms`, under the public timers):

* :func:`cuda_time_ms` / :func:`cuda_time_ms_interleaved`: device time between two CUDA events;
* :func:`time_median`: host wall time of one synchronized call (device time plus the host work around it);
* :func:`host_us_per_call`: host wall time per call of back-to-back calls, nothing synchronized between them.

On a GPU the pytest-benchmark suites time :func:`synced` functions (the call, then a device
synchronize), so pytest-benchmark's wall-clock rounds measure device time; the median is reported.
Warm-up rounds absorb JIT compilation. In the simulator every benchmark runs one tiny shape once,
labelled ``functional only``: the numbers mean nothing there.

A *case* of the IO-measurement tools (``io --measure``, ``bench.figure2``, ``bench.ncu``) is one call
of the public API on one shape: ``algorithm`` ("standard", "flash1", "flash2", "block-sparse"),
``variant`` (the kernel module's variant, e.g. "fast", "readable", "tensorcore"; None for the
default), ``pass`` ("forward", "backward" or "fwd+bwd") and the shape (batch, nheads, N, d; fp32,
non-causal, no dropout). :func:`prepare` builds the inputs and returns the function that makes
exactly that call (for "backward", the forward runs once outside it), so a caller can time it or wrap
it in an NVTX range. The IO model's count for a case (:func:`model_count`) uses the closed forms of
:mod:`numba_flash_reference.io_model` at the tiles the case's kernels use (:func:`tiles`), and for
block-sparse the kernels' exact count :func:`numba_flash.alg5_block_sparse.hbm_accesses` beside the
paper's. Elements are 4 bytes (fp32).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numba_flash

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ON_GPU = not numba_flash.is_simulator()
TOKENS = 16384
HIDDEN = 2048
#: Sequence lengths and head dims of the sweep (the simulator runs only SIM_SHAPE). A quick run may
#: restrict them: NUMBA_FLASH_BENCH_SEQLENS="1024,4096" NUMBA_FLASH_BENCH_HEADDIMS="64".
SEQLENS = tuple(
    int(n) for n in os.environ.get("NUMBA_FLASH_BENCH_SEQLENS", "256,512,1024,2048,4096,8192,16384").split(",")
)
HEADDIMS = tuple(int(n) for n in os.environ.get("NUMBA_FLASH_BENCH_HEADDIMS", "64,128").split(","))
#: The one shape a simulator run uses (functional only).
SIM_SHAPE = dict(batch=1, nheads=1, seqlen=32, headdim=16)

ALGORITHMS = ("standard", "flash1", "flash2", "block-sparse")
#: The variants measured per algorithm (None: the algorithm has one kernel set).
VARIANTS = {
    "standard": (None,),
    "flash1": ("fast", "readable"),
    "flash2": ("fast", "tensorcore", "readable"),
    "block-sparse": (None,),
}
#: Variants that exist for the forward pass only (their backward is another variant's).
FORWARD_ONLY = {("flash2", "tensorcore")}
#: The algorithms that have more than one variant (``variant=`` of the public API).
_VARIANT_MODULES = {"flash1": ("alg1_forward", "alg4_backward"), "flash2": ("fa2_forward", "fa2_backward")}
ITEMSIZE = 4  # fp32

#: Tiles (Br, Bc) of each variant's defaults at d <= 64 on a GPU, as their modules choose them
#: (``config_for`` / ``default_block_sizes`` / ``choose_block_sizes``). :func:`tiles` asks the modules
#: first and uses this table only where it cannot.
DEFAULT_TILES_D64 = {
    ("flash1", "fast", "forward"): (32, 128),
    ("flash1", "readable", "forward"): (32, 48),
    ("flash1", "fast", "backward"): (64, 128),
    ("flash1", "readable", "backward"): (32, 32),
    ("flash2", "fast", "forward"): (128, 64),
    ("flash2", "tensorcore", "forward"): (128, 64),
    ("flash2", "readable", "forward"): (48, 48),
    ("flash2", "fast", "backward"): (64, 128),
    ("flash2", "readable", "backward"): (32, 32),
}
#: The block-sparse kernels' tiles (= mask blocks) used by the tools.
BLOCK_SPARSE_TILES = (32, 32)


def torch_or_none():
    try:
        import torch

        return torch
    except ImportError:  # pragma: no cover - torch is a test dependency
        return None


# ----------------------------------------------------------------------------------------------
# Provenance
# ----------------------------------------------------------------------------------------------
def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None


def command_line() -> str:
    """This process's command line as typed: ``python -m bench.fa2_sweep --seqlens 4096``, ``python -m pytest ...``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    prog = (
        f"python -m {spec.name.removesuffix('.__main__')}"
        if spec is not None and spec.name
        else f"python {sys.argv[0]}"
    )
    return " ".join([prog, *(shlex.quote(a) for a in sys.argv[1:])])


def device_name() -> str:
    if not ON_GPU:
        return "simulator (functional only)"
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def _gpu_info() -> dict:
    """Compute capability, SM count, L2 size (bytes), memory and CUDA runtime from torch, the CUDA driver API version
    from numba, the driver from nvidia-smi; {} in the simulator."""
    if not ON_GPU:
        return {}
    import torch
    from numba import cuda

    p = torch.cuda.get_device_properties(0)
    info = {
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "l2_bytes": int(getattr(p, "L2_cache_size", 0)) or None,
        "memory_bytes": int(p.total_memory),
        "cuda_runtime_torch": torch.version.cuda,
    }
    try:
        info["driver_version"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
    except Exception:  # pragma: no cover
        pass
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
    except Exception:
        info["driver"] = None
    return info


def provenance(command: str | None = None) -> dict:
    """Device, driver, versions, date, command and commit of a results file (a JSON's ``provenance``, the benchmarks'
    ``machine_info["numba_flash"]``).

    ``command``: ``command`` if given, else ``$NUMBA_FLASH_BENCH_COMMAND`` (what ``bench/gpu/run_benchmarks.sh`` ran),
    else :func:`command_line`. ``commit``: ``$NUMBA_FLASH_COMMIT`` if set (the device machine's copy of ``.git`` may
    not be the checkout's), else ``git rev-parse HEAD``; ``dirty``: tracked files changed. ``backend`` is
    :data:`numba_flash.BACKEND`, ``describe`` :func:`numba_flash.describe`. On a GPU also the keys of the device
    (:func:`_gpu_info`).
    """
    from importlib.metadata import PackageNotFoundError, version

    import numba

    def ver(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    torch = torch_or_none()
    info = {
        "backend": numba_flash.BACKEND,
        "device": device_name(),
        "describe": numba_flash.describe(),
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command if command is not None else (os.environ.get("NUMBA_FLASH_BENCH_COMMAND") or command_line()),
        "commit": os.environ.get("NUMBA_FLASH_COMMIT") or _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "numba": numba.__version__,
        "numba_cuda": ver("numba-cuda"),
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "host": platform.node(),
    }
    info.update(_gpu_info())
    return info


def header_line(torch) -> str:
    """``# command; date; device; CPU cores; versions; commit``: the first line of a GPU probe's text output (the
    command, date and commit of :func:`provenance`)."""
    prov = provenance()
    return (
        f"# {prov['command']}; {prov['date_utc']}; device: {prov['device']}; {os.cpu_count()} CPU cores; python "
        f"{prov['python']}, torch {torch.__version__}, numba {prov['numba']}; commit {prov['commit'] or 'unknown'}"
    )


def write_json(path, data) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return path


def record_jsonl(info: dict) -> None:
    """Append one result to $NUMBA_FLASH_BENCH_JSONL (if set), so a run cut short keeps what it measured.

    The file's first line is :func:`provenance` (with the SGEMM rate) when the file is new.
    """
    path = os.environ.get("NUMBA_FLASH_BENCH_JSONL")
    if not path:
        return
    new = not os.path.exists(path)
    with open(path, "a") as fh:
        if new:
            fh.write(json.dumps({"provenance": provenance(), "sgemm_tflops_4096_fp32": sgemm_tflops()}) + "\n")
        fh.write(json.dumps(info, default=str) + "\n")


# ----------------------------------------------------------------------------------------------
# Shapes, FLOPs
# ----------------------------------------------------------------------------------------------
def fa2_shape(seqlen: int, headdim: int) -> dict:
    """(batch, nheads, seqlen, headdim) of the FA2 benchmark convention (16k tokens, hidden 2048)."""
    if not ON_GPU:
        return dict(SIM_SHAPE)
    return dict(batch=max(1, TOKENS // seqlen), nheads=HIDDEN // headdim, seqlen=seqlen, headdim=headdim)


def fa2_problem(seqlen: int, headdim: int, causal: bool = False):
    """The checked :class:`~numba_flash._launch.Problem` of the FA2 convention's GPU shape, without inputs.

    On any backend (no arrays are allocated): what a tool's ``--dry-run`` plans its kernels for.
    """
    from numba_flash._launch import Problem

    b, h = max(1, TOKENS // seqlen), HIDDEN // headdim
    return Problem(b, seqlen, seqlen, h, h, headdim, 1.0 / math.sqrt(headdim), bool(causal), 0.0, 0)


def flops_forward(batch: int, nheads: int, seqlen_q: int, seqlen_k: int, headdim: int, causal: bool = False) -> float:
    """4 b h N_q N_k d (two matmuls of 2 N_q N_k d each), halved with the causal mask."""
    f = 4.0 * batch * nheads * seqlen_q * seqlen_k * headdim
    return f / 2 if causal else f


def flops_backward(batch, nheads, seqlen_q, seqlen_k, headdim, causal=False) -> float:
    """2.5x the forward (five matmuls against two)."""
    return 2.5 * flops_forward(batch, nheads, seqlen_q, seqlen_k, headdim, causal)


def tflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e12 if seconds > 0 else float("nan")


def matmul_flops(algorithm: str, pass_: str, batch: int, nheads: int, N: int, d: int, density: float = 1.0) -> float:
    """FLOPs of the matrix products (2 per multiply-add) a pass computes.

    Forward: S = QK^T and PV (2 products of N^2 d). Backward: standard attention's 4 (dV, dP, dQ, dK);
    FlashAttention's 5 (it recomputes S). Block-sparse: the FlashAttention count times the density.
    """
    per = flops_forward(batch, nheads, N, N, d) / 2  # one product
    n = {"forward": 2, "backward": 4 if algorithm == "standard" else 5}
    count = n["forward"] + n["backward"] if pass_ == "fwd+bwd" else n[pass_]
    return count * per * (density if algorithm == "block-sparse" else 1.0)


def compulsory_bytes(pass_: str, batch: int, nheads: int, N: int, d: int) -> int:
    """The traffic no exact algorithm avoids: read the inputs once, write the outputs once (fp32).

    Forward: Q, K, V read, O written (4 N d per head). Backward: Q, K, V, O, dO read and dQ, dK, dV
    written (8 N d). fwd+bwd: both.
    """
    per = {"forward": 4, "backward": 8, "fwd+bwd": 12}[pass_]
    return per * batch * nheads * N * d * ITEMSIZE


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------
def make_inputs(
    batch,
    nheads,
    seqlen,
    headdim,
    nheads_k=None,
    seed=0,
    requires_grad=False,
    dtype="float32",
    dout=False,
    as_torch=False,
):
    """Random q, k, v (q ``(batch, seqlen, nheads, headdim)``, k and v with ``nheads_k`` heads) and, with ``dout``, an
    upstream gradient of q's shape drawn after them: ``(q, k, v)`` or ``(q, k, v, dout)``.

    On a GPU: torch CUDA tensors of ``dtype`` (a torch dtype name), drawn in float32 from a CUDA generator seeded
    with ``seed``; ``requires_grad`` for q, k, v. In the simulator: NumPy arrays (float32, or float16 for the half
    dtypes: NumPy has no bfloat16), or with ``as_torch`` torch CPU tensors drawn as on a GPU (what autograd needs).
    """
    nheads_k = nheads if nheads_k is None else nheads_k
    shapes = [(batch, seqlen, nheads, headdim), (batch, seqlen, nheads_k, headdim), (batch, seqlen, nheads_k, headdim)]
    if dout:
        shapes.append(shapes[0])
    if ON_GPU or as_torch:
        import torch

        device = "cuda" if ON_GPU else "cpu"
        gen = torch.Generator(device=device).manual_seed(seed)
        out = [
            torch.randn(s, device=device, dtype=torch.float32, generator=gen).to(getattr(torch, dtype)) for s in shapes
        ]
        for x in out[:3]:
            x.requires_grad_(requires_grad)
        return tuple(out)
    rng = np.random.default_rng(seed)
    ndt = np.float32 if dtype in ("float32", "float64") else np.float16
    return tuple(rng.standard_normal(s).astype(ndt) for s in shapes)


# ----------------------------------------------------------------------------------------------
# Timing: one core (_times_ms) on two clocks
# ----------------------------------------------------------------------------------------------
def synchronize():
    """Wait for the device (torch's and numba's work); nothing in the simulator."""
    if ON_GPU:
        torch = torch_or_none()
        if torch is not None:
            torch.cuda.synchronize()
        from numba import cuda

        cuda.synchronize()


def synced(fn):
    """fn followed by a device synchronize: what pytest-benchmark should time."""

    def run():
        out = fn()
        synchronize()
        return out

    return run


class _HostClock:
    """Host wall time (``time.perf_counter``); ``sync``, when given, runs after the warm-up and after each timing,
    untimed."""

    def __init__(self, sync=None):
        self.sync = sync

    def settle(self):
        if self.sync is not None:
            self.sync()

    def start(self):
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        ms = (time.perf_counter() - self.t0) * 1e3
        self.settle()
        return ms


class _CudaClock:
    """Device time between two CUDA events (torch's), recorded before the first call and after the last."""

    def __init__(self):
        import torch

        self.torch = torch

    def settle(self):
        self.torch.cuda.synchronize()

    def start(self):
        self.e0, self.e1 = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        self.e0.record()

    def stop(self) -> float:
        self.e1.record()
        self.e1.synchronize()
        return self.e0.elapsed_time(self.e1)


def _times_ms(fns: dict, clock, warmup: int, repeats: int, calls: int = 1) -> dict:
    """``{name: [ms per call, one per round]}`` of each of ``fns`` on ``clock``, after ``warmup`` untimed calls of each.

    Round ``r`` times every function once, starting from the ``r``-th (mod their number), so that a GPU that slows
    down as it heats slows every function alike (with one function: ``repeats`` timings in a row). Each timing spans
    ``calls`` back-to-back calls and is divided by them."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    clock.settle()
    ts = {name: [] for name in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            clock.start()
            for _ in range(calls):
                fns[name]()
            ts[name].append(clock.stop() / calls)
    return ts


def _spread(ts) -> tuple:
    return float(np.median(ts)), float(np.min(ts)), float(np.max(ts))


def time_median(fn, warmup: int = 2, repeats: int = 10) -> float:
    """Median host wall time of one synchronized call of ``fn`` in seconds, after ``warmup`` untimed calls."""
    return float(np.median(_times_ms({"fn": synced(fn)}, _HostClock(), warmup, repeats)["fn"])) / 1e3


def host_us_per_call(fn, calls: int, repeats: int, warmup: int, sync=None) -> float:
    """Host time of ``fn`` in microseconds per call: the median over ``repeats`` loops of ``calls`` back-to-back calls
    (nothing synchronized inside a loop), after ``warmup`` untimed calls; ``sync`` (e.g. ``torch.cuda.synchronize``),
    when given, runs after the warm-up and after each loop, untimed, so that no loop waits on the previous one's
    work."""
    return 1e3 * float(np.median(_times_ms({"fn": fn}, _HostClock(sync), warmup, repeats, calls)["fn"]))


def cuda_time_ms(fn, warmup: int = 2, repeats: int = 10, calls: int = 1):
    """(median, min, max) in ms of ``fn`` timed with CUDA events, after ``warmup`` untimed calls (GPU only).

    Each timing spans ``calls`` back-to-back calls and is divided by them. With one call the events also time the host
    work before the first launch (the GPU idles while the call is prepared); with several, where a call's host work
    is shorter than its kernels, the launch queue stays full and the timing is the kernels' (short sequences, whose
    one-call timing is mostly host time)."""
    return cuda_time_ms_interleaved({"fn": fn}, warmup, repeats, calls)["fn"]


def cuda_time_ms_interleaved(fns: dict, warmup: int = 2, repeats: int = 10, calls: int = 1) -> dict:
    """``{name: (median, min, max)}`` in ms of each of ``fns`` timed as :func:`cuda_time_ms` does, but in rounds: round
    ``r`` times every function once, starting from the ``r``-th (mod their number). A GPU that slows down as it heats
    (clocks fall under sustained power) then slows every function alike, where timing them one after another gave the
    first one timed an advantage (identical kernels 0.2-4.6 % apart by position, H100, 2026-11-27). ``calls``: each
    timing spans that many back-to-back calls of its function, divided by them (as :func:`cuda_time_ms`'s): with more
    than one the launch queue stays full and the timing is the kernels', without the host work before the first launch
    that a one-call timing holds (ours 66-106 us a float32 forward call, SDPA's 11-17, on an H200)."""
    return {name: _spread(ts) for name, ts in _times_ms(fns, _CudaClock(), warmup, repeats, calls).items()}


@functools.cache
def sgemm_tflops(n: int = 4096, repeats: int = 10) -> float | None:
    """cuBLAS SGEMM rate (torch.mm, fp32, TF32 off) measured now: the ceiling for pct_sgemm."""
    torch = torch_or_none()
    if not ON_GPU or torch is None:
        return None
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        t = time_median(lambda: torch.mm(a, b), warmup=3, repeats=repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return tflops(2.0 * n**3, t)


# ----------------------------------------------------------------------------------------------
# Memory, out-of-memory, the pytest-benchmark grids
# ----------------------------------------------------------------------------------------------
def peak_extra_memory(fn, io_bytes: int = 0):
    """Peak device memory ``fn`` allocates beyond what existed before it, minus ``io_bytes`` (its outputs).

    Measured with torch's caching-allocator statistics (our kernels allocate through torch when
    given CUDA tensors). Returns None in the simulator or without torch.
    """
    torch = torch_or_none()
    if not ON_GPU or torch is None:
        return None
    synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return max(0, int(peak - base - io_bytes))


def is_oom(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "out of memory" in text.lower() or "CUDA_ERROR_OUT_OF_MEMORY" in text


def free_memory():
    torch = torch_or_none()
    if ON_GPU and torch is not None:
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def grid_rounds(n: int, training: bool) -> int:
    """Timed rounds of an FA2 grid cell (``tests/benchmarks/test_bench_fa2.py``, ``test_bench_half.py``) of sequence
    length ``n``: a forward (``training`` False) or a forward + backward step.

    Each round is one synchronized call, so a short cell's time holds the caller's host work, which on a GPU
    machine spreads by up to 2.7x over ten rounds (the half grid at 805a132: our causal forward at N = 512
    0.37-1.05 ms, while its kernel takes 0.26-0.27 ms). The cells up to 2k get more rounds (forward 30, forward +
    backward 10) so that their medians rest on more calls; longer cells keep 10 / 5 (forward) and 3 (training),
    their rounds being many milliseconds of GPU work each. Every implementation of a cell gets the same rounds."""
    if training:
        return 10 if n <= 2048 else 3
    return 30 if n <= 2048 else (10 if n < 8192 else 5)


def time_or_skip_oom(benchmark, fn, rounds: int, io_bytes: int, what: str):
    """Time ``fn`` with pytest-benchmark (``rounds`` rounds after one warm-up) and record its extra memory.

    ``peak_extra_memory`` runs first (it is also the warm-up that compiles). An out-of-memory error (torch
    naive attention at long N) becomes a recorded JSONL row, then a skip naming ``what``; anything else raises.
    """
    import pytest

    try:
        extra = peak_extra_memory(fn, io_bytes=io_bytes)
        benchmark.pedantic(synced(fn), rounds=rounds, warmup_rounds=1, iterations=1)
    except Exception as exc:
        if not is_oom(exc):
            raise
        benchmark.extra_info.update(oom=True, error=str(exc)[:200])
        record_jsonl(dict(benchmark.extra_info))
        free_memory()
        pytest.skip(f"{what}: out of device memory")
    benchmark.extra_info["extra_mem_bytes"] = extra


# ----------------------------------------------------------------------------------------------
# The torch baselines
# ----------------------------------------------------------------------------------------------
def torch_naive_attention(q, k, v, causal=False, softmax_scale=None):
    """softmax(q k^T * scale) v in torch, fp32 (TF32 off): the framework's standard attention."""
    torch = torch_or_none()
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # (b, h, s, d)
    if kh.shape[1] != qh.shape[1]:
        rep = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), vh).transpose(1, 2)


def torch_sdpa_mem_efficient(q, k, v, causal=False):
    """torch SDPA with the memory-efficient (CUTLASS) backend, in the inputs' dtype (fp32: 3xTF32 tensor cores)."""
    return torch_sdpa(q, k, v, causal, "efficient")


#: torch SDPA backends by short name: ``flash`` (FA2's own CUDA kernels, half only), ``cudnn`` (cuDNN's
#: fused attention, half only), ``efficient`` (xformers' CUTLASS kernel)
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def torch_sdpa(q, k, v, causal=False, backend="efficient"):
    """``scaled_dot_product_attention`` on (b, s, h, d) tensors with one backend of :data:`SDPA_BACKENDS` forced."""
    torch = torch_or_none()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]):
        return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal).transpose(1, 2)


# ----------------------------------------------------------------------------------------------
# Variants and tiles
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def selected_variant(algorithm: str, variant: str | None):
    """Run ``algorithm`` with ``variant``; yields the keyword arguments for ``flash_attn_func``."""
    if variant is None or algorithm not in _VARIANT_MODULES:
        yield {}
        return
    yield {"variant": variant}


def default_variant(algorithm: str, pass_: str) -> str:
    """The variant the public API runs for ``algorithm``'s ``pass_`` when none is named."""
    from numba_flash import registry

    return registry.auto_variant(algorithm, pass_)


def _introspect_tiles(algorithm: str, variant: str, pass_: str, d: int):
    """(Br, Bc) as the variant's module chooses them by default on this backend (may raise)."""
    from numba_flash import registry
    from numba_flash._launch import check_attention_args

    x = np.zeros((1, 1, 1, d), np.float32)
    prob = check_attention_args(x, x, x)
    return tuple(registry.resolve(algorithm, pass_, variant, prob).module.choose_block_sizes(prob))


def tiles(algorithm: str, variant: str | None, pass_: str, d: int):
    """``((Br, Bc), source)`` of the kernels a case runs; ``(None, "-")`` for standard attention.

    ``source`` says where the numbers come from: "module" (asked on this backend) or "table"
    (:data:`DEFAULT_TILES_D64`, when the module could not be asked).
    """
    if algorithm == "standard":
        return None, "-"
    if algorithm == "block-sparse":
        return BLOCK_SPARSE_TILES, "argument"
    variant = variant or default_variant(algorithm, pass_)
    try:
        return tuple(int(n) for n in _introspect_tiles(algorithm, variant, pass_, d)), "module"
    except Exception:
        return DEFAULT_TILES_D64.get((algorithm, variant, pass_)), "table"


# ----------------------------------------------------------------------------------------------
# Masks, the IO model
# ----------------------------------------------------------------------------------------------
def block_mask(pattern: str, Tr: int, Tc: int, density: float | None = None) -> np.ndarray:
    """ "butterfly" (the flat block butterfly), "banded" (``density`` of the blocks, same count per row) or "dense"."""
    from numba_flash_reference.alg5_block_sparse import butterfly_block_mask
    from numba_flash_reference.io_model import banded_block_mask

    if pattern == "butterfly":
        return butterfly_block_mask(Tr, Tc)
    if pattern == "banded":
        return banded_block_mask(Tr, Tc, density)
    if pattern == "dense":
        return np.ones((Tr, Tc), bool)
    raise ValueError(f"unknown mask pattern {pattern!r}")


def _io_one(algorithm, pass_, batch, nheads, N, d, tile, mask):
    from numba_flash_reference import io_model

    kw = dict(b=batch, h=nheads)
    if algorithm == "standard":
        c = io_model.io_standard_forward(N, d, **kw) if pass_ == "forward" else io_model.io_alg3_backward(N, d, **kw)
        return c, c
    Br, Bc = tile
    if algorithm == "flash1":
        c = (
            io_model.io_alg1_forward(N, d, Br=Br, Bc=Bc, **kw)
            if pass_ == "forward"
            else io_model.io_alg4_backward(N, d, Br=Br, Bc=Bc, **kw)
        )
        return c, c
    if algorithm == "flash2":
        c = (
            io_model.io_fa2_forward(N, d, Br=Br, Bc=Bc, **kw)
            if pass_ == "forward"
            else io_model.io_fa2_backward(N, d, Br=Br, Bc=Bc, **kw)
        )
        return c, c
    if algorithm == "block-sparse":
        from numba_flash._launch import Problem
        from numba_flash.alg5_block_sparse import BlockMask, hbm_accesses
        from numba_flash_reference.alg5_block_sparse import io_alg5_backward

        prob = Problem(batch, N, N, nheads, nheads, d, 1.0 / np.sqrt(d), False, 0.0, 0)
        bm = BlockMask(mask=np.ascontiguousarray(np.broadcast_to(mask, (1, 1) + mask.shape)), block_size=tuple(tile))
        kernel = hbm_accesses(bm, prob, pass_)
        paper = (
            io_model.io_alg5_block_sparse(N, d, mask, Br=Br, Bc=Bc, **kw)
            if pass_ == "forward"
            else io_alg5_backward(N, d, mask, Br=Br, Bc=Bc, **kw)
        )
        return kernel, paper
    raise ValueError(algorithm)


def model_count(
    algorithm: str, pass_: str, batch: int, nheads: int, N: int, d: int, tile=None, bwd_tile=None, mask=None
) -> dict:
    """The IO model's HBM traffic of a case, in bytes: ``{"model_read", "model_write", "model_bytes",
    "paper_model_bytes"}`` (the two differ only for block-sparse, whose kernels' exact count departs
    from Proposition 4's by documented details); fwd+bwd adds the two passes (``bwd_tile`` for the
    backward's tiles)."""
    passes = (
        [("forward", tile), ("backward", bwd_tile if bwd_tile is not None else tile)]
        if pass_ == "fwd+bwd"
        else [(pass_, tile)]
    )
    r = w = paper = 0
    for p, t in passes:
        exact, pap = _io_one(algorithm, p, batch, nheads, N, d, t, mask)
        r += exact.reads
        w += exact.writes
        paper += pap.total
    return {
        "model_read": r * ITEMSIZE,
        "model_write": w * ITEMSIZE,
        "model_bytes": (r + w) * ITEMSIZE,
        "paper_model_bytes": paper * ITEMSIZE,
    }


# ----------------------------------------------------------------------------------------------
# The call a case makes
# ----------------------------------------------------------------------------------------------
def prepare(
    algorithm, variant, pass_, batch, nheads, N, d, mask=None, block_sizes=None, seed=0, dtype="float32", causal=False
):
    """The call of one case as a function of no arguments (inputs built here in ``dtype``: torch tensors, CPU ones in
    the simulator; see the module docstring; ``causal`` for the dense algorithms).

    For "backward" the forward runs once here and the function computes only the gradients
    (``torch.autograd.grad`` with ``retain_graph``, so it can run again and nothing accumulates).
    """
    from numba_flash import block_sparse_attn_func, flash_attn_func

    import torch

    grad = pass_ in ("backward", "fwd+bwd")
    q, k, v, g = make_inputs(batch, nheads, N, d, seed=seed, requires_grad=grad, dtype=dtype, dout=True, as_torch=True)

    def forward():
        if algorithm == "block-sparse":
            return block_sparse_attn_func(
                q, k, v, torch.from_numpy(np.asarray(mask)), block_size=tuple(block_sizes or BLOCK_SPARSE_TILES)
            )
        with selected_variant(algorithm, variant) as extra:
            return flash_attn_func(q, k, v, causal=causal, algorithm=algorithm, block_sizes=block_sizes, **extra)

    def backward(out):
        # The backward runs on this thread, not on autograd's CUDA worker thread: NVTX ranges are per
        # thread, so under Nsight Compute (``--nvtx-include``) a worker-thread backward would profile
        # no kernel at all (seen on an H100: "0 kernel(s) profiled" for every backward case).
        with (
            selected_variant(algorithm if algorithm != "block-sparse" else "", variant),
            torch.autograd.set_multithreading_enabled(False),
        ):
            return torch.autograd.grad(out, (q, k, v), g, retain_graph=True)

    if pass_ == "forward":

        def fn():
            with torch.no_grad():
                return forward()

        return fn
    if pass_ == "backward":
        out = forward()
        return lambda: backward(out)
    if pass_ == "fwd+bwd":
        return lambda: backward(forward())
    raise ValueError(f"pass must be forward, backward or fwd+bwd, got {pass_!r}")
