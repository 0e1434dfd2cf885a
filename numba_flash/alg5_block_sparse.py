"""FA1 Algorithm 5: block-sparse FlashAttention as Numba kernels, forward and backward, line by line.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 5 (Appendix D.1) and Proposition 4.
The NumPy twins are :func:`numba_flash_reference.alg5_block_sparse.flash_forward_alg5` and
:func:`~numba_flash_reference.alg5_block_sparse.flash_backward_alg5`. The public entry points are
:func:`numba_flash.block_sparse.block_sparse_attn_func` (torch, differentiable) and
:func:`numba_flash.block_sparse.block_sparse_attention_numpy`.

What a reader learns
--------------------
* Algorithm 5 is Algorithm 2 with one line added: ``if M_ij != 0`` (line 8) around the inner step.
  This kernel is :mod:`numba_flash.alg1_forward`'s kernel with that test, and the backward is
  :mod:`numba_flash.alg4_backward`'s with the same test: a zero tile costs **no FLOP, no barrier and
  no HBM access**. That is Proposition 4: ``Theta(N d + N^2 d^2 s / M)`` HBM accesses for a fraction
  ``s`` of non-zero blocks, so the run time falls in proportion to ``s``.
* How the skip interacts with the online softmax: the first non-zero tile of a row block starts the
  running ``(m_i, l_i, O_i)`` from ``(-inf, 0, 0)``; the last one finishes ``L_i = m_i + log l_i``.
  Zero tiles in between are simply absent from the merge (the merge is associative: FA1 §3.1).

The block-mask contract
-----------------------
The mask is over the kernel's tiles: **the tile is the mask block**. With ``block_size = (Br, Bc)``,
``block_mask`` has shape ``(Tr, Tc)``, ``(H, Tr, Tc)`` or ``(B, H, Tr, Tc)`` with ``Tr = ceil(s_q / Br)``,
``Tc = ceil(s_k / Bc)``, ``H`` in ``{1, nheads}`` and ``B`` in ``{1, batch}``; entry ``(i, j)`` is 1 when
query rows ``[i Br, (i+1) Br)`` may attend to keys ``[j Bc, (j+1) Bc)`` (the last block of each may be
ragged). The element mask is ``M~[r, c] = M[r // Br, c // Bc]`` (paper: ``M~_kl = M_{floor(k/Br),
floor(l/Bc)}``). Every row of blocks must hold at least one 1 (:mod:`numba_flash.block_sparse` checks
it before any launch). The causal mask (bottom-right aligned) and dropout apply inside the non-zero
tiles, as in Algorithm 2; to *skip* the tiles above the diagonal, put the causal structure into the
block mask (:func:`causal_block_mask`).

Launch geometry (FA1's parallelism)
-----------------------------------
Grid ``b * h``: one thread block per (batch, query head), running the paper's two loops serially
(``j`` over key blocks outside, ``i`` over query blocks inside); block ``TY x TX`` threads, each owning
a register tile of ``S_ij`` and of ``P~_ij V_j``, exactly as in :mod:`numba_flash.alg1_forward`. The
backward is :mod:`numba_flash.alg4_backward`'s geometry (one block per (batch, query head), dK, dV
summed over GQA groups by a second small kernel).

SRAM budget
-----------
Forward: :func:`numba_flash.alg1_forward.sram_footprint` (K_j, V_j, Q_i, O_i, P_ij, l_i, m_i); backward:
:class:`numba_flash.alg4_backward.Alg4Config` (K_j, V_j, Q_i, dO_i, P_ij, dS_ij). Both must fit
numba-cuda's 48 KB of static shared memory; :data:`DEFAULT_BLOCK_SIZE` = (16, 16) fits both passes up
to ``d = 128``; (32, 32) fits both up to ``d = 64``.

HBM accesses (what :func:`hbm_accesses` counts, and the simulator tests count element by element)
-------------------------------------------------------------------------------------------------------
Per (batch, query head), ``W = sum over non-zero tiles (i, j) of |rows_i|``, ``Nq = s_q``:

* forward reads ``K, V``: ``|cols_j| d`` for each *non-empty* column ``j``; ``Q``: ``W d``;
  ``O``: ``(W - Nq) d``; ``l, m``: ``W - Nq`` each. Writes ``O``: ``W d``; ``l, m``: ``W`` each; ``L``: ``Nq``.
* backward reads ``K, V`` as above; ``Q, O, dO``: ``W d`` each; ``dQ``: ``(W - Nq) d``; ``l, m``: ``W``
  each. Writes ``dQ``: ``W d``; ``dK, dV``: ``Nk d`` each (zeros for the columns no tile sees).

Against the paper's count (:func:`numba_flash_reference.io_model.io_alg5_block_sparse`, reads
``2 Nk d + W (2d + 2)``, writes ``W (d + 2)``) three departures, all marked ``Dev`` below: a column
with no non-zero tile does not load ``K_j, V_j``; the first visit of a row block does not read the
initial ``O_i = 0, l_i = 0, m_i = -inf`` (line 2 is never materialized in HBM); the last visit writes
``L_i``. The block-mask metadata (one flag per tile, a first/last column per row block, one flag per
column) is read as broadcast loads and is not counted.

Run it::

    >>> import numpy as np
    >>> from numba_flash.block_sparse import block_sparse_attention_numpy
    >>> from numba_flash_reference.alg5_block_sparse import butterfly_block_mask
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 32, 1, 8)).astype(np.float32)
    >>> out = block_sparse_attention_numpy(q, k, v, butterfly_block_mask(4), block_size=(8, 8))
    >>> out.shape
    (1, 32, 1, 8)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, uint64

from ._launch import STATIC_SMEM_BYTES, ForwardOutput, Problem, ceil_div
from .alg1_forward import sram_elements, sram_footprint, thread_layout, use_shuffles
from .alg4_backward import Alg4Config, default_threads
from .device.dropout import head_key, keep, row_key
from .device.gqa import group_sum, per_head_grads
from .runtime import backend as _backend

#: block_size (Br, Bc) when none is given: fits both kernels' 48 KB SRAM at every d <= 128.
DEFAULT_BLOCK_SIZE = (16, 16)


# ----------------------------------------------------------------------------------------------
# The block mask as the kernels read it
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockMask:
    """A checked block mask and what the kernels derive from it (all NumPy, host side).

    ``mask``: bool ``(B, H, Tr, Tc)`` with ``B`` in {1, batch}, ``H`` in {1, nheads} (broadcast by index
    in the kernels, never copied per head). ``span``: int32 ``(B, H, Tr, 2)``, the first and last
    non-zero column block of each row block (where the online softmax starts and ends). ``col``: int32
    ``(B, H, Tc)``, 1 where column ``j`` has at least one non-zero tile (else ``K_j, V_j`` are not loaded).
    """

    mask: np.ndarray
    block_size: tuple

    @property
    def Tr(self) -> int:
        return int(self.mask.shape[2])

    @property
    def Tc(self) -> int:
        return int(self.mask.shape[3])

    @property
    def span(self) -> np.ndarray:
        m = self.mask
        first = np.argmax(m, axis=3)
        last = m.shape[3] - 1 - np.argmax(m[..., ::-1], axis=3)
        return np.ascontiguousarray(np.stack([first, last], axis=-1).astype(np.int32))

    @property
    def col(self) -> np.ndarray:
        return np.ascontiguousarray(self.mask.any(axis=2).astype(np.int32))

    def broadcast(self, batch: int, nheads: int) -> np.ndarray:
        """The mask as bool ``(batch, nheads, Tr, Tc)`` (a view)."""
        return np.broadcast_to(self.mask, (batch, nheads, self.Tr, self.Tc))

    def kernel_arrays(self, alloc):
        """(mask as int32, span, col) as kernel arrays in the allocator's world."""
        arrays = (np.ascontiguousarray(self.mask.astype(np.int32)), self.span, self.col)
        return tuple(cuda.to_device(a) for a in arrays) if alloc.on_device else arrays


