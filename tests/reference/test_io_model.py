"""The IO model: counted HBM accesses of the references equal the closed forms exactly, and show the
trends of FA1 Theorem 2 (standard Theta(Nd + N^2) vs FlashAttention Theta(N^2 d^2 / M)), Proposition 4
(block-sparse scales with the fraction of non-zero blocks) and FA2's loop order.

Counts are integers, so "exactly" means ``==``, array by array (``IOCount.by_name``).
"""

import math

from numba_flash_reference import io_model
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg1_forward import flash_forward_alg1
from numba_flash_reference.alg2_forward import flash_forward_alg2
from numba_flash_reference.alg5_block_sparse import flash_forward_alg5
from numba_flash_reference.common import block_sizes
from numba_flash_reference.fa2_forward import flash_forward_fa2
from numba_flash_reference.io_model import (
    banded_block_mask,
    count_io,
    io_alg1_forward,
    io_alg2_forward,
    io_alg3_backward,
    io_alg4_backward,
    io_alg5_block_sparse,
    io_fa2_backward,
    io_fa2_forward,
    io_standard_forward,
)

import numpy as np
import pytest
from attn_testing import make_qkv

# (N_q, N_k, d, M, Br, Bc): ragged lengths (N not a multiple of the tiles), s_q != s_k both ways, tiles
# from the formula of Alg.1 L1 (Br = Bc = None) for small M, and overrides
CONFIGS = [
    (16, 16, 4, None, 4, 4),
    (13, 13, 5, None, 3, 4),
    (11, 19, 3, None, 4, 5),
    (19, 11, 3, None, 5, 2),
    (17, 17, 4, 64, None, None),  # Bc = ceil(64 / 16) = 4, Br = min(4, 4) = 4
    (23, 23, 2, 40, None, None),  # Bc = 5, Br = 2
    (9, 9, 8, 8, None, None),  # M = d: one-row tiles (Thm 2's smallest M)
]
IDS = ["Nq{}-Nk{}-d{}-M{}-Br{}-Bc{}".format(*c) for c in CONFIGS]


def qkv(rng, Nq, Nk, d, b=1, h=2, h_k=1):
    return make_qkv(rng, b, Nq, Nk, h, h_k, d, dtype=np.float64)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_hbm_accesses_match_theorem_2(rng, cfg):
    """FA1 Algorithms 1 and 2 (Thm 2) and standard attention: counted == closed form, array by array."""
    Nq, Nk, d, M, Br, Bc = cfg
    b, h = 2, 2
    q, k, v = qkv(rng, Nq, Nk, d, b=b, h=h)
    expected = io_alg1_forward(Nq, d, M=M, Br=Br, Bc=Bc, N_k=Nk, b=b, h=h)
    _, counted = count_io(flash_forward_alg1, q, k, v, M=M, Br=Br, Bc=Bc)
    assert counted == expected
    for causal in (False, True):  # Algorithm 2 masks inside tiles but skips none
        _, counted = count_io(flash_forward_alg2, q, k, v, M=M, Br=Br, Bc=Bc, causal=causal, dropout_p=0.2)
        assert counted == io_alg2_forward(Nq, d, M=M, Br=Br, Bc=Bc, N_k=Nk, b=b, h=h, causal=causal) == expected
    _, counted = count_io(standard_attention, q, k, v)
    assert counted == io_standard_forward(Nq, d, N_k=Nk, b=b, h=h)


