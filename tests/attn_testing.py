"""Helpers for the tests: random inputs, the float32 naive baseline and the error rule.

The error rule (flash-attn's own test method, see the conventions note): a kernel's error against a
float64 reference must be at most ``mult`` times the error of a plain float32 implementation of the
same function on the same inputs (``mult = 2`` for outputs, 3 for gradients), plus a floor
:func:`ulp_floor`.

Why a floor: on tiny or trivial shapes the float32 naive path can be exact (N = 1 gives P = 1, and
O = V exactly), so ``2 x 0`` would demand bit-exactness from a kernel that rounds differently (the
simulator computes scalars in float64 and rounds on store; the GPU fuses multiply-adds). The floor is
a few float32 rounding steps of the output's magnitude: ``4 * eps32 * max(1, max|ref|)``. It is far
below any real bug (a wrong mask, a missing rescale or an unwritten tile is off by O(1)).

Why the baseline's products go through :func:`matmul32` and not NumPy's ``@``: ``@`` on float32 is the
BLAS of the machine, whose blocking and fused multiply-adds depend on the CPU it detects, so the baseline,
and with it every bound, moved from machine to machine. On a Sapphire Rapids CI machine (2026-11-25) the
BLAS baseline of dq at logit scale 16 was 4.9x more accurate than float32 attention computed in order,
and the readable standard backward (FA1 Algorithm 3), which *is* plain float32 attention computed in
order (its error equals that baseline's to the last digit), failed the rule against it; the same suite
had passed on the machines before. :func:`matmul32` rounds every product and every partial sum to float32
in one fixed order, the same on every CPU: what "a plain float32 implementation" means here.
"""

from __future__ import annotations

import functools

from numba_flash_reference.common import causal_mask, default_scale, dropout_scale_matrix, kv_head

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


