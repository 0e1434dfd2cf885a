"""Register-tile steps shared by the fast kernels (FA1 Alg 1/2/4 and FA2 Alg 1/2 twins).

The four fast kernels (:mod:`~numba_flash.fast.alg1_forward`, :mod:`~numba_flash.fast.fa2_forward`,
:mod:`~numba_flash.fast.alg4_backward`, :mod:`~numba_flash.fast.fa2_backward`) tile the same matrix
products the same way: a group of ``TPR`` lanes shares ``TM`` query rows (row group ``rg``, lane
``tc``), each thread keeps a ``TM x TN`` tile of ``S`` in registers and reads SRAM 16 bytes at a time.
This module holds those steps once, as device-function factories: each ``make_*`` is cached on its
compile-time constants and returns a ``@cuda.jit(device=True, inline="always")`` function that takes
the shared array, base offsets into it, the lane indices and the caller's ``cuda.local.array``
register tiles.

Why it changes nothing on the GPU: Numba inlines ``inline="always"`` functions at the Numba IR level,
so the local arrays passed in stay registers and the trip counts stay compile-time constants (the
loops unroll as before). SRAM offsets are ``np.uint64`` throughout: a signed index makes Numba emit
the negative-index wrap-around ``select``, which hides the alignment from LLVM's load/store
vectorizer and turns each 16-byte load into four scalar ones (``docs/notes/performance-log.md``,
"Offline inspection"). ``bench/offline_resources.py`` checks that registers, spills and
the SASS instruction count of every default fast kernel are what they were before the factoring.

Paper tags stay in the kernels, on the line that calls a step; the function names say which step
(the HBM -> SRAM tile moves and causal block counts are in :mod:`numba_flash.fast._tiles`):

===================  =====================================================  ==================
factory              step                                                   used by
===================  =====================================================  ==================
make_qkt_tile        S = Q_i K_j^T (TM x TN register tile)                  FA1 / FA2 forward
make_mask_tile       S masked: -inf past N_k or above the causal diagonal   FA1 / FA2 forward
make_row_reductions  rowmax S and rowsum P~ over the TPR lanes of a row     FA1 / FA2 forward
make_softmax_p_tile  m_new, e^(m_old - m_new), P~ = exp2(S - m_new), l      FA1 / FA2 forward
make_pv_tile         O_i += P~ V_j (TM x DP/TPR register tile)              FA1 / FA2 forward
make_store_o_row     one row of that O_i tile, times 1/l_i, to HBM          FA1 / FA2 forward
make_natural_stats   base-2 m, l -> the saved m, l (natural units), L       FA1 / FA2 forward
make_forward_steps   the seven above for one tiling, as a tuple               FA1 / FA2 forward
make_s_dp_p_ds       S, dP~ (register tiles); P, P o Z, tau dS to SRAM      FA1 / FA2 backward
make_row_stats       the saved m, l (or L) -> M, 1/l for P = exp2(S - M)/l  FA1 / FA2 backward
make_dv_dk_update    dV_j += P~^T dO_i and dK_j += tau dS^T Q_i             FA1 / FA2 backward
make_store_dk_dv     write dK_j, dV_j to HBM                                FA1 / FA2 backward
===================  =====================================================  ==================

Plain device functions sit beside them: :func:`min_keep_nan`, the cap ``min(S - M, 64)`` of the fast backwards
(these two and the half ones; the 3xTF32 one's is its PTX twin) that keeps a NaN on a GPU as in the simulator;
:func:`load4` and :func:`dot4_add`, the 16-byte SRAM load and the 4-term multiply-add of the tile products.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from ..device.constants import FULL_MASK as _FULL_MASK
from ..device.constants import LN2, LOG2E, U
from ..device.dropout import keep

U1, U2, U3, U4 = U(1), U(2), U(3), U(4)


@cuda.jit(device=True, inline="always")
def min_keep_nan(x, cap):
    """``min(x, cap)`` that keeps a NaN ``x``: the fast backwards' cap on ``S - M`` before ``exp2``.

    The cap keeps ``exp2`` from overflowing on masked entries (``inf * 0 = NaN``). The builtin ``min`` is CUDA's
    ``fminf`` on a GPU, which returns ``cap`` for a NaN ``x``, and Python's ``min`` in the simulator, which keeps the NaN:
    so a NaN row of ``S`` (a NaN in ``Q_i``, whose ``1/l`` the backward reads as 0) gave ``P = 2^64 * 0 = 0`` and no NaN
    in ``dV`` on a GPU, a NaN ``P`` and ``dV`` in the simulator. ``x > cap`` is False for a NaN, so this keeps it on
    both backends, as torch's attention does (``python -m bench.nan_reach`` shows where it goes). LLVM makes it sm_80's
    ``min.NaN.f32``; the 3xTF32 backward states that instruction as PTX on a GPU (:func:`numba_flash.tensorcore.ptx.min_nan_asm`:
    with this select its non-causal d = 64 build lost its unrolling)."""
    return cap if x > cap else x


@cuda.jit(device=True, inline="always")
def load4(smem, addr, r, a):
    """``r[4 a .. 4 a + 3] = smem[addr .. addr + 3]``: four consecutive SRAM floats into a register tile (one 16-byte
    load where ``addr`` is a multiple of 4 and the SRAM is 16-byte aligned, ``VEC``)."""
    r[4 * a] = smem[addr]
    r[4 * a + 1] = smem[addr + U1]
    r[4 * a + 2] = smem[addr + U2]
    r[4 * a + 3] = smem[addr + U3]


@cuda.jit(device=True, inline="always")
def dot4_add(acc, e, r, a, x0, x1, x2, x3):
    """``acc[e] += r[4 a .. 4 a + 3] . (x0, x1, x2, x3)``, summed left to right: one 4-column step of a register-tile
    product (the loaded :func:`load4` row ``a`` times four SRAM values)."""
    s = acc[e]
    s += r[4 * a] * x0
    s += r[4 * a + 1] * x1
    s += r[4 * a + 2] * x2
    s += r[4 * a + 3] * x3
    acc[e] = s


def _shuffle_offsets(TPR: int):
    offs = []
    s = TPR // 2
    while s >= 1:
        offs.append(s)
        s //= 2
    return offs


# ---------------------------------------------------------------------------------------------
# Forward (FA1 Alg.1 L9-L12 / Alg.2 L10-L15, FA2 Alg.1 L8-L10)
# ---------------------------------------------------------------------------------------------


@functools.cache
def make_qkt_tile(TM: int, TN: int, NK4: int, RG: int, TPR: int, SQ: int):
    """``qkt_tile(smem, qbase, kbase, rg, tc, rS, rq)``: ``rS = Q K^T`` for one thread's register tile.

    Thread (``rg``, ``tc``) computes rows ``rg + RG a`` (``a < TM``) against key rows ``tc + TPR bb``
    (``bb < TN``); Q and K rows are ``SQ`` floats apart in SRAM from ``qbase``, ``kbase``, and the
    reduction runs over ``4 NK4`` columns, four at a time (one 16-byte load per row and step).
    ``rq`` (``4 TM`` floats) holds the Q vectors of one step.
    """
    uRG, uTPR, uSQ = U(RG), U(TPR), U(SQ)

    @cuda.jit(device=True, inline="always")
    def qkt_tile(smem, qbase, kbase, rg, tc, rS, rq):
        for a in range(TM * TN):
            rS[a] = float32(0.0)
        for k4 in range(NK4):
            kk = U(k4) * U4
            for a in range(TM):
                load4(smem, qbase + (rg + uRG * U(a)) * uSQ + kk, rq, a)
            for bb in range(TN):
                ka = kbase + (tc + uTPR * U(bb)) * uSQ + kk
                k0 = smem[ka]
                k1 = smem[ka + U1]
                k2 = smem[ka + U2]
                k3 = smem[ka + U3]
                for a in range(TM):
                    dot4_add(rS, a * TN + bb, rq, a, k0, k1, k2, k3)

    return qkt_tile


@functools.cache
def make_mask_tile(TM: int, TN: int, RG: int, TPR: int, W: int, CAUSAL: bool):
    """``mask_tile(rS, row0, col0, rg, tc, s_k, causal_offset)``: ``-inf`` where a key is not visible.

    The tile covers rows ``row0 ..`` and the ``W`` key columns ``col0 ..``; entries past ``s_k`` or
    (``CAUSAL``) with ``col > row + causal_offset`` are set to ``-inf``. Dev: the elementwise pass runs
    only on tiles the diagonal crosses, or on the ragged last tile.
    """
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline="always")
    def mask_tile(rS, row0, col0, rg, tc, s_k, causal_offset):
        if col0 + W > s_k or (CAUSAL and col0 + W - 1 > row0 + causal_offset):
            for a in range(TM):
                row = row0 + int(rg) + RG * a
                for bb in range(TN):
                    col = col0 + int(tc) + TPR * bb
                    if col >= s_k or (CAUSAL and col > row + causal_offset):
                        rS[a * TN + bb] = NEG_INF

    return mask_tile


@functools.cache
def make_row_reductions(TM: int, TN: int, RG: int, TPR: int, SHFL: bool):
    """``(row_max_tile, row_sum_lanes)``: reductions over the ``TPR`` lanes that share a row.

    ``row_max_tile(smem, rbase, rg, tc, rS, rmax)``: ``rmax[a]`` = max of row ``a`` of the ``TM x TN``
    tiles of all ``TPR`` lanes. ``row_sum_lanes(smem, rbase, rg, tc, rl)``: ``rl[a]`` = sum of the lanes'
    partial sums. With ``SHFL`` a shuffle butterfly (GPU); without it the partials go through the SRAM
    scratch at ``rbase`` (``(RG TM, TPR)`` floats) with two block barriers (the simulator, which has
    no warp shuffles).
    """
    uRG, uTPR = U(RG), U(TPR)
    offs = _shuffle_offsets(TPR)
    N_SHFL = len(offs)
    SH0 = offs[0] if N_SHFL > 0 else 1
    SH1 = offs[1] if N_SHFL > 1 else 1
    SH2 = offs[2] if N_SHFL > 2 else 1
    SH3 = offs[3] if N_SHFL > 3 else 1
    SRAM_REDUCE = not SHFL

    @cuda.jit(device=True, inline="always")
    def stage_partials(smem, rbase, rg, tc, r):
        """(no shuffles) this lane's partials ``r[a]`` of its TM rows into the scratch, column ``tc``."""
        cuda.syncthreads()  # Sync: (no shuffles) the previous reduction's reads of the scratch are done
        for a in range(TM):
            smem[rbase + (rg + uRG * U(a)) * uTPR + tc] = r[a]
        cuda.syncthreads()  # Sync: (no shuffles) every lane's partials are in SRAM

    @cuda.jit(device=True, inline="always")
    def row_max_tile(smem, rbase, rg, tc, rS, rmax):
        for a in range(TM):
            mt = rS[a * TN]
            for bb in range(1, TN):
                mt = max(mt, rS[a * TN + bb])
            rmax[a] = mt
        if SRAM_REDUCE:
            stage_partials(smem, rbase, rg, tc, rmax)  # the lanes' partial row maxima
            for a in range(TM):
                mt = rmax[a]
                for lane in range(TPR):
                    mt = max(mt, smem[rbase + (rg + uRG * U(a)) * uTPR + U(lane)])
                rmax[a] = mt
        else:
            for a in range(TM):
                mt = rmax[a]
                if N_SHFL > 0:
                    mt = max(mt, cuda.shfl_xor_sync(_FULL_MASK, mt, SH0))
                if N_SHFL > 1:
                    mt = max(mt, cuda.shfl_xor_sync(_FULL_MASK, mt, SH1))
                if N_SHFL > 2:
                    mt = max(mt, cuda.shfl_xor_sync(_FULL_MASK, mt, SH2))
                if N_SHFL > 3:
                    mt = max(mt, cuda.shfl_xor_sync(_FULL_MASK, mt, SH3))
                rmax[a] = mt

    @cuda.jit(device=True, inline="always")
    def row_sum_lanes(smem, rbase, rg, tc, rl):
        if SRAM_REDUCE:
            stage_partials(smem, rbase, rg, tc, rl)  # the lanes' partial row sums
            for a in range(TM):
                acc = float32(0.0)
                for lane in range(TPR):
                    acc += smem[rbase + (rg + uRG * U(a)) * uTPR + U(lane)]
                rl[a] = acc
        else:
            for a in range(TM):
                acc = rl[a]
                if N_SHFL > 0:
                    acc += cuda.shfl_xor_sync(_FULL_MASK, acc, SH0)
                if N_SHFL > 1:
                    acc += cuda.shfl_xor_sync(_FULL_MASK, acc, SH1)
                if N_SHFL > 2:
                    acc += cuda.shfl_xor_sync(_FULL_MASK, acc, SH2)
                if N_SHFL > 3:
                    acc += cuda.shfl_xor_sync(_FULL_MASK, acc, SH3)
                rl[a] = acc

    return row_max_tile, row_sum_lanes


