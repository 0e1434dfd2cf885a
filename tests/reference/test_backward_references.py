"""Claims about the backward references: FA1 Algorithm 3 (standard), FA1 Algorithm 4 (recomputation)
and FA2 Algorithm 2 (from the logsumexp), all in float64.

The chain of trust: Algorithm 3 is checked against central finite differences of the forward oracle
(Algorithm 0) and against torch autograd; Algorithms 4 and FA2-2 are checked against Algorithm 3 to
~1e-12 relative on ragged shapes, and against finite differences on one tiny case each. The IO counters
are checked against counts derived by hand from the paper's loops (Theorem 5).
"""

from __future__ import annotations

import math

from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward
from numba_flash_reference.alg4_backward import flash_backward
from numba_flash_reference.common import causal_mask, default_scale, dropout_scale_matrix, seq_blocks
from numba_flash_reference.fa2_backward import fa2_backward
from numba_flash_reference.hbm import HBMCounter

import numpy as np
import pytest
from attn_testing import make_qkv

EPS64 = float(np.finfo(np.float64).eps)
#: Float64 references agree to ~1e-12 relative (conventions note): each gradient entry is a sum of
#: O(N) products, each a handful of roundings (~1e-16 each); 1e-12 leaves a 1000x margin over the
#: ~1e-15 observed, while any algorithmic slip (a missing tau, Z or D_i) is O(1e-1) relative.
REL_TOL = 1e-12
FD_STEP = 1e-6


def grad_inputs(rng, b, s_q, s_k, h, h_k, d):
    """Fresh float64 q, k, v and an upstream gradient dO (never zeros)."""
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d, dtype=np.float64)
    dout = rng.standard_normal(q.shape)
    return q, k, v, dout


def run_backward(algo, dout, q, k, v, causal, dropout_p, seed, Br=None, Bc=None, M=None, counter=None):
    """Run one of the three backward references on the forward oracle's saved O, l, m, L."""
    if algo == "alg3":
        return standard_backward(dout, q, k, v, causal=causal, dropout_p=dropout_p, seed=seed, counter=counter)
    fwd = standard_attention(q, k, v, causal=causal, dropout_p=dropout_p, seed=seed)
    kw = dict(causal=causal, dropout_p=dropout_p, seed=seed, M=M, Br=Br, Bc=Bc, counter=counter)
    if algo == "alg4":
        return flash_backward(dout, q, k, v, fwd.O, fwd.l, fwd.m, **kw)
    return fa2_backward(dout, q, k, v, fwd.O, fwd.L, **kw)


def assert_close_rel(got, ref, what):
    """max|got - ref| <= REL_TOL * max(1, max|ref|); NaN never passes."""
    assert np.all(np.isfinite(got)), f"{what}: non-finite entries"
    err = float(np.max(np.abs(got - ref)))
    bound = REL_TOL * max(1.0, float(np.max(np.abs(ref))))
    assert err <= bound, f"{what}: max error {err:.3e} > {bound:.1e}"


# ----------------------------------------------------------------------------------------------
# Finite differences of the forward oracle
# ----------------------------------------------------------------------------------------------
def finite_difference_gradients(q, k, v, g, causal, dropout_p, seed):
    """Central differences of f(q, k, v) = sum(g * O) (O from Algorithm 0) w.r.t. every input entry.

    Returns the three gradients and the error bound of the method. With step h,
    ``|FD - f'| <= h^2/6 max|f'''| + delta/h``, where ``delta`` bounds the rounding error of one
    evaluation of f. Every row of O is a convex combination of rows of v scaled by at most
    ``1/(1-p)``, so ``|f| <= F := sum|g| max|v| / (1-p)``, and ``delta <= 64 eps F`` (a few dozen
    roundings per term at these tiny shapes). f is a composition of exp and bilinear maps whose
    logits move by at most ``c = tau max(|q|, |k|) d`` per unit step of one input, so
    ``max|f'''| <= 8 F (1 + c)^3`` (generous). With h = 1e-6 the rounding term (~1.4e-8 F) dominates
    the truncation term (~1e-10 F): about 5e-7 absolute at these shapes, against gradients of O(1)
    (a missing tau or D_i is an O(1e-1) error) and the ~1e-9 differences actually observed.
    """
    d = q.shape[-1]
    tau = default_scale(d)

    def f(qq, kk, vv):
        O = standard_attention(qq, kk, vv, causal=causal, dropout_p=dropout_p, seed=seed).O
        return float(np.sum(g * O))

    grads = []
    for which in range(3):
        args = [q.copy(), k.copy(), v.copy()]
        x = args[which]
        grad = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            x0 = x[idx]
            x[idx] = x0 + FD_STEP
            f_plus = f(*args)
            x[idx] = x0 - FD_STEP
            f_minus = f(*args)
            x[idx] = x0
            grad[idx] = (f_plus - f_minus) / (2 * FD_STEP)
        grads.append(grad)
    F = float(np.sum(np.abs(g))) * float(np.max(np.abs(v))) / (1.0 - dropout_p)
    c = tau * max(float(np.max(np.abs(q))), float(np.max(np.abs(k)))) * d
    bound = FD_STEP**2 / 6 * 8 * F * (1 + c) ** 3 + 64 * EPS64 * F / FD_STEP
    return grads, bound


