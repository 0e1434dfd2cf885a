"""Attention's steps on tensor-core fragments: the masking, row maxima and line 8's ``mma`` steps of ``S``.

These sit above the PTX layer (:mod:`numba_flash.tensorcore.ptx`, which knows nothing of attention) and
below the kernels: they know the m16n8 accumulator layout of a warp's ``S`` tile and FA2's line 8, and
both 3xTF32 forwards and the half forward compose them, so their scores keep the same bits.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from ..device.constants import U
from .ptx import make_warp_ops


@functools.cache
def make_fragment_steps(MW: int, NB: int, BC: int, CAUSAL: bool):
    """``(mask_s, lane_row_max)``: steps on a warp's ``S`` tile held as m16n8 accumulator fragments.

    Both tensor-core forwards (:mod:`~numba_flash.tensorcore.fa2_forward_tf32`, :mod:`~numba_flash.tensorcore.fa2_forward_half`)
    keep ``S_i^(j)`` as ``MW x NB`` fragments in ``rS``: fragment ``(mt, nt)`` is ``rS[(mt NB + nt) 4 + c]``,
    lane ``(g, t)`` holding row ``16 mt + 8 (c // 2) + g`` and column ``8 nt + 2t + c % 2`` of the warp's tile.

    * ``mask_s(rS, row0, wrow, g, t, col0, s_k, causal_offset)``: ``-inf`` at the columns past ``s_k`` and
      (``CAUSAL``) above the diagonal, on the key blocks where any can occur (the ragged last block, the
      blocks the diagonal crosses); other blocks are left as they are.
    * ``lane_row_max(rS, r)``: the max of this lane's ``2 NB`` values of row slot ``r`` (m16 tile ``r // 2``,
      rows ``g`` / ``g + 8`` for ``r % 2`` = 0 / 1); the quad's 4 lanes then reduce it.
    """
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline="always")
    def mask_s(rS, row0, wrow, g, t, col0, s_k, causal_offset):
        if col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset):
            for mt in range(MW):
                for nt in range(NB):
                    for c in range(4):
                        row = row0 + int(wrow) + 16 * mt + 8 * (c // 2) + int(g)
                        col = col0 + 8 * nt + 2 * int(t) + c % 2
                        if col >= s_k or (CAUSAL and col > row + causal_offset):
                            rS[(mt * NB + nt) * 4 + c] = NEG_INF

    @cuda.jit(device=True, inline="always")
    def lane_row_max(rS, r):
        mt, hf = r // 2, r % 2
        mx = rS[mt * NB * 4 + 2 * hf]
        for nt in range(NB):
            for cc in range(2):
                mx = max(mx, rS[(mt * NB + nt) * 4 + 2 * hf + cc])
        return mx

    return mask_s, lane_row_max


def make_s_steps(MW: int, NB: int, SIM: bool):
    """``(load_q_pair, split_a_pair, s_tile_step)``: line 8's steps of the 3xTF32 forward
    (:mod:`~numba_flash.tensorcore.fa2_forward_tf32`), whose scores the 3xTF32 backward recomputes bit for bit in this
    order. ``S`` is held as in
    :func:`make_fragment_steps` (``MW x NB`` m16n8 fragments in ``rS``).

    * ``load_q_pair(smem, rQw, OFF_Q, wrow, g, uSQ, csw)`` (``WIDE``): this lane's 4 columns ``csw ..`` (one 16-byte
      chunk of a swizzled row) of rows ``g`` and ``g + 8`` of each m16 tile of ``Q_i`` into ``rQw`` (8 a tile): two
      8-wide k steps' A operands.
    * ``split_a_pair(rQw, rAb, rAs, h2)`` (``WIDE``): the tf32 parts of the A fragments of the pair's k step ``h2 / 2``
      (``a = (Q[g, c], Q[g + 8, c], Q[g, c + 1], Q[g + 8, c + 1])``, c the lane's column ``h2`` of the chunk).
    * ``s_tile_step(rS, rAb, rAs, nt, bb0, bb1, bs0, bs1, sx, wbase, lane)``: one 8-wide k step of key tile ``nt`` for the
      warp's ``MW`` m16 tiles (3xTF32), into a zeroed accumulator, added to ``S`` with IEEE float32 adds.
    """
    split, mma3, _, _ = make_warp_ops(SIM)

    @cuda.jit(device=True, inline="always")
    def load_q_pair(smem, rQw, OFF_Q, wrow, g, uSQ, csw):
        for mt in range(MW):
            q0 = OFF_Q + (wrow + U(16 * mt) + g) * uSQ + csw
            for e in range(4):
                rQw[mt * 8 + e] = smem[q0 + U(e)]
                rQw[mt * 8 + 4 + e] = smem[q0 + U(8) * uSQ + U(e)]

    @cuda.jit(device=True, inline="always")
    def split_a_pair(rQw, rAb, rAs, h2):
        for mt in range(MW):
            for c in range(4):
                rAb[mt * 4 + c], rAs[mt * 4 + c] = split(rQw[mt * 8 + 4 * (c % 2) + h2 + c // 2])

    @cuda.jit(device=True, inline="always")
    def s_tile_step(rS, rAb, rAs, nt, bb0, bb1, bs0, bs1, sx, wbase, lane):
        for mt in range(MW):
            f = (mt * NB + nt) * 4
            acc = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))  # Dev: this k step alone, added to S below
            acc = mma3((rAb[mt * 4], rAb[mt * 4 + 1], rAb[mt * 4 + 2], rAb[mt * 4 + 3]),
                       (rAs[mt * 4], rAs[mt * 4 + 1], rAs[mt * 4 + 2], rAs[mt * 4 + 3]), (bb0, bb1), (bs0, bs1), acc, sx, wbase, lane)
            for c in range(4):
                rS[f + c] = rS[f + c] + acc[c]

    return load_q_pair, split_a_pair, s_tile_step
