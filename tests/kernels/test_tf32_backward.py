"""The 3xTF32 FA2 backward (:mod:`numba_flash.tensorcore.fa2_backward_tf32`), the float32 backward of
``variant="tensorcore"``.

Claims checked (flash-attn's rule: every gradient within 3x the error of float32 naive attention's
autograd, both against float64):

* After the 3xTF32 forward, the 3xTF32 backward's gradients follow the rule at every tiling the kernel
  can take: one or several warps, ``MW = 2`` key tiles per warp, a dQ tile split over warps by columns
  (``DSPLIT > 1``) or several query tiles per warp (``QPW > 1``), on ragged ``N``, odd head dims, causal
  masks with rows that see no key, GQA and dropout; with atomic dQ and with the deterministic dQ kernel,
  whose dK, dV are bitwise those of the atomic mode (the same main kernel).
* The tensor-core backward module picks the 3xTF32 kernel for float32 arrays up to d = 128 (and for half
  inputs the half kernel does not run), the half kernel for half words, the FFMA kernel above d = 128.
* The pair's sharp-softmax and scores-near--200 cases follow the rule (``tests/test_edge_values.py``: they
  were strict xfails while the FFMA backward followed the 3xTF32 forward); the GPU shapes, races and
  reproducibility are the ``tensorcore`` rows of ``tests/kernels/test_fa2_kernels.py``.

Simulator shapes stay tiny (N <= 40, d <= 24): each ``mma`` there is a lane exchange with two block barriers.
"""

from __future__ import annotations

from numba_flash import api, registry
from numba_flash._launch import poison_outputs
from numba_flash.tensorcore import fa2_backward_half, fa2_backward_tf32
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, naive_attention_backward_float32

#: (config (NW, MW, BR), b, s_q, s_k, h, h_k, d, causal, dropout_p): each tiling on a shape that exercises it.
TILINGS = [
    pytest.param((1, 1, 16), 1, 37, 29, 1, 1, 5, False, 0.0, id="1warp-ragged-odd-d5"),
    pytest.param((2, 1, 16), 1, 19, 40, 2, 1, 12, True, 0.0, id="dsplit2-causal-sq<sk-gqa-d12"),
    pytest.param((1, 2, 32), 1, 33, 14, 2, 2, 24, True, 0.2, id="mw2-qpw2-causal-sq>sk-dropout-d24"),
    pytest.param((2, 1, 32), 2, 21, 18, 1, 1, 16, False, 0.1, id="2warps-qpw1-dropout-b2-d16"),
    pytest.param((2, 1, 64), 1, 70, 45, 1, 1, 8, False, 0.0, id="2warps-qpw2-d8"),  # a warp's dQ tiles 32 rows apart
]


