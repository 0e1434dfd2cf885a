"""FA1 Algorithms 1 and 2, the fast kernel: the same K/V-outer schedule, fed like the FA2 fast kernel.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 1 (section 3.1) and Algorithm 2
(Appendix B.3). Same algorithm, loop order, HBM traffic pattern, semantics and paper tags as the
readable kernel :mod:`numba_flash.alg1_forward` (read that one first): **outer loop over K/V blocks
j, inner loop over Q blocks i, O_i, l_i, m_i read from HBM and written back at every inner step, O
stored normalized, one thread block per (batch, head)**. What changes is *who computes what* inside
the block, with the machinery of :mod:`numba_flash.fast.fa2_forward`.

What changed from the readable kernel, and why
----------------------------------------------
* **Several query blocks at once (the occupancy fix).** FA1 gives each (batch, head) one thread
  block, so at the FA2 benchmark shapes (``b * h = 128`` at N = 4096) an H200's 132 SMs hold one
  block each: the block must keep a whole SM busy on its own. The readable kernel's 4 warps work on
  one query block at a time and wait together at every barrier. Here the block has ``NW`` warps
  (8 on a GPU) and **each warp is one worker that takes its own query block i of the inner loop**
  (``i = i0 + w, i0 + w + NW, ...``), against the same ``K_j, V_j`` in shared memory. For a fixed j
  the inner-loop iterations are independent (each reads and writes only its own ``O_i, l_i, m_i``),
  so running them concurrently computes exactly Algorithm 1; the warps meet only at the block
  barrier that guards the reload of ``K_j, V_j`` (once per outer step). Inside an inner step every
  tile a warp touches (its ``Q_i``, its ``P_ij``) is its own, so it synchronizes with ``syncwarp``
  only, and while one warp waits for its ``Q_i`` from HBM the others compute.
* **Register blocking** (as FA2 fast): ``TPR`` lanes share ``TM`` query rows; each lane keeps a
  ``TM x TN`` tile of ``S_ij`` and a ``TM x (d / TPR)`` tile of ``O_i`` in registers, so each value
  loaded from SRAM feeds ``TN`` (or ``TM``) multiply-adds. ``O_i`` is loaded from HBM straight into
  that register tile (its latency hides behind the ``S_ij`` product).
* **Bigger K/V tiles with > 48 KB of SRAM** (:mod:`numba_flash.runtime.smem`): ``Bc = 128`` (the
  readable kernel: 48 at d = 64, 24 at d = 128), so ``Tc = N / Bc`` (the number of passes that stream
  ``Q, O`` through HBM, Theorem 2) is 2.7x (d = 64) and 5.3x (d = 128) smaller. ``S_ij`` of a
  128-wide block does not fit in registers, so a step computes it in ``Bc / BCC`` column chunks with a
  running row max (``# Dev:`` in the code; the result is the same merge as lines 10-12).
* **16-byte SRAM loads** (1-D aligned dynamic array, unsigned indices, padded row strides) and
  **exp2 with the scale folded in** (``Q_i`` times ``tau log2 e`` on load; ``m_i`` kept in base 2 in
  HBM during the loop and converted to natural units once, after it, with ``l`` relative to the
  ``m log2 e`` the backward forms: :func:`numba_flash.fast._regtile.make_natural_stats`).
* **Causal block skipping**: query blocks that see no key of ``K_j`` skip the step (it would read
  ``O_i, l_i, m_i`` and write them back unchanged), and chunks past a block's diagonal are not computed.

What it bought (one H200, fp32, FA2 convention ``b * N = 16k``, d = 64, b = 4, 32 heads, N = 4096,
non-causal; medians from ``docs/results/forward_h200.json`` and ``bench/sweep_fa1_fast.py``,
full log with the predictions in ``docs/notes/performance-log.md``, "FA1 forward, fast twin"):

=================================================  ============  ============  ================
version                                            ms            TFLOP/s       vs standard path
=================================================  ============  ============  ================
standard path (:mod:`numba_flash.alg0_standard`)   77.1          7.1           1.0x
readable FA1 (:mod:`numba_flash.alg1_forward`)     192           2.9           0.40x
fast FA1, 4 warps per block                        25.3          21.7          3.0x
fast FA1, Bc = 64 (twice the Q/O passes)           22.7          24.2          3.4x
**fast FA1, default (8 warps, Bc = 128)**          **20.2**      **27.2**      **3.8x**
torch naive fp32 / SDPA memory-efficient fp32      24.7 / 15.6   22.2 / 35.3
=================================================  ============  ============  ================

So 9.5x the readable kernel and 0.93x FA2's fast kernel (29.4 TFLOP/s) with FA1's schedule, HBM
round trips included. Causal: 11.2 ms (24.5 TFLOP/s). Where FA1's parallelism runs out, so does
the kernel: at N = 16384 (b = 1, 32 blocks on 132 SMs) 7.5 TFLOP/s (1.05x the standard path), and
at d = 128, N = 4096 (64 blocks) 13.3 TFLOP/s; FA2 parallelizes over query blocks to fix exactly this.
Resources: 255 registers (24 B of spills), 208 KB dynamic SRAM, 1 block of 8 warps per SM (d = 64);
233 registers, 218 KB at d = 128.

Launch geometry
---------------
grid ``b * h`` (one block per (batch, head), FA1's parallelism), block ``NT = NW * WS`` threads:
``NW`` workers of ``WS`` lanes (a warp on a GPU: ``WS = 32``, ``NW = 8``; 2 x 8 lanes in the simulator,
which has no warps and synchronizes with block barriers instead). Lane ``lane`` of worker ``w`` is in
row group ``rgw = lane // TPR`` (lane ``tc = lane % TPR`` of it) and owns query rows
``rgw + (WS/TPR) a`` (``a < TM``) of the worker's query block, key columns ``tc + TPR bb`` of each
``S`` chunk and output columns ``4 tc + 4 TPR e + (0..3)``. Query block size ``Br = (WS/TPR) TM`` (32
at d <= 64, 16 above on a GPU). ``d`` is padded to ``DP``, a multiple of ``4 TPR`` (zeros).

SRAM budget (float32 elements, one dynamic array)::

    K_j, V_j: 2 Bc (DP+4)   +   per worker: Q_i Br (DP+4) + P_ij Br (BCC+TPR)   (+ Br TPR in the simulator)

d = 64: Bc = 128, Br = 32, BCC = 64, 8 workers: 17408 + 8 (2176 + 2304) = 53248 floats = 208 KB.
d = 128: Bc = 128, Br = 16, BCC = 32, 8 workers: 33792 + 8 (2112 + 640) = 55808 floats = 218 KB.
d = 256 (every d > 128: Bc = 64, Br = 8, BCC = 32): 33280 + 8 (2080 + 320) = 52480 floats = 205 KB.
(H100/H200 opt-in limit: 227 KB per block.)

Run it::

    python -m pytest tests/kernels/test_forward_kernels.py -k "flash1"
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

from .._launch import ForwardOutput, KernelLaunch, Problem
from ..device.constants import FULL_MASK as _FULL_MASK
from ..device.constants import LOG2E, U
from ..device.dropout import head_key, row_key
from ..device.grid import query_head
from ..runtime import backend as _backend
from ..runtime import smem as _smem
from . import _plan, _regtile, _tiles


def _round_up(n: int, m: int) -> int:
    return m * ((n + m - 1) // m)


@functools.cache
def config_for(d: int, block_sizes=None, simulator=None):
    """The tiling ``(NW, WS, TM, TPR, BCC, NCH, DP)``: workers, lanes per worker, rows per lane,
    lanes per row, S-chunk width, chunks per K/V block, padded head dim.

    ``Br = (WS / TPR) TM`` rows per query block (one worker's), ``Bc = BCC * NCH``.
    """
    sim = _backend.is_simulator() if simulator is None else simulator
    if sim:
        NW, WS, TPR, TM, BCC, NCH = 2, 8, 4, 4, 16, 2
        TM_MAX, BCC_MAX = 4, 16
    elif d <= 64:
        NW, WS, TPR, TM, BCC, NCH = 8, 32, 8, 8, 64, 2
        TM_MAX, BCC_MAX = 8, 64
    elif d <= 128:
        NW, WS, TPR, TM, BCC, NCH = 8, 32, 8, 4, 32, 4
        TM_MAX, BCC_MAX = 4, 32
    else:  # Dev: d > 128 (not measured on a GPU yet): Br = 8, Bc = 64 fit the 227 KB (205 KB at d = 256)
        NW, WS, TPR, TM, BCC, NCH = 8, 32, 8, 2, 32, 2
        TM_MAX, BCC_MAX = 2, 32
    if block_sizes is not None:
        # Dev: an override (Br, Bc) is honoured up to the register tiling: Br rounds up to a multiple
        # of WS/TPR (at most WS/TPR * TM_MAX rows per worker), Bc to a multiple of the chunk step
        Br, Bc = (int(n) for n in block_sizes)
        rgw = WS // TPR
        TM = max(1, min(TM_MAX, (Br + rgw - 1) // rgw))
        BCC = min(BCC_MAX, _round_up(Bc, max(4, TPR)))
        NCH = (Bc + BCC - 1) // BCC
    # Alg.1 L1 / Alg.2 L2: block sizes; Dev: Bc from the > 48 KB SRAM (Bc = 128), Br = one worker's rows
    DP = _round_up(max(d, 1), 4 * TPR)
    return NW, WS, TM, TPR, BCC, NCH, DP


def smem_floats(NW, WS, TM, TPR, BCC, NCH, DP, shfl=True) -> int:
    """Dynamic SRAM of the kernel in float32 elements (see the module docstring)."""
    BR = (WS // TPR) * TM
    n = 2 * BCC * NCH * (DP + 4) + NW * BR * (DP + 4) + NW * BR * (BCC + TPR)
    if not shfl:
        n += NW * BR * TPR
    return n


@functools.cache
def alg1_forward_fast_kernel(NW: int, WS: int, TM: int, TPR: int, BCC: int, NCH: int, DP: int, CAUSAL: bool, DROPOUT: bool, SHFL: bool, VEC: bool):
    """The fast FA1 forward kernel for one specialization (see the module docstring).

    ``SHFL``: row reductions by warp shuffles and worker-private barriers by ``syncwarp`` (GPU); without
    it reductions go through SRAM and every barrier is a block barrier (the simulator, which has no
    warps). ``VEC``: 16-byte aligned SRAM (16-byte loads).

    Kernel arguments: ``gQ (b, s_q, h, d)``, ``gK, gV (b, s_k, h_k, d)``, outputs ``gO (b, s_q, h, d)``,
    ``gl, gm, glse (b, h, s_q)``; ``scale_log2 = tau log2 e``, ``group = h // h_k``, ``causal_offset``,
    dropout ``seed``, ``threshold``, ``dropout_scale = 1 / (1 - p)``.

    Symbol table (paper symbol -> variable -> memory space):

    ============================  ========================  ============================================
    Q, K, V, O                    gQ, gK, gV, gO            HBM (b, s, h, d), any strides
    l, m, L                       gl, gm, glse              HBM (b, h, s_q); m in base 2 until the end
    K_j, V_j                      smem[OFF_K/OFF_V ...]     SRAM (Bc, DP+4) each, once per outer step
    Q_i (times tau log2 e)        smem[qbase ...]           SRAM (Br, DP+4), one per worker w
    O_i (from HBM, then updated)  rO                        registers, TM x (DP/TPR) per lane
    l_i, m_i (m in base 2)        rl, rm                    registers (rl: this lane's partial sum)
    S_ij (one chunk, base 2)      rS                        registers, TM x TN per lane
    e^(m~ - m_new) P~_ij dropped  smem[pbase ...]           SRAM (Br, BCC+TPR), one per worker w
    m~_ij (one chunk)             rmt                       registers
    e^(m_i - m_new), l_i          ralpha, rf                registers
    ============================  ========================  ============================================
    """
    RGW = WS // TPR  # row groups per worker
    BR = RGW * TM  # rows of one query block Q_i (one worker's)
    BC = BCC * NCH  # columns of one K/V block K_j
    TN = BCC // TPR  # key columns of an S chunk per lane
    DV = DP // (4 * TPR)  # 4-float vectors of O per row per lane
    NT = NW * WS  # threads per block
    SQ = DP + 4  # row stride of the Q, K, V tiles (floats)
    SPS = BCC + TPR  # row stride of the P tile
    uTPR, uSQ, uDP, uWS = U(TPR), U(SQ), U(DP), U(WS)
    # Offsets (floats) of the tiles in the one dynamic SRAM array `smem`:
    OFF_K = U(0)  # K_j: (Bc, SQ), zero-padded to DP columns and past N_k
    OFF_V = U(BC * SQ)  # V_j: (Bc, SQ)
    OFF_Q = U(2 * BC * SQ)  # Q_i of worker w at OFF_Q + w Br SQ: NW x (Br, SQ), times tau log2 e
    OFF_P = U(2 * BC * SQ + NW * BR * SQ)  # P~_ij chunk of worker w at OFF_P + w Br SPS: NW x (Br, SPS)
    OFF_R = U(2 * BC * SQ + NW * BR * SQ + NW * BR * SPS)  # without SHFL: reduction scratch NW x (Br, TPR)
    SRAM_REDUCE = not SHFL  # the simulator has no warp shuffles
    U0 = U(0)
    ALIGN = 16 if VEC else None
    # Register-array sizes (local-array sizes must be plain constants for Numba):
    NS = TM * TN  # rS: the TM x TN tile of an S_ij chunk
    NO = TM * DV * 4  # rO: the TM x (DP / TPR) tile of O_i
    NQ = TM * 4  # rq, rp: one 4-column step of Q_i (or P~) for the TM rows
    NEG_INF = float32(-math.inf)

    # K_j, V_j: HBM -> registers (NLKV floats each per thread) -> SRAM, by the whole block
    NLKV, load_kv, store_kv = _tiles.make_pair_loader(BC, DP, NT, SQ, STEP_ROWS=False)
    n_key_blocks, _ = _tiles.make_block_counts(BR, BC, CAUSAL)
    NLQ = (BR * DP + WS - 1) // WS  # Q elements each lane of a worker moves per inner step
    NLQ_EXACT = BR * DP % WS == 0
    uBRDP = U(BR * DP)

    # Dev: dropout's 1/(1-p) on each kept P~ (FA1 Alg.2 L14)
    qkt_tile, mask_tile, row_max_tile, row_sum_lanes, softmax_p_tile, pv_tile, store_o_row, natural_stats = _regtile.make_forward_steps(
        TM, TN, DV, RGW, TPR, DP, SQ, SPS, BCC, CAUSAL, DROPOUT, not SRAM_REDUCE, True)

    # [doc:alg1-fast-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gO, gl, gm, glse, scale_log2, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32, alignment=ALIGN)  # all tiles; offsets OFF_*
        rS = cuda.local.array(NS, float32)  # S_ij chunk (registers)
        rO = cuda.local.array(NO, float32)  # O_i (registers)
        rm = cuda.local.array(TM, float32)
        rl = cuda.local.array(TM, float32)
        rf = cuda.local.array(TM, float32)
        ralpha = cuda.local.array(TM, float32)
        rmt = cuda.local.array(TM, float32)
        rq = cuda.local.array(NQ, float32)
        rp = cuda.local.array(NQ, float32)
        rkey = cuda.local.array(TM, uint64)
        rKn = cuda.local.array(NLKV, float32)  # K_j in flight (registers)
        rVn = cuda.local.array(NLKV, float32)
        rQn = cuda.local.array(NLQ, float32)  # Q_i in flight (registers)

        tid = U(cuda.threadIdx.x)
        w = tid // uWS  # worker (a warp on a GPU)
        lane = tid % uWS
        rgw = lane // uTPR
        tc = lane % uTPR
        bh, b, h, hk, s_q, s_k, d = query_head(gQ, gK, group)  # FA1: one thread block per (batch, head); GQA/MQA: hk
        ub, uh, uhk = U(b), U(h), U(hk)  # Dev: unsigned HBM indices: no negative-index wrap-around code
        k_bh = head_key(seed, bh) if DROPOUT else uint64(0)
        qbase = OFF_Q + w * U(BR * SQ)  # this worker's Q_i tile
        pbase = OFF_P + w * U(BR * SPS)  # this worker's P_ij tile
        rbase = OFF_R + w * U(BR * TPR)

        # Alg.1 L2 / Alg.2 L3: in HBM, O = (0) N x d, l = (0) N, m = (-inf) N
        for e in range(int(tid), s_q * d, NT):
            gO[ub, U(e // d), uh, U(e % d)] = float32(0.0)  # HBM write: N*d
        for r in range(int(tid), s_q, NT):
            gl[b, h, r] = float32(0.0)  # HBM write: N
            gm[b, h, r] = NEG_INF  # HBM write: N
        cuda.syncthreads()  # Sync: O, l, m initialized in HBM before any thread reads them back (L8)
        # Alg.1 L3-L4 / Alg.2 L4-L5: split Q, O, l, m into Tr blocks of Br rows, K, V into Tc blocks of Bc
        Tr = (s_q + BR - 1) // BR
        Tc = n_key_blocks(s_q, s_k, causal_offset)  # Dev: causal: key blocks past the last query row's horizon are never loaded

        # Alg.1 L5 / Alg.2 L6: for 1 <= j <= Tc
        for j in range(Tc):
            c0 = j * BC
            cuda.syncthreads()  # Sync: every worker is done with K_{j-1}, V_{j-1} before they are overwritten
            # Alg.1 L6 / Alg.2 L7: load K_j, V_j from HBM to SRAM (all loads in flight, then stored; ragged rows zero)
            load_kv(gK, gV, ub, uhk, c0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
            store_kv(smem, OFF_K, OFF_V, tid, rKn, rVn)
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before any worker's L9 and L12 read them

            # Dev: causal: query blocks whose last row sees no key of K_j skip the step (a no-op)
            i0 = 0
            if CAUSAL:
                i0 = max(0, (c0 - causal_offset) // BR)
            n_rounds = (Tr - i0 + NW - 1) // NW
            # [doc:alg1-fast-inner-loop]
            # Alg.1 L7 / Alg.2 L8: for 1 <= i <= Tr -- Dev: worker w runs i = i0 + w, i0 + w + NW, ...
            # For a fixed j the inner iterations are independent (each touches only its own O_i, l_i,
            # m_i and its own SRAM tiles), so NW of them run at once against the same K_j, V_j.
            for t in range(n_rounds):
                i = i0 + t * NW + int(w)
                if SHFL and i >= Tr:
                    break  # Dev: (GPU) workers are independent; in the simulator idle workers run empty rows for the barriers
                r0 = i * BR
                if SRAM_REDUCE:
                    cuda.syncthreads()  # Sync: (simulator) every worker's reads of its previous Q_i, P_ij are done
                else:
                    cuda.syncwarp(_FULL_MASK)  # Sync: this warp's reads of its previous Q_i, P_ij are done before they are overwritten
                # Alg.1 L8 / Alg.2 L9: load Q_i, O_i, l_i, m_i from HBM (Q_i to SRAM times tau log2 e, O_i to registers)
                for it in range(NLQ):
                    e = lane + uWS * U(it)
                    r = e // uDP
                    x = e % uDP
                    val = float32(0.0)
                    if (NLQ_EXACT or e < uBRDP) and r0 + int(r) < s_q and x < U(d):
                        val = gQ[ub, U(r0) + r, uh, x]  # HBM read: Br*d
                    rQn[it] = val
                for a in range(TM):
                    row = r0 + int(rgw) + RGW * a
                    for ev in range(DV):
                        for x4 in range(4):
                            x = 4 * int(tc) + 4 * TPR * ev + x4
                            o = float32(0.0)
                            if row < s_q and x < d:
                                o = gO[ub, U(row), uh, U(x)]  # HBM read: Br*d
                            rO[(a * DV + ev) * 4 + x4] = o
                    l_i = float32(0.0)
                    m_i = NEG_INF
                    if row < s_q:
                        l_i = gl[b, h, row]  # HBM read: Br
                        m_i = gm[b, h, row]  # HBM read: Br
                    rm[a] = m_i  # Dev: m_i is kept in base 2 in HBM during the loop (converted after it)
                    rf[a] = l_i  # diag(l_i): un-normalizes O_i at the first rescale
                    rl[a] = l_i if tc == U0 else float32(0.0)  # Dev: l kept as per-lane partial sums, lane 0 holds l_i
                    if DROPOUT:
                        rkey[a] = row_key(k_bh, row)
                for it in range(NLQ):
                    e = lane + uWS * U(it)
                    if NLQ_EXACT or e < uBRDP:
                        smem[qbase + (e // uDP) * uSQ + e % uDP] = rQn[it] * scale_log2
                if SRAM_REDUCE:
                    cuda.syncthreads()  # Sync: (simulator) Q_i in SRAM before L9 reads it
                else:
                    cuda.syncwarp(_FULL_MASK)  # Sync: Q_i in SRAM (written and read by this warp only) before L9

                # Dev: S_ij does not fit in registers for Bc = 128: a step computes it in NCH chunks of
                # BCC columns with a running row max (lines 10-12 applied chunk by chunk: the same merge,
                # as the online softmax is associative); chunks past the ragged end or the diagonal are skipped
                n_ch = min(NCH, (s_k - c0 + BCC - 1) // BCC)
                if CAUSAL and not SRAM_REDUCE:
                    n_ch = min(n_ch, (max(0, r0 + BR + causal_offset - c0) + BCC - 1) // BCC)
                for ch in range(n_ch):
                    cc0 = c0 + ch * BCC
                    kbase = OFF_K + U(ch * BCC) * uSQ
                    vbase = OFF_V + U(ch * BCC) * uSQ
                    # Alg.1 L9 / Alg.2 L10: S_ij = tau Q_i K_j^T, a TM x TN register tile per lane, 16-byte SRAM loads
                    qkt_tile(smem, qbase, kbase, rgw, tc, rS, rq)
                    # Alg.2 L11: S_ij^masked: -inf where the key is past s_k or hidden by the causal mask
                    mask_tile(rS, r0, cc0, rgw, tc, s_k, causal_offset)

                    # Alg.1 L10 / Alg.2 L12: m~_ij = rowmax(S_ij) (butterfly over the TPR lanes of a row)
                    row_max_tile(smem, rbase, rgw, tc, rS, rmt)
                    if not SRAM_REDUCE:
                        cuda.syncwarp(_FULL_MASK)  # Sync: this warp's reads of the previous chunk's P_ij are done before it is overwritten
                    # Alg.1 L11 / Alg.2 L13: m_new = max(m_i, m~_ij); l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
                    # Dev: P~_ij e^(m~_ij - m_new) in one exp2 (S - m_new): the beta of L11-L12 folded into P
                    # Alg.2 L14: P~_ij^dropped = dropout(P~_ij), Z from the counter hash, times 1/(1-p) (in the same step)
                    softmax_p_tile(smem, pbase, rgw, tc, cc0, rS, rm, rmt, ralpha, rl, rkey, threshold, dropout_scale)
                    if SRAM_REDUCE:
                        cuda.syncthreads()  # Sync: (simulator) P_ij rows in SRAM before P_ij V_j reads them
                    else:
                        cuda.syncwarp(_FULL_MASK)  # Sync: P_ij rows in SRAM before P_ij V_j; written and read by this warp only

                    # Alg.1 L12 / Alg.2 L15: O_i <- diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j (diag(l_new)^-1 at the store)
                    for a in range(TM):
                        f = ralpha[a] * rf[a]
                        rf[a] = float32(1.0)  # Dev: later chunks rescale an already un-normalized O_i
                        for e in range(DV * 4):
                            rO[a * DV * 4 + e] *= f
                    pv_tile(smem, pbase, vbase, rgw, tc, rO, rp)

                # [doc:alg1-fast-write-back]
                # Dev: l_new = the sum of the TPR lanes' partial sums, once per step
                row_sum_lanes(smem, rbase, rgw, tc, rl)
                for a in range(TM):
                    row = r0 + int(rgw) + RGW * a
                    if row < s_q:
                        l_new = rl[a]
                        inv_l = float32(1.0) / l_new if l_new > 0 else float32(0.0)
                        store_o_row(gO, ub, row, uh, tc, d, rO, a, inv_l)  # HBM write: Br*d
                        # Alg.1 L13 / Alg.2 L16: l_i <- l_new, m_i <- m_new, to HBM
                        # Dev: m_i in base 2, exactly as the next step uses it: a natural-unit m read back as
                        # m log2 e rounds (by ~ulp(m): at logits ~1e10 that is 2^10, and exp2 of it overflows)
                        if tc == U0:
                            gl[b, h, row] = l_new  # HBM write: Br
                            gm[b, h, row] = rm[a]  # HBM write: Br
                # [/doc:alg1-fast-write-back]
            # [/doc:alg1-fast-inner-loop]

        cuda.syncthreads()  # Sync: every worker's last l, m are in HBM before the L pass reads them
        # Dev: m to natural units with l relative to it as the backward reads it back (_regtile.make_natural_stats),
        # and L = m + log l (flash-attn's softmax_lse; +inf where a row saw no key)
        for r in range(int(tid), s_q, NT):
            gm[b, h, r], gl[b, h, r], glse[b, h, r] = natural_stats(gm[b, h, r], gl[b, h, r])  # HBM write: 3 N (m, l, L)

    # [/doc:alg1-fast-kernel]
    return kernel


def default_features() -> dict:
    """Shuffles, warp barriers and 16-byte loads on a GPU only."""
    gpu = not _backend.is_simulator()
    return {"SHFL": gpu, "VEC": gpu}


def plan(prob: Problem, block_sizes=None, config=None, features=None):
    """(kernel, grid, threads, dynamic SRAM bytes, config) of one launch, without launching."""
    cfg = config if config is not None else config_for(prob.headdim, None if block_sizes is None else tuple(block_sizes))
    NW, WS, TM, TPR, BCC, NCH, DP = cfg
    feats = _plan.checked_features(default_features(), features)
    if feats["SHFL"] and WS != 32:
        raise ValueError("the shuffle path needs workers of 32 lanes (one warp)")
    nbytes = 4 * smem_floats(*cfg, shfl=feats["SHFL"])
    if nbytes > _smem.max_optin_bytes():
        raise ValueError(f"block_sizes: tiles {cfg} need {nbytes} bytes of shared memory at d={prob.headdim}; "
                         f"the device allows {_smem.max_optin_bytes()}")
    kernel = alg1_forward_fast_kernel(NW, WS, TM, TPR, BCC, NCH, DP, prob.causal, prob.dropout_p > 0,
                                      feats["SHFL"], feats["VEC"])
    return kernel, (prob.batch * prob.nheads,), NW * WS, nbytes, cfg


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles (the kernel contract): :func:`config_for` rounds an override to the tiling."""
    NW, WS, TM, TPR, BCC, NCH, DP = config_for(prob.headdim, None if block_sizes is None else tuple(block_sizes))
    return (WS // TPR) * TM, BCC * NCH


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block, in bytes."""
    return plan(prob, block_sizes)[3]


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """The one launch of :func:`forward`, compiled for ``prob`` (not launched)."""
    kernel, grid, nt, nbytes, (NW, WS, TM, TPR, BCC, NCH, DP) = plan(prob, block_sizes)
    name = f"FA1 forward fast (Br, Bc) = ({(WS // TPR) * TM}, {BCC * NCH}), {NW} workers, {nbytes // 1024} KB dynamic SRAM"
    return [KernelLaunch(name, kernel, nt, grid[0])]


def forward(q, k, v, prob: Problem, alloc, block_sizes=None, config=None, features=None) -> ForwardOutput:
    """FA1 forward (Algorithms 1-2), fast kernel, on kernel arrays: ``ForwardOutput(out, lse, m, l)``.

    ``block_sizes=(Br, Bc)`` is honoured up to the register tiling (:func:`config_for`); ``config`` and
    ``features`` override the tiling and the kernel features (benchmarks and sweeps).
    """
    kernel, grid, nt, nbytes, _ = plan(prob, block_sizes, config, features)
    b, s_q, h, d = prob.batch, prob.seqlen_q, prob.nheads, prob.headdim
    out = alloc.empty((b, s_q, h, d))
    l = alloc.empty((b, h, s_q))
    m = alloc.empty((b, h, s_q))
    lse = alloc.empty((b, h, s_q))
    args = (q, k, v, out, l, m, lse, float32(prob.softmax_scale * LOG2E), prob.group, prob.causal_offset,
            prob.seed, prob.threshold, float32(prob.dropout_scale))
    _smem.launch(kernel, grid, nt, nbytes, *args)
    # Alg.1 L16 / Alg.2 L19: return O, l, m (R is the seed in prob); L = m + log l for the API
    return ForwardOutput(out=out, lse=lse, m=m, l=l)
