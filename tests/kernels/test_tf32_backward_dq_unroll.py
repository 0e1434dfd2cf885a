"""The 3xTF32 backward's dQ product a few k steps a pass (:mod:`numba_flash.tensorcore.fa2_backward_tf32`,
``DQ_UNROLL``).

Line 15, ``dQ_i += tau dS_ij K_j``, runs over the block's keys 8 at a time, each k step's three ``mma`` into a zeroed
accumulator added to dQ with float32 adds. ``DQ_UNROLL`` (2 or 4) writes that many k steps into one pass of the loop
so that more ``mma`` chains are in flight (the kernel is latency-bound at 8 warps per SM); the steps and their adds
keep their order.

Claims checked:

* The gradients are those of ``DQ_UNROLL = 1`` bit for bit: dK and dV always, dQ too in the simulator (its blocks run
  one at a time, so the atomic adds come in one order); on ragged, causal, GQA and dropout shapes with several key k
  steps per block. (``deterministic=True`` computes dQ in its own kernel, which ``DQ_UNROLL`` does not touch.)
* A factor that does not divide the block's k steps, or other than 1, 2 and 4, is refused when the kernel is built.
* The default (``DQ_UNROLL=None``) is 4 above d = 64 where 4 divides the block's k steps, else 1: the factor
  :func:`~numba_flash.tensorcore.fa2_backward_tf32.plan` builds the kernel with; a given factor is kept.
* On a GPU (marker ``gpu``): the same at realistic shapes, with dQ within the 3x rule where its atomic adds may come
  in another order.
"""

from __future__ import annotations

import inspect

from numba_flash._launch import Allocator, Problem, check_attention_args, poison_outputs
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_backward_tf32, fa2_forward_tf32

import numpy as np
import pytest
from attn_testing import assert_error_rule, assert_same_bits, make_qkv, to_host, torch_attention_grads

torch = pytest.importorskip("torch")


def _gradients(q, k, v, dout, causal, p, bs, unroll):
    """(dq, dk, dv) of the 3xTF32 backward at kernel level with ``DQ_UNROLL`` = ``unroll``, after the 3xTF32 forward."""
    prob = check_attention_args(q, k, v, p, None, causal, 7)
    alloc = Allocator(q)
    kq, kk, kv, kdo = (alloc.to_kernel(x) for x in (q, k, v, dout))
    fwd = fa2_forward_tf32.forward(kq, kk, kv, prob, alloc, bs)
    with poison_outputs():
        grads = fa2_backward_tf32.backward(
            kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, bs, features={"DQ_UNROLL": unroll}
        )
    return [to_host(g) for g in grads]


def _inputs(rng, b, s_q, s_k, h, h_k, d):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    return q, k, v, rng.standard_normal(q.shape).astype(np.float32)


#: (b, s_q, s_k, h, h_k, d, causal, p, block_sizes): Bc = 32 is four 8-key k steps of line 15
CASES = [
    pytest.param(1, 20, 37, 2, 1, 8, False, 0.0, (16, 32), id="ragged-gqa"),
    pytest.param(1, 24, 24, 1, 1, 12, True, 0.1, (16, 32), id="causal-dropout-d12"),
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_dq_k_steps_in_pairs_or_fours_give_the_same_gradients(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v, dout = _inputs(rng, b, s_q, s_k, h, h_k, d)
    base = _gradients(q, k, v, dout, causal, p, bs, 1)
    for unroll in (2, 4):
        assert_same_bits(
            base, _gradients(q, k, v, dout, causal, p, bs, unroll), f"DQ_UNROLL={unroll} and 1", ("dq", "dk", "dv")
        )


def test_a_factor_that_does_not_divide_the_k_steps_is_refused():
    sim = _backend.is_simulator()
    # Bc = 16: two k steps
    with pytest.raises(ValueError, match="does not divide the 2 k steps"):
        fa2_backward_tf32.fa2_backward_tf32_kernel(1, 1, 16, 16, False, False, True, sim, DQ_UNROLL=4)
    with pytest.raises(ValueError, match="must be 1, 2 or 4"):
        fa2_backward_tf32.fa2_backward_tf32_kernel(4, 1, 16, 16, False, False, True, sim, DQ_UNROLL=8)


@pytest.mark.parametrize(
    ("d", "block_sizes", "features", "expected"),
    [
        (128, None, None, 4),  # the default tiling: Bc = 128, 16 k steps
        (96, None, None, 4),
        (64, None, None, 1),
        (72, (16, 16), None, 1),  # Bc = 16: two k steps, 4 does not divide them
        (128, (32, 32), None, 4),  # Bc = 32: four k steps
        (128, None, {"DQ_UNROLL": 2}, 2),
        (64, None, {"DQ_UNROLL": 4}, 4),
    ],
)
def test_the_default_unroll_is_four_above_d64_where_it_divides_the_k_steps(
    monkeypatch, d, block_sizes, features, expected
):
    built = []
    real = fa2_backward_tf32.fa2_backward_tf32_kernel

    def record(*args):
        built.append(inspect.signature(real).bind(*args).arguments["DQ_UNROLL"])
        return real(*args)

    monkeypatch.setattr(fa2_backward_tf32, "fa2_backward_tf32_kernel", record)
    for causal in (False, True):
        prob = Problem(
            batch=1,
            seqlen_q=256,
            seqlen_k=256,
            nheads=2,
            nheads_k=2,
            headdim=d,
            softmax_scale=d**-0.5,
            causal=causal,
            dropout_p=0.0,
            seed=0,
        )
        fa2_backward_tf32.plan(prob, block_sizes, features=features)
    assert built == [expected, expected]


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d", "causal"), [(1000, 128, False), (1000, 128, True), (2049, 64, True)])
def test_dq_k_steps_in_pairs_or_fours_on_gpu_shapes(rng, n, d, causal):
    q, k, v, dout = _inputs(rng, 2, n, n, 4, 2, d)
    base = _gradients(q, k, v, dout, causal, 0.0, None, 1)
    ref = torch_attention_grads(
        [torch.from_numpy(x) for x in (q, k, v)], torch.from_numpy(dout), causal, 0.0, 0, torch.float64
    )
    naive = torch_attention_grads(
        [torch.from_numpy(x) for x in (q, k, v)], torch.from_numpy(dout), causal, 0.0, 0, torch.float32
    )
    for unroll in (2, 4):
        got = _gradients(q, k, v, dout, causal, 0.0, None, unroll)
        assert_same_bits(base[1:], got[1:], f"DQ_UNROLL={unroll} and 1", ("dk", "dv"))
        assert_error_rule(
            got[0].astype(np.float64).reshape(ref[0].shape), ref[0], naive[0], mult=3.0, what=f"dQ, DQ_UNROLL={unroll}"
        )