@functools.cache
def make_softmax_p_tile(TM: int, TN: int, RG: int, TPR: int, SPS: int, DROPOUT: bool, SCALE_KEPT: bool):
    """``softmax_p_tile(smem, pbase, rg, tc, col0, rS, rm, rmax, ralpha, rl, rkey, threshold, dropout_scale)``.

    The online-softmax step of one register tile (S in base 2, the scale folded into Q):
    ``m_new = max(m, rowmax)``; ``ralpha = e^(m_old - m_new)`` (exp2; 0 when ``m_old = -inf``);
    ``P~ = exp2(S - m_new)`` written to the SRAM P tile at ``pbase`` (row stride ``SPS``);
    ``rl = ralpha rl + rowsum P~`` (this lane's partial sum, from the undropped P~). With ``DROPOUT``
    the stored P~ is zero where the counter hash drops the entry, and (``SCALE_KEPT``) the kept ones
    are scaled by ``dropout_scale`` (FA1 Alg.2 L14; FA2 applies the 1/(1-p) once, at the end).
    ``rmax`` may be the same array as ``ralpha`` (each ``rmax[a]`` is read before ``ralpha[a]`` is written).
    """
    uRG, uTPR, uSPS = U(RG), U(TPR), U(SPS)
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline="always")
    def softmax_p_tile(smem, pbase, rg, tc, col0, rS, rm, rmax, ralpha, rl, rkey, threshold, dropout_scale):
        for a in range(TM):
            m_new = max(rm[a], rmax[a])
            m_safe = m_new if m_new != NEG_INF else float32(0.0)  # Dev: a row with no key yet: no NaN
            alpha = math.exp2(rm[a] - m_safe)  # e^(m_old - m_new) in base 2 (0 when m_old = -inf)
            rm[a] = m_new
            ralpha[a] = alpha
            psum = float32(0.0)
            pa = pbase + (rg + uRG * U(a)) * uSPS + tc
            for bb in range(TN):
                # Dev: P~ e^(m~ - m_new) in one exp2 (S - m_new)
                p = math.exp2(rS[a * TN + bb] - m_safe)
                psum += p  # l from the undropped P~ (FA1 Alg.2 L13)
                if DROPOUT:
                    if SCALE_KEPT:
                        p = p * dropout_scale if keep(rkey[a], col0 + int(tc) + TPR * bb, threshold) else float32(0.0)
                    else:
                        if not keep(rkey[a], col0 + int(tc) + TPR * bb, threshold):
                            p = float32(0.0)
                smem[pa + uTPR * U(bb)] = p
            rl[a] = alpha * rl[a] + psum

    return softmax_p_tile


