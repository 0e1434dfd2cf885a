"""FlashAttention-2 Algorithm 1 as a Numba CUDA kernel: the readable version, line by line.

Paper: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
Algorithm 1 (section 3.1.1), causal masking (section 3.1.1) and the work partitioning of section 3.3.
The float64 twin is :mod:`numba_flash_reference.fa2_forward`; put the two files side by side.

What a reader learns
--------------------
* **Query-outer loop (FA2.1 L3).** One thread block per (batch, head, query block ``Q_i``); blocks
  never talk to each other, so the sequence dimension parallelizes (FA2 section 3.2).
* **Un-normalized accumulator (L9-L10, L12).** ``O_i`` stays in registers for the whole inner loop and
  is only rescaled by ``exp(m_old - m_new) <= 1``; the one division by ``l_i`` happens at the end.
* **L = m + log l is stored (L13, L15)**, and here also ``m`` and ``l`` apart (O(N) more): with
  large logits the backward's ``exp(S - L)`` would inherit the rounding of ``L`` (``docs/backward.rst``).
* **Warps split over query rows (section 3.3).** Here each *thread* owns one query row: its ``m_i``,
  ``l_i`` and the ``d`` numbers of its ``O_i`` row live in its registers, and the row max / row sum of
  line 9 are loops in one thread, so no warp ever waits for another except to share ``K_j, V_j``.
* **Causal block skipping.** Key blocks beyond the last row's horizon are never loaded; only blocks the
  diagonal crosses (or the ragged last block) are masked elementwise.

Launch geometry and loops
-------------------------
grid ``(Tr, batch * nheads)``, block ``Br`` threads; thread ``t`` of block ``(i, bh)`` owns query row
``i * Br + t``. Loop: ``for j in 0..Tc-1`` (FA2.1 L6): all threads load ``K_j, V_j`` together, then each
computes its row of ``S_ij`` and ``P~_ij`` in SRAM and updates its ``O_i`` row.

SRAM budget (float32 elements): ``sQ_i`` Br (d+1), ``sK_j, sV_j`` 2 Bc d, ``sS_ij`` Br (Bc+1): below
the 48 KB static limit for the default block sizes of FA1 Algorithm 1 line 1
(:func:`numba_flash_reference.common.block_sizes`).

This is the *readable* kernel (variant ``"readable"``). Its twins: :mod:`numba_flash.fast.fa2_forward`
(variant ``"fast"``, register-blocked FFMA) and :mod:`numba_flash.tensorcore.fa2_forward_tf32` (variant
``"tensorcore"``, 3xTF32 tensor cores, the default on GPUs of compute capability 8.0+); each docstring
says what changed and what it bought. Run this one with ``variant="readable"``.

Run it::

    >>> import numpy as np
    >>> from numba_flash.api import attention_numpy
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 20, 1, 8)).astype(np.float32)
    >>> attention_numpy(q, k, v, causal=True, algorithm="flash2", variant="readable", block_sizes=(8, 8)).shape
    (1, 20, 1, 8)
"""

from __future__ import annotations

import functools
import math

from numba_flash_reference.common import block_sizes as fa1_block_sizes

from numba import cuda, float32, uint64

from ._launch import STATIC_SMEM_BYTES, ForwardOutput, KernelLaunch, Problem, bh_grid, ceil_div
from ._tiles_readable import load_tile
from .device.dropout import head_key, keep, row_key
from .device.grid import folded_batch_head


def tile_sram_bytes(Br: int, Bc: int, d: int) -> int:
    """Static shared memory of the readable kernel: sQ_i Br(d+1), sK_j, sV_j 2 Bc d, sS_ij Br(Bc+1)."""
    return 4 * (Br * (d + 1) + 2 * Bc * d + Br * (Bc + 1))


def _split(prob: Problem, block_sizes):
    """FA2.1 lines 1-2: the block sizes and the number of blocks of Q (and O, L) and of K, V."""
    d = prob.headdim
    Br, Bc = fa1_block_sizes(d) if block_sizes is None else block_sizes
    if Br > 1024:
        raise ValueError(f"block_sizes: Br={Br} is one thread per query row; at most 1024 threads per block")
    if tile_sram_bytes(Br, Bc, d) > STATIC_SMEM_BYTES:
        raise ValueError(f"block_sizes ({Br}, {Bc}) need {tile_sram_bytes(Br, Bc, d)} bytes of shared memory at d={d}; the limit is {STATIC_SMEM_BYTES}")
    # FA2.1 L1: split Q into Tr = ceil(N_q / Br) blocks Q_i, K and V into Tc = ceil(N_k / Bc) blocks K_j, V_j
    Tr = ceil_div(prob.seqlen_q, Br)
    Tc = ceil_div(prob.seqlen_k, Bc)
    # FA2.1 L2: split O into Tr blocks O_i and L into Tr blocks L_i (the same row ranges as Q_i)
    return Br, Bc, Tr, Tc


