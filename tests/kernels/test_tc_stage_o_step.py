"""The 3xTF32 forward's ``STAGE_O_STEP`` (:mod:`numba_flash.tensorcore.fa2_forward_tf32`): line 10 staged per 8-key
step.

Claims checked:

* With ``STAGE_O_STEP`` each 8-key step of ``P~ V_j`` runs into a zeroed accumulator that is added to O with IEEE
  float32 adds (the way each k step of S is staged), instead of one staged product per key block. It is
  not the default's bits (one more rounded add per 8 keys), so the claims are the forward's: O follows the error
  rule against float64 (2x naive float32's error), and L, m, l, which line 10 does not touch, are bitwise the
  default's, on ragged, causal (blocks whose rows see no key included), GQA, dropout and ``MW = 2`` shapes.
* It is on by default exactly where the tiling has ``MW = 2`` and d > 64: the ``cp.async`` path's non-causal d = 128
  default (8 warps of ``MW = 2``, ``Bc = 16``), which it makes fit the registers; off at d <= 64 (slower there) and
  for ``MW = 1`` (the causal d = 128 default, 4 warps of ``MW = 1``).
* On a GPU (marker ``gpu``): the same at realistic shapes, at the tilings it was built for (``MW = 2`` at d = 128,
  the non-causal default 8 x 2 x 16, with and without causal).

Simulator shapes stay tiny (N <= 45, d <= 24): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

from numba_flash._launch import check_attention_args
from numba_flash.runtime import backend as _backend
from numba_flash.runtime import smem as _smem
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
)

CASES = tc_forward_sram_params()


def _fits_split_kv(NW, MW, Bc):
    """Whether ``SPLIT_KV``'s d = 128 SRAM fits (not in the simulator, whose exchange scratch adds 6 KB at 8 warps): the
    plan takes its default only there."""
    return (
        4 * fa2_forward_tf32.smem_floats(NW, MW, Bc, 128, _backend.is_simulator(), 2, True, True)
        <= _smem.max_optin_bytes()
    )


def _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (step, feats), (default, _) = (
        run_tc_forward(q, k, v, causal, p, seed, bs, {"STAGE_O_STEP": on}) for on in (True, False)
    )
    assert feats["STAGE_O_STEP"]
    assert_same_bits(step[1:], default[1:], "STAGE_O_STEP and the default (L, m, l)", names=("L", "m", "l"))
    ref = standard_attention(q, k, v, causal=causal, dropout_p=p, seed=seed).O  # the same dropout mask as the kernel
    assert_error_rule(step[0], ref, naive_attention_float32(q, k, v, causal=causal, dropout_p=p, seed=seed), what="O")
    return q, k, v, seed, step


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_o_staged_per_key_step_follows_the_error_rule_and_keeps_the_statistics(
    rng, b, s_q, s_k, h, h_k, d, causal, p, bs
):
    _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs)


def test_o_staged_per_key_step_is_on_by_default_where_two_tiles_per_warp_need_it():
    assert fa2_forward_tf32.default_features()["STAGE_O_STEP"] is None
    assert fa2_forward_tf32.stage_o_step(None, 2, 128) and fa2_forward_tf32.stage_o_step(None, 2, 72)
    assert not fa2_forward_tf32.stage_o_step(None, 1, 128), "MW = 1 fits without it, and is slower with it"
    assert not fa2_forward_tf32.stage_o_step(None, 2, 64), "d = 64: 8 % slower with it on an H100"
    assert not fa2_forward_tf32.stage_o_step(False, 2, 128) and fa2_forward_tf32.stage_o_step(True, 1, 64)
    q, k, v = make_qkv(np.random.default_rng(0), 1, 8, 8, 1, 1, 128)
    for causal, (NW, MW, Bc, _), on in ((False, (8, 2, 16, 128), True), (True, (4, 1, 32, 128), False)):
        prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
        assert fa2_forward_tf32.config_for(128, None, None, causal) == (NW, MW, Bc, 128)
        kernel = fa2_forward_tf32.plan(prob)[0]
        assert kernel is fa2_forward_tf32.fa2_forward_tc_kernel(
            NW,
            MW,
            Bc,
            128,
            causal,
            False,
            False,
            _backend.is_simulator(),
            True,
            on,
            fa2_forward_tf32.wide_on(None, 128, True),
            causal,
            True,  # WIDE: the d = 128 default; HEAVY_FIRST with causal; Q_ASYNC
            fa2_forward_tf32.warp_skip_on(None, causal, _backend.is_simulator(), 128),
            fa2_forward_tf32.split_kv_on(None, True, (NW, MW, Bc)) and _fits_split_kv(NW, MW, Bc),
        )


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "d", "causal", "bs"),
    [
        (1000, 128, False, None),
        (1000, 128, True, (256, 16)),
        (1000, 128, True, (128, 32)),
        (777, 96, True, None),
        (1024, 64, False, None),
        # 4 x 1 x 16, three blocks per SM (fa2_sweep tc-cp-4x1x16-ostep)
        (1000, 128, False, (64, 16)),
        (1000, 128, True, (64, 16)),
    ],
)
def test_o_staged_per_key_step_on_gpu_shapes(rng, n, d, causal, bs):
    _check(rng, 2, n, n, 4, 2, d, causal, 0.0, bs)
