"""Helpers for the unit tests of the SRAM layouts of :mod:`numba_flash.fast._tiles`: a tile with a NaN in it, one block
that runs a pass over SRAM (the split passes) and copies the words out, and a swizzle run on the device.

numba is imported after :mod:`numba_flash` (which chooses the CUDA backend, GPU or simulator, before numba is first
imported), and at module level, so that the simulator swaps the ``cuda`` module its kernels see.
"""

from __future__ import annotations

import numba_flash  # noqa: F401  (first: it chooses the backend)

import numpy as np
from numba import cuda, float32, uint32


def nan_tile(rng, rows, cols, sa):
    """A float32 SRAM tile (row stride ``sa``) of normal values with a NaN that is not the quiet one, and a zero row."""
    a = np.zeros((rows, sa), np.float32)
    a[:, :cols] = rng.standard_normal((rows, cols)).astype(np.float32) * 3
    a[1, 5] = np.uint32(0xFFC00001).view(np.float32)
    a[rows - 1, :] = 0.0
    return a


def run_sram_pass(apply, NT, src, n_words, out_off, n_out):
    """One block of ``NT`` threads: SRAM words ``< len(src)`` filled from ``src``, the rest up to ``n_words`` with -7.0
    (words a pass must not leave as they were), then ``apply(smem, words, tid)`` (a device function calling the pass
    under test), then words ``out_off .. out_off + n_out - 1`` copied out as uint32 (the split passes of
    :mod:`numba_flash.fast._tiles`)."""
    N_IN = src.size

    @cuda.jit
    def run(src, out):
        smem = cuda.shared.array(0, float32)
        words = cuda.shared.array(0, uint32)
        for i in range(cuda.threadIdx.x, n_words, NT):
            smem[i] = src[i] if i < N_IN else float32(-7.0)
        cuda.syncthreads()  # Sync: the tile is filled before the pass reads it
        apply(smem, words, uint32(cuda.threadIdx.x))
        cuda.syncthreads()  # Sync: every thread's parts are written before the copy out
        for i in range(cuda.threadIdx.x, n_out, NT):
            out[i] = words[out_off + i]

    out = np.zeros(n_out, np.uint32)
    run[1, NT, 0, 4 * n_words](src, out)
    return out


def device_swizzle(swizzle, cols=128, rows=16):
    """``swizzle(col, row)`` (a device function of :mod:`numba_flash.fast._tiles`) for every ``col < cols`` of every
    ``row < rows``, computed on the device (or the simulator), element ``row * cols + col``."""

    @cuda.jit
    def k(out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = swizzle(uint32(i % cols), uint32(i // cols))

    out = cuda.to_device(np.zeros(cols * rows, np.uint32))
    k[(cols * rows + 255) // 256, 256](out)
    return out.copy_to_host()


def swizzle16_host(col, row):
    """:func:`numba_flash.fast._tiles.swizzle16` on the host, for ints or integer arrays (a device function cannot be
    called from the host on a GPU; the simulator allows it): ``col ^ 16`` in odd rows."""
    return col ^ (16 * (row & 1))
