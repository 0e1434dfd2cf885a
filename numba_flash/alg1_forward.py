"""FA1 Algorithms 1 and 2: the FlashAttention forward pass as one Numba kernel, line by line.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 1 (section 3.1) and its full form
Algorithm 2 (Appendix B.3: softmax scale ``tau``, mask, dropout). The NumPy twins are
:mod:`numba_flash_reference.alg1_forward` and :mod:`numba_flash_reference.alg2_forward`.

What a reader learns
--------------------
* The whole algorithm as the paper writes it, with explicit SRAM tiles (``cuda.shared.array``):
  ``K_j, V_j`` (outer loop), ``Q_i, O_i, l_i, m_i`` (inner loop) and the score tile ``P_ij``.
  Every step carries the paper's line for both algorithms: ``# Alg.1 L9 / Alg.2 L10: ...``
  (Algorithm 2 adds lines L1 (PRNG state), L11 (mask) and L14 (dropout) to Algorithm 1).
* The paper's loop order: **outer over K/V blocks j, inner over Q blocks i**, with ``O_i, l_i, m_i``
  read from HBM and written back at *every* inner step (Alg.1 L8, L12, L13). That round trip is
  what Theorem 2 counts (Theta(N^2 d^2 / M) accesses) and what FlashAttention-2 later removes.
* The online softmax in a kernel: ``O_i`` stays normalized in HBM; each step un-normalizes it
  (``diag(l_i)``), rescales it to the new row max, adds ``P~_ij V_j`` and divides by ``l_new``.
* Algorithm 5 (block-sparse) is this kernel too: compiled with ``SPARSE=True`` it runs the test
  ``if M_ij != 0`` (tagged ``Alg.5 L8``) around the inner step, and every step carries its Algorithm 5
  tag beside Algorithm 1's and 2's (:mod:`numba_flash.alg5_block_sparse` has the mask and the entry points).

Launch geometry (FA1's parallelism)
-----------------------------------
Grid ``b * h``: **one thread block per (batch, head)**, which runs the paper's two loops serially.
Block ``TY x TX`` threads (8 x 16 = 128 on a GPU, 4 x 4 in the simulator). Thread ``(ty, tx)`` owns rows
``ty + TY*a`` of the row block (``a < RR = ceil(Br/TY)``), the score columns ``tx + TX*c``
(``c < ceil(Bc/TX)``) and the output columns ``tx + TX*c`` (``c < ceil(d/TX)``): a small register
tile of ``S_ij`` and of ``P~_ij V_j`` each. Rows of one thread group are reduced (row max, row
sum) across the ``TX`` threads that share them: with warp shuffles on a GPU, through shared memory
in the simulator (which has no warp intrinsics).

SRAM budget and block sizes
---------------------------
Alg.1 L1 sets ``Bc = ceil(M / 4d)`` and ``Br = min(Bc, d)`` for an SRAM of ``M`` float32: four
d-wide tiles of ``M/4`` each. Here ``M`` is the device's per-block shared memory as numba-cuda can
use it: numba-cuda declares shared memory *statically*, and a kernel's static shared memory is capped
at **48 KB** (the extra shared memory of an H100/H200, up to 227 KB per block, needs a dynamic
allocation with an opt-in that numba-cuda does not expose). So ``M = 12288`` float32, and the paper's
formula gives ``(Br, Bc) = (48, 48)`` at ``d = 64`` and ``(24, 24)`` at ``d = 128``.

The kernel keeps *five* tiles, not four, plus two vectors::

    SRAM (float32) = Bc*d' (K_j) + Bc*d (V_j) + Br*d' (Q_i) + Br*d' (O_i) + Br*Bc' (P_ij) + 2 Br (l_i, m_i)

(``d' = d | 1`` and ``Bc' = Bc | 1``: an odd row stride keeps column walks free of bank conflicts;
the simulator adds ``2 Br TX`` for its shared-memory reductions.) The paper's factor 4 leaves no room
for ``S_ij``, so :func:`paper_block_sizes` applies the formula, caps ``Bc <= 128`` (the register
tile), then shrinks ``Br`` (and, if needed, ``Bc``) in steps of 8 until the tiles fit in 48 KB:
``(32, 48)`` at ``d = 64`` (46.8 KB), ``(16, 24)`` at ``d = 128`` (41.9 KB). Keeping ``Bc`` large
is the paper's choice too: ``Bc`` sets how many passes (``Tc = N / Bc``) stream ``Q`` and ``O``
through HBM. With only 48 KB, ``d^2 / M`` is not small (1/3 at ``d = 64``), so at these sizes
Algorithm 1's HBM traffic is about that of standard attention (see the benchmarks page): Theorem 2's
saving needs ``M >> d^2``.

Performance: what FA1's parallelism costs
-----------------------------------------
Measured results: this readable kernel was the ``flash1`` row of the first committed forward results
(192 ms at ``N = 4096, d = 64`` on an H200: ``docs/notes/performance-log.md``, "FA1 forward, fast twin"); the
current ``docs/results/forward_h200.json`` holds the fast twin, what ``variant="auto"`` runs.
``python -m bench.sweep_fa1_fast --seqlen 4096 --headdim 64 --readable`` times both (see
``bench/README.md``). One block per (batch, head) gives the FA2 benchmark shapes
(16k tokens, hidden 2048) ``b*h = 2048`` blocks at ``N = 256`` but 128 at ``N = 4096`` and 32 at
``N = 16384``: at most one 4-warp block per SM, whose inner step is a serial chain (HBM load of
``Q_i, O_i``, barrier, ``S_ij`` from SRAM, shuffles, barrier, ``P_ij V_j``, HBM store of ``O_i``) with
no other warps to hide its latencies. So this kernel matches the standard path only at small N and
falls behind it as N grows, while its extra memory stays O(N) (the statistics) against the standard
path's O(N^2). FlashAttention-2 (:mod:`numba_flash.fa2_forward`) removes exactly this limit by
parallelizing over row blocks too. ``bench/sweep_forward_tiles.py`` sweeps tiles and thread
layouts (128, 256 and 512 threads) on a GPU.

This is the *readable* kernel (variant ``"readable"``). The default (variant ``"fast"``) is its twin
:mod:`numba_flash.fast.alg1_forward`: the same schedule (K/V-outer, Q-inner, O_i, l_i, m_i through
HBM at every inner step, one block per (batch, head)) with register-blocked tiles, > 48 KB of SRAM
and several warps working on different query blocks i at once; its docstring says what changed and
what it bought. Run this one with ``flash_attn_func(..., algorithm="flash1", variant="readable")``.

Run it::

    python -m numba_flash demo
    python -m pytest tests/kernels/test_forward_kernels.py -k flash1
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

from ._launch import STATIC_SMEM_BYTES, ForwardOutput, KernelLaunch, Problem, block_mask_arrays, ceil_div
from ._tiles_readable import load_tile, zero_tile
from .device.dropout import head_key, keep, row_key
from .runtime import backend as _backend

#: Largest Bc the default rule picks (the register tile of S_ij grows with Bc / TX).
MAX_BC = 128
#: Step in which the default rule shrinks Br and Bc to fit the SRAM.
SHRINK_STEP = 8
#: Threads (TY, TX) of a block: 8 x 16 = 128 on a GPU; 4 x 4 in the simulator (Python threads).
GPU_THREADS = (8, 16)
SIM_THREADS = (4, 4)


def thread_layout() -> tuple[int, int]:
    """(TY, TX) for the current backend."""
    return SIM_THREADS if _backend.is_simulator() else GPU_THREADS


def use_shuffles(tx: int) -> bool:
    """Row reductions by warp shuffles: on a GPU, when a row's TX threads sit inside one warp."""
    return (not _backend.is_simulator()) and tx <= 32 and (tx & (tx - 1)) == 0