def assert_matches_finite_differences(grads, fd, bound):
    for name, got, want in zip(("dq", "dk", "dv"), grads, fd):
        err = float(np.max(np.abs(got - want)))
        assert err <= bound, f"{name}: |analytic - finite difference| = {err:.3e} > bound {bound:.3e}"
        # The bound must be able to fail: it is far below the gradient's own size.
        assert bound < 1e-4 * max(1e-3, float(np.max(np.abs(want))))


@pytest.mark.parametrize("dropout_p", [0.0, 0.3], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "s_q, s_k, h, h_k",
    [(3, 5, 2, 1), (5, 2, 2, 2), (4, 4, 2, 1)],
    ids=["sq<sk-mqa", "sq>sk-mha", "square-mqa"],
)
def test_standard_backward_matches_finite_differences(rng, s_q, s_k, h, h_k, causal, dropout_p):
    q, k, v, _ = grad_inputs(rng, 1, s_q, s_k, h, h_k, 3)
    g = rng.standard_normal(q.shape)
    fd, bound = finite_difference_gradients(q, k, v, g, causal, dropout_p, seed=11)
    grads = standard_backward(g, q, k, v, causal=causal, dropout_p=dropout_p, seed=11)
    assert_matches_finite_differences(grads, fd, bound)


@pytest.mark.parametrize("algo", ["alg4", "fa2"])
def test_tiled_backward_matches_finite_differences(rng, algo):
    # causal with s_q > s_k (row 0 sees no key), dropout, MQA, ragged tiles
    q, k, v, _ = grad_inputs(rng, 1, 5, 4, 2, 1, 3)
    g = rng.standard_normal(q.shape)
    fd, bound = finite_difference_gradients(q, k, v, g, causal=True, dropout_p=0.25, seed=5)
    grads = run_backward(algo, g, q, k, v, causal=True, dropout_p=0.25, seed=5, Br=2, Bc=3)
    assert_matches_finite_differences(grads, fd, bound)


# ----------------------------------------------------------------------------------------------
# Algorithm 4 and FA2 Algorithm 2 equal Algorithm 3
# ----------------------------------------------------------------------------------------------
TILED_CASES = [
    # (b, s_q, s_k, h, h_k, d, causal, dropout_p, Br, Bc, M)
    pytest.param(1, 13, 13, 1, 1, 5, False, 0.0, 4, 4, None, id="square-ragged-tiles"),
    pytest.param(2, 7, 19, 2, 2, 3, True, 0.0, 3, 5, None, id="causal-sq<sk"),
    pytest.param(1, 19, 7, 2, 1, 7, True, 0.0, 4, 3, None, id="causal-sq>sk-masked-rows-mqa"),
    pytest.param(1, 17, 11, 6, 2, 5, True, 0.17, 5, 2, None, id="causal-dropout-gqa"),
    pytest.param(2, 9, 14, 3, 1, 4, False, 0.17, 2, 3, None, id="dropout-mqa"),
    pytest.param(1, 11, 11, 2, 2, 3, True, 0.5, 1, 1, None, id="1x1-tiles"),
    pytest.param(1, 12, 20, 2, 1, 4, True, 0.1, 16, 32, None, id="tiles-larger-than-n"),
    pytest.param(1, 23, 18, 2, 2, 4, False, 0.0, None, None, 48, id="alg1-block-sizes-M48"),
    pytest.param(1, 10, 9, 1, 1, 6, True, 0.0, None, None, None, id="default-M-one-block"),
]


