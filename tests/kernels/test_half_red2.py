"""The half backward's dQ atomics: two columns per instruction (``RED2``, ``red.global.add.v2.f32``) or one.

``RED2`` is sm_90's vector reduction, so the claims run on a GPU only (marker ``gpu``); the simulator adds one float
at a time whatever the feature says.

Claims checked:

* On compute capability 9.0 the plan turns ``RED2`` on by default, causal included (before bfef7ac it left causal
  d > 64 on the scalar adds, a choice measured before ``LSE_P``).
* Both forms give dK and dV bit for bit (neither touches them) and dQ within flash-attn's 3x rule against naive
  attention in the same half dtype, on ragged, causal, GQA shapes at d = 64, 96 and 128.
"""

from __future__ import annotations

from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_backward_half, fa2_forward_half

import numpy as np
import pytest
from attn_testing import assert_error_rule, half_inputs, randn_like, to_host, torch_attention_grads

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _grads(th, dout, causal, red2):
    """The half backward at kernel level with ``RED2`` = ``red2``: (dq float32, dk, dv half) as torch tensors."""
    prob = check_attention_args(*th, 0.0, None, causal, 0)
    alloc = Allocator(th[0])
    kq, kk, kv, kdo = (alloc.to_words(x) for x in (*th, dout))
    fwd = fa2_forward_half.forward(kq, kk, kv, prob, alloc)
    with poison_outputs():
        dq, dk, dv = fa2_backward_half.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, features={"RED2": red2})
    return dq, dk, dv


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_the_plan_turns_red2_on_by_default_on_sm90(causal):
    if _backend.device_facts().compute_capability < (9, 0):
        pytest.skip("red.global.add.v2.f32 needs compute capability 9.0")
    th = half_inputs(np.random.default_rng(0), torch.bfloat16, 1, 64, 64, 2, 2, 128, device="cuda")
    prob = check_attention_args(*th, 0.0, None, causal, 0)
    main = fa2_backward_half.plan(prob)[0]  # the kernel factory is cached: the same kernel object for the same options
    on = fa2_backward_half.plan(prob, features={"RED2": True})[0]
    off = fa2_backward_half.plan(prob, features={"RED2": False})[0]
    assert main is on and main is not off


@pytest.mark.parametrize(
    ("b", "n", "h", "h_k", "d", "causal"),
    [(2, 1000, 4, 2, 128, True), (2, 777, 4, 4, 96, True), (2, 1000, 4, 2, 64, True), (1, 1024, 4, 4, 128, False)],
)
def test_vector_and_scalar_dq_atomics_give_the_same_dk_dv_and_dq_within_the_rule(rng, b, n, h, h_k, d, causal):
    if _backend.device_facts().compute_capability < (9, 0):
        pytest.skip("red.global.add.v2.f32 needs compute capability 9.0")
    th = half_inputs(rng, torch.bfloat16, b, n, n, h, h_k, d, device="cuda")
    dout = randn_like(rng, th[0])
    vec, sca = (_grads(th, dout, causal, red2) for red2 in (True, False))
    for name, a, s in zip(("dk", "dv"), vec[1:], sca[1:]):
        assert torch.equal(a, s), f"{name}: RED2 changed a gradient it does not touch"
    ref = torch_attention_grads(th, dout, causal, 0.0, 0, torch.float64)
    naive = torch_attention_grads(th, dout, causal, 0.0, 0, torch.bfloat16)
    for which, g in (("RED2", vec[0]), ("scalar", sca[0])):
        assert_error_rule(
            to_host(g).astype(np.float64).reshape(ref[0].shape), ref[0], naive[0], mult=3.0, what=f"dQ ({which})"
        )