def sram_elements() -> int:
    """M of Alg.1 L1: float32 elements of shared memory one block may declare.

    The device's per-block limit, capped by numba-cuda's 48 KB of static shared memory.
    """
    limit = STATIC_SMEM_BYTES
    if not _backend.is_simulator():
        limit = min(limit, int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK))
    return limit // 4


def sram_footprint(Br: int, Bc: int, d: int, threads=(8, 16), shuffles: bool = True) -> int:
    """float32 elements of SRAM the kernel declares for tiles (Br, Bc) at head dim d."""
    ty, tx = threads
    dp, bcp = d | 1, Bc | 1
    red = 2 if shuffles else 2 * ceil_div(Br, ty) * ty * tx  # partial row max / sum (simulator path)
    return Bc * dp + Bc * d + 2 * Br * dp + Br * bcp + 2 * Br + red


# Alg.2 L1 / Alg.5 L1: initialize the pseudo-random number generator state R and save it to HBM
def prng_state(prob: Problem):
    """R = (seed, threshold, 1/(1-p)): the counter hash needs no per-element state, only the seed.

    The keep-mask of entry (row, col) of head ``bh`` is ``hash(seed, bh, row, col) >= threshold``
    (:mod:`numba_flash.device.dropout`), so the backward pass regenerates it from the same three numbers.
    """
    return prob.seed, prob.threshold, prob.dropout_scale


