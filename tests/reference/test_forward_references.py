"""Every tiled forward reference (FA1 Algorithms 1, 2, 5 and FA2 Algorithm 1) computes exactly what
standard attention (Algorithm 0) computes: Theorem 1's "exact attention", checked in float64.

Tolerance: float64 references agree with each other to ~1e-12 relative (the conventions note). Both
sides are float64 sums of at most a few hundred terms; the tiled ones rescale by exp(m_old - m_new)
<= 1 at most Tc times, each step adding an ulp or so, so the disagreement is ~1e-15 x (terms) ~ 1e-14.
The bound 1e-12 x max(1, max|ref|) is far above that and far below any algorithmic error (a missing
rescale, a mask off by one, a wrong KV head are all O(1e-2) or more on these inputs).
"""

import math

from numba_flash_reference.alg0_standard import row_softmax, standard_attention
from numba_flash_reference.alg1_forward import flash_forward_alg1
from numba_flash_reference.alg2_forward import flash_forward_alg2
from numba_flash_reference.alg5_block_sparse import expand_block_mask, flash_forward_alg5
from numba_flash_reference.common import (
    DEFAULT_SRAM_ELEMENTS,
    block_sizes,
    causal_mask,
    default_scale,
    dropout_scale_matrix,
    kv_head,
)
from numba_flash_reference.fa2_forward import flash_forward_fa2

import numpy as np
import pytest
from attn_testing import make_qkv

RTOL = 1e-12

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim): ragged lengths, s_q != s_k both ways,
# odd head dims 1, 3, 7, 33, GQA (6 heads on 2 KV heads) and MQA (6 on 1)
SHAPES = [
    (1, 17, 17, 1, 1, 1),
    (2, 13, 29, 2, 1, 3),
    (1, 29, 13, 3, 3, 7),
    (1, 9, 16, 6, 2, 33),
    (2, 20, 11, 6, 1, 5),
]
# (Br, Bc): 1, 3, 8, 16, and None = the formula of Alg.1 L1 with the default M
BLOCKS = [(1, 1), (3, 3), (8, 3), (3, 8), (16, 16), (None, None)]


def assert_close(a, b, what=""):
    """|a - b| <= 1e-12 max(1, max|b|) on finite entries; identical +-inf pattern; never NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert not np.isnan(a).any(), f"{what}: {np.isnan(a).sum()} NaN"
    np.testing.assert_array_equal(np.isposinf(a), np.isposinf(b), err_msg=f"{what}: +inf pattern differs")
    np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b), err_msg=f"{what}: -inf pattern differs")
    fin = np.isfinite(b)
    scale = max(1.0, float(np.max(np.abs(b[fin]))) if fin.any() else 1.0)
    np.testing.assert_allclose(a[fin], b[fin], rtol=0, atol=RTOL * scale, err_msg=what)


def tiled_outputs(q, k, v, Br, Bc, **kw):
    """(name, result) for the three references that implement Algorithm 2's semantics."""
    b, s_q, h, d = q.shape
    s_k = k.shape[1]
    br, bc = block_sizes(d, None, Br, Bc)
    ones = np.ones((math.ceil(s_q / br), math.ceil(s_k / bc)))
    return [
        ("alg2", flash_forward_alg2(q, k, v, Br=Br, Bc=Bc, **kw)),
        ("alg5 (all-ones mask)", flash_forward_alg5(q, k, v, ones, Br=Br, Bc=Bc, **kw)),
        ("fa2", flash_forward_fa2(q, k, v, Br=Br, Bc=Bc, **kw)),
    ]


def check_against_standard(q, k, v, Br, Bc, **kw):
    ref = standard_attention(q, k, v, **kw)
    for name, out in tiled_outputs(q, k, v, Br, Bc, **kw):
        assert_close(out.O, ref.O, f"{name}: O")
        assert_close(out.L, ref.L, f"{name}: L")
        if hasattr(out, "m"):  # FA1 stores m and l; FA2 only L
            assert_close(out.m, ref.m, f"{name}: m")
            assert_close(out.l, ref.l, f"{name}: l")
            assert out.seed == kw.get("seed", 0)
    return ref


@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*s))
def test_tiled_forward_equals_standard_attention(rng, shape, causal, dropout_p):
    b, s_q, s_k, h, h_k, d = shape
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d, dtype=np.float64)
    seed = int(rng.integers(2**32))
    for Br, Bc in [(3, 8), (None, None)]:
        check_against_standard(q, k, v, Br, Bc, causal=causal, dropout_p=dropout_p, seed=seed)