@functools.cache
def fa2_forward_kernel(BR: int, BC: int, D: int, CAUSAL: bool, DROPOUT: bool):
    """The readable FA2 forward kernel for one (Br, Bc, d, causal, dropout) specialization.

    Kernel arguments: ``gQ (b, s_q, h, d)``, ``gK, gV (b, s_k, h_k, d)``, outputs ``gO (b, s_q, h, d)``,
    ``gL, gm, gl (b, h, s_q)``; ``tau``, ``group = h // h_k``, ``causal_offset = s_k - s_q``, dropout ``seed``,
    ``threshold`` and ``dropout_scale = 1 / (1 - p)``.

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ==================  ============================================
    Q, K, V, O, L             gQ, gK, gV, gO, gL  HBM
    Q_i                       sQ_i                SRAM (Br, d+1), loaded once (L4)
    K_j, V_j                  sK_j, sV_j          SRAM (Bc, d), loaded each inner step (L7)
    S_i^(j), P~_i^(j)         sS_ij               SRAM (Br, Bc+1); row t is thread t's only
    O_i^(j) (un-normalized)   rO_i                registers (d per thread)
    m_i^(j), l_i^(j)          m_i, l_i            registers (one row per thread)
    e^(m^(j-1) - m^(j))       alpha               register
    L_i                       L_i                 register until L15
    m_i, l_i (saved apart)    gm, gl              HBM (b, h, s_q), for the backward's P
    ========================  ==================  ============================================
    """

    # Dev: +1 column of padding on sQ_i and sS_ij: the 32 threads of a warp read one column of 32
    # different rows; with a row length that is a multiple of 32 they would all hit one memory bank.
    DQ = D + 1
    BCP = BC + 1

    # [doc:fa2-kernel]
    @cuda.jit
    def kernel(gQ, gK, gV, gO, gL, gm, gl, tau, group, causal_offset, seed, threshold, dropout_scale):
        sQ_i = cuda.shared.array((BR, DQ), float32)  # (Br, d) SRAM
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sS_ij = cuda.shared.array((BR, BCP), float32)  # (Br, Bc) SRAM: S_ij, then P~_ij
        rO_i = cuda.local.array(D, float32)  # (d,) registers: this thread's row of O_i

        t = cuda.threadIdx.x
        nheads = gQ.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        _, b, h = folded_batch_head(nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        hk = h // group  # GQA/MQA: the key/value head of query head h (indexed, never copied)
        # FA2.1 L3: for i = 1..Tr -- this thread block is one i; thread t owns query row `row`
        i = cuda.blockIdx.x
        row0 = i * BR
        row = row0 + t

        # FA2.1 L4: load Q_i from HBM to SRAM (rows past N_q are zero: computed, never stored)
        load_tile(sQ_i, gQ, b, row0, h, s_q, D, t, BR)  # HBM read: Br*d
        # FA2.1 L5: on chip, O_i = (0) Br x d, l_i = (0) Br, m_i = (-inf) Br
        for c in range(D):
            rO_i[c] = float32(0.0)
        l_i = float32(0.0)
        m_i = float32(-math.inf)
        k_row = row_key(head_key(seed, b * nheads + h), row) if DROPOUT else uint64(0)  # this row's dropout hash key

        # Dev: causal block skipping (FA2 section 3.1.1): key blocks past the block's last row's horizon
        n_blocks = (s_k + BC - 1) // BC
        if CAUSAL:
            visible_cols = min(s_k, max(0, row0 + BR + causal_offset))
            n_blocks = (visible_cols + BC - 1) // BC

        # FA2.1 L6: for j = 1..Tc
        for j in range(n_blocks):
            col0 = j * BC
            cuda.syncthreads()  # Sync: every thread is done with K_{j-1}, V_{j-1} before they are overwritten
            # FA2.1 L7: load K_j, V_j from HBM to SRAM (all threads together; ragged rows zero)
            load_tile(sK_j, gK, b, col0, hk, s_k, D, t, BR)  # HBM read: Bc*d
            load_tile(sV_j, gV, b, col0, hk, s_k, D, t, BR)  # HBM read: Bc*d
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before L8 and L10 read them

            # [doc:fa2-inner-loop]
            # Dev: the elementwise mask only on blocks the diagonal crosses, or the ragged last block
            masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
            # FA2.1 L8: S_i^(j) = tau Q_i K_j^T -- this thread's row, with its running row max
            m_tile = float32(-math.inf)
            for c in range(BC):
                col = col0 + c
                if masked and (col >= s_k or (CAUSAL and col > row + causal_offset)):
                    s = float32(-math.inf)
                else:
                    acc = float32(0.0)
                    for x in range(D):
                        acc += sQ_i[t, x] * sK_j[c, x]
                    s = float32(tau * acc)
                sS_ij[t, c] = s
                m_tile = max(m_tile, s)
            # FA2.1 L9: m_new = max(m_old, rowmax S); P~ = exp(S - m_new); l_new = e^(m_old - m_new) l_old + rowsum P~
            m_new = max(m_i, m_tile)
            m_safe = m_new if m_new != -math.inf else float32(0.0)  # Dev: a row that saw no key yet: exp(-inf - 0) = 0, no NaN
            alpha = math.exp(m_i - m_safe)  # e^(m_old - m_new) <= 1 (0 when m_old = -inf)
            rowsum = float32(0.0)
            for c in range(BC):
                p = math.exp(sS_ij[t, c] - m_safe)
                rowsum += p  # l from the undropped P~ (as FA1 Alg.2 L13)
                if DROPOUT:
                    # Dev: dropout as in FA1 Alg.2 L14, Z regenerated from the counter hash
                    p = p * dropout_scale if keep(k_row, col0 + c, threshold) else float32(0.0)
                sS_ij[t, c] = p
            l_i = alpha * l_i + rowsum
            # FA2.1 L10: O_i^(j) = diag(e^(m_old - m_new)) O_i^(j-1) + P~ V_j   (the paper's inverse is a typo)
            for x in range(D):
                acc = alpha * rO_i[x]
                for c in range(BC):
                    acc += sS_ij[t, c] * sV_j[c, x]
                rO_i[x] = acc
            m_i = m_new
            # [/doc:fa2-inner-loop]

        if row < s_q:
            # FA2.1 L12: O_i = diag(l_i)^-1 O_i -- the only division (a row that saw no key keeps O = 0)
            inv_l = float32(1.0) / l_i if l_i > 0 else float32(0.0)
            # FA2.1 L13: L_i = m_i + log(l_i)   (+inf where the row saw no key)
            L_i = m_i + math.log(l_i) if l_i > 0 else float32(math.inf)
            # FA2.1 L14: write O_i to HBM
            for x in range(D):
                gO[b, row, h, x] = rO_i[x] * inv_l  # HBM write: Br*d
            # FA2.1 L15: write L_i to HBM
            gL[b, h, row] = L_i  # HBM write: Br
            # Dev: m_i and l_i too (2 Br): the backward's P = exp(S - m) / l; exp(S - L) loses ulp(L) per entry
            gm[b, h, row] = m_i
            gl[b, h, row] = l_i

    # [/doc:fa2-kernel]
    return kernel


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) (the kernel contract): FA1's formula (Alg.1 L1) unless overridden."""
    Br, Bc, _, _ = _split(prob, block_sizes)
    return Br, Bc


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Static shared memory per block, in bytes."""
    return tile_sram_bytes(*choose_block_sizes(prob, block_sizes), prob.headdim)


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """The one launch of :func:`forward`, compiled for ``prob`` (not launched)."""
    Br, Bc, Tr, _ = _split(prob, block_sizes)
    kernel = fa2_forward_kernel(Br, Bc, prob.headdim, prob.causal, prob.dropout_p > 0)
    return [KernelLaunch(f"FA2 forward (Br, Bc) = ({Br}, {Bc})", kernel, Br, Tr * prob.batch * prob.nheads)]


def forward(q, k, v, prob: Problem, alloc, block_sizes=None) -> ForwardOutput:
    """FA2 Algorithm 1 on kernel arrays (see :mod:`numba_flash._launch`): ``ForwardOutput(out, lse, m, l)``."""
    Br, Bc, Tr, Tc = _split(prob, block_sizes)
    out = alloc.empty((prob.batch, prob.seqlen_q, prob.nheads, prob.headdim))
    lse, m, l = (alloc.empty((prob.batch, prob.nheads, prob.seqlen_q)) for _ in range(3))
    kernel = fa2_forward_kernel(Br, Bc, prob.headdim, prob.causal, prob.dropout_p > 0)
    kernel[bh_grid(Tr, prob.batch * prob.nheads), Br](
        q, k, v, out, lse, m, l, prob.softmax_scale, prob.group, prob.causal_offset, prob.seed, prob.threshold, prob.dropout_scale
    )
    # FA2.1 L17: return O, L (and m, l: see L15)
    return ForwardOutput(out=out, lse=lse, m=m, l=l)