def _grads(rng, monkeypatch, config, b, s_q, s_k, h, h_k, d, causal, p, deterministic):
    """(grads, ref, naive) of the tensorcore pair at tiling ``config`` of the backward's main kernel."""
    monkeypatch.setattr(
        fa2_backward_tf32, "config_for", lambda d_, bs=None, causal=False: (*config, 8 * ((d_ + 7) // 8))
    )
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    seed = int(rng.integers(0, 2**32))
    out, stats = api.attention_numpy(
        q,
        k,
        v,
        p,
        None,
        causal,
        algorithm="flash2",
        variant="tensorcore",
        block_sizes=(16, 16),
        seed=seed,
        return_stats=True,
    )
    names = [
        kl.name
        for kl in registry.resolve("flash2", "backward", "tensorcore", stats.problem).module.compiled_kernels(
            stats.problem, stats.block_sizes, deterministic
        )
    ]
    assert all("3xTF32" in n for n in names), names
    with poison_outputs():
        grads = api.attention_backward_numpy(dout, q, k, v, out, stats, deterministic=deterministic)
    ref = standard_backward(dout, q, k, v, causal=causal, dropout_p=p, seed=seed)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=causal, dropout_p=p, seed=seed)
    return grads, ref, naive


@pytest.mark.parametrize(("config", "b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), TILINGS)
def test_tf32_backward_gives_gradients_within_3x_float32_error_at_every_tiling(
    rng, monkeypatch, config, b, s_q, s_k, h, h_k, d, causal, p
):
    grads, ref, naive = _grads(rng, monkeypatch, config, b, s_q, s_k, h, h_k, d, causal, p, False)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert_error_rule(g, r, n, mult=3, what=f"{name} at tiling {config}")


#: The deterministic dQ kernel has the forward's geometry whatever the main kernel's tiling, so one case covers it:
#: the dQ split of TILINGS[1] with dropout added (the dQ kernel redraws the mask), GQA, causal with s_q < s_k.
DETERMINISTIC = [pytest.param((2, 1, 16), 1, 19, 40, 2, 1, 12, True, 0.1, id="dsplit2-causal-sq<sk-gqa-dropout-d12")]


@pytest.mark.parametrize(("config", "b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), DETERMINISTIC)
def test_deterministic_tf32_backward_is_within_3x_and_shares_dk_dv_with_the_atomic_one(
    rng, monkeypatch, config, b, s_q, s_k, h, h_k, d, causal, p
):
    state = rng.bit_generator.state
    det, ref, naive = _grads(rng, monkeypatch, config, b, s_q, s_k, h, h_k, d, causal, p, True)
    for name, g, r, n in zip(("dq", "dk", "dv"), det, ref, naive):
        assert_error_rule(g, r, n, mult=3, what=f"{name} (deterministic) at tiling {config}")
    rng.bit_generator.state = state  # the same inputs, seed and dout again
    atomic, _, _ = _grads(rng, monkeypatch, config, b, s_q, s_k, h, h_k, d, causal, p, False)
    np.testing.assert_array_equal(det[1], atomic[1], err_msg="dK comes from the same main kernel in both modes")
    np.testing.assert_array_equal(det[2], atomic[2], err_msg="dV comes from the same main kernel in both modes")


def test_tensorcore_backward_runs_3xtf32_on_float32_arrays_and_the_half_kernel_on_half_words():
    # (dtype, d, the kernel that must run): half words -> the half kernel; float32 arrays (float32 inputs, an odd
    # half head dim) -> 3xTF32 up to d = 128; above it the FFMA kernel, as the tensor-core forward does
    for dt, d, want in (
        (np.float16, 16, "float16"),
        (np.float16, 7, "3xTF32"),
        (np.float32, 16, "3xTF32"),
        (np.float32, 128, "3xTF32"),
        (np.float32, 136, "fast"),
    ):
        prob = api.check_attention_args(*(np.zeros((1, 20, 1, d), dt),) * 3)
        names = [
            k.name
            for k in registry.resolve("flash2", "backward", "tensorcore", prob).module.compiled_kernels(prob, (16, 16))
        ]
        assert all(want in n for n in names), (dt, d, names)


@pytest.mark.parametrize(
    ("module", "dtype", "switch"),
    [
        (fa2_backward_tf32, np.float32, "PREFETCH"),
        (fa2_backward_half, np.float16, "HEAVY_FIRST"),
        (fa2_backward_tf32, np.float32, "PREFTECH"),
    ],
    ids=["tf32", "half", "typo"],
)
def test_tensorcore_backward_plans_reject_an_unknown_switch_by_name(module, dtype, switch):
    # a removed switch (PREFETCH of the 3xTF32 backward, HEAVY_FIRST of the half one) or a misspelt one must not run
    # the defaults silently: the plan names it before it compiles anything
    prob = api.check_attention_args(*(np.zeros((1, 20, 1, 16), dtype),) * 3)
    with pytest.raises(ValueError, match=f"unknown switch.*'{switch}'"):
        module.plan(prob, (16, 16), None, {switch: True})


def test_tf32_backward_rejects_tilings_that_cannot_split_dq():
    # Br = 16 is one query tile; d = 5 pads to one n8 column tile: two warps have nothing to split
    assert fa2_backward_tf32.dq_split(2, 16, 8) is None
    with pytest.raises(ValueError, match="cannot split dQ"):
        fa2_backward_tf32.fa2_backward_tf32_kernel(2, 1, 16, 8, False, False, True, True)
