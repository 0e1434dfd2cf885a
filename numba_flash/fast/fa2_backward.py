"""FlashAttention-2 Algorithm 2, the fast kernel: register-blocked tiles, one block per K/V block.

Paper: Dao, "FlashAttention-2", Algorithm 2 ([FA2-ICLR] Appendix A). Same algorithm, semantics and
paper tags as the readable kernel :mod:`numba_flash.fa2_backward` (read that one first); this file
changes *who computes what* so that the arithmetic units are fed, the way
:mod:`numba_flash.fast.fa2_forward` does for the forward.

What changed from the readable kernel, and why
----------------------------------------------
* **Register blocking of all five matmuls.** The readable kernel gives each thread one key row, so
  every multiply-add needs one shared-memory load and the ``d`` numbers of its ``dK_j, dV_j`` rows
  live in local memory. Here each matmul has its own thread -> tile map (its output shape differs):

  - ``S_ij = Q_i K_j^T`` and ``dP_ij = dO_i V_j^T`` (L10, L13): a ``TM x TN`` tile of each per thread
    (``TPR`` lanes of a half-warp share ``TM`` query rows), 16-byte loads along ``d``;
  - ``dV_j += P^T dO_i`` and ``dK_j += dS^T Q_i`` (L12, L16): a ``TC x (4 DVX)`` tile of each per
    thread, *held in registers for the whole kernel* (the accumulators of line 7), an outer product
    over the query rows of the block (16-byte loads of a row of ``P``, ``dS``, ``dO_i``, ``Q_i``);
  - ``dQ_i += dS K_j`` (L15): a ``TM2 x DX2`` tile per thread, then one atomic add per element,
    16 lanes on 16 consecutive floats of a row (coalesced atomics).
* **No row reductions, no shuffles.** Unlike the forward, the backward needs no row max or row sum:
  ``P = exp2(S' - M_i) / l_i`` from the forward's saved ``m_i`` (``M_i = m_i log2 e``) and ``l_i``,
  with ``S'`` recomputed in base 2 exactly as the forward computed it (``Q`` times ``tau log2 e``, one
  FMUL per Q value read, the forward's order of FMAs): ``exp(S tau - L)`` inherits the rounding of
  ``L`` and of the other units, which sharp softmaxes magnify past the error rule
  (:func:`numba_flash.fast._regtile.make_s_dp_p_ds`, docs/backward.rst "Large logits"). ``D_i``
  comes from the pre-pass (L4). The scale ``tau`` is folded into ``dS`` once, so line 15 and line 16
  need no extra multiply.
* **Q_i, dO_i prefetched.** The loads of ``Q_{i+1}, dO_{i+1}, m_{i+1}, l_{i+1}, D_{i+1}`` are issued into
  registers before the compute on ``Q_i, dO_i`` (double buffering in registers, as the forward's
  K/V prefetch), all loads of a tile unrolled (one memory round trip per tile).
* **More than 48 KB of SRAM** (:mod:`numba_flash.runtime.smem`): ``Q_i, dO_i, K_j, V_j`` and ``P_ij, dS_ij``
  at 64 x 128, ``d = 64`` are 168.5 KB per block.
* **The deterministic path is fast too.** ``deterministic=True`` leaves the atomics out of the main
  kernel and runs :func:`fa2_backward_fast_dq_kernel`, one block per *query* block (FA2's forward
  geometry) that recomputes ``S, dP, dS`` tile by tile with the same register tiling and keeps
  ``dQ_i`` in registers: a fixed summation order, bitwise reproducible. ``dK, dV`` come from the
  same main kernel in both modes, so they are bitwise equal across the two.

What it bought (one H200, fp32, FA2 convention ``b * N = 16k``, d = 64, N = 4096, 32 heads, batch 4;
CUDA-event medians; the log with predictions is ``docs/notes/performance-log.md`` "FA2 backward"):

=====================================================  ==============  ==============
version (d = 64, non-causal, backward only)            ms              TFLOP/s
=====================================================  ==============  ==============
readable kernel (:mod:`numba_flash.fa2_backward`)      508.0           2.7
register-blocked, 64 x 64 (186 regs, 1 block/SM)       57.6            23.8
64 x 128 (half the dQ atomics; the d <= 64 default)    47.5            28.9 (57% SGEMM)
deterministic (64 x 64, + the dQ kernel)               78.2            17.6
=====================================================  ==============  ==============

Forward + backward (fast forward + this backward, committed run ``docs/results/fa2_h200.json``):
65.8 ms at N = 4096 (29.2 TFLOP/s, 61% of SGEMM) against 524 ms with the readable backward, torch naive
fp32 66.1 ms and SDPA memory-efficient fp32 54.6 ms: **0.83x SDPA** (0.81x at N = 2048, 0.78x at
N = 1024). d = 128 (64 x 64, 253 regs, 1 block/SM): 52.0 ms, 26.4 TFLOP/s. Levers that did *not* pay:
the Q/dO register prefetch (no change once two blocks share an SM). These numbers were measured with
``P = exp2(S tau log2 e - L log2 e)``; P is now ``exp2(S' - M) / l`` with ``S'`` from ``Q tau log2 e``
(accuracy with large logits, see the log), not yet re-timed.

Launch geometry
---------------
pre-pass (``D``): as the readable module. Main kernel: grid ``(Tc, batch * nheads_k)``, block ``NT``
threads; block ``(j, b h_k)`` owns key rows ``j Bc .. j Bc + Bc - 1`` of KV head ``h_k`` and loops
over the ``G`` query heads of its group and the visible query blocks ``i`` (one flat loop, so the
prefetch crosses head boundaries; with ``HEAD_SUMS`` each head's ``dK_j, dV_j`` is added to the group's sum in HBM at
the head's last block). Deterministic dQ kernel: grid ``(Tr, batch * nheads)``.

Thread maps (``tid`` in ``0..NT-1``):

* S/dP: ``rg = tid // TPR``, ``tc = tid % TPR``; rows ``rg + RG a`` (``a < TM``, ``RG = NT / TPR``),
  columns ``tc + TPR b`` (``b < TN = Bc / TPR``).
* dK/dV: ``cy = tid // XT``, ``tx = tid % XT``; key rows ``CW cy + CW CG q + u`` (``CG = NT / XT``,
  ``CW = 4`` or 1), columns ``4 tx + 4 XT e + w`` (``e < DVX``).
* dQ: ``rg2 = tid // TPR2``, ``tc2 = tid % TPR2``; rows ``rg2 + RG2 a`` (``a < TM2``), columns
  ``tc2 + TPR2 e`` (``e < DX2``).

``d`` is padded to ``DP``, a multiple of 16 (zero columns).

SRAM budget (float32 elements, one dynamic array): ``sQ_i, sdO_i`` 2 Br (DP+4) + ``sK_j, sV_j``
2 Bc (DP+4) + ``sP_ij, sdS_ij`` 2 Br (Bc+4) + ``m_i log2 e, D_i, 1/l_i`` 3 Br. Defaults: d <= 64, 64 x 128:
43,200 floats = 168.8 KB (1 block of 8 warps per SM, 248 registers); d = 128, 64 x 64: 166.5 KB
(1 block/SM, 253 registers). 64 x 64 at d = 64 is 102.5 KB (2 blocks/SM if capped at 128 registers).

Run it::

    >>> import numpy as np
    >>> from numba_flash.api import attention_numpy, attention_backward_numpy
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 20, 1, 8)).astype(np.float32)
    >>> out, st = attention_numpy(q, k, v, causal=True, algorithm="flash2", return_stats=True)
    >>> [g.shape for g in attention_backward_numpy(np.ones_like(q), q, k, v, out, st)]  # doctest: +SKIP
    [(1, 20, 1, 8), (1, 20, 1, 8), (1, 20, 1, 8)]
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

from .._launch import KernelLaunch, Problem, bh_grid, ceil_div
from ..device.backward_launch import launch_fa2_backward
from ..device.constants import U
from ..device.dropout import head_key, row_key
from ..device.grid import folded_kv_head, folded_query_head
from ..device.prepass import allocate_grads
from ..runtime import backend as _backend
from . import _plan, _regtile, _tiles
from . import _prepass as _prepass_kernel


def _pow2_divisor(n: int, cap: int) -> int:
    """The largest power of two <= cap dividing n."""
    p = 1
    while p * 2 <= cap and n % (p * 2) == 0:
        p *= 2
    return p


@functools.cache
def config_for(d: int, block_sizes=None, nt=None):
    """The tiling ``(NT, BR, BC, DP)`` for head dim ``d``.

    Defaults (chosen by the sweep bench/fa2_bwd_sweep.py on an H200, see
    docs/notes/performance-log.md): 256 threads; ``d <= 64``: ``Br = 64, Bc = 128`` (a 4 x 8 S/dP
    tile and an 8 x 4 dK/dV tile per thread, half the dQ atomics and Q_i/dO_i loads per FLOP of
    64 x 64); ``64 < d <= 128``: ``Br = Bc = 64`` (``Bc = 128`` does not fit the SRAM at d = 128);
    ``d > 128`` (not measured on a GPU yet): ``Br = Bc = 32``, so the registers a thread holds (the Q/dO
    prefetch, the dQ tile, the dK/dV tiles) stay about those of d = 128 (139 KB of SRAM at d = 256;
    64 x 64 would need 290 KB). ``block_sizes=(Br, Bc)`` is rounded up to multiples of 16;
    the thread count is then ``min(256, max(64, Br Bc / 16))`` (so each thread holds 16 entries of S)
    unless ``nt`` is given. ``DP`` = ``d`` rounded up to a multiple of 16 (of 32 above ``d = 128``).
    """
    DP = 16 * ((d + 15) // 16) if d <= 128 else 32 * ((d + 31) // 32)  # Dev: above 128, the 32 x 32 thread maps need DP / 4 % 8 == 0
    if block_sizes is None:
        BR, BC = (64, 128) if DP <= 64 else (64, 64) if DP <= 128 else (32, 32)
        NT = 256 if nt is None else nt
    else:
        BR, BC = (16 * ((int(n) + 15) // 16) for n in block_sizes)
        NT = min(256, max(64, BR * BC // 16)) if nt is None else nt
    return int(NT), int(BR), int(BC), int(DP)


def derived(NT, BR, BC, DP):
    """The register tiling derived from ``(NT, BR, BC, DP)`` (see the module docstring); raises if invalid."""
    TPR = 16 if BC % 16 == 0 else _pow2_divisor(BC, 16)
    RG = NT // TPR
    XT = _pow2_divisor(DP // 4, 16)
    CG = NT // XT
    TPR2 = 16
    RG2 = NT // TPR2
    ok = NT % 32 == 0 and NT % TPR == 0 and BR % RG == 0 and BC % CG == 0 and BR % RG2 == 0 and DP % 16 == 0
    if not ok or NT > 1024:
        raise ValueError(f"fast FA2 backward: tiles Br={BR}, Bc={BC} (d padded to {DP}) do not fit {NT} threads")
    TC = BC // CG
    CW = 4 if TC % 4 == 0 else 1
    return dict(TPR=TPR, RG=RG, TM=BR // RG, TN=BC // TPR, XT=XT, CG=CG, TC=TC, CW=CW, DVX=DP // (4 * XT),
                TPR2=TPR2, RG2=RG2, TM2=BR // RG2, DX2=DP // TPR2)


def smem_floats(NT, BR, BC, DP):
    """Dynamic SRAM of the main (and the dQ) kernel in float32 elements."""
    return 2 * BR * (DP + 4) + 2 * BC * (DP + 4) + 2 * BR * (BC + 4) + 3 * BR


def _split(prob: Problem, cfg):
    """FA2.2 lines 1-2: block sizes and block counts."""
    NT, BR, BC, DP = cfg
    # FA2.2 L1: split Q into Tr = ceil(N_q / Br) blocks Q_i; K, V into Tc = ceil(N_k / Bc) blocks K_j, V_j
    Tr = ceil_div(prob.seqlen_q, BR)
    Tc = ceil_div(prob.seqlen_k, BC)
    # FA2.2 L2: split O, dO and L into Tr blocks (the row ranges of Q_i)
    return Tr, Tc


def _allocate_grads(prob: Problem, alloc, deterministic: bool):
    # FA2.2 L3: dQ = (0) in HBM (the atomic adds need zeros; the deterministic kernel writes every row); dK, dV: Tc blocks
    return allocate_grads(prob, alloc, deterministic)  # numba_flash.device.prepass, shared with the other FA2 backward


def _prepass(out, dout, prob: Problem, alloc):
    # FA2.2 L4: D_i = rowsum(dO_i o O_i), a separate pre-pass (numba_flash.fast._prepass: a warp per row)
    return _prepass_kernel.row_dot(out, dout, prob, alloc)


@functools.cache
def _device_functions(NT, BR, BC, DP, CAUSAL, DROPOUT):
    """The inline device functions shared by the main and the dQ kernel (tile loads, S/dP/P/dS, dQ tile)."""
    g = derived(NT, BR, BC, DP)
    TPR, RG, TM, TN, TPR2, RG2, TM2, DX2 = (g[k] for k in ("TPR", "RG", "TM", "TN", "TPR2", "RG2", "TM2", "DX2"))
    SQ = DP + 4  # row stride (floats) of the Q_i, dO_i, K_j, V_j tiles
    SP = BC + 4  # row stride of the P and dS tiles
    uSQ, uSP, uRG2, uTPR2 = U(SQ), U(SP), U(RG2), U(TPR2)
    U4 = U(4)
    # Offsets (floats) of the tiles in the one dynamic SRAM array `smem` (both kernels):
    OFF_Q = U(0)  # Q_i: (Br, SQ), zero-padded to DP columns and past N_q
    OFF_DO = U(BR * SQ)  # dO_i: (Br, SQ)
    OFF_K = U(2 * BR * SQ)  # K_j: (Bc, SQ)
    OFF_V = U(2 * BR * SQ + BC * SQ)  # V_j: (Bc, SQ)
    OFF_P = U(2 * BR * SQ + 2 * BC * SQ)  # P_ij o Z_ij: (Br, SP)
    OFF_DS = U(2 * BR * SQ + 2 * BC * SQ + BR * SP)  # tau dS_ij: (Br, SP)
    OFF_M = U(2 * BR * SQ + 2 * BC * SQ + 2 * BR * SP)  # M_i: (Br,), the forward's base-2 row max (row_stats)
    OFF_D = U(2 * BR * SQ + 2 * BC * SQ + 2 * BR * SP + BR)  # D_i: (Br,)
    OFF_IL = U(2 * BR * SQ + 2 * BC * SQ + 2 * BR * SP + 2 * BR)  # 1/l_i: (Br,) (0 past N_q or with no key: P = 0)
    NK4 = DP // 4  # 4-column steps of Q K^T and dO V^T (16-byte loads)
    NC4 = BC // 4  # 4-key steps of dS K (line 15)

    # Q_i, dO_i (Br rows) and K_j, V_j (Bc rows): HBM -> registers (NLQ / NLK floats each per thread) -> SRAM
    NLQ, load_q, store_q = _tiles.make_pair_loader(BR, DP, NT, SQ)
    NLK, load_k, store_k = _tiles.make_pair_loader(BC, DP, NT, SQ)
    n_key_blocks, first_row_block = _tiles.make_block_counts(BR, BC, CAUSAL)

    # S, dP, P = exp2(S - M_i) / l_i, P o Z and tau dS of one (i, j) step; shared with the FA1 backward twin
    s_dp_p_ds = _regtile.make_s_dp_p_ds(TM, TN, NK4, RG, TPR, SQ, SP, BC, OFF_Q, OFF_DO, OFF_K, OFF_V, OFF_P, OFF_DS,
                                        OFF_M, OFF_D, OFF_IL, CAUSAL, DROPOUT)

    @cuda.jit(device=True, inline="always")
    def dq_tile(smem, tid, rdQ, rds):
        """rdQ (TM2 x DX2 registers) += dS_ij K_j (tau is in dS already); K_j read with scalar loads."""
        rg2 = tid // uTPR2
        tc2 = tid % uTPR2
        for c4 in range(NC4):
            cc = U(c4) * U4
            for a in range(TM2):
                _regtile.load4(smem, OFF_DS + (rg2 + uRG2 * U(a)) * uSP + cc, rds, a)
            for cx in range(4):
                for e in range(DX2):
                    kv = smem[OFF_K + (cc + U(cx)) * uSQ + tc2 + uTPR2 * U(e)]
                    for a in range(TM2):
                        rdQ[a * DX2 + e] += rds[4 * a + cx] * kv

    def dq_writer(ATOMIC):
        @cuda.jit(device=True, inline="always")
        def write_dq(gdQ, ub, uh, row0, tid, s_q, d, rdQ):
            """rdQ (the dq_tile layout) to rows row0.. of dQ_i in HBM (ATOMIC: atomic adds), rows past N_q and columns
            past d skipped."""
            rg2 = tid // uTPR2
            tc2 = tid % uTPR2
            for a in range(TM2):
                row = row0 + int(rg2 + uRG2 * U(a))
                if row < s_q:
                    for e in range(DX2):
                        x = tc2 + uTPR2 * U(e)
                        if x < U(d):
                            if ATOMIC:
                                cuda.atomic.add(gdQ, (ub, U(row), uh, x), rdQ[a * DX2 + e])  # HBM read+write: Br*d
                            else:
                                gdQ[ub, U(row), uh, x] = rdQ[a * DX2 + e]  # HBM write: Br*d

        return write_dq

    offs = dict(OFF_Q=OFF_Q, OFF_DO=OFF_DO, OFF_K=OFF_K, OFF_V=OFF_V, OFF_P=OFF_P, OFF_DS=OFF_DS, OFF_M=OFF_M, OFF_D=OFF_D,
                OFF_IL=OFF_IL)
    return dict(NLQ=NLQ, NLK=NLK, load_q=load_q, store_q=store_q, load_k=load_k, store_k=store_k,
                n_key_blocks=n_key_blocks, first_row_block=first_row_block, s_dp_p_ds=s_dp_p_ds, dq_tile=dq_tile,
                add_dq=dq_writer(True), store_dq=dq_writer(False), offs=offs, g=g)


@functools.cache
def fa2_backward_fast_kernel(NT: int, BR: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, ATOMIC_DQ: bool, VEC: bool = True, PREFETCH: bool = True, FROM_LSE: bool = False,
                             HEAD_SUMS: bool = False):
    """The main (column-block) fast backward kernel: dK, dV, and with ``ATOMIC_DQ`` the atomic dQ adds.

    Kernel arguments: ``gQ, gdO (b, s_q, h, d)``, ``gK, gV (b, s_k, h_k, d)``, ``gm, gl, gD (b, h, s_q)``
    (the forward's ``m, l``; with ``FROM_LSE`` only ``L``, passed as ``gm``), outputs ``gdQ`` (zeros;
    unused without ``ATOMIC_DQ``), ``gdK, gdV (b, s_k, h_k, d)``; ``tau``, ``c1 = tau log2 e`` (the
    forward's Q scale: S is recomputed in base 2 as the forward computed it), ``group``,
    ``causal_offset``, dropout ``seed``, ``threshold``, ``dropout_scale``.
    ``VEC``: 16-byte aligned SRAM (16-byte loads; not in the simulator). ``PREFETCH``: issue the
    loads of ``Q_{i+1}, dO_{i+1}`` before the compute on ``Q_i, dO_i``.
    ``HEAD_SUMS`` (GQA): ``dK_j, dV_j`` summed a query head at a time in registers and the heads' sums added in
    HBM (:func:`default_features`).

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, dO, m, l, D      gQ, gK, .., gD       HBM (m, l from the forward; L alone with FROM_LSE)
    dQ, dK, dV                gdQ, gdK, gdV        HBM
    K_j, V_j                  smem[OFF_K/OFF_V]    SRAM (Bc, DP+4), loaded once (L6)
    dK_j, dV_j                rdK, rdV             registers, TC x 4 DVX per thread, whole kernel (L7)
    Q_i, dO_i                 smem[OFF_Q/OFF_DO]   SRAM (Br, DP+4), per inner step (L9); rQn, rdOn: next
    m_i log2 e, 1/l_i, D_i    smem[OFF_M/IL/D]     SRAM (Br,); Mval, ILval, Dval: next block (registers)
    S_ij, dP_ij               rS, rdP              registers, TM x TN per thread
    P_ij o Z_ij, tau dS_ij    smem[OFF_P/OFF_DS]   SRAM (Br, Bc+4)
    dQ_i (this step's part)   rdQ                  registers, TM2 x DX2 per thread, then atomics
    ========================  ===================  ==================================================
    """
    fns = _device_functions(NT, BR, BC, DP, CAUSAL, DROPOUT)
    g = fns["g"]
    TM, TC, CW, DVX, XT, CG, TM2, DX2 = (g[k] for k in ("TM", "TC", "CW", "DVX", "XT", "CG", "TM2", "DX2"))
    NLQ, NLK = fns["NLQ"], fns["NLK"]
    load_q, store_q, load_k, store_k = fns["load_q"], fns["store_q"], fns["load_k"], fns["store_k"]
    s_dp_p_ds, dq_tile, add_dq, first_row_block = fns["s_dp_p_ds"], fns["dq_tile"], fns["add_dq"], fns["first_row_block"]
    o = fns["offs"]
    OFF_Q, OFF_DO, OFF_K, OFF_V, OFF_P, OFF_DS, OFF_M, OFF_D, OFF_IL = (o[k] for k in ("OFF_Q", "OFF_DO", "OFF_K", "OFF_V", "OFF_P", "OFF_DS", "OFF_M", "OFF_D", "OFF_IL"))
    row_stats = _regtile.make_row_stats(FROM_LSE)
    SQ = DP + 4
    SP = BC + 4
    uXT, uBR = U(XT), U(BR)
    NQC = TC // CW  # chunks of CW key rows per thread in the dK/dV map
    dv_dk_update = _regtile.make_dv_dk_update(BR, NQC, CW, CG, DVX, XT, TC, SP, SQ, OFF_P, OFF_DS, OFF_DO, OFF_Q)
    store_dk_dv = _regtile.make_store_dk_dv(NQC, CW, CG, DVX, XT)
    add_dk_dv = _regtile.make_store_dk_dv(NQC, CW, CG, DVX, XT, ADD=True)
    TPR_, RG_ = g["TPR"], g["RG"]  # S/dP map: lanes per row group, row groups
    # Register-array sizes (local-array sizes must be plain constants):
    NS = g["TM"] * g["TN"]  # rS, rdP: the TM x TN tiles of S_ij, dP_ij
    NTM4, NDV4, NTM24 = TM * 4, DVX * 4, TM2 * 4  # rq/rdo: a 4-column step of TM rows; rov/rqv: 4 DVX columns; rds4
    NKV = TC * DVX * 4  # rdK, rdV: TC key rows x 4 DVX columns of dK_j, dV_j
    NQ2 = TM2 * DX2  # rdQ: TM2 rows x DX2 columns of dQ_i
    ALIGN = 16 if VEC else None
    ZERO = float32(0.0)

    # [doc:fa2-fast-bwd-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, gdK, gdV, tau, c1, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32, alignment=ALIGN)  # all tiles; offsets OFF_*
        tau = float32(tau)  # Dev: float32 scalars, so no float64 arithmetic creeps into the tile loops
        c1 = float32(c1)
        dropout_scale = float32(dropout_scale)
        rS = cuda.local.array(NS, float32)  # S_ij tile (registers)
        rdP = cuda.local.array(NS, float32)  # dP_ij tile (registers)
        rq = cuda.local.array(NTM4, float32)
        rdo = cuda.local.array(NTM4, float32)
        rkey = cuda.local.array(TM, uint64)
        rdK = cuda.local.array(NKV, float32)  # dK_j tile (registers, whole kernel)
        rdV = cuda.local.array(NKV, float32)  # dV_j tile (registers, whole kernel)
        rp = cuda.local.array(TC, float32)
        rds = cuda.local.array(TC, float32)
        rov = cuda.local.array(NDV4, float32)
        rqv = cuda.local.array(NDV4, float32)
        rdQ = cuda.local.array(NQ2, float32)  # this step's dQ_i tile (registers)
        rds4 = cuda.local.array(NTM24, float32)
        rQn = cuda.local.array(NLQ, float32)  # Q_i / Q_{i+1} in flight (registers)
        rdOn = cuda.local.array(NLQ, float32)
        rKn = cuda.local.array(NLK, float32)
        rVn = cuda.local.array(NLK, float32)

        tid = U(cuda.threadIdx.x)
        nheads, b, hk, s_q, s_k, d = folded_kv_head(gQ, gK)  # Dev: b*h_k folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0]:
            return  # Dev: past b*h_k in the last z slab of the fold
        ub, uhk = U(b), U(hk)
        cy = tid // uXT
        tx = tid % uXT
        # FA2.2 L5: for j = 1..Tc -- one thread block per (j, batch, KV head)
        j = cuda.blockIdx.x
        col0 = j * BC
        # FA2.2 L6: load K_j, V_j from HBM to SRAM (all loads in flight, then stored; ragged rows and padded columns zero)
        load_k(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
        store_k(smem, OFF_K, OFF_V, tid, rKn, rVn)
        # FA2.2 L7: dK_j = (0), dV_j = (0) on chip (registers)
        for a in range(NKV):
            rdK[a] = float32(0.0)
            rdV[a] = float32(0.0)
        # Dev: causal block skipping: row blocks before the first row that sees key col0 are fully masked
        i_first = first_row_block(col0, causal_offset)
        n_i = (s_q + BR - 1) // BR - i_first
        if n_i < 0:
            n_i = 0
        # Dev: GQA/MQA: the G query heads sharing K_j, V_j and their row blocks are one flat loop of steps
        # (head-major), so dK_j, dV_j are summed over the group in a fixed order and the prefetch crosses heads.
        n_steps = group * n_i
        Mval = ZERO
        ILval = ZERO
        Dval = ZERO
        if n_steps > 0:
            h0 = hk * group
            load_q(gQ, gdO, ub, U(h0), i_first * BR, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d (first step)
            if tid < uBR:
                row = i_first * BR + int(tid)
                Mval, ILval = row_stats(gm, gl, b, h0, row, s_q)  # HBM read: 2 Br
                if row < s_q:
                    Dval = gD[b, h0, row]
        # FA2.2 L8: for i = 1..Tr (times the G query heads of the group)
        for t in range(n_steps):
            h = hk * group + t // n_i
            i = i_first + t % n_i
            row0 = i * BR
            cuda.syncthreads()  # Sync: K_j, V_j stored (first step); Q, dO, P, dS of the previous step read by all before overwriting
            # FA2.2 L9: load Q_i, dO_i, L_i, D_i from HBM to SRAM (Dev: from the registers the previous step prefetched; not O_i;
            # Dev: L_i as the forward's m_i log2 e and 1/l_i, kept apart: exp2(S - M) / l is the forward's P to a few ulp, exp(S - L) is not)
            if not PREFETCH and t > 0:
                load_q(gQ, gdO, ub, U(h), row0, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d
                Dval = ZERO
                if tid < uBR:
                    Mval, ILval = row_stats(gm, gl, b, h, row0 + int(tid), s_q)  # HBM read: 2 Br
                    if row0 + int(tid) < s_q:
                        Dval = gD[b, h, row0 + int(tid)]
            store_q(smem, OFF_Q, OFF_DO, tid, rQn, rdOn)
            if tid < uBR:
                smem[OFF_M + tid] = Mval
                smem[OFF_IL + tid] = ILval
                smem[OFF_D + tid] = Dval
            cuda.syncthreads()  # Sync: Q_i, dO_i, L_i, D_i in SRAM before L10-L16 read them
            if PREFETCH and t + 1 < n_steps:
                hn = hk * group + (t + 1) // n_i
                rown = (i_first + (t + 1) % n_i) * BR
                load_q(gQ, gdO, ub, U(hn), rown, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d (step t+1)
                Dval = ZERO
                if tid < uBR:
                    Mval, ILval = row_stats(gm, gl, b, hn, rown + int(tid), s_q)  # HBM read: 2 Br
                    if rown + int(tid) < s_q:
                        Dval = gD[b, hn, rown + int(tid)]
            if DROPOUT:
                k_bh = head_key(seed, b * nheads + h)
                for a in range(TM):
                    rkey[a] = row_key(k_bh, row0 + int(tid // U(TPR_)) + RG_ * a)

            # [doc:fa2-fast-bwd-inner-loop]
            # FA2.2 L10-L11: S_ij = tau Q_i K_j^T (a TM x TN register tile, base 2 as the forward); P_ij = exp(S_ij - L_i)
            # as exp2(S - m_i log2 e) / l_i, masked
            # FA2.2 L13-L14: dP_ij = (dO_i V_j^T) o Z_ij (same tiling); dS_ij = P_ij o (dP_ij - D_i), times tau, to SRAM
            s_dp_p_ds(smem, tid, row0, col0, s_k, causal_offset, tau, c1, rkey, threshold, dropout_scale, rS, rdP, rq, rdo)
            cuda.syncthreads()  # Sync: P_ij o Z_ij and tau dS_ij in SRAM before L12, L15, L16 read them
            # FA2.2 L12: dV_j += (P_ij o Z_ij)^T dO_i -- outer products over the Br rows, TC x 4 DVX register tile
            # FA2.2 L16: dK_j += tau dS_ij^T Q_i -- the same loop (tau is already in dS)
            dv_dk_update(smem, cy, tx, rp, rds, rov, rqv, rdV, rdK)
            if ATOMIC_DQ:
                # FA2.2 L15: dQ_i += tau dS_ij K_j (a TM2 x DX2 register tile), one atomic add per element (coalesced)
                for a in range(NQ2):
                    rdQ[a] = float32(0.0)
                dq_tile(smem, tid, rdQ, rds4)
                add_dq(gdQ, ub, U(h), row0, tid, s_q, d, rdQ)  # HBM read+write: Br*d
            # [/doc:fa2-fast-bwd-inner-loop]
            if HEAD_SUMS and t % n_i == n_i - 1:
                # Dev: the last query block of head h: its dK_j, dV_j added to the group's sum in HBM (the first head's
                # written), then zeroed: each head's sum over its rows, then the heads, as torch's float32 path
                add_dk_dv(gdK, gdV, ub, uhk, col0, s_k, d, cy, tx, rdK, rdV, t >= n_i)
                for a in range(NKV):
                    rdK[a] = float32(0.0)
                    rdV[a] = float32(0.0)

        # FA2.2 L18: write dK_j, dV_j to HBM (4 consecutive floats per lane; HEAD_SUMS: done above, zeros where no step ran)
        if not HEAD_SUMS or n_steps == 0:
            store_dk_dv(gdK, gdV, ub, uhk, col0, s_k, d, cy, tx, rdK, rdV)

    # [/doc:fa2-fast-bwd-kernel]
    return kernel


@functools.cache
def fa2_backward_fast_dq_kernel(NT: int, BR: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, VEC: bool = True, PREFETCH: bool = True, FROM_LSE: bool = False):
    """The deterministic dQ kernel: one block per (query block, batch, head), dQ_i in registers.

    It re-runs lines 10-15 with the loops swapped (query block outer, key blocks inner, as the FA2
    forward), with the main kernel's SRAM layout and register tiling, so each ``dQ`` element is one
    thread's sum in a fixed order: no atomics, bitwise reproducible. ``K_{j+1}, V_{j+1}`` are
    prefetched into registers during the compute on ``K_j, V_j``. Symbol table as
    :func:`fa2_backward_fast_kernel`, with ``rdQ`` accumulated over all ``j``.
    """
    fns = _device_functions(NT, BR, BC, DP, CAUSAL, DROPOUT)
    g = fns["g"]
    TM, TM2, DX2 = (g[k] for k in ("TM", "TM2", "DX2"))
    NLQ, NLK = fns["NLQ"], fns["NLK"]
    load_q, store_q, load_k, store_k = fns["load_q"], fns["store_q"], fns["load_k"], fns["store_k"]
    s_dp_p_ds, dq_tile, store_dq, n_key_blocks = fns["s_dp_p_ds"], fns["dq_tile"], fns["store_dq"], fns["n_key_blocks"]
    o = fns["offs"]
    OFF_Q, OFF_DO, OFF_K, OFF_V, OFF_M, OFF_D, OFF_IL = (o[k] for k in ("OFF_Q", "OFF_DO", "OFF_K", "OFF_V", "OFF_M", "OFF_D", "OFF_IL"))
    row_stats = _regtile.make_row_stats(FROM_LSE)
    uBR = U(BR)
    TPR_, RG_ = g["TPR"], g["RG"]  # S/dP map: lanes per row group, row groups
    # Register-array sizes (local-array sizes must be plain constants):
    NS = g["TM"] * g["TN"]  # rS, rdP: the TM x TN tiles of S_ij, dP_ij
    NTM4, NTM24 = TM * 4, TM2 * 4  # rq/rdo: a 4-column step of TM rows; rds4: of TM2 rows
    NQ2 = TM2 * DX2  # rdQ: TM2 rows x DX2 columns of dQ_i
    ALIGN = 16 if VEC else None

    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, tau, c1, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32, alignment=ALIGN)
        tau = float32(tau)  # Dev: float32 scalars (no float64 arithmetic in the tile loops)
        c1 = float32(c1)
        dropout_scale = float32(dropout_scale)
        rS = cuda.local.array(NS, float32)
        rdP = cuda.local.array(NS, float32)
        rq = cuda.local.array(NTM4, float32)
        rdo = cuda.local.array(NTM4, float32)
        rkey = cuda.local.array(TM, uint64)
        rdQ = cuda.local.array(NQ2, float32)  # dQ_i tile, summed over j in order (registers)
        rds4 = cuda.local.array(NTM24, float32)
        rQn = cuda.local.array(NLQ, float32)
        rdOn = cuda.local.array(NLQ, float32)
        rKn = cuda.local.array(NLK, float32)  # K_j / K_{j+1} in flight (registers)
        rVn = cuda.local.array(NLK, float32)

        tid = U(cuda.threadIdx.x)
        nheads, b, h, s_q, s_k, d = folded_query_head(gQ, gK)  # Dev: b*h folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        hk = h // group
        ub, uh, uhk = U(b), U(h), U(hk)
        row0 = cuda.blockIdx.x * BR
        load_q(gQ, gdO, ub, uh, row0, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d
        store_q(smem, OFF_Q, OFF_DO, tid, rQn, rdOn)
        if tid < uBR:
            row = row0 + int(tid)
            Mval, ILval = row_stats(gm, gl, b, h, row, s_q)
            Dval = float32(0.0)
            if row < s_q:
                Dval = gD[b, h, row]
            smem[OFF_M + tid] = Mval
            smem[OFF_IL + tid] = ILval
            smem[OFF_D + tid] = Dval
        for a in range(NQ2):
            rdQ[a] = float32(0.0)
        if DROPOUT:
            k_bh = head_key(seed, b * nheads + h)
            for a in range(TM):
                rkey[a] = row_key(k_bh, row0 + int(tid // U(TPR_)) + RG_ * a)
        n_blocks = n_key_blocks(row0 + BR, s_k, causal_offset)
        if n_blocks > 0:
            load_k(gK, gV, ub, uhk, 0, s_k, d, tid, rKn, rVn)
        for j in range(n_blocks):
            col0 = j * BC
            cuda.syncthreads()  # Sync: K_{j-1}, V_{j-1}, dS of the previous step read by all (and Q_i, dO_i stored) before overwriting
            if not PREFETCH and j > 0:
                load_k(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
            store_k(smem, OFF_K, OFF_V, tid, rKn, rVn)
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before they are read
            if PREFETCH and j + 1 < n_blocks:
                load_k(gK, gV, ub, uhk, col0 + BC, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d (tile j+1)
            # FA2.2 L10-L11: S_ij, P_ij (recomputed, the same tiles as the main kernel)
            # FA2.2 L13-L14: dP_ij, tau dS_ij to SRAM
            s_dp_p_ds(smem, tid, row0, col0, s_k, causal_offset, tau, c1, rkey, threshold, dropout_scale, rS, rdP, rq, rdo)
            cuda.syncthreads()  # Sync: tau dS_ij in SRAM before L15 reads it
            # FA2.2 L15: dQ_i += tau dS_ij K_j -- Dev: deterministic: each thread sums its tile over j in a fixed order
            dq_tile(smem, tid, rdQ, rds4)
        store_dq(gdQ, ub, uh, row0, tid, s_q, d, rdQ)  # HBM write: Br*d

    return kernel


def default_features() -> dict:
    """Kernel features used on this backend: 16-byte aligned SRAM on a GPU only. ``HEAD_SUMS`` None: on for GQA
    (``group > 1``): one float32 register summing ``dK_j`` over every row of a group (2331 terms in the GQA d = 40
    GPU case) rounds more than torch's float32 path, which sums each head's rows and then the heads, and that case
    left the 3x rule (``tests/kernels/test_fa2_kernels.py``; the performance log's section "The 3x gradient rule's
    edge"). Per head it costs ``G - 1`` read-modify-writes of the ``Bc x d`` tiles per block and no register; MHA
    kernels are compiled without it."""
    gpu = not _backend.is_simulator()
    return {"VEC": gpu, "PREFETCH": True, "HEAD_SUMS": None}


def plan(prob: Problem, block_sizes=None, config=None, features=None, deterministic=False, from_lse=False):
    """(main kernel, main grid, dQ kernel or None, dQ grid, threads, dynamic SRAM bytes), without launching.

    ``from_lse``: the forward saved only the logsumexp (no ``m, l``): P = exp2(S - L log2 e).
    """
    cfg = config if config is not None else config_for(prob.headdim, block_sizes)
    NT, BR, BC, DP = cfg
    derived(NT, BR, BC, DP)
    feats = _plan.checked_features(default_features(), features)
    nbytes = 4 * smem_floats(NT, BR, BC, DP)
    _plan.check_sram(nbytes, BR, BC, prob.headdim)
    dropout = prob.dropout_p > 0
    Tr, Tc = _split(prob, cfg)
    head_sums = prob.group > 1 if feats["HEAD_SUMS"] is None else bool(feats["HEAD_SUMS"])
    main = fa2_backward_fast_kernel(NT, BR, BC, DP, prob.causal, dropout, not deterministic, feats["VEC"], feats["PREFETCH"], bool(from_lse),
                                    head_sums)
    dqk = fa2_backward_fast_dq_kernel(NT, BR, BC, DP, prob.causal, dropout, feats["VEC"], feats["PREFETCH"], bool(from_lse)) if deterministic else None
    return main, bh_grid(Tc, prob.batch * prob.nheads_k), dqk, bh_grid(Tr, prob.batch * prob.nheads), NT, nbytes


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles (the kernel contract): :func:`config_for`, which rounds an override up to 16."""
    _, BR, BC, _ = config_for(prob.headdim, block_sizes)
    return BR, BC


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block, in bytes (both kernels use the same layout)."""
    return plan(prob, block_sizes)[5]


def compiled_kernels(prob: Problem, block_sizes=None, deterministic=False) -> list[KernelLaunch]:
    """The main kernel (and the deterministic dQ kernel), compiled for ``prob`` (not launched)."""
    main, grid, dqk, grid_dq, NT, nbytes = plan(prob, block_sizes, deterministic=deterministic)
    BR, BC = choose_block_sizes(prob, block_sizes)
    out = [KernelLaunch(f"FA2 backward fast (Br, Bc) = ({BR}, {BC})", main, NT, math.prod(grid))]
    if deterministic:
        out.append(KernelLaunch(f"FA2 backward fast dQ (Br, Bc) = ({BR}, {BC})", dqk, NT, math.prod(grid_dq)))
    return out


#: :func:`backward` puts nothing on the GPU but the allocator's outputs and launches through ``_smem.launch`` (the
#: pre-pass, the main kernel, the deterministic dQ kernel): an eager call's backward may be replayed
#: (:mod:`numba_flash.runtime.replay`)
REPLAYABLE = True


def backward(dout, q, k, v, out, fwd, prob: Problem, alloc, block_sizes=None, deterministic=False, config=None, features=None):
    """FA2 Algorithm 2, fast kernels, on kernel arrays: ``(dq, dk, dv)`` (dk, dv summed over each GQA group).

    ``deterministic=True`` computes dQ with :func:`fa2_backward_fast_dq_kernel` instead of atomic adds:
    bitwise reproducible. ``config=(NT, Br, Bc, DP)`` and ``features`` (dict of ``VEC``, ``PREFETCH``,
    ``HEAD_SUMS``) override the tiling and kernel features (the sweep uses them).
    """
    from_lse = fwd.m is None or fwd.l is None
    main, grid, dqk, grid_dq, NT, nbytes = plan(prob, block_sizes, config, features, deterministic, from_lse)
    # FA2.2 L20: return dQ, dK, dV -- after line 4's D, line 3's gradients and the launches (device.backward_launch)
    return launch_fa2_backward((main, grid, dqk, grid_dq, (NT, NT), (nbytes, nbytes)), _prepass, _allocate_grads, dout, q, k, v,
                               out, fwd, prob, alloc, deterministic, from_lse)
