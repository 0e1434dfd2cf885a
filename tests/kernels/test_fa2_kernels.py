"""FlashAttention-2 kernels (every registered variant of FA2 Algorithms 1 and 2) against the oracle.

Claims checked:

* The FA2 forward (both the readable and the fast kernel) computes standard attention: the output is
  within 2x the error of a plain float32 implementation against the float64 oracle, and the stored
  logsumexp ``L`` likewise (``+inf`` exactly on rows that see no key), for ragged ``N``,
  ``s_q != s_k``, odd head dims, causal masks, GQA/MQA and dropout.
* The FA2 backward (atomic dQ and the deterministic path), both the readable and the fast
  (register-blocked, :mod:`numba_flash.fast.fa2_backward`) kernels, gives gradients within 3x the
  float32 error, also at the fast kernel's default tiling (64 x 64, 256 threads).
* On a GPU (marker ``gpu``): the same at realistic shapes (N up to 4096, d up to 128); the forward is
  bitwise reproducible; the deterministic backward is bitwise reproducible over 10 repeats; the
  atomic dQ agrees with it to rounding.

Simulator shapes stay tiny (N <= 32, d <= 16, b*h <= 2, tiles 8/16).
"""

from __future__ import annotations

from numba_flash import api, registry
from numba_flash._launch import poison_outputs
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward
from numba_flash_reference.common import causal_mask, default_scale, dropout_scale_matrix

import numpy as np
import pytest
from attn_testing import (
    EPS32,
    assert_error_rule,
    assert_lse_rule,
    make_qkv,
    naive_attention_backward_float32,
    naive_attention_float32,
    naive_lse_float32,
    randn_like,
    torch_attention,
)

#: Every registered variant of each pass (the forward also has the tensor-core kernel).
FWD_VARIANTS = tuple(k.variant for k in registry.variants("flash2") if k.pass_ == "forward")
VARIANTS = tuple(k.variant for k in registry.variants("flash2") if k.pass_ == "backward")

#: (batch, s_q, s_k, nheads, nheads_k, d, causal, dropout_p, block_sizes): tiny simulator cases.
SIM_CASES = [
    pytest.param(1, 20, 20, 1, 1, 8, False, 0.0, (8, 8), id="ragged-N20-d8"),
    pytest.param(1, 19, 27, 2, 1, 12, True, 0.0, (8, 16), id="causal-sq<sk-gqa-d12"),
    pytest.param(1, 30, 13, 2, 2, 16, True, 0.2, (16, 8), id="causal-sq>sk-masked-rows-dropout-d16"),
    pytest.param(2, 23, 17, 1, 1, 5, False, 0.1, (8, 8), id="odd-d5-dropout-b2"),
]


@pytest.fixture(params=FWD_VARIANTS)
def variant(request):
    """Run the test with every FA2 forward kernel: readable, fast and tensor-core."""
    return request.param


@pytest.fixture(params=VARIANTS)
def bwd_variant(request):
    """Run the test with every FA2 backward kernel: readable and fast."""
    return request.param


def naive_grads_float32(dout, q, k, v, causal=False, dropout_p=0.0, seed=0, softmax_scale=None):
    """Gradients of plain float32 attention (torch autograd on the CPU): the baseline for the 3x rule."""
    torch = pytest.importorskip("torch")
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    tq, tk, tv = (torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (q, k, v))
    G = h // h_k
    kk, vv = tk.repeat_interleave(G, dim=2), tv.repeat_interleave(G, dim=2)
    S = torch.einsum("bihd,bjhd->bhij", tq, kk) * default_scale(d, softmax_scale)
    if causal:
        S = S.masked_fill(~torch.tensor(causal_mask(s_q, s_k)), float("-inf"))
    P = torch.softmax(S, -1).nan_to_num(0.0)
    if dropout_p > 0:
        Z = np.stack(
            [
                np.stack(
                    [dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p) for hi in range(h)]
                )
                for bi in range(b)
            ]
        )
        P = P * torch.tensor(Z, dtype=torch.float32)
    torch.einsum("bhij,bjhd->bihd", P, vv).backward(torch.tensor(dout))
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