@functools.cache
def _matmul32_kernel():
    # numba is imported here, not with this module: numba_flash must choose the CUDA backend (GPU or
    # simulator) before numba is first imported (numba_flash/runtime/backend.py).
    import numba

    @numba.njit(cache=False)
    def matmul32_into(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        for i in range(M):
            for j in range(N):
                out[i, j] = np.float32(0)
            for t in range(K):  # one fixed order, t = 0, 1, ..., K-1; no fused multiply-add (numba does not contract)
                ait = a[i, t]
                for j in range(N):
                    out[i, j] = out[i, j] + ait * b[t, j]

    return matmul32_into


def matmul32(a, b):
    """``a @ b`` in float32, the same bits on every CPU: ``sum_t a[i, t] * b[t, j]`` accumulated for t = 0, 1, ...,
    each product and each partial sum rounded to float32 (see the module docstring for why not BLAS)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    _matmul32_kernel()(a, b, out)
    return out


def make_qkv(rng, batch=1, seqlen_q=16, seqlen_k=None, nheads=1, nheads_k=None, headdim=8, dtype=np.float32, scale=1.0):
    """Random (b, s, h, d) q, k, v drawn from N(0, scale^2): never zeros."""
    seqlen_k = seqlen_q if seqlen_k is None else seqlen_k
    nheads_k = nheads if nheads_k is None else nheads_k
    q = (scale * rng.standard_normal((batch, seqlen_q, nheads, headdim))).astype(dtype)
    k = (scale * rng.standard_normal((batch, seqlen_k, nheads_k, headdim))).astype(dtype)
    v = (scale * rng.standard_normal((batch, seqlen_k, nheads_k, headdim))).astype(dtype)
    return q, k, v


def naive_attention_float32(q, k, v, softmax_scale=None, causal=False, dropout_p=0.0, seed=0):
    """Standard attention computed entirely in float32 NumPy: the baseline of the error rule."""
    f = np.float32
    b, s_q, h, d = q.shape
    _, s_k, h_k, _ = k.shape
    tau = f(default_scale(d, softmax_scale))
    out = np.zeros((b, s_q, h, d), dtype=f)
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            Q, K, V = q[bi, :, hi].astype(f), k[bi, :, hk].astype(f), v[bi, :, hk].astype(f)
            S = matmul32(Q, K.T) * tau
            if causal:
                S = np.where(causal_mask(s_q, s_k), S, f(-np.inf))
            m = S.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, f(0))
            E = np.exp(S - m)
            lsum = E.sum(axis=1, keepdims=True)
            P = E / np.where(lsum > 0, lsum, f(1))
            if dropout_p > 0:
                P = P * dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p).astype(f)
            out[bi, :, hi] = matmul32(P, V)
    return out


def naive_stats_float32(q, k, softmax_scale=None, causal=False):
    """Row statistics m, l and L = m + log l of standard attention, computed in float32 NumPy.

    The float32 baseline of the error rule for the statistics a forward pass saves ((b, h, s_q) each;
    a row that sees no key has m = -inf, l = 0, L = +inf).
    """
    f = np.float32
    b, s_q, h, d = q.shape
    _, s_k, h_k, _ = k.shape
    tau = f(default_scale(d, softmax_scale))
    m = np.zeros((b, h, s_q), f)
    l = np.zeros((b, h, s_q), f)
    for bi in range(b):
        for hi in range(h):
            S = matmul32(q[bi, :, hi], k[bi, :, kv_head(hi, h, h_k)].T) * tau
            if causal:
                S = np.where(causal_mask(s_q, s_k), S, f(-np.inf))
            mx = S.max(axis=1)
            safe = np.where(np.isfinite(mx), mx, f(0))
            m[bi, hi] = mx
            l[bi, hi] = np.exp(S - safe[:, None]).sum(axis=1)
    with np.errstate(divide="ignore"):
        L = np.where(l > 0, m + np.log(np.where(l > 0, l, f(1))), f(np.inf)).astype(f)
    return m, l, L


def assert_stats_rule(m, l, lse, ref, naive, mult=2.0):
    """m, l, L against the oracle's (an AttentionResult): infinities exactly where it has them, finite
    values by the error rule against ``naive`` = :func:`naive_stats_float32` on the same inputs."""
    for name, got, want, base in (("m", m, ref.m, naive[0]), ("l", l, ref.l, naive[1]), ("lse", lse, ref.L, naive[2])):
        got = np.asarray(got, dtype=np.float64)
        assert got.shape == np.shape(want), f"{name}: shape {got.shape} != {np.shape(want)}"
        inf = np.isinf(want)
        np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"{name}: infinities differ from the oracle's")
        assert_error_rule(got[~inf], want[~inf], np.asarray(base, np.float64)[~inf], mult=mult, what=name)


def ulp_floor(ref) -> float:
    """A few float32 rounding steps at the output's magnitude (see the module docstring)."""
    return 4 * EPS32 * max(1.0, float(np.max(np.abs(ref))) if np.size(ref) else 1.0)


def max_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def naive_lse_float32(q, k, causal, softmax_scale=None):
    """logsumexp of every row computed in float32 NumPy (the baseline of the error rule for L)."""
    f = np.float32
    b, s_q, h, d = q.shape
    _, s_k, h_k, _ = k.shape
    tau = f(default_scale(d, softmax_scale))
    out = np.empty((b, h, s_q), dtype=f)
    for bi in range(b):
        for hi in range(h):
            S = (q[bi, :, hi] @ k[bi, :, hi // (h // h_k)].T) * tau
            if causal:
                S = np.where(causal_mask(s_q, s_k), S, f(-np.inf))
            m = S.max(axis=1)
            ms = np.where(np.isfinite(m), m, f(0))
            with np.errstate(divide="ignore"):
                out[bi, hi] = np.where(np.isfinite(m), ms + np.log(np.exp(S - ms[:, None]).sum(axis=1)), np.inf)
    return out


def assert_lse_rule(lse, ref_L, naive_L):
    lse = np.asarray(lse, dtype=np.float64)
    fin = np.isfinite(ref_L)
    assert np.array_equal(np.isposinf(lse), ~fin), "L must be +inf exactly on the rows that see no key"
    if fin.any():
        err = max_err(lse[fin], ref_L[fin])
        base = max_err(naive_L[fin], ref_L[fin])
        assert err <= 2 * base + ulp_floor(ref_L[fin]), f"L: error {err:.2e} > 2 x float32 {base:.2e}"


def assert_error_rule(out, ref64, naive32, mult=2.0, what="output"):
    """max|out - ref| <= mult * max|naive32 - ref| + ulp_floor(ref); NaN never passes."""
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == np.shape(ref64), f"{what}: shape {out.shape} != reference {np.shape(ref64)}"
    assert np.all(np.isfinite(out)), (
        f"{what}: {np.count_nonzero(~np.isfinite(out))} non-finite elements (unwritten or NaN)"
    )
    err = max_err(out, ref64)
    base = max_err(naive32, ref64)
    bound = mult * base + ulp_floor(ref64)
    assert err <= bound, (
        f"{what}: max error {err:.3e} > {mult} x float32-naive error {base:.3e} + floor {ulp_floor(ref64):.1e}"
    )
    return err, base


def naive_attention_backward_float32(dout, q, k, v, softmax_scale=None, causal=False, dropout_p=0.0, seed=0):
    """The standard backward pass (FA1 Algorithm 3) computed entirely in float32 NumPy.

    The baseline of the error rule for gradients (``mult = 3``): P, dP and dS are whole float32
    matrices, ``D_i = rowsum(P o dP)``; dK, dV are summed over each GQA group. Returns (dq, dk, dv).
    """
    f = np.float32
    b, s_q, h, d = q.shape
    _, s_k, h_k, _ = k.shape
    tau = f(default_scale(d, softmax_scale))
    dq = np.zeros((b, s_q, h, d), dtype=f)
    dk = np.zeros((b, s_k, h_k, d), dtype=f)
    dv = np.zeros((b, s_k, h_k, d), dtype=f)
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            Q, K, V, dO = (x.astype(f) for x in (q[bi, :, hi], k[bi, :, hk], v[bi, :, hk], dout[bi, :, hi]))
            S = matmul32(Q, K.T) * tau
            if causal:
                S = np.where(causal_mask(s_q, s_k), S, f(-np.inf))
            m = S.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, f(0))
            E = np.exp(S - m)
            lsum = E.sum(axis=1, keepdims=True)
            P = E / np.where(lsum > 0, lsum, f(1))
            Z = dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p).astype(f)
            dv[bi, :, hk] += matmul32((P * Z).T, dO)
            dP = matmul32(dO, V.T) * Z
            D = np.sum(P * dP, axis=1, keepdims=True)
            dS = P * (dP - D)
            dq[bi, :, hi] = tau * matmul32(dS, K)
            dk[bi, :, hk] += tau * matmul32(dS.T, Q)
    return dq, dk, dv


def torch_attention(q, k, v, causal, p, seed, dtype, softmax_scale=None):
    """Standard attention in torch in ``dtype`` on the inputs' device (float64: the oracle; float32 or the
    inputs' half dtype: the baseline of the error rule; S, P and O are rounded to ``dtype``, as flash-attn's
    ``attention_ref`` without upcast); ``softmax_scale`` None: ``1 / sqrt(d)``."""
    import torch

    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    G = h // h_k
    q, k, v = (x.to(dtype) for x in (q, k, v))
    kk, vv = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    S = torch.einsum("bihd,bjhd->bhij", q, kk) * (default_scale(d) if softmax_scale is None else softmax_scale)
    if causal:
        S = S.masked_fill(~torch.tensor(causal_mask(s_q, s_k), device=q.device), float("-inf"))
    P = torch.softmax(S, -1).nan_to_num(0.0)
    if p > 0:
        Z = np.stack(
            [
                np.stack([dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), p) for hi in range(h)])
                for bi in range(b)
            ]
        )
        P = P * torch.tensor(Z, device=q.device, dtype=dtype)
    return torch.einsum("bhij,bjhd->bihd", P, vv)


