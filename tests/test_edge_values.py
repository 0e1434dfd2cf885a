"""Edge values a careful reviewer tries on every kernel: every registered (algorithm, pass, variant).

Random inputs of size 1 are kind to attention kernels: every row has a positive score, scores are
small, every row sees several keys. These cases are not, and each one is the only test that catches
a classic bug of the gallery (``python -m numba_flash bugs``):

* **every score near -200** (``q . k = -200 + N(0, 7)``, scale 1): exp of a score underflows in
  float32, so only a kernel that subtracts the true row max gets a non-zero l (catches a running max
  initialised to 0 and an exp without the max);
* **a sharp softmax** (scores with standard deviation 16): nearly one-hot rows;
* **one key** (``s_k = 1``): P = 1, so O = V and dQ = dK = 0;
* **rows that see no key** (causal, ``s_q > s_k``): O = 0, L = +inf, dQ = 0, nothing NaN;
* **GQA with several K/V heads** (``h = 4`` on ``h_k = 2``): the only grouping in which mapping a
  query head to its K/V head by ``h % h_k`` instead of ``h // G`` differs (MHA and MQA agree);
* **a NaN or an inf in one query row**: that row of O (and of dQ) is NaN, as in the float64
  reference; no other row is touched.

Every value is checked against the float64 oracle with the error rule (2x the float32 baseline's error
for outputs, 3x for gradients, :mod:`attn_testing`), outputs NaN-poisoned before the launch. Known
defects that another change fixes are ``xfail(strict=True)`` with the issue they come from, so the
marker fails the suite as soon as the fix lands and must then be removed.
"""

from __future__ import annotations

from numba_flash import api, registry
from numba_flash._launch import poison_outputs
from numba_flash.runtime import backend as _backend
from numba_flash.runtime.simulator import one_thread_at_a_time
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    assert_stats_rule,
    naive_attention_backward_float32,
    naive_attention_float32,
    naive_stats_float32,
)

FORWARD = [k for k in registry.entries() if k.pass_ == "forward"]
BACKWARD = [k for k in registry.entries() if k.pass_ == "backward"]
TILES = (8, 8)
ISSUE = "issue 'A test suite that catches what students get wrong'"


def _id(k):
    return f"{k.algorithm}-{k.variant}"


@pytest.fixture(autouse=True)
def _sequential_schedule():
    """In the simulator, run the kernels one thread at a time between barriers (a schedule a GPU may
    pick; :func:`numba_flash.runtime.simulator.one_thread_at_a_time`): deterministic, and 2-10x faster than the
    simulator's own schedule."""
    if _backend.is_simulator():
        with one_thread_at_a_time():
            yield
    else:
        yield


def _params(kernels, xfail=None, gpu_xfail=None):
    """One param per kernel; ``xfail`` maps an id to the reason of a strict xfail, ``gpu_xfail`` to one on a GPU
    only."""
    xfail, gpu_xfail = xfail or {}, gpu_xfail or {}
    on_gpu = not _backend.is_simulator()

    def marks(i):
        return ([pytest.mark.xfail(strict=True, reason=xfail[i])] if i in xfail else []) + (
            [pytest.mark.xfail(condition=on_gpu, strict=True, reason=gpu_xfail[i])] if i in gpu_xfail else []
        )

    return [pytest.param(k, id=_id(k), marks=marks(_id(k))) for k in kernels]


#: Found on an H100 at these tiny shapes (the simulator passes them, and the real-shape GPU tests pass): the
#: rule's float32 baseline is small on one-hot rows, and the GPU's fused multiply-adds and expf round otherwise.
#: Three earlier entries here (the fast FA2 forward's O, the readable FA1 backward's dV and the float32 tensor-core
#: pair's dV, 1.26-1.7x over) were measured against the BLAS baseline; since the baseline is float32 attention
#: computed in one fixed order (attn_testing.matmul32, 2026-11-25) all three pass on an H100 (XPASS(strict) at
#: b7c3ad5, docs/results/gpu_runs/gpu_suite_h100_b7c3ad5.log, last in the tree at e0e5a9b) and this one, which passed,
#: is over.
SHARP_FWD_L_GPU_XFAIL = (
    "found on an H100 (2026-11-25, b7c3ad5), not in the simulator: readable FA2 forward l 4.30e-6 against "
    "a bound of 3.43e-6 (1.25x; float32 baseline 1.26e-6, floor 9.2e-7) at score std 16"
)