# ------------------------------------------------------------------------------------------------
# Simulator (and GPU): tiny shapes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), SIM_CASES)
def test_fa2_forward_equals_standard_attention(rng, variant, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    ref = standard_attention(q, k, v, causal=causal, dropout_p=p, seed=seed)
    with poison_outputs():
        out, stats = api.attention_numpy(
            q, k, v, p, None, causal, algorithm="flash2", variant=variant, block_sizes=bs, seed=seed, return_stats=True
        )
    assert stats.forward.variant == variant
    assert_error_rule(
        out, ref.O, naive_attention_float32(q, k, v, causal=causal, dropout_p=p, seed=seed), what=f"O ({variant})"
    )
    assert_lse_rule(stats.lse, ref.L, naive_lse_float32(q, k, causal))


def test_fa2_fast_default_tiling_equals_standard_attention(rng):
    # The fast kernel's default tiles (Br = 128, an 8 x 8 S tile per thread at d <= 64), not a test tiling.
    q, k, v = make_qkv(rng, 1, 21, 19, 2, 1, 16)
    ref = standard_attention(q, k, v, causal=True, dropout_p=0.1, seed=3)
    with poison_outputs():
        out = api.attention_numpy(q, k, v, 0.1, None, True, algorithm="flash2", variant="fast", seed=3)
    assert_error_rule(out, ref.O, naive_attention_float32(q, k, v, causal=True, dropout_p=0.1, seed=3))


def test_fa2_rows_that_see_no_key_give_zero_output_and_infinite_lse(rng, variant):
    # s_q > s_k with the bottom-right causal mask: the first s_q - s_k rows see no key at all.
    q, k, v = make_qkv(rng, 1, 21, 9, 1, 1, 8)
    with poison_outputs():
        out, stats = api.attention_numpy(
            q, k, v, causal=True, algorithm="flash2", variant=variant, block_sizes=(8, 8), return_stats=True
        )
    assert np.all(out[0, :12] == 0.0)
    assert np.all(np.isposinf(stats.lse[0, 0, :12]))
    assert np.all(np.isfinite(stats.lse[0, 0, 12:]))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), SIM_CASES[1:])
def test_fa2_backward_gradients_within_3x_float32_error(
    rng, bwd_variant, deterministic, b, s_q, s_k, h, h_k, d, causal, p, bs
):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    seed = int(rng.integers(0, 2**32))
    out, stats = api.attention_numpy(
        q, k, v, p, None, causal, algorithm="flash2", variant=bwd_variant, block_sizes=bs, seed=seed, return_stats=True
    )
    assert stats.backward.variant == bwd_variant
    with poison_outputs():
        grads = api.attention_backward_numpy(dout, q, k, v, out, stats, deterministic=deterministic)
    ref = standard_backward(dout, q, k, v, causal=causal, dropout_p=p, seed=seed)
    naive = naive_grads_float32(dout, q, k, v, causal=causal, dropout_p=p, seed=seed)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert_error_rule(g, r, n, mult=3, what=f"{name} ({bwd_variant})")


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
def test_fa2_fast_backward_default_tiling_gradients_within_3x_float32_error(rng, deterministic):
    # The fast backward's default tiles (Br = Bc = 64, 256 threads, 4 x 4 register tiles), not a test
    # tiling: GQA (2 query heads per KV head), causal with s_q > s_k (rows that see no key), dropout.
    q, k, v = make_qkv(rng, 1, 21, 17, 2, 1, 12)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, stats = api.attention_numpy(
        q, k, v, 0.1, None, True, algorithm="flash2", variant="fast", seed=5, return_stats=True
    )
    with poison_outputs():
        grads = api.attention_backward_numpy(dout, q, k, v, out, stats, deterministic=deterministic)
    ref = standard_backward(dout, q, k, v, causal=True, dropout_p=0.1, seed=5)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=True, dropout_p=0.1, seed=5)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert np.all(np.isfinite(g)), f"{name}: NaN or inf"
        assert_error_rule(g, r, n, mult=3, what=name)