def paper_block_sizes(d: int, M: int | None = None, block_sizes=None, threads=None, shuffles=None):
    """(Br, Bc): the paper's formula from the SRAM size, fitted to numba-cuda's static 48 KB.

    Parameters
    ----------
    d : head dimension.
    M : SRAM in float32 elements (default :func:`sram_elements`).
    block_sizes : (Br, Bc) override; checked against the SRAM and returned unchanged.
    threads : (TY, TX) thread layout (default :func:`thread_layout`).
    shuffles : whether row reductions use warp shuffles (default :func:`use_shuffles`).

    Raises
    ------
    ValueError
        If an override does not fit in the SRAM (naming ``block_sizes``).
    """
    M = sram_elements() if M is None else int(M)
    ty, tx = thread_layout() if threads is None else threads
    shuffles = use_shuffles(tx) if shuffles is None else shuffles

    def fits(br, bc):
        return sram_footprint(br, bc, d, (ty, tx), shuffles) <= M

    if block_sizes is not None:
        Br, Bc = (int(n) for n in block_sizes)
        if Br < 1 or Bc < 1:
            raise ValueError(f"block_sizes must be positive, got {block_sizes!r}")
        if not fits(Br, Bc):
            kb = 4 * sram_footprint(Br, Bc, d, (ty, tx), shuffles) / 1024
            raise ValueError(f"block_sizes {(Br, Bc)} need {kb:.1f} KB of shared memory at headdim {d}; "
                             f"numba-cuda kernels may declare at most {4 * M / 1024:.0f} KB")
        return Br, Bc
    # Alg.1 L1 / Alg.2 L2: set block sizes Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)
    Bc = math.ceil(M / (4 * d))
    Br = min(Bc, d)
    # Dev: cap Bc (register tile), then shrink Br, then Bc, until the five tiles fit (module docstring)
    Bc = min(Bc, MAX_BC)
    Br = min(Br, Bc)
    while not fits(Br, Bc) and Br > SHRINK_STEP:
        Br -= SHRINK_STEP if Br % SHRINK_STEP == 0 else Br % SHRINK_STEP
    while not fits(Br, Bc) and Bc > SHRINK_STEP:
        Bc -= SHRINK_STEP if Bc % SHRINK_STEP == 0 else Bc % SHRINK_STEP
    while not fits(Br, Bc) and Br > 1:  # only for tiny SRAM sizes given explicitly
        Br -= 1
    return Br, Bc