def run_forward(kernel, q, k, v, **opts):
    with poison_outputs():
        out, stats = api.attention_numpy(
            q, k, v, algorithm=kernel.algorithm, variant=kernel.variant, block_sizes=TILES, return_stats=True, **opts
        )
    assert stats.forward.variant == kernel.variant
    return out, stats


def run_backward(kernel, dout, q, k, v, **opts):
    """Forward of the same variant, then the backward kernel under test (outputs NaN-poisoned)."""
    out, stats = api.attention_numpy(
        q, k, v, algorithm=kernel.algorithm, variant=kernel.variant, block_sizes=TILES, return_stats=True, **opts
    )
    assert stats.backward.variant == kernel.variant
    with poison_outputs():
        return api.attention_backward_numpy(dout, q, k, v, out, stats)


def check_forward(out, stats, q, k, v, what, **opts):
    """O and L against the float64 oracle by the error rule (L: +inf exactly where the oracle's is)."""
    ref = standard_attention(q, k, v, **opts)
    assert_error_rule(out, ref.O, naive_attention_float32(q, k, v, **opts), what=f"O ({what})")
    m, l, L = naive_stats_float32(q, k, opts.get("softmax_scale"), opts.get("causal", False))
    inf = np.isinf(ref.L)
    np.testing.assert_array_equal(np.asarray(stats.lse)[inf], ref.L[inf], err_msg=f"L ({what}): infinities differ")
    assert_error_rule(np.asarray(stats.lse, np.float64)[~inf], ref.L[~inf], L[~inf], what=f"L ({what})")
    if stats.forward.variant == "readable":  # m and l in natural units, as the paper defines them
        assert_stats_rule(stats.m, stats.l, stats.lse, ref, (m, l, L))
    else:
        # The fast and tensor-core forwards save l relative to the base-2 max m log2 e that their backward forms
        # (make_natural_stats); whether that product is rounded first depends on the GPU compiler fusing it
        # into an FMA, so l is checked through the backward (the sharp and -200 backward tests), m here.
        inf = np.isinf(ref.m)
        np.testing.assert_array_equal(np.asarray(stats.m)[inf], ref.m[inf], err_msg=f"m ({what}): infinities differ")
        assert_error_rule(np.asarray(stats.m, np.float64)[~inf], ref.m[~inf], m[~inf], what=f"m ({what})")


def check_backward(grads, dout, q, k, v, what, **opts):
    ref = standard_backward(dout, q, k, v, **opts)
    naive = naive_attention_backward_float32(dout, q, k, v, **opts)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert_error_rule(g, r, n, mult=3, what=f"{name} ({what})")


