"""Claims about the differentiable API: ``numba_flash.flash_attn_func`` through torch autograd, and the
NumPy-level ``attention_numpy`` / ``attention_backward_numpy`` pair.

Here the forward *and* backward kernels run (``algorithm="flash1"``: FA1 Algorithms 2 and 4;
``"standard"``: Algorithms 0 and 3), so the backward uses the statistics its own forward saved.

Oracle: torch autograd of naive attention in float64 (the dropout mask taken from
:func:`numba_flash_reference.common.dropout_scale_matrix`, the one the kernels must regenerate).
Tolerance: the gradient rule, error <= 3 x the error of torch autograd of the same naive attention
in float32 (TF32 off), plus a few-ulp floor; gradcheck where its step and tolerance can be justified.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

from numba_flash import attention_backward_numpy, attention_numpy, flash_attn_func
from numba_flash._launch import poison_outputs
from numba_flash_reference.alg3_backward import standard_backward
from numba_flash_reference.common import causal_mask, dropout_scale_matrix

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, max_err, naive_attention_backward_float32

torch = pytest.importorskip("torch")

ALGOS = ["flash1", "standard"]
#: Tiles of the simulator cases (several tile pairs and ragged tails at N <= 32); None on a GPU.
SIM_TILES = (8, 8)


def torch_naive_attention(q, k, v, softmax_scale=None, causal=False, dropout_p=0.0, seed=0):
    """softmax(tau q k^T) (o Z) v in torch, differentiable, in the dtype of q (GQA by repeating k, v).

    Rows that see no key give 0 (the library's convention) without NaN in value or gradient.
    """
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    tau = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    kk, vv = (x.repeat_interleave(h // h_k, dim=2) for x in (k, v))
    S = torch.einsum("bqhd,bkhd->bhqk", q, kk) * tau
    if causal:
        visible = torch.from_numpy(causal_mask(s_q, s_k)).to(q.device)
        has_key = visible.any(dim=1, keepdim=True)
        S = S.masked_fill(~visible, float("-inf")).masked_fill(~has_key, 0.0)
        P = torch.softmax(S, dim=-1) * has_key
    else:
        P = torch.softmax(S, dim=-1)
    if dropout_p > 0:
        Z = np.stack(
            [
                np.stack(
                    [dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p) for hi in range(h)]
                )
                for bi in range(b)
            ]
        )
        P = P * torch.from_numpy(Z).to(device=q.device, dtype=q.dtype)
    return torch.einsum("bhqk,bkhd->bqhd", P, vv)


def torch_grads(fn, q, k, v, g, dtype):
    """(dq, dk, dv) of sum(g * fn(q, k, v)) with the inputs cast to ``dtype``."""
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(g.to(dtype))
    return [x.grad for x in leaves]


def assert_autograd_follows_error_rule(got, q, k, v, g, **opts):
    """Kernel gradients vs torch float64 autograd, within 3 x torch float32 autograd's error."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ref = torch_grads(lambda *x: torch_naive_attention(*x, **opts), q, k, v, g, torch.float64)
        naive = torch_grads(lambda *x: torch_naive_attention(*x, **opts), q, k, v, g, torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    for name, a, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        assert_error_rule(
            a.detach().cpu().double().numpy(), r.cpu().numpy(), n.cpu().double().numpy(), mult=3.0, what=name
        )


def tensors(rng, b, s_q, s_k, h, h_k, d, device="cpu", dtype=torch.float32, scale=1.0):
    q, k, v = (
        torch.from_numpy(x).to(device=device, dtype=dtype) for x in make_qkv(rng, b, s_q, s_k, h, h_k, d, scale=scale)
    )
    g = torch.from_numpy(rng.standard_normal(tuple(q.shape))).to(device=device, dtype=dtype)
    return q, k, v, g


def kernel_grads(q, k, v, g, algo, **opts):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    with poison_outputs():
        out = flash_attn_func(*leaves, algorithm=algo, **opts)
        out.backward(g)
    return out, [x.grad for x in leaves]


# (batch, s_q, s_k, nheads, nheads_k, headdim, causal, dropout_p)
SIM_CASES = [
    pytest.param(1, 13, 17, 2, 1, 8, True, 0.2, id="causal-dropout-mqa-ragged"),
    pytest.param(2, 9, 9, 1, 1, 5, False, 0.0, id="odd-d"),
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), SIM_CASES)
def test_flash_attn_func_gradients_equal_torch_float64_autograd(rng, algo, b, s_q, s_k, h, h_k, d, causal, p):
    q, k, v, g = tensors(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    _, got = kernel_grads(q, k, v, g, algo, causal=causal, dropout_p=p, seed=seed, block_sizes=SIM_TILES)
    assert_autograd_follows_error_rule(got, q, k, v, g, causal=causal, dropout_p=p, seed=seed)


@pytest.mark.parametrize("algo", ALGOS)
def test_autograd_saves_only_inputs_output_and_per_row_statistics(rng, algo):
    """What the Function saves for backward: q, k, v, out and (b, h, s_q) statistics; nothing N x N."""
    b, s_q, s_k, h, d = 1, 13, 17, 2, 8
    q, k, v, _ = tensors(rng, b, s_q, s_k, h, h, d)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        flash_attn_func(*leaves, algorithm=algo, block_sizes=SIM_TILES)
    allowed = {tuple(q.shape), tuple(k.shape), (b, h, s_q)}
    assert saved and set(saved) <= allowed, saved
    assert all(math.prod(s) < s_q * s_k for s in saved if s == (b, h, s_q))
    assert (b, h, s_q) in saved  # the logsumexp (and m, l for flash1)


@pytest.mark.parametrize("algo", ALGOS)
def test_attention_backward_numpy_equals_float64_reference(rng, algo):
    b, s_q, s_k, h, h_k, d, causal, p = 1, 11, 19, 2, 2, 6, True, 0.25
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    with poison_outputs():
        out, stats = attention_numpy(
            q, k, v, p, causal=causal, algorithm=algo, seed=5, block_sizes=SIM_TILES, return_stats=True
        )
        got = attention_backward_numpy(dout, q, k, v, out, stats)
    assert stats.lse.shape == (b, h, s_q)
    ref = standard_backward(dout, q, k, v, causal=causal, dropout_p=p, seed=5)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=causal, dropout_p=p, seed=5)
    for name, a, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        assert a.dtype == np.float32
        assert_error_rule(a, r, n, mult=3.0, what=name)


@pytest.mark.parametrize("algo", ALGOS)
def test_gradients_come_back_in_the_dtype_of_the_inputs(rng, algo):
    """float64 tensors in, float64 gradients out (computed in float32: the float32 rule applies)."""
    q, k, v, g = tensors(rng, 1, 7, 10, 2, 1, 4, dtype=torch.float64)
    _, got = kernel_grads(q, k, v, g, algo, causal=True, block_sizes=SIM_TILES)
    assert all(x.dtype == torch.float64 for x in got)
    assert_autograd_follows_error_rule(got, q, k, v, g, causal=True)


@pytest.mark.parametrize("algo", ALGOS)
def test_non_contiguous_inputs_give_identical_gradients(rng, algo):
    """The kernels index (b, s, h, d) through strides: a transposed view computes bit for bit the same."""
    q, k, v, g = tensors(rng, 1, 10, 10, 2, 2, 4)
    _, ref = kernel_grads(q, k, v, g, algo, block_sizes=SIM_TILES)
    qt, kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qt.is_contiguous()
    _, got = kernel_grads(qt, kt, vt, g, algo, block_sizes=SIM_TILES)
    for a, r in zip(got, ref):
        assert torch.equal(a, r)


@pytest.mark.parametrize("algo", ALGOS)
def test_rows_that_see_no_key_get_zero_gradient_through_autograd(rng, algo):
    """Causal with s_q > s_k: the forward saves m = -inf, l = 0, L = +inf for the first s_q - s_k rows;
    the backward gives them dQ = 0 and puts no NaN anywhere."""
    s_q, s_k = 12, 5
    q, k, v, g = tensors(rng, 1, s_q, s_k, 1, 1, 4)
    _, (dq, dk, dv) = kernel_grads(q, k, v, g, algo, causal=True, block_sizes=(4, 4))
    assert all(torch.isfinite(x).all() for x in (dq, dk, dv))
    assert torch.all(dq[:, : s_q - s_k] == 0)
    assert_autograd_follows_error_rule((dq, dk, dv), q, k, v, g, causal=True)


@pytest.mark.parametrize("algo", ALGOS)
def test_scores_of_size_1e4_give_finite_gradients_through_autograd(rng, algo):
    """q, k ~ N(0, 100^2): scores of size ~1e4. The forward's statistics keep every exp argument <= 0,
    so forward and backward stay finite.

    Accuracy is not claimed at this size for flash1: with a one-hot P, Algorithm 4's D_i = dO_i . O_i
    (line 19) and dP_ij = dO_i . v_j round differently, and their ~1e-7 difference is multiplied by
    |k| ~ 100 in dQ, while a float32 naive backward's D_i = sum_j P_ij dP_ij cancels exactly.
    """
    q, k, v, g = tensors(rng, 1, 9, 12, 1, 1, 8)
    q, k = q * 100.0, k * 100.0
    out, got = kernel_grads(q, k, v, g, algo, causal=True, block_sizes=SIM_TILES)
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(x).all() for x in got)


