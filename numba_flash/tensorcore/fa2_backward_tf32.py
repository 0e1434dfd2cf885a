"""FlashAttention-2 Algorithm 2 on the tensor cores, in float32 accuracy (3xTF32 ``mma.sync.m16n8k8``).

Paper: Dao, "FlashAttention-2", Algorithm 2 ([FA2-ICLR] Appendix A). Same algorithm, semantics, paper tags
and launch grid as :mod:`numba_flash.fa2_backward` (readable) and :mod:`numba_flash.fast.fa2_backward`
(float32 FFMA); read those first, then the 3xTF32 forward :mod:`numba_flash.tensorcore.fa2_forward_tf32` (the
split ``x ~ big + small`` and why each product is three ``mma``) and the half backward
:mod:`numba_flash.tensorcore.fa2_backward_half` (whose warp layout this kernel shares). It runs the backward of
float32 inputs for ``variant="tensorcore"`` (routed here by :mod:`numba_flash.registry`), the twin of the
3xTF32 forward.

What changes from the FFMA kernel
---------------------------------
* **All five products on the tensor cores, three ``mma`` each.** Every operand is split into two tf32
  parts and ``a b ~ a_big b_big + a_big b_small + a_small b_big`` (the forward's docstring); each 8-wide k
  step runs into a zeroed accumulator that is then added with an IEEE float32 add (the forward's
  "staging": the tensor cores' float32 accumulation is not rounded like an FFMA, and ``dK_j, dV_j`` take
  ``3 N / 8`` such accumulations).
* **Each warp owns 16 key rows** (``MW`` m16 tiles), as in the half backward, so ``dK_j, dV_j`` are sums over
  queries of the warp's own rows and stay in its registers for the whole kernel.
* **The forward's S.** The warp computes ``S_ij = Q_i K_j^T`` and ``dP_ij = dO_i V_j^T`` for all ``Br``
  queries and its keys with the forward's operands in the forward's roles (A = ``Q_i tau log2 e`` rows,
  B = ``K_j`` rows), the same split, the same order of the three ``mma`` and the same staging, so ``S`` is
  the 3xTF32 forward's and ``P = exp2(S' - M) / l`` is the forward's ``P``. An FFMA backward recomputes
  ``S`` with FFMAs, 4-12 float32 roundings away from the 3xTF32 forward's, and sharp softmaxes magnify that
  past the error rule; with this pair the simulator's sharp-softmax and large-logit cases pass, and on an
  H100 so does the sharp-softmax case against the in-order float32 baseline (``tests/attn_testing.matmul32``; it
  missed by 1.55x on dV against the BLAS one: the performance log's section "Float32 training default: the
  tensor-core pair"). ``variant="auto"`` trains float32 with this pair.
* **P and dS through SRAM, read back by renaming the queries.** ``P o Z`` and ``tau dS`` go to SRAM
  (``Br x (Bc + 4)``, row = query); each warp reads back only its own key columns (``syncwarp``). The A operand
  of ``dV_j += P^T dO_i`` (keys x 8 queries) is read with the k index renamed: the order of a summed index is
  ours to choose, so k position ``t`` is query ``2t`` and ``t + 4`` is query ``2t + 1``, and the B operand reads
  ``dO_i`` rows ``2t, 2t + 1``. With row strides of 4 mod 16 floats lane ``(g, t)`` then hits bank ``8t + g``:
  no conflicts. (Reading ``P^T`` straight from the accumulators needs a loop nest NVVM would not unroll: the
  performance log has the 256-byte local array it made.)
* **dQ from the same SRAM tile.** After a barrier each warp multiplies a slice of ``tau dS`` (all the block's
  keys) by ``K_j`` (the keys of a k step renamed the same way, so ``K_j`` rows ``2t, 2t + 1`` are read) and adds
  the slice to a float32 ``dQ`` with atomics (``red.global.add.v2.f32`` on sm_90 at even ``d``:
  :func:`numba_flash.tensorcore.ptx.make_atomic_add2`).
* **After a ``WIDE`` forward** (the default above d = 64) ``S`` is summed in that forward's order
  (:func:`make_score_products_wide`: pairs of k steps from 16-byte loads), on ``Q_i, dO_i, K_j, V_j`` stored
  unpadded and swizzled (:func:`numba_flash.fast._tiles.swizzle16t`, which keeps the column reads of the dV, dK, dQ
  products in 32 banks too); the unpadded rows let ``Q_i, dO_i`` arrive by ``cp.async`` at d = 128 as well.
* ``deterministic=True``: :func:`fa2_backward_tf32_dq_kernel`, the forward's geometry (warps own query
  rows; ``S`` computed as the forward computes it), ``dS`` through the warp's own SRAM rows into the A
  operand of ``dS K_j``, ``dQ_i`` summed in a fixed order; ``dK, dV`` bitwise equal across the modes.

Accuracy: every gradient within 3x the error of float32 naive attention's autograd, both against float64
(``tests/kernels``, ``tests/test_edge_values.py``), after the 3xTF32 forward.

Launch geometry
---------------
pre-pass ``D = rowsum(dO o O)``: :func:`numba_flash.fast._prepass.row_dot`. Main kernel: grid
``(Tc, batch * nheads_k)``, block ``32 NW`` threads, ``Bc = 16 MW NW`` keys; the block loops over the ``G``
query heads of its KV head and the visible query blocks of ``Br`` rows (one flat loop, as the FFMA kernel).
SRAM (float32, one dynamic array): ``Q_i, dO_i`` Br (DP+4) each (two stages with ``CP_ASYNC``), ``K_j, V_j`` Bc
(DP+4) each, ``P_ij o Z_ij`` and ``tau dS_ij`` Br (Bc+4) each (:func:`smem_floats`), ``DP`` = d rounded up to 8 (rows of
DP floats with ``WIDE``); plus ``M_i, 1/l_i, D_i`` (float32, static) and the simulator's exchange scratch.

GPU: compute capability 8.0 or newer. The simulator runs the same source with the Python twins of
:func:`numba_flash.tensorcore.ptx.make_warp_ops`.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint32, uint64

from .._launch import KernelLaunch, Problem, bh_grid, ceil_div
from ..device.backward_launch import launch_fa2_backward
from ..device.constants import U
from ..device.dropout import head_key, keep, row_key
from ..device.prepass import allocate_grads
from ..fast import _plan, _regtile, _tiles
from ..fast import _prepass as _prepass_kernel
from ..runtime import backend as _backend
from ..runtime import smem as _smem
from . import backward_steps, fa2_forward_tf32, ptx
from .ptx import available  # noqa: F401  (the kernel contract's optional available())

#: :func:`backward` puts nothing on the GPU but the allocator's outputs and launches through ``_smem.launch`` (the
#: pre-pass, the main kernel, the deterministic dQ kernel): an eager call's backward may be replayed
#: (:mod:`numba_flash.runtime.replay`)
REPLAYABLE = True

#: Largest head dim of this kernel: the 3xTF32 forward's (:data:`numba_flash.tensorcore.fa2_forward_tf32.TC_MAX_HEADDIM`).
TF32_MAX_HEADDIM = fa2_forward_tf32.TC_MAX_HEADDIM


def handles(prob: Problem) -> bool:
    """Whether this kernel runs ``prob``: a head dim up to 128, on float32 kernel arrays (the registry routes the float16
    / bfloat16 problems the half kernel takes there first)."""
    return prob.headdim <= TF32_MAX_HEADDIM


@functools.cache
def config_for(d: int, block_sizes=None, causal: bool = False):
    """The tiling ``(NW, MW, BR, DP)``: warps, key m16 tiles per warp (``Bc = 16 MW NW``), query rows per step, d padded to 8.

    Defaults (the H100 sweeps ``docs/results/sweeps/tf32_bwd_sweep_h100_v1.json``, ``_v2.json``,
    docs/notes/performance-log.md): at ``d <= 64`` 8 warps of 16 keys (``Bc = 128``) with ``Br = 64``
    (1.07-1.24x the FFMA backward), but 4 warps with ``Br = 32`` when ``causal`` (the causal build of the
    first spills 272 bytes and is 3-8 % slower); above, 8 warps with ``Br = 32`` (1.02-1.27x). Where
    :func:`dq_split` cannot split that dQ tile (d = 24: 3 column tiles), the first of 4 warps x ``Br = 32``,
    4 x 64, 1 x 16 that it can. ``block_sizes=(Br, Bc)`` is rounded up to multiples of 16; ``Bc / 16`` m16
    tiles go to as many warps (up to 8) as the dQ split allows, the rest to ``MW``.
    """
    DP = _plan.padded_headdim(d)
    if block_sizes is None:
        first = (8, 32) if DP > 64 else (4, 32) if causal else (8, 64)
        for NW, BR in (first, (4, 32), (4, 64), (1, 16)):
            if dq_split(NW, BR, DP) is not None:
                return NW, 1, BR, DP
    BR, BC = (16 * ((int(n) + 15) // 16) for n in block_sizes)
    m16 = BC // 16
    NW = max(w for w in (1, 2, 4, 8) if m16 % w == 0 and dq_split(w, BR, DP) is not None)
    return NW, m16 // NW, BR, DP


def dq_split(NW: int, BR: int, DP: int):
    """How ``dQ_i += dS K_j`` (``BR x DP``) is split over ``NW`` warps: ``(QPW, DSPLIT)`` or None.

    ``QT = BR / 16`` query m16 tiles, ``ND = DP / 8`` n8 column tiles. With ``QT >= NW`` a warp takes
    ``QPW = QT / NW`` query tiles and every column (``DSPLIT = 1``); otherwise ``DSPLIT = NW / QT`` warps
    share a query tile, ``ND / DSPLIT`` column tiles each.
    """
    QT, ND = BR // 16, DP // 8
    if QT >= NW:
        return (QT // NW, 1) if QT % NW == 0 else None
    return (1, NW // QT) if NW % QT == 0 and ND % (NW // QT) == 0 else None


def smem_floats(NW: int, MW: int, BR: int, DP: int, stages: int = 1, wide: bool = False) -> int:
    """Dynamic SRAM of the main kernel in float32 elements: ``stages`` copies of Q_i, dO_i (2 with ``CP_ASYNC``),
    K_j, V_j, P_ij o Z_ij and tau dS_ij (module docstring); ``wide``: rows of Q_i ... V_j unpadded (``WIDE``)."""
    BC = 16 * MW * NW
    return (2 * stages * BR + 2 * BC) * (DP if wide else DP + 4) + 2 * BR * (BC + 4)


def smem_floats_dq(NW: int, MW: int, BC: int, DP: int, wide: bool = False) -> int:
    """Dynamic SRAM of the deterministic dQ kernel in float32 elements: Q_i, dO_i, K_j, V_j and tau dS_ij."""
    BR = 16 * MW * NW
    return (2 * BR + 2 * BC) * (DP if wide else DP + 4) + BR * (BC + 4)


def dq_config(d: int):
    """The tiling ``(NW, MW, BC, DP)`` of the deterministic dQ kernel: 4 warps of 16 query rows, 64 keys per step.

    Its ``S`` is the forward's whatever the tiling (the same k loop per element), so it need not take the
    forward's ``MW = 2``: one m16 tile per warp keeps ``S, dP, dQ_i`` in registers at d = 128."""
    return 4, 1, 64, _plan.padded_headdim(d)


