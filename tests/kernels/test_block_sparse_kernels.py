"""Block-sparse FlashAttention (FA1 Algorithm 5) as kernels: exact, skips zero tiles, and its HBM
traffic is Proposition 4's.

Oracle: dense attention in float64 with the block mask expanded to an element mask
(:func:`masked_attention`, every step in the dtype it is given; the float32 run of the same function
is the baseline of the error rule: 2x for outputs, 3x for gradients, see ``attn_testing``). The NumPy
reference :mod:`numba_flash_reference.alg5_block_sparse` (forward and backward) must agree with that
oracle to float64 rounding. Outputs are NaN-poisoned before every launch.

That zero tiles are *not loaded* is checked twice: K, V rows of key blocks that no tile uses are
filled with NaN (the result must not change by a bit), and the simulator runs the kernels on arrays
that count every element read and written (:class:`Counted`), which must equal the closed form
:func:`numba_flash.alg5_block_sparse.hbm_accesses` and differ from the paper's count
(:func:`numba_flash_reference.io_model.io_alg5_block_sparse`) by exactly the documented departures.

Simulator cases are tiny (N <= 48, d <= 16, tiles 8 or 16); ``gpu`` cases run real sizes.
"""

from __future__ import annotations

import threading

from numba_flash import _launch, alg1_forward, alg4_backward, alg5_block_sparse
from numba_flash.alg5_block_sparse import DEFAULT_BLOCK_SIZE, causal_block_mask, hbm_accesses
from numba_flash.block_sparse import (
    block_mask_shape,
    block_sparse_attention_backward_numpy,
    block_sparse_attention_numpy,
    check_block_mask,
)
from numba_flash_reference.alg4_backward import flash_backward
from numba_flash_reference.alg5_block_sparse import (
    butterfly_block_mask,
    expand_block_mask,
    flash_backward_alg5,
    flash_forward_alg5,
    io_alg5_backward,
)
from numba_flash_reference.common import causal_mask, default_scale, dropout_scale_matrix, kv_head
from numba_flash_reference.hbm import HBMCounter
from numba_flash_reference.io_model import IOCount, banded_block_mask, count_io, io_alg4_backward, io_alg5_block_sparse

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv


# ------------------------------------------------------------------------------------------------
# The dense masked oracle (float64) and its float32 baseline
# ------------------------------------------------------------------------------------------------
def element_mask(block_mask, b, h, s_q, s_k, block_size, causal):
    """bool (b, h, s_q, s_k): the block mask expanded to elements (M~_kl), AND the causal mask."""
    Br, Bc = block_size
    full = np.asarray(block_mask)
    full = full.reshape((1,) * (4 - full.ndim) + full.shape)
    visible = np.broadcast_to(expand_block_mask(full, s_q, s_k, Br, Bc), (b, h, s_q, s_k))
    return visible & causal_mask(s_q, s_k) if causal else visible


def masked_attention(q, k, v, visible, softmax_scale=None, dropout_p=0.0, seed=0, dout=None, dtype=np.float64):
    """Standard attention under the element mask ``visible``, and its backward, every step in ``dtype``.

    Returns ``(O, L)`` or, with ``dout``, ``(O, L, dq, dk, dv)``. Rows that see no key give ``O = 0``,
    ``L = +inf`` and zero gradients; ``dk, dv`` are summed over GQA groups.
    """
    f = dtype
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    tau = f(default_scale(d, softmax_scale))
    O = np.zeros((b, s_q, h, d), f)
    L = np.zeros((b, h, s_q), f)
    dq, dk, dv = np.zeros(q.shape, f), np.zeros(k.shape, f), np.zeros(v.shape, f)
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            Q, K, V = (x.astype(f) for x in (q[bi, :, hi], k[bi, :, hk], v[bi, :, hk]))
            S = np.where(visible[bi, hi], (Q @ K.T) * tau, f(-np.inf))
            m = S.max(axis=1, keepdims=True)
            m_safe = np.where(np.isfinite(m), m, f(0))
            E = np.exp(S - m_safe)
            lsum = E.sum(axis=1, keepdims=True)
            P = E / np.where(lsum > 0, lsum, f(1))
            Z = dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(s_k), dropout_p).astype(f)
            O[bi, :, hi] = (P * Z) @ V
            with np.errstate(divide="ignore"):
                L[bi, hi] = np.where(
                    lsum[:, 0] > 0, m_safe[:, 0] + np.log(np.where(lsum[:, 0] > 0, lsum[:, 0], f(1))), f(np.inf)
                )
            if dout is not None:
                dO = dout[bi, :, hi].astype(f)
                dv[bi, :, hk] += (P * Z).T @ dO
                dP = (dO @ V.T) * Z
                dS = P * (dP - np.sum(P * dP, axis=1, keepdims=True))
                dq[bi, :, hi] = tau * (dS @ K)
                dk[bi, :, hk] += tau * (dS.T @ Q)
    return (O, L) if dout is None else (O, L, dq, dk, dv)


