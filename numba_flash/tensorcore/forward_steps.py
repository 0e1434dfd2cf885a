"""FA2 forward steps that both tensor-core forwards compose: one piece per step, not a copy per kernel.

The 3xTF32 forward (:mod:`~numba_flash.tensorcore.fa2_forward_tf32`) and the fp16/bf16 forward
(:mod:`~numba_flash.tensorcore.fa2_forward_half`) run FA2's Algorithm 1 with one warp per ``16 MW`` query rows and
``S``, ``O`` held as m16n8 accumulator fragments (:func:`numba_flash.tensorcore.fragments.make_fragment_steps`). What
differs between them is the product of lines 8 and 10 (three TF32 ``mma`` against one half ``mma``) and the layout
of their tiles; the steps around the products are the same logic, so they live here once:

* :func:`make_query_block`: which query block and (batch, head) a thread block owns (line 3);
* :func:`make_init_o_l_m`: line 5, ``O_i = 0, l_i = 0, m_i = -inf`` (and the dropout row keys);
* :func:`make_kv_pipeline`: line 7, ``K_j, V_j`` into SRAM, by ``cp.async`` into two stages or through registers;
* :func:`make_online_softmax`: line 9, the row max, ``P~ = exp2(S - m_new)`` and the row sum;
* :func:`make_write_o_l`: lines 12-15, ``O_i / l_i`` and ``L_i`` to HBM.

Each factory returns ``@cuda.jit(device=True, inline="always")`` functions whose trip counts are the factory's
compile-time constants, so a kernel built from them compiles to the code it had with the steps written inline. The
paper tags stand at the kernels' call sites.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

from ..device.constants import U
from ..device.dropout import head_key, keep, row_key
from ..device.grid import folded_batch_head
from ..fast import _regtile, _tiles
from . import fragments, ptx


@functools.cache
def make_query_block(HEAVY_FIRST: bool):
    """``query_block(nbatch, nheads) -> (i, bh, b, h)``: the query block ``i`` of this thread block and its (batch,
    head), ``bh = b nheads + h``.

    Each head's query blocks start heaviest first (``i = Tr - 1 - blockIdx.x``; under a causal mask the last query
    block visits the most key blocks) and ``bh`` is the folded grid's (:func:`numba_flash.device.grid.folded_batch_head`).
    ``HEAVY_FIRST``: the blocks of all heads start heaviest first (:func:`numba_flash.fast._tiles.make_query_block_order`);
    ``i`` is then negative for the padding of the folded grid. Past ``batch`` (``b >= nbatch``) or past ``Tr``
    (``i < 0``) the kernel returns.
    """
    order = _tiles.make_query_block_order(HEAVY_FIRST)

    @cuda.jit(device=True, inline="always")
    def query_block(nbatch, nheads):
        i, bh = order(nbatch * nheads)
        if HEAVY_FIRST:
            return i, bh, bh // nheads, bh % nheads
        _, b, h = folded_batch_head(nheads)
        return i, bh, b, h

    return query_block


@functools.cache
def make_init_o_l_m(MW: int, NO: int, DROPOUT: bool):
    """``init_o_l_m(rO, rm, rl, rkey, seed, bh, row0, wrow, g)``: line 5 on a warp's fragments: the ``NO`` registers of
    ``O_i`` zero, and for each of the lane's ``2 MW`` rows (slot ``r``: m16 tile ``r // 2``, row ``g + 8 (r % 2)``)
    ``m_i = -inf``, ``l_i = 0`` and (``DROPOUT``) the row's key of the counter hash
    (:func:`numba_flash.device.dropout.row_key`)."""
    NR = 2 * MW
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline="always")
    def init_o_l_m(rO, rm, rl, rkey, seed, bh, row0, wrow, g):
        for a in range(NO):
            rO[a] = float32(0.0)
        for r in range(NR):
            rm[r] = NEG_INF
            rl[r] = float32(0.0)
            rkey[r] = uint64(0)
            if DROPOUT:  # row of slot r: m16 tile r // 2, half r % 2
                rkey[r] = row_key(head_key(seed, bh), row0 + int(wrow) + 16 * (r // 2) + 8 * (r % 2) + int(g))

    return init_o_l_m


@cuda.jit(device=True, inline="always")
def no_pass(smem, words, kbase, vbase, j, tid, scale, aux):
    """The pass of a kernel whose ``cp.async`` tiles are used as they land (:func:`make_kv_pipeline`)."""


@functools.cache
def make_kv_pipeline(BC: int, OFF_K, OFF_V, uSTAGE, V_STAGED: bool, CP_ASYNC: bool, PREFETCH: bool, Q_ASYNC: bool,
                     load_q_async, load_k_async, load_v_async, cp_commit, cp_wait0, load_pair, store_pair,
                     landed=no_pass):
    """``(load_kv_first, load_kv)``: line 7, the key blocks ``K_j, V_j`` into SRAM, by one of two paths.

    ``load_kv_first(smem, gQ, gK, gV, ub, uh, uhk, row0, s_q, s_k, d, tid, rKn, rVn)`` starts block 0 before the
    loop (and, ``Q_ASYNC``, line 4's copies of ``Q_i`` in the same ``cp.async`` group).
    ``load_kv(smem, words, gK, gV, ub, uhk, j, n_blocks, s_k, d, tid, scale, rKn, rVn, aux) -> (kbase, vbase)`` makes block
    ``j`` visible to all warps and returns where it lies.

    * ``CP_ASYNC``: a two-stage pipeline. Block ``j`` lives in SRAM stage ``j % 2`` (``uSTAGE`` words past stage 0;
      ``V_STAGED`` False: ``V_j`` in one stage, read only by the thread that copied it). A thread waits for its own
      copies of block ``j`` and runs ``landed(smem, words, kbase, vbase, j, tid, scale, aux)`` on them, the kernel's
      pass over its own chunks (NaN to quiet NaN, the tf32 split, ``Q_i``'s scale at ``j = 0``; ``aux`` is the
      kernel's argument to it).
    * Registers (``load_pair(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)`` into ``rKn, rVn``,
      ``store_pair(smem, off_k, off_v, tid, rKn, rVn)`` from them): one SRAM stage; a barrier before the stores
      (every warp is done with block ``j - 1``).

    Then one barrier publishes block ``j`` (and, ``CP_ASYNC``, retires block ``j - 1``'s stage), and block ``j + 1`` is
    put on its way: its copies into the other stage (``CP_ASYNC``) or, ``PREFETCH``, its loads into the registers, so
    they are in flight while the warps compute on block ``j``.
    """

    @cuda.jit(device=True, inline="always")
    def load_kv_first(smem, gQ, gK, gV, ub, uh, uhk, row0, s_q, s_k, d, tid, rKn, rVn):
        if CP_ASYNC:
            if Q_ASYNC:  # line 4's copies, in flight with K_1, V_1 (a block whose rows see no key never reads Q_i)
                load_q_async(smem, U(0), gQ, ub, uh, row0, s_q, d, tid)  # HBM read: Br*d
            load_k_async(smem, OFF_K, gK, ub, uhk, 0, s_k, d, tid)  # HBM read: Bc*d
            load_v_async(smem, OFF_V, gV, ub, uhk, 0, s_k, d, tid)  # HBM read: Bc*d
            cp_commit()
        else:
            load_pair(gK, gV, ub, uhk, 0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d

    @cuda.jit(device=True, inline="always")
    def load_kv(smem, words, gK, gV, ub, uhk, j, n_blocks, s_k, d, tid, scale, rKn, rVn, aux):
        col0 = j * BC
        stage = U(j % 2) * uSTAGE if CP_ASYNC else U(0)  # CP_ASYNC: block j in stage j % 2
        kbase = OFF_K + stage
        vbase = OFF_V + stage if V_STAGED else OFF_V
        if CP_ASYNC:
            cp_wait0()  # this thread's copies of K_j, V_j have landed (and, j = 0, of Q_i)
            landed(smem, words, kbase, vbase, j, tid, scale, aux)
        else:
            cuda.syncthreads()  # Sync: all warps are done with K_{j-1}, V_{j-1} (and Q_i is stored) before the stores
            if not PREFETCH and j > 0:
                load_pair(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
            store_pair(smem, OFF_K, OFF_V, tid, rKn, rVn)
        cuda.syncthreads()  # Sync: all of K_j, V_j in SRAM (and Q_i stored) before L8/L10; CP_ASYNC: all warps done with block j-1's stage before it is refilled
        if j + 1 < n_blocks:  # block j+1 on its way during L8-L10 of block j
            if CP_ASYNC:  # into the other stage
                load_k_async(smem, OFF_K + (uSTAGE - stage), gK, ub, uhk, col0 + BC, s_k, d, tid)  # HBM read: Bc*d
                vnext = OFF_V + (uSTAGE - stage) if V_STAGED else OFF_V
                load_v_async(smem, vnext, gV, ub, uhk, col0 + BC, s_k, d, tid)  # HBM read: Bc*d
                cp_commit()
            elif PREFETCH:  # into the registers
                load_pair(gK, gV, ub, uhk, col0 + BC, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
        return kbase, vbase

    return load_kv_first, load_kv


@functools.cache
def make_word_pair_loader(NROWS: int, DW: int, NT: int, SA: int):
    """``(NL, load_pair, store_pair)``: :func:`numba_flash.fast._tiles.make_word_loader` for ``K_j`` and ``V_j`` at once,
    with the signatures of :func:`numba_flash.fast._tiles.make_pair_loader` that :func:`make_kv_pipeline` takes."""
    NL, load, store = _tiles.make_word_loader(NROWS, DW, NT, SA)

    @cuda.jit(device=True, inline="always")
    def load_pair(gK, gV, ub, uhk, row0, n_rows, dw, tid, rK, rV):
        load(gK, ub, uhk, row0, n_rows, dw, tid, rK)
        load(gV, ub, uhk, row0, n_rows, dw, tid, rV)

    @cuda.jit(device=True, inline="always")
    def store_pair(smem, off_k, off_v, tid, rK, rV):
        store(smem, off_k, tid, rK)
        store(smem, off_v, tid, rV)

    return NL, load_pair, store_pair


@functools.cache
def make_online_softmax(MW: int, NB: int, BC: int, CAUSAL: bool, DROPOUT: bool, SIM: bool, exp2, SCALE_S: bool,
                        P_SRAM: bool = False, OFF_P: int = 0, SP: int = 0):
    """``online_softmax(rS, rm, rl, ralpha, rkey, smem, col0, wrow, g, t, scale, threshold, sx, wbase, lane)``: line 9 on
    a warp's ``S`` fragments, row slot by row slot (:func:`numba_flash.tensorcore.fragments.make_fragment_steps`).

    ``m_new = max(m_old, rowmax S)`` (the lane's ``2 Bc / 8`` values, then its quad), ``ralpha = 2^(m_old - m_new)``
    (0 while ``m_old = -inf``; a row with no key yet subtracts 0, not ``-inf``, so no NaN), ``P~ = exp2(S - m_new)``
    and ``l_i = ralpha l_i + rowsum P~`` kept per lane (the quad is summed once, after the loop). ``l`` adds the
    undropped ``P~`` (FA1 Alg.2 L13); ``DROPOUT`` zeroes the dropped entries of ``P~`` (the ``1 / (1 - p)`` is applied
    once, at line 12). ``SCALE_S``: ``S`` is unscaled and ``tau log2 e`` (``scale``) multiplies it here (the half
    forward; the 3xTF32 forward scaled ``Q_i``). ``exp2``: ``math.exp2`` or :func:`numba_flash.tensorcore.ptx.make_exp2`'s.
    ``P~`` goes back into ``rS`` (the half forward, whose ``P~ V_j`` takes it from the registers) or, ``P_SRAM``, to the
    warp's own rows of the SRAM tile at ``OFF_P`` (row stride ``SP``; the 3xTF32 forward reads it back in the A layout).
    """
    NR = 2 * MW
    NEG_INF = float32(-math.inf)
    uSP, uOFF_P = U(SP), U(OFF_P)
    _, _, quad_max, _ = ptx.make_warp_ops(SIM)
    _, lane_row_max = fragments.make_fragment_steps(MW, NB, BC, CAUSAL)

    @cuda.jit(device=True, inline="always")
    def online_softmax(rS, rm, rl, ralpha, rkey, smem, col0, wrow, g, t, scale, threshold, sx, wbase, lane):
        for r in range(NR):
            mt, hf = r // 2, r % 2
            mx = quad_max(lane_row_max(rS, r), sx, wbase, lane)
            if SCALE_S:
                mx = mx * scale
            m_new = max(rm[r], mx)
            m_safe = m_new if m_new != NEG_INF else float32(0.0)  # Dev: a row with no key yet: no NaN
            ralpha[r] = exp2(rm[r] - m_safe)  # e^(m_old - m_new) in base 2 (0 when m_old = -inf)
            rm[r] = m_new
            psum = float32(0.0)
            for nt in range(NB):
                for cc in range(2):
                    f = (mt * NB + nt) * 4 + 2 * hf + cc
                    s = rS[f]
                    if SCALE_S:
                        s = s * scale
                    p = exp2(s - m_safe)
                    psum += p  # l from the undropped P~ (FA1 Alg.2 L13)
                    if DROPOUT:  # Dev: as FA1 Alg.2 L14; the 1/(1-p) is applied once, at L12
                        if not keep(rkey[r], col0 + 8 * nt + 2 * int(t) + cc, threshold):
                            p = float32(0.0)
                    if P_SRAM:
                        smem[uOFF_P + (wrow + U(16 * mt + 8 * hf) + g) * uSP + U(8 * nt + cc) + U(2) * t] = p
                    else:
                        rS[f] = p
            rl[r] = ralpha[r] * rl[r] + psum

    return online_softmax


@functools.cache
def make_write_o_l(MW: int, SIM: bool, DROPOUT: bool, store_o_row):
    """``write_o_l(gO, gL, gm, gl, smem, rO, rm, rl, b, h, ub, uh, row0, wrow, g, t, s_q, d, sx, wbase, lane,
    dropout_scale)``: lines 12-15 for the lane's ``2 MW`` rows.

    The per-lane row sums are added across the quad, once; for each row inside ``s_q``: ``inv_l = 1 / l_i`` (times
    ``1 / (1 - p)``; :func:`numba_flash.fast._regtile.make_inverse_row_sum`), ``L_i = m_i ln 2 + ln l_i`` with ``m_i``
    and ``l_i`` apart for the backward (:func:`numba_flash.fast._regtile.make_natural_stats`), the row of ``O_i`` times
    ``inv_l`` by the kernel's ``store_o_row(gO, smem, rO, ub, row, uh, mt, hf, wrow, g, t, d, inv_l)`` (its layout of
    O in HBM), and ``L_i, m_i, l_i`` by one lane of the quad.
    """
    NR = 2 * MW
    _, _, _, quad_sum = ptx.make_warp_ops(SIM)
    natural_stats = _regtile.make_natural_stats()
    inverse_row_sum = _regtile.make_inverse_row_sum(DROPOUT)

    @cuda.jit(device=True, inline="always")
    def write_o_l(gO, gL, gm, gl, smem, rO, rm, rl, b, h, ub, uh, row0, wrow, g, t, s_q, d, sx, wbase, lane,
                  dropout_scale):
        for r in range(NR):
            mt, hf = r // 2, r % 2
            l_i = quad_sum(rl[r], sx, wbase, lane)  # Dev: the per-lane row sums, added across the quad once
            row = row0 + int(wrow) + 16 * mt + 8 * hf + int(g)
            if row < s_q:
                inv_l = inverse_row_sum(l_i, dropout_scale)  # NaN for a NaN l
                m_nat, l_m, L_i = natural_stats(rm[r], l_i)  # +inf for a row with no key
                store_o_row(gO, smem, rO, ub, row, uh, mt, hf, wrow, g, t, d, inv_l)  # HBM write: Br*d
                if t == U(0):
                    gL[b, h, row] = L_i  # HBM write: Br
                    gm[b, h, row] = m_nat  # HBM write: Br
                    gl[b, h, row] = l_m  # HBM write: Br

    return write_o_l
