"""The 3xTF32 forward's ``STAGE_O_STEP`` (:mod:`numba_flash.fast.fa2_forward_tc`): line 10 staged per 8-key step.

Claims checked:

* With ``STAGE_O_STEP`` each 8-key step of ``P~ V_j`` runs into a zeroed accumulator that is added to O with IEEE
  float32 adds (the way ``STAGE_S`` stages each k step of S), instead of one staged product per key block. It is
  not the default's bits (one more rounded add per 8 keys), so the claims are the forward's: O follows the error
  rule against float64 (2x naive float32's error), and L, m, l, which line 10 does not touch, are bitwise the
  default's, on ragged, causal (blocks whose rows see no key included), GQA, dropout and ``MW = 2`` shapes.
* It does not depend on ``STAGE_O`` (it overrides it): with ``STAGE_O`` off the result is bitwise the same.
* On a GPU (marker ``gpu``): the same at realistic shapes, at the tilings it was built for (``MW = 2`` at d = 128).

Simulator shapes stay tiny (N <= 45, d <= 24): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import (
    TC_FORWARD_SRAM_CASES,
    assert_error_rule,
    assert_same_bits,
    make_qkv,
    naive_attention_float32,
    run_tc_forward,
)

CASES = [pytest.param(*c[:-1], id=c[-1]) for c in TC_FORWARD_SRAM_CASES]


def _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (step, feats), (default, _) = (run_tc_forward(q, k, v, causal, p, seed, bs, {"STAGE_O_STEP": on}) for on in (True, False))
    assert feats["STAGE_O_STEP"]
    assert_same_bits(step[1:], default[1:], "STAGE_O_STEP and the default (L, m, l)", names=("L", "m", "l"))
    if p == 0.0:
        ref = standard_attention(q, k, v, causal=causal).O
        assert_error_rule(step[0], ref, naive_attention_float32(q, k, v, causal=causal), what="O")
    else:  # with dropout the kept set is the default's: O differs by the staging's rounding only
        np.testing.assert_allclose(step[0], default[0], rtol=1e-5, atol=1e-6)
    return q, k, v, seed, step


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_o_staged_per_key_step_follows_the_error_rule_and_keeps_the_statistics(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v, seed, step = _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs)
    unstaged, _ = run_tc_forward(q, k, v, causal, p, seed, bs, {"STAGE_O_STEP": True, "STAGE_O": False})
    assert_same_bits(unstaged, step, "STAGE_O_STEP with STAGE_O off and on")


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d", "causal", "bs"), [(1000, 128, False, None), (1000, 128, True, (128, 32)),
                                                       (777, 96, True, None), (1024, 64, False, None)])
def test_o_staged_per_key_step_on_gpu_shapes(rng, n, d, causal, bs):
    _check(rng, 2, n, n, 4, 2, d, causal, 0.0, bs)