@pytest.mark.parametrize("Br,Bc", BLOCKS, ids=lambda x: str(x))
def test_tiled_forward_is_exact_for_every_block_size(rng, Br, Bc):
    q, k, v = make_qkv(rng, 1, 19, 23, 2, 1, 7, dtype=np.float64)
    check_against_standard(q, k, v, Br, Bc, causal=True, dropout_p=0.3, seed=5, softmax_scale=0.7)


@pytest.mark.parametrize("Br,Bc", [(1, 1), (3, 8), (8, 3), (None, None)], ids=lambda x: str(x))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*s))
def test_alg1_equals_unscaled_standard_attention(rng, shape, Br, Bc):
    """Algorithm 1 has no scale: it returns softmax(Q K^T) V."""
    b, s_q, s_k, h, h_k, d = shape
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d, dtype=np.float64)
    ref = standard_attention(q, k, v, softmax_scale=1.0)
    out = flash_forward_alg1(q, k, v, Br=Br, Bc=Bc)
    for name in ("O", "m", "l", "L"):
        assert_close(getattr(out, name), getattr(ref, name), f"alg1: {name}")
    # and with the scale passed through, it matches the default-scaled oracle
    assert_close(
        flash_forward_alg1(q, k, v, Br=Br, Bc=Bc, softmax_scale=None).O, standard_attention(q, k, v).O, "alg1 tau"
    )


def test_fully_masked_rows_give_zero_output_and_infinite_lse(rng):
    """Causal with s_q > s_k: the first s_q - s_k rows see no key (bottom-right alignment)."""
    b, s_q, s_k, h, d = 2, 23, 9, 2, 5
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h, d, dtype=np.float64)
    hidden = s_q - s_k  # rows 0 .. s_q - s_k - 1 see nothing
    for Br, Bc in [(4, 3), (1, 1), (None, None)]:
        ref = check_against_standard(q, k, v, Br, Bc, causal=True, dropout_p=0.2, seed=1)
        for name, out in tiled_outputs(q, k, v, Br, Bc, causal=True, dropout_p=0.2, seed=1):
            assert np.all(out.O[:, :hidden] == 0.0), name
            assert np.all(out.L[:, :, :hidden] == np.inf), name
            assert np.all(np.isfinite(out.L[:, :, hidden:])), name
            assert np.all(np.abs(out.O[:, hidden:]).sum(axis=-1) > 0), name  # the visible rows were written
            if hasattr(out, "m"):
                assert np.all(out.m[:, :, :hidden] == -np.inf) and np.all(out.l[:, :, :hidden] == 0.0), name
        assert np.all(ref.O[:, :hidden] == 0.0)


def test_fa2_lse_equals_logsumexp_of_masked_scaled_scores(rng):
    """L = log sum_j exp(tau q_i . k_j) over the visible keys, computed here without any max trick."""
    b, s_q, s_k, h, h_k, d = 1, 21, 14, 4, 2, 6
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d, dtype=np.float64)
    tau = 0.9
    for causal in (False, True):
        out = flash_forward_fa2(q, k, v, softmax_scale=tau, causal=causal, Br=4, Bc=5)
        for bi in range(b):
            for hi in range(h):
                hk = kv_head(hi, h, h_k)
                E = np.exp(tau * q[bi, :, hi] @ k[bi, :, hk].T)  # |S| < ~20 here: no overflow
                if causal:
                    E = E * causal_mask(s_q, s_k)
                with np.errstate(divide="ignore"):
                    expected = np.log(E.sum(axis=1))  # log(0) = -inf on rows that see no key ...
                expected = np.where(np.isneginf(expected), np.inf, expected)  # ... whose L is +inf by convention
                assert_close(out.L[bi, hi], expected, f"L causal={causal} head {hi}")