def random_block_mask(rng, shape, density):
    """A random 0/1 block mask with at least one 1 in every row of blocks (and some empty columns likely)."""
    mask = rng.random(shape) < density
    rows = np.argwhere(~mask.any(axis=-1))
    for idx in rows:
        mask[tuple(idx) + (rng.integers(shape[-1]),)] = True
    return mask


# (batch, s_q, s_k, nheads, nheads_k, headdim, block_size, mask kind, causal, dropout_p)
FWD_CASES = {
    "ragged-shared-mask": (1, 37, 29, 1, 1, 9, (8, 8), "random", False, 0.0),
    "butterfly-tiles16": (1, 48, 48, 1, 1, 16, (16, 16), "butterfly", False, 0.0),
    "per-head-causal-sq<sk": (1, 19, 40, 2, 2, 8, (8, 16), "per-head", True, 0.0),
    "causal-sq>sk-rows-see-no-key": (1, 30, 17, 1, 1, 5, (8, 8), "random", True, 0.0),
    "dropout-gqa-per-batch-head": (2, 24, 21, 2, 1, 7, (8, 8), "per-batch-head", False, 0.2),
    "mqa-causal-dropout": (1, 25, 25, 2, 1, 6, (8, 8), "butterfly", True, 0.15),
}


def case_mask(rng, kind, b, h, s_q, s_k, block_size):
    Tr, Tc = block_mask_shape(s_q, s_k, block_size)
    if kind == "butterfly":
        return butterfly_block_mask(Tr, Tc)
    shape = {"random": (Tr, Tc), "per-head": (h, Tr, Tc), "per-batch-head": (b, h, Tr, Tc)}[kind]
    return random_block_mask(rng, shape, 0.45)


def run_forward_case(rng, case, seed=4321):
    b, s_q, s_k, h, h_k, d, bs, kind, causal, p = FWD_CASES[case]
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    mask = case_mask(rng, kind, b, h, s_q, s_k, bs)
    with _launch.poison_outputs():
        out, stats = block_sparse_attention_numpy(
            q, k, v, mask, dropout_p=p, causal=causal, block_size=bs, seed=seed, return_stats=True
        )
    visible = element_mask(mask, b, h, s_q, s_k, bs, causal)
    O64, L64 = masked_attention(q, k, v, visible, dropout_p=p, seed=seed)
    O32, L32 = masked_attention(q, k, v, visible, dropout_p=p, seed=seed, dtype=np.float32)
    return (q, k, v, mask, out, stats), (O64, L64, O32, L32), (bs, causal, p, seed)


@pytest.mark.parametrize("case", list(FWD_CASES))
def test_block_sparse_forward_equals_dense_masked_attention_within_twice_float32_error(rng, case):
    (q, k, v, mask, out, stats), (O64, L64, O32, L32), (bs, causal, p, seed) = run_forward_case(rng, case)
    assert out.dtype == np.float32
    assert_error_rule(out, O64, O32, what="O")
    inf = np.isinf(L64)
    np.testing.assert_array_equal(stats.lse[inf], L64[inf])  # rows that see no key: L = +inf exactly
    assert_error_rule(stats.lse[~inf], L64[~inf], L32[~inf], what="lse")
    # The NumPy reference of Algorithm 5 is the same function in float64.
    ref = flash_forward_alg5(q, k, v, mask, causal=causal, dropout_p=p, seed=seed, Br=bs[0], Bc=bs[1])
    np.testing.assert_allclose(ref.O, O64, rtol=1e-12, atol=1e-12)


BWD_CASES = [
    "ragged-shared-mask",
    "per-head-causal-sq<sk",
    "causal-sq>sk-rows-see-no-key",
    "dropout-gqa-per-batch-head",
]