@functools.cache
def make_pv_tile(TM: int, DV: int, NC4: int, RG: int, TPR: int, SQ: int, SPS: int):
    """``pv_tile(smem, pbase, vbase, rg, tc, rO, rp)``: ``rO += P~ V`` for one thread's register tile.

    ``rO`` holds rows ``rg + RG a`` and the ``DV`` 4-float vectors of columns ``4 tc + 4 TPR ev``; the
    product runs over ``4 NC4`` key rows of the P tile (``pbase``, row stride ``SPS``) and of V
    (``vbase``, row stride ``SQ``), with 16-byte loads. ``rp`` (``4 TM`` floats) holds one step of P~.
    """
    uRG, uSQ, uSPS = U(RG), U(SQ), U(SPS)

    @cuda.jit(device=True, inline="always")
    def pv_tile(smem, pbase, vbase, rg, tc, rO, rp):
        for c4 in range(NC4):
            cc = U(c4) * U4
            for a in range(TM):
                load4(smem, pbase + (rg + uRG * U(a)) * uSPS + cc, rp, a)
            for cx in range(4):
                for ev in range(DV):
                    va = vbase + (cc + U(cx)) * uSQ + U4 * tc + U(4 * TPR) * U(ev)
                    v0 = smem[va]
                    v1 = smem[va + U1]
                    v2 = smem[va + U2]
                    v3 = smem[va + U3]
                    for a in range(TM):
                        pv = rp[4 * a + cx]
                        o = (a * DV + ev) * 4
                        rO[o] += pv * v0
                        rO[o + 1] += pv * v1
                        rO[o + 2] += pv * v2
                        rO[o + 3] += pv * v3

    return pv_tile