@pytest.mark.parametrize("algo", ALGOS)
def test_gradcheck_passes_through_the_float32_kernels_with_the_readme_settings(rng, algo):
    """torch.autograd.gradcheck (fast mode: one random projection of the Jacobian) on float64 inputs,
    with the settings the README recommends (read from its ``<!-- gradcheck-settings -->`` block).

    The kernels compute in float32, so the numerical Jacobian is a difference quotient of a function
    rounded to ~4 eps32 |O| ~ 1e-6: with step eps = 1e-2 its rounding noise is ~1e-6 / 1e-2 = 1e-4 and
    its truncation error ~eps^2 |f'''| ~ 1e-4 (entries of size 1). atol = 2e-3, rtol = 1e-2 leave a 10x
    margin over both, while a wrong gradient (a missing tau, Z or group sum) is off by O(1).
    """
    settings = readme_gradcheck_settings()
    assert settings == dict(eps=1e-2, atol=2e-3, rtol=1e-2, fast_mode=True)  # the numbers derived above
    q, k, v, _ = tensors(rng, 1, 5, 6, 2, 1, 3, dtype=torch.float64)
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]

    def fn(qq, kk, vv):
        return flash_attn_func(qq, kk, vv, 0.2, causal=True, algorithm=algo, seed=11, block_sizes=(4, 4))

    assert torch.autograd.gradcheck(fn, leaves, **settings)


