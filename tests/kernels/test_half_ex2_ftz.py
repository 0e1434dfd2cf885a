"""The half kernels' ``P = 2^(S' - m)`` by ``ex2.approx.ftz.f32`` (``EX2_FTZ`` of
:mod:`numba_flash.tensorcore.fa2_forward_half` and :mod:`numba_flash.tensorcore.fa2_backward_half`).

Claims checked:

* ``exp2`` of :func:`numba_flash.tensorcore.ptx.make_exp2` with ``ftz`` is ``2^x`` for ``x >= -126`` and 0 below (where
  ``2^x`` is subnormal); without it the subnormals stay; both give 0 at ``-inf`` and NaN at NaN.
* With ``EX2_FTZ`` the forward gives bitwise equal O, L, m, l to the forward without it on ragged, causal, GQA,
  dropout and ``MW = 2`` shapes (no probability there is below 2^-126 of its row's largest), in fp16 and bf16.
* On a sharp softmax (scores 40 times larger, so that many ``S' - m`` are below -126): L, m, l are still bitwise
  equal (a subnormal is below the rounding of a row sum >= 1) and O follows the half error rule.
* The backward with ``EX2_FTZ`` (main kernel with atomic dQ adds, and the deterministic dQ kernel) gives bitwise
  equal dQ, dK, dV to the backward without it on the same shapes. On a GPU the atomic dQ adds land in the order
  the blocks reach them, so two runs of the same kernel may differ in dQ's last bits: there dQ is compared only
  from the deterministic kernel (dK, dV, each written by one block, always).
* On a GPU (marker ``gpu``): bitwise equal at realistic shapes, forward and backward.
"""

from __future__ import annotations

import math

from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_backward_half, fa2_forward_half, ptx

import numpy as np
import pytest
from attn_testing import (
    HALF_FEATURE_GPU_SHAPES,
    HALF_FORWARD_FEATURE_CASES,
    assert_error_rule,
    assert_half_feature_keeps_bits,
    assert_same_bits,
    half_inputs,
    run_half_forward,
    to_host,
    torch_attention,
)
from numba import cuda

torch = pytest.importorskip("torch")

DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]


def _run(th, causal, p, seed, bs, ftz, softmax_scale=None):
    """The half forward at kernel level with ``EX2_FTZ`` = ``ftz``: (O as half words, L, m, l) as NumPy."""
    host, planned = run_half_forward(th, causal, p, seed, bs, {"EX2_FTZ": ftz}, softmax_scale)
    assert planned["EX2_FTZ"] is ftz
    return host