@pytest.mark.parametrize("case", BWD_CASES)
def test_block_sparse_backward_equals_dense_masked_gradients_within_three_times_float32_error(rng, case):
    (q, k, v, mask, out, stats), _, (bs, causal, p, seed) = run_forward_case(rng, case)
    b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
    dout = rng.standard_normal(q.shape).astype(np.float32)
    with _launch.poison_outputs():
        dq, dk, dv = block_sparse_attention_backward_numpy(dout, q, k, v, out, stats)
    visible = element_mask(mask, b, h, s_q, k.shape[1], bs, causal)
    *_, dq64, dk64, dv64 = masked_attention(q, k, v, visible, dropout_p=p, seed=seed, dout=dout)
    *_, dq32, dk32, dv32 = masked_attention(q, k, v, visible, dropout_p=p, seed=seed, dout=dout, dtype=np.float32)
    for name, got, ref, naive in (("dq", dq, dq64, dq32), ("dk", dk, dk64, dk32), ("dv", dv, dv64, dv32)):
        assert_error_rule(got, ref, naive, mult=3.0, what=name)


def test_square_block_mask_that_is_not_symmetric_is_read_as_m_ij_forward_and_backward(rng):
    """M[i, j] = 1 lets query block i see key block j. A square mask with M != M^T, whose transpose is a
    valid mask too (a 1 in every row), catches a kernel that reads the mask transposed: a symmetric
    mask (all ones, butterfly) cannot, and a transposed read of a non-square mask may fail otherwise."""
    b, s, h, d, bs = 1, 30, 2, 8, (8, 8)  # Tr = Tc = 4, the last block ragged
    mask = np.array([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [1, 0, 0, 1]], dtype=bool)
    assert mask.shape == block_mask_shape(s, s, bs) and (mask != mask.T).any()
    assert mask.any(axis=1).all() and mask.T.any(axis=1).all()
    q, k, v = make_qkv(rng, b, s, s, h, h, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    with _launch.poison_outputs():
        out, stats = block_sparse_attention_numpy(q, k, v, mask, block_size=bs, return_stats=True)
        grads = block_sparse_attention_backward_numpy(dout, q, k, v, out, stats)
    ref = flash_forward_alg5(q, k, v, mask, Br=bs[0], Bc=bs[1])
    ref_grads = flash_backward_alg5(dout, q, k, v, ref.O, ref.l, ref.m, mask, Br=bs[0], Bc=bs[1])
    O32, L32, *grads32 = masked_attention(
        q, k, v, element_mask(mask, b, h, s, s, bs, False), dout=dout, dtype=np.float32
    )
    assert_error_rule(out, ref.O, O32, what="O")
    assert_error_rule(stats.lse, ref.L, L32, what="lse")
    for name, got, r, naive in zip(("dq", "dk", "dv"), grads, ref_grads, grads32):
        assert_error_rule(got, r, naive, mult=3.0, what=name)
    # M^T gives other outputs and gradients, far beyond the tolerances: the checks above tell M from M^T.
    ref_t = flash_forward_alg5(q, k, v, mask.T, Br=bs[0], Bc=bs[1])
    grads_t = flash_backward_alg5(dout, q, k, v, ref_t.O, ref_t.l, ref_t.m, mask.T, Br=bs[0], Bc=bs[1])
    assert np.abs(out - ref_t.O).max() > 0.1
    for got, r in zip(grads, grads_t):
        assert np.abs(got - r).max() > 0.1


def test_reference_block_sparse_backward_equals_dense_masked_gradients_and_alg4_when_dense(rng):
    b, s_q, s_k, h, h_k, d, Br, Bc = 2, 22, 17, 3, 1, 5, 4, 3
    q, k, v, dout = (
        x.astype(np.float64) for x in (*make_qkv(rng, b, s_q, s_k, h, h_k, d), rng.standard_normal((b, s_q, h, d)))
    )
    Tr, Tc = block_mask_shape(s_q, s_k, (Br, Bc))
    mask = random_block_mask(rng, (b, h, Tr, Tc), 0.4)
    fwd = flash_forward_alg5(q, k, v, mask, causal=True, dropout_p=0.25, seed=3, Br=Br, Bc=Bc)
    got = flash_backward_alg5(
        dout, q, k, v, fwd.O, fwd.l, fwd.m, mask, causal=True, dropout_p=0.25, seed=3, Br=Br, Bc=Bc
    )
    visible = element_mask(mask, b, h, s_q, s_k, (Br, Bc), True)
    *_, dq, dk, dv = masked_attention(q, k, v, visible, dropout_p=0.25, seed=3, dout=dout)
    for a, r in zip(got, (dq, dk, dv)):
        np.testing.assert_allclose(a, r, rtol=1e-11, atol=1e-12)
    ones = np.ones((Tr, Tc))
    fwd = flash_forward_alg5(q, k, v, ones, causal=True, Br=Br, Bc=Bc)
    a5 = flash_backward_alg5(dout, q, k, v, fwd.O, fwd.l, fwd.m, ones, causal=True, Br=Br, Bc=Bc)
    a4 = flash_backward(dout, q, k, v, fwd.O, fwd.l, fwd.m, causal=True, Br=Br, Bc=Bc)
    for x, y in zip(a5, a4):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------------------------------------
# Zero tiles are skipped: NaN-poisoned keys stay out, and the counted HBM traffic says so
# ------------------------------------------------------------------------------------------------
def test_keys_of_empty_block_columns_are_never_read_nan_poison_changes_nothing(rng):
    b, s_q, s_k, h, d, bs = 1, 24, 35, 2, 6, (8, 8)
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h, d)
    Tr, Tc = block_mask_shape(s_q, s_k, bs)
    mask = random_block_mask(rng, (Tr, Tc), 0.5)
    mask[:, 1] = False  # key block 1 (rows 8..15) and the ragged last one: used by no tile
    mask[:, Tc - 1] = False
    mask[:, 0] = True
    kp, vp = k.copy(), v.copy()
    for j in (1, Tc - 1):
        kp[:, j * 8 : (j + 1) * 8] = np.nan
        vp[:, j * 8 : (j + 1) * 8] = np.nan
    dout = rng.standard_normal(q.shape).astype(np.float32)
    results = []
    for kk, vv in ((k, v), (kp, vp)):
        with _launch.poison_outputs():
            out, stats = block_sparse_attention_numpy(
                q, kk, vv, mask, causal=True, dropout_p=0.1, seed=9, block_size=bs, return_stats=True
            )
            grads = block_sparse_attention_backward_numpy(dout, q, kk, vv, out, stats)
        results.append((out, stats.lse, *grads))
    for name, clean, poisoned in zip(("O", "lse", "dq", "dk", "dv"), *results):
        np.testing.assert_array_equal(poisoned, clean, err_msg=f"{name} changed when unused K, V were NaN")
    dk, dv = results[1][3], results[1][4]
    for j in (1, Tc - 1):  # keys no tile sees have exactly zero gradient
        assert np.all(dk[:, j * 8 : (j + 1) * 8] == 0) and np.all(dv[:, j * 8 : (j + 1) * 8] == 0)