@functools.cache
def make_inverse_row_sum(DROPOUT: bool):
    """``inverse_row_sum(l, dropout_scale) -> 1 / l``: the factor of FA2's line 12 (``O_i = diag(l_i)^-1 O_i``) in the
    tensor-core forwards, times ``dropout_scale`` (``1 / (1 - p)``) with ``DROPOUT``. 0 for a row that saw no key
    (``l = 0``: its O stays 0); ``l`` itself where it is NaN (a NaN score made the row sum NaN, and the row must be NaN
    even where the split or the half rounding of ``P~ V`` lost it)."""

    @cuda.jit(device=True, inline="always")
    def inverse_row_sum(l, dropout_scale):
        inv_l = float32(0.0)
        if l != l:
            inv_l = l
        if l > 0:
            inv_l = float32(1.0) / l
            if DROPOUT:
                inv_l *= dropout_scale
        return inv_l

    return inverse_row_sum


@functools.cache
def make_store_o_row(DV: int, TPR: int):
    """``store_o_row(gO, ub, row, uh, tc, d, rO, a, inv_l)``: row ``a`` of this thread's O tile (the layout of
    :func:`make_pv_tile`) times ``inv_l`` to row ``row`` of ``gO (b, s_q, h, d)``, columns past ``d`` skipped; 4
    consecutive floats per lane, the lanes of a row consecutive."""

    @cuda.jit(device=True, inline="always")
    def store_o_row(gO, ub, row, uh, tc, d, rO, a, inv_l):
        for ev in range(DV):
            for x4 in range(4):
                x = 4 * int(tc) + 4 * TPR * ev + x4
                if x < d:
                    gO[ub, U(row), uh, U(x)] = rO[(a * DV + ev) * 4 + x4] * inv_l  # HBM write: Br*d

    return store_o_row