@pytest.mark.parametrize("algo", ["alg4", "fa2"])
@pytest.mark.parametrize("b, s_q, s_k, h, h_k, d, causal, dropout_p, Br, Bc, M", TILED_CASES)
def test_tiled_backward_equals_standard_backward(rng, algo, b, s_q, s_k, h, h_k, d, causal, dropout_p, Br, Bc, M):
    q, k, v, dout = grad_inputs(rng, b, s_q, s_k, h, h_k, d)
    ref = standard_backward(dout, q, k, v, causal=causal, dropout_p=dropout_p, seed=7)
    got = run_backward(algo, dout, q, k, v, causal, dropout_p, seed=7, Br=Br, Bc=Bc, M=M)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert x.shape == r.shape and x.dtype == np.float64
        assert_close_rel(x, r, f"{algo} {name}")


@pytest.mark.parametrize("algo", ["alg3", "alg4", "fa2"])
def test_fully_masked_rows_get_zero_gradients_and_no_nan(rng, algo):
    # s_q = 9 > s_k = 4 with the bottom-right causal mask: rows 0..4 see no key.
    b, s_q, s_k, h, h_k, d = 1, 9, 4, 2, 1, 3
    q, k, v, dout = grad_inputs(rng, b, s_q, s_k, h, h_k, d)
    masked = ~causal_mask(s_q, s_k).any(axis=1)
    assert masked.tolist() == [True] * 5 + [False] * 4
    with np.errstate(all="raise"):  # not even a transient inf - inf or 0/0
        dq, dk, dv = run_backward(algo, dout, q, k, v, True, 0.2, seed=3, Br=2, Bc=3)
    assert np.all(dq[:, masked] == 0.0)
    # The other rows do get a gradient where one can exist: a row needs two visible keys (one key
    # gives P = 1, so dS = 0) and at least one key kept by dropout (else O_i = 0 and dS = 0).
    visible = causal_mask(s_q, s_k)
    for hi in range(h):
        kept = visible & (dropout_scale_matrix(3, hi, range(s_q), range(s_k), 0.2) > 0)
        live = (visible.sum(axis=1) >= 2) & (kept.sum(axis=1) >= 1)
        assert live.sum() >= 2
        assert np.all(np.abs(dq[0, live, hi]).sum(axis=-1) > 0)
    # A masked row's upstream gradient reaches nothing: changing it leaves dk, dv unchanged.
    dout2 = dout.copy()
    dout2[:, masked] = rng.standard_normal(dout2[:, masked].shape)
    dq2, dk2, dv2 = run_backward(algo, dout2, q, k, v, True, 0.2, seed=3, Br=2, Bc=3)
    np.testing.assert_array_equal(dq2, dq)
    assert_close_rel(dk2, dk, "dk")
    assert_close_rel(dv2, dv, "dv")


# ----------------------------------------------------------------------------------------------
# Dropout
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["alg3", "alg4", "fa2"])
def test_fully_dropped_key_gets_zero_dv_but_dk_through_the_normalizer(rng, algo):
    """A key dropped for every query row never reaches O, so dV_j = 0 exactly; but it still sits in the
    softmax's denominator, so dK_j = tau sum_i dS_ij q_i with dS_ij = P_ij (0 - D_i) = -P_ij D_i."""
    b, s_q, s_k, h, h_k, d, p, seed = 1, 3, 24, 1, 1, 4, 0.7, 2
    q, k, v, dout = grad_inputs(rng, b, s_q, s_k, h, h_k, d)
    Z = dropout_scale_matrix(seed, 0, range(s_q), range(s_k), p)
    dropped = np.all(Z == 0, axis=0)  # keys dropped for every query row (P = 0.343 per key)
    assert 0 < dropped.sum() < s_k, "the seed must drop some keys entirely and keep others"
    dq, dk, dv = run_backward(algo, dout, q, k, v, False, p, seed=seed, Br=2, Bc=5)

    assert np.all(dv[0, dropped, 0] == 0.0)
    assert np.all(np.abs(dv[0, ~dropped, 0]).sum(axis=-1) > 0)
    # The claim behind dV_j = 0: O does not depend on v_j at all.
    v2 = v.copy()
    v2[0, dropped, 0] += 1.0
    O1 = standard_attention(q, k, v, dropout_p=p, seed=seed).O
    O2 = standard_attention(q, k, v2, dropout_p=p, seed=seed).O
    np.testing.assert_array_equal(O1, O2)

    tau = default_scale(d)
    fwd = standard_attention(q, k, v, dropout_p=p, seed=seed, return_matrices=True)
    P = fwd.P[0, 0]  # (s_q, s_k), undropped
    D = np.sum(dout[0, :, 0] * fwd.O[0, :, 0], axis=1)  # D_i = rowsum(dO o O)
    dk_expected = tau * (-P[:, dropped] * D[:, None]).T @ q[0, :, 0]
    assert_close_rel(dk[0, dropped, 0], dk_expected, "dk of dropped keys")
    assert np.all(np.abs(dk_expected).sum(axis=-1) > 0)