def test_exp2_flushes_only_subnormal_results():
    sim = _backend.is_simulator()
    ftz, plain = ptx.make_exp2(True, sim), ptx.make_exp2(False, sim)

    @cuda.jit
    def run(x, out_ftz, out_plain):
        i = cuda.threadIdx.x
        if i < x.size:
            out_ftz[i] = ftz(x[i])
            out_plain[i] = plain(x[i])

    x = np.array([0.0, -1.0, 3.5, -20.25, -126.0, -126.5, -140.0, -200.0, -np.inf, np.nan], np.float32)
    of, op = np.zeros_like(x), np.zeros_like(x)
    run[1, 32](x, of, op)
    want = np.exp2(x.astype(np.float64))
    normal = x >= -126
    np.testing.assert_allclose(of[normal], want[normal], rtol=2**-21)
    np.testing.assert_array_equal(of[normal], op[normal])
    assert (of[(x < -126) & np.isfinite(x)] == 0).all() and (op[(x < -126) & (x > -149)] > 0).all()
    assert of[-2] == 0 and op[-2] == 0 and math.isnan(of[-1]) and math.isnan(op[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", HALF_FORWARD_FEATURE_CASES, ids=[c[-1] for c in HALF_FORWARD_FEATURE_CASES])
def test_one_instruction_exp2_gives_the_same_bits(rng, dtype, case):
    b, s_q, s_k, h, h_k, d, causal, p, bs, _ = case
    th = half_inputs(rng, dtype, b, s_q, s_k, h, h_k, d)
    assert_half_feature_keeps_bits(th, causal, p, int(rng.integers(0, 2**32)), bs, "EX2_FTZ")


@pytest.mark.parametrize("dtype", DTYPES)
def test_on_a_sharp_softmax_the_statistics_are_the_same_bits_and_o_follows_the_rule(rng, dtype):
    th = half_inputs(rng, dtype, 1, 33, 40, 2, 2, 32)
    scale = 40.0 / math.sqrt(32)  # scores of standard deviation 40: many 2^(S' - m) below 2^-126
    q, k = (x.double().numpy()[0].transpose(1, 0, 2) for x in th[:2])  # (h, s, d)
    s2 = np.einsum("hid,hjd->hij", q, k) * scale / math.log(2)  # S' = S tau log2 e
    s2 = np.where(np.tril(np.ones(s2.shape[1:], bool), s2.shape[2] - s2.shape[1]), s2, -np.inf)
    assert ((s2 - s2.max(-1, keepdims=True)) < -126).sum() > 100, "the case must have probabilities below 2^-126"
    ftz, plain = (_run(th, True, 0.0, 0, (16, 16), f, softmax_scale=scale) for f in (True, False))
    assert_same_bits(ftz[1:], plain[1:], "EX2_FTZ on and off", names=("L", "m", "l"))
    ref = torch_attention(*(x.double() for x in th), True, 0.0, 0, torch.float64, softmax_scale=scale).numpy()
    naive = torch_attention(*th, True, 0.0, 0, dtype, softmax_scale=scale).double().numpy()
    out = torch.from_numpy(np.ascontiguousarray(ftz[0])).view(dtype).double().numpy()  # O comes as half words
    assert_error_rule(out, ref, naive, what="O")


def _assert_same_grads(on, off, deterministic):
    """dQ, dK, dV bitwise equal; dQ only where its adds have a fixed order (the simulator, or ``deterministic``)."""
    keep = deterministic or _backend.is_simulator()
    assert_same_bits(
        on if keep else on[1:],
        off if keep else off[1:],
        "EX2_FTZ on and off",
        names=("dq", "dk", "dv") if keep else ("dk", "dv"),
    )


def _grads(th, causal, p, seed, bs, ftz, deterministic):
    """The half backward at kernel level (after the default forward) with ``EX2_FTZ`` = ``ftz``: dq, dk, dv as NumPy."""
    q = th[0]
    prob = check_attention_args(*th, p, None, causal, seed)
    alloc = Allocator(q)
    dout = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(q.shape)).astype(np.float32)).to(
        q.device, q.dtype
    )
    kq, kk, kv, kdo = (alloc.to_words(x) for x in (*th, dout))
    fwd = fa2_forward_half.forward(kq, kk, kv, prob, alloc, bs)
    with poison_outputs():
        grads = fa2_backward_half.backward(
            kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, bs, deterministic, features={"EX2_FTZ": ftz}
        )
    return [to_host(g) for g in grads]


#: the forward's cases with atomic dQ adds, and the causal dropout one with the deterministic dQ kernel as well
BWD_CASES = [pytest.param(*c[:-1], False, id=c[-1] + "-atomic-dq") for c in HALF_FORWARD_FEATURE_CASES] + [
    pytest.param(*HALF_FORWARD_FEATURE_CASES[1][:-1], True, id=HALF_FORWARD_FEATURE_CASES[1][-1] + "-deterministic")
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs", "deterministic"), BWD_CASES)
def test_one_instruction_exp2_gives_the_same_gradient_bits(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, deterministic):
    th = half_inputs(rng, torch.bfloat16, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    on, off = (_grads(th, causal, p, seed, bs, f, deterministic) for f in (True, False))
    _assert_same_grads(on, off, deterministic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d", "causal"), HALF_FEATURE_GPU_SHAPES)
def test_one_instruction_exp2_gives_the_same_bits_on_gpu_shapes(rng, dtype, n, d, causal):
    th = half_inputs(rng, dtype, 2, n, n, 4, 2, d, device="cuda")
    assert_half_feature_keeps_bits(th, causal, 0.0, 0, None, "EX2_FTZ")
    for deterministic in (False, True):
        on, off = (_grads(th, causal, 0.0, 0, None, f, deterministic) for f in (True, False))
        _assert_same_grads(on, off, deterministic)
