"""What a compiled kernel costs the SM: registers, shared memory, local memory and occupancy.

Occupancy is the fraction of an SM's warp slots that resident blocks fill. It is limited by whichever
resource runs out first: registers (``regs/thread x threads/block`` out of the SM's register file,
allocated per warp in units of 256), shared memory (per block, plus a driver-reserved 1 KB on
sm_80+), threads (2048 per SM on Hopper) and a cap on resident blocks (32). A kernel that keeps
large tiles in registers and shared memory trades occupancy for on-chip reuse; this module makes the
trade visible in the benchmark results. ``grid_blocks`` (optional) adds the *achieved* view: FA1's one
block per (batch, head) can leave SMs idle however high the theoretical occupancy.

Everything here needs a GPU (the simulator compiles nothing): in the simulator the functions return
``None`` values so callers can record "not measured".

Usage::

    >>> from numba_flash.runtime import resources as _inspect
    >>> _inspect.kernel_report(None, threads_per_block=128)["backend"]  # doctest: +SKIP
    'gpu'
"""

from __future__ import annotations

from numba import cuda

from . import backend as _backend

#: Hopper (sm_90) limits, used when a device attribute cannot be read.
_DEFAULT_LIMITS = {
    "max_threads_per_sm": 2048,
    "max_regs_per_sm": 65536,
    "max_regs_per_block": 65536,
    "max_smem_per_sm": 233472,
    "reserved_smem_per_block": 1024,
    "max_blocks_per_sm": 32,
    "warp_size": 32,
    "sm_count": 132,
}
_REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256


def device_limits() -> dict | None:
    """The current device's per-SM limits (None in the simulator)."""
    if _backend.is_simulator():
        return None
    dev = cuda.get_current_device()
    names = {
        "max_threads_per_sm": "MAX_THREADS_PER_MULTI_PROCESSOR",
        "max_regs_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
        "max_regs_per_block": "MAX_REGISTERS_PER_BLOCK",
        "max_smem_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
        "reserved_smem_per_block": "RESERVED_SHARED_MEMORY_PER_BLOCK",
        "max_blocks_per_sm": "MAX_BLOCKS_PER_MULTIPROCESSOR",
        "warp_size": "WARP_SIZE",
        "sm_count": "MULTIPROCESSOR_COUNT",
    }
    out = {}
    for key, attr in names.items():
        try:
            out[key] = int(getattr(dev, attr))
        except Exception:  # pragma: no cover - attribute missing in an old driver binding
            out[key] = _DEFAULT_LIMITS[key]
    return out


def _one(value):
    """Dispatcher getters return a dict {signature: value} when several overloads exist: take the max."""
    if isinstance(value, dict):
        return max(value.values()) if value else None
    return value


def kernel_resources(dispatcher) -> dict:
    """Registers per thread, static shared memory per block (bytes), local memory per thread (bytes)."""
    if dispatcher is None or _backend.is_simulator():
        return {"regs_per_thread": None, "shared_mem_per_block": None, "local_mem_per_thread": None}
    return {
        "regs_per_thread": _one(dispatcher.get_regs_per_thread()),
        "shared_mem_per_block": _one(dispatcher.get_shared_mem_per_block()),
        "local_mem_per_thread": _one(dispatcher.get_local_mem_per_thread()),
    }


def theoretical_occupancy(
    regs_per_thread: int, smem_per_block: int, threads_per_block: int, limits: dict | None = None
) -> dict:
    """Resident blocks and warps per SM, and which resource limits them.

    Parameters
    ----------
    regs_per_thread, smem_per_block (bytes), threads_per_block : the kernel's footprint.
    limits : :func:`device_limits` (default: the current device; Hopper's values if unreadable).

    Returns
    -------
    dict with ``blocks_per_sm``, ``warps_per_sm``, ``max_warps_per_sm``, ``occupancy`` (0..1) and
    ``limiter`` (``"registers"``, ``"shared_memory"``, ``"threads"`` or ``"blocks"``).
    """
    lim = dict(_DEFAULT_LIMITS)
    lim.update(limits or device_limits() or {})
    ws = lim["warp_size"]
    warps = -(-threads_per_block // ws)
    regs_per_warp = -(-(max(regs_per_thread, 1) * ws) // _REG_ALLOC_UNIT) * _REG_ALLOC_UNIT
    by = {
        "registers": lim["max_regs_per_sm"] // (regs_per_warp * warps),
        "shared_memory": lim["max_smem_per_sm"] // (smem_per_block + lim["reserved_smem_per_block"])
        if smem_per_block
        else lim["max_blocks_per_sm"],
        "threads": lim["max_threads_per_sm"] // (warps * ws),
        "blocks": lim["max_blocks_per_sm"],
    }
    limiter = min(by, key=by.get)
    blocks = by[limiter]
    max_warps = lim["max_threads_per_sm"] // ws
    return {
        "blocks_per_sm": blocks,
        "warps_per_sm": blocks * warps,
        "max_warps_per_sm": max_warps,
        "occupancy": blocks * warps / max_warps,
        "limiter": limiter,
    }


def kernel_report(dispatcher, threads_per_block: int, grid_blocks: int | None = None) -> dict:
    """Resources and theoretical occupancy of a compiled kernel, as a flat dict for ``extra_info``.

    ``grid_blocks``: the launch's number of blocks; adds ``waves`` (blocks / (SMs x blocks per SM))
    and ``sm_fill`` (the fraction of SMs with work in the first wave).
    """
    res = kernel_resources(dispatcher)
    report = {"backend": _backend.BACKEND, "threads_per_block": threads_per_block, **res}
    if res["regs_per_thread"] is None:
        report.update(blocks_per_sm=None, occupancy=None, limiter=None)
        return report
    limits = device_limits()
    occ = theoretical_occupancy(res["regs_per_thread"], res["shared_mem_per_block"], threads_per_block, limits)
    report.update(blocks_per_sm=occ["blocks_per_sm"], occupancy=round(occ["occupancy"], 4), limiter=occ["limiter"])
    if grid_blocks is not None:
        slots = limits["sm_count"] * occ["blocks_per_sm"]
        report["grid_blocks"] = int(grid_blocks)
        report["waves"] = round(grid_blocks / slots, 3)
        report["sm_fill"] = round(min(1.0, grid_blocks / limits["sm_count"]), 4)
    return report
