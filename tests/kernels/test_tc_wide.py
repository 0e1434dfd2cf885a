"""The 3xTF32 forward's ``WIDE`` (:mod:`numba_flash.tensorcore.fa2_forward_tf32`): 16-byte fragment loads.

Claims checked:

* ``WIDE`` reorders the terms of the two dot products so that each lane's fragments come from 16-byte SRAM loads
  (line 8: a pair of 8-wide k steps from one load per row of Q_i and K_j; line 10: O's columns renamed so that a
  lane's V columns are contiguous). The order of a sum's terms is not its value in float32, so the claim is the
  forward's: O and L follow the error rule against float64 (2x naive float32's error), on ragged, causal (blocks
  whose rows see no key included), GQA, dropout and ``MW = 2`` shapes; and a NaN in K or V still makes the rows it
  reaches NaN (the quiet-NaN pass must find the swizzled chunks).
* The layouts it needs are bank-conflict free: in every 8-lane phase of a 16-byte load (Q, K: rows ``g``, ``g + 1``
  of a swizzled, unpadded tile; V: rows ``t``, columns ``ND g``) the 8 lanes touch 32 different banks, where the
  same loads on the default strides would not.
* It runs only where it can: padded head dims that are a multiple of 32 and the ``cp.async`` path (the swizzled K_j
  arrives by ``cp.async`` only); elsewhere the plan is the kernel without it, and asking the kernel factory for it
  raises. It is the default above d = 64 only (:func:`numba_flash.tensorcore.fa2_forward_tf32.wide_on` says why).
* On a GPU (marker ``gpu``): the same error rule at realistic shapes and the tilings it is timed with.

Simulator shapes stay tiny (N <= 45, d <= 32): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

from numba_flash._launch import check_attention_args
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_forward_tf32
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    assert_lse_rule,
    make_qkv,
    naive_attention_float32,
    naive_lse_float32,
    run_tc_forward,
)

WIDE = {"CP_ASYNC": True, "WIDE": True}

#: (b, s_q, s_k, h, h_k, d, causal, p, block_sizes), id: d 32 and 28 (padded to 32, the smallest WIDE head dims)
CASES = [
    pytest.param(1, 37, 40, 2, 1, 32, False, 0.0, (16, 16), id="ragged-gqa-d32"),
    pytest.param(1, 33, 45, 1, 1, 28, True, 0.0, (16, 16), id="causal-d28-padded"),
    pytest.param(1, 29, 35, 1, 1, 32, True, 0.1, (32, 16), id="causal-dropout-d32"),
    pytest.param(1, 45, 14, 1, 1, 32, True, 0.0, (16, 8), id="causal-sq>sk-blocks-without-keys-d32"),
    pytest.param(1, 45, 14, 1, 1, 32, True, 0.0, (64, 16), id="causal-sq>sk-blocks-without-keys-4warps-d32"),
    pytest.param(1, 40, 37, 1, 1, 32, False, 0.0, (128, 16), id="mw2-4warps-d32"),
]


def _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    out, feats = run_tc_forward(q, k, v, causal, p, seed, bs, WIDE)
    assert feats["WIDE"] and feats["CP_ASYNC"]
    ref = standard_attention(q, k, v, causal=causal, dropout_p=p, seed=seed).O  # the same dropout mask as the kernel
    assert_error_rule(out[0], ref, naive_attention_float32(q, k, v, causal=causal, dropout_p=p, seed=seed), what="O")
    if p == 0.0:  # L does not depend on dropout; the reference's L is the undropped one
        assert_lse_rule(out[1], standard_attention(q, k, v, causal=causal).L, naive_lse_float32(q, k, causal))
    return out


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_wide_fragment_loads_follow_the_error_rule(rng, b, s_q, s_k, h, h_k, d, causal, p, bs):
    _check(rng, b, s_q, s_k, h, h_k, d, causal, p, bs)


def test_nans_in_k_and_v_reach_the_rows_they_touch(rng):
    q, k, v = make_qkv(rng, 1, 20, 40, 1, 1, 32)
    k[0, 5, 0, 21] = np.float32(np.nan)  # key 5 (an odd row: swizzled), column 21: its scores are NaN in every row
    v[0, 34, 0, 9] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN, in V
    out, _ = run_tc_forward(q, k, v, False, 0.0, 0, (16, 16), WIDE)
    assert np.isnan(out[0]).all(), "a NaN score makes every row's softmax NaN"
    q, k, v = make_qkv(rng, 1, 20, 40, 1, 1, 32)
    v[0, 33, 0, 30] = np.float32(np.nan)  # only V: column 30 of every row that sees key 33 (all rows, non-causal)
    out, _ = run_tc_forward(q, k, v, False, 0.0, 0, (16, 16), WIDE)
    assert np.isnan(out[0][..., 30]).all() and not np.isnan(np.delete(out[0], 30, axis=-1)).any()


def _phase_banks(addresses):
    """Banks touched by one 8-lane phase of a 16-byte load, lanes at float offsets ``addresses``."""
    return [(a + e) % 32 for a in addresses for e in range(4)]


@pytest.mark.parametrize("DP", [32, 64, 96, 128])
def test_wide_layouts_put_every_16_byte_load_phase_in_32_banks(DP):
    SQ, SV, _ = fa2_forward_tf32.strides(16, DP, wide=True)
    assert SQ == DP, "Q_i and K_j are unpadded: the swizzle, not a stride, separates rows g and g + 1"
    ND = DP // 8
    for p in range(DP // 16):  # Q and K: lanes (g, t), g < 2, at SRAM column (16 p ^ 16 (g & 1)) + 4 t of row g
        assert (
            len(set(_phase_banks([g * SQ + ((16 * p) ^ (16 * (g & 1))) + 4 * t for g in range(2) for t in range(4)])))
            == 32
        )
    for a in range(ND // 4):  # V: lanes (g, t) at row t, column 32 a + 4 g
        assert len(set(_phase_banks([t * SV + 32 * a + 4 * g for g in range(2) for t in range(4)]))) == 32
    # line 14's staging of O in the warp's Q rows (stride SQ, column x stored at x ^ (row % 8)): one store of a warp
    # puts lanes (g, t) at row g, column 32 a + 4 (2 t + cc) + e: 32 banks; the read back (row r, column l) too
    for a, cc, e in ((0, 0, 0), (0, 1, 3), (ND // 4 - 1, 1, 2)):
        banks = [(g * SQ + ((32 * a + 4 * (2 * t + cc) + e) ^ (g % 8))) % 32 for g in range(8) for t in range(4)]
        assert len(set(banks)) == 32
    for r in range(16):
        assert len({(r * SQ + (lane ^ (r % 8))) % 32 for lane in range(32)}) == 32
    # the same loads on the default (padded, unswizzled) Q/K stride would collide: the reason for the swizzle
    SQ0 = fa2_forward_tf32.strides(16, DP)[0]
    assert len(set(_phase_banks([g * SQ0 + 4 * t for g in range(2) for t in range(4)]))) < 32


def test_wide_runs_only_where_it_can():
    assert fa2_forward_tf32.default_features()["WIDE"] is None
    # None: on above d = 64 (the 3xTF32 backward follows it; at d <= 64 its backward loses more than the forward gains);
    # never off the cp.async path or where not wide_ok; True turns it on where it can run
    wide_on = fa2_forward_tf32.wide_on
    assert (
        wide_on(None, 128, True)
        and wide_on(None, 96, True)
        and not wide_on(None, 64, True)
        and not wide_on(None, 32, True)
    )
    assert not wide_on(None, 128, False) and not wide_on(None, 72, True)
    assert wide_on(True, 128, True) and wide_on(True, 64, True) and not wide_on(False, 128, True)
    assert not wide_on(True, 128, False) and not wide_on(True, 40, True)
    assert all(fa2_forward_tf32.wide_ok(DP) for DP in (32, 64, 96, 128))
    assert not fa2_forward_tf32.wide_ok(48), "not whole groups of 32 columns (four 8-column tiles of O)"
    sim = _backend.is_simulator()
    for d, feats, want in ((40, WIDE, False), (32, {"CP_ASYNC": False, "WIDE": True}, False), (32, WIDE, True)):
        q, k, v = make_qkv(np.random.default_rng(0), 1, 8, 8, 1, 1, d)
        prob = check_attention_args(q, k, v, 0.0, None, False, 0)
        kernel, _, _, nbytes = fa2_forward_tf32.plan(prob, (16, 16), None, feats)
        NW, MW, Bc, DP = fa2_forward_tf32.config_for(d, (16, 16))
        cp = bool(feats["CP_ASYNC"])
        assert kernel is fa2_forward_tf32.fa2_forward_tc_kernel(
            NW, MW, Bc, DP, False, False, DP <= 64 and not cp, sim, cp, False, want, False, cp, False, False
        ), (d, feats)  # HEAVY_FIRST, WARP_SKIP, SPLIT_KV: causal only; Q_ASYNC on the cp.async path
        assert nbytes == 4 * fa2_forward_tf32.smem_floats(NW, MW, Bc, DP, sim, 2 if cp else 1, want)
    with pytest.raises(ValueError, match="WIDE needs CP_ASYNC"):
        fa2_forward_tf32.fa2_forward_tc_kernel(1, 1, 16, 32, False, False, False, sim, False, False, True)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config", [(8, 1, 32, 128), (4, 1, 32, 128), (8, 2, 16, 128)], ids=lambda c: "x".join(map(str, c[:3]))
)
def test_wide_query_blocks_that_see_no_key_on_gpu(rng, config):
    """Causal with s_q > s_k: the first query blocks see no key and run no key block, so no barrier follows their
    Q_i stores; O is staged over Q_i rows, so WIDE needs one there (without it: 0.31 error at 8 x 1 x 32, H100,
    fa2_sweep's check of this shape at d4d510f)."""
    from numba_flash._launch import Allocator

    q, k, v = make_qkv(rng, 1, 1029, 513, 3, 1, 128)
    prob = check_attention_args(q, k, v, 0.0, None, True, 0)
    alloc = Allocator(q)
    fwd = fa2_forward_tf32.forward(*(alloc.to_kernel(x) for x in (q, k, v)), prob, alloc, config=config, features=WIDE)
    out = np.asarray(alloc.result(fwd.out))
    assert_error_rule(
        out, standard_attention(q, k, v, causal=True).O, naive_attention_float32(q, k, v, causal=True), what="O"
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "d", "causal", "bs"),
    [
        (1000, 128, False, None),
        (1000, 128, True, None),
        (1000, 128, True, (256, 16)),
        (1000, 128, False, (128, 32)),
        (777, 96, True, None),
        (2048, 32, False, None),
        (1000, 64, False, None),
        (1000, 64, True, None),
    ],
)
def test_wide_fragment_loads_on_gpu_shapes(rng, n, d, causal, bs):
    _check(rng, 2, n, n, 4, 2, d, causal, 0.0, bs)
