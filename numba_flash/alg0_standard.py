"""FA1 Algorithm 0: standard attention, the HBM-bound baseline, as three kernel launches.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 0 (section 2.2), with the semantics of
Algorithm 2 (scale ``tau``, causal mask, dropout) and flash-attn's ``flash_attn_func``. The NumPy
twin is :mod:`numba_flash_reference.alg0_standard`.

What a reader learns
--------------------
Standard attention is three passes over an N x N matrix that lives in HBM:

1. ``S = tau Q K^T`` (a batched GEMM, :mod:`numba_flash._matmul`), the causal mask written as ``-inf``;
2. ``P = softmax(S)`` by rows (:func:`row_softmax_kernel`), which also yields the row statistics
   ``m``, ``l`` and the logsumexp ``L = m + log l``;
3. ``O = P V`` (the same GEMM), dropout applied to ``P`` as its tiles are loaded.

Each pass is a reasonable kernel (shared-memory tiled, register-blocked GEMMs; a one-block-per-row
softmax with a shared-memory reduction), so what the comparison with FlashAttention measures is the
N x N traffic and memory, not a strawman: ``S`` is written once, read and rewritten by the softmax
(``P`` overwrites ``S`` in place), and read again by ``P V``: Theta(N^2) HBM accesses per head
(Theorem 2) and ``b * h * s_q * s_k * 4`` bytes of extra device memory.

Launch geometry
---------------
* GEMMs: see :mod:`numba_flash._matmul` (64 x 64 output tiles on a GPU, 16 x 16 in the simulator).
* Softmax: grid ``(ceil(s_q / R), b * h)``, blocks of ``T x R`` threads (``SOFTMAX_THREADS x
  SOFTMAX_ROWS``: 64 x 4 on a GPU): ``T`` threads per row of ``S``, ``R`` rows per block. Thread ``t``
  reads columns ``t, t + T, t + 2T, ...`` (coalesced), keeps an online (max, sum) pair, the ``T``
  threads merge their pairs in a shared-memory tree, then every thread writes its ``P`` entries.
  SRAM: ``2 * T * R`` float32.

Run it::

    python -m numba_flash demo                      # standard vs tiled, current backend
    python -m pytest tests/kernels/test_forward_kernels.py -k standard
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from ._launch import ForwardOutput, KernelLaunch, Problem, bh_grid
from ._matmul import default_tiles, matmul, matmul_kernel
from .runtime import backend as _backend

#: Softmax block: SOFTMAX_THREADS threads along a row x SOFTMAX_ROWS rows. The simulator runs each
#: thread as a Python thread, so it gets few threads per row.
SOFTMAX_THREADS, SOFTMAX_ROWS = (4, 8) if _backend.is_simulator() else (64, 4)


@cuda.jit(device=True, inline="always")
def merge_max_sum(m1, l1, m2, l2):
    """Merge two online-softmax summaries (max, sum of exp(x - max)); -inf means 'saw nothing'."""
    m = max(m1, m2)
    if m == -math.inf:
        return m, l1 + l2  # 0, or NaN from a NaN score
    return m, l1 * math.exp(m1 - m) + l2 * math.exp(m2 - m)


@functools.cache
def row_softmax_kernel(threads: int, rows: int):
    """The row-softmax kernel: blocks of ``threads`` (a power of two) x ``rows`` threads.

    Symbol table (paper symbol -> variable -> memory space):

    ======================  ==================  ================================
    S (masked, scaled)      gS[b, h, r, :]      HBM, read twice
    P = softmax(S)          gS[b, h, r, :]      HBM, written over S in place
    m, l, L of row r        gm, gl, glse        HBM (b, h, s_q)
    partial (max, sum)      sMax, sSum          SRAM (rows, threads)
    ======================  ==================  ================================
    """
    T, R = threads, rows
    if T & (T - 1):
        raise ValueError(f"threads must be a power of two, got {T}")

    # [doc:alg0-row-softmax]
    @cuda.jit
    def kernel(gS, gm, gl, glse):
        sMax = cuda.shared.array((R, T), float32)  # (rows, T) SRAM: each thread's running max
        sSum = cuda.shared.array((R, T), float32)  # (rows, T) SRAM: each thread's running sum of exp(s - max)
        t = cuda.threadIdx.x
        y = cuda.threadIdx.y
        r = cuda.blockIdx.x * R + y  # the row of S this thread works on
        nheads = gS.shape[1]
        bh = cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z  # Dev: b*h folded over grid y, z (y <= 65535)
        bi = bh // nheads
        hi = bh % nheads
        if bi >= gS.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        n = gS.shape[3]
        inside = r < gS.shape[2]  # the last block may have rows past s_q
        # Pass 1: one read of the row, an online (max, sum) per thread.
        m_t = float32(-math.inf)
        l_t = float32(0.0)
        if inside:
            for j in range(t, n, T):
                s = gS[bi, hi, r, j]  # HBM read: N (the whole row, over the T threads)
                if s > m_t:  # a masked entry (-inf) never enters the sum
                    l_t = l_t * math.exp(m_t - s) + float32(1.0)
                    m_t = s
                elif s > -math.inf:
                    l_t += math.exp(s - m_t)
                elif s != s:
                    l_t = s  # Dev: a NaN score makes the row NaN (as softmax does), never an ignored entry
        sMax[y, t] = m_t
        sSum[y, t] = l_t
        cuda.syncthreads()  # Sync: every thread's (max, sum) in SRAM before the tree merges them
        half = T // 2
        while half > 0:
            if t < half:
                sMax[y, t], sSum[y, t] = merge_max_sum(sMax[y, t], sSum[y, t], sMax[y, t + half], sSum[y, t + half])
            cuda.syncthreads()  # Sync: this level of the tree is merged before the next reads it
            half //= 2
        m = sMax[y, 0]
        l = sSum[y, 0]
        if inside:
            if t == 0:
                gm[bi, hi, r] = m  # HBM write: 1
                gl[bi, hi, r] = l
                glse[bi, hi, r] = m + math.log(l) if l != 0 else math.inf  # +inf: the row sees no key (NaN stays NaN)
            # Pass 2: P = exp(S - m) / l, over S in place (a fully masked row gives P = 0).
            for j in range(t, n, T):
                s = gS[bi, hi, r, j]  # HBM read: N (often an L2 hit: the row was just read)
                gS[bi, hi, r, j] = math.exp(s - m) / l if l != 0 else float32(0.0)  # HBM write: N

    # [/doc:alg0-row-softmax]
    return kernel


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """The kernel contract's (Br, Bc): here the (BM, BN) output tile of the GEMMs.

    Nothing in Algorithm 0 is tiled over N the way FlashAttention is; ``block_sizes`` is ignored.
    """
    t = default_tiles()
    return t.BM, t.BN


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Static shared memory per block of the GEMMs (the largest of the three kernels), in bytes."""
    return max(default_tiles().sram_bytes, 2 * 4 * SOFTMAX_THREADS * SOFTMAX_ROWS)


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """(name, dispatcher, threads per block, blocks in the grid) of each launch of :func:`forward`.

    For inspection (:mod:`numba_flash.runtime.resources`) after a call with the same problem.
    """
    t = default_tiles()
    b, s_q, s_k, h, d = prob.batch, prob.seqlen_q, prob.seqlen_k, prob.nheads, prob.headdim
    qk = matmul_kernel("bshd", False, "bshd", True, "bhst", False, prob.causal, False, t)
    pv = matmul_kernel("bhst", False, "bshd", False, "bshd", False, False, prob.dropout_p > 0, t)
    return [
        KernelLaunch("S = tau QK^T", qk, t.threads, -(-s_k // t.BN) * -(-s_q // t.BM) * b * h),
        KernelLaunch("P = softmax(S)", row_softmax_kernel(SOFTMAX_THREADS, SOFTMAX_ROWS), SOFTMAX_THREADS * SOFTMAX_ROWS,
                     -(-s_q // SOFTMAX_ROWS) * b * h),
        KernelLaunch("O = PV", pv, t.threads, -(-d // t.BN) * -(-s_q // t.BM) * b * h),
    ]


def forward(q, k, v, prob: Problem, alloc, block_sizes=None) -> ForwardOutput:
    """Standard attention (Algorithm 0) on kernel arrays; see :mod:`numba_flash.api` for the contract.

    ``block_sizes`` is accepted for a uniform interface and ignored: the GEMM tiles of
    :mod:`numba_flash._matmul` are not the paper's ``Br, Bc`` (nothing here is tiled over N).

    Extra device memory: the ``(b, h, s_q, s_k)`` float32 matrix that holds S, then P.
    """
    b, s_q, s_k, h = prob.batch, prob.seqlen_q, prob.seqlen_k, prob.nheads
    g = prob.group
    S = alloc.empty((b, h, s_q, s_k))  # the N x N matrix in HBM: S, then P in place
    # Alg.0 L1: S = tau Q K^T (mask: -inf where key j is hidden from query i), written to HBM
    matmul(q, k, S, a_layout="bshd", b_layout="bshd", c_layout="bhst", trans_b=True, b_kv=True, kv_group=g,
           alpha=prob.softmax_scale, causal_offset=prob.causal_offset if prob.causal else None)
    # Alg.0 L2: P = softmax(S) by rows, written to HBM (Dev: over S in place, halving the memory; the
    # traffic is the paper's), with the row statistics m, l and L = m + log l for the backward pass
    m = alloc.empty((b, h, s_q))
    l = alloc.empty((b, h, s_q))
    lse = alloc.empty((b, h, s_q))
    grid = bh_grid(-(-s_q // SOFTMAX_ROWS), b * h)
    row_softmax_kernel(SOFTMAX_THREADS, SOFTMAX_ROWS)[grid, (SOFTMAX_THREADS, SOFTMAX_ROWS)](S, m, l, lse)
    # Alg.0 L3: O = P V, written to HBM (Dev: Alg.2 L14's dropout applied to P's tiles as they are loaded)
    out = alloc.empty((b, s_q, h, prob.headdim))
    dropout = (prob.seed, prob.threshold, prob.dropout_p) if prob.dropout_p > 0 else None
    matmul(S, v, out, a_layout="bhst", b_layout="bshd", c_layout="bshd", b_kv=True, kv_group=g, dropout=dropout)
    # Alg.0 L4: return O (and the statistics)
    return ForwardOutput(out=out, lse=lse, m=m, l=l)