def test_fa2_rejects_an_unknown_variant_before_any_launch(rng):
    q, k, v = make_qkv(rng, 1, 8, 8, 1, 1, 4)
    with pytest.raises(ValueError, match="variant must be one of"):
        api.attention_numpy(q, k, v, algorithm="flash2", variant="nope")


@pytest.mark.parametrize(("variant", "tiles"), [("readable", (256, 256)), ("fast", (128, 1024))])
def test_fa2_kernels_reject_tiles_that_do_not_fit_in_sram(rng, variant, tiles):
    q, k, v = make_qkv(rng, 1, 16, 16, 1, 1, 128)
    with pytest.raises(ValueError, match="shared memory"):
        api.attention_numpy(q, k, v, algorithm="flash2", variant=variant, block_sizes=tiles)


def test_flash2_is_the_default_algorithm_and_auto_picks_the_fastest_kernel():
    from numba_flash.runtime import backend as _backend

    assert api.DEFAULT_ALGORITHM == "flash2"
    q = np.ones((1, 8, 1, 16), np.float32)
    fwd, bwd = registry.resolve_pair(None, "auto", api.check_attention_args(q, q, q))
    assert fwd.algorithm == bwd.algorithm == "flash2"
    assert fwd.variant == ("readable" if _backend.is_simulator() else "tensorcore")  # registry.auto_order
    # On a GPU the tensor-core pair, routed by dtype and head dim: the 3xTF32 kernels for float32 at d = 16
    assert bwd.variant == ("readable" if _backend.is_simulator() else "tensorcore")
    if not _backend.is_simulator():
        assert (fwd.module.__name__, bwd.module.__name__) == (
            "numba_flash.tensorcore.fa2_forward_tf32",
            "numba_flash.tensorcore.fa2_backward_tf32",
        )


# ------------------------------------------------------------------------------------------------
# GPU: realistic shapes, races, reproducibility
# ------------------------------------------------------------------------------------------------
def _cuda_inputs(rng, b, s_q, s_k, h, h_k, d):
    torch = pytest.importorskip("torch")
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    return q, k, v, *(torch.tensor(x, device="cuda") for x in (q, k, v))


GPU_CASES = [
    pytest.param(2, 1024, 1024, 4, 4, 64, False, 0.0, id="N1024-d64"),
    pytest.param(2, 1024, 1024, 4, 4, 64, True, 0.0, id="N1024-d64-causal"),
    pytest.param(1, 4096, 4096, 2, 2, 64, True, 0.0, id="N4096-d64-causal"),
    pytest.param(1, 2048, 2048, 2, 2, 128, False, 0.0, id="N2048-d128"),
    # Dev: causal d = 128 from 2k is the 3xTF32 forward's 8 x 2 x 16 with RESCALE_FMA (its default there since
    # 2026-11-28)
    pytest.param(1, 2048, 2048, 2, 2, 128, True, 0.0, id="N2048-d128-causal"),
    pytest.param(2, 777, 1029, 6, 2, 40, True, 0.0, id="ragged-sq<sk-gqa-d40-causal"),
    pytest.param(2, 1029, 513, 4, 1, 96, True, 0.17, id="ragged-sq>sk-mqa-d96-causal-dropout"),
    pytest.param(1, 1000, 1000, 3, 3, 111, False, 0.1, id="ragged-d111-dropout"),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), GPU_CASES)
