"""The 3xTF32 backward's ``Q_i, dO_i`` split once per step (:mod:`numba_flash.tensorcore.fa2_backward_tf32`,
``SPLIT_QDO``).

Every 3xTF32 ``mma`` takes the big and small tf32 parts of both operands. ``Q_i`` and ``dO_i`` are read four times a
step (the A operands of ``S = Q_i K_j^T`` and ``dP = dO_i V_j^T``, the B operands of ``dK += dS^T Q_i`` and
``dV += P^T dO_i``) by each of the block's warps, and each read splits again: 512 of a lane's 864 splits a step at the
d = 128 default. ``SPLIT_QDO`` splits each element once, in SRAM, by the thread that copied it (big part in place, small
part where the second ``cp.async`` stage was); ``Q_i`` is split times ``tau log2 e``, the A operand of the forward's
``S``, so ``dK`` is summed from the scaled ``Q_i`` and divided by ``tau log2 e`` when it is written.

Claims checked:

* ``S``, ``P``, ``dP``, ``dS`` and so ``dV`` and ``dQ`` are the bits of the backward without it (the same parts of the
  same values in the same order); ``dK`` differs by its own rounding and keeps the 3x error rule against float64. On
  ragged, GQA, causal (``s_q < s_k``), dropout and deterministic shapes, and on a sharp softmax.
* NaNs in ``Q`` and ``dO`` reach the same gradient elements as without it.
* ``QDO_PAIRS`` (the parts stored as A-fragment quads of row pairs ``2 g, 2 g + 1``, so that a quad is one 16-byte load
  in the ``mma``'s register order): the row-pair pass puts both parts of every element where the products read them,
  its swizzle keeps those reads bank-conflict free, and the gradients are the bits of ``SPLIT_QDO`` without it.
* It runs only with ``WIDE`` on the ``cp.async`` path (the kernel refuses it otherwise; the plan leaves it off), and it
  is on by default from 1k query rows, with ``QDO_PAIRS`` (the d = 128 backward 1.11-1.18x faster with both in every
  cell of two rounds at N 1k / 4k on an H100 and 8k / 16k on an H200: the performance log).
* A NaN in ``Q`` reaches its row of ``dQ`` and all of ``dK``, one in ``dO`` reaches ``dV``, on both backends. (Q's NaN
  makes its row's ``l`` NaN, whose ``1/l`` the backward takes as 0. On a GPU that row's ``P`` is then 0, because the
  backward's ``min(S' - M, 64)`` is ``fminf`` there, which drops a NaN; the simulator's Python ``min`` keeps it. So Q's
  NaN reaches ``dV`` in the simulator only: ``python -m bench.nan_reach``.)
* On a GPU (marker ``gpu``): the same at realistic shapes and the d = 128 default tiling.
"""

from __future__ import annotations

import inspect

from numba_flash._launch import Problem
from numba_flash.fast import _tiles
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_backward_tf32, ptx

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    assert_same_bits,
    make_qkv,
    run_tf32_backward,
    sharp_problem,
    torch_attention_grads,
)
from numba import cuda, uint32
from sram_pass_testing import device_swizzle, nan_tile, run_sram_pass

torch = pytest.importorskip("torch")


def _grads(q, k, v, dout, causal, p, bs, split_qdo, deterministic=False, pairs=False):
    feats = {"WIDE": True, "CP_ASYNC": True, "SPLIT_QDO": split_qdo, "QDO_PAIRS": pairs}
    return run_tf32_backward(q, k, v, dout, causal, p, 7, bs, feats, deterministic)


def _reference(q, k, v, dout, causal, p):
    """(float64 oracle, float32 baseline) gradients of the same attention (dropout seed 7, as :func:`_grads`)."""
    qkv, do = [torch.from_numpy(x) for x in (q, k, v)], torch.from_numpy(dout)
    return (
        torch_attention_grads(qkv, do, causal, p, 7, torch.float64),
        torch_attention_grads(qkv, do, causal, p, 7, torch.float32),
    )


def _assert_same_but_dk(on, off, ref, naive, what):
    """dQ, dV the bits of ``off``; dK within the 3x rule (its rounding differs)."""
    assert_same_bits([on[0], on[2]], [off[0], off[2]], what, ("dq", "dv"))
    assert_error_rule(on[1].astype(np.float64).reshape(ref[1].shape), ref[1], naive[1], mult=3.0, what=f"dK, {what}")


