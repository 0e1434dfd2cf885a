"""Shared pieces of the measurement tools: what each (algorithm, variant) runs, its tiles, its IO model.

A *case* is one call of the public API on one shape: ``algorithm`` ("standard", "flash1", "flash2",
"block-sparse"), ``variant`` (the kernel module's variant, e.g. "fast", "readable", "tensorcore";
None for the default), ``pass`` ("forward", "backward" or "fwd+bwd") and the shape (batch, nheads, N,
d; fp32, non-causal, no dropout). :func:`prepare` builds the inputs and returns the function that
makes exactly that call (for "backward", the forward runs once outside it), so a caller can time it
or wrap it in an NVTX range.

The IO model's count for a case (:func:`model_count`) uses the closed forms of
:mod:`numba_flash_reference.io_model` at the tiles the case's kernels use (:func:`tiles`), and for
block-sparse the kernels' exact count :func:`numba_flash.alg5_block_sparse.hbm_accesses` beside the
paper's. Elements are 4 bytes (fp32).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numba_flash

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ("standard", "flash1", "flash2", "block-sparse")
#: The variants measured per algorithm (None: the algorithm has one kernel set).
VARIANTS = {"standard": (None,), "flash1": ("fast", "readable"), "flash2": ("fast", "tensorcore", "readable"), "block-sparse": (None,)}
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


def on_gpu() -> bool:

    return not numba_flash.is_simulator()


# ----------------------------------------------------------------------------------------------
# Provenance
# ----------------------------------------------------------------------------------------------
def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None


def provenance(command: str | None = None) -> dict:
    """Device, versions, date, command and commit of a results file."""
    from importlib.metadata import PackageNotFoundError, version

    import numba

    def ver(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    out = {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command if command is not None else " ".join([os.path.basename(sys.executable), *sys.argv]),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "backend": numba_flash.describe(),
        "python": platform.python_version(),
        "numba": numba.__version__,
        "numba_cuda": ver("numba-cuda"),
        "numpy": np.__version__,
        "torch": ver("torch"),
        "host": platform.node(),
    }
    out.update(device_info())
    return out


def device_info() -> dict:
    """GPU name, compute capability, SM count, L2 size (bytes) and memory, from torch; {} without a GPU."""
    if not on_gpu():
        return {"device": "Numba CUDA simulator (CPU)"}
    import torch

    p = torch.cuda.get_device_properties(0)
    info = {
        "device": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "l2_bytes": int(getattr(p, "L2_cache_size", 0)) or None,
        "memory_bytes": int(p.total_memory),
        "cuda_runtime_torch": torch.version.cuda,
    }
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
    except Exception:
        info["driver"] = None
    return info


def write_json(path, data) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return path


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

    return registry.resolve(algorithm, pass_, "auto").variant


def _introspect_tiles(algorithm: str, variant: str, pass_: str, d: int):
    """(Br, Bc) as the variant's module chooses them by default on this backend (may raise)."""
    from numba_flash import registry
    from numba_flash._launch import check_attention_args

    import numpy as np

    x = np.zeros((1, 1, 1, d), np.float32)
    prob = check_attention_args(x, x, x)
    return tuple(registry.resolve(algorithm, pass_, variant).module.choose_block_sizes(prob))


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
# Masks, FLOPs, the IO model
# ----------------------------------------------------------------------------------------------
def block_mask(pattern: str, Tr: int, Tc: int, density: float | None = None) -> np.ndarray:
    """"butterfly" (the flat block butterfly), "banded" (``density`` of the blocks, same count per row) or "dense"."""
    from numba_flash_reference.alg5_block_sparse import butterfly_block_mask
    from numba_flash_reference.io_model import banded_block_mask

    if pattern == "butterfly":
        return butterfly_block_mask(Tr, Tc)
    if pattern == "banded":
        return banded_block_mask(Tr, Tc, density)
    if pattern == "dense":
        return np.ones((Tr, Tc), bool)
    raise ValueError(f"unknown mask pattern {pattern!r}")


def matmul_flops(algorithm: str, pass_: str, batch: int, nheads: int, N: int, d: int, density: float = 1.0) -> float:
    """FLOPs of the matrix products (2 per multiply-add) a pass computes.

    Forward: S = QK^T and PV (2 products of N^2 d). Backward: standard attention's 4 (dV, dP, dQ, dK);
    FlashAttention's 5 (it recomputes S). Block-sparse: the FlashAttention count times the density.
    """
    per = 2.0 * batch * nheads * N * N * d
    n = {"forward": 2, "backward": 4 if algorithm == "standard" else 5}
    count = n["forward"] + n["backward"] if pass_ == "fwd+bwd" else n[pass_]
    return count * per * (density if algorithm == "block-sparse" else 1.0)


