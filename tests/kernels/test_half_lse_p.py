"""The half backward's ``P`` from the logsumexp alone (``LSE_P`` of :mod:`numba_flash.tensorcore.fa2_backward_half`).

With ``LSE_P`` the backward recomputes ``P = 2^(S tau log2 e - L log2 e)`` with one FFMA and one exponential per
element (the kernels' ``FROM_LSE`` path, as flash-attn does), instead of ``2^(S tau log2 e - M) / l`` from the
forward's ``m`` and ``l``. The two round differently, so the claim is flash-attn's rule, not equal bits.

Claims checked:

* With ``LSE_P`` on, dQ, dK, dV (atomic dQ adds, and the deterministic dQ kernel) are within 3x the error of naive
  attention's autograd in the same half dtype, against float64, on ragged, GQA, causal, dropout and ``MW = 2``
  shapes, and on a causal shape with ``s_q > s_k`` whose first rows see no key (without the ``1/l = 0`` factor
  their ``P`` is zeroed by the causal mask; rows past ``N_q`` meet zero ``dO`` rows).
* The feature is what the plan used: the main kernel compiled with ``FROM_LSE`` where it is on, not where it is off.
* On a GPU (marker ``gpu``): the same at realistic shapes.
"""

from __future__ import annotations

from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.tensorcore import fa2_backward_half, fa2_forward_half

import numpy as np
import pytest
from attn_testing import (
    HALF_FEATURE_GPU_SHAPES,
    HALF_FORWARD_FEATURE_CASES,
    assert_error_rule,
    half_inputs,
    to_host,
    torch_attention_grads,
)

torch = pytest.importorskip("torch")

CASES = [pytest.param(*c[:-1], False, id=c[-1] + "-atomic-dq") for c in HALF_FORWARD_FEATURE_CASES] + [
    pytest.param(*HALF_FORWARD_FEATURE_CASES[1][:-1], True, id=HALF_FORWARD_FEATURE_CASES[1][-1] + "-deterministic"),
    pytest.param(1, 40, 24, 2, 1, 32, True, 0.0, (16, 16), False, id="causal-rows-without-keys-atomic-dq"),
]


def _grads(th, dout, causal, p, seed, bs, deterministic, lse_p):
    """The half backward at kernel level (after the default forward) with ``LSE_P`` = ``lse_p``: dq, dk, dv as
    float64."""
    prob = check_attention_args(*th, p, None, causal, seed)
    alloc = Allocator(th[0])
    kq, kk, kv, kdo = (alloc.to_words(x) for x in (*th, dout))
    fwd = fa2_forward_half.forward(kq, kk, kv, prob, alloc, bs)
    with poison_outputs():
        grads = fa2_backward_half.backward(
            kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, bs, deterministic, features={"LSE_P": lse_p}
        )
    dtype = th[0].dtype
    out = []
    for g in grads:
        host = to_host(g)
        out.append(
            torch.from_numpy(np.ascontiguousarray(host)).view(dtype).double().numpy()
            if host.dtype == np.int32
            else host.astype(np.float64)
        )
    return out


def _check(th, causal, p, seed, bs, deterministic):
    dtype = th[0].dtype
    dout = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(th[0].shape)).astype(np.float32)).to(
        th[0].device, dtype
    )
    got = _grads(th, dout, causal, p, seed, bs, deterministic, True)
    ref = torch_attention_grads(th, dout, causal, p, seed, torch.float64)
    naive = torch_attention_grads(th, dout, causal, p, seed, dtype)
    for name, g, r, n in zip(("dQ", "dK", "dV"), got, ref, naive):
        assert_error_rule(g.reshape(r.shape), r, n, mult=3.0, what=name)


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs", "deterministic"), CASES)
def test_p_from_the_logsumexp_keeps_the_gradients_within_the_rule(
    rng, b, s_q, s_k, h, h_k, d, causal, p, bs, deterministic
):
    th = half_inputs(rng, torch.bfloat16, b, s_q, s_k, h, h_k, d)
    _check(th, causal, p, int(rng.integers(0, 2**32)), bs, deterministic)


def test_the_plan_compiles_the_logsumexp_path_only_where_the_feature_is_on(monkeypatch):
    seen = []
    real = fa2_backward_half.plan
    monkeypatch.setattr(fa2_backward_half, "plan", lambda *a, **kw: seen.append(a[-1]) or real(*a, **kw))
    th = half_inputs(np.random.default_rng(0), torch.bfloat16, 1, 16, 16, 1, 1, 16)
    dout = torch.ones_like(th[0])
    for lse_p in (True, False):
        _grads(th, dout, False, 0.0, 0, (16, 16), False, lse_p)
    assert seen == [True, False]  # plan's from_lse: the forward's m, l were given both times


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d", "causal"), HALF_FEATURE_GPU_SHAPES)
def test_p_from_the_logsumexp_on_gpu_shapes(rng, n, d, causal):
    th = half_inputs(rng, torch.bfloat16, 2, n, n, 4, 2, d, device="cuda")
    for deterministic in (False, True):
        _check(th, causal, 0.0, 0, None, deterministic)