class Counted(np.ndarray):
    """An HBM array in the simulator: every element the kernel reads or writes is counted.

    The simulator copies kernel arguments (keeping the array's type), so the counter and the name live
    on a per-array subclass (:func:`counted`), not on the instance.
    """

    counter: HBMCounter = None
    name = "?"
    lock = threading.Lock()  # the simulator's threads count concurrently

    def __getitem__(self, idx):
        out = super().__getitem__(idx)
        if type(self).counter is not None and np.ndim(out) == 0:
            with Counted.lock:
                type(self).counter.read(1, type(self).name)
        return out

    def __setitem__(self, idx, value):
        super().__setitem__(idx, value)
        if type(self).counter is not None:
            with Counted.lock:
                type(self).counter.write(int(np.size(self.view(np.ndarray)[idx])), type(self).name)


def counted(x, counter, name):
    cls = type(f"Counted_{name}", (Counted,), {"counter": counter, "name": name})
    return np.ascontiguousarray(x).view(cls)


class CountingAllocator(_launch.Allocator):
    """Outputs are counted arrays too, named in allocation order."""

    def __init__(self, like, counter, names):
        super().__init__(like)
        self.counter, self.names = counter, list(names)

    def empty(self, shape, dtype=np.float32):
        return counted(super().empty(shape, dtype), self.counter, self.names.pop(0) if self.names else "scratch")


def counted_run(q, k, v, mask_arr, block_size, causal=False, dout=None):
    """HBM accesses the kernels make, counted element by element: (forward IOCount, backward IOCount or None)."""
    prob = _launch.check_attention_args(q, k, v, causal=causal)
    mask = check_block_mask(mask_arr, prob, block_size)
    c = HBMCounter()
    fwd = alg5_block_sparse.forward(
        counted(q, c, "Q"),
        counted(k, c, "K"),
        counted(v, c, "V"),
        mask,
        prob,
        CountingAllocator(q, c, ["O", "l", "m", "L"]),
    )
    fwd_count = IOCount.from_counter(c)
    if dout is None:
        return fwd_count, None
    c2 = HBMCounter()
    args = [counted(x, c2, n) for x, n in ((dout, "dO"), (q, "Q"), (k, "K"), (v, "V"), (fwd.out, "O"))]
    stats = _launch.ForwardOutput(out=None, lse=None, m=counted(fwd.m, c2, "m"), l=counted(fwd.l, c2, "l"))
    alg5_block_sparse.backward(*args, stats, mask, prob, CountingAllocator(q, c2, ["dQ", "dK", "dV"]))
    return fwd_count, IOCount.from_counter(c2)