def causal_block_mask(seqlen_q: int, seqlen_k: int, block_size) -> np.ndarray:
    """bool ``(Tr, Tc)``: tile ``(i, j)`` holds at least one key visible under the bottom-right causal mask.

    AND it into a block mask to skip the tiles above the diagonal (with ``causal=True`` the kernel still
    masks the diagonal tiles elementwise). A row block whose rows all see no key (``s_q > s_k``) is all
    zero here: such a mask is rejected, pass ``causal=True`` alone for those rows.

    >>> causal_block_mask(4, 4, (2, 2)).astype(int)
    array([[1, 0],
           [1, 1]])
    """
    Br, Bc = (int(n) for n in block_size)
    Tr, Tc = ceil_div(seqlen_q, Br), ceil_div(seqlen_k, Bc)
    last_row = np.minimum((np.arange(Tr) + 1) * Br, seqlen_q) - 1  # the lowest row of each row block
    first_col = np.arange(Tc) * Bc
    return first_col[None, :] <= last_row[:, None] + (seqlen_k - seqlen_q)


# ----------------------------------------------------------------------------------------------
# Block sizes: the tiles are the mask's blocks
# ----------------------------------------------------------------------------------------------
def forward_sram_floats(Br: int, Bc: int, d: int) -> int:
    """float32 elements of SRAM the forward kernel declares (the layout of the current backend)."""
    ty, tx = thread_layout()
    return sram_footprint(Br, Bc, d, (ty, tx), use_shuffles(tx))


def backward_config(Br: int, Bc: int, d: int) -> Alg4Config:
    """The backward kernel's tiles and thread layout (those of :mod:`numba_flash.alg4_backward`)."""
    return Alg4Config(Br, Bc, d, default_threads(Br, Bc, d))


