"""The 3xTF32 forward's ``O_OUTER`` (:mod:`numba_flash.fast.fa2_forward_tc`): line 10 with its loops interchanged.

FA2's line 10 is ``O_i = diag(e^(m_old - m_new)) O_i + P~ V_j``. ``STAGE_O`` computes a key block's ``P~ V_j`` into a zeroed
accumulator (``rT``, as many registers as O) over the block's 8-key steps, then adds it to the rescaled O once, an FMA per
element; at d = 128 with two m16 tiles a warp that accumulator does not fit, so ``STAGE_O_STEP`` adds each 8-key step
to O instead (an FMUL and two FADDs per element and key block at ``Bc = 16``). ``O_OUTER`` takes O's tiles in the outer
loop and the block's steps in the inner one: each tile's accumulator lives for one tile only, so no ``rT``, and O gets
``STAGE_O``'s one FMA per element and key block.

Claims checked:

* The same products, adds and order as ``STAGE_O``: O, L, m, l are **bit for bit** those of ``STAGE_O`` without
  ``STAGE_O_STEP``, on ragged, GQA, causal (blocks whose rows see no key included), dropout and ``MW = 2`` shapes, with
  and without ``WIDE`` (whose renamed columns take V in 16-byte loads of four tiles), and with ``Bc = 32`` (four steps a
  block); O follows the error rule against float64; the plan compiles a kernel of its own (it did not ignore the feature).
* It runs only where it can: with ``STAGE_O`` (whose bits it keeps) and without ``SPLIT_KV`` (whose V pairs it does not
  read); the plan drops it elsewhere and the kernel factory refuses it.
* On a GPU (marker ``gpu``): the same bits at realistic shapes and the d = 128 default tilings (4 x 2 x 16 causal at
  N 512 / 1k, 8 x 2 x 16 without ``SPLIT_KV``), where ``STAGE_O``'s ``rT`` spills to local memory and ``O_OUTER`` does not.

Simulator shapes stay tiny (N <= 45, d <= 32): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

from numba_flash._launch import check_attention_args
from numba_flash.fast import fa2_forward_tc
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import assert_error_rule, assert_same_bits, make_qkv, naive_attention_float32, run_tc_feature_pair

#: O_OUTER against the STAGE_O path whose bits it must keep (STAGE_O_STEP off: rT staged over the key block)
ON, OFF = {"O_OUTER": True}, {"O_OUTER": False, "STAGE_O_STEP": False}
WIDE = {"CP_ASYNC": True, "WIDE": True}

#: (b, s_q, s_k, h, h_k, d, causal, p, block_sizes, wide), id
CASES = [
    pytest.param(1, 37, 40, 2, 1, 16, False, 0.0, (16, 16), False, id="ragged-gqa-d16"),
    pytest.param(1, 33, 45, 2, 1, 20, True, 0.0, (16, 16), False, id="causal-gqa-d20-padded"),
    pytest.param(1, 29, 35, 1, 1, 12, True, 0.1, (32, 16), False, id="causal-dropout-d12"),
    pytest.param(1, 45, 14, 1, 1, 8, True, 0.0, (16, 8), False, id="causal-sq>sk-blocks-without-keys-d8"),
    pytest.param(1, 40, 37, 1, 1, 24, True, 0.0, (128, 32), False, id="mw2-4warps-causal-d24-Bc32"),
    pytest.param(1, 37, 40, 2, 1, 32, False, 0.0, (16, 16), True, id="wide-ragged-gqa-d32"),
    pytest.param(1, 29, 35, 1, 1, 32, True, 0.1, (32, 16), True, id="wide-causal-dropout-d32"),
    pytest.param(1, 40, 37, 1, 1, 32, True, 0.0, (128, 16), True, id="wide-mw2-4warps-causal-d32"),
]


def _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, wide, extra=None):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    base = {**(WIDE if wide else {}), **(extra or {})}
    outer, staged = run_tc_feature_pair(q, k, v, causal, p, seed, bs, {**base, **ON}, {**base, **OFF}, "O_OUTER")
    assert_same_bits(outer, staged, "O_OUTER and STAGE_O")
    ref = standard_attention(q, k, v, causal=causal, dropout_p=p, seed=seed).O  # the same dropout mask as the kernel
    assert_error_rule(outer[0], ref, naive_attention_float32(q, k, v, causal=causal, dropout_p=p, seed=seed), what="O")


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs", "wide"), CASES)
def test_o_tiles_outer_give_stage_os_bits_and_follow_the_error_rule(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, wide):
    _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, wide)


def test_o_outer_runs_only_with_stage_o_and_without_split_kv_and_is_off_by_default():
    on = fa2_forward_tc.o_outer_on
    assert on(True, True, False) and not on(False, True, False) and not on(None, True, False)
    assert not on(True, False, False), "without STAGE_O there are no staged bits to keep"
    assert not on(True, True, True), "SPLIT_KV's V_j pairs are read by the 8-key steps only"
    assert fa2_forward_tc.default_features()["O_OUTER"] is None
    q, k, v = make_qkv(np.random.default_rng(0), 1, 40, 40, 1, 1, 32)
    prob = check_attention_args(q, k, v, 0.0, None, True, 0)
    default = fa2_forward_tc.plan(prob, (32, 16))[0]
    assert fa2_forward_tc.plan(prob, (32, 16), None, {"O_OUTER": False})[0] is default
    unstaged = fa2_forward_tc.plan(prob, (32, 16), None, {"STAGE_O": False})[0]
    assert fa2_forward_tc.plan(prob, (32, 16), None, {"O_OUTER": True, "STAGE_O": False})[0] is unstaged
    assert fa2_forward_tc.plan(prob, (32, 16), None, {"O_OUTER": True})[0] is not default
    with pytest.raises(ValueError, match="O_OUTER needs STAGE_O"):
        fa2_forward_tc.fa2_forward_tc_kernel(1, 1, 16, 32, True, False, False, True, True, False, O_OUTER=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "causal", "p", "bs"), [(512, True, 0.0, None), (1000, True, 0.0, None),
                                                       (777, True, 0.1, (128, 16)), (1000, False, 0.0, None)])
def test_o_outer_on_gpu_shapes(rng, n, causal, p, bs):
    _check(rng, 2, n, n, 4, 2, 128, causal, p, bs, False, extra={"SPLIT_KV": False})