def test_fa2_forward_equals_standard_attention_on_gpu_shapes(rng, variant, b, s_q, s_k, h, h_k, d, causal, p):
    import torch

    q, k, v, tq, tk, tv = _cuda_inputs(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    ref = torch_attention(tq, tk, tv, causal, p, seed, torch.float64).cpu().numpy()
    torch.backends.cuda.matmul.allow_tf32 = False
    naive = torch_attention(tq, tk, tv, causal, p, seed, torch.float32).cpu().numpy()
    with poison_outputs():
        out = api.flash_attn_func(tq, tk, tv, p, causal=causal, algorithm="flash2", variant=variant, seed=seed)
    assert_error_rule(out.cpu().numpy(), ref, naive, what=f"O ({variant})")


#: Known failures of the 3x rule on a GPU case's own (seeded) draw: (variant, b, s_q, s_k, h, h_k, d, causal, p) ->
#: reason. Strict xfails: the marker fails the suite as soon as a fix lands (``python -m bench.rule_margin`` measures
#: a case over many draws, and ``--seed`` with zlib.crc32 of the test's node id reproduces the test's own draw).
#: (empty since the fast backward's HEAD_SUMS: its GQA d = 40 case, dK 1.16x the bound on its draw with one register
#: summing the group's 2331 rows, sums a head at a time; tests/kernels/test_fast_backward_head_sums.py)
RULE_FAILURES_ON_GPU: dict = {}


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"),
    [GPU_CASES[1], GPU_CASES[2], GPU_CASES[4], GPU_CASES[5], GPU_CASES[6], GPU_CASES[3]],
)
def test_fa2_backward_gradients_within_3x_float32_error_on_gpu_shapes(
    request, rng, bwd_variant, b, s_q, s_k, h, h_k, d, causal, p
):
    import torch

    known = RULE_FAILURES_ON_GPU.get((bwd_variant, b, s_q, s_k, h, h_k, d, causal, p))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError, reason=known))

    q, k, v, tq, tk, tv = _cuda_inputs(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    dout = randn_like(rng, tq)
    grads = {}
    for dtype in (torch.float64, torch.float32):
        xs = [x.detach().to(dtype).requires_grad_(True) for x in (tq, tk, tv)]
        torch.backends.cuda.matmul.allow_tf32 = False
        torch_attention(*xs, causal, p, seed, dtype).backward(dout.to(dtype))
        grads[dtype] = [x.grad.cpu().numpy() for x in xs]
    for deterministic in (False, True):
        xs = [x.detach().clone().requires_grad_(True) for x in (tq, tk, tv)]
        with poison_outputs():
            api.flash_attn_func(
                *xs, p, causal=causal, algorithm="flash2", variant=bwd_variant, seed=seed, deterministic=deterministic
            ).backward(dout)
        for name, x, r, n in zip(("dq", "dk", "dv"), xs, grads[torch.float64], grads[torch.float32]):
            assert_error_rule(
                x.grad.cpu().numpy(), r, n, mult=3, what=f"{name} ({bwd_variant}, deterministic={deterministic})"
            )


@pytest.mark.gpu
def test_fa2_forward_is_bitwise_reproducible_and_backward_race_free(rng, variant, bwd_variant):
    """flash-attn's race test: repeated forwards bitwise equal; deterministic backward bitwise equal
    over 10 repeats; atomic dq equal to it up to rounding (allclose), dk and dv bitwise equal."""
    import torch

    q, k, v, tq, tk, tv = _cuda_inputs(rng, 2, 1000, 1000, 4, 2, 64)
    dout = randn_like(rng, tq)
    outs = [
        api.flash_attn_func(tq, tk, tv, causal=True, algorithm="flash2", variant=variant, return_attn_probs=True)
        for _ in range(10)
    ]
    for o, lse, _ in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])

    def grads(deterministic):
        xs = [x.detach().clone().requires_grad_(True) for x in (tq, tk, tv)]
        api.flash_attn_func(
            *xs, causal=True, algorithm="flash2", variant=bwd_variant, deterministic=deterministic
        ).backward(dout)
        return [x.grad for x in xs]

    det = [grads(True) for _ in range(10)]
    for g in det[1:]:
        assert all(torch.equal(a, b0) for a, b0 in zip(g, det[0])), "deterministic backward differs between runs"
    atomic = grads(False)
    assert torch.equal(atomic[1], det[0][1]) and torch.equal(atomic[2], det[0][2]), "dk, dv must not depend on atomics"
    scale = float(det[0][0].abs().max())
    assert torch.allclose(atomic[0], det[0][0], rtol=0, atol=64 * EPS32 * scale)