@pytest.mark.simulator_only  # element counts come from the simulator's counting arrays
def test_counted_hbm_accesses_of_both_kernels_equal_the_closed_form_and_proposition_4(rng):
    b, s_q, s_k, h, d, bs = 1, 29, 36, 2, 4, (8, 8)
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    Tr, Tc = block_mask_shape(s_q, s_k, bs)
    mask = random_block_mask(rng, (h, Tr, Tc), 0.4)
    mask[:, :, 2] = False  # an empty key block: its K, V are never loaded
    fwd, bwd = counted_run(q, k, v, mask, bs, causal=True, dout=dout)
    prob = _launch.check_attention_args(q, k, v, causal=True)
    bm = check_block_mask(mask, prob, bs)
    assert fwd == hbm_accesses(bm, prob, "forward")
    assert bwd == hbm_accesses(bm, prob, "backward")
    # Against the paper's count (Prop. 4, io_model): the same per-tile traffic; the kernel skips the K, V
    # of empty columns and the first-visit reads of O, l, m, and writes L once per row.
    paper = io_alg5_block_sparse(s_q, d, mask[None], Br=bs[0], Bc=bs[1], N_k=s_k, b=b, h=h).by_name
    got = fwd.by_name
    nonempty_keys = int((mask.any(axis=1) * np.minimum(8, s_k - 8 * np.arange(Tc))).sum())
    assert got["Q"] == paper["Q"] and got["O"][1] == paper["O"][1] and got["l"][1] == paper["l"][1]
    assert paper["O"][0] - got["O"][0] == b * h * s_q * d
    assert paper["l"][0] - got["l"][0] == paper["m"][0] - got["m"][0] == b * h * s_q
    assert (
        got["K"] == got["V"] == (nonempty_keys * d, 0)
        and paper["K"][0] - got["K"][0] == (b * h * s_k - nonempty_keys) * d
    )
    assert got["L"] == (0, b * h * s_q)
    # The backward reference's count (Alg.4 on the non-zero tiles) has the same per-tile terms.
    ref_bwd = io_alg5_backward(s_q, d, mask[None], Br=bs[0], Bc=bs[1], N_k=s_k, b=b, h=h).by_name
    for name in ("Q", "O", "dO", "l", "m"):
        assert bwd.by_name[name] == ref_bwd[name], name
    assert ref_bwd["dQ"][0] - bwd.by_name["dQ"][0] == b * h * s_q * d and bwd.by_name["dQ"][1] == ref_bwd["dQ"][1]


@pytest.mark.simulator_only  # element counts come from the simulator's counting arrays
def test_counted_per_tile_traffic_is_proportional_to_the_nonzero_blocks(rng):
    # Proposition 4: HBM accesses Theta(N d + N^2 d^2 s / M): the per-tile part scales with s exactly.
    N, d, bs = 32, 4, (8, 8)
    q, k, v = make_qkv(rng, 1, N, N, 1, 1, d)
    per_tile = {}
    for nnz in (1, 3):
        fwd, _ = counted_run(q, k, v, banded_block_mask(4, 4, nnz / 4), bs)
        per_tile[nnz] = fwd.by_name["Q"][0] + fwd.by_name["O"][1] + fwd.by_name["l"][1] + fwd.by_name["m"][1]
    assert per_tile[3] == 3 * per_tile[1] == 3 * N * (2 * d + 2)  # Q_i read, O_i, l_i, m_i written per tile


def test_reference_backward_hbm_count_equals_closed_form_and_alg4_when_dense(rng):
    b, s_q, s_k, h, h_k, d, Br, Bc = 1, 13, 11, 2, 1, 3, 4, 5
    q, k, v, dout = (
        x.astype(np.float64) for x in (*make_qkv(rng, b, s_q, s_k, h, h_k, d), rng.standard_normal((b, s_q, h, d)))
    )
    Tr, Tc = block_mask_shape(s_q, s_k, (Br, Bc))
    mask = random_block_mask(rng, (b, h, Tr, Tc), 0.5)
    fwd = flash_forward_alg5(q, k, v, mask, Br=Br, Bc=Bc)
    _, c = count_io(flash_backward_alg5, dout, q, k, v, fwd.O, fwd.l, fwd.m, mask, Br=Br, Bc=Bc)
    assert c == io_alg5_backward(s_q, d, mask, Br=Br, Bc=Bc, N_k=s_k, b=b, h=h, h_k=h_k)
    assert io_alg5_backward(s_q, d, np.ones((Tr, Tc)), Br=Br, Bc=Bc, N_k=s_k, b=b, h=h, h_k=h_k) == io_alg4_backward(
        s_q, d, Br=Br, Bc=Bc, N_k=s_k, b=b, h=h, h_k=h_k
    )