def torch_attention_grads(qkv, dout, causal, p, seed, dtype) -> list:
    """``[dq, dk, dv]`` of :func:`torch_attention` computed in ``dtype`` by autograd (float64: the oracle of the
    backward's 3x rule; the inputs' half dtype or float32: its baseline), as float64 NumPy arrays."""
    xs = [x.detach().to(dtype).requires_grad_(True) for x in qkv]
    torch_attention(*xs, causal, p, seed, dtype).backward(dout.to(dtype))
    return [x.grad.double().cpu().numpy() for x in xs]


def unaligned_copy(x):
    """A copy of the host array ``x`` (4-byte elements) whose base is 4 bytes past a 16-byte boundary: rows that
    ``cp.async`` cannot copy, so the kernels that use it must take their register path."""
    x = np.asarray(x)
    assert x.itemsize == 4, x.dtype
    buf = np.empty(x.size + 4, x.dtype)
    off = (4 - buf.ctypes.data % 16 // 4) % 4 + 1  # elements to a 16-byte boundary, plus one
    y = buf[off : off + x.size].reshape(x.shape)
    y[...] = x
    return y


def to_host(x) -> np.ndarray:
    """A kernel array as a NumPy array: NumPy as it is, a numba device array copied, a torch tensor (the kernel array
    of a torch CUDA caller, :class:`numba_flash._launch.Allocator`) moved to the host."""
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.array(x)


def forward_recording_plan(module, kernel_arrays, prob, alloc, block_sizes, features):
    """``module.forward`` (a kernel module) on kernel arrays, outputs NaN-poisoned, recording what it plans.

    Returns ``(fwd, host, planned)``: the :class:`~numba_flash._launch.ForwardOutput`, its ``(O, L, m, l)`` as
    NumPy arrays, and the features ``forward()`` handed to ``module.plan`` (after its own fallbacks, e.g. an
    unaligned input turning ``CP_ASYNC`` off).
    """
    from numba_flash._launch import poison_outputs

    planned = []
    real = module.plan

    def spy(prob_, block_sizes=None, config=None, features=None):
        planned.append(dict(features or {}))
        return real(prob_, block_sizes, config, features)

    module.plan = spy
    try:
        with poison_outputs():
            fwd = module.forward(*kernel_arrays, prob, alloc, block_sizes=block_sizes, features=features)
    finally:
        module.plan = real
    host = [to_host(x) for x in (fwd.out, fwd.lse, fwd.m, fwd.l)]
    return fwd, host, planned[0]


#: Shapes for the 3xTF32 forward's ``cp.async`` path (``CP_ASYNC``), as ``(batch, s_q, s_k, nheads, nheads_k, d,
#: causal, dropout_p, block_sizes)``: several key blocks each (both stages used), ragged, causal with blocks whose
#: rows see no key, GQA, dropout, ``MW = 2`` and a padded row ending in a chunk past d (d = 20 pads to 24).
TC_FORWARD_SRAM_CASES = [
    (1, 37, 40, 2, 1, 16, False, 0.0, (16, 16), "ragged-gqa-d16"),
    (1, 33, 45, 2, 1, 20, True, 0.0, (16, 16), "causal-gqa-d20-padded-chunk"),
    (1, 29, 35, 1, 1, 12, True, 0.1, (32, 16), "causal-dropout-d12"),
    (1, 45, 14, 1, 1, 8, True, 0.0, (16, 8), "causal-sq>sk-blocks-without-keys-d8"),
    (1, 40, 37, 1, 1, 24, True, 0.0, (128, 16), "mw2-4warps-causal-d24"),
]


def tc_forward_sram_params():
    """:data:`TC_FORWARD_SRAM_CASES` as ``pytest.param``s with their ids."""
    import pytest  # here, not at the top: bench/logit_scale.py imports this module outside pytest

    return [pytest.param(*c[:-1], id=c[-1]) for c in TC_FORWARD_SRAM_CASES]


#: Shapes for the half forward's features that must not change a bit (``EX2_FTZ``), as
#: :data:`TC_FORWARD_SRAM_CASES`: several key blocks each (rows whose max grows in a later block beside rows whose max
#: does not), ragged, GQA, causal, dropout and ``MW = 2`` (4 warps).
HALF_FORWARD_FEATURE_CASES = [
    (1, 37, 70, 2, 1, 64, False, 0.0, (16, 16), "ragged-gqa-d64"),
    (1, 29, 67, 1, 1, 48, True, 0.1, (32, 16), "causal-dropout-d48"),
    (1, 37, 80, 1, 1, 40, True, 0.0, (128, 16), "mw2-4warps-causal-d40"),
]


def randn_like(rng, x):
    """A standard normal tensor with ``x``'s shape, dtype and device, drawn from the test's seeded ``rng``.

    Never torch's global generator for a test's data: its state depends on what the worker ran before, so
    under pytest-xdist a test would see other inputs in the suite than alone (a dO drawn that way made a
    gradient test fail once in the GPU suite at 805a132 and pass alone; ``bench.rule_margin`` shows why)."""
    import torch

    return torch.tensor(rng.standard_normal(tuple(x.shape), dtype=np.float32), device=x.device).to(x.dtype)


def half_inputs(rng, dtype, b, s_q, s_k, h, h_k, d, device="cpu"):
    """q, k, v of :func:`make_qkv` as torch tensors of ``dtype`` (float16 or bfloat16) on ``device``."""
    import torch

    return [torch.from_numpy(x).to(device=device, dtype=dtype) for x in make_qkv(rng, b, s_q, s_k, h, h_k, d)]


def run_half_forward(th, causal, p, seed, block_sizes, features, softmax_scale=None):
    """The half forward (:mod:`numba_flash.tensorcore.fa2_forward_half`) at kernel level on torch q, k, v ``th`` with
    ``features``, outputs NaN-poisoned: ``((O as half words, L, m, l) as NumPy arrays, the features it planned
    with)``."""
    from numba_flash._launch import Allocator, check_attention_args
    from numba_flash.tensorcore import fa2_forward_half

    prob = check_attention_args(*th, p, softmax_scale, causal, seed)
    alloc = Allocator(th[0])
    _, host, planned = forward_recording_plan(
        fa2_forward_half, [alloc.to_words(x) for x in th], prob, alloc, block_sizes, features
    )
    return host, planned


#: GPU shapes for the same features, as ``(seqlen, d, causal)`` (batch 2, 4 heads, 2 key heads)
HALF_FEATURE_GPU_SHAPES = [(1000, 64, False), (1000, 128, True), (777, 96, True)]


def assert_half_feature_keeps_bits(th, causal, p, seed, block_sizes, feature):
    """The half forward on torch q, k, v ``th`` with ``feature`` on and off gives bitwise equal O, L, m, l; each run
    checks that it planned the feature."""
    runs = []
    for on in (True, False):
        host, planned = run_half_forward(th, causal, p, seed, block_sizes, {feature: on})
        assert planned[feature] is on
        runs.append(host)
    assert_same_bits(*runs, f"{feature} on and off")


def assert_same_bits(a, b, what, names=("O", "L", "m", "l")):
    """The outputs ``a`` and ``b`` (NumPy arrays of 4-byte elements; by default the forward's O, L, m, l, else as
    ``names`` says) are bitwise equal; ``what`` names the two."""
    for name, x, y in zip(names, a, b):
        np.testing.assert_array_equal(
            np.asarray(x).view(np.uint32), np.asarray(y).view(np.uint32), err_msg=f"{name}: {what} differ"
        )


def run_module_forward(module, q, k, v, causal, p, seed, block_sizes, features, words=None):
    """The forward of the kernel module ``module`` at kernel level with ``features``, outputs NaN-poisoned:
    ``((O, L, m, l) as NumPy arrays, the features it planned with)``; ``words``: kernel arrays to pass instead of
    converting q, k, v (e.g. :func:`unaligned_copy`)."""
    from numba_flash._launch import Allocator, check_attention_args

    prob = check_attention_args(q, k, v, p, None, causal, seed)
    alloc = Allocator(q)
    kernel_arrays = words if words is not None else [alloc.to_kernel(x) for x in (q, k, v)]
    _, host, planned = forward_recording_plan(module, kernel_arrays, prob, alloc, block_sizes, features)
    return host, planned


def run_tc_forward(q, k, v, causal, p, seed, block_sizes, features, words=None):
    """:func:`run_module_forward` of the 3xTF32 forward (:mod:`numba_flash.tensorcore.fa2_forward_tf32`)."""
    from numba_flash.tensorcore import fa2_forward_tf32

    return run_module_forward(fa2_forward_tf32, q, k, v, causal, p, seed, block_sizes, features, words)


def run_tc_feature_pair(q, k, v, causal, p, seed, bs, on, off, what):
    """The 3xTF32 forward with the features ``on`` and with ``off``: ``(outputs on, outputs off)``, each (O, L, m, l) as
    NumPy arrays, after checking that the plan compiles two kernels (it did not ignore ``what``)."""
    from numba_flash._launch import check_attention_args
    from numba_flash.tensorcore import fa2_forward_tf32

    prob = check_attention_args(q, k, v, p, None, causal, seed)
    plans = [fa2_forward_tf32.plan(prob, bs, None, f)[0] for f in (on, off)]
    assert plans[0] is not plans[1], f"the plan ignored {what}: the comparison below would be of one kernel"
    (got_on, _), (got_off, _) = (run_tc_forward(q, k, v, causal, p, seed, bs, f) for f in (on, off))
    return got_on, got_off


def assert_causal_tc_feature_keeps_the_bits(rng, b, s_q, s_k, h, h_k, d, p, bs, on, off, what):
    """The causal 3xTF32 forward with the features ``on`` and with ``off`` at one shape (random inputs from ``rng``):
    the plan compiles two kernels (it did not ignore ``on``), and O, L, m, l are the same bits."""
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    got_on, got_off = run_tc_feature_pair(q, k, v, True, p, seed, bs, on, off, what)
    assert_same_bits(got_on, got_off, f"{what} on and off")


def run_tf32_backward(
    q, k, v, dout, causal, p, seed, block_sizes, features, deterministic=False, config=None, words=None
):
    """The 3xTF32 backward (:mod:`numba_flash.tensorcore.fa2_backward_tf32`) at kernel level with ``features``, after
    the 3xTF32 forward, outputs NaN-poisoned: ``([dq, dk, dv] as NumPy arrays, the features its plan was given, over the
    defaults)`` (after ``backward``'s own fallbacks, e.g. an unaligned input turning ``CP_ASYNC`` off). ``words``: a
    dict of kernel arrays (keys ``q``, ``k``, ``v``, ``dout``) to pass instead of aligned copies (e.g.
    :func:`unaligned_copy`)."""
    from numba_flash._launch import Allocator, check_attention_args, poison_outputs
    from numba_flash.tensorcore import fa2_backward_tf32, fa2_forward_tf32

    prob = check_attention_args(q, k, v, p, None, causal, seed)
    alloc = Allocator(q)
    arrays = {name: alloc.to_kernel(x) for name, x in (("q", q), ("k", k), ("v", v), ("dout", dout))}
    arrays.update(words or {})
    fwd = fa2_forward_tf32.forward(alloc.to_kernel(q), arrays["k"], arrays["v"], prob, alloc, block_sizes)
    planned, real_plan = [], fa2_backward_tf32.plan

    def plan(*a, **kw):
        planned.append({**fa2_backward_tf32.default_features(), **(a[3] or {})})
        return real_plan(*a, **kw)

    fa2_backward_tf32.plan = plan
    try:
        with poison_outputs():
            grads = fa2_backward_tf32.backward(
                arrays["dout"],
                arrays["q"],
                arrays["k"],
                arrays["v"],
                fwd.out,
                fwd,
                prob,
                alloc,
                block_sizes,
                deterministic,
                config,
                features,
            )
    finally:
        fa2_backward_tf32.plan = real_plan
    return [to_host(g) for g in grads], planned[0]


def sharp_problem(rng, b, n, h, d, scale):
    """(dout, q, k, v) with q scaled by ``scale``: scores tau q.k of standard deviation ``scale`` (tau = 1/sqrt(d)), the
    sharp softmaxes of ``tests/kernels/test_sharp_softmax.py``."""
    q, k, v = make_qkv(rng, b, n, n, h, h, d)
    q = (q * np.float32(scale)).astype(np.float32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    return dout, q, k, v
