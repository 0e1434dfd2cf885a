"""The 3xTF32 forward's ``RESCALE_FMA`` (:mod:`numba_flash.tensorcore.fa2_forward_tf32`): line 10's rescale of O in one
FFMA.

FA2's line 10 is ``O_i = diag(e^(m_old - m_new)) O_i + P~ V_j``. With ``STAGE_O_STEP`` (the d = 128 default where a warp
has two m16 tiles) the kernel multiplies O by ``e^(m_old - m_new)`` first, then adds each 8-key step's staged product.
With ``RESCALE_FMA`` the first 8-key step's add does the multiply too, ``O = fma(O, alpha, (P~ V_j)_0)``: an FMUL fewer
per element of O and key block (128 instructions per warp and key block at d = 128), and one rounding fewer.

Claims checked:

* O follows the error rule against float64 (2x naive float32's error) with it on, and L, m, l (line 9's, which line 10
  does not touch) are bitwise those without it; the plan compiles another kernel (it did not ignore the feature).
  Shapes: ragged, GQA, causal (blocks whose rows see no key included), dropout and ``MW = 2``, each over several key
  blocks, so that rows whose max grows in a later block are rescaled by alpha < 1.
* It acts only with ``STAGE_O_STEP``, whose separate rescale it replaces, and is on by default for the causal 8 x 2 x 16
  tiling only, where it paid (:func:`~numba_flash.tensorcore.fa2_forward_tf32.rescale_fma_on`): a default call's plan at
  causal N 4k, d 128 takes it, the same call without causal does not.
* On a GPU (marker ``gpu``): the same at realistic shapes and the d = 128 default tilings (8 x 2 x 16; causal 4 x 2 x 16
  and 8 x 2 x 16), where the GPU's FFMA rounds once.

In the simulator ``fma(a, b, c)`` is ``a * b + c`` in float32, two roundings, so its O is the bits without the feature;
the claims there are the error rule, the statistics and that the kernel with it is a kernel of its own.
Simulator shapes stay tiny (N <= 45, d <= 24): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

from numba_flash._launch import check_attention_args
from numba_flash.tensorcore import fa2_forward_tf32
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    assert_same_bits,
    make_qkv,
    naive_attention_float32,
    run_tc_feature_pair,
    tc_forward_sram_params,
)

CASES = tc_forward_sram_params()


def _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, stage_o_step=True):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    on, off = ({"STAGE_O_STEP": stage_o_step, "RESCALE_FMA": a} for a in (True, False))
    fma, sep = run_tc_feature_pair(q, k, v, causal, p, seed, bs, on, off, "RESCALE_FMA")
    assert_same_bits(fma[1:], sep[1:], "RESCALE_FMA on and off (L, m, l)", names=("L", "m", "l"))
    ref = standard_attention(q, k, v, causal=causal, dropout_p=p, seed=seed).O  # the same dropout mask as the kernel
    assert_error_rule(fma[0], ref, naive_attention_float32(q, k, v, causal=causal, dropout_p=p, seed=seed), what="O")


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_rescale_in_the_first_steps_fma_follows_the_error_rule_and_keeps_the_statistics(
    rng, b, s_q, s_k, h, h_k, d, causal, p, bs
):
    _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs)


def test_rescale_fma_acts_only_with_o_staged_per_key_step_and_is_on_by_default_for_causal_8x2x16():
    on = fa2_forward_tf32.rescale_fma_on
    assert on(True, True) and not on(False, True, True, (8, 2, 16))
    assert not on(True, False, True, (8, 2, 16)), "without STAGE_O_STEP there is no separate rescale to fold"
    assert fa2_forward_tf32.default_features()["RESCALE_FMA"] is None
    assert on(None, True, True, (8, 2, 16)), "the causal 8 x 2 x 16 default: 1.04x on an H200 at N 2k-16k"
    assert not on(None, True, False, (8, 2, 16)), "non-causal 8 x 2 x 16: 0.997-1.008x"
    assert not on(None, True, True, (4, 2, 16)), "causal 4 x 2 x 16: 1.002-1.014x"
    q, k, v = make_qkv(np.random.default_rng(0), 1, 4096, 4096, 1, 1, 128)
    for causal, want in ((True, True), (False, False)):  # Dev: the plan of a default call at N 4k, d 128 (8 x 2 x 16)
        prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
        got = fa2_forward_tf32.plan(prob)[0]
        assert (got is fa2_forward_tf32.plan(prob, None, None, {"RESCALE_FMA": True})[0]) is want
        assert (got is fa2_forward_tf32.plan(prob, None, None, {"RESCALE_FMA": False})[0]) is not want


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "causal", "p", "bs"),
    [
        (1000, False, 0.0, None),
        (1000, True, 0.0, (128, 16)),
        (1000, True, 0.0, (256, 16)),
        (777, True, 0.1, (128, 16)),
        (2048, False, 0.0, None),
    ],
)
def test_rescale_fma_on_gpu_shapes(rng, n, causal, p, bs):
    _check(rng, 2, n, n, 4, 2, 128, causal, p, bs, stage_o_step=None)
