"""Claims about the two backward kernels: FA1 Algorithm 4 (recomputation, ``numba_flash.alg4_backward``)
and FA1 Algorithm 3 (standard, P, dP, dS in device memory, ``numba_flash.alg3_backward``).

Each kernel is called at the kernel level (``backward(dout, q, k, v, out, fwd, prob, alloc)``) on the
float64 forward oracle's O and statistics rounded to float32, so these tests need no forward kernel; the
full pipeline (forward kernel + backward kernel + torch autograd) is tested in ``tests/test_autograd.py``.

Oracles: the float64 reference :func:`numba_flash_reference.alg3_backward.standard_backward` (itself
checked against finite differences and torch autograd in ``tests/reference``), and central finite
differences of the float64 forward oracle on tiny shapes. Tolerance: the gradient rule of the
conventions (flash-attn's): error <= 3 x the error of a float32 standard backward
(:func:`attn_testing.naive_attention_backward_float32`) on the same inputs, plus a few-ulp floor.
Every output is NaN-poisoned before the launch, so an element a kernel forgets to write fails.
"""

from __future__ import annotations

from numba_flash import alg4_backward, is_simulator, registry
from numba_flash._launch import Allocator, ForwardOutput, check_attention_args, poison_outputs
from numba_flash.fast import _regtile
from numba_flash.tensorcore import ptx
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward
from numba_flash_reference.common import dropout_keep_mask

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    make_qkv,
    max_err,
    naive_attention_backward_float32,
    ulp_floor,
)
from numba import cuda, float32

ALGOS = ["flash1", "standard"]
#: Tiles of the simulator cases: small, so ragged tails and several (i, j) tile pairs occur at N <= 32.
SIM_TILES = (8, 8)


def grad_problem(rng, b, s_q, s_k, h, h_k, d, scale=1.0):
    """Fresh float32 q, k, v and an upstream gradient dO (never zeros)."""
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d, scale=scale)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    return dout, q, k, v


def kernel_backward(
    algo, dout, q, k, v, *, causal=False, dropout_p=0.0, seed=0, softmax_scale=None, block_sizes=None, variant=None
):
    """Run one backward kernel on the float64 forward oracle's O, m, l, L (rounded to float32).

    ``variant`` ("fast" / "readable", flash1 only; None: the registry's "auto" kernel). Outputs are
    NaN-poisoned before the launch; returns float32 NumPy (dq, dk, dv).
    """
    prob = check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed)
    fwd64 = standard_attention(q, k, v, softmax_scale, causal, dropout_p, seed)
    alloc = Allocator(q)
    f32 = np.float32
    fwd = ForwardOutput(
        out=None,
        lse=alloc.to_kernel(fwd64.L.astype(f32)),
        m=alloc.to_kernel(fwd64.m.astype(f32)),
        l=alloc.to_kernel(fwd64.l.astype(f32)),
    )
    args = [alloc.to_kernel(x) for x in (dout, q, k, v, fwd64.O.astype(f32))]
    module = registry.resolve(algo, "backward", variant or "auto", prob).module
    with poison_outputs():
        grads = module.backward(*args, fwd, prob, alloc, block_sizes=block_sizes)
    return tuple(alloc.result(g) for g in grads)


def assert_gradients_follow_error_rule(got, dout, q, k, v, *, causal=False, dropout_p=0.0, seed=0, softmax_scale=None):
    """dq, dk, dv each within 3 x the float32 standard backward's error against the float64 reference."""
    ref = standard_backward(dout, q, k, v, softmax_scale, causal, dropout_p, seed)
    naive = naive_attention_backward_float32(dout, q, k, v, softmax_scale, causal, dropout_p, seed)
    for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        assert_error_rule(g, r, n, mult=3.0, what=name)
    return ref


