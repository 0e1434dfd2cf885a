"""The warp-level tensor-core steps of :mod:`numba_flash.tensorcore.ptx` (used by
:mod:`numba_flash.tensorcore.fa2_forward_tf32`).

Claims checked:

* The tf32 split keeps about 22 bits: ``big`` is ``x`` rounded to nearest on 10 mantissa bits (ties
  away, the 13 low bits zero, as ``cvt.rna.tf32.f32``), ``small`` the same rounding of ``x - big``,
  and ``|x - big - small| <= 2^-22 |x|``; the device split equals the host one bit for bit.
* The NaN-keeping split (for an operand the kernel computes, whose NaN is the GPU's ``0x7fffffff``) keeps a NaN a
  NaN and splits everything else as the plain one.
* The ``m16n8k8`` fragment layout is the PTX ISA's: with small-integer inputs (exact in tf32, so the
  small parts are zero; exact products and sums) each lane's ``D`` fragment is exactly ``A B + C`` at the documented
  positions. The same test runs in the simulator (the Python twin) and on a GPU (``mma.sync`` through inline
  PTX), so the twin is checked against the hardware.
* A 3xTF32 product (split both inputs, three mma, small parts first) of random float32 tiles is within
  the error rule: at most 2x the error of a float32 ``A @ B + C`` against float64.
"""

from __future__ import annotations

from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import ptx

import numpy as np
import pytest
from attn_testing import assert_error_rule
from numba import cuda, float32, uint32

split_tf32, mma_3xtf32, quad_max, quad_sum = ptx.make_warp_ops()
SX = 2 * ptx.SIM_SCRATCH_PER_WARP


@cuda.jit
def _split_kernel(x, big, small):
    i = cuda.grid(1)
    if i < x.size:
        b, s = split_tf32(x[i])
        big[i] = b
        small[i] = s


split_keep_nan = ptx.make_split_keep_nan()


if _backend.is_simulator():

    @cuda.jit(device=True)
    def _mul(a, b):
        """``a * b`` as the GPU's ``mul.f32`` computes it: a signalling NaN times anything is a quiet NaN, with no
        flag raised, where numpy's scalar product would warn (the simulator runs this twin)."""
        with np.errstate(invalid="ignore"):
            return a * b

else:

    @cuda.jit(device=True)
    def _mul(a, b):
        """``a * b``: ``mul.f32``."""
        return a * b


