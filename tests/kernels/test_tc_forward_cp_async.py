"""The 3xTF32 forward's two load paths for K_j, V_j (:mod:`numba_flash.tensorcore.fa2_forward_tf32`, ``CP_ASYNC``).

Claims checked:

* ``cp.async`` into two SRAM stages (``features={"CP_ASYNC": True}``, the default where it can run) and the
  register path (one stage, ``CP_ASYNC=False``) compute the same thing: bitwise equal O, L, m, l on ragged, causal
  (blocks whose rows see no key included), GQA, dropout and ``MW = 2`` shapes, at head dims whose padded rows
  end in a chunk past d (d = 20 pads to 24), and with NaNs in K and V (the cp.async path turns them into the
  quiet NaN in SRAM, as the register path does at its store, so the 3xTF32 split keeps them NaNs); and the
  result follows the forward's error rule. The NaN case can only fail on a GPU: the simulator's split is
  ``cvt.rna`` (NaN stays NaN), the GPU's five-instruction split carries the canonical NaN ``0x7fffffff``
  into the sign bit (checked: without the NaN pass the case passes in the simulator).
* Where ``cp.async`` cannot run, the register path runs, with its own default tiling: a head dim that is not a
  multiple of 4 (rows are not whole 16-byte chunks) and K, V arrays whose rows are not 16-byte aligned.
* The pass that quiets NaNs changes only NaNs, in the chunks of the calling thread.
* On a GPU (marker ``gpu``): the two paths are bitwise equal at realistic shapes.

Simulator shapes stay tiny (N <= 45, d <= 24): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

import dataclasses

from numba_flash._launch import check_attention_args
from numba_flash.fast import _plan, _tiles
from numba_flash.fast import fa2_forward as fa2_forward_fast
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_forward_tf32
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    assert_same_bits,
    make_qkv,
    naive_attention_float32,
    run_tc_forward,
    tc_forward_sram_params,
    unaligned_copy,
)
from numba import cuda, float32


def _run(q, k, v, causal, p, seed, bs, cp, words=None):
    """The tc forward at kernel level with ``CP_ASYNC`` = ``cp``: ((O, L, m, l) as NumPy, features it ran with)."""
    return run_tc_forward(
        q, k, v, causal, p, seed, bs, {"CP_ASYNC": cp, "WIDE": False}, words
    )  # Dev: WIDE reorders sums


def _assert_same(a, b):
    assert_same_bits(a, b, "cp.async and register paths")


CASES = tc_forward_sram_params()


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_cp_async_pipeline_equals_the_register_path_bit_for_bit(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (cp_out, cp_feats), (reg_out, reg_feats) = (_run(q, k, v, causal, p, seed, bs, cp) for cp in (True, False))
    prob = check_attention_args(q, k, v, p, None, causal, seed)
    NW, MW, Bc, DP = fa2_forward_tf32.config_for(d, bs)
    sim = _backend.is_simulator()
    assert fa2_forward_tf32.plan(prob, bs, None, cp_feats)[3] == 4 * fa2_forward_tf32.smem_floats(
        NW, MW, Bc, DP, sim, 2
    )
    assert fa2_forward_tf32.plan(prob, bs, None, reg_feats)[3] == 4 * fa2_forward_tf32.smem_floats(
        NW, MW, Bc, DP, sim, 1
    )
    _assert_same(cp_out, reg_out)
    if p == 0.0:  # the error rule on the result (with dropout the two paths' equality is the claim)
        ref = standard_attention(q, k, v, causal=causal).O
        assert_error_rule(cp_out[0], ref, naive_attention_float32(q, k, v, causal=causal), what="O")


def test_nans_in_k_and_v_stay_nans_on_the_cp_async_path(rng):
    q, k, v = make_qkv(rng, 1, 20, 23, 1, 1, 16)
    k[0, 5, 0, 3] = np.float32(np.nan)  # one key: its scores are NaN in every row
    v[0, 17, 0, 9] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN, in V
    (cp_out, _), (reg_out, _) = (_run(q, k, v, False, 0.0, 0, (16, 16), cp) for cp in (True, False))
    _assert_same(cp_out, reg_out)
    assert np.isnan(cp_out[0]).all(), "a NaN score makes every row's softmax NaN"


def test_head_dims_not_a_multiple_of_4_and_unaligned_inputs_take_the_register_path(rng):
    assert fa2_forward_tf32.cp_async_ok(12) and not fa2_forward_tf32.cp_async_ok(6)
    q, k, v = make_qkv(rng, 1, 19, 21, 1, 1, 6)
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    NW, MW, Bc, DP = fa2_forward_tf32.config_for(6, (16, 16))
    assert fa2_forward_tf32.plan(prob, (16, 16), None, {"CP_ASYNC": True})[3] == 4 * fa2_forward_tf32.smem_floats(
        NW, MW, Bc, DP, _backend.is_simulator(), 1
    ), "d = 6: one SRAM stage (the register path)"
    # d = 16, K and V whose base is 4 bytes past a 16-byte boundary: forward() drops CP_ASYNC
    q, k, v = make_qkv(rng, 1, 20, 20, 1, 1, 16)
    shifted = [unaligned_copy(x) for x in (q, k, v)]
    assert not _plan.aligned16(*shifted[1:]) and _plan.aligned16(k, v)
    out, feats = _run(q, k, v, False, 0.0, 0, (16, 16), True, words=shifted)
    assert not feats["CP_ASYNC"], "unaligned K, V: forward() must ask for the register path"
    aligned, _ = _run(q, k, v, False, 0.0, 0, (16, 16), True)
    _assert_same(out, aligned)


def test_each_load_path_gets_its_own_default_tiling():
    # H100 sweeps (performance log; the JSON files named below were in docs/results/sweeps, last in the tree at
    # e0e5a9b): at d <= 64 the cp.async path is fastest with Bc = 32, the register path with 64
    assert fa2_forward_tf32.config_for(64, None, True) == (4, 2, 32, 64)
    assert fa2_forward_tf32.config_for(64, None, False) == (4, 2, 64, 64)
    # d = 128: the cp.async path's 8 warps of MW = 2 (with STAGE_O_STEP, which makes them fit; Bc = 16) beat the
    # register path's tiling by 1.065x without causal (ostep_h100_d128.json); the register path keeps 8 x 1 x 32
    assert fa2_forward_tf32.config_for(128, None, True) == (8, 2, 16, 128)
    assert fa2_forward_tf32.config_for(128, None, False) == (8, 1, 32, 128)
    # causal d = 128 on the cp.async path: 64-row blocks (1.02-1.10x the 8 x 2 x 16 tiling at N 1k-4k, 0.99-1.01x
    # at 8k-16k; short_causal_h100_d128.json, causal_d128_h100.json); the register path and d <= 64 ignore causal
    assert fa2_forward_tf32.config_for(128, None, True, True) == (4, 1, 32, 128)
    # ... up to N = 2048: from there 8 x 2 x 16 (both heavy first) is faster (8192 until Q_ASYNC: 1.09-1.12x the 64-row
    # blocks at 8k-16k in heavy_fwd_d128_h200_d80baba.json; after it 1.117x at 4k, tiles_causal_d128_h100_fd4f230.json;
    # since SPLIT_KV's 16-byte stores 1.037x / 1.028x 4 x 2 x 16 at 2k, tiles_causal_skv_h100_e2df55b_{1,2}.json)
    assert fa2_forward_tf32.CAUSAL_LONG_SEQLEN == 2048, (
        "H100, SPLIT_KV's 16-byte stores: 8 x 2 x 16 1.037x / 1.028x at 2k"
    )
    # ... and from N = 512 to 2047, 4 warps of MW = 2 with Bc = 16: two 128-row blocks per SM (H100: 1.07-1.18x the
    # 64-row blocks at 1k and 2k in two rounds, tiles_4x2x16_h100_54d44d7_{1,2}.json; at 512 1.019x / 1.134x there and
    # 1.043x / 1.050x on an H200, interleaved, short_causal_h200_b83f906_{1,2}.json)
    assert fa2_forward_tf32.CAUSAL_MID_SEQLEN == 512, "4 x 2 x 16 at least 1.02x in both rounds from 512 to 2k"
    assert fa2_forward_tf32.config_for(128, None, True, True, fa2_forward_tf32.CAUSAL_MID_SEQLEN - 1) == (4, 1, 32, 128)
    assert fa2_forward_tf32.config_for(128, None, True, True, fa2_forward_tf32.CAUSAL_MID_SEQLEN) == (4, 2, 16, 128)
    assert fa2_forward_tf32.config_for(128, None, True, True, fa2_forward_tf32.CAUSAL_LONG_SEQLEN - 1) == (
        4,
        2,
        16,
        128,
    )
    assert fa2_forward_tf32.config_for(96, None, True, True, 1024) == (4, 2, 16, 96), (
        "every d > 64 on the cp.async path"
    )
    assert fa2_forward_tf32.config_for(128, None, True, False, 1024) == (8, 2, 16, 128), "without causal: Br = 256"
    assert fa2_forward_tf32.config_for(128, None, False, True, 1024) == (8, 1, 32, 128), "the register path ignores N"
    assert fa2_forward_tf32.config_for(128, None, True, True, fa2_forward_tf32.CAUSAL_LONG_SEQLEN) == (8, 2, 16, 128)
    assert fa2_forward_tf32.config_for(128, None, True, False, 16384) == (8, 2, 16, 128)
    assert fa2_forward_tf32.config_for(64, None, True, True, 16384) == (4, 2, 32, 64), "d <= 64 keeps its tiling"
    assert fa2_forward_tf32.config_for(128, None, False, True) == (8, 1, 32, 128)
    assert fa2_forward_tf32.config_for(64, None, True, True) == (4, 2, 32, 64)
    assert fa2_forward_tf32.config_for(62) == (4, 2, 64, 64), "d = 62 is not whole 16-byte chunks: the register path's"
    assert fa2_forward_tf32.default_features()["CP_ASYNC"]
    for d, cp in ((64, True), (62, False)):
        prob = check_attention_args(*make_qkv(np.random.default_rng(0), 1, 8, 8, 1, 1, d), 0.0, None, False, 0)
        NW, MW, Bc, DP = fa2_forward_tf32.config_for(d, None, cp)
        assert fa2_forward_tf32.plan(prob)[3] == 4 * fa2_forward_tf32.smem_floats(
            NW, MW, Bc, DP, _backend.is_simulator(), 2 if cp else 1
        )


@pytest.mark.parametrize("module", [fa2_forward_tf32, fa2_forward_fast], ids=["tc", "ffma"])
def test_tiling_is_what_the_plan_launches(module):
    """``tiling(prob)`` names the tiling of a problem (what the benchmarks record): it follows the mask and the query
    length where the 3xTF32 defaults do, and the plan launches its threads."""
    cases = [
        (128, True, 512),
        (128, True, 1024),
        (128, True, 4096),
        (128, False, 1024),
        (64, True, 1024),
        (62, False, 64),
    ]
    for d, causal, n in cases + ([] if module is fa2_forward_tf32 else [(160, True, 1024)]):
        q, k, v = make_qkv(np.random.default_rng(0), 1, 8, 8, 1, 1, d)
        prob = dataclasses.replace(check_attention_args(q, k, v, 0.0, None, causal, 0), seqlen_q=n, seqlen_k=n)
        cfg = module.tiling(prob)
        threads = module.plan(prob)[2]
        if module is fa2_forward_tf32:
            assert cfg == fa2_forward_tf32.config_for(d, None, None, causal, n) and threads == 32 * cfg[0], (
                d,
                causal,
                n,
            )
        else:  # Dev: the FFMA kernel's (NT, TM, TPR, Bc, DP)
            assert cfg == fa2_forward_fast.config_for(d) and threads == cfg[0], (d, causal, n)


def test_the_quiet_nan_pass_changes_only_nans_in_the_threads_chunks():
    NROWS, DW, NT, SA = 4, 8, 4, 12
    quiet = _tiles.make_quiet_nan_pass(NROWS, DW, NT, SA)

    @cuda.jit
    def run(tile):
        smem = cuda.shared.array(48, float32)  # (NROWS, SA)
        tid = cuda.threadIdx.x
        for i in range(tid, NROWS * SA, NT):
            smem[i] = tile[i]
        cuda.syncthreads()  # Sync: the tile is in SRAM before the pass
        quiet(smem, 0, tid)
        cuda.syncthreads()  # Sync: every thread's pass is done before the copy out
        for i in range(tid, NROWS * SA, NT):
            tile[i] = smem[i]

    bits = np.arange(NROWS * SA, dtype=np.uint32) + np.uint32(0x3F800000)  # 1.0, 1.0 + ulp, ...
    bits[[3, 14, 25]] = (0x7FFFFFFF, 0xFFC00001, 0x7F800001)  # NaNs inside the chunks (rows 0, 1, 2)
    bits[10] = 0x7FFFFFFF  # a NaN in the padding words of row 0 (columns 8..11): not a chunk, left alone
    tile = bits.view(np.float32).copy()
    run[1, NT](tile)
    want = bits.copy()
    want[[3, 14, 25]] = 0x7FC00000
    np.testing.assert_array_equal(tile.view(np.uint32), want)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "d", "causal"), [(1000, 64, False), (1000, 128, True), (777, 96, True), (2048, 32, False)]
)
def test_cp_async_pipeline_equals_the_register_path_on_gpu_shapes(rng, n, d, causal):
    q, k, v = make_qkv(rng, 2, n, n, 4, 2, d)
    # the cp.async path's default tiling for both paths (the register path's own default is Bc = 64 at d <= 64,
    # 8 x 1 x 32 above); at d > 64 that is 8 x 2 x 16 with STAGE_O_STEP on both paths, 4 x 1 x 32 with causal
    # (config_for without N)
    NW, MW, Bc, _ = fa2_forward_tf32.config_for(d, None, True, causal)
    bs = (16 * MW * NW, Bc)
    assert fa2_forward_tf32.config_for(d, bs) == fa2_forward_tf32.config_for(d, None, True, causal)
    (cp_out, cp_feats), (reg_out, _) = (_run(q, k, v, causal, 0.0, 0, bs, cp) for cp in (True, False))
    assert cp_feats["CP_ASYNC"]
    _assert_same(cp_out, reg_out)