@functools.cache
def make_natural_stats():
    """``natural_stats(m2, l) -> (m, l_m, L)``: a forward's base-2 row statistics as the kernels save them.

    A fast forward works in base 2 (``Q`` scaled by ``tau log2 e``): its row max ``m2`` and sum
    ``l = sum exp2(S - m2)``. It saves ``m = m2 ln 2`` (natural units, float32), the logsumexp
    ``L = m2 ln 2 + ln l`` and ``l_m``, the sum relative to ``M = m log2 e`` (the float32 product the
    backward forms, :func:`make_row_stats`): ``l_m = l 2^(m2 - M)``. ``M`` differs from ``m2`` by the
    rounding of the two products (``|m2 - M| <~ ulp(m2)``), so ``2^(m2 - M)`` is 1 to a few ulp at
    ordinary logits, and the pair ``(M, l_m)`` reproduces the forward's ``P`` exactly where it
    matters: ``exp2(S - M) / l_m = exp2(S - m2) / l``. Beyond ``|m2 - M| > 64`` (logits past ~1e9,
    where float32 cannot carry ``m2`` through natural units at all) ``l`` is saved as is. A row that
    saw no key (``l = 0``) gives ``(-inf, 0, +inf)``.
    """
    F_LN2 = float32(LN2)
    F_LOG2E = float32(LOG2E)
    INF = float32(math.inf)
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def natural_stats(m2, l):
        if not (l > ZERO):
            return -INF, ZERO, INF
        m = m2 * F_LN2
        e = m2 - m * F_LOG2E
        l_m = l
        if e >= float32(-64.0) and e <= float32(64.0):
            l_m = l * math.exp2(e)
        return m, l_m, m2 * F_LN2 + math.log(l)

    return natural_stats