def check_block_size(block_size, d: int) -> tuple[int, int]:
    """``(Br, Bc)``: positive integers whose tiles fit both kernels' SRAM at head dim ``d``.

    Raises
    ------
    ValueError
        Naming ``block_size``, with the shared memory each kernel would need.
    """
    try:
        Br, Bc = block_size
    except (TypeError, ValueError):
        raise ValueError(f"block_size must be a pair (Br, Bc) of positive integers, got {block_size!r}") from None
    for name, n in (("Br", Br), ("Bc", Bc)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"block_size: {name} must be a positive integer, got {n!r}")
    Br, Bc = int(Br), int(Bc)
    fwd = 4 * forward_sram_floats(Br, Bc, d)
    bwd = backward_config(Br, Bc, d).sram_bytes
    limit = min(4 * sram_elements(), STATIC_SMEM_BYTES)
    if max(fwd, bwd) > limit:
        raise ValueError(
            f"block_size {(Br, Bc)} needs {fwd} bytes of shared memory in the forward kernel and {bwd} in the "
            f"backward at headdim {d}; numba-cuda kernels may declare at most {limit}: use smaller blocks, e.g. "
            f"{DEFAULT_BLOCK_SIZE}"
        )
    return Br, Bc


# Alg.5 L1: initialize the pseudo-random number generator state R and save it to HBM
def prng_state(prob: Problem):
    """R = (seed, threshold, 1/(1-p)): the counter hash of :mod:`numba_flash.device.dropout` needs no more."""
    return prob.seed, prob.threshold, prob.dropout_scale