def _io_one(algorithm, pass_, batch, nheads, N, d, tile, mask):
    from numba_flash_reference import io_model

    kw = dict(b=batch, h=nheads)
    if algorithm == "standard":
        c = io_model.io_standard_forward(N, d, **kw) if pass_ == "forward" else io_model.io_alg3_backward(N, d, **kw)
        return c, c
    Br, Bc = tile
    if algorithm == "flash1":
        c = io_model.io_alg1_forward(N, d, Br=Br, Bc=Bc, **kw) if pass_ == "forward" else io_model.io_alg4_backward(N, d, Br=Br, Bc=Bc, **kw)
        return c, c
    if algorithm == "flash2":
        c = io_model.io_fa2_forward(N, d, Br=Br, Bc=Bc, **kw) if pass_ == "forward" else io_model.io_fa2_backward(N, d, Br=Br, Bc=Bc, **kw)
        return c, c
    if algorithm == "block-sparse":
        from numba_flash._launch import Problem
        from numba_flash.alg5_block_sparse import BlockMask, hbm_accesses
        from numba_flash_reference.alg5_block_sparse import io_alg5_backward

        prob = Problem(batch, N, N, nheads, nheads, d, 1.0 / np.sqrt(d), False, 0.0, 0)
        bm = BlockMask(mask=np.ascontiguousarray(np.broadcast_to(mask, (1, 1) + mask.shape)), block_size=tuple(tile))
        kernel = hbm_accesses(bm, prob, pass_)
        paper = (io_model.io_alg5_block_sparse(N, d, mask, Br=Br, Bc=Bc, **kw) if pass_ == "forward"
                 else io_alg5_backward(N, d, mask, Br=Br, Bc=Bc, **kw))
        return kernel, paper
    raise ValueError(algorithm)


def model_count(algorithm: str, pass_: str, batch: int, nheads: int, N: int, d: int, tile=None, bwd_tile=None, mask=None) -> dict:
    """The IO model's HBM traffic of a case, in bytes: ``{"model_read", "model_write", "model_bytes",
    "paper_model_bytes"}`` (the two differ only for block-sparse, whose kernels' exact count departs
    from Proposition 4's by documented details); fwd+bwd adds the two passes (``bwd_tile`` for the
    backward's tiles)."""
    passes = [("forward", tile), ("backward", bwd_tile if bwd_tile is not None else tile)] if pass_ == "fwd+bwd" else [(pass_, tile)]
    r = w = paper = 0
    for p, t in passes:
        exact, pap = _io_one(algorithm, p, batch, nheads, N, d, t, mask)
        r += exact.reads
        w += exact.writes
        paper += pap.total
    return {"model_read": r * ITEMSIZE, "model_write": w * ITEMSIZE, "model_bytes": (r + w) * ITEMSIZE,
            "paper_model_bytes": paper * ITEMSIZE}


def compulsory_bytes(pass_: str, batch: int, nheads: int, N: int, d: int) -> int:
    """The traffic no exact algorithm avoids: read the inputs once, write the outputs once (fp32).

    Forward: Q, K, V read, O written (4 N d per head). Backward: Q, K, V, O, dO read and dQ, dK, dV
    written (8 N d). fwd+bwd: both.
    """
    per = {"forward": 4, "backward": 8, "fwd+bwd": 12}[pass_]
    return per * batch * nheads * N * d * ITEMSIZE


# ----------------------------------------------------------------------------------------------
# The call a case makes
# ----------------------------------------------------------------------------------------------
def make_inputs(batch, nheads, N, d, seed=0, requires_grad=False, dtype="float32"):
    """q, k, v and an upstream gradient g in ``dtype`` (a torch dtype's name): torch CUDA tensors on a GPU, CPU
    tensors in the simulator."""
    import torch

    device = "cuda" if on_gpu() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, N, nheads, d)
    q, k, v, g = (torch.randn(shape, device=device, dtype=torch.float32, generator=gen).to(getattr(torch, dtype))
                  for _ in range(4))
    if requires_grad:
        for x in (q, k, v):
            x.requires_grad_(True)
    return q, k, v, g


def prepare(algorithm, variant, pass_, batch, nheads, N, d, mask=None, block_sizes=None, seed=0, dtype="float32", causal=False):
    """The call of one case as a function of no arguments (inputs built here in ``dtype``; see the module docstring;
    ``causal`` for the dense algorithms).

    For "backward" the forward runs once here and the function computes only the gradients
    (``torch.autograd.grad`` with ``retain_graph``, so it can run again and nothing accumulates).
    """
    from numba_flash import block_sparse_attn_func, flash_attn_func

    import torch

    grad = pass_ in ("backward", "fwd+bwd")
    q, k, v, g = make_inputs(batch, nheads, N, d, seed=seed, requires_grad=grad, dtype=dtype)

    def forward():
        if algorithm == "block-sparse":
            return block_sparse_attn_func(q, k, v, torch.from_numpy(np.asarray(mask)), block_size=tuple(block_sizes or BLOCK_SPARSE_TILES))
        with selected_variant(algorithm, variant) as extra:
            return flash_attn_func(q, k, v, causal=causal, algorithm=algorithm, block_sizes=block_sizes, **extra)

    def backward(out):
        # The backward runs on this thread, not on autograd's CUDA worker thread: NVTX ranges are per
        # thread, so under Nsight Compute (``--nvtx-include``) a worker-thread backward would profile
        # no kernel at all (seen on an H100: "0 kernel(s) profiled" for every backward case).
        with selected_variant(algorithm if algorithm != "block-sparse" else "", variant), \
                torch.autograd.set_multithreading_enabled(False):
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


def synchronize():
    if on_gpu():
        import torch

        torch.cuda.synchronize()


def time_ms(fn, warmup: int = 2, repeats: int = 10) -> dict:
    """Median (and min, max) milliseconds of ``fn()``: CUDA events on a GPU, wall clock in the simulator.

    The warm-up calls absorb JIT compilation.
    """
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    if on_gpu():
        import torch

        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": float(np.median(times)), "min_ms": float(np.min(times)), "max_ms": float(np.max(times)), "repeats": repeats}