#: (b, s_q, s_k, h, h_k, d, causal, p, block_sizes, deterministic); WIDE needs the padded d a multiple of 32
CASES = [
    pytest.param(1, 37, 29, 2, 1, 32, False, 0.0, (32, 16), False, id="ragged-gqa-d32"),
    pytest.param(1, 21, 40, 1, 1, 32, True, 0.15, (16, 16), True, id="deterministic-causal-sq<sk-dropout-d32"),
]


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs", "det"), CASES)
def test_split_q_and_do_give_the_same_dq_and_dv_and_dk_within_the_rule(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, det):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    (on, on_feats), (off, off_feats) = (_grads(q, k, v, dout, causal, p, bs, f, det) for f in (True, False))
    assert on_feats["SPLIT_QDO"] and not off_feats["SPLIT_QDO"]
    _assert_same_but_dk(on, off, *_reference(q, k, v, dout, causal, p), "Q_i, dO_i split once and by every warp")


def test_split_q_and_do_on_a_sharp_softmax(rng):
    """Scores of standard deviation 16: the case where a backward's S must be its forward's bit for bit."""
    dout, q, k, v = sharp_problem(rng, 1, 24, 1, 32, 16.0)
    (on, _), (off, _) = (_grads(q, k, v, dout, False, 0.0, (16, 16), f) for f in (True, False))
    _assert_same_but_dk(on, off, *_reference(q, k, v, dout, False, 0.0), "sharp softmax, Q_i, dO_i split once")


