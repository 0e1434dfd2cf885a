"""The warp-level tensor-core steps of :mod:`numba_flash.fast._mma` (used by :mod:`numba_flash.fast.fa2_forward_tc`).

Claims checked:

* The tf32 split keeps about 22 bits: ``big`` is ``x`` rounded to nearest on 10 mantissa bits (ties
  away, the 13 low bits zero, as ``cvt.rna.tf32.f32``), ``small`` the same rounding of ``x - big``,
  and ``|x - big - small| <= 2^-22 |x|``; the device split equals the host one bit for bit.
* The ``m16n8k8`` fragment layout is the PTX ISA's: with small-integer inputs (exact in tf32, so the
  small parts are zero; exact products and sums) each lane's ``D`` fragment is exactly ``A B + C`` at the documented positions.
  The same test runs in the simulator (the Python twin) and on a GPU (``mma.sync`` through inline
  PTX), so the twin is checked against the hardware.
* A 3xTF32 product (split both inputs, three mma, small parts first) of random float32 tiles is within
  the error rule: at most 2x the error of a float32 ``A @ B + C`` against float64.
"""

from __future__ import annotations

from numba_flash import _backend
from numba_flash.fast import _mma

import numpy as np
import pytest
from attn_testing import assert_error_rule
from numba import cuda, float32

split_tf32, mma_3xtf32, quad_max, quad_sum = _mma.make_warp_ops()
SX = 2 * _mma.SIM_SCRATCH_PER_WARP


@cuda.jit
def _split_kernel(x, big, small):
    i = cuda.grid(1)
    if i < x.size:
        b, s = split_tf32(x[i])
        big[i] = b
        small[i] = s


@cuda.jit
def _mma_kernel(A, B, C, D):
    """One warp: lane (g, t) loads its fragments of A (16x8), B (8x8), C (16x8), runs the 3xTF32
    product (three mma) and stores its D fragment at the documented positions."""
    sx = cuda.shared.array(SX, float32)
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    a = (A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4])
    b = (B[t, g], B[t + 4, g])
    c = (C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
    a0b, a0s = split_tf32(a[0])
    a1b, a1s = split_tf32(a[1])
    a2b, a2s = split_tf32(a[2])
    a3b, a3s = split_tf32(a[3])
    b0b, b0s = split_tf32(b[0])
    b1b, b1s = split_tf32(b[1])
    d = mma_3xtf32((a0b, a1b, a2b, a3b), (a0s, a1s, a2s, a3s), (b0b, b1b), (b0s, b1s), c, sx, 0, lane)
    D[g, 2 * t] = d[0]
    D[g, 2 * t + 1] = d[1]
    D[g + 8, 2 * t] = d[2]
    D[g + 8, 2 * t + 1] = d[3]


def _tf32_ok() -> bool:
    return _backend.is_simulator() or cuda.get_current_device().compute_capability >= (8, 0)


def _host_split(x):
    big = np.array([_mma._tf32_bits_host(v) for v in x], dtype=np.uint32)
    rest = (x - big.view(np.float32)).astype(np.float32)
    small = np.array([_mma._tf32_bits_host(v) for v in rest], dtype=np.uint32)
    return big, small


def test_tf32_split_keeps_22_bits(rng):
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-20, 20, 4096))).astype(np.float32)
    big, small = _host_split(x)
    assert np.all(big & 0x1FFF == 0) and np.all(small & 0x1FFF == 0), "tf32 patterns have 13 zero low bits"
    bf, sf = big.view(np.float32).astype(np.float64), small.view(np.float32).astype(np.float64)
    assert np.all(np.abs(x - bf) <= 2.0**-11 * np.abs(x)), "big: round to nearest on 10 mantissa bits"
    assert np.all(np.abs(x - bf - sf) <= 2.0**-22 * np.abs(x))
    # ties go away from zero, as cvt.rna: 1 + 2^-11 is half a tf32 ulp above 1
    tie = np.array([1 + 2.0**-11, -(1 + 2.0**-11)], dtype=np.float32)
    assert list(_host_split(tie)[0].view(np.float32)) == [1 + 2.0**-10, -(1 + 2.0**-10)]


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync TF32 (compute capability >= 8.0)")
def test_device_tf32_split_equals_host(rng):
    x = (rng.standard_normal(1000) * np.exp2(rng.integers(-30, 30, 1000))).astype(np.float32)
    big = np.zeros(x.size, dtype=np.uint32)
    small = np.zeros(x.size, dtype=np.uint32)
    _split_kernel[(x.size + 127) // 128, 128](x, big, small)
    hb, hs = _host_split(x)
    assert np.array_equal(big, hb) and np.array_equal(small, hs)


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync TF32 (compute capability >= 8.0)")
def test_mma_m16n8k8_fragment_layout_is_exact_on_integers(rng):
    A = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    B = rng.integers(-8, 9, (8, 8)).astype(np.float32)
    C = rng.integers(-64, 65, (16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, dtype=np.float32)
    _mma_kernel[1, 32](A, B, C, D)  # integers: the small parts are 0, so this is one exact mma plus zeros
    assert np.array_equal(D, A.astype(np.float64) @ B + C), "D fragment != A B + C at the documented positions"


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync TF32 (compute capability >= 8.0)")
def test_3xtf32_product_within_twice_float32_error(rng):
    A = rng.standard_normal((16, 8)).astype(np.float32)
    B = rng.standard_normal((8, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, dtype=np.float32)
    _mma_kernel[1, 32](A, B, C, D)
    ref = A.astype(np.float64) @ B.astype(np.float64) + C
    assert_error_rule(D, ref, (A @ B + C).astype(np.float32), what="3xTF32 A B + C")
