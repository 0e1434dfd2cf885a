"""The 3xTF32 backward's two load paths for Q_i, dO_i (:mod:`numba_flash.tensorcore.fa2_backward_tf32`, ``CP_ASYNC``).

Claims checked:

* ``cp.async`` into two SRAM stages, issued one step ahead with the statistics in two stages beside them and
  NaNs made quiet by the thread that copied them (``CP_ASYNC``, the default at d <= 64), and the register
  path (one stage, the default above) compute the same gradients: dK and dV bit for bit, and dQ too in the
  simulator (its blocks run one at a time; on a GPU the order of dQ's atomic adds is free) or with
  ``deterministic=True``. The shapes have several query steps per key block, so both stages are filled, read
  and refilled: ragged, causal (query blocks that see no key are skipped), GQA (the step loop crosses query
  heads), dropout (the row keys are staged too) and a head dim whose padded row ends in a chunk past d.
* Where ``cp.async`` cannot run, the register path runs: a head dim that is not a multiple of 4 and Q, dO
  whose rows are not 16-byte aligned.
* On a GPU (marker ``gpu``): the same at realistic shapes, and NaNs in Q and dO give the register path's NaNs
  bit for bit (the GPU's 3xTF32 split turns the canonical NaN ``0x7fffffff`` into a sign bit; the simulator's
  split keeps every NaN, so that case can only fail there).

As in the half backward's tests, a stage refilled while it is still read shows in the simulator only where a
block barrier does not already separate the two (its ``mma`` twins exchange lanes through block barriers); the
GPU cases with ``deterministic=True`` are the ones for the step's one barrier.
"""

from __future__ import annotations

from numba_flash._launch import check_attention_args
from numba_flash.fast import _plan
from numba_flash.tensorcore import fa2_backward_tf32

import numpy as np
import pytest
from attn_testing import make_qkv, run_tf32_backward, unaligned_copy


def _gradients(q, k, v, dout, causal, p, seed, bs, cp, deterministic=False, config=None, words=None):
    """(dq, dk, dv) of the 3xTF32 backward at kernel level with ``CP_ASYNC`` = ``cp`` after the 3xTF32 forward,
    and the ``CP_ASYNC`` its ``plan`` was given (after ``backward``'s own fallbacks). ``words``: the kernel
    arrays of q and dout to pass instead of aligned copies."""
    words = None if words is None else dict(zip(("q", "dout"), words))
    grads, planned = run_tf32_backward(
        q, k, v, dout, causal, p, seed, bs, {"CP_ASYNC": cp}, deterministic, config, words
    )
    return grads, planned["CP_ASYNC"]


def _assert_same(a, b, names=("dq", "dk", "dv")):
    for name, x, y in zip(names, a, b):
        np.testing.assert_array_equal(
            x.view(np.uint32), y.view(np.uint32), err_msg=f"{name}: cp.async and register paths differ"
        )


