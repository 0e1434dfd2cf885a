"""The 3xTF32 forward with K_j, V_j split once per block (:mod:`numba_flash.fast.fa2_forward_tc`, ``SPLIT_KV``).

Claims checked:

* With ``SPLIT_KV`` the ``cp.async`` path's pass over each thread's chunks writes the tf32 big part of every
  element of K_j, V_j in place and its small part into a second tile, and the products read those bit patterns
  instead of splitting in every warp: bitwise equal O, L, m, l to the same path without it, on ragged, causal
  (blocks whose rows see no key included), GQA, dropout, ``MW = 2`` and padded-chunk shapes, and with NaNs in K
  and V (quieted before the split, as without it).
* The SRAM it plans is twice K_j, V_j per stage (``smem_floats(..., split=True)``); where ``cp.async`` cannot run
  (d not a multiple of 4, unaligned K, V) ``SPLIT_KV`` is ignored and the register path runs, one stage.
* The split pass writes, for each element of the calling thread's chunks, the big and small parts that
  ``split`` gives (a NaN first made the quiet NaN), and touches nothing else.
* On a GPU (marker ``gpu``): bitwise equal at realistic shapes, the d = 128 default tiling included.

Simulator shapes stay tiny (N <= 45, d <= 24).
"""

from __future__ import annotations

from numba_flash import _backend
from numba_flash._launch import check_attention_args
from numba_flash.fast import _mma, _tiles, fa2_forward_tc

import numpy as np
import pytest
from attn_testing import TC_FORWARD_SRAM_CASES, assert_same_bits, make_qkv, run_tc_forward, unaligned_copy
from numba import cuda, float32, uint32


def _run(q, k, v, causal, p, seed, bs, split, words=None):
    """The tc forward at kernel level, cp.async path, ``SPLIT_KV`` = ``split``: ((O, L, m, l), features it ran with)."""
    return run_tc_forward(q, k, v, causal, p, seed, bs, {"CP_ASYNC": True, "SPLIT_KV": split}, words)


def _assert_same(a, b):
    assert_same_bits(a, b, "split and unsplit K_j, V_j")


