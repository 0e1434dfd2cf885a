"""FlashAttention-2 Algorithm 2 on the tensor cores in fp16 / bf16 (``mma.sync.m16n8k16``, float32 accumulate).

Paper: Dao, "FlashAttention-2", Algorithm 2 ([FA2-ICLR] Appendix A); the paper's kernels are fp16/bf16.
Same algorithm, semantics, paper tags and launch grid as :mod:`numba_flash.fa2_backward` (readable) and
:mod:`numba_flash.fast.fa2_backward` (float32 FFMA); read those first, and the half forward
:mod:`numba_flash.tensorcore.fa2_forward_half` for the fragment layouts, ``ldmatrix`` and why a tile of ``P``
can stay in registers. This kernel runs the backward of float16/bfloat16 inputs (``variant="tensorcore"``,
and ``"auto"`` on a GPU, routed here by :mod:`numba_flash.registry`).

What half precision changes
---------------------------
* **Inputs in half, gradients in half.** Q, K, V, O, dO arrive as words (two halves per ``uint32``,
  :meth:`numba_flash._launch.Allocator.to_words`); ``dK_j, dV_j`` are summed in float32 registers and
  written once, rounded to half words. ``dQ`` is summed across key blocks by float32 atomic adds into a
  float32 buffer (as flash-attn's ``dq_accum``), rounded to the input dtype on the way back to the caller.
* **Each warp owns 16 key rows, so the transposed tiles are the natural ones.** The block of ``Bc`` keys is
  split over its warps (``MW`` m16 tiles each); a warp computes ``S_ij^T = K_j Q_i^T`` and
  ``dP_ij^T = V_j dO_i^T`` (keys x queries) with ``K_j``, ``V_j`` rows as the A operand, exactly as the
  forward's ``S = Q K^T`` with Q rows. Then the accumulator of ``P^T`` (and of ``dS^T``) holds, per lane,
  the A words of a 16-*query* step: ``dV_j += P^T dO_i`` and ``dK_j += dS^T Q_i`` take their A operand
  from registers (``cvt.rn.{f16,bf16}x2.f32``), their B operand (``dO_i``, ``Q_i`` rows: two queries of one
  column per word) by ``ldmatrix.x4.trans``, and ``dK_j, dV_j`` never leave the warp's registers.
* **dQ goes through SRAM once.** ``dQ_i += dS_ij K_j`` sums over the block's keys, which are spread over
  the warps: each warp stores its ``dS^T`` half words (the A words it already packed) to SRAM, and after a
  barrier every warp multiplies a slice of ``dS`` (A: ``ldmatrix.x4.trans`` of the stored ``dS^T``) by
  ``K_j`` (B: ``ldmatrix.x4.trans``) and adds it to HBM with float32 atomics.
* **P from the forward's statistics.** ``P^T = exp2(S^T tau log2 e - L log2 e)`` from the forward's logsumexp
  ``L`` per *column* (query), one FFMA and one exponential per element (``LSE_P``, the default; the kernels'
  ``FROM_LSE`` path), or ``exp2(S^T tau log2 e - M) / l`` from its ``M, l`` (``LSE_P`` off), as
  :func:`numba_flash.fast._regtile.make_row_stats` gives them; ``S`` is the float32 sum of exact half products, the
  forward's ``S`` to float32 rounding.
* ``deterministic=True``: no atomics; :func:`fa2_backward_half_dq_kernel` (one block per query block, the
  forward's geometry: warps own query rows, ``dS`` in registers is the A operand of ``dS K_j``) sums
  ``dQ_i`` in registers in a fixed order and writes half words.

Accuracy (flash-attn's rule for half inputs): every gradient within 3x the error of naive attention's
autograd in the same half dtype, both against float64 (``tests/kernels/test_half_kernels.py``).

Launch geometry
---------------
pre-pass: ``D = rowsum(dO o O)`` from words (:func:`row_dot_words`, a warp per row). Main kernel: grid ``(Tc, batch * nheads_k)``,
block ``32 NW`` threads, ``Bc = 16 MW NW`` keys; the block loops over the ``G`` query heads of its KV head
and the visible query blocks of ``Br`` rows (one flat loop, as the FFMA kernel). SRAM (``uint32`` words):
``Q_i, dO_i`` Br (DW+4) each (two stages of both with ``CP_ASYNC``), ``K_j, V_j`` Bc (DW+4) each, ``dS^T``
Bc (Br/2+4) (:func:`smem_words`), plus ``M, 1/l, D`` of the Br queries (float32, static; two stages with
``CP_ASYNC``) and the simulator's exchange scratch.

GPU: compute capability 8.0 or newer. The simulator runs the same source with the Python twins of
:func:`numba_flash.tensorcore.ptx.make_half_ops`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from .._launch import KernelLaunch, Problem, bh_grid, ceil_div
from ..device.backward_launch import launch_fa2_backward
from ..device.constants import U
from ..device.dropout import head_key, keep, row_key
from ..fast import _plan, _prepass, _regtile, _tiles
from ..runtime import backend as _backend
from . import backward_steps, fa2_forward_half, forward_steps, ptx
from .ptx import available  # noqa: F401  (the kernel contract's optional available())

#: The inputs this kernel runs: those of the half forward (float16/bfloat16, even head dim <= 128).
handles = fa2_forward_half.handles
stride = fa2_forward_half.stride


#: :func:`backward` puts nothing on the GPU but the allocator's outputs and launches through ``_smem.launch`` (the
#: pre-pass, the main kernel, the deterministic dQ kernel): an eager call's backward may be replayed
#: (:mod:`numba_flash.runtime.replay`)
REPLAYABLE = True

#: The allocator hands this module half inputs as words of two halves (:meth:`numba_flash._launch.Allocator.to_words`).
TAKES_WORDS = True


@functools.cache
def config_for(d: int, block_sizes=None):
    """The tiling ``(NW, MW, BR, DP)``: warps, key m16 tiles per warp (``Bc = 16 MW NW``), query rows per step, d padded.

    Defaults (the sweep ``docs/results/sweeps/half_bwd_sweep_h100_v1.json``, docs/notes/performance-log.md):
    8 warps of 16 keys (``Bc = 128``); ``Br = 64`` at ``d <= 64``, ``Br = 32`` above (the float32 dK_j, dV_j
    registers double). Where :func:`dq_split` cannot split that ``dQ`` tile over the warps (an odd number of
    16-column pairs, e.g. d = 110), the first of 4 warps x ``Br = 64``, 2 x 32, 1 x 16 that it can.
    ``block_sizes=(Br, Bc)`` is rounded up to multiples of 16; ``Bc / 16`` m16 tiles go to as many warps
    as the dQ split allows, the rest to ``MW``.
    """
    DP = 16 * ((d + 15) // 16)
    if block_sizes is None:
        for NW, BR in ((8, 64 if DP <= 64 else 32), (4, 64), (2, 32), (1, 16)):
            if dq_split(NW, BR, DP) is not None:
                return NW, 1, BR, DP
    BR, BC = (16 * ((int(n) + 15) // 16) for n in block_sizes)
    m16 = BC // 16
    NW = max(w for w in (1, 2, 4, 8) if m16 % w == 0 and dq_split(w, BR, DP) is not None)
    return NW, m16 // NW, BR, DP


def dq_split(NW: int, BR: int, DP: int):
    """How ``dQ_i += dS K_j`` (``BR x DP``) is split over ``NW`` warps: ``(QPW, DSPLIT)`` or None.

    ``QT = BR / 16`` query m16 tiles; ``NDP = DP / 16`` pairs of n8 column tiles. With ``QT >= NW`` a warp
    takes ``QPW = QT / NW`` query tiles and every column (``DSPLIT = 1``); otherwise ``DSPLIT = NW / QT``
    warps share a query tile, ``NDP / DSPLIT`` column pairs each.
    """
    QT, NDP = BR // 16, DP // 16
    if QT >= NW:
        return (QT // NW, 1) if QT % NW == 0 else None
    return (1, NW // QT) if NW % QT == 0 and NDP % (NW // QT) == 0 else None


def smem_words(NW: int, MW: int, BR: int, DP: int, stages: int = 1) -> int:
    """Dynamic SRAM of the main kernel in 32-bit words: ``stages`` copies of Q_i, dO_i (2 with ``CP_ASYNC``), K_j,
    V_j and dS^T (see the module docstring)."""
    BC = 16 * MW * NW
    return (2 * stages * BR + 2 * BC) * stride(DP) + BC * (BR // 2 + 4)


def _allocate_grads(prob: Problem, alloc, deterministic: bool):
    """(dQ, dK, dV) of the half backward: dK, dV half words; dQ float32 zeros (atomic adds) or half words (deterministic)."""
    shape_q = (prob.batch, prob.seqlen_q, prob.nheads, prob.headdim)
    words_k = (prob.batch, prob.seqlen_k, prob.nheads_k, prob.headdim // 2)
    # FA2.2 L3: dQ = (0) in HBM (float32, for the atomic adds; the deterministic kernel writes every row); dK, dV: Tc blocks
    if deterministic:
        dq = alloc.empty(shape_q[:3] + (prob.headdim // 2,), dtype=np.int32)
    else:
        dq = alloc.zeros(shape_q)
    return dq, alloc.empty(words_k, dtype=np.int32), alloc.empty(words_k, dtype=np.int32)


def row_dot_words(out, dout, prob: Problem, alloc):
    """D (b, h, N_q) float32 from the word arrays of O and dO (:func:`numba_flash.fast._prepass.row_dot`, a warp per
    row)."""
    return _prepass.row_dot(out, dout, prob, alloc, kind=ptx.HALF_KINDS[prob.dtype])


@functools.cache
def make_mma16_add(KIND: str, SIM: bool):
    """``mma16_add(rA, q, b, rC, f, sx, wbase, lane)``: one ``mma.m16n8k16`` of the kernels' products: the A words of m16
    tile ``q`` (``rA[4 q ..]``) times the B words ``b``, accumulated into ``rC[f .. f + 3]``."""
    _, mma16, _, _ = ptx.make_half_ops(KIND, SIM)

    @cuda.jit(device=True, inline="always")
    def mma16_add(rA, q, b, rC, f, sx, wbase, lane):
        acc = mma16((rA[q * 4], rA[q * 4 + 1], rA[q * 4 + 2], rA[q * 4 + 3]), b, (rC[f], rC[f + 1], rC[f + 2], rC[f + 3]),
                    sx, wbase, lane)
        for c in range(4):
            rC[f + c] = acc[c]

    return mma16_add


@functools.cache
def make_mma16_pairs(MW: int, NX: int, KIND: str, SIM: bool):
    """``mma16_pairs(rA, rA2, rC, rC2, pair, b0, b1, b2, b3, c0, c1, c2, c3, sx, wbase, lane)``: two products of one
    16-wide k step side by side, into the n8 tiles ``2 pair`` and ``2 pair + 1`` of each of the warp's ``MW`` m16 tiles
    (tile ``n`` of m16 tile ``mt`` at ``[(mt NX + n) 4 ..]``): ``rC += A B`` (A words in ``rA``; B words ``(b0, b1)``,
    ``(b2, b3)`` of the two tiles, as one ``ldmatrix.x4`` gives them) and ``rC2 += A2 B2`` (``rA2``; ``(c0, c1)``,
    ``(c2, c3)``), the two ``mma`` of a tile one after the other (the forward's
    :func:`numba_flash.tensorcore.fa2_forward_half.make_mma16_pair` runs one product)."""
    mma16_add = make_mma16_add(KIND, SIM)

    @cuda.jit(device=True, inline="always")
    def mma16_pairs(rA, rA2, rC, rC2, pair, b0, b1, b2, b3, c0, c1, c2, c3, sx, wbase, lane):
        for h2 in range(2):
            bb = (b0, b1) if h2 == 0 else (b2, b3)
            bc = (c0, c1) if h2 == 0 else (c2, c3)
            for mt in range(MW):
                f = (mt * NX + 2 * pair + h2) * 4
                mma16_add(rA, mt, bb, rC, f, sx, wbase, lane)
                mma16_add(rA2, mt, bc, rC2, f, sx, wbase, lane)

    return mma16_pairs


@functools.cache
def make_row_words_store(ND: int, KIND: str, SIM: bool, PAIR: bool):
    """``store_row(gX, rX, gY, rY, ub, row, uh, dw, f0, t)``: a lane's part of one fragment row to HBM in half words:
    word ``4 dn + t`` of row ``row`` of ``gX[ub, :, uh, :]`` is the pair of floats ``rX[f0 + 4 dn ..]`` rounded to half
    (``ND`` n8 tiles; words past ``dw`` left out); with ``PAIR`` the same of ``rY`` into ``gY``, word by word (dK_j with
    dV_j)."""
    pack2, _, _, _ = ptx.make_half_ops(KIND, SIM)

    @cuda.jit(device=True, inline="always")
    def store_row(gX, rX, gY, rY, ub, row, uh, dw, f0, t):
        for dn in range(ND):
            x = U(4 * dn) + t
            if x < U(dw):
                f = f0 + 4 * dn
                gX[ub, U(row), uh, x] = int32(pack2(rX[f], rX[f + 1]))
                if PAIR:
                    gY[ub, U(row), uh, x] = int32(pack2(rY[f], rY[f + 1]))

    return store_row


@functools.cache
def make_fragment_products(MW: int, NB: int, KD: int, SQ: int, KIND: str, SIM: bool):
    """``(mma_pair_products, pack_a)``: the steps both half backward kernels run on m16n8k16 fragments.

    * ``mma_pair_products(smem, OFF_A, OFF_A2, OFF_B, OFF_B2, wrow, lr, lw, kr, kw, rA, rA2, rS, rS2, sx, wbase, lane)``:
      ``rS = A B^T`` and ``rS2 = A2 B2^T`` over ``16 KD`` columns, A and A2 the warp's ``16 MW`` rows at
      ``wrow`` of the SRAM tiles at ``OFF_A``, ``OFF_A2`` (ldmatrix), B and B2 the ``8 NB`` rows of the tiles
      at ``OFF_B``, ``OFF_B2`` (ldmatrix, two n8 tiles per load); row stride ``SQ`` words, accumulators in the
      layout of :func:`numba_flash.tensorcore.fragments.make_fragment_steps`. The main kernel computes ``S^T = K Q^T``,
      ``dP^T = V dO^T`` with it, the dQ kernel ``S = Q K^T``, ``dP = dO V^T``.
    * ``pack_a(rX, f0) -> 4 words``: fragments ``f0`` and ``f0 + 4`` (two adjacent n8 tiles) of ``rX`` rounded
      to half in pairs: the A operand of a 16-wide k step (the accumulator layout is the A layout).
    """
    pack2, _, ldsm, _ = ptx.make_half_ops(KIND, SIM)
    mma16_pairs = make_mma16_pairs(MW, NB, KIND, SIM)
    uSQ = U(SQ)
    NS = MW * NB * 4
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def mma_pair_products(smem, OFF_A, OFF_A2, OFF_B, OFF_B2, wrow, lr, lw, kr, kw, rA, rA2, rS, rS2, sx, wbase, lane):
        for a in range(NS):
            rS[a] = ZERO
            rS2[a] = ZERO
        for ks in range(KD):
            for mt in range(MW):
                aa = (wrow + U(16 * mt) + lr) * uSQ + U(8 * ks) + lw
                rA[mt * 4], rA[mt * 4 + 1], rA[mt * 4 + 2], rA[mt * 4 + 3] = ldsm(smem, OFF_A + aa, sx, wbase, lane)
                rA2[mt * 4], rA2[mt * 4 + 1], rA2[mt * 4 + 2], rA2[mt * 4 + 3] = ldsm(smem, OFF_A2 + aa, sx, wbase, lane)
            for np2 in range(NB // 2):
                ba = (U(16 * np2) + kr) * uSQ + U(8 * ks) + kw
                b0, b1, b2, b3 = ldsm(smem, OFF_B + ba, sx, wbase, lane)
                c0, c1, c2, c3 = ldsm(smem, OFF_B2 + ba, sx, wbase, lane)
                mma16_pairs(rA, rA2, rS, rS2, np2, b0, b1, b2, b3, c0, c1, c2, c3, sx, wbase, lane)

    @cuda.jit(device=True, inline="always")
    def pack_a(rX, f0):
        return (pack2(rX[f0], rX[f0 + 1]), pack2(rX[f0 + 2], rX[f0 + 3]), pack2(rX[f0 + 4], rX[f0 + 5]),
                pack2(rX[f0 + 6], rX[f0 + 7]))

    return mma_pair_products, pack_a


@functools.cache
def fa2_backward_half_kernel(NW: int, MW: int, BR: int, DP: int, CAUSAL: bool, DROPOUT: bool, ATOMIC_DQ: bool,
                             PREFETCH: bool, SIM: bool, KIND: str, FROM_LSE: bool = False, RED2: bool = False,
                             CP_ASYNC: bool = False, EX2_FTZ: bool = False):
    """The main (column-block) half backward kernel: dK, dV, and with ``ATOMIC_DQ`` the atomic dQ adds.

    ``CP_ASYNC`` (d a multiple of 8, 16-byte aligned Q and dO): Q_i, dO_i go HBM -> SRAM by ``cp.async`` into two
    SRAM stages (step ``st`` in stage ``st % 2``, with its statistics), issued one step ahead, as the half forward
    streams K_j, V_j; one barrier per step instead of two, and no registers hold them (``PREFETCH`` then moves
    only the statistics). Otherwise through registers into one stage (``PREFETCH``: one step ahead).

    Kernel arguments: ``gQ, gdO (b, s_q, h, d/2)``, ``gK, gV (b, s_k, h_k, d/2)`` (int32 words), ``gm, gl,
    gD (b, h, s_q)`` float32 (the forward's ``m, l``; with ``FROM_LSE`` only ``L``, passed as ``gm``),
    ``gdQ (b, s_q, h, d)`` float32 zeros (unused without ``ATOMIC_DQ``), ``gdK, gdV (b, s_k, h_k, d/2)``
    words; ``tau``, ``c1 = tau log2 e``, ``group``, ``causal_offset``, dropout ``seed``, ``threshold``,
    ``dropout_scale``.

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, dO (half words)  gQ, gK, gV, gdO      HBM, int32 views
    m, l (or L), D            gm, gl, gD           HBM, float32 (b, h, s_q)
    dQ (float32), dK, dV      gdQ, gdK, gdV        HBM (dK, dV half words)
    Q_i, dO_i                 smem[OFF_Q/OFF_DO]   SRAM (Br, DW+4) words; CP_ASYNC: 2 stages (+ uQSTAGE)
    K_j, V_j                  smem[OFF_K/OFF_V]    SRAM (Bc, DW+4) words, loaded once (L6)
    M_i, 1/l_i, D_i           sM, sIL, sD          SRAM (Br,) float32; CP_ASYNC: 2 stages (+ Br)
    S_ij^T, then P_ij^T o Z   rS                   registers: MW x (Br/8) m16n8 float32 fragments per warp
    dP_ij^T, then tau dS^T    rdP                  registers, same layout
    dS_ij^T (half)            smem[OFF_DS]         SRAM (Bc, Br/2+4) words, for L15
    dK_j, dV_j                rdK, rdV             registers: MW x (DP/8) fragments, the warp's key rows
    dQ_i slice                rdQ                  registers: QPW x (DP/(8 DSPLIT)) fragments
    ========================  ===================  ==================================================
    """
    SQ = stride(DP)
    (NT, BC, QST, OFF_Q, OFF_DO, uQSTAGE, OFF_K, OFF_V, END_KV, QPW, DSPLIT, NDW, NS, NKV, NQ, NA, NSR, SXN, SCR, NSTAT,
     NSKEY) = backward_steps.key_block_layout("half backward", NW, MW, BR, DP, SQ, CP_ASYNC, DROPOUT, SIM, dq_split(NW, BR, DP),
                                              ptx.HALF_SIM_SCRATCH_PER_WARP)
    NB = BR // 8  # n8 query tiles of S^T
    NQ16 = BR // 16  # 16-query k steps of P^T dO_i and dS^T Q_i
    NKB = BC // 16  # 16-key k steps of dS K_j
    KD = DP // 16  # 16-wide d steps of K Q^T and V dO^T
    ND = DP // 8  # n8 column tiles of dK, dV
    DW = DP // 2
    SD = BR // 2 + 4  # row stride (words) of dS^T: BR / 2 is a multiple of 8, so 4 mod 8 (conflict-free ldmatrix)
    uSQ, uSD = U(SQ), U(SD)
    OFF_DS = U(END_KV)  # dS^T after K_j, V_j
    ZERO = float32(0.0)
    CAP = float32(64.0)
    exp2 = ptx.make_exp2(EX2_FTZ, SIM)  # EX2_FTZ: one MUFU.EX2 per P element (see default_features)

    NLQ, load_q_do, store_q_do = forward_steps.make_word_pair_loader(BR, DW, NT, SQ)  # Q_i with dO_i
    NLK, load_kv, store_kv = _tiles.make_word_loader(BC, DW, NT, SQ)
    RQ = 1 if CP_ASYNC else NLQ  # register staging of Q_i, dO_i (none with cp.async)
    _, load_q_async = _tiles.make_word_loader_async(BR, DW, NT, SQ, SIM)
    _copy16, cp_commit, cp_wait0 = ptx.make_cp_async(SIM)
    key_block = backward_steps.make_key_block(False)  # Dev: the grid's launch order (the heaviest-first order gained nothing here)
    query_steps = backward_steps.make_query_steps(BR, BC, CAUSAL)
    step_rows, _, load_q_do_l_d_first, load_q_do_l_d = backward_steps.make_q_do_pipeline(
        BR, NT, OFF_Q, OFF_DO, uQSTAGE, CP_ASYNC, PREFETCH, False, DROPOUT, FROM_LSE, load_q_do, store_q_do, load_q_async,
        cp_commit, cp_wait0)
    pack2, mma16, _, ldsm_t = ptx.make_half_ops(KIND, SIM)
    mma16_pairs_kv = make_mma16_pairs(MW, ND, KIND, SIM)  # L12 with L16: dV_j and dK_j side by side
    store_dk_dv = make_row_words_store(ND, KIND, SIM, True)
    mma_pair_products, pack_a = make_fragment_products(MW, NB, KD, SQ, KIND, SIM)
    dq_atomic_add = backward_steps.make_dq_atomic_add(QPW, NW // DSPLIT, NDW, True, ptx.make_atomic_add2(RED2, SIM))

    # [doc:fa2-half-bwd-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, gdK, gdV, tau, c1, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, uint32)  # Q_i, dO_i, K_j, V_j, dS^T in words; offsets OFF_*
        sM = cuda.shared.array(NSTAT, float32)  # M_i: the forward's base-2 row max of each query of the block
        sIL = cuda.shared.array(NSTAT, float32)  # 1/l_i (0 past N_q or for a query that sees no key)
        sD = cuda.shared.array(NSTAT, float32)  # D_i
        sKey = cuda.shared.array(NSKEY, uint64)  # dropout row keys of the Br queries
        sx = cuda.shared.array(SXN, float32)  # the simulator's lane-exchange scratch (unused on a GPU)
        tau = float32(tau)
        c1 = float32(c1)
        dropout_scale = float32(dropout_scale)
        rS = cuda.local.array(NS, float32)  # S^T, then P^T o Z
        rdP = cuda.local.array(NS, float32)  # dP^T, then tau dS^T
        rdK = cuda.local.array(NKV, float32)
        rdV = cuda.local.array(NKV, float32)
        rdQ = cuda.local.array(NQ, float32)
        rA = cuda.local.array(NA, uint32)  # A words: K_j / V_j rows (L10, L13), then P^T, dS^T (L12, L16)
        rB = cuda.local.array(NA, uint32)
        rQn = cuda.local.array(RQ, uint32)  # Q_{i} / Q_{i+1} in flight (register path)
        rdOn = cuda.local.array(RQ, uint32)
        rKn = cuda.local.array(NLK, uint32)
        rMn = cuda.local.array(NSR, float32)  # M, 1/l, D of the next step's queries
        rIn = cuda.local.array(NSR, float32)
        rDn = cuda.local.array(NSR, float32)

        tid, lane, warp, g, t = backward_steps.lane_coords()
        # ldmatrix rows and words: lr, lw of the A operands (K, V rows) and the .trans B operands; kr, kw of the B operands
        # of two n8 tiles (Q, dO rows) and the .trans A of dS
        lr, lw, kr, kw = fa2_forward_half.ldmatrix_lanes(lane)
        wbase = warp * SCR
        nheads = gQ.shape[2]
        nheads_k = gK.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        dw = gQ.shape[3]
        wrow = U(16 * MW) * U(warp)  # this warp's first key row within the block
        # dQ slice of this warp: query tiles qw, qw + NW / DSPLIT, ...; column tiles from dq0
        qw = warp // DSPLIT
        dq0 = (warp % DSPLIT) * NDW
        # FA2.2 L5: for j = 1..Tc -- one thread block per (j, batch, KV head)
        j, b, hk = key_block(gQ.shape[0], nheads_k)  # Dev: b*h_k folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0] or j >= cuda.gridDim.x:
            return  # Dev: past b*h_k in the last z slab of the fold
        ub, uhk = U(b), U(hk)
        col0 = j * BC
        # FA2.2 L6: load K_j, V_j from HBM to SRAM (rows of half words; ragged rows and padded columns zero)
        load_kv(gK, ub, uhk, col0, s_k, dw, tid, rKn)  # HBM read: Bc*d halves
        store_kv(smem, OFF_K, tid, rKn)
        load_kv(gV, ub, uhk, col0, s_k, dw, tid, rKn)  # HBM read: Bc*d halves
        store_kv(smem, OFF_V, tid, rKn)
        # FA2.2 L7: dK_j = (0), dV_j = (0) on chip (registers)
        for a in range(NKV):
            rdK[a] = ZERO
            rdV[a] = ZERO
        # Dev: causal block skipping (query blocks before the first one that sees key col0 are fully masked); GQA: the G
        # query heads of the group and their blocks, one flat loop of n_steps
        i_first, n_i, n_steps = query_steps(col0, causal_offset, s_q, group)
        if n_steps > 0:  # Dev: the first step's L9 (its Q_i, dO_i by cp.async into stage 0, or into the registers)
            load_q_do_l_d_first(smem, gQ, gdO, gm, gl, gD, b, ub, hk * group, i_first * BR, s_q, dw, tid, rQn, rdOn, rMn, rIn, rDn)
        # FA2.2 L8: for i = 1..Tr (times the G query heads of the group)
        for st in range(n_steps):
            # FA2.2 L9: load Q_i, dO_i, L_i (as M_i and 1/l_i), D_i from HBM to SRAM; Dev: copied (CP_ASYNC) or loaded
            # (PREFETCH) one step ahead, into stage st % 2 (qs, so) with CP_ASYNC; step st+1's put on its way
            h, row0, qs, so = load_q_do_l_d(smem, smem, gQ, gdO, gm, gl, gD, sM, sIL, sD, sKey, seed, nheads, b, hk, group, i_first,
                                            n_i, st, n_steps, s_q, dw, tid, c1, rQn, rdOn, rMn, rIn, rDn)

            # [doc:fa2-half-bwd-inner-loop]
            # FA2.2 L10: S_ij^T = K_j Q_i^T; FA2.2 L13: dP_ij^T = V_j dO_i^T -- per 16-wide d step,
            # A = this warp's K_j (V_j) rows by ldmatrix, B = two n8 query tiles of Q_i (dO_i) rows by ldmatrix
            mma_pair_products(smem, OFF_K, OFF_V, OFF_Q + qs, OFF_DO + qs, wrow, lr, lw, kr, kw, rA, rB, rS, rdP, sx, wbase, lane)
            # FA2.2 L11: P_ij = exp(S_ij - L_i) as exp2(S tau log2 e - M_i) / l_i, masked (a column of P^T is a query);
            # FROM_LSE: M_i = L_i log2 e and no 1/l_i, one FFMA and one MUFU.EX2 per element
            # FA2.2 L14: dS_ij = P_ij o (dP_ij - D_i), times tau (Dev: dropout: P o Z for L12, dP o Z in L14)
            masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
            for mt in range(MW):
                for nt in range(NB):
                    for c in range(4):
                        f = (mt * NB + nt) * 4 + c
                        key = col0 + int(wrow) + 16 * mt + 8 * (c // 2) + int(g)
                        qi = so + U(8 * nt + c % 2) + U(2) * t  # (CP_ASYNC: in this step's statistics stage)
                        # Dev: min(., 64): no overflow on masked entries (exp2 overflow, then inf * 0 = NaN); a NaN kept
                        if FROM_LSE:  # Dev: no 1/l (0 for a row past N_q or that sees no key): such a row's P
                            # meets zero dO_i and dP - D_i rows past N_q, and the causal mask below for a row without keys
                            p = exp2(_regtile.min_keep_nan(cuda.fma(rS[f], c1, -sM[qi]), CAP))
                        else:
                            p = exp2(_regtile.min_keep_nan(rS[f] * c1 - sM[qi], CAP)) * sIL[qi]
                        if masked:
                            if key >= s_k or (CAUSAL and key > row0 + int(qi - so) + causal_offset):
                                p = ZERO
                        dp = rdP[f]
                        pz = p
                        if DROPOUT:
                            z = dropout_scale if keep(sKey[qi], key, threshold) else ZERO
                            pz = p * z
                            dp = dp * z
                        rS[f] = pz
                        rdP[f] = tau * (p * (dp - sD[qi]))
            # FA2.2 L12: dV_j += (P_ij o Z_ij)^T dO_i -- A = P^T from registers (two n8 query tiles = one 16-query step),
            # B = dO_i rows by ldmatrix.trans (two queries of one column per word)
            # FA2.2 L16: dK_j += tau dS_ij^T Q_i -- the same with dS^T, rounded to half, and Q_i; dS^T also to SRAM for L15
            for kt in range(NQ16):
                for mt in range(MW):
                    f0 = (mt * NB + 2 * kt) * 4
                    rA[mt * 4], rA[mt * 4 + 1], rA[mt * 4 + 2], rA[mt * 4 + 3] = pack_a(rS, f0)
                    rB[mt * 4], rB[mt * 4 + 1], rB[mt * 4 + 2], rB[mt * 4 + 3] = pack_a(rdP, f0)
                    da = OFF_DS + (wrow + U(16 * mt) + g) * uSD + U(8 * kt) + t  # dS^T[key g, queries 16 kt + 2t, + 1]
                    smem[da] = rB[mt * 4]
                    smem[da + U(8) * uSD] = rB[mt * 4 + 1]
                    smem[da + U(4)] = rB[mt * 4 + 2]
                    smem[da + U(8) * uSD + U(4)] = rB[mt * 4 + 3]
                for dp2 in range(ND // 2):
                    ra = (U(16 * kt) + lr) * uSQ + U(8 * dp2) + lw
                    ob0, ob1, ob2, ob3 = ldsm_t(smem, OFF_DO + qs + ra, sx, wbase, lane)
                    qb0, qb1, qb2, qb3 = ldsm_t(smem, OFF_Q + qs + ra, sx, wbase, lane)
                    mma16_pairs_kv(rA, rB, rdV, rdK, dp2, ob0, ob1, ob2, ob3, qb0, qb1, qb2, qb3, sx, wbase, lane)
            if ATOMIC_DQ:
                cuda.syncthreads()  # Sync: every warp's dS^T in SRAM before L15 reads it
                # FA2.2 L15: dQ_i += tau dS_ij K_j -- A = dS (16 queries x 16 keys) by ldmatrix.trans of dS^T,
                # B = K_j rows by ldmatrix.trans; this warp's slice, then one float32 atomic add per element
                for a in range(NQ):
                    rdQ[a] = ZERO
                for kb in range(NKB):
                    for qq in range(QPW):
                        qt = qw + (NW // DSPLIT) * qq
                        a0, a1, a2, a3 = ldsm_t(smem, OFF_DS + (U(16 * kb) + kr) * uSD + U(8 * qt) + kw, sx, wbase, lane)
                        for dp2 in range(NDW // 2):
                            kb0, kb1, kb2, kb3 = ldsm_t(smem, OFF_K + (U(16 * kb) + lr) * uSQ + U(8 * (dq0 // 2 + dp2)) + lw, sx, wbase, lane)
                            for h2 in range(2):
                                f = (qq * NDW + 2 * dp2 + h2) * 4
                                bb = (kb0, kb1) if h2 == 0 else (kb2, kb3)
                                acc = mma16((a0, a1, a2, a3), bb, (rdQ[f], rdQ[f + 1], rdQ[f + 2], rdQ[f + 3]), sx, wbase, lane)
                                for c in range(4):
                                    rdQ[f + c] = acc[c]
                dq_atomic_add(gdQ, rdQ, b, h, row0, qw, dq0, s_q, 2 * dw, g, t)  # HBM read+write: Br*d
            # [/doc:fa2-half-bwd-inner-loop]

        # FA2.2 L17-L18: write dK_j, dV_j to HBM, rounded to half (lane (g, t): word 4 dn + t of key rows g, g + 8)
        for mt in range(MW):
            for hf in range(2):
                key = col0 + int(wrow) + 16 * mt + 8 * hf + int(g)
                if key < s_k:
                    store_dk_dv(gdK, rdK, gdV, rdV, ub, key, uhk, dw, mt * ND * 4 + 2 * hf, t)  # HBM write: 2 Bc*d halves

    # [/doc:fa2-half-bwd-kernel]
    return kernel


@functools.cache
def fa2_backward_half_dq_kernel(NW: int, MW: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, PREFETCH: bool,
                                SIM: bool, KIND: str, FROM_LSE: bool = False, EX2_FTZ: bool = False):
    """The deterministic dQ kernel: one block per (query block, batch, head), ``dQ_i`` in registers.

    Lines 10-15 with the loops swapped (query block outer, key blocks inner) and the half forward's
    geometry (:func:`numba_flash.tensorcore.fa2_forward_half.config_for` of the register path: ``NW`` warps of ``16 MW`` query rows,
    ``Bc`` keys per step): ``S = Q_i K_j^T`` and ``dP = dO_i V_j^T`` as the forward's ``S``, the statistics
    of a lane's rows in registers, and ``dS`` (rounded to half in pairs) the A operand of ``dS K_j`` straight
    from the accumulators, as ``P~`` is the A operand of ``P~ V_j`` in the forward. Each ``dQ`` element is one
    lane's sum in a fixed order: no atomics, bitwise reproducible; written once as half words.
    Arguments as :func:`fa2_backward_half_kernel`, with ``gdQ (b, s_q, h, d/2)`` words.
    """
    NT = 32 * NW
    BR = 16 * MW * NW
    NB = BC // 8
    NK = BC // 16
    KD = DP // 16
    ND = DP // 8
    DW = DP // 2
    SQ = stride(DP)
    uSQ = U(SQ)
    OFF_Q = U(0)
    OFF_DO = U(BR * SQ)
    OFF_K = U(2 * BR * SQ)
    OFF_V = U(2 * BR * SQ + BC * SQ)
    NS = MW * NB * 4
    NO = MW * ND * 4
    NR = MW * 2
    NA = MW * 4
    SXN = NW * ptx.HALF_SIM_SCRATCH_PER_WARP if SIM else 1
    SCR = ptx.HALF_SIM_SCRATCH_PER_WARP
    ZERO = float32(0.0)
    CAP = float32(64.0)
    exp2 = ptx.make_exp2(EX2_FTZ, SIM)  # EX2_FTZ: one MUFU.EX2 per P element (see default_features)

    NLQ, load_q, store_q = _tiles.make_word_loader(BR, DW, NT, SQ)
    NLK, load_kv, store_kv = _tiles.make_word_loader(BC, DW, NT, SQ)
    n_key_blocks, _ = _tiles.make_block_counts(BR, BC, CAUSAL)
    pack2, mma16, _, ldsm_t = ptx.make_half_ops(KIND, SIM)
    mma16_add = make_mma16_add(KIND, SIM)
    mma_pair_products, pack_a = make_fragment_products(MW, NB, KD, SQ, KIND, SIM)
    row_stats = _regtile.make_row_stats(FROM_LSE)
    store_dq = make_row_words_store(ND, KIND, SIM, False)

    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, tau, c1, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, uint32)  # Q_i, dO_i, K_j, V_j in words; offsets OFF_*
        sx = cuda.shared.array(SXN, float32)  # the simulator's lane-exchange scratch (unused on a GPU)
        tau = float32(tau)
        c1 = float32(c1)
        dropout_scale = float32(dropout_scale)
        rS = cuda.local.array(NS, float32)  # S_ij, then P_ij
        rdP = cuda.local.array(NS, float32)  # dP_ij, then tau dS_ij
        rdQ = cuda.local.array(NO, float32)
        rA = cuda.local.array(NA, uint32)
        rB = cuda.local.array(NA, uint32)
        rM = cuda.local.array(NR, float32)
        rIL = cuda.local.array(NR, float32)
        rD = cuda.local.array(NR, float32)
        rkey = cuda.local.array(NR, uint64)
        rQn = cuda.local.array(NLQ, uint32)
        rKn = cuda.local.array(NLK, uint32)
        rVn = cuda.local.array(NLK, uint32)

        tid, lane, warp, g, t = backward_steps.lane_coords()
        lr, lw, kr, kw = fa2_forward_half.ldmatrix_lanes(lane)  # the forward's ldmatrix rows and words
        wbase = warp * SCR
        nheads = gQ.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        dw = gQ.shape[3]
        b, h, past = backward_steps.query_block_head(gQ.shape[0], nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if past:
            return  # Dev: past b*h in the last z slab of the fold
        ub, uh, uhk = U(b), U(h), U(h // group)
        i = cuda.gridDim.x - 1 - cuda.blockIdx.x  # Dev: the heaviest (causal) blocks first
        row0 = i * BR
        wrow = U(16 * MW) * U(warp)
        load_q(gQ, ub, uh, row0, s_q, dw, tid, rQn)  # HBM read: Br*d halves
        store_q(smem, OFF_Q, tid, rQn)
        load_q(gdO, ub, uh, row0, s_q, dw, tid, rQn)  # HBM read: Br*d halves
        store_q(smem, OFF_DO, tid, rQn)
        for r in range(NR):  # this lane's rows: m16 tile r // 2, row g (+ 8 for odd r)
            row = row0 + int(wrow) + 16 * (r // 2) + 8 * (r % 2) + int(g)
            rM[r], rIL[r] = row_stats(gm, gl, b, h, row, s_q)
            rD[r] = gD[b, h, row] if row < s_q else ZERO
            rkey[r] = uint64(0)
            if DROPOUT:
                rkey[r] = row_key(head_key(seed, b * nheads + h), row)
        for a in range(NO):
            rdQ[a] = ZERO
        n_blocks = n_key_blocks(row0 + BR, s_k, causal_offset)
        if n_blocks > 0:
            load_kv(gK, ub, uhk, 0, s_k, dw, tid, rKn)
            load_kv(gV, ub, uhk, 0, s_k, dw, tid, rVn)
        for j in range(n_blocks):
            col0 = j * BC
            cuda.syncthreads()  # Sync: K_{j-1}, V_{j-1} read by all (and Q_i, dO_i stored) before the stores
            if not PREFETCH and j > 0:
                load_kv(gK, ub, uhk, col0, s_k, dw, tid, rKn)  # HBM read: Bc*d halves
                load_kv(gV, ub, uhk, col0, s_k, dw, tid, rVn)
            store_kv(smem, OFF_K, tid, rKn)
            store_kv(smem, OFF_V, tid, rVn)
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before they are read
            if PREFETCH and j + 1 < n_blocks:
                load_kv(gK, ub, uhk, col0 + BC, s_k, dw, tid, rKn)  # HBM read: Bc*d halves (tile j+1)
                load_kv(gV, ub, uhk, col0 + BC, s_k, dw, tid, rVn)
            # FA2.2 L10: S_ij = Q_i K_j^T; FA2.2 L13: dP_ij = dO_i V_j^T (the forward's S, with dO, V as the second pair)
            mma_pair_products(smem, OFF_Q, OFF_DO, OFF_K, OFF_V, wrow, lr, lw, kr, kw, rA, rB, rS, rdP, sx, wbase, lane)
            # FA2.2 L11: P_ij = exp(S_ij - L_i) as exp2(S tau log2 e - M_i) / l_i, masked
            # FA2.2 L14: tau dS_ij = tau P_ij o (dP_ij o Z_ij - D_i)
            masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
            for mt in range(MW):
                for nt in range(NB):
                    for c in range(4):
                        f = (mt * NB + nt) * 4 + c
                        r = mt * 2 + c // 2
                        row = row0 + int(wrow) + 16 * mt + 8 * (c // 2) + int(g)
                        col = col0 + 8 * nt + 2 * int(t) + c % 2
                        p = exp2(_regtile.min_keep_nan(rS[f] * c1 - rM[r], CAP)) * rIL[r]
                        if masked:
                            if col >= s_k or (CAUSAL and col > row + causal_offset):
                                p = ZERO
                        dp = rdP[f]
                        if DROPOUT:
                            dp = dp * (dropout_scale if keep(rkey[r], col, threshold) else ZERO)
                        rdP[f] = tau * (p * (dp - rD[r]))
            # FA2.2 L15: dQ_i += tau dS_ij K_j -- A = dS from registers (two n8 key tiles = one 16-key step), B = K_j by
            # ldmatrix.trans; Dev: deterministic: each lane sums its dQ fragments over j in a fixed order
            for kt in range(NK):
                for mt in range(MW):
                    rA[mt * 4], rA[mt * 4 + 1], rA[mt * 4 + 2], rA[mt * 4 + 3] = pack_a(rdP, (mt * NB + 2 * kt) * 4)
                for dp2 in range(ND // 2):
                    kb0, kb1, kb2, kb3 = ldsm_t(smem, OFF_K + (U(16 * kt) + lr) * uSQ + U(8 * dp2) + lw, sx, wbase, lane)
                    for h2 in range(2):
                        dn = 2 * dp2 + h2
                        bb = (kb0, kb1) if h2 == 0 else (kb2, kb3)
                        for mt in range(MW):
                            f = (mt * ND + dn) * 4
                            mma16_add(rA, mt, bb, rdQ, f, sx, wbase, lane)
        for r in range(NR):
            mt, hf = r // 2, r % 2
            row = row0 + int(wrow) + 16 * mt + 8 * hf + int(g)
            if row < s_q:
                store_dq(gdQ, rdQ, gdQ, rdQ, ub, row, uh, dw, mt * ND * 4 + 2 * hf, t)  # HBM write: Br*d halves

    return kernel


def default_features() -> dict:
    """``PREFETCH``: load the next step's Q_i, dO_i (main kernel) or K_j, V_j (dQ kernel) into registers
    during the compute of this one. ``RED2``: add the dQ fragments with ``red.global.add.v2.f32`` (two
    columns per instruction). None: on compute capability 9.0+ (``red`` of two floats is sm_90's). Until the
    performance log's section "Half backward: RED2 for causal d = 128 again" it was off for causal at d > 64, where, measured before ``LSE_P``, the vector form's extra registers
    made ptxas spill 144 B instead of 80 B and the kernel 17-21 % slower
    (``docs/results/sweeps/half_bwd_sweep_h100_v2_red2.json``; elsewhere 1-8 % faster); with ``LSE_P`` the causal d = 128 kernel spills 12 B with it and 24/44 B without, and
    its main loop is 1404 SASS instructions against 1894 (offline, CUDA 13.5's ptxas; that section). ``CP_ASYNC``: the main
    kernel's Q_i, dO_i by ``cp.async`` into two SRAM stages where the head dim allows it
    (:func:`numba_flash.tensorcore.fa2_forward_half.cp_async_ok`) and Q, dO are 16-byte aligned: on an H100 forward +
    backward is 17-23 % faster at d = 64 and 3-25 % at d = 128 with the RED2 policy above
    (``docs/results/sweeps/half_bwd_cp_h100.json``; the performance log has prediction and outcome).
    ``EX2_FTZ``: the recomputed ``P = 2^(S' - M) / l`` by ``ex2.approx.ftz.f32`` in both kernels, as the half
    forward's ``EX2_FTZ`` (:func:`numba_flash.tensorcore.ptx.make_exp2`); on with the forward's (on an H100 forward +
    backward ran 1.01-1.05x faster with it at N = 4k, one pair, inside the run-to-run spread). ``LSE_P``: recompute
    ``P = 2^(S' - L log2 e)`` from the logsumexp alone (the kernels' ``FROM_LSE`` path, as flash-attn does) even where
    the forward's ``m, l`` are given: in the main kernel one FFMA and one MUFU.EX2 per element instead of a multiply,
    a subtraction, the exponential and a multiply by ``1/l`` (an H100's Nsight Compute put the d = 128 backward's
    ALU pipe busiest, at one block per SM: ``docs/results/sweeps/ncu_half_bwd_d128_h100_1be382f.txt``). On: on an
    H100 forward + backward ran 1.04-1.08x faster at d = 128 without causal and 1.02-1.06x at d = 64, N 1k-4k, two
    alternating pairs; the causal d = 128 cells 1.00-1.06x (``docs/results/sweeps/lse_p_h100_d645902_*``; the
    performance log's section "Half backward: P from the logsumexp")."""
    return {"PREFETCH": True, "RED2": None, "CP_ASYNC": True, "EX2_FTZ": True, "LSE_P": True}


def plan(prob: Problem, block_sizes=None, config=None, features=None, deterministic=False, from_lse=False):
    """(main kernel, main grid, dQ kernel or None, dQ grid, threads, SRAM bytes of each), without launching."""
    if not handles(prob):
        raise ValueError(f"the half-precision backward runs float16/bfloat16 inputs with an even head dim <= "
                         f"{fa2_forward_half.HALF_MAX_HEADDIM}; got {prob.dtype} and headdim {prob.headdim}")
    d = prob.headdim
    NW, MW, BR, DP = config if config is not None else config_for(d, block_sizes)
    feats = _plan.checked_features(default_features(), features)
    sim = _backend.is_simulator()
    kind = ptx.HALF_KINDS[prob.dtype]
    BC = 16 * MW * NW
    cp_async = bool(feats["CP_ASYNC"]) and fa2_forward_half.cp_async_ok(d)  # Dev: d % 8 != 0: the register path
    nbytes = 4 * smem_words(NW, MW, BR, DP, 2 if cp_async else 1)
    _plan.check_sram(nbytes, BR, BC, d)
    dropout = prob.dropout_p > 0
    from_lse = from_lse or bool(feats["LSE_P"])  # Dev: the caller passes L as both m and l then (backward)
    red2 = feats["RED2"]
    if red2 is None:
        red2 = not sim and _backend.device_facts().compute_capability >= (9, 0)
    main = fa2_backward_half_kernel(NW, MW, BR, DP, prob.causal, dropout, not deterministic, bool(feats["PREFETCH"]), sim, kind,
                                    bool(from_lse), bool(red2), cp_async, bool(feats["EX2_FTZ"]))
    grid = bh_grid(ceil_div(prob.seqlen_k, BC), prob.batch * prob.nheads_k)
    dq = None
    NWq, MWq, BCq, _ = fa2_forward_half.config_for(d, block_sizes, cp_async=False)  # the dQ kernel loads through registers
    BRq = 16 * MWq * NWq
    nbytes_dq = 4 * (2 * BRq + 2 * BCq) * stride(DP)
    if deterministic:
        _plan.check_sram(nbytes_dq, BRq, BCq, d)
        dq = fa2_backward_half_dq_kernel(NWq, MWq, BCq, DP, prob.causal, dropout, bool(feats["PREFETCH"]), sim, kind, bool(from_lse),
                                         bool(feats["EX2_FTZ"]))
    return main, grid, dq, bh_grid(ceil_div(prob.seqlen_q, BRq), prob.batch * prob.nheads), (32 * NW, 32 * NWq), (nbytes, nbytes_dq)


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the main kernel's tiles: :func:`config_for` rounds an override to the tiling."""
    NW, MW, BR, _ = config_for(prob.headdim, block_sizes)
    return BR, 16 * MW * NW


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block of the main kernel, in bytes."""
    return plan(prob, block_sizes)[5][0]


def compiled_kernels(prob: Problem, block_sizes=None, deterministic=False) -> list[KernelLaunch]:
    """The main kernel (and the deterministic dQ kernel), compiled for ``prob`` (not launched)."""
    main, grid, dqk, grid_dq, (nt, nt_dq), _ = plan(prob, block_sizes, deterministic=deterministic)
    BR, BC = choose_block_sizes(prob, block_sizes)
    out = [KernelLaunch(f"FA2 backward tensor cores {prob.dtype} (Br, Bc) = ({BR}, {BC})", main, nt, math.prod(grid))]
    if deterministic:
        out.append(KernelLaunch(f"FA2 backward tensor cores {prob.dtype} dQ", dqk, nt_dq, math.prod(grid_dq)))
    return out


def backward(dout, q, k, v, out, fwd, prob: Problem, alloc, block_sizes=None, deterministic=False, config=None, features=None):
    """FA2 Algorithm 2 on half words: ``(dq, dk, dv)``; dk, dv half words (summed over each GQA group), dq
    float32 (atomic adds) or, with ``deterministic``, half words from :func:`fa2_backward_half_dq_kernel`."""
    features = _plan.register_path_if_unaligned(features, default_features(), q, dout)  # Dev: cp.async of Q, dO rows
    lse_p = {**default_features(), **(features or {})}["LSE_P"]
    from_lse = fwd.m is None or fwd.l is None or bool(lse_p)
    kernels = plan(prob, block_sizes, config, features, deterministic, from_lse)
    # FA2.2 L20: return dQ, dK, dV -- after line 4's D, line 3's gradients and the launches (device.backward_launch)
    return launch_fa2_backward(kernels, row_dot_words, _allocate_grads, dout, q, k, v, out, fwd, prob, alloc, deterministic, from_lse)
