"""The 3xTF32 forward's folded warp tiles and per-tile skipping on the causal diagonal (``FOLD``, ``TILE_SKIP``,
:mod:`numba_flash.fast.fa2_forward_tc`).

A causal thread block visits the key blocks up to its *last* row's horizon, so on its diagonal the m16 tiles of its
earlier rows meet key blocks they do not see. Dealt to the warps in runs (warp ``w``: tiles ``MW w ..``), the last warp
sees nearly every diagonal block with both its tiles, and every key block's barrier waits for it. Folded (warp ``w``:
tiles ``w`` and ``2 NW - 1 - w``), each warp holds one early and one late tile; with ``TILE_SKIP`` a warp skips the
``mma`` of a tile that sees none of a key block's keys.

Claims checked:

* The count behind the docstring (:func:`~numba_flash.fast.fa2_forward_tc.diagonal_tile_steps`): at 4 x 2 x 16 the
  diagonal needs 36 of a block's 64 tile-steps; the slowest warp of each key block computes 16 of them in runs, 15 in
  runs with the skip, 12 folded with it, and each warp's own work is then the same (9).
* Folding changes who computes a row, not what it computes: O, L, m, l bit for bit against the tiles in runs, in the
  simulator (causal, two ragged query blocks, s_q above and below s_k, dropout, the 16-byte ``WIDE`` path with its staged
  O rows, ``SPLIT_KV``).
* On a GPU (marker ``gpu``), folding with the skip keeps the same bits at realistic shapes and at the tilings it
  applies to (4 x 2 x 16 and 8 x 2 x 16 at d = 128, 4 x 2 x 32 at d = 64).
* Both are off by default (together they ran 0.82-0.83x the default on an H200), only with causal (``FOLD`` also only with ``MW = 2``); ``TILE_SKIP``
  never in the simulator, whose ``mma`` exchanges through block barriers that every warp must reach.
"""

from __future__ import annotations

from numba_flash import _backend
from numba_flash._launch import check_attention_args
from numba_flash.fast import fa2_forward_tc

import numpy as np
import pytest
from attn_testing import assert_causal_tc_feature_keeps_the_bits, assert_same_bits, make_qkv, run_tc_forward

FOLDED = {"FOLD": True, "TILE_SKIP": not _backend.is_simulator()}


def test_folding_with_the_skip_evens_out_the_causal_diagonal():
    steps = fa2_forward_tc.diagonal_tile_steps
    assert steps(4, 2, 16, False, False) == (36, 16), "in runs: the last warp's two tiles in every key block"
    assert steps(4, 2, 16, False, True) == (36, 15), "the skip alone: tile 6 sits out one key block"
    assert steps(4, 2, 16, True, True) == (36, 12), "folded: two tiles in key blocks 0-3, one in 4-7"
    assert steps(4, 2, 16, True, False) == (36, 16), "folded without the skip: the same work, dealt otherwise"
    assert steps(8, 2, 16, True, True) == (136, 24) and steps(4, 2, 32, True, True) == (20, 6)
    for NW, MW in ((4, 2), (8, 2), (4, 4)):
        dealt = [fa2_forward_tc.folded_tiles(NW, MW, w, True) for w in range(NW)]
        assert sorted(sum(dealt, [])) == list(range(NW * MW)), "every tile once"
        per_warp = {sum(T + 1 for T in ts) for ts in dealt}  # at Bc = 16 tile T sees the diagonal's key blocks 0..T
        assert len(per_warp) == 1, f"folded, every warp needs the same tile-steps ({NW} x {MW}: {per_warp})"


