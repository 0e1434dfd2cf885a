"""The 3xTF32 FA2 forward with the keys of ``S`` and the columns of ``O`` split across warps (``DSPLIT``).

Paper: Dao, "FlashAttention-2", Algorithm 1 and section 3.3. Same algorithm, semantics, outputs and launch grid as
:mod:`numba_flash.fast.fa2_forward_tc` (read that first); this file changes how a thread block's warps share its work.

Why another warp layout
-----------------------
In :mod:`~numba_flash.fast.fa2_forward_tc` each warp owns ``16 MW`` query rows and does everything for them: all
``Bc`` keys of ``S_i^(j)`` and all ``d`` columns of ``O_i``. That is FA2's section 3.3 ("split Q", no warp waits for
another), and at d = 64 it wins. At d = 128 a lane then holds ``MW d / 8 = 128`` floats of O at ``MW = 2``, so the key
block per warp stays at ``Bc = 16``, and the 3xTF32 split of ``Q_i``'s fragments (four instructions a float, 128
floats a lane) is paid again for every 16 keys. Nsight Compute at causal N = 512, d = 128 (the performance log,
2026-11-28) puts SDPA's kernel at 447 M instructions for the same tensor work as our 558 M: SDPA's warps split
``Q_i`` once per 32 keys and its O rescale costs a quarter as much, because its 64 x 128 block shares the d columns of
O among warps and passes ``P~`` between them through SRAM.

This kernel does the same with ``WM x WN`` warps (default 4 x 2, Br = 128, Bc = 64 at d = 128):

* **Line 8, split by keys.** Warp ``(wm, wn)`` computes ``S`` for its ``16 MW`` rows and the ``Bc / WN`` keys
  ``wn Bc / WN ..``: each split ``Q_i`` fragment serves ``Bc / WN`` = 32 keys (16 in the row-owning layout).
  The k steps run in ``WIDE``'s order (:func:`numba_flash.fast.fa2_forward_tc.fa2_forward_tc_kernel`), so every score
  has the bits of the default d = 128 forward, which the 3xTF32 backward recomputes bit for bit.
* **Line 9 across warps.** A row's max is over all ``WN`` warps of its row group: each writes its quad's partial max
  to an SRAM exchange, a block barrier, each reads the ``WN`` values (the one place where warps wait for each other,
  which FA2 avoids; here it buys the split of line 10). Row sums stay per warp until the end (only line 12 needs them).
* **Line 10, split by columns.** ``P~`` goes to SRAM (as in the row-owning kernel, which stages it there too), a block
  barrier, and warp ``(wm, wn)`` computes ``O_i``'s columns ``wn d / WN ..`` over all ``Bc`` keys: 64 floats of O a lane
  (plus 64 for the key block's staged ``P~ V_j``), and the rescale of line 10 is 64 FFMA a key block, not 128 per 16 keys.

Per unit of work (32 rows x 64 keys x d = 128) a warp issues about 1000 fewer instructions of splits and rescale than
the 4 x 2 x 16 layout (the performance log's section on ``DSPLIT`` has the count) for three block barriers a key block
(the row-owning kernel has one and a warp barrier), 8 warps in one block of 199 KB (one block an SM, as the 8 x 2 x 16
default). On an H200 it did not pay (2026-11-29, commit 50079fe, ``docs/results/sweeps/dsplit_h200_50079fe_{1,2}.json``):
0.999-1.005x the default at causal N 512 / 1k, 0.91-0.95x elsewhere. Nsight Compute at causal 512 counted SDPA's number
of instructions (442.6 M against 447.4 M; the default 558.4 M), each waiting 4.48 cycles to issue against SDPA's 3.99
(suspects: the exchanges' block barriers, and twice SDPA's bank-conflict wavefronts). So it stays off, FA2 section 3.3's
"split-K" measured.

SRAM (float32, :func:`smem_floats`): ``Q_i`` Br x DP (unpadded, :func:`~numba_flash.fast._tiles.swizzle16`), ``K_j``
Bc x DP (one stage: block j+1's copies are issued after the barrier that ends every warp's reads of ``K_j``), ``V_j``
Bc x SV in two stages (block j+1's copies are issued at the top of block j), ``P~`` Br x (Bc + 4), the exchange WN x Br.
At d = 128, 4 x 2, Bc = 64: 199 KB.

Runs on the ``cp.async`` path with ``WIDE`` (16-byte aligned K and V, ``DP % 32 == 0``); :func:`dsplit_on` says where.
"""