CASES = [pytest.param(*c[:-1], id=c[-1]) for c in TC_FORWARD_SRAM_CASES]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_k_and_v_split_once_per_block_give_the_same_bits(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (split_out, split_feats), (plain_out, _) = (_run(q, k, v, causal, p, seed, bs, split) for split in (True, False))
    assert split_feats["SPLIT_KV"] and split_feats["CP_ASYNC"]
    prob = check_attention_args(q, k, v, p, None, causal, seed)
    NW, MW, Bc, DP = fa2_forward_tc.config_for(d, bs)
    assert fa2_forward_tc.plan(prob, bs, None, split_feats)[3] == 4 * fa2_forward_tc.smem_floats(NW, MW, Bc, DP, _backend.is_simulator(), 2, True)
    _assert_same(split_out, plain_out)


def test_nans_in_k_and_v_give_the_same_bits_split_or_not(rng):
    q, k, v = make_qkv(rng, 1, 20, 23, 1, 1, 16)
    k[0, 5, 0, 3] = np.float32(np.nan)
    v[0, 17, 0, 9] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN, in V
    (split_out, _), (plain_out, _) = (_run(q, k, v, False, 0.0, 0, (16, 16), split) for split in (True, False))
    _assert_same(split_out, plain_out)
    assert np.isnan(split_out[0]).all(), "a NaN score makes every row's softmax NaN"


def test_split_kv_is_ignored_where_the_register_path_runs(rng):
    sim = _backend.is_simulator()
    q, k, v = make_qkv(rng, 1, 19, 21, 1, 1, 6)  # d = 6: rows are not whole 16-byte chunks
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    NW, MW, Bc, DP = fa2_forward_tc.config_for(6, (16, 16))
    assert fa2_forward_tc.plan(prob, (16, 16), None, {"SPLIT_KV": True})[3] == 4 * fa2_forward_tc.smem_floats(NW, MW, Bc, DP, sim, 1)
    q, k, v = make_qkv(rng, 1, 20, 20, 1, 1, 16)
    shifted = [unaligned_copy(x) for x in (q, k, v)]
    out, feats = _run(q, k, v, False, 0.0, 0, (16, 16), True, words=shifted)
    assert not feats["CP_ASYNC"], "unaligned K, V: forward() must ask for the register path"
    NW, MW, Bc, DP = fa2_forward_tc.config_for(16, (16, 16))
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    assert fa2_forward_tc.plan(prob, (16, 16), None, feats)[3] == 4 * fa2_forward_tc.smem_floats(NW, MW, Bc, DP, sim, 1)
    plain, _ = _run(q, k, v, False, 0.0, 0, (16, 16), False)
    _assert_same(out, plain)


def test_the_split_pass_writes_each_elements_tf32_parts_in_the_threads_chunks():
    NROWS, DW, NT, SA, SMALL = 4, 8, 4, 12, 48
    sim = _backend.is_simulator()
    split_pass = _tiles.make_split_pass(NROWS, DW, NT, SA, SMALL, sim)

    @cuda.jit
    def run(tile):
        smem = cuda.shared.array(96, float32)  # (NROWS, SA), then the small parts at + SMALL
        tid = cuda.threadIdx.x
        for i in range(tid, 2 * NROWS * SA, NT):
            smem[i] = tile[i]
        cuda.syncthreads()  # Sync: the tile is in SRAM before the pass
        split_pass(smem, 0, tid)
        cuda.syncthreads()  # Sync: every thread's pass is done before the copy out
        for i in range(tid, 2 * NROWS * SA, NT):
            tile[i] = smem[i]

    split, _, _, _ = _mma.make_warp_ops(sim)
    f32_bits, _ = _mma.make_bitcasts(sim)

    @cuda.jit
    def reference(x, big, small):  # the kernels' own split, element by element
        i = cuda.threadIdx.x
        if i < x.size:
            b, s = split(x[i])
            big[i], small[i] = b, s
        # f32_bits is the identity on bit patterns
        if i == 0:
            big[x.size] = f32_bits(float32(1.5))

    rng = np.random.default_rng(7)
    x = (rng.standard_normal(NROWS * SA) * 3).astype(np.float32)
    bits = x.view(np.uint32).copy()
    bits[[3, 14]] = (0x7FFFFFFF, 0xFFC00001)  # NaNs inside chunks (rows 0 and 1)
    bits[10] = 0x7FFFFFFF  # a NaN in the padding words of row 0 (columns 8..11): not a chunk, left alone
    tile = np.concatenate([bits.view(np.float32), np.full(NROWS * SA, -7.0, np.float32)])
    run[1, NT](tile)

    chunk = np.zeros(NROWS * SA, bool)
    for r in range(NROWS):
        chunk[r * SA:r * SA + DW] = True
    quiet = bits.copy()
    quiet[[3, 14]] = 0x7FC00000
    big = np.zeros(NROWS * SA + 1, np.uint32)
    small = np.zeros(NROWS * SA, np.uint32)
    reference[1, 64](quiet.view(np.float32), big, small)
    assert big[-1] == np.float32(1.5).view(np.uint32)
    got = tile.view(np.uint32)
    np.testing.assert_array_equal(got[:NROWS * SA][chunk], big[:-1][chunk], err_msg="big parts in place")
    np.testing.assert_array_equal(got[NROWS * SA:][chunk], small[chunk], err_msg="small parts at + SMALL")
    np.testing.assert_array_equal(got[:NROWS * SA][~chunk], bits[~chunk], err_msg="padding words untouched")
    np.testing.assert_array_equal(got[NROWS * SA:][~chunk], np.float32(-7.0).view(np.uint32), err_msg="small tile padding untouched")
    assert (big[:-1][chunk] & 0x1FFF == 0).all() and (small[chunk] & 0x1FFF == 0).all(), "tf32 patterns: 13 low bits clear"


def test_bitcasts_keep_every_bit():
    sim = _backend.is_simulator()
    f32_bits, bits_f32 = _mma.make_bitcasts(sim)

    @cuda.jit
    def roundtrip(u, out_u, x, out_x):
        i = cuda.threadIdx.x
        if i < u.size:
            out_u[i] = f32_bits(bits_f32(uint32(u[i])))
            out_x[i] = bits_f32(f32_bits(x[i]))

    u = np.array([0, 0x80000000, 0x3F800000, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0x00000001, 0xFFFFE000], np.uint32)
    x = u.view(np.float32).copy()
    out_u, out_x = np.zeros_like(u), np.zeros_like(x)
    roundtrip[1, 8](u, out_u, x, out_x)
    np.testing.assert_array_equal(out_u, u)
    np.testing.assert_array_equal(out_x.view(np.uint32), u)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d", "causal"), [(1000, 128, False), (1000, 128, True), (777, 96, True), (2048, 64, False)])
def test_k_and_v_split_once_per_block_give_the_same_bits_on_gpu_shapes(rng, n, d, causal):
    q, k, v = make_qkv(rng, 2, n, n, 4, 2, d)
    (split_out, split_feats), (plain_out, _) = (_run(q, k, v, causal, 0.0, 0, None, split) for split in (True, False))
    assert split_feats["SPLIT_KV"] and split_feats["CP_ASYNC"]
    _assert_same(split_out, plain_out)
