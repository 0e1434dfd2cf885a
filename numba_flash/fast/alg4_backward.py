"""FA1 Algorithm 4, the fast kernel: FA1's schedule with the register-blocked FA2 backward machinery.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 4 (Appendix B.4). Same algorithm,
semantics, schedule and paper tags as the readable kernel :mod:`numba_flash.alg4_backward` (read that
one first); this file changes *who computes what* inside a thread block, reusing the tile loaders and
register tilings of :mod:`numba_flash.fast.fa2_backward`.

What stayed (FA1's schedule)
----------------------------
One thread block per (batch, query head); outer loop over the key blocks ``j`` with ``K_j, V_j`` in
SRAM and ``dK~_j, dV~_j`` on chip, inner loop over the query blocks ``i``; ``S_ij, P_ij`` recomputed
from the forward's final ``m, l`` (line 13: ``P = diag(l)^-1 exp(S - m)``, ``P = 0`` on rows that
see no key); the dropout mask regenerated from the seed; ``dQ_i`` read, updated and written back in
HBM on every ``(i, j)`` (line 21, no atomics: the block owns its head's dQ); GQA/MQA as the readable
kernel (per-query-head partial ``dK, dV`` + the group-sum kernel).

What changed from the readable kernel, and why
----------------------------------------------
* **Register blocking of all five matmuls** (the tilings of :mod:`numba_flash.fast.fa2_backward`):
  ``S_ij``, ``dP_ij`` as ``TM x TN`` register tiles per thread (16-byte SRAM loads along ``d``);
  ``dV~_j, dK~_j`` as ``TC x 4 DVX`` register tiles held for the whole inner loop, updated by outer
  products over the query rows; the ``dQ_i`` update (``TM2 x DX2`` per thread) added to the old
  ``dQ_i``, which was loaded into registers at line 10 (its HBM latency overlaps lines 11-20).
* **Bigger tiles through dynamic SRAM > 48 KB** (:mod:`numba_flash.runtime.smem`): ``Br x Bc = 64 x 128``
  at ``d <= 64`` (169 KB), ``64 x 64`` at ``d = 128``; the readable kernel's 32 x 32 (41.8 KB) meant
  ``Tc = N / 32`` read-modify-write passes over ``dQ``, this one ``N / 128``.
* **Q_i, dO_i, l_i, m_i, D_i prefetched** into registers during the compute of the previous row block.
* **D_i computed once per row** (line 19): in the first pass (``j = 0``, which visits every row that
  sees a key) from ``dO_i, O_i`` in HBM, kept in an O(N)-per-head scratch array and read back in the
  later passes (the readable kernel forms it ``Tc`` times, while loading ``Q_i``).
* **tau folded into dS** (line 20) once, so lines 21 and 22 need no extra multiply and line 24
  writes ``dK_j`` as accumulated.

What it bought (one H200, fp32, FA2 convention ``b * N = 16k``, d = 64, N = 4096, 32 heads, batch 4;
``docs/results/backward_d64_h200.json``; the log with predictions is ``docs/notes/performance-log.md``
"FA1 backward (Alg.4), fast twin"):

=====================================================  ==============  ==============
version (d = 64, non-causal)                           ms              TFLOP/s
=====================================================  ==============  ==============
readable Alg.4 backward (32 x 32 tiles, 48 KB static)  253             5.4
this kernel, backward (251 regs, 0 local, 168.8 KB)    46.3            29.7 (59% SGEMM)
standard path fwd + bwd (Alg. 0 + Alg. 3)              261.8           7.4
flash1 fwd + bwd (fast FA1 forward + this kernel)      65.6            29.3
=====================================================  ==============  ==============

So forward + backward with the recomputation backward is **4.0x** faster than the standard path
(3.98x / 3.95x at N = 1024 / 2048), with 4 MiB of extra device memory against 25.8 GB; the backward
alone runs as fast as the FA2 fast backward (47.5 ms). Causal (d = 64): 24.6 ms (27.9 TFLOP/s).
d = 128 (16 heads: 64 blocks for 132 SMs, FA1's parallelism limit): 102 ms (13.5 TFLOP/s).

Launch geometry
---------------
Grid ``batch * nheads`` blocks of ``NT`` threads (256 by default): block ``bh = b nheads + h`` owns
query head ``h`` of batch ``b`` (also the dropout hash's head index). Loops inside a block::

    for j in 0..Tc-1:                       # L6-L8: K_j, V_j -> SRAM; dK~_j, dV~_j = 0 (registers)
        for i in i_first(j)..Tr-1:          # L9 (causal: row blocks that see no key of K_j skipped)
            L10  Q_i, dO_i, m_i, 1/l_i, D_i -> SRAM (prefetched)                     | barrier
            L11-L20  S, dP register tiles; P~_ij, tau dS_ij -> SRAM                   | barrier
            (dQ_i -> registers: its load is issued here)
            L16, L22  dV~_j += P~^T dO_i, dK~_j += tau dS^T Q_i (one loop, registers)
            L21  dQ_i += tau dS K_j, written back to HBM (same threads read and write each element)
        L24  dK_j, dV_j -> HBM (this query head's share; GQA: summed by the group-sum kernel)

Thread maps (``tid`` in ``0..NT-1``) as :mod:`numba_flash.fast.fa2_backward`: S/dP rows
``rg + RG a``, columns ``tc + TPR b``; dK/dV key rows ``CW cy + CW CG q + u``, columns
``4 tx + 4 XT e + w``; dQ rows ``rg2 + RG2 a``, columns ``tc2 + TPR2 e``. ``d`` is padded to ``DP``,
a multiple of 16 (zero columns).

SRAM budget
-----------
One dynamic float32 array: ``Q_i, dO_i`` 2 Br (DP+4) + ``K_j, V_j`` 2 Bc (DP+4) + ``P~_ij, dS_ij``
2 Br (Bc+4) + ``m_i, D_i, 1/l_i`` 3 Br. Defaults: d <= 64, 64 x 128: 43,200 floats = 168.8 KB;
d = 128, 64 x 64: 166.8 KB. One block (8 warps) per SM; ``S_ij, dP_ij, dK~_j, dV~_j`` and the
``dQ_i`` tiles in registers. Extra HBM memory: ``D`` (b, h, N) and, under GQA, the per-query-head
``dK, dV`` partials: O(N) per head.

Run it::

    >>> import numpy as np
    >>> from numba_flash import attention_numpy, attention_backward_numpy
    >>> q, k, v, do = np.random.default_rng(0).standard_normal((4, 1, 20, 2, 8)).astype(np.float32)
    >>> out, st = attention_numpy(q, k, v, causal=True, algorithm="flash1", return_stats=True)
    >>> [g.shape for g in attention_backward_numpy(do, q, k, v, out, st)]  # doctest: +SKIP
    [(1, 20, 2, 8), (1, 20, 2, 8), (1, 20, 2, 8)]

Tests: ``python -m pytest tests/kernels/test_backward_kernels.py -k "flash1 or variant"``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint64

from .._launch import KernelLaunch, Problem
from ..device.constants import LOG2E, U
from ..device.dropout import head_key, row_key
from ..device.gqa import group_sum, per_head_grads
from ..device.grid import query_head
from ..runtime import backend as _backend
from ..runtime import smem as _smem
from . import _plan, _regtile
from . import fa2_backward as fa2_backward_fast
from .fa2_backward import _device_functions, derived


def config_for(d: int, block_sizes=None, nt=None):
    """The tiling ``(NT, BR, BC, DP)`` for head dim ``d``: the same choice as the FA2 fast backward.

    This kernel reuses :mod:`numba_flash.fast.fa2_backward`'s register tilings, so it takes its tile
    sizes from :func:`numba_flash.fast.fa2_backward.config_for` too: 256 threads; ``d <= 64``:
    ``Br = 64, Bc = 128`` (``Tc = N / 128`` passes of line 21's dQ read-modify-write); ``d > 64``:
    ``Br = Bc = 64``. ``block_sizes=(Br, Bc)`` is rounded up to multiples of 16.
    """
    return fa2_backward_fast.config_for(d, block_sizes, nt)


def smem_floats(NT, BR, BC, DP):
    """Dynamic SRAM in float32 elements (see the module docstring): the FA2 fast backward's layout."""
    return fa2_backward_fast.smem_floats(NT, BR, BC, DP)


@functools.cache
def alg4_backward_fast_kernel(NT: int, BR: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, FROM_LSE: bool, VEC: bool = True):
    """Compile (once per configuration) the fast Algorithm 4 kernel.

    Kernel arguments: ``gQ, gO, gdO (b, s_q, h, d)``, ``gK, gV (b, s_k, h_k, d)``, ``gm, gl (b, h, s_q)``
    (``FROM_LSE``: ``gm`` is the logsumexp ``L`` and ``l = 1``, so line 13's P is ``exp(S - L)``),
    scratch ``gDs (b, h, s_q)`` (D_i), outputs ``gdQ (b, s_q, h, d)``, ``gdK, gdV (b, s_k, h, d)``
    (per query head); ``tau``, ``group``, ``causal_offset``, dropout ``seed``, ``threshold``,
    ``dropout_scale``. ``VEC``: 16-byte aligned SRAM (not in the simulator).

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, O, dO            gQ, gK, gV, gO, gdO  HBM (O read only in the first pass, line 19)
    m, l                      gm, gl               HBM (b, h, N)
    dQ, dK, dV                gdQ, gdK, gdV        HBM (dQ read-modify-written at every (i, j))
    K_j, V_j                  smem[OFF_K/OFF_V]    SRAM (Bc, DP+4), per outer step (L7)
    dK~_j, dV~_j              rdK, rdV             registers, TC x 4 DVX per thread (L8)
    Q_i, dO_i                 smem[OFF_Q/OFF_DO]   SRAM (Br, DP+4) (L10); rQn, rdOn: next block
    m_i, 1/l_i, D_i           smem[OFF_M/IL/D]     SRAM (Br,); D_i also in the HBM scratch gDs
    S_ij -> P_ij, dP_ij       rS, rdP              registers, TM x TN per thread
    Z_ij                      keep(rkey, col)      regenerated from the seed, never stored
    P~_ij = P o Z, tau dS_ij  smem[OFF_P/OFF_DS]   SRAM (Br, Bc+4)
    dQ_i                      rdQo + rdQ           registers TM2 x DX2 (old value, read after L20, + this step's part)
    R (PRNG state)            seed -> k_bh         kernel argument -> register
    ========================  ===================  ==================================================
    """
    fns = _device_functions(NT, BR, BC, DP, CAUSAL, DROPOUT)
    g = fns["g"]
    TPR, RG, TM, TN = g["TPR"], g["RG"], g["TM"], g["TN"]
    TC, CW, DVX, XT, CG, TM2, DX2, RG2, TPR2 = (g[k] for k in ("TC", "CW", "DVX", "XT", "CG", "TM2", "DX2", "RG2", "TPR2"))
    NLQ, NLK = fns["NLQ"], fns["NLK"]
    load_q, store_q, load_k, store_k, dq_tile = fns["load_q"], fns["store_q"], fns["load_k"], fns["store_k"], fns["dq_tile"]
    first_row_block = fns["first_row_block"]
    o = fns["offs"]
    OFF_Q, OFF_DO, OFF_K, OFF_V, OFF_P, OFF_DS = (o[k] for k in ("OFF_Q", "OFF_DO", "OFF_K", "OFF_V", "OFF_P", "OFF_DS"))
    # SRAM layout of :mod:`numba_flash.fast.fa2_backward` (Q_i, dO_i, K_j, V_j, P~_ij, tau dS_ij, m_i log2 e, D_i, 1/l_i)
    OFF_M, OFF_D, OFF_IL = o["OFF_M"], o["OFF_D"], o["OFF_IL"]  # (Br,) each
    stats = _regtile.make_row_stats(FROM_LSE)
    SQ = DP + 4  # row stride (floats) of the Q_i, dO_i, K_j, V_j tiles
    SP = BC + 4  # row stride of the P~ and dS tiles
    uXT, uTPR, uTPR2, uRG2, uBR = U(XT), U(TPR), U(TPR2), U(RG2), U(BR)
    NQC = TC // CW  # chunks of CW key rows per thread in the dK/dV map
    # Register-array sizes (local-array sizes must be plain constants):
    NS = TM * TN  # rS, rdP: the TM x TN tiles of S_ij, dP_ij
    NTM4, NDV4, NTM24 = TM * 4, DVX * 4, TM2 * 4  # rq/rdo: a 4-column step of TM rows; rov/rqv: 4 DVX columns; rds4
    NKV = TC * DVX * 4  # rdK, rdV: TC key rows x 4 DVX columns of dK~_j, dV~_j
    NQ2 = TM2 * DX2  # rdQ, rdQo: TM2 rows x DX2 columns of dQ_i
    ALIGN = 16 if VEC else None
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def row_stats(gm, gl, gO, gdO, gDs, b, h, row, s_q, d, first_pass):
        """(M_r, 1/l_r, D_r) of one row: (0, 0, 0) past N_q; (0, 0, D_r) on a row that sees no key.

        ``M_r = m_r log2 e``, the forward's base-2 row max (:func:`numba_flash.fast._regtile.make_row_stats`).
        D_r = rowsum(dO o O) is formed from HBM in the first pass and stored to gDs; later passes read it.
        """
        M_r, il_r = stats(gm, gl, b, h, row, s_q)  # HBM read: 2 per row
        D_r = ZERO
        if row < s_q:
            if first_pass:
                for c in range(d):  # Dev: a runtime loop (not unrolled): once per row, few registers
                    D_r += gdO[b, row, h, c] * gO[b, row, h, c]  # HBM read: 2 d per row, once
                gDs[b, h, row] = D_r  # HBM write: 1 per row, once (O(N) scratch)
            else:
                D_r = gDs[b, h, row]
        return M_r, il_r, D_r

    # S, dP, P = diag(l_i)^-1 exp2(S - m_i log2 e) (S in base 2, as the forward), P o Z and tau dS of one (i, j)
    # step: the FA2 fast backward's (same SRAM layout)
    s_dp_p_ds = fns["s_dp_p_ds"]
    dv_dk_update = _regtile.make_dv_dk_update(BR, NQC, CW, CG, DVX, XT, TC, SP, SQ, OFF_P, OFF_DS, OFF_DO, OFF_Q)
    store_dk_dv = _regtile.make_store_dk_dv(NQC, CW, CG, DVX, XT)

    # [doc:alg4-fast-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gO, gdO, gm, gl, gDs, gdQ, gdK, gdV, tau, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32, alignment=ALIGN)  # all tiles; offsets OFF_*
        tid = U(cuda.threadIdx.x)
        c = float32(tau * LOG2E)  # Dev: the forward's Q scale tau log2 e, rounded as the host rounded it for the forward
        tau = float32(tau)  # Dev: float32 scalars, so no float64 arithmetic creeps into the tile loops
        dropout_scale = float32(dropout_scale)
        rS = cuda.local.array(NS, float32)  # S_ij, then P_ij (registers)
        rdP = cuda.local.array(NS, float32)  # dP_ij (registers)
        rq = cuda.local.array(NTM4, float32)
        rdo = cuda.local.array(NTM4, float32)
        rkey = cuda.local.array(TM, uint64)
        rdK = cuda.local.array(NKV, float32)  # dK~_j (times tau) tile (registers, whole inner loop)
        rdV = cuda.local.array(NKV, float32)  # dV~_j tile (registers, whole inner loop)
        rp = cuda.local.array(TC, float32)
        rds = cuda.local.array(TC, float32)
        rov = cuda.local.array(NDV4, float32)
        rqv = cuda.local.array(NDV4, float32)
        rdQ = cuda.local.array(NQ2, float32)  # tau dS_ij K_j: this step's part of dQ_i (registers)
        rdQo = cuda.local.array(NQ2, float32)  # dQ_i as read from HBM at line 10 (registers)
        rds4 = cuda.local.array(NTM24, float32)
        rQn = cuda.local.array(NLQ, float32)  # Q_i / Q_{i+1} in flight (registers)
        rdOn = cuda.local.array(NLQ, float32)
        rKn = cuda.local.array(NLK, float32)
        rVn = cuda.local.array(NLK, float32)

        bh, b, h, hk, s_q, s_k, d = query_head(gQ, gK, group)  # bh = b nheads + h: also the dropout hash's head index
        ub, uh, uhk = U(b), U(h), U(hk)
        cy = tid // uXT
        tx = tid % uXT
        rg2 = tid // uTPR2
        tc2 = tid % uTPR2

        # Alg.4 L1: set the PRNG state to R: the counter hash's key for this (batch, head) and seed
        k_bh = head_key(seed, bh)
        # Alg.4 L2: block sizes Br = BR, Bc = BC: compile-time constants of this kernel (config_for)
        # Alg.4 L3-L4: Q, O, dO, l, m split into Tr row blocks; K, V into Tc column blocks (ragged tails)
        Tr = (s_q + BR - 1) // BR
        Tc = (s_k + BC - 1) // BC
        # Alg.4 L5: dQ = 0 in HBM. Dev: the j = 0 pass writes dQ_i without reading it; the rows it skips
        # (causal rows before the first one that sees key 0: they see no key) are zeroed here, so every
        # output element is written by the kernel (a NaN-poisoned output catches a missed one)
        i_first0 = 0
        if CAUSAL:
            i_first0 = min(Tr, first_row_block(0, causal_offset))
        n_zero = U(i_first0 * BR) * U(d)
        e = tid
        while e < n_zero:
            gdQ[ub, e // U(d), uh, e % U(d)] = ZERO  # HBM write: rows that see no key
            e += U(NT)

        # Alg.4 L6: for j = 1..Tc (outer loop: K_j, V_j and dK~_j, dV~_j stay on chip)
        for j in range(Tc):
            col0 = j * BC
            # Dev: causal block skipping: row blocks before the first row that sees key col0 are fully masked
            i_first = 0
            if CAUSAL:
                i_first = min(Tr, first_row_block(col0, causal_offset))
            cuda.syncthreads()  # Sync: every thread is done with K_{j-1}, V_{j-1} (line 21 reads K) before line 7 overwrites them
            # Alg.4 L7: load K_j, V_j from HBM to SRAM (all loads in flight, then stored; ragged rows and padded columns zero)
            load_k(gK, gV, ub, uhk, col0, s_k, d, tid, rKn, rVn)  # HBM read: 2 Bc*d
            store_k(smem, OFF_K, OFF_V, tid, rKn, rVn)
            # Alg.4 L8: dK~_j = (0), dV~_j = (0) on chip (registers)
            for a in range(NKV):
                rdK[a] = ZERO
                rdV[a] = ZERO
            # Dev: the loads of the first row block (Q_i, dO_i, m_i, l_i, D_i) are issued here, the later
            # ones one inner step ahead (prefetch into registers)
            mval = ZERO
            ilval = ZERO
            Dval = ZERO
            if i_first < Tr:
                load_q(gQ, gdO, ub, uh, i_first * BR, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d
                if tid < uBR:
                    mval, ilval, Dval = row_stats(gm, gl, gO, gdO, gDs, b, h, i_first * BR + int(tid), s_q, d, j == 0)

            # [doc:alg4-fast-inner-loop]
            # Alg.4 L9: for i = 1..Tr (inner loop over the row blocks that see a key of K_j)
            for i in range(i_first, Tr):
                row0 = i * BR
                cuda.syncthreads()  # Sync: K_j, V_j stored (first step); Q, dO, P~, dS of the previous step read by all before overwriting
                # Alg.4 L10: load Q_i, dO_i, l_i, m_i into SRAM (from the prefetch registers); dQ_i: see line 21
                store_q(smem, OFF_Q, OFF_DO, tid, rQn, rdOn)
                if tid < uBR:
                    smem[OFF_M + tid] = mval
                    smem[OFF_IL + tid] = ilval  # 1/l_i; 0 if the row sees no key
                    smem[OFF_D + tid] = Dval
                cuda.syncthreads()  # Sync: Q_i, dO_i, m_i, 1/l_i, D_i in SRAM before lines 11-20 read them
                # Dev: prefetch Q_{i+1}, dO_{i+1} and the row statistics into registers
                if i + 1 < Tr:
                    rown = row0 + BR
                    load_q(gQ, gdO, ub, uh, rown, s_q, d, tid, rQn, rdOn)  # HBM read: 2 Br*d (block i+1)
                    if tid < uBR:
                        # Alg.4 L19: D_i = rowsum(dO_i o O_i). Dev: formed once per row in the first pass
                        # (j = 0) and kept in an O(N) scratch array; the later passes read it back
                        mval, ilval, Dval = row_stats(gm, gl, gO, gdO, gDs, b, h, rown + int(tid), s_q, d, j == 0)
                if DROPOUT:
                    for a in range(TM):
                        rkey[a] = row_key(k_bh, row0 + int(tid // uTPR) + RG * a)
                # Alg.4 L11-L15: S_ij = tau Q_i K_j^T (TM x TN register tile, base 2 as the forward); masked (L12);
                # P_ij = diag(l_i)^-1 exp(S_ij - m_i) (L13, as exp2(S - m_i log2 e) / l_i); Z_ij from the seed (L14);
                # P~_ij = P_ij o Z_ij to SRAM (L15)
                # Alg.4 L17-L20: dP~_ij = dO_i V_j^T (L17); dP_ij = dP~_ij o Z_ij (L18); dS_ij = P_ij o (dP_ij - D_i)
                # (L20), times tau, to SRAM
                s_dp_p_ds(smem, tid, row0, col0, s_k, causal_offset, tau, c, rkey, threshold, dropout_scale, rS, rdP, rq, rdo)
                cuda.syncthreads()  # Sync: all of P~_ij and tau dS_ij in SRAM before lines 16, 21, 22 read other threads' rows
                # Dev: line 21's read of dQ_i (into registers) is issued here, so that its HBM latency overlaps
                # lines 16 and 22 (issued at line 10 it would be live across lines 11-20, the register peak: spills)
                for a in range(TM2):
                    row = row0 + int(rg2 + uRG2 * U(a))
                    for e2 in range(DX2):
                        x = tc2 + uTPR2 * U(e2)
                        val = ZERO  # j = 0: line 5's dQ = 0, never read from HBM
                        if j > 0 and row < s_q and x < U(d):
                            val = gdQ[ub, U(row), uh, x]  # HBM read: Br*d
                        rdQo[a * DX2 + e2] = val
                # Alg.4 L16: dV~_j += P~_ij^T dO_i -- outer products over the Br rows, TC x 4 DVX register tile
                # Alg.4 L22: dK~_j += tau dS_ij^T Q_i -- Dev: the same loop as line 16 (one pass over the rows)
                dv_dk_update(smem, cy, tx, rp, rds, rov, rqv, rdV, rdK)
                # Alg.4 L21: dQ_i <- dQ_i + tau dS_ij K_j, written back to HBM (no atomics: this block owns
                # the head's dQ, and the thread that writes an element is the one that read it at line 10)
                for a in range(NQ2):
                    rdQ[a] = ZERO
                dq_tile(smem, tid, rdQ, rds4)
                for a in range(TM2):
                    row = row0 + int(rg2 + uRG2 * U(a))
                    if row < s_q:
                        for e2 in range(DX2):
                            x = tc2 + uTPR2 * U(e2)
                            if x < U(d):
                                gdQ[ub, U(row), uh, x] = rdQo[a * DX2 + e2] + rdQ[a * DX2 + e2]  # HBM write: Br*d
            # [/doc:alg4-fast-inner-loop]

            # Alg.4 L24: write dK_j (tau is in dK~_j already) and dV_j to HBM: this query head's share
            store_dk_dv(gdK, gdV, ub, uh, col0, s_k, d, cy, tx, rdK, rdV)

    # [/doc:alg4-fast-kernel]
    return kernel


def default_features() -> dict:
    """Kernel features used on this backend: 16-byte aligned SRAM on a GPU only."""
    return {"VEC": not _backend.is_simulator()}


def plan(prob: Problem, block_sizes=None, config=None, features=None, from_lse=False):
    """(kernel, grid, threads, dynamic SRAM bytes, config) of :func:`backward`, without launching."""
    cfg = config if config is not None else config_for(prob.headdim, None if block_sizes is None else tuple(block_sizes))
    NT, BR, BC, DP = cfg
    derived(NT, BR, BC, DP)
    feats = _plan.checked_features(default_features(), features)
    nbytes = 4 * smem_floats(NT, BR, BC, DP)
    _plan.check_sram(nbytes, BR, BC, prob.headdim)
    kernel = alg4_backward_fast_kernel(NT, BR, BC, DP, bool(prob.causal), prob.dropout_p > 0, bool(from_lse), feats["VEC"])
    return kernel, prob.batch * prob.nheads, NT, nbytes, cfg


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles (the kernel contract): :func:`config_for`, which rounds an override up."""
    _, BR, BC, _ = config_for(prob.headdim, None if block_sizes is None else tuple(block_sizes))
    return BR, BC


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block, in bytes."""
    return plan(prob, block_sizes)[3]


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """The main launch of :func:`backward`, compiled for ``prob`` (not launched)."""
    kernel, grid, NT, nbytes, (_, BR, BC, _) = plan(prob, block_sizes)
    return [KernelLaunch(f"FA1 backward fast (Br, Bc) = ({BR}, {BC})", kernel, NT, grid)]


def backward(dout, q, k, v, out, fwd, prob: Problem, alloc, block_sizes=None, deterministic=False, config=None, features=None):
    """FA1 Algorithm 4, fast kernel, on kernel arrays: ``(dq, dk, dv)`` (dk, dv summed over each GQA group).

    Same contract as :func:`numba_flash.alg4_backward.backward` (``fwd.m, fwd.l`` from the FA1 forward,
    or the logsumexp ``fwd.lse`` alone). Always deterministic (no atomics). ``config=(NT, Br, Bc, DP)``
    and ``features`` (dict of ``VEC``) override the tiling and kernel features.
    """
    from_lse = fwd.m is None or fwd.l is None
    kernel, grid, NT, nbytes, _ = plan(prob, block_sizes, config, features, from_lse)
    b, s_q, s_k, h, h_k, d = prob.batch, prob.seqlen_q, prob.seqlen_k, prob.nheads, prob.nheads_k, prob.headdim
    G = prob.group
    dq = alloc.empty((b, s_q, h, d))
    dk = alloc.empty((b, s_k, h_k, d))
    dv = alloc.empty((b, s_k, h_k, d))
    # Dev: under GQA/MQA each query head's block writes its partial dK, dV to an O(N)-per-head scratch
    # array and numba_flash.device.gqa.group_sum adds each group (as the readable kernel).
    dk_h, dv_h = per_head_grads(dk, dv, prob, alloc)
    delta = alloc.empty((b, h, s_q))  # D_i scratch: O(N) per head
    m, l = (fwd.lse, fwd.lse) if from_lse else (fwd.m, fwd.l)
    _smem.launch(kernel, grid, NT, nbytes, q, k, v, out, dout, m, l, delta, dq, dk_h, dv_h,
                 prob.softmax_scale, G, prob.causal_offset, np.uint32(prob.seed), np.uint32(prob.threshold),
                 np.float32(prob.dropout_scale))
    group_sum(dk_h, dv_h, dk, dv, prob)
    # Alg.4 L26: return dQ, dK, dV
    return dq, dk, dv
