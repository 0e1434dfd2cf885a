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
"""

from __future__ import annotations

import numpy as np
from numba_flash_reference.common import causal_mask, default_scale, dropout_scale_matrix, kv_head

EPS32 = float(np.finfo(np.float32).eps)


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
            S = (Q @ K.T) * tau
            if causal:
                S = np.where(causal_mask(s_q, s_k), S, f(-np.inf))
            m = S.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, f(0))
            E = np.exp(S - m)
            lsum = E.sum(axis=1, keepdims=True)
            P = E / np.where(lsum > 0, lsum, f(1))
            if dropout_p > 0:
                P = P * dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p).astype(f)
            out[bi, :, hi] = P @ V
    return out


def ulp_floor(ref) -> float:
    """A few float32 rounding steps at the output's magnitude (see the module docstring)."""
    return 4 * EPS32 * max(1.0, float(np.max(np.abs(ref))) if np.size(ref) else 1.0)


def max_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def assert_error_rule(out, ref64, naive32, mult=2.0, what="output"):
    """max|out - ref| <= mult * max|naive32 - ref| + ulp_floor(ref); NaN never passes."""
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == np.shape(ref64), f"{what}: shape {out.shape} != reference {np.shape(ref64)}"
    assert np.all(np.isfinite(out)), f"{what}: {np.count_nonzero(~np.isfinite(out))} non-finite elements (unwritten or NaN)"
    err = max_err(out, ref64)
    base = max_err(naive32, ref64)
    bound = mult * base + ulp_floor(ref64)
    assert err <= bound, f"{what}: max error {err:.3e} > {mult} x float32-naive error {base:.3e} + floor {ulp_floor(ref64):.1e}"
    return err, base
