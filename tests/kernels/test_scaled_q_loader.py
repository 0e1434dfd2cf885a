"""Line 4's load of ``Q_i`` times ``tau log2 e`` into SRAM (:func:`numba_flash.fast._tiles.make_scaled_q_loader`, the
FFMA forward's and the 3xTF32 forward's register path).

Claims checked:

* With any ``BATCH`` (loads in flight per pass), the loader writes ``Q`` times ``scale`` rounded once to float32, zero
  rows past ``s_q`` and columns past ``d``, NaNs quieted where asked, swizzled where asked, and leaves the words past
  ``DP`` alone; on a tile that is a multiple of the block's threads (equal shares) and on one that is not (the last
  threads have one element fewer).
"""

from __future__ import annotations

from numba_flash.fast import _tiles

import numpy as np
import pytest
from numba import cuda, float32
from sram_pass_testing import swizzle16_host

QNAN_BITS = 0x7FC00000


@pytest.mark.parametrize(
    ("quiet", "swizzle"), [(False, False), (True, False), (True, True)], ids=["plain", "quiet", "quiet-swizzled"]
)
@pytest.mark.parametrize("NT", [48, 40], ids=["ragged-share", "exact-share"])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_the_loader_writes_q_times_scale_rounded_once_with_any_batch(batch, NT, quiet, swizzle):
    # Dev: BR * DP = 5 * 32 = 160 elements: 4 a thread over 40 threads (exact), over 48 the last threads have 3
    BR, DP, SQ, ROW0, S_Q, D = 5, 32, 36, 3, 6, 29  # rows 3..7 of Q, s_q = 6: rows 6, 7 past it; d = 29 pads to 32
    load_q = _tiles.make_scaled_q_loader(
        BR, DP, NT, SQ, QUIET_NAN=quiet, SWIZZLE=_tiles.swizzle16 if swizzle else None, BATCH=batch
    )
    rng = np.random.default_rng(batch)
    gq = rng.standard_normal((1, 9, 2, D)).astype(np.float32)
    gq[0, 4, 1, 7] = np.uint32(0xFFC00000).view(np.float32)  # a NaN in the tile (head 1, row 4, column 7), not the
    # quiet one
    scale = np.float32(0.18033688)
    TILE = BR * SQ  # Dev: a shared array's shape must be a constant on a GPU, not an expression (the simulator takes
    # either)

    @cuda.jit
    def run(gq, out):
        smem = cuda.shared.array(TILE, float32)
        for i in range(cuda.threadIdx.x, TILE, NT):
            smem[i] = float32(-7.0)  # Dev: a word the loader must not touch (padding past DP) keeps this
        cuda.syncthreads()  # Sync: the tile is filled before the loader overwrites it
        load_q(gq, smem, 0, 0, 1, ROW0, S_Q, D, cuda.threadIdx.x, float32(scale))
        cuda.syncthreads()  # Sync: every thread's stores are done before the copy out
        for i in range(cuda.threadIdx.x, TILE, NT):
            out[i] = smem[i]

    out = np.zeros(TILE, np.float32)
    run[1, NT](gq, out)
    want = np.full((BR, SQ), -7.0, np.float32)
    want[:, :DP] = 0.0
    rows = gq[0, ROW0:S_Q, 1, :]
    want[: S_Q - ROW0, :D] = rows * scale
    if quiet:
        want.view(np.uint32)[np.isnan(want)] = QNAN_BITS
    if swizzle:
        cols = np.array([[swizzle16_host(x, r) for x in range(DP)] for r in range(BR)])
        sw = want.copy()
        for r in range(BR):
            sw[r, cols[r]] = want[r, :DP]
        want = sw
    got = out.reshape(BR, SQ)
    if not quiet:  # Dev: without quieting, the NaN's bits are whatever the product made: compare it as a NaN
        nan = np.isnan(want)
        assert np.isnan(got[nan]).all()
        got, want = np.where(nan, 0, got), np.where(nan, 0, want)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
