"""The fast FFMA backward's ``HEAD_SUMS`` (:mod:`numba_flash.fast.fa2_backward`): dK, dV of a GQA group summed per head.

A block of the FA2 backward owns key rows of one K/V head and loops over the ``G`` query heads of its group. Summing
``dK_j`` over all ``G N`` rows in one float32 register rounds more than torch's float32 path, which sums each head's
rows and then the heads; on the GPU case with a group of 3 at d = 40 that left the 3x rule (the performance log's
section "The 3x gradient rule's edge"). With ``HEAD_SUMS`` (on for GQA by default) each head's sum stays in the
registers, is added to the group's sum in HBM at the head's last block, and the registers start again from zero.

Claims checked:

* dK and dV of a group are, bit for bit, the float32 sum over its heads (in head order) of the dK, dV that the same
  kernel gives for each head alone; dQ is each head's own, bit for bit. Without ``HEAD_SUMS`` they are not: one sum
  over all the group's rows rounds otherwise (the check can tell the two apart). Causal with blocks that see no key,
  ragged, dropout and the deterministic dQ kernel included.
* It follows the 3x rule, and it is on by default for GQA only: MHA compiles the kernel without it.
* On a GPU (marker ``gpu``): the GQA d = 40 case of ``tests/kernels/test_fa2_kernels.py`` that was a strict xfail
  with the single register sum now passes there (its test), and this file's bit-for-bit claim holds at GPU shapes.
"""

from __future__ import annotations

from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.fast import fa2_backward, fa2_forward
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import assert_error_rule, assert_same_bits, make_qkv, naive_attention_backward_float32, to_host


def _grads(q, k, v, dout, causal, p, seed, head_sums, deterministic=False, bs=(16, 16)):
    """(dq, dk, dv) of the fast FFMA pair at kernel level, ``HEAD_SUMS`` as given."""
    prob = check_attention_args(q, k, v, p, None, causal, seed)
    alloc = Allocator(q)
    kq, kk, kv, kdo = (alloc.to_kernel(x) for x in (q, k, v, dout))
    fwd = fa2_forward.forward(kq, kk, kv, prob, alloc, bs)
    with poison_outputs():
        grads = fa2_backward.backward(
            kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, bs, deterministic, None, {"HEAD_SUMS": head_sums}
        )
    return [to_host(g) for g in grads]


def _per_head_sum(q, k, v, dout, causal, p, seed, deterministic, bs=(16, 16)):
    """dQ of each head alone, and dK, dV summed over the heads of each group in float32, head by head."""
    h, h_k = q.shape[2], k.shape[2]
    G = h // h_k
    dq = np.empty_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for hh in range(h):
        kv_head = hh // G
        one = lambda x, j: np.ascontiguousarray(x[:, :, j : j + 1])  # noqa: E731
        # the dropout mask is drawn per (batch, query head): a lone head draws head 0's, so only p = 0 compares here
        g = _grads(
            one(q, hh), one(k, kv_head), one(v, kv_head), one(dout, hh), causal, p, seed, False, deterministic, bs
        )
        dq[:, :, hh : hh + 1] = g[0]
        dk[:, :, kv_head : kv_head + 1] = (
            (dk[:, :, kv_head : kv_head + 1] + g[1]).astype(np.float32) if hh % G else g[1]
        )
        dv[:, :, kv_head : kv_head + 1] = (
            (dv[:, :, kv_head : kv_head + 1] + g[2]).astype(np.float32) if hh % G else g[2]
        )
    return dq, dk, dv


#: (b, s_q, s_k, h, h_k, d, causal, deterministic): a group of 3 with causal blocks that see no key (s_q > s_k), and a
#: group of 2 with ragged blocks and the deterministic dQ kernel
CASES = [
    pytest.param(1, 45, 21, 3, 1, 16, True, False, id="group3-causal-sq>sk-d16"),
    pytest.param(2, 37, 29, 4, 2, 12, False, True, id="group2-ragged-deterministic-b2-d12"),
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "det"), CASES)
def test_head_sums_give_dk_dv_as_the_float32_sum_of_each_heads(rng, b, s_q, s_k, h, h_k, d, causal, det):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    want = _per_head_sum(q, k, v, dout, causal, 0.0, 0, det)
    got = _grads(q, k, v, dout, causal, 0.0, 0, True, det)
    assert_same_bits(got, want, "HEAD_SUMS and the heads' sum", ("dq", "dk", "dv"))
    single = _grads(q, k, v, dout, causal, 0.0, 0, False, det)
    assert (single[1].view(np.uint32) != want[1].view(np.uint32)).any(), "one register over the group rounds otherwise"


def test_head_sums_follow_the_error_rule_with_dropout(rng):
    q, k, v = make_qkv(rng, 1, 40, 33, 4, 1, 16)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    seed = int(rng.integers(0, 2**32))
    got = _grads(q, k, v, dout, True, 0.15, seed, True)
    ref = standard_backward(dout, q, k, v, causal=True, dropout_p=0.15, seed=seed)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=True, dropout_p=0.15, seed=seed)
    for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        assert_error_rule(g, r, n, mult=3, what=f"{name} (HEAD_SUMS, dropout)")


def test_head_sums_are_on_for_gqa_only():
    assert fa2_backward.default_features()["HEAD_SUMS"] is None
    f = fa2_backward.default_features()
    for h_k, want in ((1, True), (2, False)):
        q, k, v = make_qkv(np.random.default_rng(0), 1, 8, 8, 2, h_k, 16)
        prob = check_attention_args(q, k, v, 0.0, None, False, 0)
        NT, BR, BC, DP = fa2_backward.config_for(16)
        main = fa2_backward.plan(prob)[0]
        assert main is fa2_backward.fa2_backward_fast_kernel(
            NT, BR, BC, DP, False, False, True, f["VEC"], f["PREFETCH"], False, want
        )
        assert fa2_backward.plan(prob, features={"HEAD_SUMS": not want})[0] is not main


@pytest.mark.gpu
def test_head_sums_give_the_heads_sum_on_gpu_shapes(rng):
    q, k, v = make_qkv(rng, 2, 777, 1029, 6, 2, 40)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    want = _per_head_sum(q, k, v, dout, True, 0.0, 0, True, None)  # the default tiling on both sides
    got = _grads(q, k, v, dout, True, 0.0, 0, True, True, None)
    assert_same_bits(got, want, "HEAD_SUMS and the heads' sum", ("dq", "dk", "dv"))
