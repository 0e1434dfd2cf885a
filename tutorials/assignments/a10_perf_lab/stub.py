"""Assignment 10: the performance lab. Models, a bandwidth probe, an ncu parser, a roofline.  <-- your file.

Read first: FA1 section 2 (the memory hierarchy; attention is memory-bound), Theorem 2 (HBM accesses of
standard vs tiled attention), FA2 section 4.1 (how FLOPs are counted); ``tutorials/01_memory_hierarchy.py``.

This file holds the graded pieces of the lab; ``lab.py`` (given) uses them on a GPU to measure the
time and DRAM bytes of standard and FlashAttention-2 attention with Nsight Compute, compare them with
your models, and draw a roofline. Without a GPU you can do (and are graded on) everything here:

1. ``copy_kernel`` / ``copy``: a bandwidth probe, ``dst[:] = src[:]`` for 1-D float32 arrays of any
   length with a small fixed grid and a grid-stride loop (``cuda.grid(1)``, ``cuda.gridsize(1)``);
   each element read once and written once. On a GPU its GB/s is the roofline's memory roof.
2. ``attention_flops(N, d, batch_heads, causal)``: forward FLOPs, ``4 N^2 d`` per head (two N x N x d
   matmuls at 2 FLOPs per multiply-add), half with the causal mask.
3. ``standard_attention_hbm(N, d)``: ``(reads, writes)`` in elements, per head, of FA1 Algorithm 0
   (lines 1-3: S and P written to HBM and read back).
4. ``fa2_forward_hbm(N, d, Br, Bc, causal)``: the same for FA2 Algorithm 1 (Q once; K, V once per
   query tile; with ``causal``, query tile ``i`` loads only the key tiles ``0 .. floor(last row / Bc)``;
   O and L written once).
5. ``parse_ncu_csv(text)``: ``{kernel name: (DRAM read bytes, DRAM write bytes)}`` summed over all
   launches, from ``ncu --csv`` output (see ``data/ncu_sample.csv``: progress lines first, one row per
   (launch, metric), values with thousands separators, units ``byte``, ``Kbyte`` (10^3), ``Mbyte`` (10^6),
   ``Gbyte`` (10^9)).
6. ``roofline(flops, bytes_moved, peak_flops, peak_bandwidth)``: ``(intensity, attainable, bound)``.

Allowed imports: numpy, numba, math, csv, io, re and the like (not numba-flash).
Grade yourself: ``python -m pytest tutorials/assignments/a10_perf_lab``.
"""

from __future__ import annotations

import csv  # noqa: F401
import io  # noqa: F401
import math  # noqa: F401

from numba import cuda


@cuda.jit
def copy_kernel(src, dst):
    """``dst[:] = src[:]`` with a grid-stride loop."""
    # TODO
    raise NotImplementedError("a10: copy_kernel")


def copy(src, dst, blocks=4, threads=32):
    """Launch :func:`copy_kernel` with ``blocks`` blocks of ``threads`` threads (whatever the length)."""
    # TODO
    raise NotImplementedError("a10: copy")


def attention_flops(N, d, batch_heads=1, causal=False):
    """Forward FLOPs of attention: ``4 N^2 d`` per (batch, head); half of it when causal (an int)."""
    # TODO
    raise NotImplementedError("a10: attention_flops")


def standard_attention_hbm(N, d):
    """FA1 Algorithm 0, one head: ``(reads, writes)`` in elements."""
    # TODO
    raise NotImplementedError("a10: standard_attention_hbm")


def fa2_forward_hbm(N, d, Br, Bc, causal=False):
    """FA2 Algorithm 1, one head, tiles ``Br x Bc``: ``(reads, writes)`` in elements."""
    # TODO
    raise NotImplementedError("a10: fa2_forward_hbm")


def parse_ncu_csv(text):
    """``{kernel name: (dram read bytes, dram write bytes)}`` (ints) summed over launches; ``{}`` if there are no
    rows."""
    # TODO
    raise NotImplementedError("a10: parse_ncu_csv")


def roofline(flops, bytes_moved, peak_flops, peak_bandwidth):
    """``(intensity, attainable FLOP/s, "memory" or "compute")``."""
    # TODO
    raise NotImplementedError("a10: roofline")