def test_nans_in_q_and_do_reach_the_same_gradients(rng):
    q, k, v = make_qkv(rng, 1, 12, 13, 1, 1, 32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    q[0, 3, 0, 5] = np.float32(np.nan)
    dout[0, 9, 0, 30] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN
    (on, _), (off, _) = (_grads(q, k, v, dout, False, 0.0, (16, 16), f) for f in (True, False))
    for name, a, b in zip(("dq", "dk", "dv"), on, off):
        assert np.isnan(a).any(), f"{name}: the NaNs reach it"
        np.testing.assert_array_equal(
            np.isnan(a), np.isnan(b), err_msg=f"{name}: NaNs where the backward without it has them"
        )


def test_split_qdo_runs_only_with_wide_on_the_cp_async_path_and_by_default_from_1k_rows():
    on, n = fa2_backward_tf32.split_qdo_on, fa2_backward_tf32.SPLIT_QDO_SEQLEN
    assert fa2_backward_tf32.default_features()["SPLIT_QDO"] is None
    assert n == 1024, "with QDO_PAIRS 1.11-1.18x in every cell timed (1k / 4k H100, 8k / 16k H200); 512 not timed"
    assert on(True, True, True) and on(True, True, True, 0) and not on(False, True, True, n)
    assert not on(True, False, True, n) and not on(True, True, False, n) and not on(None, False, True, n)
    assert on(None, True, True, n) and not on(None, True, True, n - 1) and not on(None, True, True)
    sim = _backend.is_simulator()
    for cp_async, wide in ((False, True), (True, False)):
        with pytest.raises(ValueError, match="SPLIT_QDO needs CP_ASYNC and WIDE"):
            fa2_backward_tf32.fa2_backward_tf32_kernel(
                1, 1, 16, 32, False, False, True, sim, CP_ASYNC=cp_async, WIDE=wide, SPLIT_QDO=True
            )
    with pytest.raises(ValueError, match="only with the key columns kept"):
        fa2_backward_tf32.make_score_products_wide(1, 2, 4, 32, sim, False, 64)


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs", "det"), CASES)
def test_row_pairs_give_the_bits_of_split_q_and_do(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, det):
    """The same parts of the same values summed in the same order: dQ, dK, dV all bit for bit."""
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    (pairs, feats), (rows, _) = (_grads(q, k, v, dout, causal, p, bs, True, det, f) for f in (True, False))
    assert feats["QDO_PAIRS"] and feats["SPLIT_QDO"]
    assert_same_bits(pairs, rows, "Q_i, dO_i parts as quads of row pairs and row by row", ("dq", "dk", "dv"))


def test_row_pairs_on_a_sharp_softmax_and_nans(rng):
    dout, q, k, v = sharp_problem(rng, 1, 24, 1, 32, 16.0)
    q[0, 3, 0, 5] = np.float32(np.nan)
    dout[0, 10, 0, 30] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN
    (pairs, _), (rows, _) = (_grads(q, k, v, dout, False, 0.0, (16, 16), True, False, f) for f in (True, False))
    dq, dk, dv = pairs
    assert np.isnan(dq[0, 3]).all() and np.isnan(dk).all(), "Q's NaN reaches its row of dQ and all of dK"
    assert np.isnan(dv).all(), "... and all of dV (the cap on S - M keeps it on a GPU too: _regtile.min_keep_nan)"
    assert_same_bits(pairs, rows, "sharp softmax with NaNs, row pairs", ("dq", "dk", "dv"))


def _sw(x, r):  # Dev: _tiles.swizzle_pairs on the host
    return x ^ (4 * (r & 1) | 8 * ((r >> 2) & 1) | 16 * ((r >> 1) & 1))


def _banks(addresses, width):
    return [(a + e) % 32 for a in addresses for e in range(width)]


@pytest.mark.parametrize("DP", [32, 64, 96, 128])
def test_swizzle_pairs_keeps_the_quad_and_pair_reads_in_32_banks(DP):
    for r0 in (0, 16, 48):
        for kp in range(DP // 16):  # S, dP: lane (g, t) loads the quad of rows 2g, 2g+1 at column 16 kp + 4 t (h2 = 0:
            # in row
            for h in range(2):  # 2g's chunk; h2 = 2: in row 2g + 1's), 16 bytes, served 8 lanes (g = 2m, 2m + 1) at a
                # time
                for m in range(4):
                    rows = [(r0 + 2 * g + h, t) for g in (2 * m, 2 * m + 1) for t in range(4)]
                    assert len(set(_banks([r * DP + _sw(16 * kp + 4 * t, r) for r, t in rows], 4))) == 32, (
                        r0,
                        kp,
                        h,
                        m,
                    )
        for n in range(DP // 8):  # dV, dK: lane (g, t) loads (X[2t, c], X[2t+1, c]), c = 8 n + g, 8 bytes, 16 lanes at
            # a time
            for nt in range(2):
                for half in range(2):
                    at = []
                    for g in range(4 * half, 4 * half + 4):
                        for t in range(4):
                            rr = r0 + 8 * nt + 2 * t + ((g >> 1) & 1)
                            at.append(rr * DP + _sw(8 * n + (g & 4), rr) + 2 * (g & 1))
                    assert len(set(_banks(at, 2))) == 32, (r0, n, nt, half)
    # swizzle16t (the row-by-row tiles') would give the quads of rows 0 and 2 the same four chunks
    sw16t = lambda x, r: x ^ (16 * (r & 1)) ^ (8 * ((r >> 1) & 3))  # noqa: E731
    assert len(set(_banks([r * DP + sw16t(4 * t, r) for r in (0, 2) for t in range(4)], 4))) == 16


def test_swizzle_pairs_on_the_device_is_the_host_formula():
    i = np.arange(128 * 16)
    np.testing.assert_array_equal(device_swizzle(_tiles.swizzle_pairs), _sw(i % 128, i // 128))


@pytest.mark.parametrize("NT", [64, 96], ids=["exact-share", "ragged-share"])
def test_the_row_pair_pass_writes_the_quads_of_every_pair(NT):
    """After :func:`make_word_loader_async`'s ``ROW_PAIRS`` (rows r, r + 1) copy, swizzled by ``swizzle_pairs``: the
    chunk of row r (even) at columns c .. c + 3 holds (X[r, c], X[r+1, c], X[r, c+1], X[r+1, c+1]) and row r + 1's the
    quad of c + 2, c + 3, big parts in place and small ones ``SMALL`` words on (``Q_i`` scaled first)."""
    ROWS, DW, SCALE = 16, 64, 1.4426950408889634  # 256 chunks, 128 pairs: over 96 threads the last 32 have one pair
    SMALL = ROWS * DW
    split_pass = _tiles.make_row_pair_split_pass(ROWS, DW, NT, DW, _backend.is_simulator(), SCALE=True)
    x = nan_tile(np.random.default_rng(NT), ROWS, DW, DW)
    src = np.zeros_like(x)  # Dev: as the copies land: X[r, c] at column swizzle_pairs(c, r) of row r
    for r in range(ROWS):
        src[r, _sw(np.arange(DW), r)] = x[r]

    @cuda.jit(device=True)
    def apply(smem, words, tid):
        split_pass(smem, words, uint32(0), uint32(SMALL), tid, np.float32(SCALE))

    out = run_sram_pass(apply, NT, src.ravel(), 2 * SMALL, 0, 2 * SMALL)
    seen = set()
    for r in range(0, ROWS, 2):
        for c in range(0, DW, 4):
            for h in range(2):  # the quad of columns c + 2h, c + 2h + 1, in row r + h's chunk
                base = (r + h) * DW + _sw(c, r + h)
                for w in range(4):
                    row, col = r + w % 2, c + 2 * h + w // 2
                    v = np.float32(x[row, col] * np.float32(SCALE))
                    if np.isnan(v):
                        assert out[base + w] == 0x7FC00000, f"the NaN at {(row, col)} was not made the quiet NaN"
                    else:
                        assert (int(out[base + w]), int(out[SMALL + base + w])) == ptx.split_tf32_host(v), (row, col)
                    seen.add((row, col))
    assert len(seen) == ROWS * DW, "every element of the tile has its place"


def test_row_pairs_need_split_q_and_do():
    with pytest.raises(ValueError, match="QDO_PAIRS needs SPLIT_QDO"):
        fa2_backward_tf32.fa2_backward_tf32_kernel(
            1, 1, 16, 32, False, False, True, _backend.is_simulator(), CP_ASYNC=True, WIDE=True, QDO_PAIRS=True
        )
    with pytest.raises(ValueError, match="only with split query rows"):
        fa2_backward_tf32.make_score_products_wide(1, 2, 4, 32, _backend.is_simulator(), True, 0, True)
    with pytest.raises(ValueError, match=r"row pairs \(r, r \+ 1\) need a multiple of 2 rows"):
        _tiles.make_own_chunks(15, 32, 32, 32, _tiles.swizzle_pairs, True, 1)
    on = fa2_backward_tf32.qdo_pairs_on
    assert fa2_backward_tf32.default_features()["QDO_PAIRS"] is None
    assert on(None, True) and on(True, True) and not on(False, True) and not on(None, False) and not on(True, False)


ON, SPLIT, OFF = (True, True), (True, False), (False, False)  # (SPLIT_QDO, QDO_PAIRS) as built


@pytest.mark.parametrize(
    ("d", "features", "n", "expected"),
    [
        (128, {"SPLIT_QDO": True}, 256, ON),  # WIDE (as the forward above d = 64) on the cp.async path, pairs with it
        (128, {"SPLIT_QDO": True, "QDO_PAIRS": False}, 256, SPLIT),  # pairs asked off
        (128, {"SPLIT_QDO": True, "WIDE": False}, 256, OFF),  # not WIDE: off
        (128, {"SPLIT_QDO": True, "CP_ASYNC": False}, 256, OFF),  # the register path: off
        (64, {"SPLIT_QDO": True}, 256, OFF),  # d = 64: WIDE off by default
        (128, {"QDO_PAIRS": True}, 256, OFF),  # pairs asked, SPLIT_QDO by default off below SPLIT_QDO_SEQLEN ...
        (128, None, 1023, OFF),
        (128, None, 1024, ON),  # ... and on from it, with pairs
        (64, None, 16384, OFF),  # not at d = 64 (no WIDE)
    ],
)
def test_the_plan_builds_it_only_with_wide_on_the_cp_async_path(monkeypatch, d, features, n, expected):
    built = []
    real = fa2_backward_tf32.fa2_backward_tf32_kernel

    def record(*args):
        bound = inspect.signature(real).bind(*args).arguments
        built.append((bound.get("SPLIT_QDO", False), bound.get("QDO_PAIRS", False)))
        return real(*args)

    monkeypatch.setattr(fa2_backward_tf32, "fa2_backward_tf32_kernel", record)
    prob = Problem(
        batch=1,
        seqlen_q=n,
        seqlen_k=n,
        nheads=2,
        nheads_k=2,
        headdim=d,
        softmax_scale=d**-0.5,
        causal=True,
        dropout_p=0.0,
        seed=0,
    )
    fa2_backward_tf32.plan(prob, None, features=features)
    assert built == [expected]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "d", "causal", "det"), [(1000, 128, False, False), (1000, 128, True, True), (777, 96, True, False)]
)
def test_split_q_and_do_on_gpu_shapes(rng, n, d, causal, det):
    """dV bit for bit, dQ too with ``deterministic`` (atomic adds land in any order: else the 3x rule), dK the 3x rule;
    with ``QDO_PAIRS`` the bits of ``SPLIT_QDO`` alone (dQ with ``deterministic``)."""
    q, k, v = make_qkv(rng, 2, n, n, 4, 2, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    on, off = (_grads(q, k, v, dout, causal, 0.0, None, f, det)[0] for f in (True, False))
    pairs = _grads(q, k, v, dout, causal, 0.0, None, True, det, True)[0]
    ref, naive = _reference(q, k, v, dout, causal, 0.0)
    assert_same_bits([on[2]], [off[2]], "Q_i, dO_i split once and by every warp", ("dv",))
    assert_same_bits(pairs[1:], on[1:], "Q_i, dO_i as quads of row pairs", ("dk", "dv"))
    if det:
        assert_same_bits([on[0]], [off[0]], "Q_i, dO_i split once and by every warp", ("dq",))
        assert_same_bits([pairs[0]], [on[0]], "Q_i, dO_i as quads of row pairs", ("dq",))
    for got, what in ((on, "SPLIT_QDO"), (pairs, "QDO_PAIRS")):
        for i, name in ((0, "dQ"), (1, "dK")):
            assert_error_rule(
                got[i].astype(np.float64).reshape(ref[i].shape), ref[i], naive[i], mult=3.0, what=f"{name}, {what}"
            )
