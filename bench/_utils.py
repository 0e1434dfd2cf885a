"""Shared helpers of the benchmarks: shapes, FLOPs, timing, memory, ceilings, provenance.

Used by the pytest-benchmark suites (``tests/benchmarks/test_bench_*.py`` and their conftest) and by
the tools of this package (``python -m bench.fa2_sweep`` ...). It lives here, in the repository's
``bench`` package, rather than in ``numba_flash`` (it is measurement tooling, not part of the
installed library) or in ``tests/`` (the tools are not tests). Both sides import it as
``from bench import _utils``: the tools run as ``python -m bench.<tool>`` from the repository root,
which puts the root on ``sys.path``; pytest puts it there through ``pythonpath = ["."]`` in
``pyproject.toml``'s ``[tool.pytest.ini_options]`` (declared once, no ``sys.path`` edits in code).

Every benchmark follows the FlashAttention-2 convention (FA2 paper, section 4.1):
``batch * seqlen = 16384`` tokens and hidden size 2048, so ``nheads = 2048 // headdim`` (32 heads at
d = 64, 16 at d = 128). Forward FLOPs are ``4 * b * h * N^2 * d`` (halved when causal); the backward
is 2.5x the forward.

On a GPU the timed function runs on torch CUDA tensors (zero-copy into the Numba kernels) and ends
with a device synchronize, so pytest-benchmark's wall-clock rounds measure device time; the median is
reported. Warm-up rounds absorb JIT compilation. In the simulator every benchmark runs one tiny shape
once, labelled ``functional only``: the numbers mean nothing there.
"""

from __future__ import annotations

import datetime
import functools
import math
import os
import platform
import shlex
import sys
import time

from numba_flash import _backend

import numpy as np

ON_GPU = not _backend.is_simulator()
TOKENS = 16384
HIDDEN = 2048
#: Sequence lengths and head dims of the sweep (the simulator runs only SIM_SHAPE). A quick run may
#: restrict them: NUMBA_FLASH_BENCH_SEQLENS="1024,4096" NUMBA_FLASH_BENCH_HEADDIMS="64".
SEQLENS = tuple(int(n) for n in os.environ.get("NUMBA_FLASH_BENCH_SEQLENS", "256,512,1024,2048,4096,8192,16384").split(","))
HEADDIMS = tuple(int(n) for n in os.environ.get("NUMBA_FLASH_BENCH_HEADDIMS", "64,128").split(","))
#: The one shape a simulator run uses (functional only).
SIM_SHAPE = dict(batch=1, nheads=1, seqlen=32, headdim=16)


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


def torch_or_none():
    try:
        import torch

        return torch
    except ImportError:  # pragma: no cover - torch is a test dependency
        return None


def make_inputs(batch, nheads, seqlen, headdim, nheads_k=None, seed=0, requires_grad=False, dtype="float32"):
    """Random q, k, v: torch CUDA tensors of ``dtype`` (a torch dtype name) on a GPU, NumPy arrays in the simulator
    (float32, or float16 for the half dtypes: NumPy has no bfloat16)."""
    nheads_k = nheads if nheads_k is None else nheads_k
    rng = np.random.default_rng(seed)
    shapes = [(batch, seqlen, nheads, headdim), (batch, seqlen, nheads_k, headdim), (batch, seqlen, nheads_k, headdim)]
    if ON_GPU:
        torch = torch_or_none()
        gen = torch.Generator(device="cuda").manual_seed(seed)
        tdt = getattr(torch, dtype)
        return tuple(torch.randn(s, device="cuda", dtype=torch.float32, generator=gen).to(tdt).requires_grad_(requires_grad) for s in shapes)
    ndt = np.float32 if dtype in ("float32", "float64") else np.float16
    return tuple(rng.standard_normal(s).astype(ndt) for s in shapes)


def synchronize():
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


