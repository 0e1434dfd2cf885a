"""The 3xTF32 forward's causal warps that skip the key blocks none of their rows sees (``WARP_SKIP``,
:mod:`numba_flash.tensorcore.fa2_forward_tf32`).

With causal masking a thread block visits the key blocks up to its *last* row's horizon (FA2 section 3.1's block
skipping). On the diagonal, the warps of its earlier rows then meet key blocks whose every score is masked for them;
``WARP_SKIP`` lets such a warp go on to the next barrier instead of computing an all ``-inf`` S, a P~ of zeros and a
P~ V_j of zeros (lines 8-10).

Claims checked:

* The predicate (:func:`numba_flash.fast._tiles.make_warp_horizon`) is true exactly when every score of the warp's rows
  in the key block is masked, brute-forced over rows, key blocks and causal offsets (s_q above and below s_k) in a
  kernel.
* It is on by default with causal on a GPU up to d = 64 (above it lost on an H100), never without causal, and never
  in the simulator, whose ``mma`` exchanges fragments through block barriers that every warp must reach (the kernel
  factory refuses it there).
* On a GPU (marker ``gpu``): with and without it, O, L, m, l are bitwise equal at realistic shapes (ragged, s_q below
  and above s_k, GQA, dropout) and at every causal tiling the defaults use (4 x 1 x 32, 4 x 2 x 16, 8 x 2 x 16 at
  d = 128; 4 x 2 x 32 at d = 64).
"""

from __future__ import annotations

from numba_flash._launch import check_attention_args
from numba_flash.fast import _tiles
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_forward_tf32

import numpy as np
import pytest
from attn_testing import assert_causal_tc_feature_keeps_the_bits, make_qkv
from numba import cuda


@pytest.mark.parametrize("rows", [16, 32])
def test_a_warp_sees_no_key_exactly_when_all_its_scores_are_masked(rows):
    sees_no_key = _tiles.make_warp_horizon(rows)
    BC, offsets, row_firsts, col0s = 16, (-40, -15, -3, 0, 1, 5, 17, 37), range(0, 96, 16), range(0, 160, 16)
    cases = np.array([(r, c, o) for r in row_firsts for c in col0s for o in offsets], dtype=np.int32)

    @cuda.jit
    def run(cases, out):
        i = cuda.grid(1)
        if i < cases.shape[0]:
            out[i] = 1 if sees_no_key(cases[i, 0], cases[i, 1], cases[i, 2]) else 0

    out = np.full(len(cases), -1, np.int32)
    run[(len(cases) + 63) // 64, 64](cases, out)
    # Dev: brute force: a score (row, col) is masked where col > row + causal_offset (the kernels' mask_s)
    want = [all(col > row + o for row in range(r, r + rows) for col in range(c, c + BC)) for r, c, o in cases]
    np.testing.assert_array_equal(out.astype(bool), want)
    assert 0 < sum(want) < len(want), "both outcomes occur"


def test_warp_skip_is_on_with_causal_on_a_gpu_up_to_d64_only():
    assert fa2_forward_tf32.default_features()["WARP_SKIP"] is None
    on = fa2_forward_tf32.warp_skip_on
    assert (
        on(None, True, False, 64)
        and on(None, True, False, 16)
        and on(True, True, False, 128)
        and not on(False, True, False, 64)
    )
    # H100: 1.00-1.10x at d = 64 in 9 of 12 cells (0.981-0.995x in 3); at d = 128 0.91-1.02x (the GPU's build keeps
    # 8-16 B in local memory)
    assert not on(None, True, False, 128) and not on(None, True, False, 96), "above d = 64 it lost at N 512-4k"
    assert not on(None, False, False, 64) and not on(True, False, False, 64), (
        "without causal no warp's scores are all masked"
    )
    assert not on(None, True, True, 64) and not on(True, True, True, 64), (
        "the simulator's mma needs every warp at its barriers"
    )
    sim = _backend.is_simulator()
    with pytest.raises(ValueError, match="WARP_SKIP needs CAUSAL and a GPU"):
        fa2_forward_tf32.fa2_forward_tc_kernel(1, 1, 8, 8, False, False, False, False, WARP_SKIP=True)
    with pytest.raises(ValueError, match="WARP_SKIP needs CAUSAL and a GPU"):
        fa2_forward_tf32.fa2_forward_tc_kernel(1, 1, 8, 8, True, False, False, True, WARP_SKIP=True)
    q, k, v = make_qkv(np.random.default_rng(0), 1, 40, 40, 1, 1, 16)
    prob = check_attention_args(q, k, v, 0.0, None, True, 0)
    kernels = [fa2_forward_tf32.plan(prob, (32, 16), None, {"WARP_SKIP": ws})[0] for ws in (True, False)]
    assert (kernels[0] is kernels[1]) == sim, "on a GPU the feature compiles another kernel; in the simulator it is off"


#: (b, s_q, s_k, h, h_k, d, dropout p, block sizes or None for the default): ragged, s_q below and above s_k (query
#: blocks with rows that see no key), GQA, dropout, and each causal tiling the defaults use
GPU_CASES = [
    (2, 1000, 1000, 4, 2, 128, 0.0, None),
    (2, 1000, 1000, 4, 2, 128, 0.0, (64, 32)),
    (2, 2049, 2049, 4, 1, 128, 0.0, (128, 16)),
    (1, 1000, 1531, 4, 2, 128, 0.1, (256, 16)),
    (1, 1531, 1000, 4, 2, 128, 0.0, (128, 16)),
    (2, 1029, 1029, 4, 2, 64, 0.17, None),
    (2, 777, 777, 4, 4, 96, 0.0, None),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "p", "bs"), GPU_CASES)
def test_warp_skip_keeps_the_outputs_bit_for_bit_on_gpu(rng, b, s_q, s_k, h, h_k, d, p, bs):
    assert_causal_tc_feature_keeps_the_bits(
        rng, b, s_q, s_k, h, h_k, d, p, bs, {"WARP_SKIP": True}, {"WARP_SKIP": False}, "WARP_SKIP"
    )