# ------------------------------------------------------------------------------------------------
# Masks: the butterfly pattern, the causal block mask, bad masks
# ------------------------------------------------------------------------------------------------
def test_butterfly_mask_is_the_union_of_butterfly_factor_supports():
    m = butterfly_block_mask(16)
    assert np.array_equal(m, m.T) and m.diagonal().all()
    assert (m.sum(axis=1) == 1 + 4).all()  # diagonal + one partner per factor (log2 16 = 4)
    for i in range(16):
        for j in range(16):
            x = i ^ j
            assert m[i, j] == (x & (x - 1) == 0)  # 0 or a power of two
    assert (butterfly_block_mask(16, n_factors=2).sum(axis=1) == 3).all()
    g = butterfly_block_mask(8, n_factors=1, global_blocks=1)
    # row 0 and column 0 (15 blocks), row 1's diagonal (its partner 0 is in column 0), rows 2-7 diagonal + partner
    assert g[0].all() and g[:, 0].all() and g.sum() == 15 + 1 + 6 * 2
    assert butterfly_block_mask(5, 7).any(axis=1).all()  # non-square: every row keeps a block
    # density ~ log2(T) / T: Proposition 4's s = N^-1 log N case
    dens = [butterfly_block_mask(t).mean() for t in (16, 64, 256)]
    assert dens == [5 / 16, 7 / 64, 9 / 256]


def test_causal_block_mask_skips_tiles_above_the_diagonal_without_changing_the_result(rng):
    s_q, s_k, d, bs = 30, 30, 6, (8, 8)
    q, k, v = make_qkv(rng, 1, s_q, s_k, 1, 1, d)
    cm = causal_block_mask(s_q, s_k, bs)
    assert cm.astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert causal_block_mask(21, 30, bs).astype(int).tolist() == [
        [1, 1, 1, 0],
        [1, 1, 1, 1],
        [1, 1, 1, 1],
    ]  # bottom-right
    with _launch.poison_outputs():
        a = block_sparse_attention_numpy(q, k, v, np.ones_like(cm), causal=True, block_size=bs)
        b = block_sparse_attention_numpy(q, k, v, cm, causal=True, block_size=bs)
    np.testing.assert_array_equal(a, b)  # the skipped tiles held only -inf scores


def test_a_different_dropout_seed_is_a_different_mask(rng):
    q, k, v = make_qkv(rng, 1, 16, 16, 1, 1, 4)
    mask = np.ones((2, 2), bool)
    a = block_sparse_attention_numpy(q, k, v, mask, dropout_p=0.4, seed=7, block_size=(8, 8))
    b = block_sparse_attention_numpy(q, k, v, mask, dropout_p=0.4, seed=8, block_size=(8, 8))
    assert np.max(np.abs(a - b)) > 1e-2


@pytest.fixture
def no_launch(monkeypatch):
    def launched(*args, **kwargs):
        raise AssertionError("a kernel was reached: the argument check came too late")

    monkeypatch.setattr(alg5_block_sparse, "forward", launched)
    monkeypatch.setattr(alg5_block_sparse, "backward", launched)


BAD_MASKS = {
    "float-dtype": (lambda m: m.astype(np.float32), TypeError, "block_mask must have a bool or integer dtype"),
    "not-an-array": (lambda m: m.tolist(), TypeError, "block_mask must be a NumPy array or torch tensor"),
    "wrong-Tc": (lambda m: m[:, :-1], ValueError, r"block_mask must end in \(Tr, Tc\) = \(3, 2\)"),
    "1-d": (lambda m: m[0], ValueError, "block_mask must have shape"),
    "5-d": (lambda m: m[None, None, None], ValueError, "block_mask must have shape"),
    "3-heads": (lambda m: np.stack([m] * 3), ValueError, "block_mask has 3 heads; it must have 1 or nheads = 2"),
    "batch-2": (lambda m: np.stack([np.stack([m] * 2)] * 2), ValueError, "block_mask has batch dimension 2"),
    "value-2": (lambda m: m.astype(np.int32) * 2, ValueError, "block_mask must hold only 0 and 1"),
    "empty-row": (
        lambda m: np.where(np.arange(3)[:, None] == 1, False, m),
        ValueError,
        r"block_mask: row block 1 \(query rows 8\.\.15\) has no non-zero block",
    ),
    "empty-row-of-one-head": (
        lambda m: np.stack([m, np.where(np.arange(3)[:, None] == 2, 0, m.astype(np.int8))]),
        ValueError,
        r"row block 2 \(query rows 16\.\.19\), head 1 has no non-zero block",
    ),
}


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize("bad", list(BAD_MASKS))
def test_bad_block_mask_raises_naming_block_mask_before_any_launch(rng, bad):
    q, k, v = make_qkv(rng, 1, 20, 16, 2, 2, 4)
    make, exc, match = BAD_MASKS[bad]
    mask = np.ones((3, 2), dtype=bool)  # (ceil(20/8), ceil(16/8)) with block_size (8, 8)
    with pytest.raises(exc, match=match):
        block_sparse_attention_numpy(q, k, v, make(mask), block_size=(8, 8))