def make_forward_steps(TM: int, TN: int, DV: int, RG: int, TPR: int, DP: int, SQ: int, SPS: int, W: int, CAUSAL: bool,
                       DROPOUT: bool, SHFL: bool, SCALE_KEPT: bool):
    """The forward steps above for one tiling, as both FFMA forwards take them: ``(qkt_tile, mask_tile, row_max_tile,
    row_sum_lanes, softmax_p_tile, pv_tile, store_o_row, natural_stats)``. ``W``: the key columns of one S tile (FA2's ``Bc``, FA1's
    chunk ``BCC``), so ``W / 4`` 4-key steps of ``P~ V`` and ``DP / 4`` 4-column steps of ``Q K^T``."""
    NK4 = DP // 4  # 4-column steps of Q K^T (16-byte loads)
    NC4 = W // 4  # 4-key steps of P~ V
    row_max_tile, row_sum_lanes = make_row_reductions(TM, TN, RG, TPR, SHFL)
    return (make_qkt_tile(TM, TN, NK4, RG, TPR, SQ), make_mask_tile(TM, TN, RG, TPR, W, CAUSAL), row_max_tile,
            row_sum_lanes, make_softmax_p_tile(TM, TN, RG, TPR, SPS, DROPOUT, SCALE_KEPT),
            make_pv_tile(TM, DV, NC4, RG, TPR, SQ, SPS), make_store_o_row(DV, TPR), make_natural_stats())


# ---------------------------------------------------------------------------------------------
# Backward (FA1 Alg.4 L11-L24, FA2 Alg.2 L10-L18)
# ---------------------------------------------------------------------------------------------