def test_dropout_dv_is_dropped_probabilities_transposed_times_dout(rng):
    """dV = (P o Z)^T dO (Alg.4 L16), summed over a GQA group, and not P^T dO: the mask matters."""
    b, s_q, s_k, h, h_k, d, p, seed = 2, 6, 7, 4, 2, 3, 0.4, 9
    q, k, v, dout = grad_inputs(rng, b, s_q, s_k, h, h_k, d)
    fwd = standard_attention(q, k, v, causal=True, dropout_p=p, seed=seed, return_matrices=True)
    _, _, dv = standard_backward(dout, q, k, v, causal=True, dropout_p=p, seed=seed)
    expected = np.zeros_like(dv)
    undropped = np.zeros_like(dv)
    for bi in range(b):
        for hi in range(h):
            Z = dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), p)
            expected[bi, :, hi // 2] += (fwd.P[bi, hi] * Z).T @ dout[bi, :, hi]
            undropped[bi, :, hi // 2] += fwd.P[bi, hi].T @ dout[bi, :, hi]
    assert_close_rel(dv, expected, "dv")
    assert np.max(np.abs(dv - undropped)) > 0.1 * np.max(np.abs(dv))


# ----------------------------------------------------------------------------------------------
# torch autograd
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "s_q, s_k, h, h_k, causal, dropout_p",
    [(6, 6, 2, 2, False, 0.0), (5, 9, 4, 2, True, 0.0), (7, 8, 3, 1, True, 0.2)],
    ids=["mha", "causal-gqa-sq<sk", "causal-mqa-dropout"],
)
def test_standard_backward_equals_torch_autograd(rng, s_q, s_k, h, h_k, causal, dropout_p):
    torch = pytest.importorskip("torch")
    d, seed = 5, 4
    q, k, v, dout = grad_inputs(rng, 2, s_q, s_k, h, h_k, d)
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    # Naive attention in torch: GQA by repeating K/V heads (autograd sums over the repeats).
    kk = tk.repeat_interleave(h // h_k, dim=2)
    vv = tv.repeat_interleave(h // h_k, dim=2)
    S = torch.einsum("bqhd,bkhd->bhqk", tq, kk) * default_scale(d)
    if causal:  # bottom-right aligned, as an explicit boolean mask (s_q <= s_k: no empty rows)
        visible = torch.tensor(causal_mask(s_q, s_k))
        S = S.masked_fill(~visible, float("-inf"))
    P = torch.softmax(S, dim=-1)
    Z = np.zeros((2, h, s_q, s_k))  # (b, h, s_q, s_k): the forward's dropout scale matrices
    for bi, hi in np.ndindex(2, h):
        Z[bi, hi] = dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p)
    O = torch.einsum("bhqk,bkhd->bqhd", P * torch.tensor(Z), vv)
    O.backward(torch.tensor(dout))
    got = standard_backward(dout, q, k, v, causal=causal, dropout_p=dropout_p, seed=seed)
    for name, x, t in zip(("dq", "dk", "dv"), got, (tq, tk, tv)):
        assert_close_rel(x, t.grad.numpy(), name)


# ----------------------------------------------------------------------------------------------
# HBM access counts (Theorem 5)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_alg4_hbm_accesses_match_theorem_5_count(rng, causal):
    """K, V read once and dK, dV written once per KV head; Q, O, dO, l, m read and dQ read and written
    once per (query head, column block): Tc passes over the rows. FA1 masks elementwise, so causal
    changes nothing."""
    b, s_q, s_k, h, h_k, d, Br, Bc = 2, 10, 7, 4, 2, 3, 4, 3
    Tc = math.ceil(s_k / Bc)
    q, k, v, dout = grad_inputs(rng, b, s_q, s_k, h, h_k, d)
    c = HBMCounter()
    got = run_backward("alg4", dout, q, k, v, causal, 0.0, 0, Br=Br, Bc=Bc, counter=c)
    rows = b * h * s_q  # query rows over all batches and query heads
    keys = b * h_k * s_k
    assert c.by_name == {
        "K": (keys * d, 0),
        "V": (keys * d, 0),
        "Q": (Tc * rows * d, 0),
        "O": (Tc * rows * d, 0),
        "dO": (Tc * rows * d, 0),
        "l": (Tc * rows, 0),
        "m": (Tc * rows, 0),
        "dQ": (Tc * rows * d, Tc * rows * d),
        "dK": (0, keys * d),
        "dV": (0, keys * d),
    }
    ref = run_backward("alg4", dout, q, k, v, causal, 0.0, 0, Br=Br, Bc=Bc)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert_close_rel(x, r, name)  # counting changes nothing (contiguous copies may round differently)


def test_standard_backward_hbm_accesses_are_quadratic(rng):
    """Algorithm 3 reads or writes an N_q x N_k matrix 7 times per query head (P twice, dP twice,
    dS three times), on top of 4 N_q d + 4 N_k d accesses to N x d matrices."""
    b, s_q, s_k, h, h_k, d = 1, 6, 5, 3, 1, 2
    q, k, v, dout = grad_inputs(rng, b, s_q, s_k, h, h_k, d)
    c = HBMCounter()
    standard_backward(dout, q, k, v, causal=True, counter=c)
    nn = b * h * s_q * s_k
    rows, keys = b * h * s_q, b * h_k * s_k
    assert c.by_name == {
        "P": (2 * nn, 0),
        "dP": (nn, nn),
        "dS": (2 * nn, nn),
        "dO": (2 * rows * d, 0),
        "V": (keys * d, 0),
        "K": (keys * d, 0),
        "Q": (rows * d, 0),
        "dQ": (0, rows * d),
        "dK": (0, keys * d),
        "dV": (0, keys * d),
    }


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa2_backward_hbm_accesses_match_its_loops(rng, causal):
    """FA2: one D pre-pass over O, dO; K, V read once; per visited block Q_i, dO_i, L_i, D_i read and
    dQ_i read and written (the atomic add); with causal, only blocks with a visible entry are visited."""
    b, s_q, s_k, h, h_k, d, Br, Bc = 1, 11, 9, 2, 1, 3, 3, 2
    q, k, v, dout = grad_inputs(rng, b, s_q, s_k, h, h_k, d)
    c = HBMCounter()
    run_backward("fa2", dout, q, k, v, causal, 0.0, 0, Br=Br, Bc=Bc, counter=c)
    # rows of all visited (i, j) blocks, counted by brute force over the mask
    visited_rows = 0
    for rows in seq_blocks(s_q, Br):
        for cols in seq_blocks(s_k, Bc):
            if not causal or causal_mask(s_q, s_k, rows, cols).any():
                visited_rows += len(rows)
    if not causal:
        assert visited_rows == math.ceil(s_k / Bc) * s_q
    n = b * h * visited_rows
    keys = b * h_k * s_k
    assert c.by_name == {
        "O": (b * h * s_q * d, 0),
        "dO": (b * h * s_q * d + n * d, 0),
        "D": (n, b * h * s_q),
        "K": (keys * d, 0),
        "V": (keys * d, 0),
        "Q": (n * d, 0),
        "L": (n, 0),
        "dQ": (n * d, n * d),
        "dK": (0, keys * d),
        "dV": (0, keys * d),
    }


def test_backward_references_reject_mismatched_shapes(rng):
    q, k, v, dout = grad_inputs(rng, 1, 4, 5, 2, 1, 3)
    fwd = standard_attention(q, k, v)
    with pytest.raises(ValueError, match="dout"):
        standard_backward(dout[:, :3], q, k, v)
    with pytest.raises(ValueError, match="l must have shape"):
        flash_backward(dout, q, k, v, fwd.O, fwd.l[:, :1], fwd.m)
    with pytest.raises(ValueError, match="out must have"):
        fa2_backward(dout, q, k, v, fwd.O[..., :2], fwd.L)
