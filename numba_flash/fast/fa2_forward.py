"""FlashAttention-2 Algorithm 1, the fast kernel: register-blocked S and O tiles, 16-byte SRAM loads.

Paper: Dao, "FlashAttention-2", Algorithm 1 and section 3.3 (warps split over query rows). Same
algorithm, semantics and paper tags as the readable kernel :mod:`numba_flash.fa2_forward` (read that
one first); this file changes *who computes what* so that the arithmetic units are fed, and says so.

What changed from the readable kernel, and why
----------------------------------------------
* **Register blocking.** The readable kernel gives each thread one query row, so each multiply-add
  needs one shared-memory load (``sQ_i[t, x] * sK_j[c, x]``): SRAM bandwidth, not arithmetic, bounds it.
  Here ``TPR`` consecutive lanes share ``TM`` query rows; each thread keeps a ``TM x TN`` tile of
  ``S_ij`` and a ``TM x (d / TPR)`` tile of ``O_i`` in registers, so each value loaded from SRAM feeds
  ``TN`` (or ``TM``) multiply-adds.
* **16-byte SRAM loads.** All tiles live in one dynamic shared array indexed with unsigned integers
  from a 16-byte aligned base, so the compiler emits ``ld.shared.v4.f32`` (four floats per load).
  The row strides are padded (``d + 4`` and ``Bc + TPR``) so the 16-byte loads of a warp fall in
  different banks.
* **exp2 with the scale folded in.** ``Q_i`` is multiplied by ``tau * log2(e)`` when it is loaded, so
  ``S`` comes out in base-2 units and line 9 is ``exp2(S - m)`` (one MUFU.EX2 instruction); line 13
  converts back: ``L = m ln 2 + ln l``.
* **Warps split over query rows, with shuffles.** The ``TPR`` lanes of a row group are in one warp:
  the row max of line 9 is a ``shfl_xor`` butterfly inside the warp, ``P~`` goes through SRAM to the
  lanes that need it with only a warp barrier (``syncwarp``), and the row sum is kept per lane and
  reduced once, after the loop (FA2 section 3.1.1's point: fewer non-matmul operations). The
  simulator has no warp intrinsics: there the same steps go through SRAM and ``syncthreads``.
* **More than 48 KB of SRAM** (:mod:`numba_flash.runtime.smem`): a 64 x 64 block at ``d = 64`` needs
  about 70 KB.
* **Heaviest query blocks first** under causal masking (block ``x`` of the grid runs query block
  ``Tr - 1 - x``), so the long rows do not start last.
* Dropout scales by ``1/(1-p)`` once at line 12 instead of per element (flash-attn does the same).

* **K/V tiles: all loads of a tile in flight, and the next tile prefetched.** The loads of
  ``K_j, V_j`` are an unrolled loop into registers (unsigned indices, no wrap-around code), stored
  to SRAM after one round trip; the loads of ``K_{j+1}, V_{j+1}`` are issued before the compute on
  ``K_j, V_j`` (double buffering in registers: Numba has no ``cp.async``).

What it bought (one H200, fp32, FA2 convention ``b * N = 16k``, N = 4096, CUDA-event medians; the
full log with predictions is ``docs/notes/performance-log.md``, the committed sweep
``docs/results/fa2_h200.json``):

=====================================================  ==============  ==============
version (d = 64, non-causal)                           ms              TFLOP/s
=====================================================  ==============  ==============
readable kernel (:mod:`numba_flash.fa2_forward`)       420.6           1.3
register-blocked, 64 x 64, loop-loaded K/V             26.8            20.5
+ K/V loads unrolled (one round trip per tile)          22.7            24.2
+ prefetch of the next tile                            20.9            26.3
+ 8 x 8 S tile per thread, Br = 128 (the default)      18.7            29.4
torch naive fp32 / SDPA memory-efficient fp32          24.7 / 15.7     22.3 / 35.0
=====================================================  ==============  ==============

(the first four rows from the sweep runs, the last two from the committed benchmark run). So 23x the
readable kernel, 1.32x torch's naive fp32 attention and 0.84x SDPA's memory-efficient backend at
d = 64 (d = 128: 23.4 TFLOP/s, 0.75x naive, 0.52x SDPA). Levers that did *not* move the
time here: 16-byte SRAM loads and shuffles instead of SRAM reductions (measured before the load fix,
when the tile loads bounded the kernel), heaviest-first ordering of causal blocks.

Launch geometry
---------------
grid ``(Tr, batch * nheads)``, block ``NT = (Br / TM) * TPR`` threads. Thread ``tid`` is in row group
``rg = tid // TPR`` (lane ``tc = tid % TPR`` of it) and owns query rows ``rg + (Br/TM) * a`` for
``a < TM``, key columns ``tc + TPR * b`` for ``b < TN = Bc / TPR`` of ``S_ij``, and output columns
``4 tc + 4 TPR e + (0..3)`` of ``O_i``. ``d`` is padded to ``DP``, a multiple of ``4 TPR`` (zeros).

SRAM budget (float32 elements): ``sQ_i`` Br (DP+4) + ``sK_j, sV_j`` 2 Bc (DP+4) + ``sP_ij`` Br (Bc+TPR)
(+ Br TPR in the simulator for the reductions).
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

from .._launch import ForwardOutput, KernelLaunch, Problem, bh_grid, ceil_div
from ..device.constants import FULL_MASK as _FULL_MASK
from ..device.constants import U
from ..device.dropout import head_key, row_key
from ..device.grid import folded_query_head
from ..runtime import backend as _backend
from . import _plan, _regtile, _tiles

#: :func:`forward` puts nothing on the GPU but the allocator's outputs and launches through ``_smem.launch``
#: (:func:`numba_flash.fast._plan.run_fa2_forward`): an eager call may be replayed (:mod:`numba_flash.runtime.replay`)
REPLAYABLE = True


def _padded_d(d: int, TPR: int) -> int:
    return 4 * TPR * ((d + 4 * TPR - 1) // (4 * TPR))


@functools.cache
def config_for(d: int, block_sizes=None):
    """The tiling ``(NT, TM, TPR, Bc, DP)`` for head dim ``d``.

    Defaults (chosen by the sweep in bench/fa2_sweep.py on an H200, see
    docs/notes/performance-log.md): 128 threads, ``TPR = 8`` lanes per row group; for ``d <= 64``
    ``TM = 8`` rows per thread (``Br = 128``, ``Bc = 64``, an 8 x 8 S tile per thread), above it
    ``TM = 4`` (``Br = 64``, ``Bc = 32``: SRAM and the 4 x 16 O tile bound it). Above ``d = 128``
    (not measured on a GPU yet): 256 threads, ``TM = 2`` (``Br = 64``, ``Bc = 32``), so a thread's O
    tile (``TM x DP / 8``) and K/V prefetch registers stay those of ``d = 128`` (64 floats each at
    ``d = 256``); SRAM ``Br (DP+4) + 2 Bc (DP+4) + Br (Bc+8)`` = 140 KB at ``d = 256``.
    ``block_sizes=(Br, Bc)`` is honoured up to the tiling's granularity: ``Bc`` is
    rounded up to a multiple of ``max(4, TPR)`` and ``Br`` up to a multiple of ``TM``.
    """
    if block_sizes is None:
        if d <= 64:
            return 128, 8, 8, 64, _padded_d(d, 8)  # Br = 128: an 8 x 8 S tile per thread
        if d <= 128:
            return 128, 4, 8, 32, _padded_d(d, 8)  # Br = 64, Bc = 32: O is 4 x 16 per thread at d = 128
        return 256, 2, 8, 32, _padded_d(d, 8)  # Br = 64, Bc = 32: O is 2 x 32 per thread at d = 256
    Br, Bc = (int(n) for n in block_sizes)
    TPR = 8
    while TPR > 1 and TPR > Bc:
        TPR //= 2
    step = max(4, TPR)
    Bc = step * ((Bc + step - 1) // step)
    TM = 4
    while TM > 1 and Br % TM:
        TM //= 2
    NT = ((Br + TM - 1) // TM) * TPR
    if NT > 1024:
        raise ValueError(f"block_sizes: Br={Br} needs {NT} threads per block in the fast kernel (at most 1024)")
    return NT, TM, TPR, Bc, _padded_d(d, TPR)


def smem_floats(NT, TM, TPR, Bc, DP, shfl=True):
    """Dynamic SRAM of the fast kernel in float32 elements (see the module docstring)."""
    Br = (NT // TPR) * TM
    n = Br * (DP + 4) + 2 * Bc * (DP + 4) + Br * (Bc + TPR)
    if not shfl:
        n += Br * TPR
    return n


@functools.cache
def fa2_forward_fast_kernel(NT: int, TM: int, TPR: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, SHFL: bool, VEC: bool, REVERSE: bool = True, PREFETCH: bool = True):
    """The register-blocked FA2 forward kernel for one specialization (see the module docstring).

    ``SHFL``: row max / row sum across the lanes of a row group with warp shuffles (GPU) or through
    SRAM with block barriers (required in the simulator; on a GPU it measures what shuffles buy).
    ``VEC``: declare the SRAM 16-byte aligned so the compiler emits 16-byte loads (not in the
    simulator). ``REVERSE``: run the heaviest causal query blocks first. ``PREFETCH``: issue the
    loads of ``K_{j+1}, V_{j+1}`` before computing on ``K_j, V_j``.

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, O, L             gQ, gK, gV, gO, gL   HBM
    Q_i (times tau log2 e)    smem[OFF_Q ...]      SRAM (Br, DP+4), loaded once (L4)
    K_j, V_j                  smem[OFF_K/OFF_V]    SRAM (Bc, DP+4) each, loaded each step (L7)
    S_i^(j) (base 2)          rS                   registers, TM x TN per thread
    P~_i^(j)                  smem[OFF_P ...]      SRAM (Br, Bc+TPR); rows shared by one warp only
    O_i^(j) (un-normalized)   rO                   registers, TM x (DP / TPR) per thread
    m_i, l_i (base 2)         rm, rl               registers (rl: this lane's partial sum); saved as gm, gl
    e^(m_old - m_new)         ralpha               registers (first rowmax S, then the rescale factor)
    ========================  ===================  ==================================================
    """
    RG = NT // TPR  # row groups per block (TPR lanes each)
    BR = RG * TM  # query rows of the block (Br)
    TN = BC // TPR  # key columns of S per lane
    DV = DP // (4 * TPR)  # 4-float vectors of O per row per thread
    SQ = DP + 4  # row stride of the Q, K, V tiles (floats)
    SPS = BC + TPR  # row stride of the P tile
    uTPR = U(TPR)
    # Offsets (floats) of the tiles in the one dynamic SRAM array `smem`:
    OFF_Q = U(0)  # Q_i: (Br, SQ), rows of d values times tau log2 e, zero-padded to DP
    OFF_K = U(BR * SQ)  # K_j: (Bc, SQ)
    OFF_V = U(BR * SQ + BC * SQ)  # V_j: (Bc, SQ)
    OFF_P = U(BR * SQ + 2 * BC * SQ)  # P~_ij: (Br, SPS); row group rg's rows are read by its own warp only
    OFF_R = U(BR * SQ + 2 * BC * SQ + BR * SPS)  # without SHFL: reduction scratch (Br, TPR)
    SRAM_REDUCE = not SHFL  # the simulator has no warp shuffles
    U0 = U(0)
    ALIGN = 16 if VEC else None
    # Register-array sizes (local-array sizes must be plain constants for Numba):
    NS = TM * TN  # rS: the TM x TN tile of S_ij
    NO = TM * DV * 4  # rO: the TM x (DP / TPR) tile of O_i
    NQ = TM * 4  # rq, rp: one 4-column step of Q_i (or P~) for the TM rows
    NEG_INF = float32(-math.inf)

    # K_j, V_j: HBM -> registers (NL floats each per thread) -> SRAM; Q_i: HBM -> SRAM, times tau log2 e
    NL, load_kv, store_kv = _tiles.make_pair_loader(BC, DP, NT, SQ)
    load_q = _tiles.make_scaled_q_loader(BR, DP, NT, SQ)
    n_key_blocks, _ = _tiles.make_block_counts(BR, BC, CAUSAL)

    # Dev: dropout's 1/(1-p) once, at L12 (not on each P~)
    qkt_tile, mask_tile, row_max_tile, row_sum_lanes, softmax_p_tile, pv_tile, store_o_row, natural_stats = _regtile.make_forward_steps(
        TM, TN, DV, RG, TPR, DP, SQ, SPS, BC, CAUSAL, DROPOUT, not SRAM_REDUCE, False)

    # [doc:fa2-fast-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gO, gL, gm, gl, scale_log2, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32, alignment=ALIGN)  # all tiles; offsets OFF_*
        tid = U(cuda.threadIdx.x)
        scale_log2 = float32(scale_log2)  # Dev: float32, so the backward rounds tau log2 e Q exactly as here
        rS = cuda.local.array(NS, float32)  # S_ij tile (registers)
        rO = cuda.local.array(NO, float32)  # O_i tile (registers)
        rm = cuda.local.array(TM, float32)
        rl = cuda.local.array(TM, float32)
        ralpha = cuda.local.array(TM, float32)
        rq = cuda.local.array(NQ, float32)
        rp = cuda.local.array(NQ, float32)
        rkey = cuda.local.array(TM, uint64)
        rKn = cuda.local.array(NL, float32)  # K_j / K_{j+1} in flight (registers)
        rVn = cuda.local.array(NL, float32)

        rg = tid // uTPR
        tc = tid % uTPR
        nheads, b, h, s_q, s_k, d = folded_query_head(gQ, gK)  # Dev: b*h folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        hk = h // group
        ub, uh, uhk = U(b), U(h), U(hk)  # Dev: unsigned HBM indices: no negative-index wrap-around code per load
        # FA2.1 L3: for i = 1..Tr -- one thread block per i; Dev: the heaviest (causal) blocks first
        i = cuda.gridDim.x - 1 - cuda.blockIdx.x if REVERSE else cuda.blockIdx.x
        row0 = i * BR

        # FA2.1 L4: load Q_i (times tau log2 e: exp2 later) from HBM to SRAM; rows past N_q and columns past d are zero
        load_q(gQ, smem, OFF_Q, ub, uh, row0, s_q, d, tid, scale_log2)  # HBM read: Br*d
        # FA2.1 L5: on chip, O_i = 0, l_i = 0, m_i = -inf
        for a in range(TM * DV * 4):
            rO[a] = float32(0.0)
        for a in range(TM):
            rm[a] = NEG_INF
            rl[a] = float32(0.0)
            rkey[a] = uint64(0)
            if DROPOUT:
                rkey[a] = row_key(head_key(seed, b * nheads + h), row0 + int(rg) + RG * a)

        # Dev: causal block skipping: key blocks past the last row's horizon are never visited
        n_blocks = n_key_blocks(row0 + BR, s_k, causal_offset)

        # Dev: K_j, V_j travel HBM -> registers -> SRAM. All NL loads of a thread are issued before the
        # first store (one memory round trip per tile); with PREFETCH the loads of tile j+1 are issued
        # before the compute of tile j, so their latency hides behind it (double buffering in registers).
        if n_blocks > 0:
            load_kv(gK, gV, ub, uhk, 0, s_k, d, tid, rKn, rVn)
        # FA2.1 L6: for j = 1..Tc
        for j in range(n_blocks):
            col0 = j * BC
            cuda.syncthreads()  # Sync: all warps are done with K_{j-1}, V_{j-1} (and Q_i is stored) before the stores
            # FA2.1 L7: load K_j, V_j from HBM to SRAM (coalesced along d; ragged rows and padded columns zero)
            if not PREFETCH and j > 0:
                load_kv(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
            store_kv(smem, OFF_K, OFF_V, tid, rKn, rVn)
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before L8 and L10 read them
            if PREFETCH and j + 1 < n_blocks:
                load_kv(gK, gV, ub, uhk, col0 + BC, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d (tile j+1)

            # [doc:fa2-fast-inner-loop]
            # FA2.1 L8: S_i^(j) = Q_i K_j^T, a TM x TN register tile per thread, 16-byte SRAM loads
            qkt_tile(smem, OFF_Q, OFF_K, rg, tc, rS, rq)
            # Dev: the elementwise mask only on blocks the diagonal crosses, or the ragged last block
            mask_tile(rS, row0, col0, rg, tc, s_k, causal_offset)

            # FA2.1 L9: m_new = max(m_old, rowmax S) (butterfly over the TPR lanes of a row); P~ = exp2(S - m_new)
            row_max_tile(smem, OFF_R, rg, tc, rS, ralpha)
            # Dev: dropout as FA1 Alg.2 L14 (the 1/(1-p) is applied once, at L12); l_i = e^(m_old - m_new) l_i
            # + rowsum P~ kept per lane, the lanes are summed once, after L11
            softmax_p_tile(smem, OFF_P, rg, tc, col0, rS, rm, ralpha, ralpha, rl, rkey, threshold, dropout_scale)
            if SRAM_REDUCE:
                cuda.syncthreads()  # Sync: (no shuffles) P~_ij rows in SRAM before L10 reads them
            else:
                cuda.syncwarp(_FULL_MASK)  # Sync: P~ rows in SRAM before L10; written and read by the lanes of one warp only

            # FA2.1 L10: O_i = diag(e^(m_old - m_new)) O_i + P~ V_j, a TM x (DP/TPR) register tile
            for a in range(TM):
                for e in range(DV * 4):
                    rO[a * DV * 4 + e] *= ralpha[a]
            pv_tile(smem, OFF_P, OFF_V, rg, tc, rO, rp)
            # [/doc:fa2-fast-inner-loop]

        # Dev: the per-lane row sums l_i are added across the TPR lanes of each row group, once
        row_sum_lanes(smem, OFF_R, rg, tc, rl)

        for a in range(TM):
            row = row0 + int(rg) + RG * a
            if row < s_q:
                l_i = rl[a]
                # FA2.1 L12: O_i = diag(l_i)^-1 O_i, the only division (times 1/(1-p) with dropout)
                inv_l = float32(0.0)
                if l_i > 0:
                    inv_l = float32(1.0) / l_i
                    if DROPOUT:
                        inv_l *= dropout_scale
                # FA2.1 L13: L_i = m_i + log(l_i), m_i in base 2: L = m ln 2 + ln l (+inf for a row with no key);
                # Dev: m_i (natural units) and l_i are saved too, apart, for the backward's P (make_natural_stats)
                m_nat, l_m, L_i = natural_stats(rm[a], l_i)
                # FA2.1 L14: write O_i to HBM (4 consecutive floats per lane, lanes consecutive)
                store_o_row(gO, ub, row, uh, tc, d, rO, a, inv_l)  # HBM write: Br*d
                # FA2.1 L15: write L_i to HBM (one lane per row)
                if tc == U0:
                    gL[b, h, row] = L_i  # HBM write: Br
                    gm[b, h, row] = m_nat  # HBM write: Br
                    gl[b, h, row] = l_m  # HBM write: Br

    # [/doc:fa2-fast-kernel]
    return kernel


def default_features() -> dict:
    """The kernel features used on this backend: shuffles and 16-byte loads on a GPU only."""
    gpu = not _backend.is_simulator()
    return {"SHFL": gpu, "VEC": gpu, "REVERSE": True, "PREFETCH": True}


def tiling(prob: Problem, block_sizes=None, features=None) -> tuple:
    """The tiling :func:`plan` launches for ``prob``: ``(NT, TM, TPR, Bc, DP)`` (:func:`config_for` of its head dim; the
    mask, length and ``features`` do not change it)."""
    return config_for(prob.headdim, block_sizes)


def plan(prob: Problem, block_sizes=None, config=None, features=None):
    """(kernel, grid, threads, dynamic SRAM bytes) of one launch, without launching."""
    d = prob.headdim
    NT, TM, TPR, Bc, DP = config if config is not None else tiling(prob, block_sizes, features)
    feats = _plan.checked_features(default_features(), features)
    Br = (NT // TPR) * TM
    nbytes = 4 * smem_floats(NT, TM, TPR, Bc, DP, feats["SHFL"])
    _plan.check_sram(nbytes, Br, Bc, d)
    kernel = fa2_forward_fast_kernel(NT, TM, TPR, Bc, DP, prob.causal, prob.dropout_p > 0, feats["SHFL"], feats["VEC"], feats["REVERSE"], feats["PREFETCH"])
    grid = bh_grid(ceil_div(prob.seqlen_q, Br), prob.batch * prob.nheads)
    return kernel, grid, NT, nbytes


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles (the kernel contract): :func:`config_for` rounds an override to the tiling."""
    NT, TM, TPR, Bc, DP = config_for(prob.headdim, block_sizes)
    return (NT // TPR) * TM, Bc


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block, in bytes."""
    return plan(prob, block_sizes)[3]


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """The one launch of :func:`forward`, compiled for ``prob`` (not launched)."""
    return _plan.one_launch("FA2 forward fast", plan(prob, block_sizes), *choose_block_sizes(prob, block_sizes))


def forward(q, k, v, prob: Problem, alloc, block_sizes=None, config=None, features=None) -> ForwardOutput:
    """FA2 Algorithm 1, fast kernel, on kernel arrays: ``ForwardOutput(out, lse)``.

    ``config=(NT, TM, TPR, Bc, DP)`` overrides the tiling and ``features`` (dict of ``SHFL``, ``VEC``,
    ``REVERSE``) the kernel features (the sweep in bench/fa2_sweep.py uses both);
    otherwise :func:`config_for` picks the tiling from ``d`` and ``block_sizes``.
    """
    fwd = _plan.run_fa2_forward(plan(prob, block_sizes, config, features), q, k, v, prob, alloc)
    # FA2.1 L17: return O, L
    return fwd