def randn(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# Every score near -200
# ------------------------------------------------------------------------------------------------
def very_negative_scores(rng, s_q=13, s_k=19, h=2, d=8):
    """q . k = 10 * (-20) + (7 random products) = -200 + N(0, 7) for every pair; use softmax_scale=1."""
    q, k, v = randn(rng, 1, s_q, h, d), randn(rng, 1, s_k, h, d), randn(rng, 1, s_k, h, d)
    q[..., 0], k[..., 0] = 10.0, -20.0
    return q, k, v


@pytest.mark.parametrize("kernel", _params(FORWARD))
def test_forward_with_every_score_near_minus_200_follows_the_error_rule(rng, kernel):
    q, k, v = very_negative_scores(rng)
    assert (standard_attention(q, k, v, softmax_scale=1.0, return_matrices=True).S < -150).all()
    out, stats = run_forward(kernel, q, k, v, softmax_scale=1.0)
    check_forward(out, stats, q, k, v, _id(kernel), softmax_scale=1.0)


#: Found by this test (not in the issue): the fast FA1 forward folded tau log2(e) into Q and saved L from base-2
#: scores while its backward recomputed S in base e; at |S| ~ 200 the two roundings differ by ~|S| eps32 ~ 2e-5,
#: and dQ picked up 80x the allowed error. #14's fix (m, l saved apart, S recomputed in base 2 as the forward
#: formed it) brought it to 1.08x of the bound on dV; the rest is not explained yet. The readable pairs pass.
MINUS_200_BWD_XFAIL = (
    "found by this test (not in the issue): the fast FA1 backward at S ~ -200; dq was 80x over the 3x "
    "rule before the m, l fix of #14, dV is now 3.4e-5 against a bound of 3.2e-5 (1.08x)"
)


#: The float32 tensor-core pair (3xTF32 forward, 3xTF32 backward :mod:`numba_flash.tensorcore.fa2_backward_tf32`) with
#: one key: P = 1, so dS = dP - D must cancel to zero. D = rowsum(dO o O) comes from the forward's O, which 3xTF32 gives
#: as V to ~2^-23 (the split of V drops its last bits), and dP = dO V^T is a 3xTF32 product; the float32 baseline
#: forms D from P o dP and cancels exactly, so the rule's bound is its ulp floor. Measured in the simulator: dq
#: 5.2e-7 against a floor of 4.8e-7 (1.09x). flash-attn forms D the same way (its half kernels have the same
#: non-zero here); the FFMA pair cancels exactly because its O is V and its dP and D are the same FFMA sums.
TC_FP32_ONE_KEY_XFAIL = (
    "float32 variant='tensorcore' with one key: D = rowsum(dO o O) from the 3xTF32 forward's O and "
    "the 3xTF32 dP do not cancel to the float32 ulp floor (dq 5.2e-7 vs 4.8e-7 in the simulator)"
)


@pytest.mark.parametrize("kernel", _params(BACKWARD, {"flash1-fast": MINUS_200_BWD_XFAIL}))
def test_backward_with_every_score_near_minus_200_follows_the_error_rule(rng, kernel):
    q, k, v = very_negative_scores(rng)
    dout = randn(rng, *q.shape)
    check_backward(
        run_backward(kernel, dout, q, k, v, softmax_scale=1.0), dout, q, k, v, _id(kernel), softmax_scale=1.0
    )


# ------------------------------------------------------------------------------------------------
# A sharp softmax: scores with standard deviation 16
# ------------------------------------------------------------------------------------------------
SHARP = dict(softmax_scale=16.0 / np.sqrt(8))  # q . k ~ N(0, d = 8): tau q . k ~ N(0, 16^2)
#: The fast FA1 / FA2 backwards exceeded the 3x gradient rule here (dV 15x and 3.8x; the issue's dK 3.4-4.2x,
#: dV 3.8-5.7x) until they kept m and l apart and recomputed S as their forward did (docs/backward.rst).


@pytest.mark.parametrize("kernel", _params(FORWARD, gpu_xfail={"flash2-readable": SHARP_FWD_L_GPU_XFAIL}))
def test_forward_with_a_sharp_softmax_follows_the_error_rule(rng, kernel):
    q, k, v = (randn(rng, 1, n, 2, 8) for n in (17, 21, 21))
    out, stats = run_forward(kernel, q, k, v, causal=True, **SHARP)
    check_forward(out, stats, q, k, v, _id(kernel), causal=True, **SHARP)


@pytest.mark.parametrize("kernel", _params(BACKWARD))
def test_backward_with_a_sharp_softmax_follows_the_error_rule(rng, kernel):
    q, k, v = (randn(rng, 1, n, 2, 8) for n in (17, 21, 21))
    dout = randn(rng, *q.shape)
    grads = run_backward(kernel, dout, q, k, v, causal=True, **SHARP)
    check_backward(grads, dout, q, k, v, _id(kernel), causal=True, **SHARP)


# ------------------------------------------------------------------------------------------------
# One key
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", _params(FORWARD))
def test_forward_with_one_key_returns_its_value_in_every_row(rng, kernel):
    q, k, v = randn(rng, 1, 11, 2, 8), randn(rng, 1, 1, 2, 8), randn(rng, 1, 1, 2, 8)
    out, stats = run_forward(kernel, q, k, v)
    check_forward(out, stats, q, k, v, _id(kernel))
    assert_error_rule(out, np.broadcast_to(v, out.shape), np.broadcast_to(v, out.shape), what="O = v")


@pytest.mark.parametrize("kernel", _params(BACKWARD, {"flash2-tensorcore": TC_FP32_ONE_KEY_XFAIL}))
def test_backward_with_one_key_gives_zero_score_gradients(rng, kernel):
    q, k, v = randn(rng, 1, 11, 2, 8), randn(rng, 1, 1, 2, 8), randn(rng, 1, 1, 2, 8)
    dout = randn(rng, *q.shape)
    dq, dk, dv = run_backward(kernel, dout, q, k, v)
    check_backward((dq, dk, dv), dout, q, k, v, _id(kernel))
    assert_error_rule(dv, dout.sum(axis=1, keepdims=True), dout.sum(axis=1, keepdims=True), what="dV = sum of dO")


# ------------------------------------------------------------------------------------------------
# Rows that see no key
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", _params(FORWARD))
def test_forward_rows_that_see_no_key_give_zero_output_and_infinite_lse(rng, kernel):
    q, k, v = randn(rng, 1, 13, 2, 8), randn(rng, 1, 5, 2, 8), randn(rng, 1, 5, 2, 8)
    out, stats = run_forward(kernel, q, k, v, causal=True)
    empty = 13 - 5  # bottom-right causal: the first s_q - s_k rows see no key
    assert np.all(out[:, :empty] == 0.0) and np.all(np.isposinf(stats.lse[:, :, :empty]))
    check_forward(out, stats, q, k, v, _id(kernel), causal=True)


@pytest.mark.parametrize("kernel", _params(BACKWARD))
def test_backward_rows_that_see_no_key_get_zero_dq_and_no_nan(rng, kernel):
    q, k, v = randn(rng, 1, 13, 2, 8), randn(rng, 1, 5, 2, 8), randn(rng, 1, 5, 2, 8)
    dout = randn(rng, *q.shape)
    dq, dk, dv = run_backward(kernel, dout, q, k, v, causal=True)
    assert np.all(dq[:, : 13 - 5] == 0.0)
    check_backward((dq, dk, dv), dout, q, k, v, _id(kernel), causal=True)


# ------------------------------------------------------------------------------------------------
# GQA with several K/V heads
# ------------------------------------------------------------------------------------------------
GQA = (1, 13, 11, 4, 2, 8)  # h = 4 query heads on h_k = 2 K/V heads: heads 0, 1 -> 0 and 2, 3 -> 1


def gqa_inputs(rng):
    b, s_q, s_k, h, h_k, d = GQA
    return randn(rng, b, s_q, h, d), randn(rng, b, s_k, h_k, d), randn(rng, b, s_k, h_k, d)


@pytest.mark.parametrize("kernel", _params(FORWARD))
def test_forward_gqa_with_several_kv_heads_reads_each_groups_head(rng, kernel):
    q, k, v = gqa_inputs(rng)
    out, stats = run_forward(kernel, q, k, v)
    check_forward(out, stats, q, k, v, _id(kernel))


@pytest.mark.parametrize("kernel", _params(BACKWARD))
def test_backward_gqa_with_several_kv_heads_sums_each_group_into_its_head(rng, kernel):
    q, k, v = gqa_inputs(rng)
    dout = randn(rng, *q.shape)
    check_backward(run_backward(kernel, dout, q, k, v), dout, q, k, v, _id(kernel))


# ------------------------------------------------------------------------------------------------
# NaN or inf in one query row
# ------------------------------------------------------------------------------------------------
NAN_ROW = (0, 3, 1)  # (batch, query row, head)
#: The standard path and the readable FA1 forward returned 0, not NaN, for such rows (the issue; this test found
#: the FA1 case): max() drops a NaN operand, and an l > 0 guard then zeroed the row. Both fixed: NaN propagates.


def poisoned_row_inputs(rng, value):
    q, k, v = randn(rng, 1, 9, 2, 8), randn(rng, 1, 12, 2, 8), randn(rng, 1, 12, 2, 8)
    clean = q.copy()
    b, r, h = NAN_ROW
    q[b, r, h, 0] = value  # one element: every score of the row is NaN (or +-inf)
    return q, clean, k, v


def assert_only_the_poisoned_row_is_nan(got, want, naive, what):
    b, r, h = NAN_ROW
    assert np.all(np.isnan(got[b, r, h])), f"{what}: the row with a {what} input must be NaN, got {got[b, r, h]}"
    rest = np.ones(got.shape, bool)
    rest[b, r, h] = False
    assert_error_rule(got[rest], want[rest], naive[rest], what=f"{what}: the other rows")


#: The tensor-core forward's NaN rows were found on an H100 (the 3xTF32 split turned the GPU's NaN into -0.0);
#: fixed in fast/_tiles.py (QUIET_NAN), so every kernel runs every case on both backends.
NAN_CASES = [
    pytest.param(*p.values, value, id=f"{p.id}-{vid}", marks=p.marks)
    for p in _params(FORWARD)
    for value, vid in ((np.nan, "nan"), (np.inf, "inf"))
]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize(("kernel", "value"), NAN_CASES)
def test_forward_nan_or_inf_in_one_query_row_makes_only_that_row_nan(rng, kernel, value):
    q, clean, k, v = poisoned_row_inputs(rng, value)
    with np.errstate(invalid="ignore"):
        assert np.all(np.isnan(standard_attention(q, k, v).O[NAN_ROW]))  # the float64 oracle's answer
    out, _ = run_forward(kernel, q, k, v)
    assert_only_the_poisoned_row_is_nan(
        out, standard_attention(clean, k, v).O, naive_attention_float32(clean, k, v), f"O {value}"
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("kernel", _params(BACKWARD))
def test_backward_nan_in_one_query_row_makes_that_row_of_dq_and_its_heads_dk_dv_nan(rng, kernel):
    """dq_i = tau sum_j dS_ij k_j depends on row i alone, so only that row of dQ is NaN. dK and dV sum over every row
    of their head, so all of that head's are NaN, as in the float64 reference (and torch); the other head's are not
    touched. On a GPU the builtin ``min`` (``fminf``) of the fast backwards' cap on ``S - M`` dropped the NaN and left
    dV clean there (found on an H200, 2026-11-28); the cap keeps it now (``fast._regtile.min_keep_nan``). The 3xTF32
    backward at these shapes (no ``SPLIT_QDO``) lost it once more on a GPU, in its per-warp split of ``Q_i tau log2 e``
    (the product's NaN is ``0x7fffffff``, which the split's rounding carried into -0.0); that split now keeps it
    (``tensorcore.ptx.make_split_keep_nan``)."""
    q, clean, k, v = poisoned_row_inputs(rng, np.nan)
    dout = randn(rng, *q.shape)
    dq, dk, dv = run_backward(kernel, dout, q, k, v)
    ref = standard_backward(dout, clean, k, v)
    naive = naive_attention_backward_float32(dout, clean, k, v)
    assert_only_the_poisoned_row_is_nan(dq, ref[0], naive[0], "dq nan")
    b, _, h = NAN_ROW
    with np.errstate(invalid="ignore"):
        oracle = standard_backward(dout, q, k, v)
    for i, (name, got) in enumerate((("dk", dk), ("dv", dv)), start=1):
        assert np.isnan(oracle[i][b, :, h]).all(), "the float64 oracle's answer"
        assert np.isnan(got[b, :, h]).all(), f"{name}: the poisoned head's rows must all be NaN, got {got[b, :, h]}"
        other = np.ones(got.shape, bool)
        other[b, :, h] = False
        assert_error_rule(got[other], ref[i][other], naive[i][other], what=f"{name} nan: the other head")
