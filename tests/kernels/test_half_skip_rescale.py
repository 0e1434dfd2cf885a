"""The half forward's rescale of O skipped by a warp whose rows kept their max (``SKIP_RESCALE`` of
:mod:`numba_flash.fast.fa2_forward_half`).

Line 10 of FA2's Algorithm 1 rescales ``O_i`` by ``diag(e^(m_old - m_new))`` every key block; where no row of a
warp found a larger max in block j every factor is exactly 1, and the warp may skip the multiplications.

Claims checked:

* ``warp_all`` of :func:`numba_flash.fast._mma.make_warp_all` is true for a warp exactly when every lane of it
  says so (each warp decides alone).
* With ``SKIP_RESCALE`` the forward gives bitwise equal O, L, m, l to the forward without it on ragged, causal,
  GQA, dropout and ``MW = 2`` shapes of several key blocks (rows whose max grows in a later block, beside rows
  whose max does not), in fp16 and bf16, and on inputs whose first key block holds every row's max (every later
  block skips).
* On a GPU (marker ``gpu``): bitwise equal at realistic shapes.
"""

from __future__ import annotations

from numba_flash import _backend
from numba_flash.fast import _mma

import numpy as np
import pytest
from attn_testing import HALF_FEATURE_GPU_SHAPES, HALF_FORWARD_FEATURE_CASES, assert_half_feature_keeps_bits, half_inputs, make_qkv
from numba import cuda

torch = pytest.importorskip("torch")

DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]


def test_warp_all_is_true_exactly_when_every_lane_of_the_warp_says_so():
    sim = _backend.is_simulator()
    warp_all = _mma.make_warp_all(sim)
    scratch = _mma.HALF_SIM_SCRATCH_PER_WARP
    nsx = 2 * scratch  # a shared array's shape must be a constant, not an expression (the simulator does not check)

    @cuda.jit
    def run(pred, out):
        sx = cuda.shared.array(nsx, np.float32)  # the simulator's lane exchange (unused on a GPU)
        i = cuda.threadIdx.x
        lane, warp = i % 32, i // 32
        out[i] = 1 if warp_all(pred[i] != 0, sx, warp * scratch, lane) else 0

    cases = {
        "all yes": np.ones(64, np.int32),
        "one lane of warp 0 says no": np.where(np.arange(64) == 17, 0, 1).astype(np.int32),
        "lane 31 of warp 1 says no": np.where(np.arange(64) == 63, 0, 1).astype(np.int32),
        "all no": np.zeros(64, np.int32),
    }
    for name, pred in cases.items():
        out = np.full(64, -1, np.int32)
        run[1, 64](pred, out)
        want = np.repeat([pred[:32].all(), pred[32:].all()], 32).astype(np.int32)
        np.testing.assert_array_equal(out, want, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", HALF_FORWARD_FEATURE_CASES, ids=[c[-1] for c in HALF_FORWARD_FEATURE_CASES])
def test_skipping_the_rescale_by_1_gives_the_same_bits(rng, dtype, case):
    b, s_q, s_k, h, h_k, d, causal, p, bs, _ = case
    th = half_inputs(rng, dtype, b, s_q, s_k, h, h_k, d)
    assert_half_feature_keeps_bits(th, causal, p, int(rng.integers(0, 2**32)), bs, "SKIP_RESCALE")


def test_same_bits_when_the_first_key_block_holds_every_rows_max(rng):
    """Queries of positive entries and the first key block's keys raised by 2 in every entry: the first block holds
    every row's max, so each later block's factors are all 1 and every warp skips (the random cases only now and
    then)."""
    q, k, v = make_qkv(rng, 1, 24, 64, 1, 1, 32)
    q, k = np.abs(q), k.copy()
    k[:, :16] += 2.0  # scores of the first block up by 2 sum(q) > 0
    th = [torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16) for x in (q, k, v)]
    assert_half_feature_keeps_bits(th, False, 0.0, 0, (16, 16), "SKIP_RESCALE")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d", "causal"), HALF_FEATURE_GPU_SHAPES)
def test_skipping_the_rescale_gives_the_same_bits_on_gpu_shapes(rng, dtype, n, d, causal):
    th = half_inputs(rng, dtype, 2, n, n, 4, 2, d, device="cuda")
    assert_half_feature_keeps_bits(th, causal, 0.0, 0, None, "SKIP_RESCALE")