# ----------------------------------------------------------------------------------------------
# Forward: Algorithm 5
# ----------------------------------------------------------------------------------------------
@functools.cache
def forward_kernel(BR: int, BC: int, D: int, CAUSAL: bool, DROPOUT: bool, TY: int, TX: int, SHUFFLE: bool):
    """Compile the Algorithm 5 forward kernel for one tile shape, head dim and option set (cached).

    Symbol table (paper symbol -> variable -> memory space):

    ==========================  ===========================  ==============================
    Q, K, V, O                  gQ, gK, gV, gO               HBM (b, s, h, d), any strides
    l, m, L                     gl, gm, glse                 HBM (b, h, s_q)
    M (the block mask)          gmask                        HBM (B, H, Tr, Tc), 0/1
    first, last non-zero j      gspan                        HBM (B, H, Tr, 2)
    column j has a tile         gcol                         HBM (B, H, Tc)
    tau, R                      tau, (seed, threshold)       kernel arguments
    Q_i, O_i                    sQ_i, sO_i                   SRAM (Br, d)
    K_j, V_j                    sK_j, sV_j                   SRAM (Bc, d)
    l_i, m_i                    sl_i, sm_i                   SRAM (Br,)
    S_ij, P~_ij                 rS (this thread's entries)   registers (RR, CS)
    P~_ij^dropped               sP_ij                        SRAM (Br, Bc)
    m~_ij, l~_ij                rm_tilde, rl_tilde           registers (RR,) per thread
    m_i^new, l_i^new            r_m_new, r_l_new             registers
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
    KV_LOADS = ceil_div(BC * D, NT)
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

    jit_options = {} if _backend.is_simulator() or NT <= 256 else {"max_registers": min(255, 65536 // NT)}

    @cuda.jit(**jit_options)
    def kernel(gQ, gK, gV, gmask, gspan, gcol, gO, gl, gm, glse, tau, causal_offset, seed, threshold, drop_scale):
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
        mb = bi if gmask.shape[0] > 1 else 0  # the mask's batch and head (1 = shared, broadcast)
        mh = hi if gmask.shape[1] > 1 else 0
        k_bh = head_key(seed, bh) if DROPOUT else uint64(0)

        # Alg.5 L2: in HBM, O = (0) N x d, l = (0) N, m = (-inf) N.
        # Dev: never materialized: the first non-zero tile of row block i starts from these values in
        # SRAM instead of reading them (see L9), so every element of O, l, m is written exactly by L15-L16.
        # Alg.5 L3-L4: split Q, O, l, m into Tr row blocks and K, V into Tc column blocks (the mask's grid)
        Tr = gmask.shape[2]
        Tc = gmask.shape[3]

        # [doc:alg5-outer-loop]
        # Alg.5 L5: for 1 <= j <= Tc
        for j in range(Tc):
            if gcol[mb, mh, j] == 0:  # Dev: no non-zero tile in column j: skipped whole, K_j, V_j are not even loaded
                continue
            c0 = j * BC
            # Alg.5 L6: load K_j, V_j from HBM to on-chip SRAM
            for t in range(KV_LOADS):
                e = tid + NT * t
                if e < BC * D:
                    c = e // D
                    x = e % D
                    kx = float32(0.0)  # Dev: rows past s_k (ragged last block) are zeros, masked below
                    vx = float32(0.0)
                    if c0 + c < s_k:
                        kx = gK[bi, c0 + c, hk, x]  # HBM read: Bc*d
                        vx = gV[bi, c0 + c, hk, x]  # HBM read: Bc*d
                    sK_j[c, x] = kx
                    sV_j[c, x] = vx
            # Alg.5 L7: for 1 <= i <= Tr
            for i in range(Tr):
                # Alg.5 L8: if M_ij != 0: a zero tile costs no FLOP, no barrier and no HBM access
                if gmask[mb, mh, i, j] == 0:
                    continue
                r0 = i * BR
                first = j == gspan[mb, mh, i, 0]  # the first non-zero tile of row block i
                last = j == gspan[mb, mh, i, 1]  # the last one
                # [doc:alg5-load]
                # Alg.5 L9: load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM
                for t in range(QO_LOADS):
                    e = tid + NT * t
                    if e < BR * D:
                        r = e // D
                        x = e % D
                        qx = float32(0.0)  # Dev: rows past s_q (ragged last block) are zeros, never stored
                        ox = float32(0.0)  # Dev: first visit: L2's O_i = 0, not read from HBM
                        if r0 + r < s_q:
                            qx = gQ[bi, r0 + r, hi, x]  # HBM read: Br*d
                            if not first:
                                ox = gO[bi, r0 + r, hi, x]  # HBM read: Br*d (not on the first visit)
                        sQ_i[r, x] = qx
                        sO_i[r, x] = ox
                for r in range(tid, BR, NT):
                    l_r = float32(0.0)  # Dev: first visit (or a row past s_q): L2's l = 0, m = -inf
                    m_r = NEG_INF
                    if r0 + r < s_q and not first:
                        l_r = gl[bi, hi, r0 + r]  # HBM read: Br
                        m_r = gm[bi, hi, r0 + r]  # HBM read: Br
                    sl_i[r] = l_r
                    sm_i[r] = m_r
                cuda.syncthreads()  # Sync: K_j, V_j, Q_i, O_i, l_i, m_i in SRAM before L10 reads them
                # [/doc:alg5-load]

                # Alg.5 L10: S_ij = tau Q_i K_j^T  (this thread's RR x CS entries)
                for a in range(RR):
                    for c in range(CS):
                        rS[a, c] = 0.0
                for x in range(D):
                    for a in range(RR):
                        rq[a] = sQ_i[min(ty + TY * a, BR - 1), x]
                    for c in range(CS):
                        rk[c] = sK_j[min(tx + TX * c, BC - 1), x]
                    for a in range(RR):
                        for c in range(CS):
                            rS[a, c] += rq[a] * rk[c]
                # Alg.5 L11: S_ij^masked = mask(S_ij): the causal mask (the block mask is 1 on this whole tile)
                for a in range(RR):
                    row = r0 + ty + TY * a
                    for c in range(CS):
                        col = c0 + tx + TX * c
                        s = tau * rS[a, c]
                        if tx + TX * c >= BC or col >= s_k:
                            s = NEG_INF  # Dev: padding columns (past Bc or past s_k) take no probability
                        if CAUSAL and col > row + causal_offset:
                            s = NEG_INF
                        rS[a, c] = s

                # Alg.5 L12: m~_ij = rowmax(S_ij^masked), P~_ij = exp(S_ij^masked - m~_ij), l~_ij = rowsum(P~_ij)
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
                    m_safe = rm_tilde[a] if rm_tilde[a] > NEG_INF else float32(0.0)  # Dev: a row hidden in this tile: exp(-inf - 0) = 0
                    lsum = float32(0.0)
                    for c in range(CS):
                        p = math.exp(rS[a, c] - m_safe)
                        rS[a, c] = p
                        lsum += p
                    if SHUFFLE:
                        rl_tilde[a] = row_sum(lsum)
                    else:
                        sRowSum[ty + TY * a, tx] = lsum

                # Alg.5 L14: P~_ij^dropped = dropout(P~_ij, p_drop), into SRAM (l~_ij above is from the undropped P~_ij)
                for a in range(RR):
                    r = ty + TY * a
                    k_row = row_key(k_bh, r0 + r) if DROPOUT else uint64(0)
                    for c in range(CS):
                        cc = tx + TX * c
                        if r < BR and cc < BC:
                            p = rS[a, c]
                            if DROPOUT:
                                p = p * drop_scale if keep(k_row, c0 + cc, threshold) else float32(0.0)
                            sP_ij[r, cc] = p
                cuda.syncthreads()  # Sync: P_ij (and the partial row sums) complete in SRAM before P_ij V_j
                if not SHUFFLE:
                    for a in range(RR):
                        lsum = float32(0.0)
                        for t in range(TX):
                            lsum += sRowSum[ty + TY * a, t]
                        rl_tilde[a] = lsum

                # Alg.5 L13: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
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

                # Alg.5 L15: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij^dropped V_j), to HBM
                for a in range(RR):
                    for c in range(CO):
                        rPV[a, c] = 0.0
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
                                gO[bi, row, hi, x] = o / l_new if l_new > 0 else float32(0.0)  # HBM write: Br*d
                        # Alg.5 L16: l_i <- l_new, m_i <- m_new, to HBM
                        if tx == 0:
                            gl[bi, hi, row] = l_new  # HBM write: Br
                            gm[bi, hi, row] = r_m_new[a]  # HBM write: Br
                            if last:  # Dev: the last non-zero tile of the row block also writes L = m + log l
                                glse[bi, hi, row] = r_m_new[a] + math.log(l_new) if l_new > 0 else math.inf  # HBM write: Br
                cuda.syncthreads()  # Sync: all reads of this step's SRAM tiles done before the next step overwrites them
                # Alg.5 L17: end if
            # Alg.5 L18: end for
        # Alg.5 L19: end for
        # [/doc:alg5-outer-loop]

    return kernel


def forward(q, k, v, mask: BlockMask, prob: Problem, alloc) -> ForwardOutput:
    """Algorithm 5 on kernel arrays: ``ForwardOutput(out, lse, m, l)``.

    ``mask`` is a checked :class:`BlockMask` whose tiles are the kernel's (``mask.block_size``);
    :mod:`numba_flash.block_sparse` builds it from the user's ``block_mask``.
    """
    b, s_q, h, d = prob.batch, prob.seqlen_q, prob.nheads, prob.headdim
    Br, Bc = mask.block_size
    ty, tx = thread_layout()
    shuffles = use_shuffles(tx)
    seed, threshold, drop_scale = prng_state(prob)
    out = alloc.empty((b, s_q, h, d))
    l = alloc.empty((b, h, s_q))
    m = alloc.empty((b, h, s_q))
    lse = alloc.empty((b, h, s_q))
    gmask, gspan, gcol = mask.kernel_arrays(alloc)
    kernel = forward_kernel(Br, Bc, d, prob.causal, prob.dropout_p > 0, ty, tx, shuffles)
    kernel[b * h, ty * tx](q, k, v, gmask, gspan, gcol, out, l, m, lse, float32(prob.softmax_scale),
                           prob.causal_offset, seed, threshold, float32(drop_scale))
    # Alg.5 L20: return O, l, m, R (R is the seed in prob; L = m + log l for the API and the backward)
    return ForwardOutput(out=out, lse=lse, m=m, l=l)


# ----------------------------------------------------------------------------------------------
# Backward: Algorithm 4 with Algorithm 5's test
# ----------------------------------------------------------------------------------------------
@functools.cache
def backward_kernel(cfg: Alg4Config, causal: bool, dropout: bool):
    """Compile (once per configuration) the block-sparse backward kernel: Algorithm 4, zero tiles skipped.

    The body is :func:`numba_flash.alg4_backward.alg4_kernel`'s with the test of Alg.5 L8 around lines
    10-22, the first-visit rule for ``dQ_i`` (line 5's ``dQ = 0`` is read only where no earlier tile
    wrote it) and empty columns, whose ``dK_j, dV_j`` are written as zeros without loading ``K_j, V_j``.
    """
    BR, BC, D, NT, DP = cfg.Br, cfg.Bc, cfg.d, cfg.threads, cfg.DP
    TAX, TAY, RA, CA = cfg.TAX, cfg.TAY, cfg.RA, cfg.CA
    TBX, TBY, RB, RQ, CB = cfg.TBX, cfg.TBY, cfg.RB, cfg.RQ, cfg.CB
    TLX, TLY = cfg.TLX, cfg.TLY
    RL = ceil_div(BR, TLY)  # rows of Q_i each loading thread handles
    CL = ceil_div(D, TLX)  # columns per row each loading thread handles
    KV_LOADS = ceil_div(BC * D, NT)
    CAUSAL, DROPOUT = bool(causal), bool(dropout)
    jit_options = {} if _backend.is_simulator() else {"max_registers": min(255, 65536 // NT // 8 * 8)}
    ZERO = float32(0.0)
    ONE = float32(1.0)

    @cuda.jit(**jit_options)
    def kernel(gQ, gK, gV, gO, gdO, gm, gl, gmask, gspan, gcol, gdQ, gdK, gdV, tau, drop_scale, s_q, s_k, nheads, group, causal_offset, seed, threshold):
        """One (batch, query head) per block: Algorithm 4 lines 1-24 on the non-zero tiles.

        Symbol table (paper -> variable -> memory space):

        ===============  =====================  ====================================
        Q_i, dO_i        sQ_i, sdO_i            SRAM (Br, d)
        K_j, V_j         sK_j, sV_j             SRAM (Bc, d)
        O_i              gO                     HBM (read only for line 19)
        m_i, l_i         sm_i, sinv_l_i         SRAM (Br,) (1/l_i, 0 for empty rows)
        M                gmask, gspan, gcol     HBM (the block mask and what is derived from it)
        S_ij -> P_ij     rS                     registers (RA, CA) per thread
        dP_ij            rdP                    registers (RA, CA)
        Z_ij             rZ                     registers (regenerated, never stored)
        P_ij^dropped     sP_drop                SRAM (Br, Bc)
        dS_ij            sdS_ij                 SRAM (Br, Bc)
        D_i              sD_part -> D_r         SRAM (Br, TLX) partial sums -> register
        dK~_j, dV~_j     rdK, rdV               registers (RB, CB) per thread
        dQ_i             gdQ -> rdQ_old (+rdQ)  HBM, read at L10 into registers, written at L21
        dK_j, dV_j       gdK, gdV               HBM (this query head's share under GQA)
        ===============  =====================  ====================================
        """
        sK_j = cuda.shared.array((BC, DP), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, DP), float32)  # (Bc, d) SRAM
        sQ_i = cuda.shared.array((BR, DP), float32)  # (Br, d) SRAM
        sdO_i = cuda.shared.array((BR, DP), float32)  # (Br, d) SRAM
        sP_drop = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM: P_ij^dropped
        sdS_ij = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        sD_part = cuda.shared.array((BR, TLX), float32)  # (Br, TLX) SRAM: partial sums of dO_i o O_i
        sm_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sinv_l_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        rdK = cuda.local.array((RB, CB), float32)  # dK~_j: registers
        rdV = cuda.local.array((RB, CB), float32)  # dV~_j: registers
        rdQ = cuda.local.array((RQ, CB), float32)  # dS_ij K_j for this thread's share of dQ_i
        rdQ_old = cuda.local.array((RQ, CB), float32)  # dQ_i as loaded at line 10
        rS = cuda.local.array((RA, CA), float32)  # S_ij, then P_ij
        rdP = cuda.local.array((RA, CA), float32)  # dP_ij^dropped
        rZ = cuda.local.array((RA, CA), float32)  # Z_ij
        ra = cuda.local.array(RA, float32)
        rb = cuda.local.array(CA, float32)
        rx = cuda.local.array(CB, float32)

        t = cuda.threadIdx.x
        bh = cuda.blockIdx.x  # = batch * nheads + query head: also the dropout hash's head index
        bi = bh // nheads
        hi = bh - bi * nheads
        hk = hi // group  # the key/value head this query head reads (GQA/MQA)
        mb = bi if gmask.shape[0] > 1 else 0
        mh = hi if gmask.shape[1] > 1 else 0
        ax = t % TAX  # L11-L20 layout: columns ax + TAX*b of the tile, rows ay + TAY*a
        ay = t // TAX
        bx = t % TBX  # L16/L21/L22 layout: head-dim columns bx + TBX*e, rows by + TBY*a
        by = t // TBX
        lx = t % TLX  # L10 layout: TLX threads per row of Q_i
        ly = t // TLX

        # Alg.4 L1: set the PRNG state to R: the counter hash's key for this (batch, head) and seed
        k_bh = head_key(seed, bh)
        # Alg.4 L2: block sizes Br = BR, Bc = BC: the block mask's blocks
        # Alg.4 L3-L4: Q, O, dO, l, m split into Tr row blocks; K, V into Tc column blocks
        Tr = gmask.shape[2]
        Tc = gmask.shape[3]
        # Alg.4 L5: dQ = 0 in HBM. Dev: never materialized: the first non-zero tile of a row block
        # starts from dQ_i = 0 instead of reading it (every row block has one, so dQ is written whole).

        # Alg.4 L6: for j = 1..Tc
        for j in range(Tc):
            col0 = j * BC
            if gcol[mb, mh, j] == 0:
                # Dev: no tile of column j is non-zero: dK_j = dV_j = 0 exactly, written without loading K_j, V_j
                for a in range(RB):
                    jj = by + TBY * a
                    col = col0 + jj
                    if jj < BC and col < s_k:
                        for e in range(CB):
                            c = bx + TBX * e
                            if c < D:
                                gdK[bi, col, hi, c] = ZERO  # HBM write: Bc*d
                                gdV[bi, col, hi, c] = ZERO  # HBM write: Bc*d
                continue
            # Alg.4 L7: load K_j, V_j into SRAM (zeros past s_k)
            for e in range(KV_LOADS):
                idx = t + NT * e
                if idx < BC * D:
                    r = idx // D
                    c = idx - r * D
                    col = col0 + r
                    if col < s_k:
                        sK_j[r, c] = gK[bi, col, hk, c]  # HBM read: Bc*d
                        sV_j[r, c] = gV[bi, col, hk, c]  # HBM read: Bc*d
                    else:
                        sK_j[r, c] = ZERO
                        sV_j[r, c] = ZERO
            # Alg.4 L8: dK~_j = dV~_j = 0 (Bc x d), on chip
            for a in range(RB):
                for e in range(CB):
                    rdK[a, e] = ZERO
                    rdV[a, e] = ZERO

            # [doc:alg5-backward-inner-loop]
            # Alg.4 L9: for i = 1..Tr
            for i in range(Tr):
                if gmask[mb, mh, i, j] == 0:  # Dev: Alg.5 L8's test around Algorithm 4's inner step: a zero tile is skipped whole
                    continue
                row0 = i * BR
                first = j == gspan[mb, mh, i, 0]
                # Alg.4 L10: load Q_i, dO_i into SRAM, l_i, m_i, and dQ_i (into the registers that update it at L21)
                for a in range(RQ):
                    row = row0 + by + TBY * a
                    for e in range(CB):
                        c = bx + TBX * e
                        val = ZERO  # Dev: first visit of row block i: L5's dQ_i = 0, not read from HBM
                        if not first and row < s_q and by + TBY * a < BR and c < D:
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
                                l_r = gl[bi, hi, row]  # HBM read: Br
                                m_r = gm[bi, hi, row]  # HBM read: Br
                                if l_r > ZERO:
                                    inv_l = ONE / l_r
                                else:
                                    m_r = ZERO
                            sm_i[r] = m_r
                            sinv_l_i[r] = inv_l
                cuda.syncthreads()  # Sync: Q_i, dO_i, m_i, 1/l_i, D_i partials (and K_j, V_j) in SRAM before L11 reads them

                # Alg.4 L11: S_ij = tau Q_i K_j^T (the thread's RA x CA share)
                for a in range(RA):
                    for b in range(CA):
                        rS[a, b] = ZERO
                for c in range(D):
                    for a in range(RA):
                        ra[a] = sQ_i[min(ay + TAY * a, BR - 1), c]
                    for b in range(CA):
                        rb[b] = sK_j[min(ax + TAX * b, BC - 1), c]
                    for a in range(RA):
                        for b in range(CA):
                            rS[a, b] += ra[a] * rb[b]
                for a in range(RA):
                    r = ay + TAY * a
                    rc = min(r, BR - 1)
                    row = row0 + r
                    m_r = sm_i[rc]
                    inv_l = sinv_l_i[rc]
                    k_row = row_key(k_bh, row)
                    for b in range(CA):
                        cc = ax + TAX * b
                        col = col0 + cc
                        # Alg.4 L12: S_ij^masked = mask(S_ij): the ragged tails and the bottom-right causal mask
                        visible = row < s_q and col < s_k and inv_l > ZERO
                        if CAUSAL:
                            visible = visible and col <= row + causal_offset
                        # Alg.4 L13: P_ij = diag(l_i)^-1 exp(S_ij^masked - m_i), from the forward's final m, l
                        p = ZERO
                        if visible:
                            p = math.exp(tau * rS[a, b] - m_r) * inv_l
                        rS[a, b] = p
                        # Alg.4 L14: Z_ij regenerated from R: 1/(1-p) where kept, 0 where dropped
                        z = ONE
                        if DROPOUT:
                            z = drop_scale if keep(k_row, col, threshold) else ZERO
                        rZ[a, b] = z
                        # Alg.4 L15: P_ij^dropped = P_ij o Z_ij, to SRAM for line 16
                        if r < BR and cc < BC:
                            sP_drop[r, cc] = p * z

                # Alg.4 L17: dP_ij^dropped = dO_i V_j^T (same register layout as S_ij)
                for a in range(RA):
                    for b in range(CA):
                        rdP[a, b] = ZERO
                for c in range(D):
                    for a in range(RA):
                        ra[a] = sdO_i[min(ay + TAY * a, BR - 1), c]
                    for b in range(CA):
                        rb[b] = sV_j[min(ax + TAX * b, BC - 1), c]
                    for a in range(RA):
                        for b in range(CA):
                            rdP[a, b] += ra[a] * rb[b]
                for a in range(RA):
                    r = ay + TAY * a
                    rc = min(r, BR - 1)
                    # Alg.4 L19: D_i = rowsum(dO_i o O_i): add up the load's partial sums
                    D_r = ZERO
                    for x in range(TLX):
                        D_r += sD_part[rc, x]
                    for b in range(CA):
                        cc = ax + TAX * b
                        # Alg.4 L18: dP_ij = dP_ij^dropped o Z_ij
                        dp = rdP[a, b] * rZ[a, b]
                        # Alg.4 L20: dS_ij = P_ij o (dP_ij - D_i), to SRAM for lines 21-22
                        if r < BR and cc < BC:
                            sdS_ij[r, cc] = rS[a, b] * (dp - D_r)
                cuda.syncthreads()  # Sync: all of P_ij^dropped and dS_ij in SRAM before lines 16, 21, 22 read other threads' rows

                # Alg.4 L16: dV~_j += (P_ij^dropped)^T dO_i (after the barrier: it needs every row of P_ij^dropped)
                for r in range(BR):
                    for e in range(CB):
                        rx[e] = sdO_i[r, min(bx + TBX * e, D - 1)]
                    for a in range(RB):
                        pv = sP_drop[r, min(by + TBY * a, BC - 1)]
                        for e in range(CB):
                            rdV[a, e] += pv * rx[e]
                # Alg.4 L21: dQ_i <- dQ_i + tau dS_ij K_j, a read-modify-write in HBM on every non-zero (i, j)
                for a in range(RQ):
                    for e in range(CB):
                        rdQ[a, e] = ZERO
                for jj in range(BC):
                    for e in range(CB):
                        rx[e] = sK_j[jj, min(bx + TBX * e, D - 1)]
                    for a in range(RQ):
                        ds = sdS_ij[min(by + TBY * a, BR - 1), jj]
                        for e in range(CB):
                            rdQ[a, e] += ds * rx[e]
                for a in range(RQ):
                    r = by + TBY * a
                    row = row0 + r
                    if r < BR and row < s_q:
                        for e in range(CB):
                            c = bx + TBX * e
                            if c < D:
                                gdQ[bi, row, hi, c] = rdQ_old[a, e] + tau * rdQ[a, e]  # HBM write: Br*d
                # Alg.4 L22: dK~_j += tau dS_ij^T Q_i (tau applied once, at line 24)
                for r in range(BR):
                    for e in range(CB):
                        rx[e] = sQ_i[r, min(bx + TBX * e, D - 1)]
                    for a in range(RB):
                        ds = sdS_ij[r, min(by + TBY * a, BC - 1)]
                        for e in range(CB):
                            rdK[a, e] += ds * rx[e]
                cuda.syncthreads()  # Sync: every thread is done with Q_i, dO_i, P~_ij, dS_ij (and K_j, V_j) before they are overwritten
            # [/doc:alg5-backward-inner-loop]

            # Alg.4 L24: write dK_j <- tau dK~_j and dV_j <- dV~_j to HBM (this query head's share)
            for a in range(RB):
                jj = by + TBY * a
                col = col0 + jj
                if jj < BC and col < s_k:
                    for e in range(CB):
                        c = bx + TBX * e
                        if c < D:
                            gdK[bi, col, hi, c] = tau * rdK[a, e]  # HBM write: Bc*d
                            gdV[bi, col, hi, c] = rdV[a, e]  # HBM write: Bc*d

    return kernel


def backward(dout, q, k, v, out, fwd: ForwardOutput, mask: BlockMask, prob: Problem, alloc):
    """The block-sparse backward on kernel arrays: ``(dq, dk, dv)`` for upstream gradient ``dout``.

    ``fwd`` holds the forward's ``m, l`` (b, h, s_q); ``mask`` the same :class:`BlockMask` the
    forward ran. Under GQA/MQA each query head's block writes its partial ``dK, dV`` to scratch and
    :func:`numba_flash.device.gqa.group_sum` adds each group (as in Algorithm 4's kernel).
    """
    b, s_q, s_k, h, h_k, d = prob.batch, prob.seqlen_q, prob.seqlen_k, prob.nheads, prob.nheads_k, prob.headdim
    Br, Bc = mask.block_size
    cfg = backward_config(Br, Bc, d)
    kernel = backward_kernel(cfg, prob.causal, prob.dropout_p > 0.0)
    G = prob.group
    dq = alloc.empty((b, s_q, h, d))
    dk = alloc.empty((b, s_k, h_k, d))
    dv = alloc.empty((b, s_k, h_k, d))
    dk_h, dv_h = per_head_grads(dk, dv, prob, alloc)
    gmask, gspan, gcol = mask.kernel_arrays(alloc)
    kernel[b * h, cfg.threads](
        q, k, v, out, dout, fwd.m, fwd.l, gmask, gspan, gcol, dq, dk_h, dv_h,
        np.float32(prob.softmax_scale), np.float32(prob.dropout_scale), s_q, s_k, h, G,
        prob.causal_offset, np.uint32(prob.seed), np.uint32(prob.threshold),
    )
    group_sum(dk_h, dv_h, dk, dv, prob)
    # Alg.4 L26: return dQ, dK, dV
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------
# The kernels' HBM accesses in closed form
# ----------------------------------------------------------------------------------------------
def hbm_accesses(mask: BlockMask, prob: Problem, pass_: str = "forward"):
    """The exact HBM accesses (elements) of :func:`forward` or :func:`backward`, as an ``IOCount``.

    See the module docstring for the accounting and its three departures from the paper's count
    (:func:`numba_flash_reference.io_model.io_alg5_block_sparse`). ``pass_``: "forward" or
    "backward" (the backward's count is for ``nheads == nheads_k``: under GQA the group sum adds one
    pass over the per-head ``dK, dV`` scratch).
    """
    from numba_flash_reference.io_model import IOCount

    b, h, d, Nq, Nk = prob.batch, prob.nheads, prob.headdim, prob.seqlen_q, prob.seqlen_k
    Br, Bc = mask.block_size
    full = mask.broadcast(b, h)
    rows = np.minimum(Br, Nq - Br * np.arange(mask.Tr))  # |rows_i|
    cols = np.minimum(Bc, Nk - Bc * np.arange(mask.Tc))  # |cols_j|
    W = int((full.sum(axis=3) * rows).sum())
    first = b * h * Nq  # first visits: one per row, over all (batch, head)
    kv = int((full.any(axis=2) * cols).sum()) * d  # K_j, V_j of the non-empty columns
    if pass_ == "forward":
        by_name = {
            "K": (kv, 0), "V": (kv, 0),
            "Q": (W * d, 0),
            "O": ((W - first) * d, W * d),
            "l": (W - first, W), "m": (W - first, W),
            "L": (0, first),
        }
    elif pass_ == "backward":
        if prob.group != 1:
            raise ValueError("hbm_accesses(pass_='backward') counts the nheads == nheads_k case")
        by_name = {
            "K": (kv, 0), "V": (kv, 0),
            "Q": (W * d, 0), "O": (W * d, 0), "dO": (W * d, 0),
            "dQ": ((W - first) * d, W * d),
            "l": (W, 0), "m": (W, 0),
            "dK": (0, b * h * Nk * d), "dV": (0, b * h * Nk * d),
        }
    else:
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    return IOCount.from_by_name(by_name)