@functools.cache
def make_s_dp_p_ds(TM: int, TN: int, NK4: int, RG: int, TPR: int, SQ: int, SP: int, BC: int,
                   OFF_Q, OFF_DO, OFF_K, OFF_V, OFF_P, OFF_DS, OFF_M, OFF_D, OFF_IL, CAUSAL: bool, DROPOUT: bool):
    """``s_dp_p_ds(smem, tid, row0, col0, s_k, causal_offset, tau, c, rkey, threshold, dropout_scale, rS, rdP, rq, rdo)``.

    ``S = (c Q_i) K_j^T`` (base 2: ``c = tau log2 e``, each ``Q`` element scaled as it is read, exactly
    as the forward scaled it on load) and ``dP~ = dO_i V_j^T`` as ``TM x TN`` register tiles (one pass
    over the ``4 NK4`` columns, 16-byte loads); then, per entry, ``P = exp2(S - M_r) / l_r`` with the
    row's ``M_r`` and ``1/l_r`` read from SRAM at ``OFF_M`` and ``OFF_IL`` (:func:`make_row_stats`),
    zero where masked; ``P o Z`` to SRAM at ``OFF_P`` and ``tau dS = tau P o (dP~ o Z - D_r)`` at
    ``OFF_DS`` (row stride ``SP``), ``D_r`` read at ``OFF_D``.

    Why base 2 and the forward's scaling (not ``exp(S tau - L)``): with a sharp softmax the error rule
    needs ``P`` at a row's dominant key to reproduce the forward's normalization to a few ulp. ``S``
    recomputed with the forward's roundings (bitwise: the same products and FMA chain) and the
    forward's ``M, l`` give exactly that; ``exp(S tau - L)`` is off by ``ulp(L)`` and by the rounding
    differences between ``S tau`` and the forward's base-2 ``S`` (``docs/backward.rst``, "Large logits").
    """
    uRG, uTPR, uSQ, uSP = U(RG), U(TPR), U(SQ), U(SP)
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def s_dp_p_ds(smem, tid, row0, col0, s_k, causal_offset, tau, c, rkey, threshold, dropout_scale, rS, rdP, rq, rdo):
        rg = tid // uTPR
        tc = tid % uTPR
        for a in range(TM * TN):
            rS[a] = ZERO
            rdP[a] = ZERO
        for k4 in range(NK4):
            kk = U(k4) * U4
            for a in range(TM):
                qa = (rg + uRG * U(a)) * uSQ + kk
                rq[4 * a] = smem[OFF_Q + qa] * c  # Dev: Q_i times tau log2 e, rounded as the forward's Q load
                rq[4 * a + 1] = smem[OFF_Q + qa + U1] * c
                rq[4 * a + 2] = smem[OFF_Q + qa + U2] * c
                rq[4 * a + 3] = smem[OFF_Q + qa + U3] * c
                load4(smem, OFF_DO + qa, rdo, a)
            for bb in range(TN):
                ka = (tc + uTPR * U(bb)) * uSQ + kk
                k0 = smem[OFF_K + ka]
                k1 = smem[OFF_K + ka + U1]
                k2 = smem[OFF_K + ka + U2]
                k3 = smem[OFF_K + ka + U3]
                v0 = smem[OFF_V + ka]
                v1 = smem[OFF_V + ka + U1]
                v2 = smem[OFF_V + ka + U2]
                v3 = smem[OFF_V + ka + U3]
                for a in range(TM):
                    dot4_add(rS, a * TN + bb, rq, a, k0, k1, k2, k3)
                    dot4_add(rdP, a * TN + bb, rdo, a, v0, v1, v2, v3)
        masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
        # Dev: branch-free (selects, not branches) so that the TM x TN loops unroll and rS, rdP stay in registers
        for a in range(TM):
            r = rg + uRG * U(a)
            row = row0 + int(r)
            M_r = smem[OFF_M + r]  # the forward's base-2 row max (0 on rows that see no key or lie past N_q)
            il = smem[OFF_IL + r]  # 1/l_i; 0 on rows that see no key or lie past N_q (then P = 0, no NaN)
            D_r = smem[OFF_D + r]
            horizon = s_k - 1
            if CAUSAL:
                horizon = min(horizon, row + causal_offset)
            if not masked:
                horizon = col0 + BC
            for bb in range(TN):
                cc = tc + uTPR * U(bb)
                col = col0 + int(cc)
                # Dev: min(., 64): no overflow on masked entries (exp2 overflow, then inf * 0 = NaN); a NaN kept
                p = math.exp2(min_keep_nan(rS[a * TN + bb] - M_r, float32(64.0))) * il
                p = p if col <= horizon else ZERO
                dp = rdP[a * TN + bb]
                pz = p
                if DROPOUT:
                    z = dropout_scale if keep(rkey[a], col, threshold) else ZERO
                    pz = p * z
                    dp = dp * z
                smem[OFF_P + r * uSP + cc] = pz
                smem[OFF_DS + r * uSP + cc] = tau * (p * (dp - D_r))

    return s_dp_p_ds


@functools.cache
def make_row_stats(FROM_LSE: bool):
    """``row_stats(gm, gl, b, h, row, s_q) -> (M, 1/l)``: one row's statistics as the backward's P needs them.

    ``M = m log2 e`` (float32 product) is the base-2 row max the forward used, recovered from the
    natural-unit ``m`` it saved: the forward stored ``m`` and adjusted ``l`` so that the pair is exact
    for this very product (:func:`make_natural_stats`). ``FROM_LSE``: only the logsumexp ``L`` was
    saved (passed as ``gm``), ``M = L log2 e`` and ``1/l = 1``. Rows past ``s_q`` or that see no key
    (``l = 0``, ``L = +inf``) give ``(0, 0)``: ``P = 0``, never NaN.
    """
    ZERO = float32(0.0)
    ONE = float32(1.0)
    INF = float32(math.inf)
    F_LOG2E = float32(LOG2E)

    @cuda.jit(device=True, inline="always")
    def row_stats(gm, gl, b, h, row, s_q):
        M = ZERO
        il = ZERO
        if row < s_q:
            if FROM_LSE:
                L_r = gm[b, h, row]
                if L_r < INF:
                    M = L_r * F_LOG2E
                    il = ONE
            else:
                l_r = gl[b, h, row]
                if l_r > ZERO:
                    M = gm[b, h, row] * F_LOG2E
                    il = ONE / l_r
        return M, il

    return row_stats