def test_closed_forms_have_the_documented_totals():
    """The headline formulas of the module docstring (per head, N_q = N_k = N)."""
    N, d, M = 1000, 64, 50000
    Br, Bc = block_sizes(d, M)
    Tr, Tc = math.ceil(N / Br), math.ceil(N / Bc)
    assert io_standard_forward(N, d).total == 4 * N * N + 4 * N * d
    assert io_alg1_forward(N, d, M=M).total == 2 * N * d + Tc * N * (3 * d + 4)
    assert io_fa2_forward(N, d, M=M).total == N * (2 * d + 1) + 2 * Tr * N * d
    assert io_alg3_backward(N, d).total == 7 * N * N + 8 * N * d
    assert io_alg4_backward(N, d, M=M).total == 4 * N * d + Tc * N * (5 * d + 2)
    assert io_fa2_backward(N, d, M=M).total == 6 * N * d + N + Tc * N * (4 * d + 2)
    paper_literal = io_fa2_backward(N, d, M=M, load_o_at_L9=True, load_dq_at_L9=True)
    assert paper_literal.total == io_fa2_backward(N, d, M=M).total + 2 * Tc * N * d


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_fa2_forward_hbm_accesses_match_closed_form(rng, cfg):
    Nq, Nk, d, M, Br, Bc = cfg
    q, k, v = qkv(rng, Nq, Nk, d, b=1, h=3, h_k=1)
    for causal in (False, True):
        _, counted = count_io(flash_forward_fa2, q, k, v, M=M, Br=Br, Bc=Bc, causal=causal, dropout_p=0.1)
        assert counted == io_fa2_forward(Nq, d, M=M, Br=Br, Bc=Bc, N_k=Nk, h=3, causal=causal)


def test_fa2_writes_each_output_once_while_fa1_rewrites_it_every_outer_step():
    """FA2's loop swap: O and L are written exactly once (N(d + 1) per head) whatever the tiles; FA1's O, l, m
    are written Tc times and read Tc times."""
    N, d = 64, 8
    fa2_writes = {io_fa2_forward(N, d, Br=br, Bc=bc).writes for br in (1, 4, 16, 64) for bc in (1, 4, 16, 64)}
    assert fa2_writes == {N * (d + 1)}
    for Bc in (1, 4, 16, 64):
        Tc = math.ceil(N / Bc)
        fa1 = io_alg1_forward(N, d, Br=4, Bc=Bc)
        assert fa1.by_name["O"] == (Tc * N * d, Tc * N * d)
        assert fa1.writes == Tc * N * (d + 2)
    # FA2 re-reads K and V once per row block instead: Tr passes
    for Br in (1, 4, 16, 64):
        assert io_fa2_forward(N, d, Br=Br, Bc=4).by_name["K"] == (math.ceil(N / Br) * N * d, 0)


def test_fa2_causal_skipping_visits_the_lower_triangle_of_blocks():
    """Square blocks, s_q = s_k = T B: row block i loads key blocks 0..i, T(T + 1)/2 of the T^2 tiles:
    the fraction (T + 1) / (2T) -> 1/2 of K/V traffic that gives FA2 its causal speed-up."""
    d, B = 4, 8
    for T in (1, 2, 5, 16):
        N = T * B
        full = io_fa2_forward(N, d, Br=B, Bc=B).by_name["K"][0]
        causal = io_fa2_forward(N, d, Br=B, Bc=B, causal=True).by_name["K"][0]
        assert causal * 2 * T == full * (T + 1)


def test_block_sparse_hbm_accesses_scale_with_nonzero_blocks(rng):
    """Proposition 4: counted == closed form for random masks, and the count is affine in the number of
    non-zero blocks: base 2 N_k d (K, V) plus (3d + 4) |rows_i| per non-zero tile."""
    Nq, Nk, d, Br, Bc = 22, 17, 3, 4, 3  # ragged: the last row block has 2 rows, the last column block 2
    b, h = 1, 2
    Tr, Tc = math.ceil(Nq / Br), math.ceil(Nk / Bc)
    q, k, v = qkv(rng, Nq, Nk, d, b=b, h=h)
    row_sizes = np.array([min(Br, Nq - i * Br) for i in range(Tr)])
    for density in (0.0, 0.3, 0.7, 1.0):
        mask = rng.random((b, h, Tr, Tc)) < density
        _, counted = count_io(flash_forward_alg5, q, k, v, mask, Br=Br, Bc=Bc, causal=True)
        expected = io_alg5_block_sparse(Nq, d, mask, Br=Br, Bc=Bc, N_k=Nk, b=b, h=h)
        assert counted == expected
        W = int((mask.sum(axis=-1) * row_sizes).sum())
        assert expected.total == b * h * 2 * Nk * d + W * (3 * d + 4)
    ones = np.ones((Tr, Tc))
    assert io_alg5_block_sparse(Nq, d, ones, Br=Br, Bc=Bc, N_k=Nk, b=b, h=h) == io_alg2_forward(
        Nq, d, Br=Br, Bc=Bc, N_k=Nk, b=b, h=h
    )
    # with Br | N, each extra non-zero block costs the same: the count grows linearly with the sparsity s
    N = 64
    totals = [io_alg5_block_sparse(N, 8, banded_block_mask(16, 16, k / 16), Br=4, Bc=4).total for k in range(1, 17)]
    steps = np.diff(totals)
    assert np.all(steps == 16 * 4 * (3 * 8 + 4))  # Tr rows gain one block each: Tr * Br * (3d + 4)