# (batch, s_q, s_k, nheads, nheads_k, headdim, causal, dropout_p, softmax_scale, (Br, Bc))
SIM_CASES = [
    pytest.param(1, 17, 17, 1, 1, 8, False, 0.0, None, SIM_TILES, id="ragged-N"),
    pytest.param(1, 13, 22, 2, 1, 5, True, 0.0, None, SIM_TILES, id="causal-sq<sk-odd-d-mqa"),
    pytest.param(2, 20, 9, 1, 1, 7, True, 0.0, 0.3, (8, 4), id="causal-sq>sk-empty-rows-scale"),
    pytest.param(1, 19, 19, 2, 2, 6, False, 0.17, None, (4, 8), id="dropout"),
    pytest.param(1, 16, 24, 2, 1, 16, True, 0.3, None, SIM_TILES, id="causal-dropout-gqa"),
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "scale", "tiles"), SIM_CASES)
def test_backward_kernel_gradients_equal_float64_reference(rng, algo, b, s_q, s_k, h, h_k, d, causal, p, scale, tiles):
    dout, q, k, v = grad_problem(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    got = kernel_backward(
        algo, dout, q, k, v, causal=causal, dropout_p=p, seed=seed, softmax_scale=scale, block_sizes=tiles
    )
    assert_gradients_follow_error_rule(got, dout, q, k, v, causal=causal, dropout_p=p, seed=seed, softmax_scale=scale)


@pytest.mark.parametrize("algo", ALGOS)
def test_backward_kernel_gradients_match_central_finite_differences(rng, algo):
    """Independent of every backward reference: the derivative of the float64 forward oracle itself.

    f(q, k, v) = sum(dO o O(q, k, v)); central differences with step 1e-5 in float64 have truncation
    error ~1e-10 and rounding error ~1e-11, far below the float32 errors the rule compares.
    """
    b, s_q, s_k, h, h_k, d, causal = 1, 3, 5, 2, 1, 3, True
    dout, q, k, v = grad_problem(rng, b, s_q, s_k, h, h_k, d)
    q64, k64, v64, do64 = (x.astype(np.float64) for x in (q, k, v, dout))
    step = 1e-5

    def f(qq, kk, vv):
        return float(np.sum(do64 * standard_attention(qq, kk, vv, causal=causal).O))

    fd = []
    for which in range(3):
        args = [q64, k64, v64]
        g = np.zeros_like(args[which])
        for idx in np.ndindex(g.shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += step
            minus[which][idx] -= step
            g[idx] = (f(*plus) - f(*minus)) / (2 * step)
        fd.append(g)
    got = kernel_backward(algo, dout, q, k, v, causal=causal, block_sizes=(2, 2))
    naive = naive_attention_backward_float32(dout, q, k, v, causal=causal)
    for name, gk, gfd, gn in zip(("dq", "dk", "dv"), got, fd, naive):
        assert_error_rule(gk, gfd, gn, mult=3.0, what=name)


# ----------------------------------------------------------------------------------------------
# Edge cases
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ALGOS)
def test_single_token_attention_has_zero_score_gradients(rng, algo):
    """N = 1: P = 1, so dV = dO and dS = P (dP - D) = dO.v - dO.o = 0 (o = v): dQ = dK = 0."""
    dout, q, k, v = grad_problem(rng, 2, 1, 1, 2, 1, 8)
    dq, dk, dv = kernel_backward(algo, dout, q, k, v)
    assert_gradients_follow_error_rule((dq, dk, dv), dout, q, k, v)
    assert max_err(dv[:, :, 0], dout.sum(axis=2)) <= ulp_floor(dout)  # MQA: dV sums the 2 query heads' dO
    assert max_err(dq, 0.0) <= ulp_floor(dout) and max_err(dk, 0.0) <= ulp_floor(dout)


@pytest.mark.parametrize("algo", ALGOS)
def test_rows_that_see_no_key_get_zero_gradient_and_no_nan(rng, algo):
    """Causal with s_q > s_k (bottom-right aligned): the first s_q - s_k rows see no key (m = -inf,
    l = 0, L = +inf). Their dQ is exactly 0, and no gradient anywhere is NaN."""
    s_q, s_k = 13, 5
    dout, q, k, v = grad_problem(rng, 1, s_q, s_k, 2, 1, 4)
    got = kernel_backward(algo, dout, q, k, v, causal=True, block_sizes=(4, 4))
    for g in got:
        assert np.all(np.isfinite(g))
    assert np.all(got[0][:, : s_q - s_k] == 0.0)
    assert np.any(got[0][:, s_q - s_k :] != 0.0)
    assert_gradients_follow_error_rule(got, dout, q, k, v, causal=True)


@pytest.mark.parametrize("algo", ALGOS)
def test_scores_of_size_1e4_give_finite_gradients(rng, algo):
    """q, k ~ N(0, 100^2): scores tau q.k of size ~1e4. exp is only evaluated at S - m <= 0 (Alg.4 L13)
    or S - L <= 0, and 1/l only where l > 0, so nothing overflows: every gradient is finite.

    Accuracy is not claimed here: these kernel-level calls get the float64 oracle's m, l, L, while
    the kernel recomputes S in float32, whose rounding at |S| ~ 1e4 (~1e-3 per entry) shifts P by
    ~0.1%; with a float32 forward's own statistics the shift cancels (tests/test_autograd.py).
    """
    dout, q, k, v = grad_problem(rng, 1, 11, 14, 2, 2, 8)
    q, k = q * np.float32(100.0), k * np.float32(100.0)
    S = standard_attention(q, k, v, return_matrices=True).S
    assert np.max(np.abs(S)) > 5e3
    for g in kernel_backward(algo, dout, q, k, v, causal=True, block_sizes=SIM_TILES):
        assert np.all(np.isfinite(g))


@pytest.mark.parametrize("algo", ALGOS)
def test_single_query_row_against_a_long_key_sequence(rng, algo):
    """s_q = 1, s_k = 61, causal (bottom-right aligned: the one row sees every key)."""
    dout, q, k, v = grad_problem(rng, 1, 1, 61, 1, 1, 8)
    got = kernel_backward(algo, dout, q, k, v, causal=True, block_sizes=SIM_TILES)
    assert_gradients_follow_error_rule(got, dout, q, k, v, causal=True)


# ----------------------------------------------------------------------------------------------
# Dropout: the backward regenerates the forward's mask
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ALGOS)
def test_backward_regenerates_the_forward_dropout_mask_from_the_seed(rng, algo):
    """The gradients match the reference built with the mask of the *same* seed, and miss by far the
    reference of another seed: the mask is the forward's, not merely some mask with the right rate."""
    p, seed = 0.3, int(rng.integers(0, 2**31))
    dout, q, k, v = grad_problem(rng, 1, 12, 12, 1, 1, 8)
    got = kernel_backward(algo, dout, q, k, v, dropout_p=p, seed=seed, block_sizes=SIM_TILES)
    assert_gradients_follow_error_rule(got, dout, q, k, v, dropout_p=p, seed=seed)
    other = standard_backward(dout, q, k, v, dropout_p=p, seed=seed + 1)
    naive = naive_attention_backward_float32(dout, q, k, v, dropout_p=p, seed=seed)
    ref = standard_backward(dout, q, k, v, dropout_p=p, seed=seed)
    assert max_err(got[2], other[2]) > 100 * (3 * max_err(naive[2], ref[2]) + ulp_floor(ref[2]))


