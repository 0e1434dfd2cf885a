"""The 3xTF32 forward's ``SPLIT_KV`` (:mod:`numba_flash.tensorcore.fa2_forward_tf32`): ``K_j, V_j`` split into tf32
parts once.

Each 3xTF32 product needs the big and small tf32 parts of both operands. Without ``SPLIT_KV`` every warp splits the
``K_j`` and ``V_j`` values it loads, so a block of 8 warps splits each of them 8 times per key block; with it the
threads that copied a chunk split it once, in SRAM (:func:`numba_flash.fast._tiles.make_split_pass` for ``K_j``,
:func:`numba_flash.fast._tiles.make_v_pair_split_pass` for ``V_j``, whose parts go in the register pairs of the
``mma``'s B fragments), and the warps load both parts.

Claims checked:

* The split pass writes, for every element of a thread's chunks, the big part in place and the small part at the
  given distance: the split of the value, a NaN first made the quiet NaN; swizzled tiles and ragged shares included.
* The V pass puts the pair ``(V[8 kt + t, c], V[8 kt + t + 4, c])`` where lane ``(g, t)`` reads the B fragment of O's
  renamed column ``c = 32 a + 4 g + e`` (``WIDE``), and each 8-lane phase of those 16-byte loads touches 32 banks.
* The forward's O, L, m, l are bitwise those without it (the same function of the same values) on ragged, causal,
  GQA, dropout and ``MW = 2`` shapes, and with NaNs in K and V.
* It runs only with ``WIDE`` (so on the ``cp.async`` path); the kernel factory refuses it elsewhere; the plan's SRAM
  is :func:`numba_flash.tensorcore.fa2_forward_tf32.smem_floats` with ``split``, which fits the default d = 128 tiling.
* On a GPU (marker ``gpu``): the same bits at realistic shapes and the default tilings.

Simulator shapes stay tiny (N <= 45, d <= 32), as for ``WIDE``.
"""

from __future__ import annotations

import dataclasses

from numba_flash._launch import check_attention_args
from numba_flash.fast import _tiles
from numba_flash.runtime import backend as _backend
from numba_flash.runtime import smem as _smem
from numba_flash.tensorcore import fa2_forward_tf32, ptx

import numpy as np
import pytest
from attn_testing import assert_same_bits, make_qkv, run_tc_forward
from numba import cuda, uint32
from sram_pass_testing import device_swizzle, nan_tile, run_sram_pass, swizzle16_host

QNAN_BITS = 0x7FC00000
ON = {"CP_ASYNC": True, "WIDE": True, "SPLIT_KV": True}
OFF = {"CP_ASYNC": True, "WIDE": True, "SPLIT_KV": False}