def test_float64_inputs_are_computed_in_float32_so_gradcheck_fails_at_its_defaults(rng):
    """What the README's precision paragraph says, checked: float64 in, float64 out, float32 accuracy;
    gradcheck at its defaults (eps=1e-6, atol=1e-5) fails, as the README warns (its settings pass: the
    test above). If the kernels ever compute in float64, this test fails and the README must change.

    gradcheck re-runs a failed fast-mode check in slow mode (a column of the Jacobian per input
    element), so the differentiated input is tiny: q alone, 6 elements.
    """
    q, k, v, _ = tensors(rng, 1, 3, 4, 1, 1, 2, dtype=torch.float64)
    leaf = q.detach().requires_grad_(True)

    def fn(qq):
        return flash_attn_func(qq, k, v, causal=True, algorithm="flash2", block_sizes=(4, 4))

    out = fn(leaf)
    err = (out - torch_naive_attention(leaf, k, v, causal=True)).abs().max().item()
    assert out.dtype == torch.float64 and 1e-10 < err < 1e-5  # float32-sized error, not float64's ~1e-16
    assert not torch.autograd.gradcheck(fn, (leaf,), fast_mode=True, raise_exception=False)


def readme_gradcheck_settings() -> dict:
    """The keyword arguments of the gradcheck call the README recommends (block after <!-- gradcheck-settings -->)."""
    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    start = lines.index("<!-- gradcheck-settings -->")
    fence = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    call = ast.parse("\n".join(lines[fence + 1 : end])).body[0].value
    assert ast.unparse(call.func) == "torch.autograd.gradcheck"
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


# ----------------------------------------------------------------------------------------------
# Realistic shapes on a GPU (CUDA tensors, zero-copy into the kernels)
# ----------------------------------------------------------------------------------------------
GPU_CASES = [
    pytest.param(2, 1023, 1023, 8, 8, 64, False, 0.0, id="d64-ragged"),
    pytest.param(2, 1000, 1200, 8, 2, 128, True, 0.1, id="d128-causal-gqa-dropout"),
    pytest.param(1, 1, 3000, 4, 1, 59, True, 0.0, id="sq1-long-sk-mqa-odd-d"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), GPU_CASES)
def test_flash_attn_func_gradients_equal_torch_float64_autograd_on_gpu(rng, algo, b, s_q, s_k, h, h_k, d, causal, p):
    q, k, v, g = tensors(rng, b, s_q, s_k, h, h_k, d, device="cuda")
    seed = int(rng.integers(0, 2**32))
    _, got = kernel_grads(q, k, v, g, algo, causal=causal, dropout_p=p, seed=seed)
    assert_autograd_follows_error_rule(got, q, k, v, g, causal=causal, dropout_p=p, seed=seed)


@pytest.mark.gpu
def test_recomputation_backward_allocates_no_n_by_n_matrix_on_gpu(rng):
    """FA1 forward + Algorithm 4 backward at N = 8192: the peak memory beyond inputs, output and
    gradients is O(N) per head, far below one (b, h, N, N) float32 matrix (1 GiB here); the standard
    path needs three of them."""
    b, n, h, d = 1, 8192, 4, 64
    q, k, v, g = tensors(rng, b, n, n, h, h, d, device="cuda")
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = flash_attn_func(*leaves, algorithm="flash1")
    out.backward(g)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    io = 4 * q.numel() * 4  # out, dq, dk, dv
    nxn = 4 * b * h * n * n
    assert extra - io < 0.02 * nxn, (extra, io, nxn)
    assert max_err(leaves[0].grad.cpu().numpy(), 0.0) > 0