def masked_attention(q, k, v, visible, tau, dropout_p=0.0, seed=0):
    """Standard attention with an arbitrary (b, h, s_q, s_k) visibility mask: the block-sparse oracle."""
    b, s_q, h, d = q.shape
    h_k = k.shape[2]
    O = np.zeros_like(q)
    L = np.zeros((b, h, s_q))
    for bi in range(b):
        for hi in range(h):
            hk = kv_head(hi, h, h_k)
            S = np.where(visible[bi, hi], tau * q[bi, :, hi] @ k[bi, :, hk].T, -np.inf)
            P, m, l = row_softmax(S)
            Z = dropout_scale_matrix(seed, bi * h + hi, range(s_q), range(k.shape[1]), dropout_p)
            O[bi, :, hi] = (P * Z) @ v[bi, :, hk]
            with np.errstate(divide="ignore"):
                L[bi, hi] = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), np.inf)
    return O, L


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True], ids=["shared-mask", "per-head-mask"])
def test_block_sparse_equals_standard_attention_with_expanded_mask(rng, causal, per_head):
    b, s_q, s_k, h, h_k, d, Br, Bc = 2, 22, 17, 3, 1, 5, 4, 3
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d, dtype=np.float64)
    Tr, Tc = math.ceil(s_q / Br), math.ceil(s_k / Bc)
    tau = default_scale(d)
    for density in (0.2, 0.5, 0.9):
        mask = rng.random((b, h, Tr, Tc) if per_head else (Tr, Tc)) < density
        if not per_head:
            mask[0, 0], mask[-1, -1] = False, True  # make sure both kinds of tiles occur
        visible = np.broadcast_to(expand_block_mask(mask, s_q, s_k, Br, Bc), (b, h, s_q, s_k))
        if causal:
            visible = visible & causal_mask(s_q, s_k)
        O_ref, L_ref = masked_attention(q, k, v, visible, tau, dropout_p=0.25, seed=3)
        out = flash_forward_alg5(q, k, v, mask, causal=causal, dropout_p=0.25, seed=3, Br=Br, Bc=Bc)
        assert_close(out.O, O_ref, f"O density {density}")
        assert_close(out.L, L_ref, f"L density {density}")
        unseen = ~visible.any(axis=-1)  # (b, h, s_q) rows with no visible key
        assert np.all(np.moveaxis(out.O, 2, 1)[unseen] == 0.0)


def test_block_sparse_with_all_ones_mask_equals_alg2_bit_for_bit(rng):
    q, k, v = make_qkv(rng, 1, 15, 15, 2, 2, 4, dtype=np.float64)
    a2 = flash_forward_alg2(q, k, v, causal=True, dropout_p=0.1, seed=9, Br=4, Bc=4)
    a5 = flash_forward_alg5(q, k, v, np.ones((4, 4)), causal=True, dropout_p=0.1, seed=9, Br=4, Bc=4)
    np.testing.assert_array_equal(a5.O, a2.O)
    np.testing.assert_array_equal(a5.L, a2.L)


# ----------------------------------------------------------------------------------------------
# Dropout
# ----------------------------------------------------------------------------------------------


def dropped_probabilities(fn, b, s_q, h, rng, p, seed, **kw):
    """P_dropped of every head, recovered from the output: with V = I (s_k = d), O = P_dropped V = P_dropped."""
    s_k = d = s_q
    q, k, _ = make_qkv(rng, b, s_q, s_k, h, h, d, dtype=np.float64)
    v = np.broadcast_to(np.eye(s_k)[None, :, None, :], (b, s_k, h, d)).copy()
    out = fn(q, k, v, dropout_p=p, seed=seed, **kw)
    return np.moveaxis(out.O, 2, 1), (q, k, v)  # (b, h, s_q, s_k)


@pytest.mark.parametrize("p", [0.1, 0.17, 0.5, 0.9])
def test_dropout_keeps_fraction_1_minus_p_within_5_sigma(rng, p):
    """The number kept of n independent draws is Binomial(n, 1 - p'): |kept/n - (1 - p')| <= 5 sqrt(p'(1-p')/n).

    p' = floor(p 2^32) / 2^32 is the hash's exact drop probability (|p - p'| < 2^-32). A 5-sigma bound
    fails by chance with probability < 6e-7 per case. Kept entries must equal P / (1 - p).
    """
    b, s, h = 1, 48, 4
    n = b * h * s * s  # 9216 draws
    Pd, (q, k, v) = dropped_probabilities(flash_forward_alg2, b, s, h, rng, p, seed=1234, Br=16, Bc=16)
    kept = Pd > 0  # undropped P is > 0 everywhere (no mask, |S| small)
    p_exact = math.floor(p * 2**32) / 2**32
    sigma = math.sqrt(p_exact * (1 - p_exact) / n)
    assert abs(kept.mean() - (1 - p_exact)) <= 5 * sigma, (
        f"kept {kept.mean():.4f}, expected {1 - p_exact:.4f} +- {5 * sigma:.4f}"
    )
    P = standard_attention(q, k, v, return_matrices=True).P
    assert_close(np.where(kept, Pd, 0.0), np.where(kept, P / (1 - p), 0.0), "kept entries = P / (1 - p)")