def test_standard_attention_accesses_are_theta_Nd_plus_N2():
    """Theorem 2, standard side: 4N^2 + 4Nd, i.e. quadratic in N and independent of M."""
    for N in (64, 256, 1024):
        for d in (16, 64):
            assert io_standard_forward(N, d).total == 4 * N * N + 4 * N * d
    assert io_standard_forward(2048, 64).total / io_standard_forward(1024, 64).total == pytest.approx(4, rel=0.05)


def test_flash_accesses_are_theta_N2_d2_over_M():
    """Theorem 2, FlashAttention side, with explicit constants over d <= M <= N d.

    count = 2Nd + Tc N (3d + 4), Tc = ceil(N / Bc), Bc = ceil(M / 4d). Upper: Tc <= 4Nd/M + 1 and
    Nd <= N^2 d^2 / M (as M <= Nd), so count <= 2Nd + (4Nd/M) N (7d) + N(7d) <= 37 N^2 d^2 / M.
    Lower: count >= Tc N 3d >= (N / Bc) 3Nd, and Bc <= M/(4d) + 1 <= M/(2d) when M >= 4d, Bc = 1 when
    M < 4d; both give count >= 3 N^2 d^2 / M. So 3 <= count / (N^2 d^2 / M) <= 37.
    """
    for N in (256, 1024, 4096):
        for d in (16, 64, 128):
            for M in sorted({d, 4 * d, d * d, 4 * d * d, 12288, 98304, N * d}):
                if not d <= M <= N * d:
                    continue
                ratio = io_alg1_forward(N, d, M=M).total / (N * N * d * d / M)
                assert 3 <= ratio <= 37, (N, d, M, ratio)


def test_flash_advantage_grows_with_sram_size():
    """Theorem 2: the ratio standard / FA1 never falls as M grows, rises whenever Tc drops, and is
    (4N + 4d) / (2d + Tc (3d + 4)) ~ M / (3 d^2) to leading order: within 10% for 4d <= M <= Nd/4, where
    Bc = ceil(M/4d) ~ M/4d, Tc = ceil(N/Bc) ~ N/Bc and d << N (the dropped terms are O(d/N + Bc/N))."""
    N, d = 4096, 64
    std = io_standard_forward(N, d).total
    Ms = [d * 2**k for k in range(0, 13) if d * 2**k <= N * d]
    ratios = [std / io_alg1_forward(N, d, M=M).total for M in Ms]
    Tcs = [math.ceil(N / block_sizes(d, M)[1]) for M in Ms]
    for r0, r1, t0, t1 in zip(ratios, ratios[1:], Tcs, Tcs[1:]):
        assert r1 >= r0 and (r1 > r0) == (t1 < t0)
    for M, r in zip(Ms, ratios):
        if 4 * d <= M <= N * d // 4:  # Bc ~ M/4d holds closely and Tc = N/Bc >> 1
            assert r == pytest.approx(M / (3 * d * d), rel=0.1), M
    # and the same trend forward + backward (Theorem 5)
    fb = [
        (std + io_alg3_backward(N, d).total) / (io_alg1_forward(N, d, M=M) + io_alg4_backward(N, d, M=M)).total
        for M in Ms
    ]
    assert all(b >= a for a, b in zip(fb, fb[1:])) and fb[-1] > 5 * fb[0]