@pytest.mark.usefixtures("no_launch")
def test_block_size_that_does_not_fit_the_shared_memory_raises_naming_block_size(rng):
    q, k, v = make_qkv(rng, 1, 16, 16, 1, 1, 128)
    for bs, match in (
        ((64, 64), "block_size .* shared memory"),
        ((0, 8), "block_size: Br must be a positive integer"),
        ((8,), "block_size must be a pair"),
    ):
        with pytest.raises(ValueError, match=match):
            block_sparse_attention_numpy(q, k, v, np.ones((1, 1), bool), block_size=bs)


def test_default_block_size_fits_both_kernels_up_to_headdim_128():
    for d in (1, 16, 64, 80, 128):
        assert alg5_block_sparse.check_block_size(DEFAULT_BLOCK_SIZE, d) == DEFAULT_BLOCK_SIZE
    assert alg5_block_sparse.check_block_size((32, 32), 64) == (32, 32)


# ------------------------------------------------------------------------------------------------
# torch: autograd through both kernels
# ------------------------------------------------------------------------------------------------
def test_block_sparse_attn_func_is_differentiable_and_matches_the_numpy_twin(rng):
    torch = pytest.importorskip("torch")
    from numba_flash import block_sparse_attn_func

    b, s_q, s_k, h, h_k, d, bs = 1, 20, 24, 2, 1, 8, (8, 8)
    qn, kn, vn = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    mask = random_block_mask(rng, (h, 3, 3), 0.5)
    q, k, v = (torch.from_numpy(x).requires_grad_(True) for x in (qn, kn, vn))
    out, lse, none = block_sparse_attn_func(
        q,
        k,
        v,
        torch.from_numpy(mask.astype(np.uint8)),
        causal=True,
        dropout_p=0.1,
        return_attn_probs=True,
        block_size=bs,
        seed=11,
    )
    assert none is None and lse.dtype == torch.float32 and not lse.requires_grad
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(torch.from_numpy(g))
    on, stats = block_sparse_attention_numpy(
        qn, kn, vn, mask, causal=True, dropout_p=0.1, block_size=bs, seed=11, return_stats=True
    )
    grads = block_sparse_attention_backward_numpy(g, qn, kn, vn, on, stats)
    np.testing.assert_array_equal(out.detach().numpy(), on)
    np.testing.assert_array_equal(lse.numpy(), stats.lse)
    for t, n in zip((q, k, v), grads):
        np.testing.assert_array_equal(t.grad.numpy(), n)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        block_sparse_attn_func(qn, k, v, mask)


# ------------------------------------------------------------------------------------------------
# Traceability of the kernel module (the rules of tests/test_traceability.py)
# ------------------------------------------------------------------------------------------------
def test_block_sparse_kernels_are_the_alg1_and_alg4_kernels_with_the_mask_test_tagged_alg5_l8():
    """Algorithm 5 has no kernel of its own: it is one body with Algorithms 1-2 (alg1_forward.py, which
    tags every work line of Alg.5: tests/test_traceability.py's TAGGED_FILES) and with Algorithm 4
    (alg4_backward.py). In both, the Alg.5 L8 tag sits inside the kernel on the line before the test of
    the block mask, and alg5_block_sparse.py compiles no kernel."""
    import test_traceability as tt

    assert ("Alg.5", "numba_flash/alg1_forward.py") in tt.TAGGED_FILES
    for name in ("alg1_forward.py", "alg4_backward.py"):
        path = tt.ROOT / "numba_flash" / name
        tags, errors = tt.parse_tags(path)
        assert not errors and not tt.order_errors(tags, "Alg.5"), name
        lines = path.read_text(encoding="utf-8").splitlines()
        l8 = [t.lineno for t in tags if (t.alg, t.first) == ("Alg.5", 8)]
        assert len(l8) == 1, (name, l8)
        assert lines[l8[0]].strip() == "if SPARSE and gmask[mb, mh, i, j] == 0:", (name, lines[l8[0]])
        assert lines[l8[0] + 1].strip() == "continue", name
        spans = [s for s in tt.tag_spans(path.read_text(encoding="utf-8")) if s.lineno == l8[0]]
        assert spans and "gmask" in spans[0].code, name
    src = (tt.ROOT / "numba_flash" / "alg5_block_sparse.py").read_text(encoding="utf-8")
    assert "cuda.jit" not in src and "syncthreads" not in src


