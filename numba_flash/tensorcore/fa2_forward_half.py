"""FlashAttention-2 Algorithm 1 on the tensor cores in fp16 / bf16 (``mma.sync.m16n8k16``, float32 accumulate).

Paper: Dao, "FlashAttention-2", Algorithm 1 and section 3.3; the paper's kernels are fp16/bf16. Same
algorithm, semantics, paper tags and launch grid as :mod:`numba_flash.fa2_forward` (readable) and
:mod:`numba_flash.tensorcore.fa2_forward_tf32` (float32 on 3xTF32 tensor cores); read those first. This
kernel runs when q, k, v are float16 or bfloat16 (``variant="tensorcore"``, and ``"auto"`` on a GPU).

What half precision changes
---------------------------
* **Inputs and outputs stay half.** Q, K, V arrive as *words*: ``uint32`` holding two adjacent
  elements of a row (the lower index in the low 16 bits), an ``int32`` view of the caller's tensor
  (:meth:`numba_flash._launch.Allocator.to_words`), so each HBM read moves two elements, half the bytes of
  the float32 kernels. O is written the same way, two elements per store; ``L``, ``m``, ``l`` are float32.
* **One mma per product, not three.** ``m16n8k16`` multiplies half inputs exactly and accumulates in
  float32: no split (:mod:`numba_flash.tensorcore.ptx`, :func:`~numba_flash.tensorcore.ptx.make_half_ops`).
  ``S`` is the float32 sum of exact products; the softmax runs in float32 on it:
  ``P~ = exp2(S tau log2 e - m)`` (``tau`` applied to S in float32, not folded into a half Q).
* **P~ never leaves the registers.** The accumulator of ``S`` gives lane ``(g, t)`` the columns
  ``2t, 2t + 1`` of rows ``g, g + 8`` of each 8-key tile; the A operand of a 16-key step wants
  ``(P[g, 2t:2t+2], P[g+8, 2t:2t+2], P[g, 2t+8:2t+10], P[g+8, 2t+8:2t+10])``: the same values, two
  8-key tiles side by side. So ``P~`` is rounded to half in pairs (``cvt.rn.f16x2.f32``, one instruction
  per two values) straight into the A words of ``P~ V_j``; the float32 kernel had to go through SRAM
  because its m16n8k8 A layout (``P[g, t], P[g, t + 4]``) is not the accumulator's. As in flash-attn,
  the row sum ``l`` adds the float32 ``P~`` before rounding.
* **Fragments come from SRAM by ldmatrix.** ``ldmatrix.x4`` (Numba reaches it as inline PTX, with the
  shared array's address converted by ``cvta.to.shared``: :func:`numba_flash.tensorcore.ptx.make_half_ops`)
  loads four 8x8 half matrices per instruction, each lane getting its fragment words of all four: one
  A operand of ``Q_i`` (16 rows x 16 d), or the B operands of two key tiles of ``K_j``. The B operand of
  ``P~ V_j`` wants two *keys* of one column in a word, but ``V_j`` rows hold columns of one key:
  ``ldmatrix.x4.trans`` reads the row-major ``V_j`` and hands out column pairs (CUDA C++ FlashAttention
  does the same). A first version loaded words one at a time (``LDS.32``) and stored ``V_j`` transposed;
  the performance log has both.
* **Bank-conflict-free SRAM.** The Q, K, V rows have ``DW + 4`` words (``DW`` = ``DP / 2``, a multiple
  of 8): an ldmatrix phase reads 8 rows of 16 bytes, which start 4 banks apart.
* **K_j, V_j stream in by cp.async, two stages deep** (``CP_ASYNC``, the default where ``d % 8 == 0``).
  ``cp.async.cg`` copies 16 bytes HBM -> SRAM without a register on the way
  (:func:`numba_flash.tensorcore.ptx.make_cp_async`, :func:`numba_flash.fast._tiles.make_word_loader_async`);
  its ``src_size = 0`` form writes zeros, which gives the zero rows past N and words past d. K_j, V_j
  alternate between two SRAM stages: the copies of block j+1 are issued before block j is computed and
  waited for (``cp.async.wait_group 0``) after it, with one ``syncthreads`` per key block instead of two.
  Q_i comes the same way, in the first group. The register path it replaces (loads into registers
  ``rKn``, ``rVn``, a register prefetch of block j+1, stores to one SRAM stage) held ``2 Bc DW / (32 NW)``
  more registers per thread and stays for ``d % 8 != 0`` (``d = 110``: a row's 16-byte chunks are not
  16-byte aligned in HBM), for inputs not 16-byte aligned (:func:`aligned16`), and as ``CP_ASYNC=False``.

Accuracy (flash-attn's rule for half inputs): at most 2x the error of a naive attention computed in the
same half dtype (S, P and O rounded to it), both against a float64 reference
(``tests/kernels/test_half_kernels.py``). ``P~`` rounded to half is this kernel's largest error, as in
flash-attn.

Launch geometry
---------------
grid ``(Tr, batch * nheads)``, block ``32 NW`` threads, ``Br = 16 MW NW``; warp ``w`` owns the query rows
``16 MW w .. 16 MW (w + 1) - 1`` of the block. SRAM (``uint32`` words, one dynamic array ``smem`` at
offsets ``OFF_*``, :func:`smem_words`): ``Q_i`` Br (DW+4) + ``stages`` x (``K_j``, ``V_j`` Bc (DW+4)
each), ``stages`` = 2 with ``CP_ASYNC`` (stage ``j % 2`` holds block j), 1 without; ``DP`` = d padded
to a multiple of 16 and ``DW = DP / 2`` (+ a 384-float exchange scratch per warp in the simulator).
At d = 128, Br = 128, Bc = 64: 34 KiB + 2 x 34 KiB = 102 KiB with cp.async (2 blocks fit an H100 SM).

GPU: compute capability 8.0 or newer. The simulator runs the same source with the Python twins of
:func:`numba_flash.tensorcore.ptx.make_half_ops`.
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int32, uint32, uint64

from .._launch import KernelLaunch, Problem, bh_grid, ceil_div
from ..device.constants import U
from ..fast import _plan, _tiles
from ..runtime import backend as _backend
from . import forward_steps, fragments, ptx
from .ptx import available  # noqa: F401  (the kernel contract's optional available())

#: Largest head dim of the half kernel; above it (and at odd head dims, which do not pack into words)
#: :mod:`numba_flash.tensorcore.fa2_forward_tf32` computes half inputs in float32 (:func:`handles`).
HALF_MAX_HEADDIM = 128


#: :func:`forward` puts nothing on the GPU but the allocator's outputs and launches through ``_smem.launch``: an eager
#: call may be replayed (:mod:`numba_flash.runtime.replay`), as the 3xTF32 forward's may
REPLAYABLE = True

#: The allocator hands this module half inputs as words of two halves (:meth:`numba_flash._launch.Allocator.to_words`).
TAKES_WORDS = True


def handles(prob: Problem) -> bool:
    """Whether this kernel runs ``prob``: float16/bfloat16 inputs, an even head dim up to :data:`HALF_MAX_HEADDIM`."""
    return prob.dtype in ptx.HALF_KINDS and prob.headdim % 2 == 0 and prob.headdim <= HALF_MAX_HEADDIM


@functools.cache
def config_for(d: int, block_sizes=None, cp_async=None):
    """The tiling ``(NW, MW, Bc, DP)``: warps per block, m16 tiles per warp, key block, d padded to 16.

    Defaults on the ``cp.async`` path (``cp_async``; None: where :func:`cp_async_ok`), from the H100 sweeps of the
    performance log's section "FA2 forward in fp16 / bf16: cp.async and a second K/V stage" (``python -m
    bench.half_sweep``): 4 warps of ``MW = 2`` m16 tiles (Br = 128) with ``Bc = 64`` at ``d <= 64`` (232 registers, no spill) and
    ``Bc = 32`` above (248); on the register path (d % 8 != 0, unaligned inputs, ``CP_ASYNC=False``) the
    tilings it was measured with before: ``d <= 64``: 4 warps, ``MW = 2``, ``Bc = 32`` (``Bc = 64`` spills);
    above: 8 warps, ``MW = 1``, ``Bc = 64``. ``block_sizes=(Br, Bc)`` is rounded up to the mma granularity
    (Br to a multiple of 16, Bc of 16; above Br = 64 the warps take ``MW = Br / 64``).
    """
    DP = 16 * ((d + 15) // 16)
    if block_sizes is None:
        if cp_async_ok(d) if cp_async is None else cp_async:
            return (4, 2, 64, DP) if d <= 64 else (4, 2, 32, DP)
        return (4, 2, 32, DP) if d <= 64 else (8, 1, 64, DP)
    Br, Bc = (int(n) for n in block_sizes)
    m16 = (Br + 15) // 16
    NW, MW = (m16, 1) if m16 <= 4 else (4, (m16 + 3) // 4)
    return NW, MW, 16 * ((Bc + 15) // 16), DP


def stride(DP: int) -> int:
    """Row stride in words of the Q_i, K_j, V_j tiles: ``DW + 4``, so the 8 16-byte rows one ldmatrix phase
    reads (``DW`` is a multiple of 8, so the stride is 4 mod 8 words) start in 8 different groups of 4 banks."""
    return DP // 2 + 4


def smem_words(NW: int, MW: int, BC: int, DP: int, stages: int = 1) -> int:
    """Dynamic SRAM of the kernel in 32-bit words (see the module docstring): Q_i and ``stages`` copies of
    K_j, V_j (2 with ``CP_ASYNC``, :func:`kv_stages`)."""
    return (16 * MW * NW + 2 * stages * BC) * stride(DP)


def cp_async_ok(d: int) -> bool:
    """Whether head dim ``d`` can take the ``cp.async`` path: a row of ``d / 2`` words is whole 16-byte
    chunks (``d % 8 == 0``), so every chunk of a row is 16-byte aligned in HBM and all inside or all past d."""
    return d % 8 == 0


def kv_stages(cp_async: bool) -> int:
    """SRAM stages of K_j, V_j: 2 for the cp.async pipeline, 1 for the register path."""
    return 2 if cp_async else 1


@cuda.jit(device=True, inline="always")
def ldmatrix_lanes(lane):
    """``(lr, lw, kr, kw)``: the row and word this lane addresses in an ``ldmatrix.x4`` (lane ``l`` gives the address
    of row ``l % 8`` of matrix ``l // 8``, matrix ``j`` at ``(j % 2, j // 2)``): of an A operand of ``Q_i`` or a B
    operand pair of ``V_j`` (``lr``, ``lw``), of a B operand pair of ``K_j`` (``kr``, ``kw``)."""
    lr = U(lane % 8 + 8 * ((lane // 8) % 2))  # A (Q) and V: row within a 16-row slab; + 8 for matrices 1, 3
    lw = U(4 * (lane // 16))  # A (Q): word offset 0 / 4 (k 0-7 / 8-15) for matrices 0, 1 / 2, 3
    kr = U(lane % 8 + 8 * (lane // 16))  # K: key row within a 16-key pair of n8 tiles (matrices 2, 3: the second)
    kw = U(4 * ((lane // 8) % 2))  # K: word offset 0 / 4 (k 0-7 / 8-15) for matrices 0, 2 / 1, 3
    return lr, lw, kr, kw


@functools.cache
def make_mma16_pair(MW: int, NX: int, KIND: str, SIM: bool):
    """``mma16_pair(rA, rC, pair, w0, w1, w2, w3, sx, wbase, lane)``: the ``mma`` of one 16-wide k step into the
    accumulator tiles ``2 pair`` and ``2 pair + 1`` of each of the warp's ``MW`` m16 tiles (tile ``n`` of m16 tile
    ``mt`` at ``rC[(mt NX + n) 4 ..]``): A = the warp's four A words per m16 tile in ``rA``, B = the two B words of
    each tile, ``(w0, w1)`` and ``(w2, w3)``, as one ``ldmatrix.x4`` gives them. Line 8 (``S += Q_i K_j^T`` over
    key tile pairs, ``NX = Bc / 8``) and line 10 (``O += P~ V_j`` over column tile pairs, ``NX = d / 8``) alike."""
    _, mma16, _, _ = ptx.make_half_ops(KIND, SIM)

    @cuda.jit(device=True, inline="always")
    def mma16_pair(rA, rC, pair, w0, w1, w2, w3, sx, wbase, lane):
        for h2 in range(2):
            bb = (w0, w1) if h2 == 0 else (w2, w3)
            for mt in range(MW):
                f = (mt * NX + 2 * pair + h2) * 4
                acc = mma16((rA[mt * 4], rA[mt * 4 + 1], rA[mt * 4 + 2], rA[mt * 4 + 3]), bb,
                            (rC[f], rC[f + 1], rC[f + 2], rC[f + 3]), sx, wbase, lane)
                for c in range(4):
                    rC[f + c] = acc[c]

    return mma16_pair


@functools.cache
def make_half_steps(MW: int, NB: int, DP: int, KIND: str, SIM: bool):
    """``(mma_qk, mma_pv)``: lines 8 and 10 on the warp's ``MW x NB`` float32 fragments.

    * ``mma_qk(smem, rS, OFF_Q, kbase, wrow, lanes, sx, wbase, lane)``: line 8, ``S_i^(j) = Q_i K_j^T`` into ``rS``:
      per 16-wide k step, A = the warp's rows of ``Q_i`` (16 x 16 per m16 tile, one ``ldmatrix.x4``), B = ``K_j^T``
      (16 x 8 per key tile: lane word ``K[g, 2t:2t+2]`` is ``B[2t:2t+2, g]``; one ``ldmatrix.x4`` for two key tiles);
      ``lanes``: this lane's ldmatrix rows and words (:func:`ldmatrix_lanes`).
    * ``mma_pv(smem, rS, rO, ralpha, vbase, lanes, sx, wbase, lane)``: line 10, ``O_i = diag(e^(m_old - m_new)) O_i +
      P~ V_j``: A = ``P~`` from the registers (``rS``'s 8-key tiles ``2 kt``, ``2 kt + 1`` are the A operand of 16-key
      step ``kt``, rounded to half in pairs), B = ``V_j`` by ``ldmatrix.x4.trans`` (two column tiles per instruction).
    """
    KD = DP // 16  # 16-wide k steps of Q K^T
    NK = NB // 2  # 16-key steps of P~ V_j
    ND = DP // 8  # 8-column tiles of O
    NS = MW * NB * 4
    NA = MW * 4  # words of one A operand (4 per m16 tile)
    uSQ = U(stride(DP))
    pack2, _, ldsm, ldsm_t = ptx.make_half_ops(KIND, SIM)
    mma16_pair_s = make_mma16_pair(MW, NB, KIND, SIM)
    mma16_pair_o = make_mma16_pair(MW, ND, KIND, SIM)

    @cuda.jit(device=True, inline="always")
    def mma_qk(smem, rS, OFF_Q, kbase, wrow, lanes, sx, wbase, lane):
        rA = cuda.local.array(NA, uint32)  # A words of Q_i
        lr, lw, kr, kw = lanes
        for a in range(NS):
            rS[a] = float32(0.0)
        for ks in range(KD):
            for mt in range(MW):  # a = (Q[g, 2t:], Q[g+8, 2t:], Q[g, 2t+8:], Q[g+8, 2t+8:])
                rA[mt * 4], rA[mt * 4 + 1], rA[mt * 4 + 2], rA[mt * 4 + 3] = ldsm(smem, OFF_Q + (wrow + U(16 * mt) + lr) * uSQ + U(8 * ks) + lw, sx, wbase, lane)
            for np2 in range(NB // 2):  # b of key tiles 2 np2, 2 np2 + 1 = (K[g, 2t:2t+2], K[g, 2t+8:2t+10]) each
                kb0, kb1, kb2, kb3 = ldsm(smem, kbase + (U(16 * np2) + kr) * uSQ + U(8 * ks) + kw, sx, wbase, lane)
                mma16_pair_s(rA, rS, np2, kb0, kb1, kb2, kb3, sx, wbase, lane)

    @cuda.jit(device=True, inline="always")
    def mma_pv(smem, rS, rO, ralpha, vbase, lanes, sx, wbase, lane):
        rA = cuda.local.array(NA, uint32)  # A words of P~
        lr, lw, _, _ = lanes  # V's rows and words as Q's
        for mt in range(MW):
            for dn in range(ND):
                for c in range(4):
                    rO[(mt * ND + dn) * 4 + c] *= ralpha[mt * 2 + c // 2]
        for kt in range(NK):  # 16 keys per step: S tiles 2 kt and 2 kt + 1 are the A operand
            for mt in range(MW):
                f0 = (mt * NB + 2 * kt) * 4
                f1 = f0 + 4
                # a = (P[g, 2t:2t+2], P[g+8, 2t:2t+2], P[g, 2t+8:2t+10], P[g+8, 2t+8:2t+10]), rounded to half
                rA[mt * 4] = pack2(rS[f0], rS[f0 + 1])
                rA[mt * 4 + 1] = pack2(rS[f0 + 2], rS[f0 + 3])
                rA[mt * 4 + 2] = pack2(rS[f1], rS[f1 + 1])
                rA[mt * 4 + 3] = pack2(rS[f1 + 2], rS[f1 + 3])
            for dp2 in range(ND // 2):  # b of column tiles 2 dp2, 2 dp2 + 1 = (V[2t:2t+2, g], V[2t+8:2t+10, g]) each
                vb0, vb1, vb2, vb3 = ldsm_t(smem, vbase + (U(16 * kt) + lr) * uSQ + U(8 * dp2) + lw, sx, wbase, lane)
                mma16_pair_o(rA, rO, dp2, vb0, vb1, vb2, vb3, sx, wbase, lane)

    return mma_qk, mma_pv


@functools.cache
def make_half_o_store(MW: int, DP: int, KIND: str, SIM: bool):
    """``store_o_row(gO, smem, rO, ub, row, uh, mt, hf, wrow, g, t, dw, inv_l)``: line 14's row of O times ``inv_l``,
    rounded to half, lane ``(g, t)`` writing word ``4 dn + t`` (columns ``8 dn + 2t``, ``+ 1``) of each column tile."""
    ND = DP // 8
    pack2, _, _, _ = ptx.make_half_ops(KIND, SIM)

    @cuda.jit(device=True, inline="always")
    def store_o_row(gO, smem, rO, ub, row, uh, mt, hf, wrow, g, t, dw, inv_l):
        for dn in range(ND):
            x = U(4 * dn) + t
            if x < U(dw):
                f = (mt * ND + dn) * 4 + 2 * hf
                gO[ub, U(row), uh, x] = int32(pack2(rO[f] * inv_l, rO[f + 1] * inv_l))  # HBM write: Br*d halves

    return store_o_row


@functools.cache
def fa2_forward_half_kernel(NW: int, MW: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, PREFETCH: bool, SIM: bool, KIND: str,
                            CP_ASYNC: bool = False, EX2_FTZ: bool = False):
    """The fp16/bf16 FA2 forward kernel for one specialization (see the module docstring), composed of steps: line 7
    from :func:`numba_flash.tensorcore.forward_steps.make_kv_pipeline`, line 8 from :func:`make_half_steps`, line 9
    from :func:`numba_flash.tensorcore.forward_steps.make_online_softmax`, line 10 from it too,
    lines 12-15 from :func:`numba_flash.tensorcore.forward_steps.make_write_o_l` with :func:`make_half_o_store`.

    ``CP_ASYNC`` (d a multiple of 8): Q_i, K_j, V_j go HBM -> SRAM by ``cp.async`` into two SRAM stages of
    K_j, V_j (``PREFETCH`` is then unused); otherwise through registers into one stage (``PREFETCH``: the
    loads of K_{j+1}, V_{j+1} in flight during block j).

    ``EX2_FTZ``: ``P~ = 2^(S' - m)`` by ``ex2.approx.ftz.f32`` (:func:`numba_flash.tensorcore.ptx.make_exp2`).

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, O (half words)   gQ, gK, gV, gO       HBM, int32 views (b, s, h, d / 2)
    L, m, l                   gL, gm, gl           HBM, float32 (b, h, s)
    Q_i                       smem[OFF_Q ...]      SRAM (Br, DW+4) words, loaded once (L4)
    K_j                       smem[kbase ...]      SRAM (Bc, DW+4) words, loaded each step (L7); CP_ASYNC: 2 stages
    V_j                       smem[vbase ...]      SRAM (Bc, DW+4) words, loaded each step (L7); CP_ASYNC: 2 stages
    S_i^(j)                   rS                   registers: MW x (Bc/8) m16n8 float32 fragments per warp
    P~_i^(j) (half)           rA                   registers: the A words of one 16-key step (mma_pv)
    O_i^(j) (un-normalized)   rO                   registers: MW x (DP/8) m16n8 float32 fragments
    m_i, l_i (base 2)         rm, rl               registers, 2 MW rows per lane (rl: partial sum)
    ========================  ===================  ==================================================
    """
    NT = 32 * NW
    BR = 16 * MW * NW
    NB = BC // 8  # 8-column tiles of S
    ND = DP // 8  # 8-column tiles of O
    DW = DP // 2  # words of a padded row
    SQ = stride(DP)  # row stride (words) of the Q_i, K_j and V_j tiles
    # Offsets (words) of the tiles in the one dynamic SRAM array `smem`:
    OFF_Q = U(0)  # Q_i: (Br, SQ) words, columns past d zero
    OFF_K = U(BR * SQ)  # K_j: (Bc, SQ)
    OFF_V = U(BR * SQ + BC * SQ)  # V_j: (Bc, SQ) words, rows of keys (read transposed by ldmatrix.trans)
    uSTAGE = U(2 * BC * SQ)  # CP_ASYNC: stage 1 (K, V of the odd blocks) follows stage 0 at OFF_K + uSTAGE
    NS = MW * NB * 4  # registers of rS: MW x NB m16n8 fragments, 4 floats per lane each
    NO = MW * ND * 4  # registers of rO
    NR = MW * 2  # query rows per lane (rows g and g + 8 of each m16 tile)
    SXN = NW * ptx.HALF_SIM_SCRATCH_PER_WARP if SIM else 1  # simulator lane-exchange scratch (floats)
    SCR = ptx.HALF_SIM_SCRATCH_PER_WARP  # one warp's share of it

    NLQ, load_q, store_q = _tiles.make_word_loader(BR, DW, NT, SQ)
    NLK, load_pair, store_pair = forward_steps.make_word_pair_loader(BC, DW, NT, SQ)  # K_j and V_j alike
    RQ, RK = (1, 1) if CP_ASYNC else (NLQ, NLK)  # register staging of Q_i, K_j, V_j (none with cp.async)
    _, load_q_async = _tiles.make_word_loader_async(BR, DW, NT, SQ, SIM)
    _, load_kv_async = _tiles.make_word_loader_async(BC, DW, NT, SQ, SIM)
    _copy16, cp_commit, cp_wait0 = ptx.make_cp_async(SIM)
    n_key_blocks, _ = _tiles.make_block_counts(BR, BC, CAUSAL)
    query_block = forward_steps.make_query_block(False)  # Dev: each head's blocks in turn (all heads' heaviest first gained nothing here)

    exp2 = ptx.make_exp2(EX2_FTZ, SIM)  # EX2_FTZ: one MUFU.EX2 instead of four instructions (see default_features)
    init_o_l_m = forward_steps.make_init_o_l_m(MW, NO, DROPOUT)
    load_kv_first, load_kv = forward_steps.make_kv_pipeline(BC, OFF_K, OFF_V, uSTAGE, True, CP_ASYNC, PREFETCH, CP_ASYNC,
                                                            load_q_async, load_kv_async, load_kv_async, cp_commit, cp_wait0,
                                                            load_pair, store_pair)
    mma_qk, mma_pv = make_half_steps(MW, NB, DP, KIND, SIM)
    mask_s, _ = fragments.make_fragment_steps(MW, NB, BC, CAUSAL)
    online_softmax = forward_steps.make_online_softmax(MW, NB, BC, CAUSAL, DROPOUT, SIM, exp2, True)
    write_o_l = forward_steps.make_write_o_l(MW, SIM, DROPOUT, make_half_o_store(MW, DP, KIND, SIM))

    # [doc:fa2-half-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gO, gL, gm, gl, scale_log2, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, uint32)  # Q_i, K_j, V_j in words; offsets OFF_*
        scale_log2 = float32(scale_log2)  # tau log2 e, applied to S in float32
        sx = cuda.shared.array(SXN, float32)  # the simulator's lane-exchange scratch (unused on a GPU)
        rS = cuda.local.array(NS, float32)  # S_ij, then P~_ij (float32): MW x NB fragments
        rO = cuda.local.array(NO, float32)  # O_i: MW x ND fragments
        rm = cuda.local.array(NR, float32)
        rl = cuda.local.array(NR, float32)
        ralpha = cuda.local.array(NR, float32)
        rkey = cuda.local.array(NR, uint64)
        rQn = cuda.local.array(RQ, uint32)  # Q_i on its way to SRAM (register path)
        rKn = cuda.local.array(RK, uint32)  # K_j / K_{j+1} in flight (register path)
        rVn = cuda.local.array(RK, uint32)  # V_j / V_{j+1}

        tid = U(cuda.threadIdx.x)
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        g = U(lane // 4)  # fragment row (and row + 8)
        t = U(lane % 4)  # fragment word column t (elements 2t, 2t + 1) and t + 4
        lanes = ldmatrix_lanes(lane)  # this lane's rows and words in an ldmatrix.x4
        wbase = warp * SCR
        nheads = gQ.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        dw = gQ.shape[3]  # words of a row: d / 2
        # FA2.1 L3: for i = 1..Tr -- one thread block per i; Dev: the heaviest (causal) blocks first
        i, bh, b, h = query_block(gQ.shape[0], nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        ub, uh, uhk = U(b), U(h), U(h // group)
        row0 = i * BR
        wrow = U(16 * MW) * U(warp)  # this warp's first row within the block

        # FA2.1 L4: load Q_i from HBM to SRAM (half words); rows past N_q and columns past d are zero
        # (CP_ASYNC: issued below, in one cp.async group with K_1, V_1)
        if not CP_ASYNC:
            load_q(gQ, ub, uh, row0, s_q, dw, tid, rQn)  # HBM read: Br*d halves
            store_q(smem, OFF_Q, tid, rQn)
        # FA2.1 L5: on chip, O_i = 0, l_i = 0, m_i = -inf
        init_o_l_m(rO, rm, rl, rkey, seed, bh, row0, wrow, g)

        # Dev: causal block skipping: key blocks past the last row's horizon are never visited
        n_blocks = n_key_blocks(row0 + BR, s_k, causal_offset)
        if n_blocks > 0:  # Dev: L7 of block 1 before the loop (CP_ASYNC: into stage 0, in one group with Q_i's copies)
            load_kv_first(smem, gQ, gK, gV, ub, uh, uhk, row0, s_q, s_k, dw, tid, rKn, rVn)
        # FA2.1 L6: for j = 1..Tc
        for j in range(n_blocks):
            col0 = j * BC
            # FA2.1 L7: K_j, V_j from HBM in SRAM (CP_ASYNC: waited for, then K_{j+1}, V_{j+1} issued into the other stage)
            kbase, vbase = load_kv(smem, smem, gK, gV, ub, uhk, j, n_blocks, s_k, dw, tid, scale_log2, rKn, rVn, 0)

            # [doc:fa2-half-inner-loop]
            # FA2.1 L8: S_i^(j) = Q_i K_j^T: per 16-wide k step, A = Q rows (16 x 16 per m tile, one ldmatrix),
            # B = K_j^T (16 x 8 per key tile: lane word K[g, 2t:2t+2] is B[2t:2t+2, g]; one ldmatrix for two tiles)
            mma_qk(smem, rS, OFF_Q, kbase, wrow, lanes, sx, wbase, lane)
            # Dev: the elementwise mask only on blocks the diagonal crosses, or the ragged last block
            mask_s(rS, row0, wrow, g, t, col0, s_k, causal_offset)

            # FA2.1 L9: m_new = max(m_old, rowmax S tau log2 e) (this lane's values, then its quad);
            # P~ = exp2(S tau log2 e - m_new), kept in rS as float32; l_i = e^(m_old - m_new) l_i + rowsum P~, per lane
            online_softmax(rS, rm, rl, ralpha, rkey, smem, col0, wrow, g, t, scale_log2, threshold, sx, wbase, lane)

            # FA2.1 L10: O_i = diag(e^(m_old - m_new)) O_i + P~ V_j (A = P~ from registers, B = V_j by ldmatrix.trans)
            mma_pv(smem, rS, rO, ralpha, vbase, lanes, sx, wbase, lane)
            # [/doc:fa2-half-inner-loop]

        # FA2.1 L12-L15: O_i = diag(l_i)^-1 O_i, L_i = m_i + log(l_i) (m_i in base 2), O_i rounded to half, both to HBM;
        # Dev: m_i (natural units) and l_i are saved too, apart, for the backward's P
        write_o_l(gO, gL, gm, gl, smem, rO, rm, rl, b, h, ub, uh, row0, wrow, g, t, s_q, dw, sx, wbase, lane, dropout_scale)

    # [/doc:fa2-half-kernel]
    return kernel


def default_features() -> dict:
    """``CP_ASYNC``: Q_i, K_j, V_j HBM -> SRAM by ``cp.async`` into two SRAM stages of K_j, V_j, where the head
    dim allows it (:func:`cp_async_ok`) and the inputs are 16-byte aligned (:func:`aligned16`); else, and
    with ``False``, the register path. ``PREFETCH`` (register path only): load K_{j+1}, V_{j+1} into
    registers during the compute of tile j (faster at every default tiling of the register path's sweep).
    ``EX2_FTZ``: ``P~ = 2^(S' - m)`` by ``ex2.approx.ftz.f32`` (:func:`numba_flash.tensorcore.ptx.make_exp2`): one
    instruction instead of four, and 0 instead of a subnormal below 2^-126; on since an H100 timed it 1.02-1.13x
    faster at N = 16k (bf16, three paired runs; the performance log's section "Half forward: one instruction per
    exp2")."""
    return {"CP_ASYNC": True, "PREFETCH": True, "EX2_FTZ": True}


def tiling(prob: Problem, block_sizes=None, features=None) -> tuple:
    """The tiling :func:`plan` launches for ``prob`` (``features`` over the defaults): ``(NW, MW, Bc, DP)``
    (:func:`config_for` of its head dim on the path the features take)."""
    feats = _plan.checked_features(default_features(), features)
    return config_for(prob.headdim, block_sizes, bool(feats["CP_ASYNC"]) and cp_async_ok(prob.headdim))


def plan(prob: Problem, block_sizes=None, config=None, features=None):
    """(kernel, grid, threads, dynamic SRAM bytes) of one launch, without launching."""
    if not handles(prob):
        raise ValueError(f"the half-precision kernel runs float16/bfloat16 inputs with an even head dim <= {HALF_MAX_HEADDIM}; "
                         f"got {prob.dtype} and headdim {prob.headdim}")
    d = prob.headdim
    feats = _plan.checked_features(default_features(), features)
    cp_async = bool(feats["CP_ASYNC"]) and cp_async_ok(d)  # Dev: d % 8 != 0 (d = 110): the register path
    NW, MW, Bc, DP = config if config is not None else tiling(prob, block_sizes, feats)
    prefetch = feats["PREFETCH"] if feats["PREFETCH"] is not None else DP <= 64
    prefetch = bool(prefetch) and not cp_async  # unused by the cp.async path: one compiled kernel, not two
    sim = _backend.is_simulator()
    Br = 16 * MW * NW
    nbytes = 4 * smem_words(NW, MW, Bc, DP, kv_stages(cp_async))
    _plan.check_sram(nbytes, Br, Bc, d)
    kernel = fa2_forward_half_kernel(NW, MW, Bc, DP, prob.causal, prob.dropout_p > 0, prefetch, sim, ptx.HALF_KINDS[prob.dtype], cp_async,
                                     bool(feats["EX2_FTZ"]))
    grid = bh_grid(ceil_div(prob.seqlen_q, Br), prob.batch * prob.nheads)
    return kernel, grid, 32 * NW, nbytes


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles: :func:`config_for` rounds an override to the tiling."""
    NW, MW, Bc, DP = config_for(prob.headdim, block_sizes)
    return 16 * MW * NW, Bc


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block, in bytes."""
    return plan(prob, block_sizes)[3]


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """The one launch of :func:`forward`, compiled for ``prob`` (not launched)."""
    return _plan.one_launch(f"FA2 forward tensor cores {prob.dtype}", plan(prob, block_sizes), *choose_block_sizes(prob, block_sizes))


def forward(q, k, v, prob: Problem, alloc, block_sizes=None, config=None, features=None):
    """FA2 Algorithm 1 on half words (:meth:`~numba_flash._launch.Allocator.to_words`): ``ForwardOutput``
    whose ``out`` is a word array (the caller's dtype through :meth:`~numba_flash._launch.Allocator.result`)."""
    features = _plan.register_path_if_unaligned(features, default_features(), q, k, v)  # Dev: an odd slice of a tensor
    # FA2.1 L17: return O, L
    return _plan.run_fa2_forward(plan(prob, block_sizes, config, features), q, k, v, prob, alloc, out_words=True)