@pytest.mark.parametrize("algo", ALGOS)
def test_key_dropped_for_every_query_row_gets_zero_value_gradient(rng, algo):
    """dV_j = sum_i P_ij Z_ij dO_i: a key column that dropout removes from every row has dV_j = 0
    exactly (while dK_j, through the softmax's D_i term, is not zero)."""
    s_q, s_k, p = 3, 16, 0.5
    seed = next(s for s in range(10_000) if np.any(~dropout_keep_mask(s, 0, range(s_q), range(s_k), p).any(axis=0)))
    dropped = ~dropout_keep_mask(seed, 0, range(s_q), range(s_k), p).any(axis=0)
    dout, q, k, v = grad_problem(rng, 1, s_q, s_k, 1, 1, 8)
    dq, dk, dv = kernel_backward(algo, dout, q, k, v, dropout_p=p, seed=seed, block_sizes=SIM_TILES)
    assert np.all(dv[0, dropped] == 0.0)
    assert np.all(np.any(dv[0, ~dropped] != 0.0, axis=-1))
    assert np.all(np.any(dk[0, dropped] != 0.0, axis=-1))
    assert_gradients_follow_error_rule((dq, dk, dv), dout, q, k, v, dropout_p=p, seed=seed)


# ----------------------------------------------------------------------------------------------
# Argument handling of the kernel modules
# ----------------------------------------------------------------------------------------------
def test_recomputation_backward_rejects_tiles_over_the_shared_memory_limit(rng):
    """The readable kernel's tiles are static shared arrays (48 KB); the fast twin's dynamic SRAM
    allows up to the device's opt-in limit (227 KB on an H100/H200)."""
    dout, q, k, v = grad_problem(rng, 1, 4, 4, 1, 1, 64)
    with pytest.raises(ValueError, match="shared memory"):
        kernel_backward("flash1", dout, q, k, v, block_sizes=(64, 64), variant="readable")
    with pytest.raises(ValueError, match="shared memory"):
        kernel_backward("flash1", dout, q, k, v, block_sizes=(256, 256), variant="fast")