def _allocate_grads(prob: Problem, alloc, deterministic: bool):
    # FA2.2 L3: dQ = (0) in HBM (the atomic adds need zeros; the deterministic kernel writes every row); dK, dV: Tc blocks
    return allocate_grads(prob, alloc, deterministic)  # numba_flash.device.prepass, shared with the other float32 FA2 backwards


def _prepass(out, dout, prob: Problem, alloc):
    # FA2.2 L4: D_i = rowsum(dO_i o O_i), a separate pre-pass (numba_flash.fast._prepass: a warp per row)
    return _prepass_kernel.row_dot(out, dout, prob, alloc)


@functools.cache
def make_score_products(QT: int, NKN: int, KD: int, SQ: int, SIM: bool):
    """``mma_score_products(smem, OFF_Q, OFF_DO, OFF_K, OFF_V, wrow, g, t, c1, rKb, rKs, rVb, rVs, rS, rdP, sx, wbase, lane)``.

    ``rS = S = (Q_i tau log2 e) K_j^T`` and ``rdP = dP = dO_i V_j^T`` for the ``16 QT`` query rows of the tiles and
    the warp's ``8 NKN`` key rows at ``wrow`` (row stride ``SQ``), over ``8 KD`` columns, as ``QT x NKN`` m16n8
    fragments (fragment ``(qt, kn)`` is ``rS[(qt NKN + kn) 4 + c]``; lane ``(g, t)``: queries ``16 qt + g (+ 8)``,
    keys ``8 kn + 2t (+ 1)``). The forward's products exactly: A = ``Q_i tau log2 e`` rows, B = ``K_j`` rows,
    3xTF32 in the forward's order, each k step staged, so ``S`` is the 3xTF32 forward's ``S`` bit for bit.
    ``rKb, rKs, rVb, rVs`` (``2 NKN`` words each): the B fragments of one k step.
    """
    split, mma3, _, _ = ptx.make_warp_ops(SIM)
    split_nan = ptx.make_split_keep_nan(SIM)  # Dev: Q_i tau log2 e's NaN is 0x7fffffff, which split would make -0.0
    uSQ = U(SQ)
    NS = QT * NKN * 4
    ZERO = float32(0.0)
    Z4 = (ZERO, ZERO, ZERO, ZERO)

    @cuda.jit(device=True, inline="always")
    def mma_score_products(smem, OFF_Q, OFF_DO, OFF_K, OFF_V, wrow, g, t, c1, rKb, rKs, rVb, rVs, rS, rdP, sx, wbase, lane):
        for a in range(NS):
            rS[a] = ZERO
            rdP[a] = ZERO
        for ks in range(KD):
            for kn in range(NKN):  # b = (K[g, t], K[g, t+4]) of the warp's key tile kn (V the same)
                ka = (wrow + U(8 * kn) + g) * uSQ + U(8 * ks) + t
                rKb[2 * kn], rKs[2 * kn] = split(smem[OFF_K + ka])
                rKb[2 * kn + 1], rKs[2 * kn + 1] = split(smem[OFF_K + ka + U(4)])
                rVb[2 * kn], rVs[2 * kn] = split(smem[OFF_V + ka])
                rVb[2 * kn + 1], rVs[2 * kn + 1] = split(smem[OFF_V + ka + U(4)])
            for qt in range(QT):  # a = (Q'[g, t], Q'[g+8, t], Q'[g, t+4], Q'[g+8, t+4]), Q' = Q tau log2 e (the forward's)
                qa = (U(16 * qt) + g) * uSQ + U(8 * ks) + t
                qb0, qs0 = split_nan(smem[OFF_Q + qa] * c1)
                qb1, qs1 = split_nan(smem[OFF_Q + qa + U(8) * uSQ] * c1)
                qb2, qs2 = split_nan(smem[OFF_Q + qa + U(4)] * c1)
                qb3, qs3 = split_nan(smem[OFF_Q + qa + U(8) * uSQ + U(4)] * c1)
                ob0, os0 = split(smem[OFF_DO + qa])
                ob1, os1 = split(smem[OFF_DO + qa + U(8) * uSQ])
                ob2, os2 = split(smem[OFF_DO + qa + U(4)])
                ob3, os3 = split(smem[OFF_DO + qa + U(8) * uSQ + U(4)])
                for kn in range(NKN):
                    f = (qt * NKN + kn) * 4
                    acc = mma3((qb0, qb1, qb2, qb3), (qs0, qs1, qs2, qs3), (rKb[2 * kn], rKb[2 * kn + 1]), (rKs[2 * kn], rKs[2 * kn + 1]),
                               Z4, sx, wbase, lane)
                    for c in range(4):
                        rS[f + c] += acc[c]
                    acc = mma3((ob0, ob1, ob2, ob3), (os0, os1, os2, os3), (rVb[2 * kn], rVb[2 * kn + 1]), (rVs[2 * kn], rVs[2 * kn + 1]),
                               Z4, sx, wbase, lane)
                    for c in range(4):
                        rdP[f + c] += acc[c]

    return mma_score_products