def test_swizzle16_on_the_device_is_the_host_formula():
    i = np.arange(128 * 16)
    np.testing.assert_array_equal(device_swizzle(_tiles.swizzle16), swizzle16_host(i % 128, i // 128))


@pytest.mark.parametrize("swizzle", [False, True], ids=["plain", "swizzled"])
@pytest.mark.parametrize("NT", [64, 48], ids=["exact-share", "ragged-share"])
def test_the_split_pass_writes_both_parts_of_every_element(NT, swizzle):
    ROWS, DW, SA = 12, 32, 32  # 96 chunks: over 64 threads the last have one, over 48 every thread has two
    swz = _tiles.swizzle16 if swizzle else None
    split_pass = _tiles.make_split_pass(ROWS, DW, NT, SA, _backend.is_simulator(), swz)
    src = nan_tile(np.random.default_rng(NT), ROWS, DW, SA)
    SMALL = ROWS * SA

    @cuda.jit(device=True)
    def apply(smem, words, tid):
        split_pass(smem, words, uint32(0), uint32(SMALL), tid)

    out = run_sram_pass(apply, NT, src.ravel(), 2 * SMALL, 0, 2 * SMALL)
    big, small = out[:SMALL].reshape(ROWS, SA), out[SMALL:].reshape(ROWS, SA)
    for r in range(ROWS):
        for c in range(DW):
            at = (r, swizzle16_host(c, r) if swizzle else c)
            x = src[at]
            if np.isnan(x):  # Dev: quieted first; its small part is whatever NaN - NaN gives on the backend
                assert big[at] == QNAN_BITS, f"the NaN at {at} was not made the quiet NaN"
                continue
            assert (int(big[at]), int(small[at])) == ptx.split_tf32_host(x), f"element {at}"


A, BC = 2, 16  # Dev: the V pass's tile: d = 64 (two groups of 32 columns), two key steps


def _pair_word(kt, t, p, a, g, h, e):
    """Word of ``V[8 kt + t + 4 p, 32 a + 4 g + 2 h + e]``'s part in :func:`make_v_pair_split_pass`'s layout (d = 32
    A)."""
    return (4 * kt + t) * _tiles.v_pair_stride(32 * A) + 64 * a + 32 * h + 4 * g + 2 * e + p


@pytest.mark.parametrize("NT", [128, 96], ids=["exact-share", "ragged-share"])
def test_the_v_pass_puts_each_lanes_b_fragments_in_register_pairs(NT):
    """Each thread takes both rows ``r, r + 4`` of a pair at once (``ROW_PAIRS``), over an exact and a ragged share."""
    DP, SV = 32 * A, 32 * A + 8
    RS = _tiles.v_pair_stride(DP)
    PART = BC // 8 * 4 * RS
    split_v = _tiles.make_v_pair_split_pass(BC, DP, NT, SV, _backend.is_simulator())
    src = nan_tile(np.random.default_rng(NT), BC, DP, SV)
    N_IN = BC * SV

    @cuda.jit(device=True)
    def apply(smem, words, tid):
        split_v(smem, words, uint32(0), uint32(N_IN), uint32(PART), tid)

    out = run_sram_pass(apply, NT, src.ravel(), N_IN + 2 * PART, N_IN, 2 * PART)
    seen = 0
    for kt in range(BC // 8):
        for g in range(8):
            for t in range(4):  # lane (g, t): the kernel's two 16-byte loads per group a read words 32 h + 4 g .. + 3
                for a in range(A):
                    for h in range(2):
                        for e in range(2):
                            col = 32 * a + 4 * g + 2 * h + e  # O's renamed column of tile 4 a + 2 h + e
                            for p in range(2):
                                w = _pair_word(kt, t, p, a, g, h, e)
                                x = src[8 * kt + t + 4 * p, col]
                                if np.isnan(x):
                                    assert out[w] == QNAN_BITS
                                else:
                                    assert (int(out[w]), int(out[PART + w])) == ptx.split_tf32_host(x), (kt, t, p, col)
                                seen += 1
    assert seen == BC * DP, "every element of the tile has its place"
    # Dev: a 16-byte load of a warp is served 8 lanes at a time: lanes (g, t), g < 2 (and each later 8) must hit 32
    # banks
    for phase in range(4):
        banks = [
            (_pair_word(0, t, 0, 0, g, 0, 0) + i) % 32
            for g in (2 * phase, 2 * phase + 1)
            for t in range(4)
            for i in range(4)
        ]
        assert len(set(banks)) == 32, f"phase {phase} of the pair loads has a bank conflict"


def test_split_kv_runs_only_with_wide_and_by_default_at_the_8x2x16_tiling():
    on = fa2_forward_tf32.split_kv_on
    assert on(True, True, (4, 2, 16)) and not on(True, False, (8, 2, 16)) and not on(False, True, (8, 2, 16))
    assert on(None, True, (8, 2, 16)), (
        "at 8 x 2 x 16 it ran 1.06-1.07x causal and, with 16-byte stores, 1.03-1.05x without"
    )
    assert not on(None, True, (4, 2, 16)) and not on(None, True, (4, 1, 32)), "it takes the second block per SM there"
    assert fa2_forward_tf32.default_features()["SPLIT_KV"] is None
    for n, want in (
        (4096, True),
        (16384, True),
        (2048, True),
        (1024, False),
        (512, False),
    ):  # Dev: the causal d = 128 default of each N
        cfg = fa2_forward_tf32.config_for(128, None, None, True, n)
        assert on(None, fa2_forward_tf32.wide_on(None, 128, True), cfg[:3]) == want, n
    # Dev: the plan takes the default only where it fits: not in the simulator, whose exchange scratch adds 6 KB at 8
    # warps
    sim = _backend.is_simulator()
    q, k, v = make_qkv(np.random.default_rng(0), 1, 8, 8, 1, 1, 128)
    prob = dataclasses.replace(check_attention_args(q, k, v, 0.0, None, True, 0), seqlen_q=4096, seqlen_k=4096)
    fits = 4 * fa2_forward_tf32.smem_floats(8, 2, 16, 128, sim, 2, True, True) <= _smem.max_optin_bytes()
    assert not (sim and fits), "the simulator's scratch makes it 232960 bytes, past the 227 KB it allows"
    assert fa2_forward_tf32.plan(prob)[3] == 4 * fa2_forward_tf32.smem_floats(8, 2, 16, 128, sim, 2, True, fits)
    noncausal = check_attention_args(q, k, v, 0.0, None, False, 0)  # Dev: 8 x 2 x 16 at every N
    assert fa2_forward_tf32.plan(noncausal)[3] == 4 * fa2_forward_tf32.smem_floats(8, 2, 16, 128, sim, 2, True, fits)
    with pytest.raises(ValueError, match="SPLIT_KV needs WIDE"):
        fa2_forward_tf32.fa2_forward_tc_kernel(
            1, 1, 16, 32, False, False, False, _backend.is_simulator(), True, SPLIT_KV=True
        )
    q, k, v = make_qkv(np.random.default_rng(0), 1, 40, 40, 1, 1, 32)
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    sim = _backend.is_simulator()
    (k_on, _, _, n_on), (k_off, _, _, n_off) = (fa2_forward_tf32.plan(prob, (32, 16), None, f) for f in (ON, OFF))
    assert k_on is not k_off
    assert n_on == 4 * fa2_forward_tf32.smem_floats(2, 1, 16, 32, sim, 2, True, True)
    assert n_off == 4 * fa2_forward_tf32.smem_floats(2, 1, 16, 32, sim, 2, True, False)
    k_reg = fa2_forward_tf32.plan(prob, (32, 16), None, {**ON, "CP_ASYNC": False})[0]
    assert k_reg is fa2_forward_tf32.plan(prob, (32, 16), None, {**OFF, "CP_ASYNC": False})[0], (
        "off the cp.async path it is off"
    )
    assert 4 * fa2_forward_tf32.smem_floats(8, 2, 16, 128, False, 2, True, True) <= 227 * 1024, (
        "the d = 128 default tiling fits an H100"
    )


#: (b, s_q, s_k, h, h_k, d, causal, p, block_sizes), id: d 32 and 28 (the smallest WIDE head dims)
CASES = [
    pytest.param(1, 37, 40, 2, 1, 32, False, 0.0, (16, 16), id="ragged-gqa-d32"),
    pytest.param(1, 33, 45, 1, 1, 28, True, 0.0, (16, 16), id="causal-d28-padded"),
    pytest.param(1, 29, 35, 1, 1, 32, True, 0.1, (32, 16), id="causal-dropout-d32"),
    pytest.param(1, 45, 14, 1, 1, 32, True, 0.0, (64, 16), id="causal-sq>sk-blocks-without-keys-4warps-d32"),
    pytest.param(1, 40, 37, 1, 1, 32, False, 0.0, (128, 16), id="mw2-4warps-d32"),
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_split_kv_keeps_the_outputs_bit_for_bit(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (on, f_on), (off, f_off) = (run_tc_forward(q, k, v, causal, p, seed, bs, f) for f in (ON, OFF))
    assert f_on["SPLIT_KV"] and not f_off["SPLIT_KV"]
    assert_same_bits(on, off, "SPLIT_KV on and off")


def test_the_kernel_factory_caches_by_its_signature():
    """A flag left out and the same flag passed at its default give one kernel object (the plan passes every flag; the
    tests that compare its kernel with the factory's pass only those they name)."""
    sim = _backend.is_simulator()
    args = (2, 1, 16, 32, False, False, False, sim, True, False, True)
    k = fa2_forward_tf32.fa2_forward_tc_kernel(*args)
    assert k is fa2_forward_tf32.fa2_forward_tc_kernel(*args, False, False, False, False, False)
    assert k is fa2_forward_tf32.fa2_forward_tc_kernel(*args, SPLIT_KV=False)
    assert k is not fa2_forward_tf32.fa2_forward_tc_kernel(*args, SPLIT_KV=True)


def test_split_kv_keeps_nans_where_they_reach(rng):
    q, k, v = make_qkv(rng, 1, 40, 40, 1, 1, 32)
    k[0, 7, 0, 3] = np.nan
    v[0, 20, 0, 9] = np.uint32(0x7F800001).view(np.float32)  # a NaN whose payload is only in the bits tf32 drops
    (on, _), (off, _) = (run_tc_forward(q, k, v, True, 0.0, 0, (16, 16), f) for f in (ON, OFF))
    assert np.isnan(on[0][0, 7:, 0]).all() and not np.isnan(on[0][0, :7, 0]).any(), (
        "K's NaN reaches the rows that see key 7"
    )
    assert_same_bits(on, off, "SPLIT_KV on and off")


#: (b, s_q, s_k, h, h_k, d, causal, p, block sizes or None for the default): the default tilings at d = 128 (8 x 2 x 16
#: without causal and from 2k with it; 4 x 2 x 16 and 4 x 1 x 32 with causal below), d = 96 (three groups of 32
#: columns), ragged, GQA, s_q above and below s_k, dropout
GPU_CASES = [
    (2, 1000, 1000, 4, 2, 128, False, 0.0, None),
    (2, 1000, 1000, 4, 2, 128, True, 0.0, (256, 16)),
    (2, 1029, 1029, 4, 1, 128, True, 0.1, None),
    (1, 1000, 1531, 4, 2, 128, True, 0.0, (256, 16)),
    (1, 1531, 1000, 4, 2, 128, True, 0.0, (64, 32)),
    (2, 777, 777, 4, 4, 96, False, 0.17, None),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), GPU_CASES)
def test_split_kv_keeps_the_outputs_bit_for_bit_on_gpu(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    k[0, 17, 0, 5] = np.nan
    seed = int(rng.integers(0, 2**32))
    (on, f_on), (off, _) = (run_tc_forward(q, k, v, causal, p, seed, bs, {"SPLIT_KV": s}) for s in (True, False))
    assert f_on["SPLIT_KV"]
    assert_same_bits(on, off, "SPLIT_KV on and off")