def test_recomputation_backward_default_tiles_fit_the_static_shared_memory_limit():
    from numba_flash._launch import MAX_HEADDIM, STATIC_SMEM_BYTES

    for d in range(1, MAX_HEADDIM + 1):
        Br, Bc = alg4_backward.default_block_sizes(d)
        assert alg4_backward.tile_sram_bytes(Br, Bc, d) <= STATIC_SMEM_BYTES


def _backward_from_lse(algo, variant, dout, q, k, v, out, lse, causal):
    """(dq, dk, dv) on the host of the backward kernel of ``algo`` / ``variant`` given the forward's O and its
    logsumexp ``lse`` alone (no m, l), outputs NaN-poisoned, tiles (4, 4)."""
    prob = check_attention_args(q, k, v, 0.0, None, causal, 0)
    alloc = Allocator(q)
    fwd = ForwardOutput(out=None, lse=alloc.to_kernel(lse))
    args = [alloc.to_kernel(x) for x in (dout, q, k, v, out)]
    with poison_outputs():
        got = registry.resolve(algo, "backward", variant, prob).module.backward(
            *args, fwd, prob, alloc, block_sizes=(4, 4)
        )
    return tuple(alloc.result(g) for g in got)


@pytest.mark.parametrize("algo", ALGOS)
def test_backward_from_the_logsumexp_alone_equals_backward_from_m_and_l(rng, algo):
    """Alg.4's kernel takes FA1's (m, l); given only FA2's L = m + log l it uses P = exp(S - L) (the
    same P). The standard kernel always uses L. Both give the reference's gradients."""
    dout, q, k, v = grad_problem(rng, 1, 10, 9, 1, 1, 5)
    fwd64 = standard_attention(q, k, v, causal=True)
    got = _backward_from_lse(algo, "auto", dout, q, k, v, fwd64.O.astype(np.float32), fwd64.L.astype(np.float32), True)
    assert_gradients_follow_error_rule(got, dout, q, k, v, causal=True)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize(("algo", "variant"), [("flash1", "readable"), ("flash1", "fast"), ("standard", "readable")])
def test_backward_from_the_logsumexp_alone_spreads_a_nan_in_q_as_the_reference_does(rng, algo, variant):
    """A NaN in one query row, whose L the readable forwards leave NaN (the float64 oracle's is +inf, the statistic of
    a row that sees no key): from L alone each kernel's gradients are NaN where the float64 reference's are, that row
    of dQ and all of dK and dV (every key sees the row's NaN P)."""
    dout, q, k, v = grad_problem(rng, 1, 10, 9, 1, 1, 5)
    q[0, 4, 0, 1] = np.nan
    with np.errstate(invalid="ignore"):
        fwd64 = standard_attention(q, k, v)
        ref = standard_backward(dout, q, k, v)
    lse = fwd64.L.astype(np.float32)
    lse[0, 0, 4] = np.nan
    got = _backward_from_lse(algo, variant, dout, q, k, v, fwd64.O.astype(np.float32), lse, False)
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert np.isnan(r).any()
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r), err_msg=f"{name}: NaN where the reference has it")