def time_median(fn, warmup: int = 2, repeats: int = 10) -> float:
    """Median wall time of ``fn`` (synchronized) in seconds, after ``warmup`` untimed calls."""
    run = synced(fn)
    for _ in range(warmup):
        run()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def host_us_per_call(fn, calls: int, repeats: int, warmup: int, sync=None) -> float:
    """Host time of ``fn`` in microseconds per call: the median over ``repeats`` loops of ``calls`` back-to-back calls
    (nothing synchronized inside a loop), after ``warmup`` untimed calls; ``sync`` (e.g. ``torch.cuda.synchronize``),
    when given, runs after the warm-up and after each loop, untimed, so that no loop waits on the previous one's work."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
        if sync is not None:
            sync()
    return 1e6 * float(np.median(times))


def cuda_time_ms(fn, warmup: int = 2, repeats: int = 10, calls: int = 1):
    """(median, min, max) in ms of ``fn`` timed with CUDA events, after ``warmup`` untimed calls (GPU only).

    Each timing spans ``calls`` back-to-back calls and is divided by them. With one call the events also time the host
    work before the first launch (the GPU idles while the call is prepared); with several, where a call's host work
    is shorter than its kernels, the launch queue stays full and the timing is the kernels' (short sequences, whose
    one-call timing is mostly host time)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(calls):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / calls)
    return float(np.median(ts)), float(np.min(ts)), float(np.max(ts))


def cuda_time_ms_interleaved(fns: dict, warmup: int = 2, repeats: int = 10, calls: int = 1) -> dict:
    """``{name: (median, min, max)}`` in ms of each of ``fns`` timed as :func:`cuda_time_ms` does, but in rounds: round
    ``r`` times every function once, starting from the ``r``-th (mod their number). A GPU that slows down as it heats
    (clocks fall under sustained power) then slows every function alike, where timing them one after another gave the
    first one timed an advantage (identical kernels 0.2-4.6 % apart by position, H100, 2026-11-27). ``calls``: each
    timing spans that many back-to-back calls of its function, divided by them (as :func:`cuda_time_ms`'s): with more
    than one the launch queue stays full and the timing is the kernels', without the host work before the first launch
    that a one-call timing holds (ours 66-106 us a float32 forward call, SDPA's 11-17, on an H200)."""
    import torch

    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    torch.cuda.synchronize()
    ts = {name: [] for name in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(calls):
                fns[name]()
            e1.record()
            e1.synchronize()
            ts[name].append(e0.elapsed_time(e1) / calls)
    return {name: (float(np.median(v)), float(np.min(v)), float(np.max(v))) for name, v in ts.items()}


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


def device_name() -> str:
    if not ON_GPU:
        return "simulator (functional only)"
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def command_line() -> str:
    """This process's command line as typed: ``python -m bench.fa2_sweep --seqlens 4096``, ``python -m pytest ...``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    prog = f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None and spec.name else f"python {sys.argv[0]}"
    return " ".join([prog, *(shlex.quote(a) for a in sys.argv[1:])])


def header_line(torch) -> str:
    """``# command; date; device; CPU cores; versions; commit``: the first line of a GPU probe's text output (the
    commit from ``NUMBA_FLASH_COMMIT``: the device machine's copy of ``.git`` may not be the checkout's)."""
    prov = provenance()
    return (f"# {prov['command']}; {prov['date_utc']}; device: {prov['device']}; {os.cpu_count()} CPU cores; python "
            f"{prov['python']}, torch {torch.__version__}, numba {prov['numba']}; commit {os.environ.get('NUMBA_FLASH_COMMIT', 'unknown')}")


def provenance() -> dict:
    """Device, driver, versions, date and command, for the results JSON."""
    import numba
    import numpy

    info = {
        "backend": _backend.BACKEND,
        "device": device_name(),
        "describe": _backend.describe(),
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numba": numba.__version__,
        "numpy": numpy.__version__,
        "command": os.environ.get("NUMBA_FLASH_BENCH_COMMAND") or command_line(),
    }
    torch = torch_or_none()
    if torch is not None:
        info["torch"] = torch.__version__
        if ON_GPU:
            info["cuda_runtime_torch"] = torch.version.cuda
    if ON_GPU:
        from numba import cuda

        try:
            info["driver_version"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
        except Exception:  # pragma: no cover
            pass
    return info


def record_jsonl(info: dict) -> None:
    """Append one result to $NUMBA_FLASH_BENCH_JSONL (if set), so a run cut short keeps what it measured.

    The file's first line is :func:`provenance` (with the SGEMM rate) when the file is new.
    """
    import json

    path = os.environ.get("NUMBA_FLASH_BENCH_JSONL")
    if not path:
        return
    new = not os.path.exists(path)
    with open(path, "a") as fh:
        if new:
            fh.write(json.dumps({"provenance": provenance(), "sgemm_tflops_4096_fp32": sgemm_tflops()}) + "\n")
        fh.write(json.dumps(info, default=str) + "\n")


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