@functools.cache
def make_dv_dk_update(BR: int, NQC: int, CW: int, CG: int, DVX: int, XT: int, TC: int, SP: int, SQ: int,
                      OFF_P, OFF_DS, OFF_DO, OFF_Q):
    """``dv_dk_update(smem, cy, tx, rp, rds, rov, rqv, rdV, rdK)``: ``dV_j += P~^T dO_i``, ``dK_j += tau dS^T Q_i``.

    One pass over the ``BR`` rows of the block: outer products of this thread's ``TC`` key columns
    (``CW`` consecutive ones in each of ``NQC`` groups, ``cy``) of P~ and tau dS with its ``4 DVX`` head
    columns (``tx``) of dO_i and Q_i, accumulated in the ``TC x 4 DVX`` register tiles ``rdV``, ``rdK``.
    """
    uSP, uSQ, uCW, uCG = U(SP), U(SQ), U(CW), U(CG)

    @cuda.jit(device=True, inline="always")
    def dv_dk_update(smem, cy, tx, rp, rds, rov, rqv, rdV, rdK):
        for r in range(BR):
            ur = U(r)
            for qc in range(NQC):
                pa = ur * uSP + uCW * cy + uCW * uCG * U(qc)
                for u in range(CW):
                    rp[qc * CW + u] = smem[OFF_P + pa + U(u)]
                    rds[qc * CW + u] = smem[OFF_DS + pa + U(u)]
            for e in range(DVX):
                xa = ur * uSQ + U(4) * tx + U(4 * XT) * U(e)
                for w in range(4):
                    rov[4 * e + w] = smem[OFF_DO + xa + U(w)]
                    rqv[4 * e + w] = smem[OFF_Q + xa + U(w)]
            for cc in range(TC):
                pv = rp[cc]
                dsv = rds[cc]
                for x in range(DVX * 4):
                    rdV[cc * DVX * 4 + x] += pv * rov[x]
                    rdK[cc * DVX * 4 + x] += dsv * rqv[x]

    return dv_dk_update


@functools.cache
def make_store_dk_dv(NQC: int, CW: int, CG: int, DVX: int, XT: int, ADD: bool = False):
    """``store_dk_dv(gdK, gdV, ub, uhead, col0, s_k, d, cy, tx, rdK, rdV)``: the register tiles to HBM.

    Writes this thread's key columns ``col0 + CW cy + CW CG qc + u`` (below ``s_k``) and head columns
    ``4 tx + 4 XT e + w`` (below ``d``) of ``gdK[b, col, head, x]``, ``gdV`` (4 consecutive floats per lane).
    ``ADD``: ``add_dk_dv(..., rdK, rdV, add)`` adds the tiles to what is there when ``add`` (one float32 add per element,
    the thread's own elements: no race), else writes them.
    """
    uCW, uCG = U(CW), U(CG)

    @cuda.jit(device=True, inline="always")
    def add_dk_dv(gdK, gdV, ub, uhead, col0, s_k, d, cy, tx, rdK, rdV, add):
        for qc in range(NQC):
            for u in range(CW):
                c = uCW * cy + uCW * uCG * U(qc) + U(u)
                col = col0 + int(c)
                if col < s_k:
                    for e in range(DVX):
                        for w in range(4):
                            x = U(4) * tx + U(4 * XT) * U(e) + U(w)
                            if x < U(d):
                                a = (qc * CW + u) * DVX * 4 + 4 * e + w
                                if ADD and add:
                                    gdK[ub, U(col), uhead, x] += rdK[a]  # HBM read+write: Bc*d
                                    gdV[ub, U(col), uhead, x] += rdV[a]  # HBM read+write: Bc*d
                                else:
                                    gdK[ub, U(col), uhead, x] = rdK[a]  # HBM write: Bc*d
                                    gdV[ub, U(col), uhead, x] = rdV[a]  # HBM write: Bc*d

    @cuda.jit(device=True, inline="always")
    def store_dk_dv(gdK, gdV, ub, uhead, col0, s_k, d, cy, tx, rdK, rdV):
        add_dk_dv(gdK, gdV, ub, uhead, col0, s_k, d, cy, tx, rdK, rdV, False)

    return add_dk_dv if ADD else store_dk_dv
