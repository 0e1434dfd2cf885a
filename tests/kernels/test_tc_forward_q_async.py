"""The 3xTF32 forward's two loads of Q_i (:mod:`numba_flash.tensorcore.fa2_forward_tf32`, ``Q_ASYNC``).

FA2 Algorithm 1 line 4 loads ``Q_i`` once per thread block. The register load (each thread's share of ``Q_i`` times
``tau log2 e``, then stored to SRAM) is a loop that ptxas does not unroll, whose each load is consumed before the next
is issued, so each block began with 64-128 HBM round trips in a row. ``Q_ASYNC`` copies ``Q_i`` by ``cp.async`` in
flight with ``K_1, V_1`` and scales each thread's own chunks in SRAM after the wait.

Claims checked:

* Both loads compute the same thing: bitwise equal O, L, m, l on ragged, causal (query blocks whose rows see no key
  included), GQA, dropout and ``MW = 2`` shapes, with and without ``WIDE`` (swizzled Q rows), at a head dim whose
  padded rows end in a chunk past d; and with NaNs in Q (the scaling pass quiets them, as the register load does).
* ``Q_ASYNC`` is on by default on the ``cp.async`` path, never off it, and a ``q`` whose rows are not 16-byte aligned
  takes the register load while K and V keep ``cp.async``.
* The scaling pass multiplies exactly the calling thread's chunks, with the register load's float32 rounding.
* On a GPU (marker ``gpu``): the two loads are bitwise equal at realistic shapes and the default tilings.

Simulator shapes stay tiny (N <= 45, d <= 32): each ``mma`` is a lane exchange with two block barriers there.
"""

from __future__ import annotations

from numba_flash._launch import check_attention_args
from numba_flash.fast import _plan, _tiles
from numba_flash.tensorcore import fa2_forward_tf32

import numpy as np
import pytest
from attn_testing import TC_FORWARD_SRAM_CASES, assert_same_bits, make_qkv, run_tc_forward, unaligned_copy
from numba import cuda, float32

#: two of :data:`TC_FORWARD_SRAM_CASES` (dropout; query blocks without keys), WIDE off; a smaller twin of its
#: padded-chunk case (d = 20 pads to 24: the last chunk of a row is past d); and cases at d = 32, where ``WIDE`` can run
#: (swizzled Q_i rows), one of them ``MW = 2``
CASES = [
    pytest.param(*c[:-1], False, id=c[-1])
    for c in TC_FORWARD_SRAM_CASES
    if c[-1] in ("causal-dropout-d12", "causal-sq>sk-blocks-without-keys-d8")
] + [
    pytest.param(1, 19, 21, 2, 1, 20, True, 0.0, (16, 8), False, id="causal-gqa-d20-padded-chunk"),
    pytest.param(1, 21, 24, 2, 1, 32, False, 0.0, (16, 8), True, id="wide-ragged-gqa-d32"),
    pytest.param(1, 45, 14, 1, 1, 32, True, 0.0, (16, 8), True, id="wide-causal-sq>sk-blocks-without-keys-d32"),
    pytest.param(1, 21, 19, 1, 1, 32, True, 0.1, (128, 8), True, id="wide-mw2-4warps-causal-dropout-d32"),
]


def _run(q, k, v, causal, p, seed, bs, q_async, wide, words=None):
    """The tc forward at kernel level with ``Q_ASYNC`` = ``q_async``: ((O, L, m, l) as NumPy, features it ran with)."""
    return run_tc_forward(q, k, v, causal, p, seed, bs, {"Q_ASYNC": q_async, "WIDE": wide}, words)


@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs", "wide"), CASES)
def test_q_by_cp_async_equals_the_register_load_bit_for_bit(rng, b, s_q, s_k, h, h_k, d, causal, p, bs, wide):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (a_out, a_feats), (r_out, r_feats) = (_run(q, k, v, causal, p, seed, bs, qa, wide) for qa in (True, False))
    assert a_feats["Q_ASYNC"] and not r_feats["Q_ASYNC"]
    assert_same_bits(a_out, r_out, "Q_i by cp.async and by registers")


def test_nans_in_q_stay_nans_when_q_arrives_by_cp_async(rng):
    q, k, v = make_qkv(rng, 1, 20, 23, 1, 1, 16)
    q[0, 5, 0, 3] = np.float32(np.nan)  # one query row's scores are NaN
    q[0, 17, 0, 9] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # the GPU's canonical NaN
    (a_out, _), (r_out, _) = (_run(q, k, v, False, 0.0, 0, (16, 16), qa, False) for qa in (True, False))
    assert_same_bits(a_out, r_out, "Q_i by cp.async and by registers")
    assert np.isnan(a_out[0][0, [5, 17]]).all() and not np.isnan(np.delete(a_out[0][0], [5, 17], axis=0)).any()