@functools.cache
def forward_kernel(BR: int, BC: int, D: int, CAUSAL: bool, DROPOUT: bool, TY: int, TX: int, SHUFFLE: bool,
                   SPARSE: bool = False):
    """Compile the forward kernel for one tile shape, head dim and option set (cached).

    ``SPARSE``: Algorithm 5 (block-sparse, :mod:`numba_flash.alg5_block_sparse`): Algorithm 2 with the
    test ``if M_ij != 0`` (Alg.5 L8) around the inner step. The dense kernel (``SPARSE=False``) never
    reads the three block-mask arguments; the launch passes one-element placeholders.

    Symbol table (paper symbol -> variable -> memory space):

    ==========================  ===========================  ==============================
    Q, K, V, O                  gQ, gK, gV, gO               HBM (b, s, h, d), any strides
    l, m (and L = m + log l)    gl, gm, glse                 HBM (b, h, s_q)
    M (Alg.5's block mask)      gmask                        HBM (B, H, Tr, Tc), 0/1
    first, last non-zero j      gspan                        HBM (B, H, Tr, 2)
    column j has a tile         gcol                         HBM (B, H, Tc)
    tau, R                      tau, (seed, threshold)       kernel arguments
    Q_i, O_i                    sQ_i, sO_i                   SRAM (Br, d)
    K_j, V_j                    sK_j, sV_j                   SRAM (Bc, d)
    l_i, m_i                    sl_i, sm_i                   SRAM (Br,)
    S_ij, P~_ij                 rS (this thread's entries)   registers (RR, CS)
    P~_ij^dropped               sP_ij                        SRAM (Br, Bc)
    m~_ij, l~_ij                rm_tilde, rl_tilde           registers (RR,) per thread
    m_i^new, l_i^new            m_new, l_new                 registers
    P~_ij^dropped V_j           rPV                          registers (RR, CO)
    ==========================  ===========================  ==============================
    """
    NT = TY * TX
    RR = ceil_div(BR, TY)  # rows of the row block per thread
    CS = ceil_div(BC, TX)  # score columns per thread
    CO = ceil_div(D, TX)  # output columns per thread
    DP = D | 1  # odd row strides: a warp walking a column hits distinct banks
    BCP = BC | 1
    RED_SHAPE = (1, 1) if SHUFFLE else (RR * TY, TX)  # partial row reductions (simulator path only)
    QO_LOADS = ceil_div(BR * D, NT)
    FULL_MASK = 0xFFFFFFFF
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline="always")
    def row_max(x):
        """max of x over the TX threads of a row group (warp shuffle butterfly)."""
        off = TX // 2
        while off > 0:
            x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, off))
            off //= 2
        return x

    @cuda.jit(device=True, inline="always")
    def row_sum(x):
        """sum of x over the TX threads of a row group (warp shuffle butterfly)."""
        off = TX // 2
        while off > 0:
            x += cuda.shfl_xor_sync(FULL_MASK, x, off)
            off //= 2
        return x

    # GPU only: cap registers so that a block of NT threads can always launch (65536 per SM / NT).
    jit_options = {} if _backend.is_simulator() or NT <= 256 else {"max_registers": min(255, 65536 // NT)}

    @cuda.jit(**jit_options)
    def kernel(gQ, gK, gV, gO, gl, gm, glse, tau, causal_offset, seed, threshold, dropout_scale, gmask, gspan, gcol):
        sK_j = cuda.shared.array((BC, DP), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sQ_i = cuda.shared.array((BR, DP), float32)  # (Br, d) SRAM
        sO_i = cuda.shared.array((BR, DP), float32)  # (Br, d) SRAM
        sP_ij = cuda.shared.array((BR, BCP), float32)  # (Br, Bc) SRAM: P~_ij (dropped) for P V_j
        sl_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sm_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sRowMax = cuda.shared.array(RED_SHAPE, float32)  # (Br, TX) SRAM: partial row maxima (simulator)
        sRowSum = cuda.shared.array(RED_SHAPE, float32)  # (Br, TX) SRAM: partial row sums (simulator)
        rS = cuda.local.array((RR, CS), float32)  # this thread's S_ij entries, then P~_ij
        rPV = cuda.local.array((RR, CO), float32)  # this thread's entries of P~_ij V_j
        rm_tilde = cuda.local.array(RR, float32)
        rl_tilde = cuda.local.array(RR, float32)
        r_m_new = cuda.local.array(RR, float32)
        r_l_new = cuda.local.array(RR, float32)
        r_alpha = cuda.local.array(RR, float32)  # e^(m_i - m_new)
        r_beta = cuda.local.array(RR, float32)  # e^(m~_ij - m_new)
        rq = cuda.local.array(RR, float32)
        rk = cuda.local.array(CS, float32)
        rv = cuda.local.array(CO, float32)

        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        nheads = gQ.shape[2]
        bh = cuda.blockIdx.x  # FA1: one thread block per (batch, head)
        bi = bh // nheads
        hi = bh % nheads
        hk = hi // (nheads // gK.shape[2])  # GQA/MQA: the key/value head of query head hi
        mb = bi if gmask.shape[0] > 1 else 0  # Alg.5: the block mask's batch and head (1 = shared, broadcast)
        mh = hi if gmask.shape[1] > 1 else 0
        k_bh = head_key(seed, bh) if DROPOUT else uint64(0)

        # [doc:alg1-init]
        # Alg.1 L2 / Alg.2 L3 / Alg.5 L2: in HBM, O = (0) N x d, l = (0) N, m = (-inf) N
        if not SPARSE:  # Dev: Alg.5 does not materialize them: a row block's first non-zero tile starts from them in SRAM (L9)
            for e in range(tid, s_q * D, NT):
                gO[bi, e // D, hi, e % D] = 0.0  # HBM write: N*d
            for r in range(tid, s_q, NT):
                gl[bi, hi, r] = 0.0  # HBM write: N
                gm[bi, hi, r] = NEG_INF  # HBM write: N
            cuda.syncthreads()  # Sync: O, l, m initialized in HBM before any thread reads them back (L8)
        # Alg.1 L3-L4 / Alg.2 L4-L5 / Alg.5 L3-L4: split Q, O, l, m into Tr row blocks and K, V into Tc column blocks
        Tr = (s_q + BR - 1) // BR
        Tc = (s_k + BC - 1) // BC
        # [/doc:alg1-init]

        # [doc:alg1-outer-loop]
        # Alg.1 L5 / Alg.2 L6 / Alg.5 L5: for 1 <= j <= Tc
        for j in range(Tc):
            if SPARSE and gcol[mb, mh, j] == 0:  # Dev: Alg.5, no non-zero tile in column j: K_j, V_j are not even loaded
                continue
            c0 = j * BC
            # Alg.1 L6 / Alg.2 L7 / Alg.5 L6: load K_j, V_j from HBM to on-chip SRAM (Dev: rows past s_k, the ragged last block, are zeros, masked below)
            load_tile(sK_j, gK, bi, c0, hk, s_k, D, tid, NT)  # HBM read: Bc*d
            load_tile(sV_j, gV, bi, c0, hk, s_k, D, tid, NT)  # HBM read: Bc*d
            # Alg.1 L7 / Alg.2 L8 / Alg.5 L7: for 1 <= i <= Tr
            for i in range(Tr):
                # Alg.5 L8: if M_ij != 0: a zero tile costs no FLOP, no barrier and no HBM access (dense: no test)
                if SPARSE and gmask[mb, mh, i, j] == 0:
                    continue
                r0 = i * BR
                first = SPARSE and j == gspan[mb, mh, i, 0]  # Alg.5's first non-zero tile of row block i ...
                last = SPARSE and j == gspan[mb, mh, i, 1]  # ... and its last one
                # [doc:alg1-inner-loop]
                # Alg.1 L8 / Alg.2 L9 / Alg.5 L9: load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM
                for t in range(QO_LOADS):
                    e = tid + NT * t
                    if e < BR * D:
                        r = e // D
                        x = e % D
                        qx = float32(0.0)  # Dev: rows past s_q (ragged last block) are zeros, never stored
                        ox = float32(0.0)  # Dev: Alg.5's first visit takes L2's O_i = 0, not read from HBM
                        if r0 + r < s_q:
                            qx = gQ[bi, r0 + r, hi, x]  # HBM read: Br*d
                            if not first:
                                ox = gO[bi, r0 + r, hi, x]  # HBM read: Br*d
                        sQ_i[r, x] = qx
                        sO_i[r, x] = ox
                for r in range(tid, BR, NT):
                    l_r = float32(0.0)  # rows past s_q, and Alg.5's first visit: L2's l = 0, m = -inf
                    m_r = NEG_INF
                    if r0 + r < s_q and not first:
                        l_r = gl[bi, hi, r0 + r]  # HBM read: Br
                        m_r = gm[bi, hi, r0 + r]  # HBM read: Br
                    sl_i[r] = l_r
                    sm_i[r] = m_r
                cuda.syncthreads()  # Sync: K_j, V_j, Q_i, O_i, l_i, m_i in SRAM before L9 reads them

                # Alg.1 L9 / Alg.2 L10 / Alg.5 L10: S_ij = Q_i K_j^T (this thread's RR x CS entries; Alg.2's tau comes next)
                zero_tile(rS)
                for x in range(D):
                    for a in range(RR):
                        rq[a] = sQ_i[min(ty + TY * a, BR - 1), x]
                    for c in range(CS):
                        rk[c] = sK_j[min(tx + TX * c, BC - 1), x]
                    for a in range(RR):
                        for c in range(CS):
                            rS[a, c] += rq[a] * rk[c]
                # Alg.2 L10-L11 / Alg.5 L10-L11: S_ij = tau S_ij, then S_ij^masked = mask(S_ij): -inf where key col is hidden
                # from query row. Dev (Alg.1 and Alg.2): padding columns past Bc or past s_k (the ragged last
                # block) are set to -inf too, so they take no probability.
                for a in range(RR):
                    row = r0 + ty + TY * a
                    for c in range(CS):
                        col = c0 + tx + TX * c
                        s = tau * rS[a, c]
                        if tx + TX * c >= BC or col >= s_k:
                            s = NEG_INF
                        if CAUSAL and col > row + causal_offset:
                            s = NEG_INF
                        rS[a, c] = s

                # Alg.1 L10 / Alg.2 L12 / Alg.5 L12: m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)
                for a in range(RR):
                    mx = NEG_INF
                    for c in range(CS):
                        mx = max(mx, rS[a, c])
                    if SHUFFLE:
                        rm_tilde[a] = row_max(mx)
                    else:
                        sRowMax[ty + TY * a, tx] = mx
                if not SHUFFLE:
                    cuda.syncthreads()  # Sync: every partial row max in SRAM before the rows are reduced
                    for a in range(RR):
                        mx = NEG_INF
                        for t in range(TX):
                            mx = max(mx, sRowMax[ty + TY * a, t])
                        rm_tilde[a] = mx
                for a in range(RR):
                    m_safe = rm_tilde[a] if rm_tilde[a] > NEG_INF else float32(0.0)  # Dev: a row hidden in this tile: exp(-inf - 0) = 0, never NaN
                    lsum = float32(0.0)
                    for c in range(CS):
                        p = math.exp(rS[a, c] - m_safe)
                        rS[a, c] = p
                        lsum += p
                    if SHUFFLE:
                        rl_tilde[a] = row_sum(lsum)
                    else:
                        sRowSum[ty + TY * a, tx] = lsum
                # Alg.2 L14 / Alg.5 L14: P~_ij^dropped = dropout(P~_ij, p_drop), into SRAM (l~_ij above is from the undropped P~_ij)
                for a in range(RR):
                    r = ty + TY * a
                    k_row = row_key(k_bh, r0 + r) if DROPOUT else uint64(0)
                    for c in range(CS):
                        cc = tx + TX * c
                        if r < BR and cc < BC:
                            p = rS[a, c]
                            if DROPOUT:
                                p = p * dropout_scale if keep(k_row, c0 + cc, threshold) else float32(0.0)
                            sP_ij[r, cc] = p
                cuda.syncthreads()  # Sync: P_ij (and the partial row sums) complete in SRAM before P_ij V_j
                if not SHUFFLE:
                    for a in range(RR):
                        lsum = float32(0.0)
                        for t in range(TX):
                            lsum += sRowSum[ty + TY * a, t]
                        rl_tilde[a] = lsum

                # Alg.1 L11 / Alg.2 L13 / Alg.5 L13: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
                for a in range(RR):
                    rc = min(ty + TY * a, BR - 1)
                    m_i = sm_i[rc]
                    m_new = max(m_i, rm_tilde[a])
                    alpha = float32(0.0)  # Dev: a row that has seen no key yet keeps l = 0, O = 0 (no -inf - -inf)
                    beta = float32(0.0)
                    if m_new > NEG_INF:
                        alpha = math.exp(m_i - m_new)
                        beta = math.exp(rm_tilde[a] - m_new)
                    r_alpha[a] = alpha
                    r_beta[a] = beta
                    r_m_new[a] = m_new
                    r_l_new[a] = alpha * sl_i[rc] + beta * rl_tilde[a]

                # Alg.1 L12 / Alg.2 L15 / Alg.5 L15: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j), to HBM
                zero_tile(rPV)
                for kk in range(BC):
                    for a in range(RR):
                        rq[a] = sP_ij[min(ty + TY * a, BR - 1), kk]
                    for c in range(CO):
                        rv[c] = sV_j[kk, min(tx + TX * c, D - 1)]
                    for a in range(RR):
                        for c in range(CO):
                            rPV[a, c] += rq[a] * rv[c]
                for a in range(RR):
                    r = ty + TY * a
                    row = r0 + r
                    if r < BR and row < s_q:
                        l_new = r_l_new[a]
                        scale_O = sl_i[r] * r_alpha[a]  # diag(l_i) e^(m_i - m_new): un-normalize, rescale
                        for c in range(CO):
                            x = tx + TX * c
                            if x < D:
                                o = scale_O * sO_i[r, x] + r_beta[a] * rPV[a, c]
                                gO[bi, row, hi, x] = o / l_new if l_new != 0 else float32(0.0)  # HBM write: Br*d (NaN stays NaN)
                        # Alg.1 L13 / Alg.2 L16 / Alg.5 L16: l_i <- l_new, m_i <- m_new, to HBM
                        if tx == 0:
                            gl[bi, hi, row] = l_new  # HBM write: Br
                            gm[bi, hi, row] = r_m_new[a]  # HBM write: Br
                            if last:  # Dev: Alg.5, the row block's last non-zero tile also writes L = m + log l
                                glse[bi, hi, row] = r_m_new[a] + math.log(l_new) if l_new != 0 else math.inf  # HBM write: Br
                cuda.syncthreads()  # Sync: all reads of this step's SRAM tiles done before the next step overwrites them
                # [/doc:alg1-inner-loop]
        # [/doc:alg1-outer-loop]

        # Dev: also write L = m + log l (flash-attn's softmax_lse; +inf where a row saw no key; Alg.5: written above)
        if not SPARSE:
            for r in range(tid, s_q, NT):
                l_r = gl[bi, hi, r]
                glse[bi, hi, r] = gm[bi, hi, r] + math.log(l_r) if l_r != 0 else math.inf

    return kernel


def launch(q, k, v, prob: Problem, alloc, block_sizes=None, threads=None, shuffles=None, block_mask=None):
    """Run the forward kernel; returns (ForwardOutput, the compiled dispatcher, (Br, Bc), (TY, TX)).

    :func:`forward` is this with the defaults; benchmarks and inspection use the extras. ``block_mask``:
    a checked :class:`numba_flash.alg5_block_sparse.BlockMask` whose blocks are the tiles
    (``block_sizes`` must be its ``block_size``): the kernel then runs Algorithm 5.
    """
    b, s_q, h, d = prob.batch, prob.seqlen_q, prob.nheads, prob.headdim
    ty, tx = thread_layout() if threads is None else threads
    shuffles = use_shuffles(tx) if shuffles is None else (shuffles and use_shuffles(tx))
    seed, threshold, dropout_scale = prng_state(prob)
    Br, Bc = paper_block_sizes(d, block_sizes=block_sizes, threads=(ty, tx), shuffles=shuffles)
    out = alloc.empty((b, s_q, h, d))
    l = alloc.empty((b, h, s_q))
    m = alloc.empty((b, h, s_q))
    lse = alloc.empty((b, h, s_q))
    gmask, gspan, gcol = block_mask_arrays(block_mask, alloc)
    kernel = forward_kernel(Br, Bc, d, prob.causal, prob.dropout_p > 0, ty, tx, shuffles, block_mask is not None)
    kernel[b * h, ty * tx](q, k, v, out, l, m, lse, float32(prob.softmax_scale), prob.causal_offset,
                           seed, threshold, float32(dropout_scale), gmask, gspan, gcol)
    return ForwardOutput(out=out, lse=lse, m=m, l=l), kernel, (Br, Bc), (ty, tx)


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) on this backend (the kernel contract): :func:`paper_block_sizes` at ``prob.headdim``."""
    return paper_block_sizes(prob.headdim, block_sizes=block_sizes)


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Static shared memory per block, in bytes, of the tiles :func:`choose_block_sizes` picks."""
    ty, tx = thread_layout()
    Br, Bc = choose_block_sizes(prob, block_sizes)
    return 4 * sram_footprint(Br, Bc, prob.headdim, (ty, tx), use_shuffles(tx))


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """The one launch of :func:`forward`, compiled for ``prob`` (not launched)."""
    ty, tx = thread_layout()
    shuffles = use_shuffles(tx)
    Br, Bc = choose_block_sizes(prob, block_sizes)
    kernel = forward_kernel(Br, Bc, prob.headdim, prob.causal, prob.dropout_p > 0, ty, tx, shuffles, False)
    return [KernelLaunch(f"FA1 forward (Br, Bc) = ({Br}, {Bc})", kernel, ty * tx, prob.batch * prob.nheads)]


def forward(q, k, v, prob: Problem, alloc, block_sizes=None, block_mask=None) -> ForwardOutput:
    """FA1 forward (Algorithms 1-2, or 5 with ``block_mask``) on kernel arrays; see :mod:`numba_flash.api`.

    ``block_sizes=(Br, Bc)`` overrides :func:`paper_block_sizes` (it must fit the 48 KB SRAM).
    ``block_mask``: a checked :class:`numba_flash.alg5_block_sparse.BlockMask`; its ``block_size`` is
    the tiles (:func:`numba_flash.alg5_block_sparse.forward` is this call).
    """
    if block_mask is not None:
        block_sizes = block_mask.block_size
    fwd, _, _, _ = launch(q, k, v, prob, alloc, block_sizes, block_mask=block_mask)
    # Alg.1 L16 / Alg.2 L19 / Alg.5 L20: return O, l, m (R is the seed in prob); L = m + log l for the API
    return fwd
