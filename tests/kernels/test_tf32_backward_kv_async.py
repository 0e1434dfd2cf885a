"""The 3xTF32 backward's two loads of K_j, V_j (:mod:`numba_flash.tensorcore.fa2_backward_tf32`, ``KV_ASYNC``).

FA2 Algorithm 2 line 6 loads ``K_j, V_j`` once per thread block. The register load keeps 64 floats of each per thread
at d = 128, which ptxas puts in local memory: each HBM load is waited for by its spill store, 64 round trips in a row
before the block's first step. ``KV_ASYNC`` copies them by ``cp.async`` in the first step's copy group (with Q_i, dO_i)
and quiets their NaNs after the wait, as the kernel already does for Q_i, dO_i.

Claims checked:

* Both loads give the same gradients: dK, dV bit for bit, and dQ too in the simulator (its blocks run one at a time)
  or with ``deterministic=True``, on ragged (a key block past N_k), causal (key blocks no query sees: no copy is
  issued), GQA, dropout shapes and a head dim whose padded row ends in a chunk past d; with NaNs in K and V.
* ``KV_ASYNC`` is on by default on the ``cp.async`` path above d = 64, never off that path, and K or V rows that are not
  16-byte aligned take the register load while Q and dO keep ``cp.async``.
* On a GPU (marker ``gpu``): the same at realistic shapes and the default tilings (d = 128 among them, where the
  register load spilled).
"""

from __future__ import annotations

from numba_flash.fast import _plan
from numba_flash.tensorcore import fa2_backward_tf32

import numpy as np
import pytest
from attn_testing import assert_same_bits, make_qkv, run_tf32_backward, unaligned_copy


def _grads(q, k, v, dout, causal, p, seed, bs, kv_async, deterministic=False, config=None, words=None):
    return run_tf32_backward(
        q, k, v, dout, causal, p, seed, bs, {"CP_ASYNC": True, "KV_ASYNC": kv_async}, deterministic, config, words
    )


GRADS = ("dq", "dk", "dv")
CASES = [
    pytest.param(1, 19, 21, 2, 1, 16, False, 0.0, (16, 16), False, id="ragged-gqa-d16"),
    pytest.param(1, 21, 20, 1, 1, 20, True, 0.15, (16, 16), False, id="causal-dropout-d20-padded-chunk"),
    pytest.param(1, 13, 40, 1, 1, 8, True, 0.0, (16, 16), True, id="deterministic-causal-sq<sk-unseen-key-blocks-d8"),
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs", "det"), CASES)
def test_k_and_v_by_cp_async_give_the_register_loads_gradients_bit_for_bit(
    rng, b, s_q, s_k, h, h_k, d, causal, p, bs, det
):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    seed = int(rng.integers(0, 2**32))
    (a_grads, a_feats), (r_grads, r_feats) = (
        _grads(q, k, v, dout, causal, p, seed, bs, kv, det) for kv in (True, False)
    )
    assert a_feats["KV_ASYNC"] and not r_feats["KV_ASYNC"]
    assert_same_bits(a_grads, r_grads, "K_j, V_j by cp.async and by registers", GRADS)


def test_nans_in_k_and_v_give_the_register_loads_nans(rng):
    q, k, v = make_qkv(rng, 1, 12, 13, 1, 1, 8)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    k[0, 5, 0, 3] = np.float32(np.nan)
    v[0, 11, 0, 6] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN
    (a_grads, _), (r_grads, _) = (_grads(q, k, v, dout, False, 0.0, 0, (16, 16), kv) for kv in (True, False))
    assert_same_bits(a_grads, r_grads, "K_j, V_j by cp.async and by registers", GRADS)
    assert np.isnan(a_grads[0]).all(), "a NaN score reaches every dQ row"


def test_kv_async_is_the_default_on_the_cp_async_path_and_unaligned_k_v_take_the_register_load(rng):
    assert fa2_backward_tf32.default_features()["KV_ASYNC"] is None
    # None: above d = 64 (H100: 1.01-1.14x at d = 128; 0.96-1.005x at d = 64, where the register load had no spill)
    assert [fa2_backward_tf32.kv_async_for(DP, True) for DP in (64, 72, 128)] == [False, True, True]
    assert not fa2_backward_tf32.kv_async_for(128, False) and not fa2_backward_tf32.kv_async_for(128, False, True)
    assert fa2_backward_tf32.kv_async_for(64, True, True) and not fa2_backward_tf32.kv_async_for(128, True, False)
    # features_for resolves it where CP_ASYNC is, so backward() reads K and V's alignment only where it would run
    assert (
        not fa2_backward_tf32.features_for(64)["KV_ASYNC"]
        and fa2_backward_tf32.features_for(128, None, True)["KV_ASYNC"]
    )
    assert not fa2_backward_tf32.features_for(128, {"WIDE": False}, True)["KV_ASYNC"], "no cp.async path: no KV_ASYNC"
    with pytest.raises(ValueError, match="KV_ASYNC needs CP_ASYNC"):
        fa2_backward_tf32.fa2_backward_tf32_kernel(1, 1, 16, 8, False, False, True, True, KV_ASYNC=True)
    q, k, v = make_qkv(rng, 1, 12, 12, 1, 1, 8)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    sk, sv = unaligned_copy(k), unaligned_copy(v)
    assert not _plan.aligned16(sk) and not _plan.aligned16(sv)
    shifted, feats = _grads(q, k, v, dout, False, 0.0, 0, (16, 16), True, words={"k": sk, "v": sv})
    assert feats["KV_ASYNC"] is False and feats["CP_ASYNC"], "unaligned K, V: register load; Q, dO by cp.async"
    aligned, aligned_feats = _grads(q, k, v, dout, False, 0.0, 0, (16, 16), True)
    assert aligned_feats["KV_ASYNC"] is True, "aligned: cp.async as asked"
    assert_same_bits(shifted, aligned, "K_j, V_j by registers (unaligned) and by cp.async", GRADS)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "d", "causal", "det"),
    [
        (1000, 128, False, False),
        (1000, 128, True, True),
        (777, 96, True, False),
        (1000, 64, True, False),
        (2048, 64, False, True),
    ],
)
def test_k_and_v_by_cp_async_give_the_register_loads_gradients_on_gpu_shapes(rng, n, d, causal, det):
    """dK, dV bit for bit (dQ too with ``deterministic``: atomic adds land in any order), the default tilings."""
    q, k, v = make_qkv(rng, 2, n, n, 4, 2, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    (a_grads, a_feats), (r_grads, _) = (_grads(q, k, v, dout, causal, 0.0, 7, None, kv, det) for kv in (True, False))
    assert a_feats["KV_ASYNC"]
    first = 0 if det else 1
    assert_same_bits(a_grads[first:], r_grads[first:], "K_j, V_j by cp.async and by registers", GRADS[first:])