def test_q_async_is_the_default_on_the_cp_async_path_and_unaligned_q_takes_the_register_load(rng):
    assert fa2_forward_tf32.default_features()["Q_ASYNC"] is None
    assert _plan.async_on(None, True) and not _plan.async_on(None, False)
    assert not _plan.async_on(True, False), "Q_ASYNC needs the cp.async path"
    assert not _plan.async_on(False, True)
    with pytest.raises(ValueError, match="Q_ASYNC needs CP_ASYNC"):
        fa2_forward_tf32.fa2_forward_tc_kernel(1, 1, 8, 8, False, False, False, True, Q_ASYNC=True)
    q, k, v = make_qkv(rng, 1, 20, 20, 1, 1, 16)
    shifted = unaligned_copy(q)
    assert not _plan.aligned16(shifted)
    out, feats = _run(q, k, v, False, 0.0, 0, (16, 16), None, False, words=[shifted, k, v])
    assert feats["Q_ASYNC"] is False and feats.get("CP_ASYNC", True), "unaligned Q: register load, K and V by cp.async"
    aligned, aligned_feats = _run(q, k, v, False, 0.0, 0, (16, 16), None, False)
    assert aligned_feats["Q_ASYNC"] is None, "aligned Q: the default (on) is left alone"
    assert_same_bits(out, aligned, "Q_i by registers (unaligned q) and by cp.async")
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    for feats in ({"Q_ASYNC": True}, {"Q_ASYNC": None}, {"Q_ASYNC": False}, {"Q_ASYNC": True, "CP_ASYNC": False}):
        assert (
            fa2_forward_tf32.plan(prob, (16, 16), None, feats)[0]
            is fa2_forward_tf32.plan(
                prob,
                (16, 16),
                None,
                {**feats, "Q_ASYNC": _plan.async_on(feats["Q_ASYNC"], feats.get("CP_ASYNC", True))},
            )[0]
        )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # Dev: the simulator's NumPy, on the NaN
def test_the_scaling_pass_scales_exactly_the_threads_chunks():
    NROWS, DW, NT, SA = 4, 8, 4, 12
    scale_pass = _tiles.make_quiet_nan_pass(NROWS, DW, NT, SA, SCALE=True)

    @cuda.jit
    def run(tile, scale):
        smem = cuda.shared.array(48, float32)  # (NROWS, SA)
        tid = cuda.threadIdx.x
        for i in range(tid, NROWS * SA, NT):
            smem[i] = tile[i]
        cuda.syncthreads()  # Sync: the tile is in SRAM before the pass
        scale_pass(smem, 0, tid, float32(scale))
        cuda.syncthreads()  # Sync: every thread's pass is done before the copy out
        for i in range(tid, NROWS * SA, NT):
            tile[i] = smem[i]

    rng = np.random.default_rng(3)
    vals = rng.standard_normal(NROWS * SA).astype(np.float32)
    vals[25] = np.float32(np.inf)
    vals.view(np.uint32)[3] = 0x7F800001  # a NaN with a payload: times the scale it keeps one, unless quieted
    tile = vals.copy()
    scale = np.float32(0.3 * np.log2(np.e))
    chunk = (np.arange(NROWS * SA) % SA) < DW  # the chunks (columns < DW); the padding words are nobody's
    run[1, NT](tile, scale)
    with np.errstate(invalid="ignore"):  # the signalling NaN times the scale
        want = np.where(chunk, (vals * scale).astype(np.float32), vals)
    want[3] = np.frombuffer(np.uint32(0x7FC00000).tobytes(), np.float32)[0]
    np.testing.assert_array_equal(tile.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "d", "causal"), [(1000, 128, False), (1000, 128, True), (777, 96, True), (2048, 64, False)]
)
def test_q_by_cp_async_equals_the_register_load_on_gpu_shapes(rng, n, d, causal):
    q, k, v = make_qkv(rng, 2, n, n, 4, 2, d)
    NW, MW, Bc, _ = fa2_forward_tf32.config_for(d, None, True, causal, n)  # the default tiling
    bs = (16 * MW * NW, Bc)
    wide = fa2_forward_tf32.wide_on(None, 8 * ((d + 7) // 8), True)
    (a_out, a_feats), (r_out, _) = (_run(q, k, v, causal, 0.0, 0, bs, qa, wide) for qa in (True, False))
    assert a_feats["Q_ASYNC"]
    assert_same_bits(a_out, r_out, "Q_i by cp.async and by registers")
