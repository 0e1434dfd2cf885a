"""FA1 Algorithm 4 as a Numba CUDA kernel: the FlashAttention backward pass by recomputation.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 4 (Appendix B.4) and Theorem 5. The
NumPy twin, line for line, is :mod:`numba_flash_reference.alg4_backward`.

What a reader learns
--------------------
* The backward pass never needs the N x N matrices ``S``, ``P`` or the dropout mask: each tile
  ``S_ij`` is recomputed on chip from ``Q_i, K_j`` (line 11), ``P_ij`` from the forward's *final*
  row statistics ``m_i, l_i`` (line 13, the exact softmax, no online rescaling), and ``Z_ij`` from the
  seed (line 14, the same counter hash as the forward: :mod:`numba_flash.device.dropout`). Extra memory is
  O(N) per head; HBM traffic Theta(N^2 d^2 / M) instead of Algorithm 3's Theta(N d + N^2).
* The D trick (line 19): ``D_i = rowsum(dO_i o O_i)``, a length-d dot product per row, replaces the
  length-N ``rowsum(P_i o dP_i)`` of Algorithm 3 line 3.
* Which accumulator lives where: ``dK~_j, dV~_j`` sum over the inner loop (all row blocks ``i``) and
  stay in registers for the whole inner loop; ``dQ_i`` sums over the *outer* loop (all ``j``), so it is
  read, updated and written back in HBM on every ``(i, j)`` (line 21), as the paper does. One thread
  block owns a whole (batch, head), so these read-modify-writes need no atomics (FA2 moves the
  parallelism to the column blocks and pays with atomics on dQ: :mod:`numba_flash.fa2_backward`).

Launch geometry and loop structure
----------------------------------
Grid: one thread block per (batch, query head), ``b * h`` blocks (FA1's parallelism, Section 3.1 of
FA2: it fills the GPU only when ``b * h`` is about the number of SMs or more). Block: ``NT`` threads
(:func:`default_threads`: 256 for the default tiles). Inside a block, the paper's loops::

    for j in 0..Tc-1:                      # L6: K_j, V_j -> SRAM; dK~_j, dV~_j = 0 in registers
        for i in 0..Tr-1:                  # L9
            L10  Q_i, dO_i -> SRAM; l_i, m_i; dQ_i -> registers; dO_i o O_i sums  | barrier
            L11-L15  S_ij, P_ij, Z_ij, P~_ij -> SRAM       (thread: RA x CA tile)
            L17-L20  dP_ij, D_i, dS_ij -> SRAM             (same tile)            | barrier
            L16  dV~_j += P~^T dO_i   (thread: RB x CB tile of dV~_j)
            L21  dQ_i += tau dS K_j   (thread: RQ x CB tile of dQ_i, read-modify-write in HBM)
            L22  dK~_j += dS^T Q_i    (thread: RB x CB tile of dK~_j)              | barrier
        L24  dK_j = tau dK~_j, dV_j = dV~_j -> HBM

Each thread owns strided register tiles (rows ``ty + TY*a``, columns ``tx + TX*b``) so that a warp's
shared-memory reads are broadcasts or hit distinct banks, and its HBM accesses are coalesced.

GQA/MQA: ``dK, dV`` of a key/value head are sums over the ``G = h / h_k`` query heads of its group.
Departure from the reference (which loops the group's heads inside the ``j`` loop): one block per
*query* head, each writing its own partial dK, dV to an O(N)-per-head scratch array, and a small second
kernel that sums each group (deterministic, no atomics). Looping the group inside one block would cut
the grid to ``b * h_k`` blocks: under MQA a handful of SMs would do all the work.

Block-sparse (Algorithm 5): the same kernel compiled with ``sparse=True`` runs Algorithm 5's test
``if M_ij != 0`` (tagged ``Alg.5 L8``) around lines 10-22 and skips the zero tiles of a block mask
(:mod:`numba_flash.alg5_block_sparse`); the dense kernel compiles without it.

SRAM budget
-----------
Per block, float32: ``K_j, V_j``: 2 Bc (d|1); ``Q_i, dO_i``: 2 Br (d|1) (rows padded to an odd length
so that column reads across rows hit distinct banks); ``P~_ij, dS_ij``: 2 Br Bc; D_i partials, m_i,
1/l_i: Br (TLX + 2). ``S_ij, dP_ij`` and the accumulators ``dK~_j, dV~_j, dQ_i`` live in registers.
``O_i`` never enters SRAM: it is only needed for line 19's dot products, formed while loading.
At d = 64 with Br = Bc = 32: 41.8 KB, under numba-cuda's 48 KB static limit (:func:`tile_sram_bytes`);
at d = 128 the default is Br = 16, Bc = 24 (44.4 KB). With one block per SM an SM could give a block
up to 227 KB, but only through dynamic shared memory with a driver opt-in (:mod:`numba_flash.runtime.smem`);
this readable kernel keeps the paper's named, statically sized tiles.

What it costs (measured in an earlier run; ``docs/results/backward_d64_h200.json`` now holds the fast twin's)
---------------------------------------------------------------------------------------------------------------
On an H200 at N = 4096, d = 64, b = 4, h = 32 (fp32) this backward takes about 253 ms (5.4 TFLOP/s)
against 185 ms for the standard Algorithm 3, and it needs O(N) extra memory (2 MiB) where Algorithm 3
needs three N x N matrices (24 GiB). The recomputation does not pay here: fp32 matrix products on the
CUDA cores run at ~7 TFLOP/s even in the tiled standard kernels, so standard attention is bound by
arithmetic, not by the HBM traffic FlashAttention removes (its ~12 passes over 8.6 GB N x N matrices take
~25 ms at 4.2 TB/s); and FA1's grid of one block per (batch, head) puts a single 8-warp block on each
SM (fewer blocks than SMs once b * h < 132, e.g. N >= 8192 at 16k tokens), with tiles capped by the
48 KB of static shared memory. FA2's sequence parallelism and bigger tiles are the paper's answers.

Run it (the public entry point is :func:`numba_flash.flash_attn_func` with ``algorithm="flash1"``;
on a machine without a GPU this runs in Numba's CUDA simulator)::

    >>> import numpy as np
    >>> from numba_flash import attention_numpy, attention_backward_numpy
    >>> q, k, v, do = np.random.default_rng(0).standard_normal((4, 1, 12, 2, 4)).astype(np.float32)
    >>> out, stats = attention_numpy(q, k, v, causal=True, return_stats=True, block_sizes=(8, 8))
    >>> dq, dk, dv = attention_backward_numpy(do, q, k, v, out, stats)
    >>> dq.shape, dk.shape
    ((1, 12, 2, 4), (1, 12, 2, 4))

This is the *readable* kernel (variant ``"readable"``). The default (variant ``"fast"``) is its twin
:mod:`numba_flash.fast.alg4_backward`: the same schedule (one block per (batch, head), ``j`` outer,
``i`` inner, ``dQ_i`` read-modify-written in HBM) with register-blocked tiles, 64 x 128 tiles in
dynamic SRAM and prefetched row blocks; its docstring says what changed and what it bought (same H200
shape: 46 ms instead of 253 ms, so forward + backward is 4.0x faster than the standard path). Run
this one with ``flash_attn_func(..., algorithm="flash1", variant="readable")``.

Tests: ``python -m pytest tests/kernels/test_backward_kernels.py tests/test_autograd.py -k flash1``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from ._launch import STATIC_SMEM_BYTES, KernelLaunch, Problem, block_mask_arrays, ceil_div
from ._tiles_readable import load_tile
from .device.dropout import head_key, keep, row_key
from .device.gqa import group_sum, per_head_grads
from .runtime import backend as _backend

#: Largest number of threads per block :func:`default_threads` picks.
MAX_THREADS = 256


def _pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1)


def default_block_sizes(d: int) -> tuple[int, int]:
    """(Br, Bc) used when none are given: (32, 32) up to d = 64, (16, 24) up to d = 128, (16, 16) up to
    d = 160, (8, 16) up to d = 240, (8, 12) up to d = 256.

    Both fit 48 KB (:func:`tile_sram_bytes`); a larger ``Bc`` means fewer passes of line 21's dQ
    read-modify-write (``Tc = N / Bc``), which is why the d = 128 tile is wider than it is tall
    (the tile sweep ``bench/alg4_sweep.py`` measures the alternatives).

    FA1's formula (Algorithm 1 line 1, ``Bc = ceil(M/4d)``, ``Br = min(Bc, d)``) assumes the backward
    pass can keep about 2.5 M elements on chip; this kernel keeps the budget of :func:`tile_sram_bytes`
    under numba-cuda's 48 KB static limit instead.
    """
    if d <= 128:
        return (32, 32) if d <= 64 else (16, 24)
    return (16, 16) if d <= 160 else (8, 16) if d <= 240 else (8, 12)


def default_threads(Br: int, Bc: int, d: int) -> int:
    """Threads per block: about 8 outputs of the largest per-tile product per thread, 32..256.

    With one block per SM (FA1's grid), more warps hide more latency, up to the register file: 512
    threads must fit in 128 registers each, and the spills cost more than the extra warps gain (H200,
    d = 64, N = 4096, b = 4, h = 32, tiles (32, 32): 256 ms with 256 threads, 310 ms with 512;
    ``docs/results/sweeps/alg4_sweep_h200.log``, from ``bench/alg4_sweep.py``).
    """
    work = max(Br * Bc, Bc * d, Br * d)
    return int(min(MAX_THREADS, max(32, 32 * ceil_div(ceil_div(work, 8), 32))))


@dataclass(frozen=True)
class Alg4Config:
    """Tile sizes and thread layouts of one compiled kernel (all compile-time constants)."""

    Br: int
    Bc: int
    d: int
    threads: int

    @property
    def DP(self) -> int:
        """Row stride of the (., d) SRAM tiles: d made odd, so rows start in different banks."""
        return self.d | 1

    # Phase L11-L20: the (Br, Bc) tiles S_ij, dP_ij; threads TAY x TAX, each RA x CA outputs.
    @property
    def TAX(self) -> int:
        return min(_pow2_floor(self.Bc), 16, self.threads)

    @property
    def TAY(self) -> int:
        return self.threads // self.TAX

    @property
    def RA(self) -> int:
        return ceil_div(self.Br, self.TAY)

    @property
    def CA(self) -> int:
        return ceil_div(self.Bc, self.TAX)

    # Phase L16, L21, L22: the (Bc, d) tiles dV~_j, dK~_j and the (Br, d) tile of dQ_i.
    @property
    def TBX(self) -> int:
        return min(_pow2_floor(self.d), 32, self.threads)

    @property
    def TBY(self) -> int:
        return self.threads // self.TBX

    @property
    def RB(self) -> int:
        return ceil_div(self.Bc, self.TBY)

    @property
    def RQ(self) -> int:
        return ceil_div(self.Br, self.TBY)

    @property
    def CB(self) -> int:
        return ceil_div(self.d, self.TBX)

    # Phase L10: loading the Br rows of Q_i, dO_i; TLX threads per row.
    @property
    def TLX(self) -> int:
        return max(1, self.threads // self.Br)

    @property
    def TLY(self) -> int:
        return self.threads // self.TLX

    @property
    def loads(self) -> tuple[int, int]:
        """(RL, CL): rows and columns of Q_i per loading thread (L10). K_j, V_j (L7) are strided over all threads."""
        return ceil_div(self.Br, self.TLY), ceil_div(self.d, self.TLX)

    @property
    def exact(self) -> tuple[bool, ...]:
        """Which register-tile indices never run past the tile (else they are clamped on read, skipped on
        write): rows and columns of the L11-L20 tile, rows of dV~_j, dK~_j and of dQ_i, columns of d."""
        return (self.TAY * self.RA == self.Br, self.TAX * self.CA == self.Bc, self.TBY * self.RB == self.Bc,
                self.TBY * self.RQ == self.Br, self.TBX * self.CB == self.d)

    @property
    def sram_bytes(self) -> int:
        floats = 2 * self.Bc * self.DP + 2 * self.Br * self.DP + 2 * self.Br * self.Bc + self.Br * (self.TLX + 2)
        return 4 * floats


def tile_sram_bytes(Br: int, Bc: int, d: int, threads: int | None = None) -> int:
    """Static shared memory of the kernel for these tiles (see the module docstring)."""
    return Alg4Config(Br, Bc, d, threads or default_threads(Br, Bc, d)).sram_bytes


@functools.cache
def alg4_kernel(cfg: Alg4Config, causal: bool, dropout: bool, stats_from_lse: bool, sparse: bool = False):
    """Compile (once per configuration) the Algorithm 4 kernel for the tiles and options of ``cfg``.

    ``stats_from_lse``: the forward saved only the logsumexp ``L`` (FA2's statistic), passed as ``m``
    with ``l = 1``: then line 13's ``diag(l)^-1 exp(S - m)`` is ``exp(S - L)``, the same P.

    ``sparse``: Algorithm 5's test ``if M_ij != 0`` around lines 10-22, the block-sparse backward
    (:mod:`numba_flash.alg5_block_sparse`); the dense kernel never reads the block-mask arguments.
    """
    BR, BC, D, NT, DP = cfg.Br, cfg.Bc, cfg.d, cfg.threads, cfg.DP
    TAX, TAY, RA, CA = cfg.TAX, cfg.TAY, cfg.RA, cfg.CA
    TBX, TBY, RB, RQ, CB = cfg.TBX, cfg.TBY, cfg.RB, cfg.RQ, cfg.CB
    TLX, TLY = cfg.TLX, cfg.TLY
    RL, CL = cfg.loads  # L10: RL rows x CL columns of Q_i per loading thread
    # Which register-tile indices can run past the tile (then they are clamped on read, skipped on write).
    A_ROWS_EXACT, A_COLS_EXACT, B_ROWS_EXACT, Q_ROWS_EXACT, B_COLS_EXACT = cfg.exact
    CAUSAL, DROPOUT, FROM_LSE, SPARSE = bool(causal), bool(dropout), bool(stats_from_lse), bool(sparse)
    # GPU only (the simulator rejects the option): cap registers so that NT threads fit one SM's 64K.
    jit_options = {} if _backend.is_simulator() else {"max_registers": min(255, 65536 // NT // 8 * 8)}
    INF = float32(math.inf)
    ZERO = float32(0.0)
    ONE = float32(1.0)

    @cuda.jit(**jit_options)
    def kernel(gQ, gK, gV, gO, gdO, gm, gl, gdQ, gdK, gdV, tau, dropout_scale, s_q, s_k, nheads, group, causal_offset, seed, threshold,
               gmask, gspan, gcol):
        """One (batch, query head) per block: Algorithm 4 lines 1-24.

        Symbol table (paper -> variable -> memory space):

        ===============  =====================  ====================================
        Q_i, dO_i        sQ_i, sdO_i            SRAM (Br, d)
        K_j, V_j         sK_j, sV_j             SRAM (Bc, d)
        O_i              gO                     HBM (read only for line 19)
        m_i, l_i         sm_i, sinv_l_i         SRAM (Br,) (1/l_i, 0 for empty rows)
        M (Alg.5)        gmask, gspan, gcol     HBM (the block mask and what is derived from it)
        S_ij -> P_ij     rS                     registers (RA, CA) per thread
        dP_ij            rdP                    registers (RA, CA)
        Z_ij             rZ                     registers (regenerated, never stored)
        P_ij^dropped     sP_drop                SRAM (Br, Bc)
        dS_ij            sdS_ij                 SRAM (Br, Bc)
        D_i              sD_part -> D_r         SRAM (Br, TLX) partial sums -> register
        dK~_j, dV~_j     rdK, rdV               registers (RB, CB) per thread
        dQ_i             gdQ -> rdQ_old (+rdQ)  HBM, read at L10 into registers, written at L21
        dK_j, dV_j       gdK, gdV               HBM (this query head's share under GQA)
        tau, R           tau, seed              kernel arguments
        ===============  =====================  ====================================
        """
        # Written out whole on purpose: lines 11 and 17 (S_ij = Q_i K_j^T, dP_ij = dO_i V_j^T), 16 and 22
        # (dV~_j += P~^T dO_i, dK~_j += dS^T Q_i), 21 and 24 (guarded HBM stores) are the same loops on other
        # operands, but the paper gives each its own line, and the reader sees each product where its line
        # is, in the register layout it runs in (RA x CA, RB x CB, RQ x CB). Only the tile copy is shared.
        sK_j = cuda.shared.array((BC, DP), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, DP), float32)  # (Bc, d) SRAM
        sQ_i = cuda.shared.array((BR, DP), float32)  # (Br, d) SRAM
        sdO_i = cuda.shared.array((BR, DP), float32)  # (Br, d) SRAM
        sP_drop = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM: P_ij^dropped
        sdS_ij = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        sD_part = cuda.shared.array((BR, TLX), float32)  # (Br, TLX) SRAM: partial sums of dO_i o O_i
        sm_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sinv_l_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        rdK = cuda.local.array((RB, CB), float32)  # dK~_j: this thread's (RB, CB) share, registers
        rdV = cuda.local.array((RB, CB), float32)  # dV~_j: registers
        rdQ = cuda.local.array((RQ, CB), float32)  # dS_ij K_j for this thread's (RQ, CB) share of dQ_i
        rdQ_old = cuda.local.array((RQ, CB), float32)  # dQ_i as loaded at line 10: registers
        rS = cuda.local.array((RA, CA), float32)  # S_ij, then P_ij: registers
        rdP = cuda.local.array((RA, CA), float32)  # dP_ij^dropped: registers
        rZ = cuda.local.array((RA, CA), float32)  # Z_ij: registers
        ra = cuda.local.array(RA, float32)
        rb = cuda.local.array(CA, float32)
        rx = cuda.local.array(CB, float32)

        t = cuda.threadIdx.x
        bh = cuda.blockIdx.x  # = batch * nheads + query head: also the dropout hash's head index
        bi = bh // nheads
        hi = bh - bi * nheads
        hk = hi // group  # the key/value head this query head reads (GQA/MQA)
        mb = bi if gmask.shape[0] > 1 else 0  # Alg.5: the block mask's batch and head (1 = shared, broadcast)
        mh = hi if gmask.shape[1] > 1 else 0
        ax = t % TAX  # L11-L20 layout: columns ax + TAX*b of the tile, rows ay + TAY*a
        ay = t // TAX
        bx = t % TBX  # L16/L21/L22 layout: head-dim columns bx + TBX*e, rows by + TBY*a
        by = t // TBX
        lx = t % TLX  # L10 layout: TLX threads per row of Q_i
        ly = t // TLX

        # Alg.4 L1: set the PRNG state to R: the counter hash's key for this (batch, head) and seed
        k_bh = head_key(seed, bh)
        # Alg.4 L2: block sizes Br = BR, Bc = BC: compile-time constants of this kernel (default_block_sizes)
        # Alg.4 L3-L4: Q, O, dO, l, m split into Tr row blocks; K, V into Tc column blocks (ragged tails)
        Tr = (s_q + BR - 1) // BR
        Tc = (s_k + BC - 1) // BC
        # Alg.4 L5: dQ = 0 in HBM. Dev: not a separate pass: the first visit of row block i (j = 0, or its first
        # non-zero tile under a block mask) reads zeros instead of dQ_i at line 10 and stores dQ_i at line 21 (dK, dV
        # are written whole at line 24), so every element is written by the kernel and a NaN poison catches a miss.

        # Alg.4 L6: for j = 1..Tc (outer loop: K_j, V_j and the dK~_j, dV~_j accumulators stay on chip)
        for j in range(Tc):
            col0 = j * BC
            # Alg.4 L7: load K_j, V_j into SRAM (zeros past s_k)
            if not SPARSE or gcol[mb, mh, j] != 0:  # Dev: Alg.5 loads no K_j, V_j for a column with no non-zero tile
                load_tile(sK_j, gK, bi, col0, hk, s_k, D, t, NT)  # HBM read: Bc*d
                load_tile(sV_j, gV, bi, col0, hk, s_k, D, t, NT)  # HBM read: Bc*d
            # Alg.4 L8: dK~_j = dV~_j = 0 (Bc x d), on chip
            for a in range(RB):
                for e in range(CB):
                    rdK[a, e] = ZERO
                    rdV[a, e] = ZERO

            # [doc:alg4-inner-loop]
            # Alg.4 L9: for i = 1..Tr (inner loop over the row blocks)
            for i in range(Tr):
                # Alg.5 L8: if M_ij != 0 (Algorithm 4 with Algorithm 5's test): a zero tile is skipped whole (dense: no test)
                if SPARSE and gmask[mb, mh, i, j] == 0:
                    continue
                row0 = i * BR
                first = j == gspan[mb, mh, i, 0] if SPARSE else j == 0  # the first visit of row block i
                # Alg.4 L10: load Q_i, dO_i into SRAM, l_i, m_i, and dQ_i (into the registers of the threads
                # that update it at line 21: its HBM latency then overlaps lines 11-20).
                # Dev: line 19's products dO_i o O_i are formed during this load and summed per thread,
                # so O_i, needed for nothing else, never takes SRAM.
                for a in range(RQ):
                    row = row0 + by + TBY * a
                    for e in range(CB):
                        c = bx + TBX * e
                        val = ZERO  # first visit: line 5's dQ = 0, never read from HBM
                        if not first and row < s_q and (Q_ROWS_EXACT or by + TBY * a < BR) and (B_COLS_EXACT or c < D):
                            val = gdQ[bi, row, hi, c]  # HBM read: Br*d
                        rdQ_old[a, e] = val
                for a in range(RL):
                    r = ly + TLY * a
                    if ly < TLY and r < BR:
                        row = row0 + r
                        part = ZERO
                        for e in range(CL):
                            c = lx + TLX * e
                            if c < D:
                                qv = ZERO
                                dov = ZERO
                                if row < s_q:
                                    qv = gQ[bi, row, hi, c]  # HBM read: Br*d
                                    dov = gdO[bi, row, hi, c]  # HBM read: Br*d
                                    part += dov * gO[bi, row, hi, c]  # HBM read: Br*d
                                sQ_i[r, c] = qv
                                sdO_i[r, c] = dov
                        sD_part[r, lx] = part
                        if lx == 0:
                            m_r = ZERO
                            inv_l = ZERO  # a row with no visible key (l = 0, m = -inf): P = 0, no NaN
                            if row < s_q:
                                if FROM_LSE:
                                    L_r = gm[bi, hi, row]  # HBM read: Br
                                    if L_r < INF or L_r != L_r:  # a NaN L (a NaN in Q_i) too: P NaN, as in the reference
                                        m_r = L_r
                                        inv_l = ONE
                                else:
                                    l_r = gl[bi, hi, row]  # HBM read: Br
                                    if l_r > ZERO or l_r != l_r:  # a NaN l (a NaN in Q_i) too: P NaN, as in the reference
                                        m_r = gm[bi, hi, row]  # HBM read: Br
                                        inv_l = ONE / l_r
                            sm_i[r] = m_r
                            sinv_l_i[r] = inv_l
                cuda.syncthreads()  # Sync: Q_i, dO_i, m_i, 1/l_i, D_i partials (and K_j, V_j at i = 0) in SRAM before line 11 reads them

                # Alg.4 L11: S_ij = tau Q_i K_j^T (the thread's RA x CA share, accumulated in registers)
                for a in range(RA):
                    for b in range(CA):
                        rS[a, b] = ZERO
                for c in range(D):
                    for a in range(RA):
                        r = ay + TAY * a
                        ra[a] = sQ_i[r if A_ROWS_EXACT else min(r, BR - 1), c]
                    for b in range(CA):
                        cc = ax + TAX * b
                        rb[b] = sK_j[cc if A_COLS_EXACT else min(cc, BC - 1), c]
                    for a in range(RA):
                        for b in range(CA):
                            rS[a, b] += ra[a] * rb[b]
                for a in range(RA):
                    r = ay + TAY * a
                    rc = r if A_ROWS_EXACT else min(r, BR - 1)
                    row = row0 + r
                    m_r = sm_i[rc]
                    inv_l = sinv_l_i[rc]
                    k_row = row_key(k_bh, row)
                    for b in range(CA):
                        cc = ax + TAX * b
                        col = col0 + cc
                        # Alg.4 L12: S_ij^masked = mask(S_ij): the ragged tails and the bottom-right causal mask
                        visible = row < s_q and col < s_k and inv_l != ZERO  # 1/l = 0: a row with no visible key
                        if CAUSAL:
                            visible = visible and col <= row + causal_offset
                        # Alg.4 L13: P_ij = diag(l_i)^-1 exp(S_ij^masked - m_i), the exact softmax from the final m, l
                        p = ZERO
                        if visible:
                            p = math.exp(tau * rS[a, b] - m_r) * inv_l
                        rS[a, b] = p
                        # Alg.4 L14: Z_ij regenerated from R: 1/(1-p) where kept, 0 where dropped
                        z = ONE
                        if DROPOUT:
                            z = dropout_scale if keep(k_row, col, threshold) else ZERO
                        rZ[a, b] = z
                        # Alg.4 L15: P_ij^dropped = P_ij o Z_ij, to SRAM for line 16
                        if (A_ROWS_EXACT or r < BR) and (A_COLS_EXACT or cc < BC):
                            sP_drop[r, cc] = p * z

                # Alg.4 L17: dP_ij^dropped = dO_i V_j^T (same register layout as S_ij)
                for a in range(RA):
                    for b in range(CA):
                        rdP[a, b] = ZERO
                for c in range(D):
                    for a in range(RA):
                        r = ay + TAY * a
                        ra[a] = sdO_i[r if A_ROWS_EXACT else min(r, BR - 1), c]
                    for b in range(CA):
                        cc = ax + TAX * b
                        rb[b] = sV_j[cc if A_COLS_EXACT else min(cc, BC - 1), c]
                    for a in range(RA):
                        for b in range(CA):
                            rdP[a, b] += ra[a] * rb[b]
                for a in range(RA):
                    r = ay + TAY * a
                    rc = r if A_ROWS_EXACT else min(r, BR - 1)
                    # Alg.4 L19: D_i = rowsum(dO_i o O_i): add up the load's partial sums (length d, not N)
                    D_r = ZERO
                    for x in range(TLX):
                        D_r += sD_part[rc, x]
                    for b in range(CA):
                        cc = ax + TAX * b
                        # Alg.4 L18: dP_ij = dP_ij^dropped o Z_ij
                        dp = rdP[a, b] * rZ[a, b]
                        # Alg.4 L20: dS_ij = P_ij o (dP_ij - D_i), to SRAM for lines 21-22
                        if (A_ROWS_EXACT or r < BR) and (A_COLS_EXACT or cc < BC):
                            sdS_ij[r, cc] = rS[a, b] * (dp - D_r)
                cuda.syncthreads()  # Sync: all of P_ij^dropped and dS_ij in SRAM before lines 16, 21, 22 read other threads' rows

                # Alg.4 L16: dV~_j += (P_ij^dropped)^T dO_i.
                # Dev: after the barrier, beside lines 21-22: it needs every row of P_ij^dropped, which
                # other threads computed; moving it changes no value.
                for r in range(BR):
                    for e in range(CB):
                        c = bx + TBX * e
                        rx[e] = sdO_i[r, c if B_COLS_EXACT else min(c, D - 1)]
                    for a in range(RB):
                        jj = by + TBY * a
                        pv = sP_drop[r, jj if B_ROWS_EXACT else min(jj, BC - 1)]
                        for e in range(CB):
                            rdV[a, e] += pv * rx[e]
                # Alg.4 L21: dQ_i <- dQ_i + tau dS_ij K_j, a read-modify-write in HBM on every (i, j)
                for a in range(RQ):
                    for e in range(CB):
                        rdQ[a, e] = ZERO
                for jj in range(BC):
                    for e in range(CB):
                        c = bx + TBX * e
                        rx[e] = sK_j[jj, c if B_COLS_EXACT else min(c, D - 1)]
                    for a in range(RQ):
                        r = by + TBY * a
                        ds = sdS_ij[r if Q_ROWS_EXACT else min(r, BR - 1), jj]
                        for e in range(CB):
                            rdQ[a, e] += ds * rx[e]
                for a in range(RQ):
                    r = by + TBY * a
                    row = row0 + r
                    if (Q_ROWS_EXACT or r < BR) and row < s_q:
                        for e in range(CB):
                            c = bx + TBX * e
                            if B_COLS_EXACT or c < D:
                                gdQ[bi, row, hi, c] = rdQ_old[a, e] + tau * rdQ[a, e]  # HBM write: Br*d
                # Alg.4 L22: dK~_j += tau dS_ij^T Q_i (tau applied once, at line 24)
                for r in range(BR):
                    for e in range(CB):
                        c = bx + TBX * e
                        rx[e] = sQ_i[r, c if B_COLS_EXACT else min(c, D - 1)]
                    for a in range(RB):
                        jj = by + TBY * a
                        ds = sdS_ij[r, jj if B_ROWS_EXACT else min(jj, BC - 1)]
                        for e in range(CB):
                            rdK[a, e] += ds * rx[e]
                cuda.syncthreads()  # Sync: every thread is done with Q_i, dO_i, P~_ij, dS_ij (and K_j, V_j) before line 10 (or 7) overwrites them
            # [/doc:alg4-inner-loop]

            # Alg.4 L24: write dK_j <- tau dK~_j and dV_j <- dV~_j to HBM (this query head's share)
            for a in range(RB):
                jj = by + TBY * a
                col = col0 + jj
                if (B_ROWS_EXACT or jj < BC) and col < s_k:
                    for e in range(CB):
                        c = bx + TBX * e
                        if B_COLS_EXACT or c < D:
                            gdK[bi, col, hi, c] = tau * rdK[a, e]  # HBM write: Bc*d
                            gdV[bi, col, hi, c] = rdV[a, e]  # HBM write: Bc*d

    return kernel




def _config(prob, block_sizes=None, num_threads=None) -> Alg4Config:
    d = prob.headdim
    Br, Bc = default_block_sizes(d) if block_sizes is None else (int(block_sizes[0]), int(block_sizes[1]))
    nt = default_threads(Br, Bc, d) if num_threads is None else int(num_threads)
    if nt < 1 or nt > 1024 or (nt % 32 and nt & (nt - 1)):
        raise ValueError(f"num_threads must be a multiple of 32 up to 1024 (or a power of two below 32), got {nt}")
    cfg = Alg4Config(Br, Bc, d, nt)
    if cfg.sram_bytes > STATIC_SMEM_BYTES:
        raise ValueError(
            f"block_sizes (Br, Bc) = ({Br}, {Bc}) need {cfg.sram_bytes} bytes of shared memory at headdim {d} in the "
            f"Algorithm 4 kernel, over the {STATIC_SMEM_BYTES}-byte static limit; use smaller tiles, e.g. {default_block_sizes(d)}"
        )
    return cfg


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles (the kernel contract): :func:`default_block_sizes` or the override."""
    cfg = _config(prob, block_sizes)
    return cfg.Br, cfg.Bc


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Static shared memory per block, in bytes."""
    return _config(prob, block_sizes).sram_bytes


def compiled_kernels(prob: Problem, block_sizes=None, stats_from_lse=False, num_threads=None) -> list[KernelLaunch]:
    """The main launch of :func:`backward`, compiled for ``prob`` (not launched)."""
    cfg = _config(prob, block_sizes, num_threads)
    kernel = alg4_kernel(cfg, prob.causal, prob.dropout_p > 0.0, stats_from_lse)
    return [KernelLaunch(f"FA1 backward (Br, Bc) = ({cfg.Br}, {cfg.Bc})", kernel, cfg.threads, prob.batch * prob.nheads)]


def backward(dout, q, k, v, out, fwd, prob, alloc, block_sizes=None, deterministic=False, *, num_threads=None, block_mask=None):
    """FA1 Algorithm 4 on kernel arrays: ``(dq, dk, dv)`` for upstream gradient ``dout``.

    Parameters
    ----------
    dout, q, out : float32 kernel arrays, (b, s_q, h, d), any strides
    k, v : float32 kernel arrays, (b, s_k, h_k, d)
    fwd : :class:`~numba_flash._launch.ForwardOutput` with ``m, l`` (b, h, s_q) from the FA1 forward;
        when they are None the logsumexp ``fwd.lse`` is used instead (``P = exp(S - L)``)
    prob : :class:`~numba_flash._launch.Problem`
    alloc : :class:`~numba_flash._launch.Allocator`
    block_sizes : (Br, Bc), default :func:`default_block_sizes`
    deterministic : accepted for the common signature; this kernel is always deterministic (no atomics)
    num_threads : threads per block, default :func:`default_threads`
    block_mask : a checked :class:`numba_flash.alg5_block_sparse.BlockMask` (its ``block_size`` is the
        tiles): Algorithm 4 on its non-zero tiles only (:func:`numba_flash.alg5_block_sparse.backward`)

    Returns
    -------
    dq (b, s_q, h, d), dk, dv (b, s_k, h_k, d): float32 kernel arrays; dk, dv summed over GQA groups.
    """
    b, s_q, s_k, h, h_k, d = prob.batch, prob.seqlen_q, prob.seqlen_k, prob.nheads, prob.nheads_k, prob.headdim
    if block_mask is not None:
        block_sizes = block_mask.block_size
    cfg = _config(prob, block_sizes, num_threads)
    nt = cfg.threads
    from_lse = fwd.m is None or fwd.l is None
    kernel = alg4_kernel(cfg, prob.causal, prob.dropout_p > 0.0, from_lse, block_mask is not None)
    G = prob.group
    dq = alloc.empty((b, s_q, h, d))
    dk = alloc.empty((b, s_k, h_k, d))
    dv = alloc.empty((b, s_k, h_k, d))
    # Dev: under GQA/MQA each query head's block writes its partial dK, dV to an O(N)-per-head scratch
    # array and numba_flash.device.gqa.group_sum adds the group (grid b*h, not b*h_k; see the module
    # docstring). With G = 1 the kernel writes dk, dv directly.
    dk_h, dv_h = per_head_grads(dk, dv, prob, alloc)
    m, l = (fwd.lse, fwd.lse) if from_lse else (fwd.m, fwd.l)
    dropout_scale = np.float32(prob.dropout_scale)
    gmask, gspan, gcol = block_mask_arrays(block_mask, alloc)
    kernel[b * h, nt](
        q, k, v, out, dout, m, l, dq, dk_h, dv_h,
        np.float32(prob.softmax_scale), dropout_scale, s_q, s_k, h, G, prob.causal_offset,
        np.uint32(prob.seed), np.uint32(prob.threshold), gmask, gspan, gcol,
    )
    group_sum(dk_h, dv_h, dk, dv, prob)
    # Alg.4 L26: return dQ, dK, dV
    return dq, dk, dv