from __future__ import annotations

import math

from numba import cuda, float32, uint32, uint64

from .._constants import U
from .._dropout import head_key, keep, row_key
from . import _mma, _plan, _regtile, _tiles

#: The default ``(WM, WN, Bc)``: warps along the query rows (each ``MW = 2`` m16 tiles), warps along the keys of S and
#: the columns of O, key block.
DEFAULT_TILING = (4, 2, 64)


def v_stride(DP: int) -> int:
    """Row stride (floats) of the ``V_j`` tile: 8 or 24 mod 32, so that the B fragments ``V[8 k + t, 8 n + g]`` of a warp
    hit 32 banks (:func:`numba_flash.fast.fa2_forward_tc.strides`), and a multiple of 4 (16-byte ``cp.async`` rows)."""
    sv = DP
    while sv % 32 not in (8, 24):
        sv += 4
    return sv


def tiling_for(d: int, block_sizes=None) -> tuple:
    """``(WM, MW, WN, Bc, DP)``: warps along rows, m16 tiles per warp, warps along keys / columns, key block, padded d.

    ``block_sizes=(Br, Bc)``: Br rounded up to 16, then ``WM = Br / 32`` warps of ``MW = 2`` (``WM`` at most 4, one warp of
    ``MW = 1`` for Br = 16); Bc rounded up to a multiple of ``8 WN``."""
    DP = _plan.padded_headdim(d)
    WM, WN, BC = DEFAULT_TILING
    MW = 2
    if block_sizes is not None:
        Br, Bc = (int(n) for n in block_sizes)
        m16 = (Br + 15) // 16
        WM, MW = (1, 1) if m16 == 1 else (min(4, (m16 + 1) // 2), 2)
        BC = 8 * WN * ((Bc + 8 * WN - 1) // (8 * WN))
    return WM, MW, WN, BC, DP


def smem_floats(WM: int, MW: int, WN: int, BC: int, DP: int, simulator: bool = False) -> int:
    """Dynamic SRAM in float32 elements: ``Q_i``, one stage of ``K_j``, two of ``V_j``, ``P~``, the exchange (and the
    simulator's lane-exchange scratch)."""
    BR = 16 * MW * WM
    n = BR * DP + BC * DP + 2 * BC * v_stride(DP) + BR * (BC + 4) + WN * BR
    return n + (WM * WN * _mma.SIM_SCRATCH_PER_WARP if simulator else 0)


def dsplit_on(feature, wide: bool) -> bool:
    """``DSPLIT`` resolved: only where the row-owning kernel would take ``WIDE`` (the ``cp.async`` path, ``DP % 32 == 0``),
    whose order of the k steps it keeps; there ``bool(feature)``, off by default (slower on an H200: the module's docstring)."""
    return wide and bool(feature)


@_plan.cache_by_signature
def fa2_forward_tc_dsplit_kernel(WM: int, MW: int, WN: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, SIM: bool,
                                 HEAVY_FIRST: bool = False, Q_ASYNC: bool = False):
    """The 3xTF32 FA2 forward with S split by keys and O by columns across warps (see the module docstring).

    ``Q_ASYNC``: ``Q_i`` by ``cp.async`` with ``K_1, V_1``, scaled in SRAM (as the row-owning kernel's); else the register
    load. ``HEAVY_FIRST`` (causal): the heaviest query blocks of all heads first, as there.

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, O, L             gQ, gK, gV, gO, gL   HBM
    Q_i (times tau log2 e)    smem[OFF_Q ...]      SRAM (Br, DP), swizzled, loaded once (L4)
    K_j                       smem[OFF_K ...]      SRAM (Bc, DP), swizzled, one stage (L7)
    V_j                       smem[vbase ...]      SRAM (Bc, SV), two stages (L7)
    S_i^(j) (a warp's keys)   rS                   registers: MW x (Bc / WN / 8) m16n8 fragments per warp
    rowmax S (a warp's keys)  smem[OFF_X ...]      SRAM (WN, Br): the exchange of line 9 (then of l, after L11)
    P~_i^(j)                  smem[OFF_P ...]      SRAM (Br, Bc+4): written by the warps of a row group, read by each
    O_i (a warp's columns)    rO                   registers: MW x (d / WN / 8) m16n8 fragments per warp
    P~_i^(j) V_j (staged)     rT                   registers, like rO, zeroed each key block
    m_i, l_i (base 2)         rm, rl               registers, 2 MW rows per lane (rl: partial sum over the warp's keys)
    ========================  ===================  ==================================================
    """
    if DP % 32 or BC % (8 * WN) or DP % (8 * WN):
        raise ValueError(f"DSPLIT needs DP % 32 == 0 and Bc, DP multiples of 8 WN (DP={DP}, Bc={BC}, WN={WN})")
    NW = WM * WN
    NT = 32 * NW
    BR = 16 * MW * WM
    BCW = BC // WN  # keys of S per warp
    NBW = BCW // 8  # 8-key tiles of S per warp
    NB = BC // 8  # 8-key steps of P~ V_j
    NDW = DP // WN // 8  # 8-column tiles of O per warp
    KD = DP // 8  # 8-wide k steps of Q K^T
    SQ, SV, SP = DP, v_stride(DP), BC + 4
    uSQ, uSV, uSP = U(SQ), U(SV), U(SP)
    OFF_Q = U(0)
    OFF_K = U(BR * SQ)
    OFF_V = OFF_K + U(BC * SQ)  # stage s at OFF_V + s uVST
    uVST = U(BC * SV)
    OFF_P = OFF_V + U(2) * uVST
    OFF_X = OFF_P + U(BR * SP)  # the exchange: row r of warp column wn at OFF_X + wn Br + r
    NS = MW * NBW * 4
    NO = MW * NDW * 4
    NR = MW * 2
    NA = MW * 4
    NQW = MW * 8
    NKW = NBW * 4
    NEG_INF = float32(-math.inf)
    SXN = NW * _mma.SIM_SCRATCH_PER_WARP if SIM else 1
    SCR = _mma.SIM_SCRATCH_PER_WARP

    SWZ = _tiles.swizzle16
    load_q = _tiles.make_scaled_q_loader(BR, DP, NT, SQ, QUIET_NAN=True, SWIZZLE=SWZ)
    _, load_q_async = _tiles.make_word_loader_async(BR, DP, NT, SQ, SIM, SWZ)
    scale_q = _tiles.make_quiet_nan_pass(BR, DP, NT, SQ, SWZ, SCALE=True)
    _, load_k_async = _tiles.make_word_loader_async(BC, DP, NT, SQ, SIM, SWZ)
    _, load_v_async = _tiles.make_word_loader_async(BC, DP, NT, SV, SIM)
    quiet_k = _tiles.make_quiet_nan_pass(BC, DP, NT, SQ, SWZ)
    quiet_v = _tiles.make_quiet_nan_pass(BC, DP, NT, SV)
    _copy16, cp_commit, cp_wait0 = _mma.make_cp_async(SIM)
    n_key_blocks, _ = _tiles.make_block_counts(BR, BC, CAUSAL)
    query_block = _tiles.make_query_block_order(HEAVY_FIRST)
    split, mma3, quad_max, quad_sum = _mma.make_warp_ops(SIM)
    natural_stats = _regtile.make_natural_stats()
    inverse_row_sum = _regtile.make_inverse_row_sum(DROPOUT)
    mask_s, lane_row_max = _mma.make_fragment_steps(MW, NBW, BCW, CAUSAL)
    load_q_pair, split_a_pair, s_tile_step = _mma.make_s_steps(MW, NBW, True, SIM)  # Dev: line 8 as the row-owning kernel's

    # [doc:fa2-tc-dsplit-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gO, gL, gm, gl, scale_log2, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32)  # Q_i, K_j, V_j (2 stages), P~, the exchange; offsets OFF_*
        scale_log2 = float32(scale_log2)
        sx = cuda.shared.array(SXN, float32)  # the simulator's lane-exchange scratch (unused on a GPU)
        rS = cuda.local.array(NS, float32)
        rO = cuda.local.array(NO, float32)
        rT = cuda.local.array(NO, float32)
        rm = cuda.local.array(NR, float32)
        rl = cuda.local.array(NR, float32)
        ralpha = cuda.local.array(NR, float32)
        rkey = cuda.local.array(NR, uint64)
        rAb = cuda.local.array(NA, uint32)  # A fragments (tf32 big / small parts)
        rAs = cuda.local.array(NA, uint32)
        rQw = cuda.local.array(NQW, float32)  # Q_i columns 16 p + 4 t .. + 3 of rows g, g + 8 (per m16 tile)
        rKw = cuda.local.array(NKW, float32)  # K_j columns 16 p + 4 t .. + 3 of key row g (per key tile)

        tid = U(cuda.threadIdx.x)
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        g = U(lane // 4)
        t = U(lane % 4)
        wbase = warp * SCR
        wrow = U(16 * MW) * U(warp // WN)  # this warp's first row within the block (its row group)
        wn = warp % WN
        kw0 = U(BCW) * U(wn)  # this warp's first key of S within the key block
        dw0 = U(NDW * 8) * U(wn)  # this warp's first column of O
        nheads = gQ.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        d = gQ.shape[3]
        # FA2.1 L3: for i = 1..Tr -- one thread block per i (HEAVY_FIRST: the heaviest of all heads first)
        i, bh = query_block(gQ.shape[0] * nheads)
        b = bh // nheads
        h = bh % nheads
        if b >= gQ.shape[0] or (HEAVY_FIRST and i < 0):
            return  # Dev: past b*h (HEAVY_FIRST: past Tr) in the last z slab of the fold
        ub, uh, uhk = U(b), U(h), U(h // group)
        row0 = i * BR

        # FA2.1 L4: load Q_i (times tau log2 e) from HBM to SRAM
        if not Q_ASYNC:
            load_q(gQ, smem, OFF_Q, ub, uh, row0, s_q, d, tid, scale_log2)  # HBM read: Br*d
        # FA2.1 L5: on chip, O_i = 0, l_i = 0, m_i = -inf
        for a in range(NO):
            rO[a] = float32(0.0)
        for r in range(NR):
            rm[r] = NEG_INF
            rl[r] = float32(0.0)
            rkey[r] = uint64(0)
            if DROPOUT:  # row of slot r: m16 tile r // 2, half r % 2
                rkey[r] = row_key(head_key(seed, b * nheads + h), row0 + int(wrow) + 16 * (r // 2) + 8 * (r % 2) + int(g))

        n_blocks = n_key_blocks(row0 + BR, s_k, causal_offset)  # Dev: causal block skipping
        if n_blocks > 0:
            if Q_ASYNC:
                load_q_async(smem, OFF_Q, gQ, ub, uh, row0, s_q, d, tid)  # HBM read: Br*d
            # FA2.1 L7: K_1, V_1 (before the loop); V into stage 0
            load_k_async(smem, OFF_K, gK, ub, uhk, 0, s_k, d, tid)  # HBM read: Bc*d
            load_v_async(smem, OFF_V, gV, ub, uhk, 0, s_k, d, tid)  # HBM read: Bc*d
            cp_commit()
        # FA2.1 L6: for j = 1..Tc
        for j in range(n_blocks):
            col0 = j * BC
            vstage = U(j % 2) * uVST
            vbase = OFF_V + vstage
            cp_wait0()  # this thread's copies of K_j, V_j (and, j = 0, Q_i) have landed
            if Q_ASYNC and j == 0:
                scale_q(smem, OFF_Q, tid, scale_log2)
            quiet_k(smem, OFF_K, tid)
            quiet_v(smem, vbase, tid)
            cuda.syncthreads()  # Sync: K_j, V_j (and Q_i) in SRAM; every warp is done with block j-1's P~, exchange and V stage
            if j + 1 < n_blocks:  # Dev: V_{j+1} into the other stage, landing during this block
                load_v_async(smem, OFF_V + (uVST - vstage), gV, ub, uhk, col0 + BC, s_k, d, tid)  # HBM read: Bc*d
                cp_commit()

            # [doc:fa2-tc-dsplit-s]
            # FA2.1 L8: S = Q_i K_j^T for this warp's rows and its Bc / WN keys, the k steps in WIDE's order
            for a in range(NS):
                rS[a] = float32(0.0)
            for kp in range(KD // 2):
                csw = _tiles.swizzle16(U(16 * kp), g) + U(4) * t  # columns 16 kp + 4 t .. + 3 of rows g, g + 8 (key row g)
                load_q_pair(smem, rQw, OFF_Q, wrow, g, uSQ, csw)
                for nt in range(NBW):
                    k0 = OFF_K + (kw0 + U(8 * nt) + g) * uSQ + csw
                    for e in range(4):
                        rKw[nt * 4 + e] = smem[k0 + U(e)]
                for h2 in range(0, 4, 2):  # k step 2 kp + h2 / 2: columns c = 16 kp + 4 t + h2, c + 1
                    split_a_pair(rQw, rAb, rAs, h2)
                    for nt in range(NBW):
                        bb0, bs0 = split(rKw[nt * 4 + h2])
                        bb1, bs1 = split(rKw[nt * 4 + h2 + 1])
                        s_tile_step(rS, rAb, rAs, nt, bb0, bb1, bs0, bs1, sx, wbase, lane)  # 3xTF32 mma3, staged (STAGE_S)
            mask_s(rS, row0, wrow, g, t, col0 + int(kw0), s_k, causal_offset)
            # [/doc:fa2-tc-dsplit-s]

            # [doc:fa2-tc-dsplit-softmax]
            # FA2.1 L9: m_new = max(m_old, rowmax S) across the WN warps of a row group, through the exchange
            for r in range(NR):
                mx = quad_max(lane_row_max(rS, r), sx, wbase, lane)
                if t == U(0):
                    smem[OFF_X + U(wn * BR) + wrow + U(16 * (r // 2) + 8 * (r % 2)) + g] = mx
            cuda.syncthreads()  # Sync: every warp's partial maxima in the exchange; every warp is done reading K_j
            if j + 1 < n_blocks:  # Dev: K_{j+1} into K_j's one stage, landing during L9-L10
                load_k_async(smem, OFF_K, gK, ub, uhk, col0 + BC, s_k, d, tid)  # HBM read: Bc*d
                cp_commit()
            for r in range(NR):
                mt, hf = r // 2, r % 2
                lr = wrow + U(16 * mt + 8 * hf) + g
                mx = smem[OFF_X + lr]
                for w2 in range(1, WN):
                    mx = max(mx, smem[OFF_X + U(w2 * BR) + lr])
                m_new = max(rm[r], mx)
                m_safe = m_new if m_new != NEG_INF else float32(0.0)  # Dev: a row with no key yet: no NaN
                ralpha[r] = math.exp2(rm[r] - m_safe)
                rm[r] = m_new
                psum = float32(0.0)
                for nt in range(NBW):
                    for cc in range(2):
                        p = math.exp2(rS[(mt * NBW + nt) * 4 + 2 * hf + cc] - m_safe)
                        psum += p  # l from the undropped P~ (FA1 Alg.2 L13)
                        if DROPOUT:
                            if not keep(rkey[r], col0 + int(kw0) + 8 * nt + 2 * int(t) + cc, threshold):
                                p = float32(0.0)
                        smem[OFF_P + lr * uSP + kw0 + U(8 * nt + cc) + U(2) * t] = p
                rl[r] = ralpha[r] * rl[r] + psum  # Dev: this warp's keys only; the WN partial sums meet after L11
            cuda.syncthreads()  # Sync: all of P~_ij (every warp's keys) in SRAM before L10 reads whole rows of it
            # [/doc:fa2-tc-dsplit-softmax]

            # [doc:fa2-tc-dsplit-o]
            # FA2.1 L10: O_i = diag(e^(m_old - m_new)) O_i + P~ V_j for this warp's d / WN columns, over all Bc keys
            for a in range(NO):
                rT[a] = float32(0.0)
            for kt in range(NB):  # a = (P[g, t], P[g+8, t], P[g, t+4], P[g+8, t+4]) of 8-key step kt
                for mt in range(MW):
                    p0 = OFF_P + (wrow + U(16 * mt) + g) * uSP + U(8 * kt) + t
                    for c in range(4):
                        rAb[mt * 4 + c], rAs[mt * 4 + c] = split(smem[p0 + U(8 * (c % 2)) * uSP + U(4 * (c // 2))])
                for dn in range(NDW):
                    v0 = vbase + (U(8 * kt) + t) * uSV + dw0 + U(8 * dn) + g  # b = (V[t, c], V[t+4, c])
                    bb0, bs0 = split(smem[v0])
                    bb1, bs1 = split(smem[v0 + U(4) * uSV])
                    for mt in range(MW):
                        f = (mt * NDW + dn) * 4
                        acc = mma3((rAb[mt * 4], rAb[mt * 4 + 1], rAb[mt * 4 + 2], rAb[mt * 4 + 3]),
                                   (rAs[mt * 4], rAs[mt * 4 + 1], rAs[mt * 4 + 2], rAs[mt * 4 + 3]), (bb0, bb1), (bs0, bs1),
                                   (rT[f], rT[f + 1], rT[f + 2], rT[f + 3]), sx, wbase, lane)
                        for c in range(4):
                            rT[f + c] = acc[c]
            for mt in range(MW):  # Dev: the key block's product staged in rT (STAGE_O), one IEEE float32 FMA per element
                for dn in range(NDW):
                    for c in range(4):
                        f = (mt * NDW + dn) * 4 + c
                        rO[f] = rO[f] * ralpha[mt * 2 + c // 2] + rT[f]
            # [/doc:fa2-tc-dsplit-o]

        # Dev: l_i = the sum of the WN warps' partial sums, through the exchange
        cuda.syncthreads()  # Sync: every warp is done reading the exchange's maxima (block-uniform: n_blocks is)
        for r in range(NR):
            lp = quad_sum(rl[r], sx, wbase, lane)
            if t == U(0):
                smem[OFF_X + U(wn * BR) + wrow + U(16 * (r // 2) + 8 * (r % 2)) + g] = lp
        cuda.syncthreads()  # Sync: every warp's partial row sums in the exchange
        for r in range(NR):
            mt, hf = r // 2, r % 2
            lr = wrow + U(16 * mt + 8 * hf) + g
            l_i = smem[OFF_X + lr]
            for w2 in range(1, WN):
                l_i += smem[OFF_X + U(w2 * BR) + lr]
            row = row0 + int(lr)
            if row < s_q:
                # FA2.1 L12: O_i = diag(l_i)^-1 O_i, the only division (times 1/(1-p) with dropout; NaN for a NaN l)
                inv_l = inverse_row_sum(l_i, dropout_scale)
                m_nat, l_m, L_i = natural_stats(rm[r], l_i)  # FA2.1 L13: L_i = m_i + log(l_i)
                # FA2.1 L14: write this warp's columns of O_i to HBM
                for dn in range(NDW):
                    for cc in range(2):
                        col = dw0 + U(8 * dn + cc) + U(2) * t
                        if col < U(d):
                            gO[ub, U(row), uh, col] = rO[(mt * NDW + dn) * 4 + 2 * hf + cc] * inv_l  # HBM write: Br*d
                # FA2.1 L15: write L_i to HBM (one lane per row, in the first warp column)
                if t == U(0) and wn == 0:
                    gL[b, h, row] = L_i  # HBM write: Br
                    gm[b, h, row] = m_nat  # HBM write: Br
                    gl[b, h, row] = l_m  # HBM write: Br

    # [/doc:fa2-tc-dsplit-kernel]
    return kernel
