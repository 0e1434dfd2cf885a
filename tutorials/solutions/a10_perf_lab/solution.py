"""Assignment 10, solution (course staff): the performance lab's graded pieces.

Paper: FA1 section 2 (arithmetic intensity; attention is memory-bound), Theorem 2 and Proposition 3
(HBM accesses), FA2 section 4.1 (FLOP counts: ``4 N^2 d`` per head for the forward, halved with the
causal mask). The lab script (``lab.py``, GPU only) measures time and DRAM bytes with Nsight Compute
and draws a roofline with these functions; the autograder checks them on the CPU.

Kept by course staff, never in the handout.
"""

from __future__ import annotations

import csv
import io
import math

from numba import cuda

UNIT_BYTES = {"byte": 1, "Kbyte": 10**3, "Mbyte": 10**6, "Gbyte": 10**9, "Tbyte": 10**12}


# ----------------------------------------------------------------------------------------------
# 1. A bandwidth probe: the memory roof of the roofline
# ----------------------------------------------------------------------------------------------
@cuda.jit
def copy_kernel(src, dst):
    """``dst[:] = src[:]`` with a grid-stride loop: consecutive threads touch consecutive elements (coalesced)."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, src.shape[0], stride):
        dst[k] = src[k]  # HBM read: 1, HBM write: 1 per element


def copy(src, dst, blocks=4, threads=32):
    """Launch :func:`copy_kernel` on 1-D arrays: a small fixed grid, the loop covers any length."""
    copy_kernel[blocks, threads](src, dst)


# ----------------------------------------------------------------------------------------------
# 2. The models: FLOPs and HBM accesses (elements, per head)
# ----------------------------------------------------------------------------------------------
def attention_flops(N, d, batch_heads=1, causal=False):
    """Forward FLOPs: two N x N x d matmuls (``QK^T`` and ``PV``) = ``4 N^2 d`` per head; half of it when causal."""
    flops = 4 * N * N * d * batch_heads
    return flops // 2 if causal else flops


def standard_attention_hbm(N, d):
    """FA1 Algorithm 0: ``(reads, writes)`` in elements. L1 reads Q, K and writes S; L2 reads S, writes P;
    L3 reads P, V and writes O."""
    reads = N * d + N * d + N * N + N * N + N * d  # Q, K; S; P, V
    writes = N * N + N * N + N * d  # S; P; O
    return reads, writes


def fa2_forward_hbm(N, d, Br, Bc, causal=False):
    """FA2 Algorithm 1: ``(reads, writes)`` in elements: Q once, K and V once per query tile (only the tiles
    on or below the diagonal when causal), O and L once."""
    keys = 0
    for i in range(math.ceil(N / Br)):
        if causal:
            last_row = min(N, (i + 1) * Br) - 1
            keys += min(N, Bc * (last_row // Bc + 1))
        else:
            keys += N
    reads = N * d + 2 * keys * d
    writes = N * d + N
    return reads, writes


# ----------------------------------------------------------------------------------------------
# 3. Nsight Compute's CSV
# ----------------------------------------------------------------------------------------------
def parse_ncu_csv(text):
    """``{kernel name: (dram read bytes, dram write bytes)}`` summed over every launch of each kernel.

    Skips ncu's ``==PROF==`` lines and anything before the header; values may carry thousands
    separators (``"4,194,304"``) and scaled units (``Kbyte`` = 1000 bytes, ...).
    """
    lines = text.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {}
    out = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        metric = row.get("Metric Name")
        if metric not in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            continue
        value = float(row["Metric Value"].replace(",", "")) * UNIT_BYTES[row["Metric Unit"]]
        r, w = out.get(row["Kernel Name"], (0, 0))
        if metric == "dram__bytes_read.sum":
            r += value
        else:
            w += value
        out[row["Kernel Name"]] = (r, w)
    return {k: (int(round(r)), int(round(w))) for k, (r, w) in out.items()}


# ----------------------------------------------------------------------------------------------
# 4. The roofline
# ----------------------------------------------------------------------------------------------
def roofline(flops, bytes_moved, peak_flops, peak_bandwidth):
    """``(intensity, attainable FLOP/s, bound)``: ``intensity = flops / bytes``, attainable
    ``= min(peak_flops, intensity * peak_bandwidth)``, bound ``"memory"`` left of the ridge point, else
    ``"compute"``."""
    intensity = flops / bytes_moved
    attainable = min(peak_flops, intensity * peak_bandwidth)
    bound = "memory" if intensity * peak_bandwidth < peak_flops else "compute"
    return intensity, attainable, bound
