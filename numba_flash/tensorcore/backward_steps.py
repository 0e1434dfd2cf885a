"""FA2 backward steps that both tensor-core backwards compose: one piece per step, not a copy per kernel.

The 3xTF32 backward (:mod:`~numba_flash.tensorcore.fa2_backward_tf32`) and the fp16/bf16 backward
(:mod:`~numba_flash.tensorcore.fa2_backward_half`) run FA2's Algorithm 2 with the same warp layout: one thread block
per key block ``K_j, V_j`` (grid ``(Tc, batch * nheads_k)``), each warp owning ``16 MW`` of its key rows, and one flat
loop over the query heads of the KV head's group and their visible query blocks. What differs between them is the
products (three TF32 ``mma`` against one half ``mma``) and the layout of their tiles; the steps around the products
are the same logic, so they live here once:

* :func:`make_key_block`: which key block and (batch, KV head) a thread block owns (line 5); :func:`query_block_head`:
  the (batch, head) of a block of the deterministic dQ kernels;
* :func:`make_query_steps`: the query blocks that see the key block, times the group's heads (line 8's trip count);
* :func:`make_q_do_pipeline`: line 9, ``Q_i, dO_i`` into SRAM (by ``cp.async`` into two stages or through
  registers) and the statistics ``L_i`` (as ``M_i, 1/l_i``), ``D_i`` and the dropout row keys beside them;
* :func:`make_dq_atomic_add`: the end of line 15, a warp's slice of ``dQ_i`` added to HBM by float32 atomics.

Each factory returns ``@cuda.jit(device=True, inline="always")`` functions whose trip counts are the factory's
compile-time constants, so a kernel built from them compiles to the code it had with the steps written inline. The
paper tags stand at the kernels' call sites.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from numba import cuda, float32

from ..device.constants import U
from ..device.dropout import head_key, row_key
from ..device.grid import folded_batch_head
from ..fast import _regtile, _tiles


@functools.cache
def make_key_block(HEAVY_FIRST: bool):
    """``key_block(nbatch, nheads_k) -> (j, b, hk)``: the key block ``j`` of this thread block and its (batch, KV head)
    (:func:`numba_flash.fast._tiles.make_key_block_order`; ``HEAVY_FIRST``: every head's ``j = 0`` first). Past
    ``nbatch`` (``b >= nbatch``) or past ``Tc`` (``j >= gridDim.x``) the kernel returns: the padding of the folded grid."""
    order = _tiles.make_key_block_order(HEAVY_FIRST)

    @cuda.jit(device=True, inline="always")
    def key_block(nbatch, nheads_k):
        j, bhk = order(nbatch * nheads_k)
        return j, bhk // nheads_k, bhk % nheads_k

    return key_block


class KeyBlockLayout(NamedTuple):
    """The compile-time sizes and SRAM offsets both column-block kernels share (:func:`key_block_layout`)."""

    NT: int  # threads of the block
    BC: int  # keys of the block: 16 MW NW
    QST: int  # SRAM stages of Q_i, dO_i and of the statistics (2 with CP_ASYNC)
    OFF_Q: U  # Q_i (stage 0), then dO_i, then stage 1 of both (uQSTAGE on), then K_j, V_j
    OFF_DO: U
    uQSTAGE: U
    OFF_K: U
    OFF_V: U
    END_KV: int  # the first SRAM element past V_j (the kernel's own tiles follow)
    QPW: int  # dQ split over the warps: query m16 tiles per warp, warps per query tile, n8 column tiles per warp
    DSPLIT: int
    NDW: int
    NS: int  # fragment registers of S (and dP): MW x (Br/8) tiles
    NKV: int  # of dK_j (and dV_j): MW x (DP/8) tiles
    NQ: int  # of the warp's dQ_i slice
    NA: int  # A-operand words of the warp's MW m16 tiles
    NSR: int  # query rows whose statistics one thread moves
    SXN: int  # the simulator's lane-exchange scratch (1 on a GPU)
    SCR: int  # one warp's share of it
    NSTAT: int  # statistics (and dropout row keys) of QST stages
    NSKEY: int


def key_block_layout(name: str, NW: int, MW: int, BR: int, DP: int, SQ: int, CP_ASYNC: bool, DROPOUT: bool, SIM: bool,
                     split, scratch_per_warp: int) -> KeyBlockLayout:
    """The layout of a column-block backward kernel of ``NW`` warps of ``16 MW`` keys and query steps of ``BR`` rows,
    the head dim padded to ``DP`` (``DP / 8`` n8 column tiles) and tile rows ``SQ`` elements apart: ``Q_i, dO_i`` (two
    stages with ``CP_ASYNC``), then ``K_j, V_j`` in the dynamic SRAM; ``split``: the module's ``dq_split`` of the dQ
    tile over the warps (a ValueError that names ``name`` when it is None). Plain Python, computed by the factories."""
    NT, BC, ND = 32 * NW, 16 * MW * NW, DP // 8
    if split is None:
        raise ValueError(f"{name}: Br={BR}, Bc={BC} (d padded to {DP}) cannot split dQ over {NW} warps")
    QPW, DSPLIT = split
    QST = 2 if CP_ASYNC else 1
    q_do = QST * 2 * BR * SQ
    return KeyBlockLayout(NT, BC, QST, U(0), U(BR * SQ), U(2 * BR * SQ), U(q_do), U(q_do + BC * SQ), q_do + 2 * BC * SQ,
                          QPW, DSPLIT, ND // DSPLIT, MW * (BR // 8) * 4, MW * ND * 4, QPW * (ND // DSPLIT) * 4, MW * 4,
                          (BR + NT - 1) // NT, NW * scratch_per_warp if SIM else 1, scratch_per_warp, QST * BR,
                          QST * (BR if DROPOUT else 1))


@cuda.jit(device=True, inline="always")
def lane_coords():
    """``(tid, lane, warp, g, t)``: this thread's index (``U``), its lane and warp, and the lane's row ``g`` and column
    pair ``t`` (``U``) in the fragment layouts of ``mma.sync``."""
    tid = U(cuda.threadIdx.x)
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    return tid, lane, warp, U(lane // 4), U(lane % 4)


@cuda.jit(device=True, inline="always")
def query_block_head(nbatch, nheads):
    """``(b, h, past)``: the (batch, head) of a thread block of the deterministic dQ kernels, one block per query block
    as in the forwards' grid (:func:`numba_flash.device.grid.folded_batch_head`), and whether it is past ``nbatch``:
    the padding of the folded grid, for which the kernel returns."""
    _, b, h = folded_batch_head(nheads)
    return b, h, b >= nbatch


@functools.cache
def make_query_steps(BR: int, BC: int, CAUSAL: bool):
    """``query_steps(col0, causal_offset, s_q, group) -> (i_first, n_i, n_steps)``: the ``n_i`` query blocks of ``BR``
    rows from ``i_first`` that see the key block at ``col0`` (``CAUSAL``: the blocks before ``i_first`` are fully masked
    and skipped), and ``n_steps = group n_i`` steps of the flat loop over the group's query heads (GQA)."""
    _, first_row_block = _tiles.make_block_counts(BR, BC, CAUSAL)

    @cuda.jit(device=True, inline="always")
    def query_steps(col0, causal_offset, s_q, group):
        i_first = first_row_block(col0, causal_offset)
        n_i = max(0, (s_q + BR - 1) // BR - i_first)
        return i_first, n_i, group * n_i

    return query_steps


@cuda.jit(device=True, inline="always")
def none_landed(smem, words, qs, st, tid, c1):
    """The pass of a kernel whose ``cp.async`` copies of ``Q_i, dO_i`` are used as they land (:func:`make_q_do_pipeline`)."""


@functools.cache
def make_q_do_pipeline(BR: int, NT: int, OFF_Q, OFF_DO, uQSTAGE, CP_ASYNC: bool, PREFETCH: bool, ONE_STAGE: bool,
                       DROPOUT: bool, FROM_LSE: bool, load_pair, store_pair, load_q_async, cp_commit, cp_wait0,
                       landed=none_landed):
    """``(step_rows, q_do_async, load_q_do_l_d_first, load_q_do_l_d)``: line 9, the query block ``Q_i, dO_i`` and its
    statistics into SRAM, step by step of the flat loop over (query head, query block).

    * ``step_rows(hk, group, i_first, n_i, s) -> (h, row0)``: the query head and first query row of step ``s`` of key
      head ``hk``'s block: the group's heads in turn, each over its ``n_i`` query blocks from ``i_first``.
    * ``q_do_async(smem, off, gQ, gdO, ub, h, row0, s_q, d, tid)``: the ``cp.async`` copies of ``Q_i, dO_i`` into the
      stage ``off`` words past ``OFF_Q, OFF_DO``, committed as one group.
    * ``load_q_do_l_d_first(smem, gQ, gdO, gm, gl, gD, b, ub, h, row0, s_q, d, tid, rQn, rdOn, rMn, rIn, rDn)``: the
      first step's loads, before the loop: ``Q_i, dO_i`` by ``cp.async`` into stage 0 (``CP_ASYNC``) or into the
      registers ``rQn, rdOn``, and ``M_i, 1/l_i, D_i`` of the block's rows into ``rMn, rIn, rDn``
      (:func:`numba_flash.fast._regtile.make_row_stats`; ``FROM_LSE``: ``L_i`` passed as ``gm``).
    * ``load_q_do_l_d(smem, words, gQ, gdO, gm, gl, gD, sM, sIL, sD, sKey, seed, nheads, b, hk, group, i_first, n_i, st,
      n_steps, s_q, d, tid, c1, rQn, rdOn, rMn, rIn, rDn) -> (h, row0, qs, so)``: step ``st``'s tiles made visible to
      all warps; ``h, row0`` its query head and first row (``step_rows``), ``qs`` the word offset of its stage of
      ``Q_i, dO_i``, ``so`` the index offset of its stage of the statistics. (Under 30 arguments: CPython passes a
      longer call as ``*args``, which Numba cannot inline.)

    ``CP_ASYNC``: step ``st`` lives in stage ``st % 2`` (``uQSTAGE`` words past stage 0; ``ONE_STAGE``: ``Q_i, dO_i``
    in one stage, the statistics still in two). A thread waits for its own copies and runs
    ``landed(smem, words, qs, st, tid, c1)`` on them (the kernel's pass over its chunks: the 3xTF32 NaN pass or split).
    Otherwise a barrier first (every warp is done with step ``st - 1``), then ``Q_i, dO_i`` from the registers into
    one stage (``load_pair(gQ, gdO, ub, uh, row0, s_q, d, tid, rQ, rdO)``, ``store_pair(smem, OFF_Q, OFF_DO, tid, rQ,
    rdO)``). The statistics go to ``sM, sIL, sD`` (and, ``DROPOUT``, the row keys to ``sKey``); one barrier publishes
    the step. Then step ``st + 1`` is put on its way, landing during this step's compute: its copies into the other
    stage (``CP_ASYNC`` without ``ONE_STAGE``; ``ONE_STAGE``: the kernel issues them after its last read of the stage)
    or, ``PREFETCH``, its loads into the registers (with ``CP_ASYNC``: only its statistics). Without ``PREFETCH`` the
    step's own loads come after the first barrier.
    """
    NSR = (BR + NT - 1) // NT  # query rows whose statistics one thread moves
    ZERO = float32(0.0)
    uBR = U(BR)
    row_stats = _regtile.make_row_stats(FROM_LSE)

    @cuda.jit(device=True, inline="always")
    def step_rows(hk, group, i_first, n_i, s):
        return hk * group + s // n_i, (i_first + s % n_i) * BR

    @cuda.jit(device=True, inline="always")
    def q_do_async(smem, off, gQ, gdO, ub, h, row0, s_q, d, tid):
        load_q_async(smem, OFF_Q + off, gQ, ub, U(h), row0, s_q, d, tid)  # HBM read: Br*d
        load_q_async(smem, OFF_DO + off, gdO, ub, U(h), row0, s_q, d, tid)  # HBM read: Br*d
        cp_commit()

    @cuda.jit(device=True, inline="always")
    def load_stats(gm, gl, gD, b, h, row0, s_q, tid, rMn, rIn, rDn):
        for e in range(NSR):
            row = row0 + int(tid) + NT * e
            rMn[e], rIn[e] = row_stats(gm, gl, b, h, row, s_q)
            rDn[e] = gD[b, h, row] if row < s_q else ZERO  # HBM read: Br

    @cuda.jit(device=True, inline="always")
    def load_q_do_l_d_first(smem, gQ, gdO, gm, gl, gD, b, ub, h, row0, s_q, d, tid, rQn, rdOn, rMn, rIn, rDn):
        if CP_ASYNC:  # Dev: into stage 0, one cp.async group
            q_do_async(smem, U(0), gQ, gdO, ub, h, row0, s_q, d, tid)
        else:
            load_pair(gQ, gdO, ub, U(h), row0, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d
        load_stats(gm, gl, gD, b, h, row0, s_q, tid, rMn, rIn, rDn)

    @cuda.jit(device=True, inline="always")
    def load_q_do_l_d(smem, words, gQ, gdO, gm, gl, gD, sM, sIL, sD, sKey, seed, nheads, b, hk, group, i_first, n_i, st,
                      n_steps, s_q, d, tid, c1, rQn, rdOn, rMn, rIn, rDn):
        ub = U(b)
        h, row0 = step_rows(hk, group, i_first, n_i, st)
        qs = U(0)  # this step's stage: word offset of its Q_i, dO_i (CP_ASYNC: stage st % 2) ...
        so = U(0)  # ... and index offset of its statistics
        if CP_ASYNC:
            qs = U(0) if ONE_STAGE else U(st % 2) * uQSTAGE
            so = U(st % 2) * uBR
            cp_wait0()  # this thread's copies of Q_i, dO_i (issued one step ago) have landed
            landed(smem, words, qs, st, tid, c1)
        else:
            cuda.syncthreads()  # Sync: K_j, V_j stored (first step); Q, dO, stats, dS of the previous step read by all
        if not PREFETCH and st > 0:
            if not CP_ASYNC:
                load_pair(gQ, gdO, ub, U(h), row0, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d
            load_stats(gm, gl, gD, b, h, row0, s_q, tid, rMn, rIn, rDn)
        if not CP_ASYNC:
            store_pair(smem, OFF_Q, OFF_DO, tid, rQn, rdOn)
        for e in range(NSR):  # Dev: CP_ASYNC: into the statistics' stage st % 2, last read two steps ago
            r = int(tid) + NT * e
            if r < BR:
                rs = r + int(so)
                sM[rs] = rMn[e]
                sIL[rs] = rIn[e]
                sD[rs] = rDn[e]
                if DROPOUT:
                    sKey[rs] = row_key(head_key(seed, b * nheads + h), row0 + r)
        # (CP_ASYNC: this barrier also publishes every thread's copies, and every warp is then done with step st-1:
        # its stage, refilled next, and its dS)
        cuda.syncthreads()  # Sync: Q_i, dO_i, M_i, 1/l_i, D_i in SRAM before L10-L16 read them
        if (CP_ASYNC or PREFETCH) and st + 1 < n_steps:
            # Dev: step st+1's loads issued now, landing during L10-L16 of step st: CP_ASYNC into the other stage (then
            # PREFETCH moves only the statistics), else into the registers
            hn, rown = step_rows(hk, group, i_first, n_i, st + 1)
            if CP_ASYNC:
                if not ONE_STAGE:  # Dev: ONE_STAGE: refilled by the kernel after this step's last read of it
                    q_do_async(smem, uQSTAGE - qs, gQ, gdO, ub, hn, rown, s_q, d, tid)
            else:
                load_pair(gQ, gdO, ub, U(hn), rown, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d (step st+1)
            if PREFETCH:
                load_stats(gm, gl, gD, b, hn, rown, s_q, tid, rMn, rIn, rDn)
        return h, row0, qs, so

    return step_rows, q_do_async, load_q_do_l_d_first, load_q_do_l_d


@functools.cache
def make_dq_atomic_add(QPW: int, QSTRIDE: int, NDW: int, EVEN_D: bool, add2):
    """``dq_atomic_add(gdQ, rdQ, b, h, row0, qw, dq0, s_q, d, g, t)``: a warp's slice of ``dQ_i`` (``QPW`` query m16 tiles
    from ``qw``, ``QSTRIDE`` apart, ``NDW`` n8 column tiles from ``dq0``, accumulator fragments ``rdQ``) added to the
    float32 ``gdQ`` (b, s_q, h, d), two columns at a time by ``add2`` (:func:`numba_flash.tensorcore.ptx.make_atomic_add2`);
    rows past ``s_q`` and columns past ``d`` are left out. Without ``EVEN_D`` an odd ``d``'s last column is a single
    ``atomic.add``."""

    @cuda.jit(device=True, inline="always")
    def dq_atomic_add(gdQ, rdQ, b, h, row0, qw, dq0, s_q, d, g, t):
        for qq in range(QPW):
            qt = qw + QSTRIDE * qq
            for hf in range(2):
                row = row0 + 16 * qt + 8 * hf + int(g)
                if row < s_q:
                    for dn in range(NDW):
                        col = 8 * (dq0 + dn) + 2 * int(t)
                        f = (qq * NDW + dn) * 4 + 2 * hf
                        if EVEN_D:
                            if col < d:  # d is even: both columns or neither
                                add2(gdQ, (b, row, h, col), rdQ[f], rdQ[f + 1])  # HBM read+write: Br*d
                        elif col + 1 < d:
                            add2(gdQ, (b, row, h, col), rdQ[f], rdQ[f + 1])  # HBM read+write: Br*d
                        elif col < d:  # Dev: the last column of an odd d
                            cuda.atomic.add(gdQ, (b, row, h, col), rdQ[f])

    return dq_atomic_add