@cuda.jit
def _split_keep_nan_kernel(x, scale, big, small):
    """``split_keep_nan(x * scale)``: a NaN product is the GPU's ``0x7fffffff`` whatever NaN ``x`` held (``x`` holds
    a signalling NaN too)."""
    i = cuda.grid(1)
    if i < x.size:
        b, s = split_keep_nan(_mul(x[i], scale[0]))
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
    big = np.array([ptx._tf32_bits_host(v) for v in x], dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN, as the GPU's split gives
        rest = (x - big.view(np.float32)).astype(np.float32)
    small = np.array([ptx._tf32_bits_host(v) for v in rest], dtype=np.uint32)
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


def _bits(*patterns):
    return np.array(patterns, dtype=np.uint32).view(np.float32)


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync TF32 (compute capability >= 8.0)")
@pytest.mark.parametrize("scale", [1.0, 0.18033688])
def test_the_nan_keeping_split_of_a_product_keeps_nan_and_splits_the_rest_as_the_host(rng, scale):
    """The 3xTF32 backward splits ``Q_i tau log2 e`` per warp. On a GPU a NaN product is ``0x7fffffff``, which the
    plain split's rounding (add ``0x1000``) carries into ``-0.0``: a NaN in ``Q`` then left ``dV`` clean (H200,
    2026-11-28). The NaN-keeping split (``ptx.make_split_keep_nan``) clamps the bits first: a NaN product stays a NaN,
    every other value (finite, the largest float32, inf) gets the host's big part bit for bit, and every finite value
    its small part. (The small part of an inf is the split of ``inf - inf``: the host keeps that NaN, the GPU's
    rounding makes it -0.0, in this split as in the plain one; the big part carries the inf.)"""
    nans = _bits(0x7FFFFFFF, 0x7FFFF000, 0x7FC00000, 0x7F800001, 0xFFC00000)  # the GPU's NaN, the carry edge, others
    edges = np.array([np.inf, -np.inf, 0.0, -0.0, np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    x = np.concatenate(
        [nans, edges, (rng.standard_normal(500) * np.exp2(rng.integers(-30, 30, 500))).astype(np.float32)]
    )
    big = np.zeros(x.size, dtype=np.uint32)
    small = np.zeros(x.size, dtype=np.uint32)
    _split_keep_nan_kernel[(x.size + 127) // 128, 128](x, np.array([scale], np.float32), big, small)
    assert np.isnan(big[: nans.size].view(np.float32)).all(), (
        f"NaN products split to {[hex(b) for b in big[: nans.size]]}"
    )
    with np.errstate(over="ignore"):
        rest = (x[nans.size :] * np.float32(scale)).astype(np.float32)
    hb, hs = _host_split(rest)
    np.testing.assert_array_equal(big[nans.size :], hb)
    finite = np.isfinite(rest)
    assert finite.sum() == rest.size - 2, "the two infinities are the only values without a small part to compare"
    np.testing.assert_array_equal(small[nans.size :][finite], hs[finite])


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


# ------------------------------------------------------------------------------------------------
# Half precision (fa2_forward_half): pack2 and mma.m16n8k16
# ------------------------------------------------------------------------------------------------
SXH = ptx.HALF_SIM_SCRATCH_PER_WARP
_HALF = {kind: ptx.make_half_ops(kind) for kind in ("f16", "bf16")}


def _make_half_kernels(kind):
    pack2, mma16, ldsm, ldsm_t = _HALF[kind]

    @cuda.jit
    def pack_kernel(lo, hi, out):
        i = cuda.grid(1)
        if i < lo.size:
            out[i] = pack2(lo[i], hi[i])

    @cuda.jit
    def mma_kernel(Aw, Bw, C, D):
        """One warp: A (16x16) as words Aw[r, w] = (A[r, 2w], A[r, 2w+1]), B (16x8) as words of two k rows
        Bw[w, n] = (B[2w, n], B[2w+1, n]); lane (g, t) takes its fragments and stores its D fragment."""
        sx = cuda.shared.array(SXH, float32)
        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        a = (Aw[g, t], Aw[g + 8, t], Aw[g, t + 4], Aw[g + 8, t + 4])
        b = (Bw[t, g], Bw[t + 4, g])
        c = (C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
        d = mma16(a, b, c, sx, 0, lane)
        D[g, 2 * t] = d[0]
        D[g, 2 * t + 1] = d[1]
        D[g + 8, 2 * t] = d[2]
        D[g + 8, 2 * t + 1] = d[3]

    @cuda.jit
    def ldsm_kernel(W, R, RT):
        """One warp: a 32 x 4-word tile to SRAM; lane l gives row l (matrix l // 8) to ldmatrix.x4 and .trans."""
        sx = cuda.shared.array(SXH, float32)
        tile = cuda.shared.array(128, uint32)
        lane = cuda.threadIdx.x
        for w in range(4):
            tile[lane * 4 + w] = W[lane, w]
        cuda.syncthreads()
        r = ldsm(tile, lane * 4, sx, 0, lane)
        rt = ldsm_t(tile, lane * 4, sx, 0, lane)
        for j in range(4):
            R[lane, j] = r[j]
            RT[lane, j] = rt[j]

    return pack_kernel, mma_kernel, ldsm_kernel


_HALF_KERNELS = {kind: _make_half_kernels(kind) for kind in ("f16", "bf16")}


def _host_bits(x, kind):
    return np.array([ptx.half_bits_host(v, kind) for v in x], dtype=np.uint32)


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync (compute capability >= 8.0)")
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_pack2_rounds_to_nearest_even_like_the_host(rng, kind):
    # random magnitudes, exact ties (a float32 halfway between two halves) and specials
    x = (rng.standard_normal(512) * np.exp2(rng.integers(-12, 12, 512))).astype(np.float32)
    ulp = 2.0**-10 if kind == "f16" else 2.0**-7
    ties = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 70000.0, np.inf, -np.inf], dtype=np.float32)
    lo = np.concatenate([x, ties])
    hi = lo[::-1].copy()
    out = np.zeros(lo.size, dtype=np.uint32)
    _HALF_KERNELS[kind][0][(lo.size + 127) // 128, 128](lo, hi, out)
    want = _host_bits(lo, kind) | (_host_bits(hi, kind) << 16)
    assert np.array_equal(out, want), f"{np.count_nonzero(out != want)} words differ from round-to-nearest-even"
    # ties go to even: 1 + ulp/2 -> 1, 1 + 3 ulp/2 -> 1 + 2 ulp
    vals = [ptx.half_value_host(b, kind) for b in _host_bits(ties[:2], kind)]
    assert vals == [1.0, 1 + 2 * ulp]


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync (compute capability >= 8.0)")
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_m16n8k16_fragment_layout_is_exact_on_integers(rng, kind):
    A = rng.integers(-8, 9, (16, 16)).astype(np.float32)
    B = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    C = rng.integers(-64, 65, (16, 8)).astype(np.float32)
    Aw = (_host_bits(A[:, 0::2].ravel(), kind) | (_host_bits(A[:, 1::2].ravel(), kind) << 16)).reshape(16, 8)
    Bw = (_host_bits(B[0::2].ravel(), kind) | (_host_bits(B[1::2].ravel(), kind) << 16)).reshape(8, 8)
    D = np.full((16, 8), np.nan, dtype=np.float32)
    _HALF_KERNELS[kind][1][1, 32](Aw, Bw, C, D)  # small integers: exact in half and in the float32 sums
    assert np.array_equal(D, A.astype(np.float64) @ B + C), "D fragment != A B + C at the documented positions"


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync (compute capability >= 8.0)")
def test_ldmatrix_x4_gives_each_lane_its_fragment_words(rng):
    # 4 matrices of 8 rows x 8 halves (16-bit patterns); lane l holds row l (matrix l // 8, row l % 8)
    H = rng.integers(0, 2**16, (32, 8)).astype(np.uint32)
    W = H[:, 0::2] | (H[:, 1::2] << 16)
    R = np.zeros((32, 4), np.uint32)
    RT = np.zeros((32, 4), np.uint32)
    _HALF_KERNELS["f16"][2][1, 32](W, R, RT)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for j in range(4):
            M = H[8 * j : 8 * j + 8]
            assert R[lane, j] == W[8 * j + g, t], "ldmatrix: word t of row g of matrix j"
            assert RT[lane, j] == M[2 * t, g] | (M[2 * t + 1, g] << 16), "ldmatrix.trans: elements (2t, g), (2t + 1, g)"


_UNPACK = {kind: ptx.make_unpack2(kind) for kind in ("f16", "bf16")}


def _make_unpack_kernel(kind):
    unpack2 = _UNPACK[kind]

    @cuda.jit
    def unpack_kernel(words, lo, hi):
        i = cuda.grid(1)
        if i < words.size:
            lo[i], hi[i] = unpack2(words[i])

    return unpack_kernel


_UNPACK_KERNELS = {kind: _make_unpack_kernel(kind) for kind in ("f16", "bf16")}


@pytest.mark.skipif(not _tf32_ok(), reason="needs mma.sync (compute capability >= 8.0)")
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_unpack2_gives_back_both_halves_of_a_word_exactly(rng, kind):
    # every finite pattern class: random bits (subnormals, both signs, large exponents), plus +-0 and +-inf;
    # NaN patterns are left out (their payload is not a value)
    bits = rng.integers(0, 2**16, 4096).astype(np.uint32)
    vals = np.array([ptx.half_value_host(b, kind) for b in bits])
    bits = np.concatenate(
        [bits[np.isfinite(vals)], _host_bits(np.array([0.0, -0.0, np.inf, -np.inf], np.float32), kind)]
    )
    lo_bits, hi_bits = bits, bits[::-1].copy()
    words = (lo_bits | (hi_bits << 16)).astype(np.uint32)
    lo = np.full(words.size, np.nan, np.float32)
    hi = np.full(words.size, np.nan, np.float32)
    _UNPACK_KERNELS[kind][(words.size + 127) // 128, 128](words, lo, hi)
    want_lo = np.array([ptx.half_value_host(b, kind) for b in lo_bits], np.float32)
    want_hi = np.array([ptx.half_value_host(b, kind) for b in hi_bits], np.float32)
    assert np.array_equal(lo.view(np.uint32), want_lo.view(np.uint32)), "low half (bits, so -0.0 counts)"
    assert np.array_equal(hi.view(np.uint32), want_hi.view(np.uint32)), "high half"


def _make_add2_kernel(vector):
    add2 = ptx.make_atomic_add2(vector)

    @cuda.jit
    def add2_kernel(out, vals):
        """Thread i adds vals[i, 0], vals[i, 1] to columns 2 (i % 4), + 1 of row (i // 4) % 3 of out[1, :, 1, :]."""
        i = cuda.grid(1)
        if i < vals.shape[0]:
            add2(out, (1, (i // 4) % 3, 1, 2 * (i % 4)), vals[i, 0], vals[i, 1])

    return add2_kernel


@pytest.mark.parametrize("vector", [pytest.param(False, id="two-atomics"), pytest.param(True, id="red.v2")])
def test_atomic_add2_adds_both_columns_of_every_lane(rng, vector):
    if vector and not _backend.is_simulator() and cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("red.global.add.v2.f32 needs compute capability 9.0")
    vals = rng.integers(-64, 65, (96, 2)).astype(np.float32)  # small integers: every order of the sums is exact
    out = np.zeros((2, 3, 2, 8), np.float32)
    d_out = cuda.to_device(out)
    _make_add2_kernel(vector)[1, 96](d_out, vals)
    want = np.zeros_like(out)
    for i in range(96):
        want[1, (i // 4) % 3, 1, 2 * (i % 4) : 2 * (i % 4) + 2] += vals[i]
    np.testing.assert_array_equal(d_out.copy_to_host(), want)