def test_fold_and_tile_skip_are_off_by_default_and_only_where_they_apply():
    feats = fa2_forward_tc.default_features()
    assert feats["FOLD"] is False and feats["TILE_SKIP"] is False, "together 0.82-0.83x the default (H200, 35b0cb0)"
    fold, skip = fa2_forward_tc.fold_on, fa2_forward_tc.tile_skip_on
    assert fold(True, True, 2) and not fold(False, True, 2) and not fold(None, True, 2)
    assert not fold(True, False, 2) and not fold(True, True, 1) and not fold(True, True, 4), "causal only, two tiles a warp"
    assert skip(True, True, False) and not skip(True, False, False) and not skip(True, True, True) and not skip(None, True, False)
    with pytest.raises(ValueError, match="FOLD needs CAUSAL and MW = 2"):
        fa2_forward_tc.fa2_forward_tc_kernel(4, 1, 16, 16, True, False, False, True, FOLD=True)
    with pytest.raises(ValueError, match="FOLD needs CAUSAL and MW = 2"):
        fa2_forward_tc.fa2_forward_tc_kernel(4, 2, 16, 16, False, False, False, True, FOLD=True)
    with pytest.raises(ValueError, match="TILE_SKIP needs CAUSAL and a GPU"):
        fa2_forward_tc.fa2_forward_tc_kernel(4, 2, 16, 16, True, False, False, True, TILE_SKIP=True)


def test_the_plan_compiles_another_kernel_for_fold_and_drops_warp_skip_with_it():
    q, k, v = make_qkv(np.random.default_rng(0), 1, 40, 40, 1, 1, 16)
    prob = check_attention_args(q, k, v, 0.0, None, True, 0)
    folded, plain = (fa2_forward_tc.plan(prob, (128, 16), None, f)[0] for f in ({"FOLD": True, "WARP_SKIP": True}, {}))
    assert folded is not plain
    assert fa2_forward_tc.plan(prob, (64, 16), None, {"FOLD": True})[0] is fa2_forward_tc.plan(prob, (64, 16), None, {})[0], (
        "one m16 tile a warp: nothing to fold, the same kernel")


#: (b, s_q, s_k, h, h_k, d, dropout p, features over the fold): 4 warps of two m16 tiles (Br = 128), Bc = 16
SIM_CASES = [
    pytest.param(1, 136, 136, 1, 1, 8, 0.0, {}, id="two-blocks-ragged-d8"),
    pytest.param(1, 130, 90, 1, 1, 8, 0.0, {}, id="sq>sk-rows-without-keys-d8"),
    pytest.param(1, 90, 150, 1, 1, 8, 0.1, {}, id="sq<sk-dropout-d8"),
    pytest.param(1, 128, 128, 1, 1, 32, 0.0, {"CP_ASYNC": True, "WIDE": True, "SPLIT_KV": True}, id="wide-split-kv-d32"),
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "p", "extra"), SIM_CASES)
def test_folding_keeps_the_outputs_bit_for_bit(rng, b, s_q, s_k, h, h_k, d, p, extra):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (on, f_on), (off, _) = (run_tc_forward(q, k, v, True, p, seed, (128, 16), {**extra, **f}) for f in (FOLDED, {}))
    assert f_on["FOLD"]
    assert_same_bits(on, off, "FOLD on and off")


#: realistic shapes: ragged, s_q below and above s_k, GQA, dropout, and each tiling with two m16 tiles a warp
GPU_CASES = [(2, 1000, 1000, 4, 2, 128, 0.0, None), (2, 512, 512, 4, 2, 128, 0.0, None),
             (2, 2049, 2049, 4, 1, 128, 0.0, (128, 16)), (1, 1000, 1531, 4, 2, 128, 0.1, (256, 16)),
             (1, 1531, 1000, 4, 2, 128, 0.0, (128, 16)), (2, 1029, 1029, 4, 2, 64, 0.17, None),
             (2, 777, 777, 4, 4, 96, 0.0, (128, 16))]


@pytest.mark.gpu
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "p", "bs"), GPU_CASES)
def test_folding_with_the_skip_keeps_the_outputs_bit_for_bit_on_gpu(rng, b, s_q, s_k, h, h_k, d, p, bs):
    assert_causal_tc_feature_keeps_the_bits(rng, b, s_q, s_k, h, h_k, d, p, bs, FOLDED, {}, "FOLD with TILE_SKIP")