@functools.cache
def make_score_products_wide(QT: int, NKN: int, KD: int, SQ: int, SIM: bool, KEYS_FIXED: bool, SMALL: int = 0,
                             PAIRS: bool = False):
    """``mma_score_products_wide(smem, words, OFF_Q, OFF_DO, OFF_K, OFF_V, qrow, krow, g, t, c1, rS, rdP, sx, wbase, lane)``.

    :func:`make_score_products`'s ``S`` and ``dP`` (the same fragments; query rows ``qrow + 16 qt + g (+ 8)``, key
    rows ``krow + 8 kn + g``, ``qrow`` and ``krow`` multiples of 8) summed in the order of the 3xTF32 forward's
    ``WIDE`` (:func:`numba_flash.tensorcore.fa2_forward_tf32.fa2_forward_tc_kernel`), so ``S`` is that forward's ``S`` bit
    for bit: the 8-wide k steps go in pairs over 16 columns of d, lane ``(g, t)`` loads columns ``16 p + 4 t .. + 3``
    of each of its rows at once (16 bytes), and k step ``2 p + h`` takes columns ``c = 16 p + 4 t + 2 h`` and ``c + 1``
    at k positions ``t`` and ``t + 4``; each k step staged as in :func:`make_score_products`. The tiles are stored
    unpadded and swizzled by :func:`numba_flash.fast._tiles.swizzle16t` (``SQ = DP``, a multiple of 32). ``S`` first,
    then ``dP`` (one product at a time: half the operand registers of computing both per k step).

    ``KEYS_FIXED`` (the main kernel: few key rows per warp, up to 4 query tiles): the warp's key columns of a pair of
    k steps are split once and kept while the query rows stream by; otherwise (the dQ kernel: the warp's own query
    rows, 8 key tiles) the query columns are kept and the key rows stream. Each element's k steps go in the same
    order either way.

    ``SMALL`` (with ``KEYS_FIXED``; the main kernel's ``SPLIT_QDO``): the query rows were split in SRAM, their tf32 big
    parts in place and the small parts ``SMALL`` words further on (``Q_i`` already times ``tau log2 e``), so the streamed
    A operand is loaded in two parts (from ``words``, the uint32 view of ``smem``) instead of split by every warp; the same
    parts, so the same ``S`` and ``dP`` bit for bit. Without it ``words`` is not read.

    ``PAIRS`` (with ``SMALL``; the main kernel's ``QDO_PAIRS``): the split pass left the query rows as A-fragment quads of
    row pairs (:func:`numba_flash.fast._tiles.make_row_pair_split_pass`), and the fragment rows ``g, g + 8`` of query tile
    ``qt`` are query rows ``qrow + 16 qt + 2 g`` and ``+ 1`` (not ``+ g`` and ``+ g + 8``): each k step's A parts are
    two 16-byte loads, already in the ``mma``'s register order. The same sums of the same parts for every element.
    """
    split, mma3, _, _ = ptx.make_warp_ops(SIM)
    split_nan = ptx.make_split_keep_nan(SIM)  # Dev: A c1's NaN is 0x7fffffff, which split would make -0.0
    uSQ = U(SQ)
    PRESPLIT = SMALL > 0
    if PRESPLIT and not KEYS_FIXED:
        raise ValueError("3xTF32 backward: split query rows (SMALL) only with the key columns kept (KEYS_FIXED)")
    if PAIRS and not PRESPLIT:
        raise ValueError("3xTF32 backward: query row pairs (PAIRS) only with split query rows (SMALL)")
    uSMALL = U(SMALL)
    NS = QT * NKN * 4
    NF = 4 * NKN if KEYS_FIXED else 8 * QT  # split parts of the kept operand per pair of k steps
    ZERO = float32(0.0)
    Z4 = (ZERO, ZERO, ZERO, ZERO)

    def make_product(SCALED: bool):
        @cuda.jit(device=True, inline="always")
        def a_parts(rX, words, qa, e, c1):
            """The tf32 parts of the streamed A element ``e`` (columns e % 4 from ``qa`` of rows g: 0-3, g + 8: 4-7): split
            here (times c1 if SCALED), or with PRESPLIT both loaded (Dev: the four columns of a row merge into one 16-byte
            load, whose words ptxas then moves into the fragment's (g, g + 8) order: the performance log's SPLIT_QDO)."""
            if PRESPLIT:
                at = qa + U(e % 4) + (U(8) * uSQ if e >= 4 else U(0))
                return words[at], words[at + uSMALL]
            return split_nan(rX[e] * c1) if SCALED else split(rX[e])

        @cuda.jit(device=True, inline="always")
        def product(smem, words, OFF_A, OFF_B, qrow, krow, g, t, c1, rOut, sx, wbase, lane):
            """rOut = (A rows, times c1 if SCALED) (B rows)^T: S from Q_i, K_j or dP from dO_i, V_j."""
            rFb = cuda.local.array(NF, uint32)  # the kept operand's tf32 big / small parts
            rFs = cuda.local.array(NF, uint32)
            rX = cuda.local.array(8, float32)  # the streamed operand's 4 columns of one key row or two query rows
            for a in range(NS):
                rOut[a] = ZERO
            for kp in range(KD // 2):
                # SRAM column of columns 16 kp + 4 t .. + 3 in rows 8 r + g (Dev: as 32 (kp // 2) plus one of two swizzled
                # offsets, so that the addresses are two registers and immediates)
                cs = U(32 * (kp // 2)) + _tiles.swizzle16t(U(16 * (kp % 2)) + U(4) * t, g)
                if KEYS_FIXED:
                    for kn in range(NKN):  # key row 8 kn + g: columns 16 kp + 4 t + e, split (part 4 kn + e)
                        ka = OFF_B + (krow + U(8 * kn) + g) * uSQ + cs
                        for e in range(4):
                            rX[e] = smem[ka + U(e)]
                        for e in range(4):
                            rFb[kn * 4 + e], rFs[kn * 4 + e] = split(rX[e])
                    for qt in range(QT):  # query rows g (e < 4) and g + 8 (e >= 4), the same columns
                        if PAIRS:  # Dev: the quads of rows 2 g, 2 g + 1: columns c, c + 1 in row 2 g's chunk, c + 2, c + 3 in the next
                            qr = OFF_A + (qrow + U(16 * qt) + U(2) * g) * uSQ + U(32 * (kp // 2))
                            qa = qr + _tiles.swizzle_pairs(U(16 * (kp % 2)) + U(4) * t, U(2) * g)
                            qa1 = qr + uSQ + _tiles.swizzle_pairs(U(16 * (kp % 2)) + U(4) * t, U(2) * g + U(1))
                        else:
                            qa = OFF_A + (qrow + U(16 * qt) + g) * uSQ + cs
                            qa1 = qa  # Dev: unread without PAIRS
                        for e in range(4):
                            if not PRESPLIT:  # Dev: SPLIT_QDO: a_parts loads both parts, from the split pass
                                rX[e] = smem[qa + U(e)]
                                rX[4 + e] = smem[qa + U(8) * uSQ + U(e)]
                        for h2 in range(0, 4, 2):  # k step 2 kp + h2 / 2: columns c = 16 kp + 4 t + h2, c + 1
                            if PAIRS:  # a = (A[2g, c], A[2g+1, c], A[2g, c+1], A[2g+1, c+1]): one quad of each part
                                qp = qa if h2 == 0 else qa1
                                ab0, ab1, ab2, ab3 = words[qp], words[qp + U(1)], words[qp + U(2)], words[qp + U(3)]
                                as0, as1 = words[qp + uSMALL], words[qp + uSMALL + U(1)]
                                as2, as3 = words[qp + uSMALL + U(2)], words[qp + uSMALL + U(3)]
                            else:
                                ab0, as0 = a_parts(rX, words, qa, h2, c1)  # a = (A[g, c], A[g+8, c], A[g, c+1], A[g+8, c+1])
                                ab1, as1 = a_parts(rX, words, qa, 4 + h2, c1)
                                ab2, as2 = a_parts(rX, words, qa, h2 + 1, c1)
                                ab3, as3 = a_parts(rX, words, qa, 5 + h2, c1)
                            for kn in range(NKN):  # b = (B[g, c], B[g, c+1]) of key tile kn
                                x = kn * 4 + h2
                                f = (qt * NKN + kn) * 4
                                acc = mma3((ab0, ab1, ab2, ab3), (as0, as1, as2, as3), (rFb[x], rFb[x + 1]), (rFs[x], rFs[x + 1]), Z4,
                                           sx, wbase, lane)
                                for c in range(4):
                                    rOut[f + c] += acc[c]
                else:
                    for qt in range(QT):  # query rows g, g + 8: columns 16 kp + 4 t + e, split (parts 8 qt + e, 8 qt + 4 + e)
                        qa = OFF_A + (qrow + U(16 * qt) + g) * uSQ + cs
                        for e in range(4):
                            rX[e] = smem[qa + U(e)]
                            rX[4 + e] = smem[qa + U(8) * uSQ + U(e)]
                        for e in range(8):
                            rFb[qt * 8 + e], rFs[qt * 8 + e] = split_nan(rX[e] * c1) if SCALED else split(rX[e])
                    for kn in range(NKN):  # key row 8 kn + g, the same columns
                        ka = OFF_B + (krow + U(8 * kn) + g) * uSQ + cs
                        for e in range(4):
                            rX[e] = smem[ka + U(e)]
                        for h2 in range(0, 4, 2):  # k step 2 kp + h2 / 2: columns c = 16 kp + 4 t + h2, c + 1
                            bb0, bs0 = split(rX[h2])  # b = (B[g, c], B[g, c+1])
                            bb1, bs1 = split(rX[h2 + 1])
                            for qt in range(QT):  # a = (A[g, c], A[g+8, c], A[g, c+1], A[g+8, c+1])
                                x = qt * 8 + h2
                                f = (qt * NKN + kn) * 4
                                acc = mma3((rFb[x], rFb[x + 4], rFb[x + 1], rFb[x + 5]), (rFs[x], rFs[x + 4], rFs[x + 1], rFs[x + 5]),
                                           (bb0, bb1), (bs0, bs1), Z4, sx, wbase, lane)
                                for c in range(4):
                                    rOut[f + c] += acc[c]

        return product

    s_product, dp_product = make_product(True), make_product(False)

    @cuda.jit(device=True, inline="always")
    def mma_score_products_wide(smem, words, OFF_Q, OFF_DO, OFF_K, OFF_V, qrow, krow, g, t, c1, rS, rdP, sx, wbase, lane):
        s_product(smem, words, OFF_Q, OFF_K, qrow, krow, g, t, c1, rS, sx, wbase, lane)  # S = (Q_i tau log2 e) K_j^T
        dp_product(smem, words, OFF_DO, OFF_V, qrow, krow, g, t, c1, rdP, sx, wbase, lane)  # dP = dO_i V_j^T

    return mma_score_products_wide


@functools.cache
def make_rows_2t(SQ: int, WIDE: bool):
    """``rows_2t(off, r0, c0, g, t) -> (a0, a1)``: SRAM offsets of column ``c0 + g`` in rows ``r0 + 2 t`` and
    ``r0 + 2 t + 1`` of the ``Q_i``, ``dO_i`` or ``K_j`` tile at ``off`` (row stride ``SQ``; ``r0``, ``c0`` multiples
    of 8): the B operands read down a column (``dV += P^T dO_i``, ``dK += dS^T Q_i``, ``dQ += dS K_j``). ``WIDE``: the
    tile is swizzled by :func:`numba_flash.fast._tiles.swizzle16t`, which keeps these reads in 32 banks."""
    uSQ = U(SQ)

    @cuda.jit(device=True, inline="always")
    def rows_2t(off, r0, c0, g, t):
        if WIDE:  # Dev: the swizzle moves bits 3, 4 only: 32-aligned part of c0 and the row block as immediates
            a = off + r0 * uSQ + (c0 & ~U(31))
            lo = c0 & U(24)
            return (a + U(2) * t * uSQ + _tiles.swizzle16t(lo + g, U(2) * t),
                    a + (U(2) * t + U(1)) * uSQ + _tiles.swizzle16t(lo + g, U(2) * t + U(1)))
        a = off + (r0 + U(2) * t) * uSQ + c0 + g  # Dev: the sums in the order the kernels had before WIDE (same SASS)
        return a, a + uSQ

    return rows_2t


@functools.cache
def make_row_store(ND: int, PAIR: bool, SCALED: bool):
    """``store_row(gX, rX, gY, rY, ub, row, uh, d, f0, t, c1)``: a lane's part of one fragment row to HBM: columns
    ``8 dn + 2t``, ``+ 1`` of row ``row`` of ``gX[ub, :, uh, :]`` are ``rX[f0 + 4 dn ..]`` (``ND`` n8 tiles; columns past
    ``d`` left out), divided by ``c1`` with ``SCALED``; with ``PAIR`` the same of ``rY`` (never divided) into ``gY``,
    element by element (dK_j with dV_j)."""

    @cuda.jit(device=True, inline="always")
    def store_row(gX, rX, gY, rY, ub, row, uh, d, f0, t, c1):
        for dn in range(ND):
            for cc in range(2):
                x = 8 * dn + 2 * int(t) + cc
                if x < d:
                    f = f0 + 4 * dn + cc
                    gX[ub, U(row), uh, U(x)] = rX[f] / c1 if SCALED else rX[f]
                    if PAIR:
                        gY[ub, U(row), uh, U(x)] = rY[f]

    return store_row


@functools.cache
def make_mma3_add(SIM: bool):
    """``mma3_add(rAb, rAs, q, b, bs, rC, f, sx, wbase, lane)``: one staged 3xTF32 ``mma`` of the kernels' products: the A
    fragment of m16 tile ``q`` (big parts ``rAb[4 q ..]``, small ``rAs[4 q ..]``) times the B fragment (parts ``b``,
    ``bs``) into a zeroed accumulator, added to ``rC[f .. f + 3]`` with IEEE float32 adds."""
    _, mma3, _, _ = ptx.make_warp_ops(SIM)
    ZERO = float32(0.0)
    Z4 = (ZERO, ZERO, ZERO, ZERO)

    @cuda.jit(device=True, inline="always")
    def mma3_add(rAb, rAs, q, b, bs, rC, f, sx, wbase, lane):
        acc = mma3((rAb[q * 4], rAb[q * 4 + 1], rAb[q * 4 + 2], rAb[q * 4 + 3]),
                   (rAs[q * 4], rAs[q * 4 + 1], rAs[q * 4 + 2], rAs[q * 4 + 3]), b, bs, Z4, sx, wbase, lane)
        for c in range(4):
            rC[f + c] += acc[c]

    return mma3_add


@functools.cache
def make_dq_k_step(NQT: int, QSTRIDE: int, NDW: int, SD: int, OFF_DS: int, SQ: int, WIDE: bool, SIM: bool):
    """Line 15's k step of 8 keys for ``NQT`` query m16 tiles (rows ``q0``, ``q0 + QSTRIDE``, ...) and ``NDW`` n8
    column tiles of dQ (from column tile ``dq0``): ``rdQ += tau dS[:, 8 kb ..] K_j[8 kb .., :]``, each tile's three
    ``mma`` into a zeroed accumulator then added (staged). A = ``tau dS`` rows from SRAM at ``OFF_DS`` (row stride
    ``SD``), B = ``K_j`` rows ``2t, 2t + 1`` of the k step (:func:`make_rows_2t`). The atomic kernel calls it for its
    warp's slice of ``dQ_i`` (``DQ_UNROLL`` at a time), the deterministic dQ kernel for its warp's own query rows."""
    split, _, _, _ = ptx.make_warp_ops(SIM)
    mma3_add = make_mma3_add(SIM)
    rows_2t = make_rows_2t(SQ, WIDE)
    uSD, uOFF_DS = U(SD), U(OFF_DS)

    # [doc:fa2-tf32-bwd-dq-step]
    @cuda.jit(device=True, inline="always")
    def dq_k_step(smem, off_k, kb, q0, dq0, g, t, rAb, rAs, rdQ, sx, wbase, lane):
        """k step ``kb`` (8 keys) of ``dQ_i += tau dS_ij K_j`` into the fragments ``rdQ`` (``K_j`` at ``off_k``;
        ``rAb, rAs``: the A fragments' big and small tf32 parts, scratch)."""
        for qq in range(NQT):  # a = (dS[g, 2t], dS[g+8, 2t], dS[g, 2t+1], dS[g+8, 2t+1]) of query tile qq
            qa = uOFF_DS + (q0 + U(QSTRIDE * qq) + g) * uSD + U(8 * kb) + U(2) * t
            for c in range(4):
                rAb[qq * 4 + c], rAs[qq * 4 + c] = split(smem[qa + U(8 * (c % 2)) * uSD + U(c // 2)])
        for dn in range(NDW):
            ka0, ka1 = rows_2t(off_k, U(8 * kb), U(8 * (dq0 + dn)), g, t)  # b = (K[2t, g], K[2t+1, g])
            kb0, ks0 = split(smem[ka0])
            kb1, ks1 = split(smem[ka1])
            for qq in range(NQT):
                f = (qq * NDW + dn) * 4
                mma3_add(rAb, rAs, qq, (kb0, kb1), (ks0, ks1), rdQ, f, sx, wbase, lane)
    # [/doc:fa2-tf32-bwd-dq-step]

    return dq_k_step


@functools.cache
def make_dv_dk_update(MW: int, NB: int, ND: int, SD: int, OFF_P, OFF_DS, OFF_Q, OFF_DO, SQ: int, uQSTAGE, WIDE: bool,
                      SPLIT_QDO: bool, QDO_PAIRS: bool, SIM: bool):
    """``dv_dk_update(smem, words, qs, wrow, g, t, rKb, rKs, rVb, rVs, rdV, rdK, sx, wbase, lane)``: lines 12 and 16 of
    the main kernel for the warp's ``16 MW`` keys, ``dV_j += (P o Z)^T dO_i`` and ``dK_j += tau dS^T Q_i`` over the
    ``8 NB`` queries of the step, each k step's three ``mma`` into a zeroed accumulator then added (staged).

    A = the warp's key columns of ``P o Z`` (at ``OFF_P``) and ``tau dS`` (at ``OFF_DS``; row = query, stride ``SD``),
    split into ``rKb, rKs`` and ``rVb, rVs``, with the 8 queries of a k step in the order ``2t, 2t + 1`` (k positions
    ``t, t + 4``: bank ``8t + g``, conflict free); B = ``dO_i`` and ``Q_i`` rows ``2t, 2t + 1`` of the stage at ``qs``
    (:func:`make_rows_2t`), split here or (``SPLIT_QDO``) the parts the split pass left, ``uQSTAGE`` words apart
    (``QDO_PAIRS``: two adjacent words of one part's quad chunk).
    """
    split, _, _, _ = ptx.make_warp_ops(SIM)
    mma3_add = make_mma3_add(SIM)
    rows_2t = make_rows_2t(SQ, WIDE)
    uSQ, uSD = U(SQ), U(SD)

    @cuda.jit(device=True, inline="always")
    def pair_parts(words, off, r0, c0, g, t):
        """QDO_PAIRS: the tf32 parts of ``(X[r0 + 2t, c], X[r0 + 2t + 1, c])``, ``c = c0 + g`` (``r0``, ``c0`` multiples of 8),
        of the ``Q_i`` or ``dO_i`` tile at ``off``: two adjacent words of row ``r0 + 2t``'s quad chunk (columns ``c % 4 < 2``)
        or of row ``r0 + 2t + 1``'s, ``2 (c % 2)`` words in."""
        rr = r0 + U(2) * t + ((g >> U(1)) & U(1))
        # Dev: the swizzle moves bits 2-4 only: c0's 32-aligned part an immediate, as rows_2t's
        at = off + rr * uSQ + (c0 & ~U(31)) + _tiles.swizzle_pairs((c0 & U(24)) + (g & U(4)), rr) + U(2) * (g & U(1))
        return words[at], words[at + U(1)], words[at + uQSTAGE], words[at + uQSTAGE + U(1)]

    @cuda.jit(device=True, inline="always")
    def b_parts(smem, words, at):
        """The tf32 parts of the ``Q_i`` or ``dO_i`` element at ``at``: split here, or (SPLIT_QDO) as the split pass left them."""
        if SPLIT_QDO:
            return words[at], words[at + uQSTAGE]
        return split(smem[at])

    @cuda.jit(device=True, inline="always")
    def dv_dk_update(smem, words, qs, wrow, g, t, rKb, rKs, rVb, rVs, rdV, rdK, sx, wbase, lane):
        for nt in range(NB):
            for mt in range(MW):  # a = (X[2t, g], X[2t, g+8], X[2t+1, g], X[2t+1, g+8]) of the (query, key) tiles
                pa = (U(8 * nt) + U(2) * t) * uSD + wrow + U(16 * mt) + g
                for c in range(4):
                    off = pa + U(c // 2) * uSD + U(8 * (c % 2))
                    rKb[mt * 4 + c], rKs[mt * 4 + c] = split(smem[OFF_P + off])
                    rVb[mt * 4 + c], rVs[mt * 4 + c] = split(smem[OFF_DS + off])
            for dn in range(ND):
                if QDO_PAIRS:  # Dev: both rows of b in two adjacent words of each part
                    ob0, ob1, os0, os1 = pair_parts(words, OFF_DO, U(8 * nt), U(8 * dn), g, t)
                    qb0, qb1, qs0, qs1 = pair_parts(words, OFF_Q, U(8 * nt), U(8 * dn), g, t)
                else:
                    ra0, ra1 = rows_2t(U(0), U(8 * nt), U(8 * dn), g, t)  # b = (X[2t, g], X[2t+1, g]) of column tile dn
                    ob0, os0 = b_parts(smem, words, OFF_DO + qs + ra0)
                    ob1, os1 = b_parts(smem, words, OFF_DO + qs + ra1)
                    qb0, qs0 = b_parts(smem, words, OFF_Q + qs + ra0)  # Dev: SPLIT_QDO: Q_i tau log2 e (dK / tau log2 e at L18)
                    qb1, qs1 = b_parts(smem, words, OFF_Q + qs + ra1)
                for mt in range(MW):
                    f = (mt * ND + dn) * 4
                    mma3_add(rKb, rKs, mt, (ob0, ob1), (os0, os1), rdV, f, sx, wbase, lane)
                    mma3_add(rVb, rVs, mt, (qb0, qb1), (qs0, qs1), rdK, f, sx, wbase, lane)

    return dv_dk_update


def _check_switches(DP: int, NKB: int, CP_ASYNC: bool, WIDE: bool, DQ_UNROLL: int, KV_ASYNC: bool, SPLIT_QDO: bool,
                    QDO_PAIRS: bool) -> None:
    """ValueError for a combination of :func:`fa2_backward_tf32_kernel`'s switches that it cannot build (``NKB``: the
    ``Bc / 8`` k steps of ``dS K_j``)."""
    if DQ_UNROLL < 1 or NKB % DQ_UNROLL:
        raise ValueError(f"3xTF32 backward: DQ_UNROLL={DQ_UNROLL} does not divide the {NKB} k steps of dS K_j")
    if DQ_UNROLL not in (1, 2, 4):
        raise ValueError(f"3xTF32 backward: DQ_UNROLL must be 1, 2 or 4, got {DQ_UNROLL}")
    if KV_ASYNC and not CP_ASYNC:
        raise ValueError("3xTF32 backward: KV_ASYNC needs CP_ASYNC")
    if WIDE and not fa2_forward_tf32.wide_ok(DP):
        raise ValueError(f"3xTF32 backward: WIDE needs a padded head dim that is a multiple of 32, got DP={DP}")
    if SPLIT_QDO and not (CP_ASYNC and WIDE):
        raise ValueError("3xTF32 backward: SPLIT_QDO needs CP_ASYNC and WIDE")
    if QDO_PAIRS and not SPLIT_QDO:
        raise ValueError("3xTF32 backward: QDO_PAIRS needs SPLIT_QDO")


@_plan.cache_by_signature  # Dev: a flag passed at its default (the plan) and left out (a test) give one kernel
def fa2_backward_tf32_kernel(NW: int, MW: int, BR: int, DP: int, CAUSAL: bool, DROPOUT: bool, ATOMIC_DQ: bool,
                             SIM: bool, FROM_LSE: bool = False, RED2: bool = False, CP_ASYNC: bool = False,
                             HEAVY_FIRST: bool = False, WIDE: bool = False, DQ_UNROLL: int = 1, KV_ASYNC: bool = False,
                             SPLIT_QDO: bool = False, QDO_PAIRS: bool = False):
    """The main (column-block) 3xTF32 backward kernel: dK, dV, and with ``ATOMIC_DQ`` the atomic dQ adds.

    Kernel arguments: ``gQ, gdO (b, s_q, h, d)``, ``gK, gV (b, s_k, h_k, d)`` float32, ``gm, gl, gD (b, h, s_q)``
    (the forward's ``m, l``; with ``FROM_LSE`` only ``L``, passed as ``gm``), ``gdQ (b, s_q, h, d)`` zeros
    (unused without ``ATOMIC_DQ``), ``gdK, gdV (b, s_k, h_k, d)``; ``tau``, ``c1 = tau log2 e``, ``group``,
    ``causal_offset``, dropout ``seed``, ``threshold``, ``dropout_scale``. ``RED2``: dQ added two columns per
    ``red.global.add.v2.f32`` (even ``d``, sm_90). ``CP_ASYNC`` (d a multiple of 4, 16-byte aligned Q and dO):
    Q_i, dO_i go HBM -> SRAM by ``cp.async`` into two SRAM stages, issued one step ahead, with the statistics
    staged beside them, and each thread turns NaNs of its own chunks into the quiet NaN after its wait (the
    half backward's pipeline, :func:`numba_flash.tensorcore.fa2_backward_half.fa2_backward_half_kernel`, with the
    3xTF32 forward's NaN pass); one barrier per step instead of two. Without it they go through registers.
    ``WIDE`` (padded d a multiple of 32): ``S`` in the order of the forward's ``WIDE``, for a forward that ran with it
    (:func:`make_score_products_wide`); ``Q_i, dO_i, K_j, V_j`` unpadded (``SQ = DP``) and swizzled
    (:func:`numba_flash.fast._tiles.swizzle16t`), ``dP`` from the same 16-byte loads. ``KV_ASYNC`` (needs ``CP_ASYNC``):
    line 6's ``K_j, V_j`` by ``cp.async`` too, in the first step's copy group, quieted by each thread after its wait. The
    register load is a loop that ptxas keeps in local memory at d = 128 (64 floats of each a thread: every load waited
    for by its spill store, 64 HBM round trips in a row before the block's first step); same bits.
    ``SPLIT_QDO`` (needs ``CP_ASYNC`` and ``WIDE``): ``Q_i`` (times ``tau log2 e``) and ``dO_i`` are split into their tf32
    parts once per step, by the threads that copied them (:func:`numba_flash.fast._tiles.make_split_pass`, in place of
    the NaN pass), instead of by each of the ``NW`` warps at each of their four reads (the A operands of ``S``, ``dP``, the
    B operands of ``dV``, ``dK``): big parts in place, small parts where the second stage was. So the tiles have one
    stage, and the next step's copies are issued after the barrier that ends this step's reads of them (before line 15,
    during whose ``dQ`` product they land). ``S``, ``dP``, ``P``, ``dS``, ``dV`` and ``dQ`` are the same bits; ``dK`` is
    summed from the scaled ``Q_i`` and divided by ``tau log2 e`` at its write, a rounding of its own.
    ``QDO_PAIRS`` (needs ``SPLIT_QDO``): the split parts stored as A-fragment quads of row pairs ``2 g, 2 g + 1``
    (:func:`numba_flash.fast._tiles.make_row_pair_split_pass`, each thread copying rows ``r, r + 1``), which the ``S``
    and ``dP`` products load 16 bytes at a time in the ``mma``'s register order (their fragment rows ``g, g + 8`` are
    then query rows ``2 g, 2 g + 1``: so are ``P`` and ``dS``'s), and ``dV``, ``dK`` 8 bytes at a time (rows ``2 t,
    2 t + 1`` of a column, two words side by side). The same bits as ``SPLIT_QDO`` alone.

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, dO               gQ, gK, gV, gdO      HBM, float32
    m, l (or L), D            gm, gl, gD           HBM, float32 (b, h, s_q)
    dQ, dK, dV                gdQ, gdK, gdV        HBM, float32
    Q_i, dO_i                 smem[OFF_Q/OFF_DO]   SRAM (Br, SQ); CP_ASYNC: 2 stages (+ uQSTAGE)
    Q_i tau log2 e, dO_i      words[OFF_Q/OFF_DO]  SPLIT_QDO: tf32 big parts, one stage; small parts + uQSTAGE
                                                   (QDO_PAIRS: as quads of row pairs)
    K_j, V_j                  smem[OFF_K/OFF_V]    SRAM (Bc, SQ), loaded once (L6); SQ = DP + 4 (WIDE: DP, swizzled)
    tau dS_ij                 smem[OFF_DS]         SRAM (Br, Bc+4), for L15
    M_i, 1/l_i, D_i           sM, sIL, sD          SRAM (Br,); CP_ASYNC: 2 stages (+ Br)
    S_ij (base 2), then -     rS                   registers: (Br/16) x 2 MW m16n8 fragments per warp (its keys)
    dP_ij                     rdP                  registers, same layout
    P_ij o Z_ij               smem[OFF_P]          SRAM (Br, Bc+4); a warp reads back its own key columns
    dK_j, dV_j                rdK, rdV             registers: MW x (DP/8) fragments, the warp's key rows
    dQ_i slice                rdQ                  registers: QPW x (DP/(8 DSPLIT)) fragments
    ========================  ===================  ==================================================
    """
    # row stride of Q_i, dO_i, K_j, V_j: 4 mod 8 (A/B loads conflict free), 4 or 12 mod 16 (renamed rows); WIDE: DP
    # (a multiple of 32) with the tiles swizzled (make_score_products_wide, make_rows_2t)
    SQ = DP if WIDE else DP + 4
    _check_switches(DP, 2 * MW * NW, CP_ASYNC, WIDE, DQ_UNROLL, KV_ASYNC, SPLIT_QDO, QDO_PAIRS)  # the Bc / 8 k steps of dS K_j
    (NT, BC, QST, OFF_Q, OFF_DO, uQSTAGE, OFF_K, OFF_V, END_KV, QPW, DSPLIT, NDW, NS, NKV, NQ, NA, NSR, SXN, SCR, NSTAT,
     NSKEY) = backward_steps.key_block_layout("3xTF32 backward", NW, MW, BR, DP, SQ, CP_ASYNC, DROPOUT, SIM, dq_split(NW, BR, DP),
                                              ptx.SIM_SCRATCH_PER_WARP)
    NB = BR // 8  # 8-query k steps of P^T dO_i, dS^T Q_i
    QT = BR // 16  # m16 query tiles of S, dP
    NKN = 2 * MW  # n8 key tiles of S, dP (the warp's 16 MW keys)
    NKB = BC // 8  # 8-key k steps of dS K_j
    KD = DP // 8  # 8-wide d steps of K Q^T and V dO^T
    ND = DP // 8  # n8 column tiles of dK, dV
    SD = BC + 4  # row stride of dS: 4 mod 16 (the stores of dS^T fragments hit bank 8t + g)
    uSD = U(SD)
    OFF_P = U(END_KV)  # P o Z, then tau dS, after K_j, V_j
    OFF_DS = U(END_KV + BR * SD)
    NQA = QPW * 4
    ZERO = float32(0.0)
    CAP = float32(64.0)
    cap_nan = ptx.make_min_keep_nan(SIM)  # Dev: min(x, CAP) keeping a NaN x (min.NaN.f32 on a GPU)
    QNAN = _tiles.QNAN

    SWZ = _tiles.swizzle16t if WIDE else None
    NLQ, load_q, store_q = _tiles.make_pair_loader(BR, DP, NT, SQ, QUIET_NAN=True, SWIZZLE=SWZ)  # Q_i with dO_i
    RQ = 1 if CP_ASYNC else NLQ  # register staging of Q_i, dO_i (none with cp.async)
    if QDO_PAIRS:  # Dev: each thread copies rows r, r + 1 of a column chunk, and rewrites both as the quads of the pair
        _, load_q_async = _tiles.make_word_loader_async(BR, DP, NT, SQ, SIM, _tiles.swizzle_pairs, True, 1)
        split_q = _tiles.make_row_pair_split_pass(BR, DP, NT, SQ, SIM, SCALE=True)  # Q_i tau log2 e into its parts
        split_do = _tiles.make_row_pair_split_pass(BR, DP, NT, SQ, SIM)  # dO_i
    else:
        _, load_q_async = _tiles.make_word_loader_async(BR, DP, NT, SQ, SIM, SWZ)  # Q_i or dO_i as 16-byte chunks of 4 floats
        split_q = _tiles.make_split_pass(BR, DP, NT, SQ, SIM, SWZ, SCALE=True)  # SPLIT_QDO: Q_i tau log2 e into its parts
        split_do = _tiles.make_split_pass(BR, DP, NT, SQ, SIM, SWZ)  # SPLIT_QDO: dO_i
    quiet_q = _tiles.make_quiet_nan_pass(BR, DP, NT, SQ, SWZ)
    _copy16, cp_commit, cp_wait0 = ptx.make_cp_async(SIM)
    NLK, load_kv, store_kv = _tiles.make_pair_loader(BC, DP, NT, SQ, QUIET_NAN=True, SWIZZLE=SWZ)  # K_j with V_j
    RK = 1 if KV_ASYNC else NLK  # register staging of K_j, V_j (none with KV_ASYNC)
    _, load_kv_async = _tiles.make_word_loader_async(BC, DP, NT, SQ, SIM, SWZ)  # KV_ASYNC: K_j or V_j, 16-byte chunks
    quiet_kv = _tiles.make_quiet_nan_pass(BC, DP, NT, SQ, SWZ)
    key_block = backward_steps.make_key_block(HEAVY_FIRST)
    query_steps = backward_steps.make_query_steps(BR, BC, CAUSAL)
    mma_score_products = make_score_products(QT, NKN, KD, SQ, SIM)
    mma_score_products_wide = make_score_products_wide(QT, NKN, KD, SQ, SIM, True, int(uQSTAGE) if SPLIT_QDO else 0, QDO_PAIRS)
    dq_atomic_add = backward_steps.make_dq_atomic_add(QPW, NW // DSPLIT, NDW, False, ptx.make_atomic_add2(RED2, SIM))
    store_dk_dv = make_row_store(ND, True, SPLIT_QDO)
    dq_k_step = make_dq_k_step(QPW, 16 * (NW // DSPLIT), NDW, SD, int(OFF_DS), SQ, WIDE, SIM)
    dv_dk_update = make_dv_dk_update(MW, NB, ND, SD, OFF_P, OFF_DS, OFF_Q, OFF_DO, SQ, uQSTAGE, WIDE, SPLIT_QDO, QDO_PAIRS, SIM)

    @cuda.jit(device=True, inline="always")
    def landed(smem, words, qs, st, tid, c1):
        """The pass of each thread over its own landed chunks: NaN to the quiet NaN (the split keeps it a NaN), or with
        SPLIT_QDO the split into tf32 parts (NaN quieted first; big parts in place, small ones + uQSTAGE)."""
        if KV_ASYNC and st == 0:
            quiet_kv(smem, OFF_K, tid)  # Dev: L6's copies landed with step 0's
            quiet_kv(smem, OFF_V, tid)
        if SPLIT_QDO:
            split_q(smem, words, OFF_Q, uQSTAGE, tid, c1)  # Q_i tau log2 e, the forward's A operand
            split_do(smem, words, OFF_DO, uQSTAGE, tid)
        else:
            quiet_q(smem, OFF_Q + qs, tid)
            quiet_q(smem, OFF_DO + qs, tid)

    step_rows, q_do_async, load_q_do_l_d_first, load_q_do_l_d = backward_steps.make_q_do_pipeline(
        BR, NT, OFF_Q, OFF_DO, uQSTAGE, CP_ASYNC, False, SPLIT_QDO, DROPOUT, FROM_LSE, load_q, store_q, load_q_async,
        cp_commit, cp_wait0, landed)

    # [doc:fa2-tf32-bwd-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, gdK, gdV, tau, c1, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32)  # Q_i, dO_i, K_j, V_j, tau dS_ij; offsets OFF_*
        words = cuda.shared.array(0, uint32)  # the same SRAM as tf32 bit patterns (SPLIT_QDO's Q_i, dO_i parts)
        sM = cuda.shared.array(NSTAT, float32)  # M_i: the forward's base-2 row max of each query of the block
        sIL = cuda.shared.array(NSTAT, float32)  # 1/l_i (0 past N_q or for a query that sees no key)
        sD = cuda.shared.array(NSTAT, float32)  # D_i
        sKey = cuda.shared.array(NSKEY, uint64)  # dropout row keys of the Br queries
        sx = cuda.shared.array(SXN, float32)  # the simulator's lane-exchange scratch (unused on a GPU)
        tau = float32(tau)
        c1 = float32(c1)
        dropout_scale = float32(dropout_scale)
        rS = cuda.local.array(NS, float32)  # S_ij (the warp's key columns)
        rdP = cuda.local.array(NS, float32)  # dP_ij
        rdK = cuda.local.array(NKV, float32)
        rdV = cuda.local.array(NKV, float32)
        rdQ = cuda.local.array(NQ, float32)
        rKb = cuda.local.array(NA, uint32)  # tf32 big / small parts: B of K_j (L10), then A of P^T (L12)
        rKs = cuda.local.array(NA, uint32)
        rVb = cuda.local.array(NA, uint32)  # B of V_j (L13), then A of dS^T (L16)
        rVs = cuda.local.array(NA, uint32)
        rQb = cuda.local.array(NQA, uint32)  # dS rows of the dQ slice (L15)
        rQs = cuda.local.array(NQA, uint32)
        rQn = cuda.local.array(RQ, float32)  # Q_i / Q_{i+1} in flight (register path)
        rdOn = cuda.local.array(RQ, float32)
        rKn = cuda.local.array(RK, float32)  # K_j, V_j on their way to SRAM (register path)
        rVn = cuda.local.array(RK, float32)
        rMn = cuda.local.array(NSR, float32)  # M, 1/l, D of the next step's queries
        rIn = cuda.local.array(NSR, float32)
        rDn = cuda.local.array(NSR, float32)

        tid, lane, warp, g, t = backward_steps.lane_coords()
        wbase = warp * SCR
        nheads = gQ.shape[2]
        nheads_k = gK.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        d = gQ.shape[3]
        wrow = U(16 * MW) * U(warp)  # this warp's first key row within the block
        qw = warp // DSPLIT  # dQ slice of this warp: query tiles qw, qw + NW / DSPLIT, ...; column tiles from dq0
        dq0 = (warp % DSPLIT) * NDW
        dq_row = U(16 * qw)  # its first query row
        # FA2.2 L5: for j = 1..Tc -- one thread block per (j, batch, KV head) (HEAVY_FIRST: every head's j = 0 first)
        j, b, hk = key_block(gQ.shape[0], nheads_k)  # Dev: b*h_k folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0] or j >= cuda.gridDim.x:
            return  # Dev: past b*h_k in the last z slab of the fold
        ub, uhk = U(b), U(hk)
        col0 = j * BC
        # FA2.2 L6: load K_j, V_j from HBM to SRAM (ragged rows and padded columns zero)
        if not KV_ASYNC:  # Dev: KV_ASYNC: by cp.async with the first step's Q_i, dO_i below
            load_kv(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
            store_kv(smem, OFF_K, OFF_V, tid, rKn, rVn)
        # FA2.2 L7: dK_j = (0), dV_j = (0) on chip (registers)
        for a in range(NKV):
            rdK[a] = ZERO
            rdV[a] = ZERO
        # Dev: causal block skipping (query blocks before the first one that sees key col0 are fully masked); GQA: the G
        # query heads of the group and their blocks, one flat loop of n_steps
        i_first, n_i, n_steps = query_steps(col0, causal_offset, s_q, group)
        if n_steps > 0:  # Dev: the first step's L9 (its Q_i, dO_i by cp.async into stage 0, or into the registers)
            h0 = hk * group
            if CP_ASYNC and KV_ASYNC:  # Dev: L6's copies in the same group (a block no query sees never reads K_j, V_j)
                load_kv_async(smem, OFF_K, gK, ub, uhk, col0, s_k, d, tid)  # HBM read: Bc*d
                load_kv_async(smem, OFF_V, gV, ub, uhk, col0, s_k, d, tid)  # HBM read: Bc*d
            load_q_do_l_d_first(smem, gQ, gdO, gm, gl, gD, b, ub, h0, i_first * BR, s_q, d, tid, rQn, rdOn, rMn, rIn, rDn)
        # FA2.2 L8: for i = 1..Tr (times the G query heads of the group)
        for st in range(n_steps):
            # FA2.2 L9: load Q_i, dO_i, L_i (as M_i and 1/l_i), D_i from HBM to SRAM; Dev: CP_ASYNC: copied one step ahead
            # into stage st % 2 (qs, so; SPLIT_QDO: Q_i, dO_i in one stage, split by landed), step st+1's put on its way
            h, row0, qs, so = load_q_do_l_d(smem, words, gQ, gdO, gm, gl, gD, sM, sIL, sD, sKey, seed, nheads, b, hk, group, i_first,
                                            n_i, st, n_steps, s_q, d, tid, c1, rQn, rdOn, rMn, rIn, rDn)

            # [doc:fa2-tf32-bwd-inner-loop]
            # FA2.2 L10: S_ij = Q_i K_j^T (the forward's S, base 2, bit for bit); FA2.2 L13: dP_ij = dO_i V_j^T --
            # A = Q_i tau log2 e (dO_i) rows, B = this warp's K_j (V_j) rows, 3xTF32 as the forward, each d step staged
            if WIDE:  # Dev: the k steps of the forward's WIDE (16-byte loads, columns paired)
                mma_score_products_wide(smem, words, OFF_Q + qs, OFF_DO + qs, OFF_K, OFF_V, U(0), wrow, g, t, c1, rS, rdP, sx, wbase,
                                        lane)
            else:
                mma_score_products(smem, OFF_Q + qs, OFF_DO + qs, OFF_K, OFF_V, wrow, g, t, c1, rKb, rKs, rVb, rVs, rS, rdP, sx, wbase, lane)
            # FA2.2 L11: P_ij = exp(S_ij - L_i) as exp2(S' - M_i) / l_i, masked (a column of P^T is a query)
            # FA2.2 L14: dS_ij = P_ij o (dP_ij - D_i), times tau; P o Z and tau dS to SRAM (row = query)
            masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
            for qt in range(QT):
                for kn in range(NKN):
                    for c in range(4):
                        f = (qt * NKN + kn) * 4 + c
                        # query row within the block: fragment row g (c < 2) or g + 8 (QDO_PAIRS: rows 2 g, 2 g + 1)
                        qi = U(16 * qt + c // 2) + U(2) * g if QDO_PAIRS else U(16 * qt + 8 * (c // 2)) + g
                        qx = qi + so  # its statistics (CP_ASYNC: in this step's stage)
                        kr = wrow + U(8 * kn + c % 2) + U(2) * t  # key row within the block
                        key = col0 + int(kr)
                        # Dev: min(., 64): no overflow on masked entries (exp2 overflow, then inf * 0 = NaN); a NaN kept
                        p = math.exp2(cap_nan(rS[f] - sM[qx], CAP)) * sIL[qx]
                        if masked:
                            if key >= s_k or (CAUSAL and key > row0 + int(qi) + causal_offset):
                                p = ZERO
                        dp = rdP[f]
                        pz = p
                        if DROPOUT:
                            z = dropout_scale if keep(sKey[qx], key, threshold) else ZERO
                            pz = p * z
                            dp = dp * z
                        ds = tau * (p * (dp - sD[qx]))
                        # Dev: a NaN as the quiet NaN 0x7fc00000 (the split would turn the GPU's 0x7fffffff into -0.0)
                        smem[OFF_P + qi * uSD + kr] = pz if pz == pz else QNAN
                        smem[OFF_DS + qi * uSD + kr] = ds if ds == ds else QNAN
            if SIM:
                cuda.syncthreads()  # Sync: (simulator) P, dS columns in SRAM before L12, L16 read them
            else:
                cuda.syncwarp(0xFFFFFFFF)  # Sync: this warp's key columns of P, dS in SRAM; L12, L16 read only those
            # FA2.2 L12: dV_j += (P_ij o Z_ij)^T dO_i -- A = this warp's columns of P (keys x 8 queries), B = dO_i rows;
            # Dev: the 8 queries of a k step in the order 2t, 2t + 1 (k positions t, t + 4): bank 8t + g, conflict free
            # FA2.2 L16: dK_j += tau dS_ij^T Q_i -- the same with dS and Q_i
            dv_dk_update(smem, words, qs, wrow, g, t, rKb, rKs, rVb, rVs, rdV, rdK, sx, wbase, lane)
            if ATOMIC_DQ or SPLIT_QDO:
                cuda.syncthreads()  # Sync: every warp's tau dS in SRAM before L15 reads it (SPLIT_QDO: all done with Q_i, dO_i)
            if SPLIT_QDO and st + 1 < n_steps:  # Dev: L9 of step st+1 now, landing during L15 (its statistics: at its start)
                hn, rown = step_rows(hk, group, i_first, n_i, st + 1)
                q_do_async(smem, U(0), gQ, gdO, ub, hn, rown, s_q, d, tid)
            if ATOMIC_DQ:
                # FA2.2 L15: dQ_i += tau dS_ij K_j -- A = dS rows of this warp's query tiles, B = K_j; the 8 keys of a k step
                # in the order 2t, 2t + 1 (K_j rows 2t, 2t + 1: bank 8t + g); each k step staged; then float32 atomic adds
                for a in range(NQ):
                    rdQ[a] = ZERO
                for kq in range(NKB // DQ_UNROLL):  # Dev: DQ_UNROLL k steps a pass, in order (the same sums, more mma in flight)
                    dq_k_step(smem, OFF_K, kq * DQ_UNROLL, dq_row, dq0, g, t, rQb, rQs, rdQ, sx, wbase, lane)
                    if DQ_UNROLL >= 2:
                        dq_k_step(smem, OFF_K, kq * DQ_UNROLL + 1, dq_row, dq0, g, t, rQb, rQs, rdQ, sx, wbase, lane)
                    if DQ_UNROLL >= 4:
                        dq_k_step(smem, OFF_K, kq * DQ_UNROLL + 2, dq_row, dq0, g, t, rQb, rQs, rdQ, sx, wbase, lane)
                        dq_k_step(smem, OFF_K, kq * DQ_UNROLL + 3, dq_row, dq0, g, t, rQb, rQs, rdQ, sx, wbase, lane)
                dq_atomic_add(gdQ, rdQ, b, h, row0, qw, dq0, s_q, d, g, t)  # HBM read+write: Br*d
            # [/doc:fa2-tf32-bwd-inner-loop]

        # FA2.2 L17-L18: write dK_j, dV_j to HBM (lane (g, t): columns 8 dn + 2t, + 1 of key rows g, g + 8)
        for mt in range(MW):
            for hf in range(2):
                key = col0 + int(wrow) + 16 * mt + 8 * hf + int(g)
                if key < s_k:  # Dev: SPLIT_QDO: dK_j was summed from Q_i tau log2 e
                    store_dk_dv(gdK, rdK, gdV, rdV, ub, key, uhk, d, mt * ND * 4 + 2 * hf, t, c1)  # HBM write: 2 Bc*d

    # [/doc:fa2-tf32-bwd-kernel]
    return kernel


@functools.cache
def fa2_backward_tf32_dq_kernel(NW: int, MW: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, SIM: bool, FROM_LSE: bool = False,
                                WIDE: bool = False):
    """The deterministic dQ kernel: one block per (query block, batch, head), ``dQ_i`` in registers.

    Lines 10-15 with the loops swapped (query block outer, key blocks inner) and the 3xTF32 forward's
    geometry (:func:`numba_flash.tensorcore.fa2_forward_tf32.config_for`: ``NW`` warps of ``16 MW`` query rows, ``Bc``
    keys per step): ``S = Q_i K_j^T`` computed exactly as the forward computes it, ``dP = dO_i V_j^T`` the same
    way, and ``tau dS`` through the warp's own rows of an SRAM tile (``OFF_DS``, row stride ``Bc + 4``) into the
    A operand of ``dS K_j`` (the 8 keys of a k step in the order ``2t, 2t + 1``, as in the main kernel's
    ``dQ``). Each ``dQ`` element is one lane's sum in a fixed order: bitwise reproducible. Arguments as
    :func:`fa2_backward_tf32_kernel`, with ``gdQ`` written (not added to). Tiling: :func:`dq_config`. ``WIDE``: as
    the main kernel's (:func:`make_score_products_wide` with the query columns kept).
    """
    NT = 32 * NW
    BR = 16 * MW * NW
    NB = BC // 8
    KD = DP // 8
    ND = DP // 8
    SQ = DP if WIDE else DP + 4  # as the main kernel's
    uSQ = U(SQ)
    if WIDE and not fa2_forward_tf32.wide_ok(DP):
        raise ValueError(f"3xTF32 backward: WIDE needs a padded head dim that is a multiple of 32, got DP={DP}")
    OFF_Q = U(0)
    OFF_DO = U(BR * SQ)
    OFF_K = U(2 * BR * SQ)
    OFF_V = U(2 * BR * SQ + BC * SQ)
    SD = BC + 4  # row stride of dS
    uSD = U(SD)
    OFF_DS = U(2 * BR * SQ + 2 * BC * SQ)  # tau dS_ij: (Br, SD); warp w writes and reads its own 16 MW rows
    NS = MW * NB * 4
    NO = MW * ND * 4
    NR = MW * 2
    NA = MW * 4
    SXN = NW * ptx.SIM_SCRATCH_PER_WARP if SIM else 1
    SCR = ptx.SIM_SCRATCH_PER_WARP
    ZERO = float32(0.0)
    CAP = float32(64.0)
    cap_nan = ptx.make_min_keep_nan(SIM)  # Dev: min(x, CAP) keeping a NaN x (min.NaN.f32 on a GPU)

    SWZ = _tiles.swizzle16t if WIDE else None
    NLQ, load_q, store_q = _tiles.make_pair_loader(BR, DP, NT, SQ, QUIET_NAN=True, SWIZZLE=SWZ)
    NLK, load_kv, store_kv = _tiles.make_pair_loader(BC, DP, NT, SQ, QUIET_NAN=True, SWIZZLE=SWZ)
    n_key_blocks, _ = _tiles.make_block_counts(BR, BC, CAUSAL)
    split, _, _, _ = ptx.make_warp_ops(SIM)
    mma3_add = make_mma3_add(SIM)
    split_nan = ptx.make_split_keep_nan(SIM)  # Dev: Q_i tau log2 e's NaN is 0x7fffffff, which split would make -0.0
    mma_score_products_wide = make_score_products_wide(MW, NB, KD, SQ, SIM, False)
    dq_k_step = make_dq_k_step(MW, 16, ND, SD, int(OFF_DS), SQ, WIDE, SIM)
    row_stats = _regtile.make_row_stats(FROM_LSE)
    store_dq = make_row_store(ND, False, False)
    QNAN = _tiles.QNAN

    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, tau, c1, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32)  # Q_i, dO_i, K_j, V_j, tau dS_ij; offsets OFF_*
        sx = cuda.shared.array(SXN, float32)  # the simulator's lane-exchange scratch (unused on a GPU)
        tau = float32(tau)
        c1 = float32(c1)
        dropout_scale = float32(dropout_scale)
        rS = cuda.local.array(NS, float32)  # S_ij, then P_ij
        rdP = cuda.local.array(NS, float32)  # dP_ij, then tau dS_ij
        rdQ = cuda.local.array(NO, float32)
        rAb = cuda.local.array(NA, uint32)  # A operands (tf32 big / small): Q_i, then dS
        rAs = cuda.local.array(NA, uint32)
        rA2b = cuda.local.array(NA, uint32)  # dO_i
        rA2s = cuda.local.array(NA, uint32)
        rM = cuda.local.array(NR, float32)
        rIL = cuda.local.array(NR, float32)
        rD = cuda.local.array(NR, float32)
        rkey = cuda.local.array(NR, uint64)
        rQn = cuda.local.array(NLQ, float32)
        rdOn = cuda.local.array(NLQ, float32)
        rKn = cuda.local.array(NLK, float32)
        rVn = cuda.local.array(NLK, float32)

        tid, lane, warp, g, t = backward_steps.lane_coords()
        nheads = gQ.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        d = gQ.shape[3]
        b, h, past = backward_steps.query_block_head(gQ.shape[0], nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if past:
            return  # Dev: past b*h in the last z slab of the fold
        ub, uh, uhk = U(b), U(h), U(h // group)
        i = cuda.gridDim.x - 1 - cuda.blockIdx.x  # Dev: the heaviest (causal) blocks first
        row0 = i * BR
        wrow = U(16 * MW) * U(warp)
        wbase = warp * SCR  # this warp's share of the simulator's scratch (unused on a GPU)
        load_q(gQ, gdO, ub, uh, row0, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d
        store_q(smem, OFF_Q, OFF_DO, tid, rQn, rdOn)
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
        for j in range(n_blocks):
            col0 = j * BC
            load_kv(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
            cuda.syncthreads()  # Sync: K_{j-1}, V_{j-1} read by all (and Q_i, dO_i stored) before the stores
            store_kv(smem, OFF_K, OFF_V, tid, rKn, rVn)
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before they are read
            # FA2.2 L10: S_ij = Q_i K_j^T (as the forward: A = Q_i tau log2 e, B = K_j, 3xTF32, each d step staged);
            # FA2.2 L13: dP_ij = dO_i V_j^T (the same with dO_i, V_j)
            if WIDE:  # Dev: the k steps of the forward's WIDE (16-byte loads, columns paired)
                mma_score_products_wide(smem, smem, OFF_Q, OFF_DO, OFF_K, OFF_V, wrow, U(0), g, t, c1, rS, rdP, sx, wbase, lane)
            for a in range(0 if WIDE else NS):
                rS[a] = ZERO
                rdP[a] = ZERO
            for ks in range(0 if WIDE else KD):
                for mt in range(MW):
                    q0 = (wrow + U(16 * mt) + g) * uSQ + U(8 * ks) + t
                    for c in range(4):  # a = (Q[g, t], Q[g+8, t], Q[g, t+4], Q[g+8, t+4])
                        off = q0 + U(8 * (c % 2)) * uSQ + U(4 * (c // 2))
                        rAb[mt * 4 + c], rAs[mt * 4 + c] = split_nan(smem[OFF_Q + off] * c1)
                        rA2b[mt * 4 + c], rA2s[mt * 4 + c] = split(smem[OFF_DO + off])
                for nt in range(NB):
                    k0 = (U(8 * nt) + g) * uSQ + U(8 * ks) + t  # b = (K[g, t], K[g, t+4])
                    kb0, ks0 = split(smem[OFF_K + k0])
                    kb1, ks1 = split(smem[OFF_K + k0 + U(4)])
                    vb0, vs0 = split(smem[OFF_V + k0])
                    vb1, vs1 = split(smem[OFF_V + k0 + U(4)])
                    for mt in range(MW):
                        f = (mt * NB + nt) * 4
                        mma3_add(rAb, rAs, mt, (kb0, kb1), (ks0, ks1), rS, f, sx, wbase, lane)
                        mma3_add(rA2b, rA2s, mt, (vb0, vb1), (vs0, vs1), rdP, f, sx, wbase, lane)
            # FA2.2 L11: P_ij = exp(S_ij - L_i) as exp2(S' - M_i) / l_i, masked
            # FA2.2 L14: tau dS_ij = tau P_ij o (dP_ij o Z_ij - D_i)
            masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
            for mt in range(MW):
                for nt in range(NB):
                    for c in range(4):
                        f = (mt * NB + nt) * 4 + c
                        r = mt * 2 + c // 2
                        row = row0 + int(wrow) + 16 * mt + 8 * (c // 2) + int(g)
                        col = col0 + 8 * nt + 2 * int(t) + c % 2
                        p = math.exp2(cap_nan(rS[f] - rM[r], CAP)) * rIL[r]
                        if masked:
                            if col >= s_k or (CAUSAL and col > row + causal_offset):
                                p = ZERO
                        dp = rdP[f]
                        if DROPOUT:
                            dp = dp * (dropout_scale if keep(rkey[r], col, threshold) else ZERO)
                        ds = tau * (p * (dp - rD[r]))
                        smem[OFF_DS + (wrow + U(16 * mt + 8 * (c // 2)) + g) * uSD + U(8 * nt + c % 2) + U(2) * t] = ds if ds == ds else QNAN
            if SIM:
                cuda.syncthreads()  # Sync: (simulator) dS rows in SRAM before L15 reads them
            else:
                cuda.syncwarp(0xFFFFFFFF)  # Sync: this warp's dS rows in SRAM; L15 reads only those
            # FA2.2 L15: dQ_i += tau dS_ij K_j -- A = this warp's dS rows, B = K_j, the 8 keys of a k step in the order
            # 2t, 2t + 1 (K_j rows 2t, 2t + 1: bank 8t + g); each k step staged; Dev: deterministic: a fixed order
            for nt in range(NB):
                dq_k_step(smem, OFF_K, nt, wrow, 0, g, t, rAb, rAs, rdQ, sx, wbase, lane)  # the warp's rows, every column
        for r in range(NR):
            mt, hf = r // 2, r % 2
            row = row0 + int(wrow) + 16 * mt + 8 * hf + int(g)
            if row < s_q:
                store_dq(gdQ, rdQ, gdQ, rdQ, ub, row, uh, d, mt * ND * 4 + 2 * hf, t, c1)  # HBM write: Br*d

    return kernel


def default_features() -> dict:
    """``RED2``: add the dQ fragments with ``red.global.add.v2.f32`` (two columns per instruction); None: on compute
    capability 9.0+ at even head dims (8-byte aligned rows). ``CP_ASYNC``: the main kernel's Q_i, dO_i by
    ``cp.async`` into two SRAM stages where :func:`numba_flash.tensorcore.fa2_forward_tf32.cp_async_ok` and Q, dO are
    16-byte aligned; None: at ``d <= 64``, where an H100 sweep timed the backward 1.03-1.05x faster at the
    default tiling and 1.04-1.11x causal; above, the default tiling's two stages do not fit (236 KB) and the
    tilings they fit ran 0.89-1.01x (``docs/results/sweeps/tf32_bwd_cp_h100.json``, the performance log).
    ``WIDE``: ``S`` (and ``dP``) in the order of the 3xTF32 forward's ``WIDE`` (:func:`make_score_products_wide`), which
    the backward must follow to recompute the forward's ``S`` bit for bit; None: as the forward on the same K, V
    (:func:`numba_flash.tensorcore.fa2_forward_tf32.wide_for`: above d = 64). Only where the padded d is a multiple of 32. With
    it ``CP_ASYNC`` None is on at d = 128 too: the unpadded rows fit two stages of the default tiling (225.8 KB), and
    an H100 ran that backward 1.04-1.06x faster than the former default, causal 0.99-1.01x, while ``WIDE`` on the
    register path ran 0.94-0.98x (``docs/results/sweeps/wide_bwd_h100_86d63ca.json``).
    ``HEAVY_FIRST``: with causal, the heaviest key blocks of every head start first
    (:func:`numba_flash.fast._tiles.make_key_block_order`): on an H100 the causal d = 128 backward ran 1.03x faster
    at N 1k and 1.05x at 4k (6.772 -> 6.559 ms, 22.463 -> 21.295; the non-causal rows, the same kernel, within 0.6 %;
    ``docs/results/sweeps/heavy_first_h100_827b946_tf32.json``). The half backward has it off.
    ``DQ_UNROLL``: the atomic dQ product's 8-key k steps (line 15) this many to a pass of its loop, in the same order
    and with the same staging (the same bits): two or four steps' ``mma`` chains in flight instead of one step's
    ``NDW`` (4 at the default tilings). None: 4 above d = 64 where 4 divides the block's ``Bc / 8`` k steps, else 1
    (:func:`dq_unroll_for`). On an H100 the d = 128 backward ran 1.005-1.06x faster with 4 in all 12 cells of two rounds
    (N 1k / 4k / 16k, causal and not), 7 of them by 2 % or more; at d = 64, 4 ran 0.99-1.03x and 2 0.99-1.02x, short of
    the rule set before the run (``docs/results/sweeps/dq_unroll_h100_86e8f49.json``, the performance log's section
    "3xTF32 backward: the dQ product's k steps in pairs").
    ``KV_ASYNC``: the main kernel's ``K_j, V_j`` by ``cp.async`` too (:func:`fa2_backward_tf32_kernel`), never off the
    ``cp.async`` path nor where K or V rows are not 16-byte aligned; None: above d = 64 (:func:`kv_async_for`).
    ``SPLIT_QDO``: ``Q_i, dO_i`` split into their tf32 parts once per step in SRAM (:func:`fa2_backward_tf32_kernel`),
    only with ``WIDE`` on the ``cp.async`` path (:func:`split_qdo_on`); None: on from ``seqlen_q`` =
    :data:`SPLIT_QDO_SEQLEN`.
    ``QDO_PAIRS``: with ``SPLIT_QDO``, its parts stored as the A-fragment quads of row pairs (:func:`fa2_backward_tf32_kernel`);
    None: wherever ``SPLIT_QDO`` runs (:func:`qdo_pairs_on`)."""
    return {"RED2": None, "CP_ASYNC": None, "HEAVY_FIRST": True, "WIDE": None, "DQ_UNROLL": None,
            "KV_ASYNC": None, "SPLIT_QDO": None, "QDO_PAIRS": None}


#: Query lengths from which ``SPLIT_QDO`` (with ``QDO_PAIRS``) is on by default. Alone, with its 16-byte stores, it ran the
#: d = 128 backward 1.009-1.038x on an H100 (``docs/results/sweeps/split_qdo_16b_h100_e2df55b.json``), at least 1.02x in
#: both rounds (the rule) only at 16k. With ``QDO_PAIRS``, 1.11-1.18x the backward without either (one outlier round
#: 1.44x) in every cell of two rounds, causal and not: N 1k and 4k on an H100 (``qdo_pairs_h100_8da26c3.json``), 8k and
#: 16k on an H200 (``qdo_pairs_long_h200_5cae1b0.json``); 2k lies between, 512 was not timed.
SPLIT_QDO_SEQLEN = 1024


def split_qdo_on(value, cp_async: bool, wide: bool, seqlen_q: int = 0) -> bool:
    """``SPLIT_QDO`` resolved: never off the ``cp.async`` path or without ``WIDE`` (its split pass replaces the NaN pass
    of the ``cp.async`` copies, and its products are ``WIDE``'s); there ``bool(value)``, None: from ``seqlen_q`` =
    :data:`SPLIT_QDO_SEQLEN`."""
    if not (cp_async and wide):
        return False
    return bool(value) if value is not None else seqlen_q >= SPLIT_QDO_SEQLEN


def qdo_pairs_on(value, split_qdo: bool) -> bool:
    """``QDO_PAIRS`` resolved: only with ``SPLIT_QDO`` (``split_qdo``, resolved); there ``bool(value)``, None: on. The same
    bits as ``SPLIT_QDO`` alone, and 1.09-1.20x faster than it in every cell timed (:data:`SPLIT_QDO_SEQLEN`)."""
    return split_qdo and (value is None or bool(value))


def kv_async_for(DP: int, cp_async: bool, value=None) -> bool:
    """``KV_ASYNC`` resolved for a padded head dim ``DP`` on the main kernel's ``cp.async`` path or not: ``value`` if given
    (:func:`numba_flash.fast._plan.async_on`), else on where ``DP > 64``. At d = 128 the register load of ``K_j, V_j``
    sat in local memory (64 HBM round trips in a row a block) and an H100 ran the backward alone 1.006-1.14x faster with
    ``cp.async`` in 13 of 14 cells of N 1k / 4k, causal and not (one at 0.91x, then 1.01-1.09x in three more rounds of
    that cell); at d = 64 the register load was not in local memory, and it ran 0.96-1.005x
    (``docs/results/sweeps/kv_async_h100_e2e04dd.json``, ``kv_async_1k_d128_h100_e2e04dd.json``)."""
    if value is not None:
        return _plan.async_on(value, cp_async)
    return cp_async and DP > 64


def dq_unroll_for(DP: int, BC: int, value=None) -> int:
    """``DQ_UNROLL`` resolved for a padded head dim ``DP`` and ``BC`` keys a block: ``value`` if given, else 4 where
    ``DP > 64`` and 4 divides the ``BC / 8`` k steps of ``dS K_j``, else 1 (:func:`default_features`)."""
    if value is not None:
        return int(value)
    return 4 if DP > 64 and (BC // 8) % 4 == 0 else 1


def features_for(d: int, features=None, forward_wide: bool = False) -> dict:
    """:func:`default_features` updated with ``features``, resolved for head dim ``d``: ``WIDE=None`` as the forward
    (``forward_wide``: :func:`numba_flash.tensorcore.fa2_forward_tf32.wide_for`), off where the padded d is not a multiple of
    32; ``CP_ASYNC=None`` on at d <= 64 and with ``WIDE``; ``KV_ASYNC`` as :func:`kv_async_for` on that ``cp.async`` path
    (so :func:`backward` reads K and V's alignment only where ``KV_ASYNC`` would run)."""
    f = _plan.checked_features(default_features(), features)
    DP = _plan.padded_headdim(d)
    f["WIDE"] = bool(forward_wide if f["WIDE"] is None else f["WIDE"]) and fa2_forward_tf32.wide_ok(DP)
    if f["CP_ASYNC"] is None:
        f["CP_ASYNC"] = DP <= 64 or f["WIDE"]
    f["KV_ASYNC"] = kv_async_for(DP, bool(f["CP_ASYNC"]) and fa2_forward_tf32.cp_async_ok(d), f["KV_ASYNC"])
    return f


def plan(prob: Problem, block_sizes=None, config=None, features=None, deterministic=False, from_lse=False):
    """(main kernel, main grid, dQ kernel or None, dQ grid, threads, SRAM bytes of each), without launching. ``WIDE``
    None follows the forward on 16-byte aligned K, V (:func:`backward` resolves it on its arrays)."""
    if not handles(prob):
        raise ValueError(f"the 3xTF32 backward runs float32 kernel arrays with a head dim <= {TF32_MAX_HEADDIM}; "
                         f"got {prob.dtype} and headdim {prob.headdim}")
    d = prob.headdim
    NW, MW, BR, DP = config if config is not None else config_for(d, block_sizes, prob.causal)
    feats = features_for(d, features, fa2_forward_tf32.wide_for(prob))
    sim = _backend.is_simulator()
    BC = 16 * MW * NW
    cp_async = bool(feats["CP_ASYNC"]) and fa2_forward_tf32.cp_async_ok(d)  # Dev: d % 4 != 0: the register path
    wide = feats["WIDE"]
    if cp_async and 4 * smem_floats(NW, MW, BR, DP, 2, wide) > _smem.max_optin_bytes():
        cp_async = False  # Dev: two stages of these tiles do not fit (e.g. larger block_sizes at d = 128): one stage
    nbytes = 4 * smem_floats(NW, MW, BR, DP, 2 if cp_async else 1, wide)
    _plan.check_sram(nbytes, BR, BC, d)
    dropout = prob.dropout_p > 0
    red2 = feats["RED2"]
    if red2 is None:
        red2 = not sim and _backend.device_facts().compute_capability >= (9, 0)
    red2 = bool(red2) and d % 2 == 0  # Dev: red.v2 needs 8-byte aligned pairs: rows of d floats, d even
    split_qdo = split_qdo_on(feats["SPLIT_QDO"], cp_async, wide, prob.seqlen_q)
    main = fa2_backward_tf32_kernel(NW, MW, BR, DP, prob.causal, dropout, not deterministic, sim,
                                    bool(from_lse), red2, cp_async, prob.causal and bool(feats["HEAVY_FIRST"]), wide,
                                    dq_unroll_for(DP, BC, feats["DQ_UNROLL"]), kv_async_for(DP, cp_async, feats["KV_ASYNC"]),
                                    split_qdo, qdo_pairs_on(feats["QDO_PAIRS"], split_qdo))
    grid = bh_grid(ceil_div(prob.seqlen_k, BC), prob.batch * prob.nheads_k)
    dq = None
    NWq, MWq, BCq, _ = dq_config(d)
    BRq = 16 * MWq * NWq
    nbytes_dq = 4 * smem_floats_dq(NWq, MWq, BCq, DP, wide)
    if deterministic:
        _plan.check_sram(nbytes_dq, BRq, BCq, d)
        dq = fa2_backward_tf32_dq_kernel(NWq, MWq, BCq, DP, prob.causal, dropout, sim, bool(from_lse), wide)
    return main, grid, dq, bh_grid(ceil_div(prob.seqlen_q, BRq), prob.batch * prob.nheads), (32 * NW, 32 * NWq), (nbytes, nbytes_dq)


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the main kernel's tiles: :func:`config_for` rounds an override to the tiling."""
    NW, MW, BR, _ = config_for(prob.headdim, block_sizes, prob.causal)
    return BR, 16 * MW * NW


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block of the main kernel, in bytes."""
    return plan(prob, block_sizes)[5][0]


def compiled_kernels(prob: Problem, block_sizes=None, deterministic=False) -> list[KernelLaunch]:
    """The main kernel (and the deterministic dQ kernel), compiled for ``prob`` (not launched)."""
    main, grid, dqk, grid_dq, (nt, nt_dq), _ = plan(prob, block_sizes, deterministic=deterministic)
    BR, BC = choose_block_sizes(prob, block_sizes)
    out = [KernelLaunch(f"FA2 backward tensor cores 3xTF32 (Br, Bc) = ({BR}, {BC})", main, nt, math.prod(grid))]
    if deterministic:
        out.append(KernelLaunch("FA2 backward tensor cores 3xTF32 dQ", dqk, nt_dq, math.prod(grid_dq)))
    return out


def backward(dout, q, k, v, out, fwd, prob: Problem, alloc, block_sizes=None, deterministic=False, config=None, features=None):
    """FA2 Algorithm 2 on the tensor cores (3xTF32), on float32 kernel arrays: ``(dq, dk, dv)`` (dk, dv summed
    over each GQA group); dq by atomic adds or, with ``deterministic``, by :func:`fa2_backward_tf32_dq_kernel`."""
    from_lse = fwd.m is None or fwd.l is None
    # Dev: S in the order the forward summed it on these K, V; cp.async of Q, dO rows where they are aligned
    features = features_for(prob.headdim, features, fa2_forward_tf32.wide_for(prob, k, v))
    features = _plan.register_path_if_unaligned(features, {}, q, dout)
    features = _plan.registers_if_unaligned(features, {}, "KV_ASYNC", k, v)  # Dev: cp.async of K, V rows
    kernels = plan(prob, block_sizes, config, features, deterministic, from_lse)
    # FA2.2 L20: return dQ, dK, dV -- after line 4's D, line 3's gradients and the launches (device.backward_launch)
    return launch_fa2_backward(kernels, _prepass, _allocate_grads, dout, q, k, v, out, fwd, prob, alloc, deterministic, from_lse)