def test_dropout_mask_is_reproducible_from_the_seed_and_differs_across_seeds_and_heads(rng):
    b, s, h, p = 2, 24, 3, 0.3
    gen_a, gen_b = np.random.default_rng(7), np.random.default_rng(7)  # same inputs twice
    masks = {}
    for name, fn, kw in [("alg2", flash_forward_alg2, dict(Br=5, Bc=7)), ("fa2", flash_forward_fa2, dict(Br=7, Bc=5))]:
        first, _ = dropped_probabilities(fn, b, s, h, gen_a, p, seed=42, **kw)
        again, _ = dropped_probabilities(fn, b, s, h, gen_b, p, seed=42, **kw)
        np.testing.assert_array_equal(first, again)  # the same seed regenerates the same mask, bit for bit
        masks[name] = first > 0
    np.testing.assert_array_equal(masks["alg2"], masks["fa2"])  # tiling does not change the mask
    other, _ = dropped_probabilities(flash_forward_alg2, b, s, h, np.random.default_rng(7), p, seed=43, Br=5, Bc=7)
    m42 = masks["alg2"]
    assert np.mean(m42 != (other > 0)) > 0.2  # two independent masks differ in 2 p (1 - p) = 42% of entries
    heads = m42.reshape(b * h, s * s)
    for x in range(b * h):
        for y in range(x + 1, b * h):
            assert np.mean(heads[x] != heads[y]) > 0.2, f"heads {x} and {y} share a mask"


# ----------------------------------------------------------------------------------------------
# Block sizes
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "d,M,expected",
    [
        (64, 12288, (48, 48)),  # the default: 48 KB of float32
        (64, 98304, (64, 384)),  # Br = min(Bc, d) caps the row block at d
        (8, DEFAULT_SRAM_ELEMENTS, (8, 384)),
        (33, 1000, (8, 8)),  # ceil(1000 / 132) = 8
        (7, 20, (1, 1)),  # M < 4d: one-row tiles
        (128, 65536, (128, 128)),
    ],
)
def test_block_sizes_follow_alg1_line_1(d, M, expected):
    Br, Bc = block_sizes(d, M)
    assert (Br, Bc) == expected
    assert Bc == math.ceil(M / (4 * d)) and Br == min(Bc, d)


def test_block_size_overrides_take_precedence():
    assert block_sizes(64, 12288, Br=16) == (16, 48)
    assert block_sizes(64, 12288, Bc=10) == (10, 10)  # Br = min(Bc, d) follows the overridden Bc
    assert block_sizes(64, 12288, Br=3, Bc=5) == (3, 5)
    with pytest.raises(ValueError):
        block_sizes(64, 12288, Br=0)


# ----------------------------------------------------------------------------------------------
# The oracle itself, against PyTorch
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,causal",
    [
        ((2, 13, 13, 4, 4, 7), False),
        ((2, 13, 13, 4, 4, 7), True),
        ((1, 9, 21, 6, 2, 5), False),
        ((1, 9, 21, 6, 2, 5), True),  # s_q < s_k: bottom-right mask passed explicitly
        ((1, 21, 9, 6, 1, 3), False),
        ((1, 21, 12, 2, 1, 3), True),  # s_q > s_k: rows 0..8 see no key; compared on the other rows
    ],
)
def test_standard_attention_equals_torch_sdpa(rng, shape, causal):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    b, s_q, s_k, h, h_k, d = shape
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d, dtype=np.float64)
    ref = standard_attention(q, k, v, causal=causal)

    def t(x):  # (b, s, h, d) -> (b, h, s, d), KV heads repeated for GQA/MQA
        x = torch.from_numpy(np.ascontiguousarray(x)).transpose(1, 2)
        return x.repeat_interleave(h // x.shape[1], dim=1)

    kwargs = {}
    if causal and s_q == s_k:
        kwargs["is_causal"] = True  # torch's is_causal is top-left aligned: the same when square
    elif causal:
        kwargs["attn_mask"] = torch.from_numpy(causal_mask(s_q, s_k))  # bottom-right, explicitly
    out = F.scaled_dot_product_attention(t(q), t(k), t(v), **kwargs).transpose(1, 2).numpy()
    seen = causal_mask(s_q, s_k).any(axis=1) if causal else np.ones(s_q, dtype=bool)
    assert_close(ref.O[:, seen], out[:, seen], "standard_attention vs torch SDPA")