# ------------------------------------------------------------------------------------------------
# GPU: real sizes
# ------------------------------------------------------------------------------------------------
# (batch, s_q, s_k, nheads, nheads_k, headdim, block_size, mask kind, causal, dropout_p)
GPU_CASES = {
    "N1024-d64-butterfly-32x32": (2, 1024, 1024, 4, 4, 64, (32, 32), "butterfly", False, 0.0),
    "N2048-d128-causal-per-head": (1, 2048, 2048, 2, 2, 128, (16, 16), "per-head", True, 0.0),
    "ragged-1000x1023-d96-gqa-dropout": (2, 1000, 1023, 6, 2, 96, (16, 16), "per-batch-head", True, 0.17),
    "N513-d37-mqa-random": (1, 513, 700, 3, 1, 37, (32, 16), "random", False, 0.1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_block_sparse_forward_and_backward_equal_dense_masked_attention_at_real_sizes_on_gpu(rng, case, monkeypatch):
    monkeypatch.setitem(FWD_CASES, case, GPU_CASES[case])
    (q, k, v, mask, out, stats), (O64, L64, O32, L32), (bs, causal, p, seed) = run_forward_case(rng, case)
    assert_error_rule(out, O64, O32, what="O")
    b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
    dout = rng.standard_normal(q.shape).astype(np.float32)
    with _launch.poison_outputs():
        dq, dk, dv = block_sparse_attention_backward_numpy(dout, q, k, v, out, stats)
    visible = element_mask(mask, b, h, s_q, k.shape[1], bs, causal)
    *_, dq64, dk64, dv64 = masked_attention(q, k, v, visible, dropout_p=p, seed=seed, dout=dout)
    *_, dq32, dk32, dv32 = masked_attention(q, k, v, visible, dropout_p=p, seed=seed, dout=dout, dtype=np.float32)
    for name, got, ref, naive in (("dq", dq, dq64, dq32), ("dk", dk, dk64, dk32), ("dv", dv, dv64, dv32)):
        assert_error_rule(got, ref, naive, mult=3.0, what=name)


@pytest.mark.gpu
def test_block_sparse_attn_func_on_cuda_tensors_matches_the_numpy_path_on_gpu(rng):
    torch = pytest.importorskip("torch")
    from numba_flash import block_sparse_attn_func

    qn, kn, vn = make_qkv(rng, 2, 512, 512, 4, 2, 64)
    mask = butterfly_block_mask(16)
    q, k, v = (torch.from_numpy(x).cuda().requires_grad_(True) for x in (qn, kn, vn))
    out = block_sparse_attn_func(q, k, v, torch.from_numpy(mask).cuda(), block_size=(32, 32), causal=True)
    out.sum().backward()
    ref = block_sparse_attention_numpy(qn, kn, vn, mask, block_size=(32, 32), causal=True)
    np.testing.assert_allclose(out.detach().cpu().numpy(), ref, rtol=0, atol=1e-6)
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.gpu
def test_block_sparse_kernels_fit_48kb_shared_memory_and_do_not_spill_on_gpu(rng):
    from numba_flash.runtime import resources as _inspect

    for d, bs in ((64, (32, 32)), (128, DEFAULT_BLOCK_SIZE)):
        q, k, v = make_qkv(rng, 1, 64, 64, 1, 1, d)
        mask = np.ones(block_mask_shape(64, 64, bs), bool)
        out, stats = block_sparse_attention_numpy(q, k, v, mask, block_size=bs, return_stats=True)
        block_sparse_attention_backward_numpy(q, q, k, v, out, stats)
        ty, tx = alg5_block_sparse.thread_layout()
        fwd_kernel = alg1_forward.forward_kernel(*bs, d, False, False, ty, tx, alg5_block_sparse.use_shuffles(tx), True)
        cfg = alg5_block_sparse.backward_config(*bs, d)
        for disp, threads in (
            (fwd_kernel, ty * tx),
            (alg4_backward.alg4_kernel(cfg, False, False, False, True), cfg.threads),
        ):
            rep = _inspect.kernel_report(disp, threads)
            assert rep["shared_mem_per_block"] <= _launch.STATIC_SMEM_BYTES
            assert rep["local_mem_per_thread"] == 0, rep