#: (batch, s_q, s_k, nheads, nheads_k, d, causal, dropout_p, block_sizes (Br, Bc)): Br 16 gives 3-4 query steps
#: per key block (both stages used, then refilled)
CASES = [
    pytest.param(1, 53, 37, 2, 1, 16, False, 0.0, (16, 32), id="ragged-gqa-d16"),
    pytest.param(1, 45, 50, 1, 1, 20, True, 0.0, (16, 16), id="causal-d20-padded-chunk"),
    pytest.param(1, 50, 21, 2, 2, 8, True, 0.15, (16, 16), id="causal-sq>sk-dropout-d8"),
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_cp_async_stages_give_the_register_paths_gradients_bit_for_bit(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    seed = int(rng.integers(0, 2**32))
    (cp_grads, cp_planned), (reg_grads, reg_planned) = (
        _gradients(q, k, v, dout, causal, p, seed, bs, cp) for cp in (True, False)
    )
    assert cp_planned and not reg_planned
    _assert_same(cp_grads, reg_grads)


def test_cp_async_stages_in_the_deterministic_backward_give_the_register_paths_gradients(rng):
    """Without atomic dQ the main kernel has no barrier after dK, dV: the step's one barrier alone guards the stages."""
    q, k, v = make_qkv(rng, 1, 50, 40, 2, 1, 16)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    (cp_grads, cp_planned), (reg_grads, _) = (
        _gradients(q, k, v, dout, True, 0.0, 0, (16, 16), cp, True) for cp in (True, False)
    )
    assert cp_planned
    _assert_same(cp_grads, reg_grads)


def test_cp_async_is_the_default_where_the_h100_sweep_found_it_faster():
    # d <= 64: 1.03-1.11x; d = 128: two stages do not fit the default tiling, the tilings they fit were slower
    assert fa2_backward_tf32.default_features()["CP_ASYNC"] is None
    assert [fa2_backward_tf32.features_for(d)["CP_ASYNC"] for d in (16, 60, 64, 65, 96, 128)] == [True] * 3 + [
        False
    ] * 3
    assert not fa2_backward_tf32.features_for(64, {"CP_ASYNC": False})["CP_ASYNC"]
    assert fa2_backward_tf32.features_for(128, {"CP_ASYNC": True})["CP_ASYNC"]
    # after a WIDE forward (the default above d = 64) the unpadded rows fit two stages of the d = 128 default tiling,
    # 1.04-1.06x faster on an H100 (docs/results/sweeps/wide_bwd_h100_86d63ca.json, last in the tree at
    # e0e5a9b); d = 72 cannot take WIDE
    assert [fa2_backward_tf32.features_for(d, None, True)["CP_ASYNC"] for d in (72, 96, 128)] == [False, True, True]
    assert not fa2_backward_tf32.features_for(128, {"WIDE": False}, True)["CP_ASYNC"]


def test_the_two_stages_double_the_sram_of_q_and_do_only():
    NW, MW, BR, DP = fa2_backward_tf32.config_for(64)
    one, two = (fa2_backward_tf32.smem_floats(NW, MW, BR, DP, st) for st in (1, 2))
    assert two - one == 2 * BR * (DP + 4)


def test_head_dims_not_a_multiple_of_4_and_unaligned_inputs_take_the_register_path(rng):
    q, k, v = make_qkv(rng, 1, 20, 20, 1, 1, 6)
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    NW, MW, BR, DP = fa2_backward_tf32.config_for(6, (16, 16))
    # asked for, but d = 6 has rows that are not whole 16-byte chunks: one stage, the register path
    assert fa2_backward_tf32.plan(prob, (16, 16), None, {"CP_ASYNC": True})[5][0] == 4 * fa2_backward_tf32.smem_floats(
        NW, MW, BR, DP, 1
    )
    # d = 16, Q and dO 4 bytes past a 16-byte boundary: backward() drops CP_ASYNC
    q, k, v = make_qkv(rng, 1, 20, 20, 1, 1, 16)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    sq, sdo = unaligned_copy(q), unaligned_copy(dout)
    assert not _plan.aligned16(sq) and not _plan.aligned16(sdo)
    shifted, planned = _gradients(q, k, v, dout, False, 0.0, 0, (16, 16), True, words=(sq, sdo))
    aligned, planned_aligned = _gradients(q, k, v, dout, False, 0.0, 0, (16, 16), True)
    assert not planned, "unaligned Q, dO: backward() must ask for the register path"
    assert planned_aligned, "aligned: the cp.async path"
    _assert_same(shifted, aligned)


#: GPU tilings (NW, MW, BR, DP=None): the default where two stages fit (d = 64) and the d = 128 candidates that fit
#: 227 KB with two stages (the default 8 x 1 x 32 needs 236 KB)
GPU_CASES = [
    (1000, 64, False, 0.0, False, None),
    (1000, 64, True, 0.1, False, None),
    (777, 96, True, 0.0, False, (4, 1, 32)),
    (1000, 128, False, 0.0, False, (4, 1, 32)),
    (1000, 128, True, 0.0, False, (8, 1, 16)),
    (1000, 64, True, 0.0, True, None),
    (1000, 128, False, 0.0, True, (4, 1, 32)),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d", "causal", "p", "det", "tiling"), GPU_CASES)
def test_cp_async_stages_give_the_register_paths_gradients_on_gpu_shapes(rng, n, d, causal, p, det, tiling):
    """dK, dV bit for bit (dQ too with ``deterministic``: atomic adds land in any order)."""
    q, k, v = make_qkv(rng, 2, n, n, 4, 2, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    config = None if tiling is None else (*tiling, 8 * ((d + 7) // 8))
    (cp_grads, cp_planned), (reg_grads, _) = (
        _gradients(q, k, v, dout, causal, p, 7, None, cp, det, config) for cp in (True, False)
    )
    assert cp_planned
    _assert_same(cp_grads[0 if det else 1 :], reg_grads[0 if det else 1 :], ("dq", "dk", "dv")[0 if det else 1 :])


@pytest.mark.gpu
def test_nans_in_q_and_do_give_the_register_paths_nans_on_gpu(rng):
    q, k, v = make_qkv(rng, 1, 300, 300, 2, 2, 64)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    q[0, 7, 1, 5] = np.nan
    dout[0, 200, 0, 9] = np.nan
    (cp_grads, cp_planned), (reg_grads, _) = (
        _gradients(q, k, v, dout, False, 0.0, 0, None, cp, True) for cp in (True, False)
    )
    assert cp_planned
    _assert_same(cp_grads, reg_grads)
    assert np.isnan(cp_grads[1]).any() and np.isnan(cp_grads[2]).any(), "a NaN in Q (dO) reaches dK (dV)"