def test_backward_closed_forms_follow_theorem_5():
    """Standard backward Theta(Nd + N^2); FA1 Algorithm 4 Theta(N^2 d^2 / M).

    count = 4Nd + Tc N (5d + 2). As in Theorem 2's test, for 4d <= M <= Nd: Tc <= 4Nd/M + 1 gives
    count <= 4Nd + 28 N^2 d^2/M + 7Nd <= 39 N^2 d^2 / M, and Tc >= 2Nd/M gives count >= 10 N^2 d^2 / M.
    """
    d = 64
    for N in (256, 1024, 4096):
        assert io_alg3_backward(N, d).total == 7 * N * N + 8 * N * d
        for M in (4 * d, 4 * d * d, 12288, N * d):
            ratio = io_alg4_backward(N, d, M=M).total / (N * N * d * d / M)
            assert 10 <= ratio <= 39, (N, M, ratio)


def test_backward_closed_forms_scale_kv_terms_per_kv_head():
    one = io_alg4_backward(40, 8, Br=4, Bc=4, h=6, h_k=6)
    gqa = io_alg4_backward(40, 8, Br=4, Bc=4, h=6, h_k=2)
    for name in ("K", "V", "dK", "dV"):
        assert tuple(3 * x for x in gqa.by_name[name]) == one.by_name[name]
    for name in ("Q", "O", "dO", "dQ", "l", "m"):
        assert gqa.by_name[name] == one.by_name[name]
    with pytest.raises(ValueError):
        io_alg3_backward(10, 4, h=6, h_k=4)


def test_format_table_reports_every_algorithm_and_the_sweep():
    text = io_model.format_table(N=1024, d=64)
    for needle in (
        "FA1 Alg.0",
        "FA1 Alg.1/2",
        "FA2 Alg.1",
        "FA1 Alg.5",
        "FA1 Alg.3",
        "FA1 Alg.4",
        "FA2 Alg.2",
        "9x",
        "40.3 GB",
    ):
        assert needle in text, needle
    rows = io_model.table_rows(1024, 64, M=98304, sparsity=0.25)
    by = {(r["pass"], r["algorithm"]): r for r in rows}
    assert by[("forward", "standard")]["total"] == io_standard_forward(1024, 64).total
    assert by[("forward", "FlashAttention")]["total"] == io_alg1_forward(1024, 64, M=98304).total
    for r in rows:
        assert r["total"] == r["reads"] + r["writes"] and r["MB_fp32"] == pytest.approx(4 * r["total"] / 1e6)
        assert r["vs_standard"] == pytest.approx(by[(r["pass"], "standard")]["total"] / r["total"])
    # at an A100-sized SRAM, FlashAttention makes several times fewer accesses than standard attention
    assert by[("fwd+bwd", "FlashAttention")]["vs_standard"] > 5
    sweep = io_model.sweep_rows(1024, 64)
    assert [r["fwd_FA1"] for r in sweep] == sorted(r["fwd_FA1"] for r in sweep)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_backward_hbm_accesses_match_theorem_5(rng, cfg):
    """Alg.3 (standard), Alg.4 (recomputation) and FA2 Alg.2: counted == closed form, array by array.

    GQA (h = 2 query heads on h_k = 1 KV head) checks that K, V, dK, dV traffic is per KV head.
    """
    from numba_flash_reference.alg3_backward import standard_backward
    from numba_flash_reference.alg4_backward import flash_backward
    from numba_flash_reference.fa2_backward import fa2_backward

    Nq, Nk, d, M, Br, Bc = cfg
    b, h, h_k = 2, 2, 1
    q, k, v = qkv(rng, Nq, Nk, d, b=b, h=h, h_k=h_k)
    dout = rng.standard_normal(q.shape)
    fwd = standard_attention(q, k, v)
    _, counted = count_io(standard_backward, dout, q, k, v)
    assert counted == io_alg3_backward(Nq, d, N_k=Nk, b=b, h=h, h_k=h_k)
    _, counted = count_io(flash_backward, dout, q, k, v, fwd.O, fwd.l, fwd.m, M=M, Br=Br, Bc=Bc)
    assert counted == io_alg4_backward(Nq, d, M=M, Br=Br, Bc=Bc, N_k=Nk, b=b, h=h, h_k=h_k)
    _, counted = count_io(fa2_backward, dout, q, k, v, fwd.O, fwd.L, M=M, Br=Br, Bc=Bc)
    assert counted == io_fa2_backward(Nq, d, M=M, Br=Br, Bc=Bc, N_k=Nk, b=b, h=h, h_k=h_k)