# ----------------------------------------------------------------------------------------------
# The two Algorithm 4 kernels: readable (alg4_backward) and its fast twin (fast/alg4_backward)
# ----------------------------------------------------------------------------------------------
#: Tiny shapes for both variants (the fast twin rounds tiles up to multiples of 16, so N up to 40
#: still gives several (i, j) tile pairs and ragged tails).
VARIANT_SIM_CASES = [
    pytest.param(1, 37, 37, 2, 2, 16, False, 0.0, (16, 16), id="ragged-N-d16"),
    pytest.param(1, 23, 40, 2, 1, 7, True, 0.0, (16, 16), id="causal-sq<sk-odd-d-mqa"),
    pytest.param(2, 33, 17, 1, 1, 12, True, 0.2, (16, 16), id="causal-sq>sk-empty-rows-dropout"),
    pytest.param(1, 29, 35, 2, 1, 9, False, 0.15, (16, 32), id="dropout-gqa-ragged"),
]


@pytest.mark.parametrize("variant", ["fast", "readable"])
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "tiles"), VARIANT_SIM_CASES)
def test_fast_and_readable_recomputation_backward_follow_the_error_rule(
    rng, variant, b, s_q, s_k, h, h_k, d, causal, p, tiles
):
    dout, q, k, v = grad_problem(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    got = kernel_backward(
        "flash1", dout, q, k, v, causal=causal, dropout_p=p, seed=seed, block_sizes=tiles, variant=variant
    )
    assert_gradients_follow_error_rule(got, dout, q, k, v, causal=causal, dropout_p=p, seed=seed)


def test_recomputation_backward_defaults_to_the_fast_twin_on_a_gpu_and_rejects_unknown_variants(rng):
    assert {k.variant for k in registry.variants("flash1") if k.pass_ == "backward"} == {"fast", "readable"}
    # auto: the fast twin on a GPU, the readable kernel in the simulator (registry.auto_order)
    assert registry.auto_variant("flash1", "backward") == ("readable" if is_simulator() else "fast")
    prob = check_attention_args(*make_qkv(rng, 1, 8, 8, 1, 1, 64), 0.0, None, False, 0)
    assert "fast" in registry.resolve("flash1", "backward", "fast").module.compiled_kernels(prob)[0].name
    assert "fast" not in alg4_backward.compiled_kernels(prob)[0].name
    dout, q, k, v = grad_problem(rng, 1, 4, 4, 1, 1, 4)
    with pytest.raises(ValueError, match="variant"):
        kernel_backward("flash1", dout, q, k, v, variant="quick")


# ----------------------------------------------------------------------------------------------
# Realistic shapes on a GPU
# ----------------------------------------------------------------------------------------------
GPU_CASES = [
    pytest.param(2, 1023, 1023, 8, 8, 64, False, 0.0, id="d64-ragged"),
    pytest.param(2, 1000, 1200, 8, 2, 128, True, 0.0, id="d128-causal-gqa"),
    pytest.param(1, 777, 513, 6, 2, 59, True, 0.17, id="d59-causal-sq>sk-dropout"),
    pytest.param(2, 1, 2049, 4, 1, 64, True, 0.0, id="sq1-long-sk-mqa"),
    pytest.param(4, 512, 512, 16, 16, 32, False, 0.1, id="d32-dropout"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), GPU_CASES)
def test_backward_kernel_gradients_equal_float64_reference_at_realistic_shapes(
    rng, algo, b, s_q, s_k, h, h_k, d, causal, p
):
    dout, q, k, v = grad_problem(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    got = kernel_backward(algo, dout, q, k, v, causal=causal, dropout_p=p, seed=seed)
    assert_gradients_follow_error_rule(got, dout, q, k, v, causal=causal, dropout_p=p, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
def test_scores_of_size_1e4_give_finite_gradients_at_realistic_shapes(rng, algo):
    dout, q, k, v = grad_problem(rng, 1, 300, 257, 4, 4, 64)
    q, k = q * np.float32(100.0), k * np.float32(100.0)
    for g in kernel_backward(algo, dout, q, k, v, causal=True):
        assert np.all(np.isfinite(g))


#: Both Algorithm 4 variants at realistic shapes (default tiles: 64 x 128 / 64 x 64 in the fast twin).
VARIANT_GPU_CASES = [
    pytest.param(2, 1000, 777, 8, 2, 64, True, 0.1, id="d64-causal-sq>sk-dropout-gqa"),
    pytest.param(1, 513, 1029, 4, 1, 128, False, 0.0, id="d128-sq<sk-mqa"),
    pytest.param(2, 640, 640, 4, 4, 16, True, 0.0, id="d16-causal"),
    pytest.param(1, 700, 700, 4, 4, 96, False, 0.17, id="d96-dropout"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fast", "readable"])
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), VARIANT_GPU_CASES)
def test_fast_and_readable_recomputation_backward_follow_the_error_rule_at_realistic_shapes(
    rng, variant, b, s_q, s_k, h, h_k, d, causal, p
):
    dout, q, k, v = grad_problem(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    got = kernel_backward("flash1", dout, q, k, v, causal=causal, dropout_p=p, seed=seed, variant=variant)
    assert_gradients_follow_error_rule(got, dout, q, k, v, causal=causal, dropout_p=p, seed=seed)


BWD_PAIRS = sorted({(k.algorithm, k.variant) for k in registry.variants() if k.pass_ == "backward"})


@pytest.mark.parametrize(("algorithm", "variant"), BWD_PAIRS)
def test_backward_from_the_logsumexp_alone_follows_the_error_rule(rng, algorithm, variant):
    """Stats with m = l = None (FA2's own saved state: L only): every backward recomputes P = exp(S - L)."""
    import dataclasses

    from numba_flash import attention_backward_numpy, attention_numpy

    q, k, v = make_qkv(rng, 1, 11, 13, 2, 1, 8)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, st = attention_numpy(
        q, k, v, causal=True, algorithm=algorithm, variant=variant, block_sizes=(8, 8), return_stats=True
    )
    lse_only = dataclasses.replace(st, m=None, l=None)
    with poison_outputs():
        grads = attention_backward_numpy(dout, q, k, v, out, lse_only)
    ref = standard_backward(dout, q, k, v, causal=True)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=True)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert_error_rule(g, r, n, mult=3.0, what=f"{algorithm}/{variant} {name} from L alone")


@pytest.mark.parametrize("which", ["select", "backend"])
def test_the_fast_backwards_cap_on_s_minus_m_keeps_a_nan(which):
    """``min(S - M, 64)`` keeps ``exp2`` from overflowing on masked entries; the builtin ``min`` is ``fminf`` on a GPU,
    which turns a NaN into 64 (Python's ``min`` in the simulator keeps it). The caps of the fast backwards keep it on
    both backends, and are ``min`` on everything else: ``_regtile.min_keep_nan`` (a select; the FFMA and half ones) and
    ``ptx.make_min_keep_nan()`` (``min.NaN.f32`` on a GPU; the 3xTF32 one)."""
    fn = _regtile.min_keep_nan if which == "select" else ptx.make_min_keep_nan()
    xs = np.array([np.nan, 100.0, 64.0, 3.0, -np.inf, np.inf, -0.0], np.float32)
    out = np.full_like(xs, 7.0)

    @cuda.jit
    def cap(x, o):
        i = cuda.grid(1)
        if i < x.size:
            o[i] = fn(x[i], float32(64.0))

    cap[1, 32](xs, out)
    np.testing.assert_array_equal(out, np.array([np.nan, 64.0, 64.0, 3.0, -np.inf, 64.0, -0.0], np.float32))
