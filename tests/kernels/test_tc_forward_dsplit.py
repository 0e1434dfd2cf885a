"""The 3xTF32 forward with keys and O's columns split across warps (``DSPLIT``, :mod:`numba_flash.fast.fa2_forward_tc_dsplit`).

Claims checked:

* Its warps share a block's work (line 8 by keys, line 10 by O's columns; the row maxima of line 9 and ``P~`` through
  SRAM, the row sums after the loop), and the result is FA2's: O and L follow the error rule against float64 (2x naive
  float32's error) on ragged, GQA, causal (blocks whose rows see no key included), dropout and multi-warp ``MW = 2``
  shapes, over several key blocks (rows whose max grows in a later block, whose O is rescaled).
* Every score has the bits of the row-owning kernel with ``WIDE`` (the same k steps in the same order): the row max m,
  a function of the scores alone, is bitwise that kernel's. The 3xTF32 backward recomputes S in that order, so it
  stays the forward's.
* A NaN in K makes every row that sees it NaN, and one in V the column it is in: the NaN pass finds the swizzled chunks
  of the one-stage K_j and the two-stage V_j.
* It runs only with ``WIDE`` (the ``cp.async`` path and ``DP % 32 == 0``) and is off by default; elsewhere the plan is
  the row-owning kernel's. Its plan launches ``32 WM WN`` threads with the SRAM of :func:`smem_floats`, and
  ``fa2_forward_tc.tiling`` reports the tiling of the kernel the plan launches (``bench.fa2_sweep`` labels rows by it).
* On a GPU (marker ``gpu``): the same at realistic shapes and its default tiling (4 x 2 warps, Br 128, Bc 64).

Simulator shapes stay tiny (N <= 50, d = 28 or 32): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

from numba_flash import _backend
from numba_flash._launch import check_attention_args
from numba_flash.fast import fa2_forward_tc
from numba_flash.fast import fa2_forward_tc_dsplit as ds
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import assert_error_rule, assert_lse_rule, make_qkv, naive_attention_float32, naive_lse_float32, run_tc_forward

from bench import fa2_sweep

DSPLIT = {"DSPLIT": True, "WIDE": True}
ROW_OWNING = {"WIDE": True}
GPU_NAN = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN

#: (b, s_q, s_k, h, h_k, d, causal, p, block_sizes), id: block_sizes (Br, Bc) give (WM, MW) = (1, 1), (1, 2), (2, 2),
#: (4, 2) warps by m16 tiles and Bc 16 or 32 (two warps of 8 or 16 keys)
CASES = [
    pytest.param(1, 37, 40, 2, 1, 32, False, 0.0, (16, 16), id="ragged-gqa-1x1"),
    pytest.param(1, 33, 45, 1, 1, 28, True, 0.0, (32, 16), id="causal-d28-padded-1x2"),
    pytest.param(1, 29, 35, 1, 1, 32, True, 0.1, (32, 32), id="causal-dropout-1x2-Bc32"),
    pytest.param(1, 45, 14, 1, 1, 32, True, 0.0, (16, 16), id="causal-sq>sk-blocks-without-keys"),
    pytest.param(1, 40, 37, 1, 1, 32, True, 0.0, (64, 16), id="causal-2x2"),
    pytest.param(1, 40, 50, 1, 1, 32, False, 0.0, (128, 32), id="4x2-Bc32"),
]


def _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    prob = check_attention_args(q, k, v, p, None, causal, seed)
    WM, MW, WN, Bc, _ = ds.tiling_for(d, bs)
    assert fa2_forward_tc.plan(prob, bs, None, DSPLIT)[2] == 32 * WM * WN, "the plan did not take the DSPLIT kernel"
    out, _ = run_tc_forward(q, k, v, causal, p, seed, bs, DSPLIT)
    ref = standard_attention(q, k, v, causal=causal, dropout_p=p, seed=seed).O  # the same dropout mask as the kernel
    assert_error_rule(out[0], ref, naive_attention_float32(q, k, v, causal=causal, dropout_p=p, seed=seed), what="O")
    assert_lse_rule(out[1], standard_attention(q, k, v, causal=causal).L, naive_lse_float32(q, k, causal))
    row_owning, _ = run_tc_forward(q, k, v, causal, p, seed, None, ROW_OWNING)  # Dev: other blocks, the same scores
    assert np.array_equal(out[2], row_owning[2], equal_nan=True), "m: the scores are not the row-owning kernel's bits"


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_dsplit_follows_the_error_rule_with_the_row_owning_kernels_scores(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs)


def test_dsplit_nans_in_k_and_v_reach_the_rows_they_touch(rng):
    """The GPU's canonical NaN ``0x7fffffff``, which the GPU's 3xTF32 split would wrap to -0.0 if the NaN pass missed its
    chunk. (The simulator's split keeps every NaN, so there this checks only that NaNs flow through the exchanges.)"""
    q, k, v = make_qkv(rng, 1, 20, 40, 1, 1, 32)
    k[0, 21, 0, 21] = GPU_NAN  # key 21 (an odd row: swizzled; the second key block at Bc 16)
    out, _ = run_tc_forward(q, k, v, False, 0.0, 0, (16, 16), DSPLIT)
    assert np.isnan(out[0]).all(), "a NaN score makes every row's softmax NaN"
    q, k, v = make_qkv(rng, 1, 20, 40, 1, 1, 32)
    v[0, 17, 0, 30] = GPU_NAN  # only V (block 1, in the second of V_j's two stages): column 30 of every row
    out, _ = run_tc_forward(q, k, v, False, 0.0, 0, (16, 16), DSPLIT)
    assert np.isnan(out[0][..., 30]).all() and not np.isnan(np.delete(out[0], 30, axis=-1)).any()


def test_dsplit_runs_only_with_wide_and_is_off_by_default():
    assert fa2_forward_tc.default_features()["DSPLIT"] is False
    assert ds.dsplit_on(True, True) and not ds.dsplit_on(True, False) and not ds.dsplit_on(False, True)
    assert ds.tiling_for(128) == (4, 2, 2, 64, 128), "the default: 4 x 2 warps, Br 128, Bc 64"
    assert ds.tiling_for(32, (16, 16)) == (1, 1, 2, 16, 32) and ds.tiling_for(40, (100, 20)) == (4, 2, 2, 32, 40)
    assert 4 * ds.smem_floats(4, 2, 2, 64, 128) == 203776, "199 KB at d = 128: one block an SM"
    sim = _backend.is_simulator()
    for d, feats, bs, want in ((32, DSPLIT, (16, 16), True), (32, {"DSPLIT": True}, (16, 16), False),  # WIDE off at d <= 64
                               (40, DSPLIT, (16, 16), False), (32, {**DSPLIT, "CP_ASYNC": False}, (16, 16), False),
                               (128, {"DSPLIT": True}, None, True)):  # WIDE's default at d = 128
        q, k, v = make_qkv(np.random.default_rng(0), 1, 8, 8, 1, 1, d)
        prob = check_attention_args(q, k, v, 0.0, None, True, 0)
        kernel, grid, threads, nbytes = fa2_forward_tc.plan(prob, bs, None, feats)
        WM, MW, WN, Bc, DP = ds.tiling_for(d, bs)
        is_ds = DP % 32 == 0 and kernel is ds.fa2_forward_tc_dsplit_kernel(WM, MW, WN, Bc, DP, True, False, sim, True, True)
        assert is_ds is want, (d, feats)
        assert not want or (threads, nbytes) == (32 * WM * WN, 4 * ds.smem_floats(WM, MW, WN, Bc, DP, sim))
        assert (fa2_forward_tc.tiling(prob, bs, feats) == (WM, MW, WN, Bc, DP)) is want, "tiling: not the launched kernel's"
        if bs is None:  # Dev: the sweep's tile label comes from tiling(), not from a second plan
            assert fa2_sweep.plan_variant(("tc", None), feats, prob)[1] == f"{16 * MW * WM}x{Bc}"
    with pytest.raises(ValueError, match="DSPLIT needs DP % 32 == 0"):
        ds.fa2_forward_tc_dsplit_kernel(1, 1, 2, 16, 40, False, False, sim)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d", "causal", "p"), [(1000, 128, False, 0.0), (1000, 128, True, 0.0), (777, 128, True, 0.1),
                                                      (2048, 128, True, 0.0), (1000, 96, False, 0.0), (1000, 64, True, 0.0)])
def test_dsplit_on_gpu_shapes(rng, n, d, causal, p):
    _check(rng, 2, n, n, 4, 2, d, causal, p, None)


@pytest.mark.gpu
def test_dsplit_query_blocks_that_see_no_key_on_gpu(rng):
    _check(rng, 1, 1029, 513, 3, 1, 128, True, 0.0, None)
