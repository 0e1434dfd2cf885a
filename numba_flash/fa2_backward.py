"""FlashAttention-2 Algorithm 2 as Numba CUDA kernels: the readable backward pass.

Paper: Dao, "FlashAttention-2", Algorithm 2 ([FA2-ICLR] Appendix A). The float64 twin is
:mod:`numba_flash_reference.fa2_backward`; put the two files side by side.

What a reader learns
--------------------
* **A D pre-pass (FA2.2 L4).** ``D = rowsum(dO o O)`` is one small kernel before the main one, so the
  main loop never loads ``O`` (FA1 recomputed ``D_i`` on every pass).
* **P from the row statistics (L11).** ``P_ij = exp(S_ij - L_i)`` in the paper; here
  ``exp(S_ij - m_i) / l_i`` with the forward's ``m, l`` kept apart, because the rounding of
  ``L = m + log l`` (``eps |L|``) is inherited by every recomputed ``P`` and large logits magnify it past
  the error rule (:func:`row_stats_fn`, ``docs/backward.rst``). A row that saw no key gets ``P = 0``.
* **Column blocks are independent (L5).** One thread block per (batch, KV head, ``K_j, V_j``) block,
  ``dK_j`` and ``dV_j`` accumulated on chip. Each thread owns one key row ``c`` of the block, so
  ``dV_j += P^T dO_i`` (L12) and ``dK_j += dS^T Q_i`` (L16) are sums *down a column* of ``P`` and
  ``dS``: one thread's private loop, no reduction between threads.
* **dQ through atomic adds (L15).** Every column block adds ``dS_ij K_j`` into the same ``dQ_i``, so
  the additions race; ``cuda.atomic.add`` makes them safe but their order (hence the last bits of
  ``dQ``) varies from run to run.
* **A deterministic path** (``deterministic=True``): the main kernel leaves ``dQ`` out and a second
  kernel, one thread block per *query* block (FA2's forward geometry), recomputes ``S, P, dP, dS`` and
  sums ``dQ_i = tau sum_j dS_ij K_j`` in a fixed order: bitwise reproducible, no atomics, at the cost
  of recomputing two matmuls.
* **GQA/MQA.** The ``G`` query heads of a KV head are ``G`` more passes of the row loop inside the same
  thread block, so ``dK_j, dV_j`` are summed over the group in a fixed order (no atomics for them).

Launch geometry
---------------
pre-pass: grid ``(ceil(N_q / 128), b h)``, 128 threads, one per row. Main: grid ``(Tc, b h_k)``, block
``Bc`` threads (thread ``c`` owns key row ``j Bc + c``). Deterministic dQ: grid ``(Tr, b h)``, block
``Br`` threads (thread ``t`` owns query row ``i Br + t``).

SRAM budget of the main kernel (float32 elements): ``sK_j, sV_j`` 2 Bc (d+1); ``sQ_i, sdO_i``
2 Br d; ``sm_i, sil_i, sD_i`` 3 Br; ``sdS_ij`` Br Bc. ``dK_j, dV_j`` rows are per-thread local arrays.

This is the *readable* kernel (variant ``"readable"``). Its register-blocked twin is
:mod:`numba_flash.fast.fa2_backward` (variant ``"fast"``, the default); its docstring says what changed
and what it bought. Run this one with ``flash_attn_func(..., algorithm="flash2", variant="readable")``.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

from ._launch import STATIC_SMEM_BYTES, KernelLaunch, Problem, bh_grid, ceil_div
from ._tiles_readable import load_tile
from .device.dropout import head_key, keep, row_key
from .device.grid import folded_batch_head
from .device.prepass import allocate_grads, row_dot


def tile_sram_bytes(Br: int, Bc: int, d: int) -> int:
    """Static SRAM of the main kernel (the larger of the two)."""
    main = 2 * Bc * (d + 1) + 2 * Br * d + 3 * Br + Br * Bc
    dq = 2 * Br * (d + 1) + 2 * Bc * d + 2 * Br
    return 4 * max(main, dq)


def default_block_sizes(d: int):
    """The largest square tile (64, 32, 16, 8 or 4) whose two kernels fit the 48 KB static SRAM.

    FA1's formula (Algorithm 1 line 1) budgets four ``B x d`` tiles; this backward holds more
    (``K_j, V_j, Q_i, dO_i`` plus ``dS_ij``), so it picks its own.
    """
    for B in (64, 32, 16, 8, 4):
        if tile_sram_bytes(B, B, d) <= STATIC_SMEM_BYTES:
            return B, B
    return 2, 2


def _split(prob: Problem, block_sizes):
    """FA2.2 lines 1-2: block sizes and block counts."""
    d = prob.headdim
    Br, Bc = default_block_sizes(d) if block_sizes is None else block_sizes
    if max(Br, Bc) > 1024:
        raise ValueError(f"block_sizes ({Br}, {Bc}): one thread per row, at most 1024 threads per block")
    if tile_sram_bytes(Br, Bc, d) > STATIC_SMEM_BYTES:
        raise ValueError(f"block_sizes ({Br}, {Bc}) need {tile_sram_bytes(Br, Bc, d)} bytes of shared memory at d={d}; the limit is {STATIC_SMEM_BYTES}")
    # FA2.2 L1: split Q into Tr = ceil(N_q / Br) blocks Q_i; K, V into Tc = ceil(N_k / Bc) blocks K_j, V_j
    Tr = ceil_div(prob.seqlen_q, Br)
    Tc = ceil_div(prob.seqlen_k, Bc)
    # FA2.2 L2: split O, dO and L into Tr blocks (the row ranges of Q_i)
    return Br, Bc, Tr, Tc


def _allocate_grads(prob: Problem, alloc, deterministic: bool):
    # FA2.2 L3: dQ = (0) in HBM (the atomic adds need zeros; the deterministic kernel writes every row); dK, dV: Tc blocks
    return allocate_grads(prob, alloc, deterministic)  # numba_flash.device.prepass, shared with the other FA2 backward


def _row_dot(out, dout, prob: Problem, alloc):
    # FA2.2 L4: D_i = rowsum(dO_i o O_i) for every row, by the pre-pass kernel of numba_flash.device.prepass
    return row_dot(out, dout, prob, alloc)


@functools.cache
def row_stats_fn(FROM_LSE: bool):
    """``row_stats(gm, gl, b, h, row, s_q) -> (m_i, 1/l_i)``: the row statistics of ``P = exp(S - m) / l``.

    Line 11 writes ``P = exp(S - L)``; the kernels use the forward's ``m`` and ``l`` apart, because
    ``L = m + log l`` is rounded to ``ulp(L) ~ eps |L|``, an error every recomputed ``P`` inherits and
    that sharp softmaxes magnify past the error rule (``docs/backward.rst``, "Large logits").
    ``FROM_LSE``: only ``L`` was saved (passed as ``gm``): ``(L, 1)``. ``(0, 0)`` past ``N_q`` and on
    rows that see no key (``l = 0``, ``L = +inf``): ``P = 0``, no NaN.
    """
    ZERO = float32(0.0)
    ONE = float32(1.0)

    @cuda.jit(device=True, inline="always")
    def row_stats(gm, gl, b, h, row, s_q):
        m_r = ZERO
        il_r = ZERO
        if row < s_q:
            if FROM_LSE:
                if gm[b, h, row] < math.inf:
                    m_r = gm[b, h, row]
                    il_r = ONE
            elif gl[b, h, row] > ZERO:
                m_r = gm[b, h, row]
                il_r = ONE / gl[b, h, row]
        return m_r, il_r

    return row_stats


@functools.cache
def fa2_backward_kernel(BR: int, BC: int, D: int, CAUSAL: bool, DROPOUT: bool, ATOMIC_DQ: bool, FROM_LSE: bool = False):
    """The main (column-block) kernel: dK, dV, and with ``ATOMIC_DQ`` the atomic dQ adds.

    Kernel arguments: ``gQ, gdO (b, s_q, h, d)``, ``gK, gV (b, s_k, h_k, d)``, ``gm, gl, gD (b, h, s_q)``
    (the forward's ``m, l``: :func:`row_stats_fn`; with ``FROM_LSE`` its ``L``, passed as both), outputs ``gdQ`` (zeros; unused without ``ATOMIC_DQ``), ``gdK, gdV (b, s_k, h_k, d)``; ``tau``,
    ``group``, ``causal_offset``, dropout ``seed``, ``threshold``, ``dropout_scale``.

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ==================  ==========================================
    Q, K, V, dO, m, l, D      gQ, gK, .., gD      HBM
    dQ, dK, dV                gdQ, gdK, gdV       HBM
    K_j, V_j                  sK_j, sV_j          SRAM (Bc, d+1), loaded once (L6)
    dK_j, dV_j                rdK_j, rdV_j        registers/local: row c per thread (L7)
    Q_i, dO_i                 sQ_i, sdO_i         SRAM (Br, d), per inner step (L9)
    L_i (as m_i, 1/l_i), D_i  sm_i, sil_i, sD_i   SRAM (Br,)
    S, P, dP (one entry)      s, P, dP            registers: thread c handles column c
    dS_ij                     sdS_ij              SRAM (Br, Bc): shared for the dQ sum (L15)
    ========================  ==================  ==========================================

    Line 9's load of ``Q_i, dO_i`` (and ``L_i, D_i``) is written out in the body on purpose: it is the step
    that differs from FA1 (no ``O_i``: the pre-pass made ``D_i``); the plain ``K_j, V_j`` copy of line 6 is
    the readable kernels' shared ``load_tile`` (``numba_flash/_tiles_readable.py``).
    """
    DK = D + 1  # Dev: +1 pad: thread c reads row c of K_j, V_j; rows of 32 floats would share one bank
    row_stats = row_stats_fn(FROM_LSE)

    @cuda.jit
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, gdK, gdV, tau, group, causal_offset, seed, threshold, dropout_scale):
        sK_j = cuda.shared.array((BC, DK), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, DK), float32)  # (Bc, d) SRAM
        sQ_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sdO_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sm_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sil_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sD_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sdS_ij = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        rdK_j = cuda.local.array(D, float32)  # this thread's row of dK_j
        rdV_j = cuda.local.array(D, float32)  # this thread's row of dV_j

        t = cuda.threadIdx.x
        nheads = gQ.shape[2]
        nheads_k = gK.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        _, b, hk = folded_batch_head(nheads_k)  # Dev: b*h_k folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0]:
            return  # Dev: past b*h_k in the last z slab of the fold
        # FA2.2 L5: for j = 1..Tc -- this thread block is one j; thread t owns key row `col`
        col0 = cuda.blockIdx.x * BC
        col = col0 + t
        # FA2.2 L6: load K_j, V_j from HBM to SRAM (rows past N_k are zero)
        load_tile(sK_j, gK, b, col0, hk, s_k, D, t, BC)  # HBM read: Bc*d
        load_tile(sV_j, gV, b, col0, hk, s_k, D, t, BC)  # HBM read: Bc*d
        # FA2.2 L7: dK_j = (0), dV_j = (0) on chip
        for x in range(D):
            rdK_j[x] = float32(0.0)
            rdV_j[x] = float32(0.0)
        # Dev: causal block skipping: row blocks before the first row that sees key col0 are fully masked
        i_first = 0
        if CAUSAL:
            i_first = max(0, col0 - causal_offset) // BR
        n_row_blocks = (s_q + BR - 1) // BR

        # Dev: GQA/MQA: the G query heads sharing K_j, V_j are G more passes of the row-block loop
        for h in range(hk * group, (hk + 1) * group):
            k_bh = head_key(seed, b * nheads + h) if DROPOUT else uint64(0)
            # FA2.2 L8: for i = 1..Tr
            for i in range(i_first, n_row_blocks):
                row0 = i * BR
                cuda.syncthreads()  # Sync: K_j, V_j stored (first pass); Q_{i-1}, dO_{i-1}, dS read by all before overwriting
                # FA2.2 L9: load Q_i, dO_i, L_i, D_i from HBM to SRAM (Dev: not O_i: the L4 pre-pass made D_i from it)
                for e in range(t, BR * D, BC):
                    r = e // D
                    x = e % D
                    inside = row0 + r < s_q
                    sQ_i[r, x] = gQ[b, row0 + r, h, x] if inside else float32(0.0)  # HBM read: Br*d
                    sdO_i[r, x] = gdO[b, row0 + r, h, x] if inside else float32(0.0)  # HBM read: Br*d
                for r in range(t, BR, BC):
                    inside = row0 + r < s_q
                    # Dev: L_i as the forward's m_i and 1/l_i, kept apart (see row_stats_fn); 1/l = 0: P = 0
                    m_r, il_r = row_stats(gm, gl, b, h, row0 + r, s_q)  # HBM read: 2 Br
                    sm_i[r] = m_r
                    sil_i[r] = il_r
                    sD_i[r] = gD[b, h, row0 + r] if inside else float32(0.0)  # HBM read: Br
                cuda.syncthreads()  # Sync: Q_i, dO_i, L_i, D_i in SRAM before L10 reads them

                # [doc:fa2-bwd-inner-loop]
                masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
                for r in range(BR):
                    row = row0 + r
                    # FA2.2 L10: S_ij = tau Q_i K_j^T -- entry (r, c) of this thread's column c
                    acc = float32(0.0)
                    for x in range(D):
                        acc += sQ_i[r, x] * sK_j[t, x]
                    s = float32(tau * acc)
                    # FA2.2 L11: P_ij = exp(S_ij - L_i) = exp(S_ij - m_i) / l_i (the causal mask and ragged columns give P = 0)
                    P = float32(0.0)
                    if not (masked and (col >= s_k or (CAUSAL and col > row + causal_offset))):
                        P = math.exp(s - sm_i[r]) * sil_i[r]
                    # Dev: dropout: Z_ij regenerated from the counter hash (FA1 Alg.4 L14-L15)
                    Z = float32(1.0)
                    if DROPOUT:
                        Z = dropout_scale if keep(row_key(k_bh, row), col, threshold) else float32(0.0)
                    # FA2.2 L12: dV_j += (P_ij o Z_ij)^T dO_i -- column c of P^T dO is row c of dV_j
                    PZ = P * Z
                    for x in range(D):
                        rdV_j[x] += PZ * sdO_i[r, x]
                    # FA2.2 L13: dP_ij = (dO_i V_j^T) o Z_ij
                    acc = float32(0.0)
                    for x in range(D):
                        acc += sdO_i[r, x] * sV_j[t, x]
                    dP = acc * Z
                    # FA2.2 L14: dS_ij = P_ij o (dP_ij - D_i)
                    dS = P * (dP - sD_i[r])
                    sdS_ij[r, t] = dS
                    # FA2.2 L16: dK_j += tau dS_ij^T Q_i (row c of it: this thread's)
                    for x in range(D):
                        rdK_j[x] += tau * dS * sQ_i[r, x]
                if ATOMIC_DQ:
                    cuda.syncthreads()  # Sync: all of dS_ij in SRAM before L15 sums over its columns
                    # FA2.2 L15: dQ_i += tau dS_ij K_j, with atomic adds (every column block adds into dQ_i)
                    for e in range(t, BR * D, BC):
                        r = e // D
                        x = e % D
                        if row0 + r < s_q:
                            acc = float32(0.0)
                            for c in range(BC):
                                acc += sdS_ij[r, c] * sK_j[c, x]
                            cuda.atomic.add(gdQ, (b, row0 + r, h, x), tau * acc)  # HBM read+write: Br*d
                # [/doc:fa2-bwd-inner-loop]

        # FA2.2 L18: write dK_j, dV_j to HBM
        if col < s_k:
            for x in range(D):
                gdK[b, col, hk, x] = rdK_j[x]  # HBM write: Bc*d
                gdV[b, col, hk, x] = rdV_j[x]  # HBM write: Bc*d

    return kernel


@functools.cache
def fa2_dq_kernel(BR: int, BC: int, D: int, CAUSAL: bool, DROPOUT: bool, FROM_LSE: bool = False):
    """The deterministic dQ kernel: one thread block per query block, one thread per query row.

    It re-runs lines 10-15 with the loops swapped (query block outer, key blocks inner, as the FA2
    forward), so each ``dQ`` element is one thread's sum in a fixed order: no atomics, bitwise
    reproducible. Symbol table as :func:`fa2_backward_kernel`, plus ``rdQ_i`` (registers: this
    thread's row of dQ_i).
    """
    DQ = D + 1  # Dev: +1 pad: thread t reads row t of Q_i, dO_i
    row_stats = row_stats_fn(FROM_LSE)

    @cuda.jit
    def kernel(gQ, gK, gV, gdO, gm, gl, gD, gdQ, tau, group, causal_offset, seed, threshold, dropout_scale):
        sQ_i = cuda.shared.array((BR, DQ), float32)  # (Br, d) SRAM
        sdO_i = cuda.shared.array((BR, DQ), float32)  # (Br, d) SRAM
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        rdQ_i = cuda.local.array(D, float32)  # this thread's row of dQ_i

        t = cuda.threadIdx.x
        nheads = gQ.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        _, b, h = folded_batch_head(nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0]:
            return  # Dev: past b*h in the last z slab of the fold
        hk = h // group
        row0 = cuda.blockIdx.x * BR
        row = row0 + t
        # Dev: Q_i and dO_i once per thread block (the forward's geometry); K_j, V_j for every key block below
        load_tile(sQ_i, gQ, b, row0, h, s_q, D, t, BR)  # HBM read: Br*d
        load_tile(sdO_i, gdO, b, row0, h, s_q, D, t, BR)  # HBM read: Br*d
        m_r, il_r = row_stats(gm, gl, b, h, row, s_q)  # L_r as m_r, 1/l_r (see row_stats_fn)
        D_r = gD[b, h, row] if row < s_q else float32(0.0)
        for x in range(D):
            rdQ_i[x] = float32(0.0)
        k_row = row_key(head_key(seed, b * nheads + h), row) if DROPOUT else uint64(0)
        n_blocks = (s_k + BC - 1) // BC
        if CAUSAL:
            n_blocks = (min(s_k, max(0, row0 + BR + causal_offset)) + BC - 1) // BC
        for j in range(n_blocks):
            col0 = j * BC
            cuda.syncthreads()  # Sync: K_{j-1}, V_{j-1} read by every thread (and Q_i, dO_i stored) before overwriting
            load_tile(sK_j, gK, b, col0, hk, s_k, D, t, BR)  # HBM read: Bc*d
            load_tile(sV_j, gV, b, col0, hk, s_k, D, t, BR)  # HBM read: Bc*d
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before they are read
            masked = col0 + BC > s_k or (CAUSAL and col0 + BC - 1 > row0 + causal_offset)
            for c in range(BC):
                col = col0 + c
                if masked and (col >= s_k or (CAUSAL and col > row + causal_offset)):
                    continue
                # FA2.2 L10: S_ij = tau Q_i K_j^T (entry (t, c), recomputed)
                acc = float32(0.0)
                for x in range(D):
                    acc += sQ_i[t, x] * sK_j[c, x]
                # FA2.2 L11: P_ij = exp(S_ij - L_i) = exp(S_ij - m_i) / l_i
                P = math.exp(float32(tau * acc) - m_r) * il_r
                # FA2.2 L13: dP_ij = (dO_i V_j^T) o Z_ij
                acc = float32(0.0)
                for x in range(D):
                    acc += sdO_i[t, x] * sV_j[c, x]
                if DROPOUT:
                    acc = acc * dropout_scale if keep(k_row, col, threshold) else float32(0.0)
                # FA2.2 L14: dS_ij = P_ij o (dP_ij - D_i)
                dS = P * (acc - D_r)
                # FA2.2 L15: dQ_i += tau dS_ij K_j -- Dev: deterministic: one thread sums its row in a fixed order
                for x in range(D):
                    rdQ_i[x] += tau * dS * sK_j[c, x]
        if row < s_q:
            for x in range(D):
                gdQ[b, row, h, x] = rdQ_i[x]  # HBM write: Br*d

    return kernel


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles (the kernel contract, :class:`numba_flash._launch.KernelModule`)."""
    Br, Bc, _, _ = _split(prob, block_sizes)
    return Br, Bc


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Static shared memory per block of the larger of the two kernels, in bytes."""
    return tile_sram_bytes(*choose_block_sizes(prob, block_sizes), prob.headdim)


def compiled_kernels(prob: Problem, block_sizes=None, deterministic=False) -> list[KernelLaunch]:
    """The main kernel (and the deterministic dQ kernel), compiled for ``prob`` (not launched)."""
    Br, Bc, Tr, Tc = _split(prob, block_sizes)
    dropout = prob.dropout_p > 0
    out = [KernelLaunch(f"FA2 backward (Br, Bc) = ({Br}, {Bc})",
                        fa2_backward_kernel(Br, Bc, prob.headdim, prob.causal, dropout, not deterministic),
                        Bc, Tc * prob.batch * prob.nheads_k)]
    if deterministic:
        out.append(KernelLaunch(f"FA2 backward dQ (Br, Bc) = ({Br}, {Bc})",
                                fa2_dq_kernel(Br, Bc, prob.headdim, prob.causal, dropout), Br, Tr * prob.batch * prob.nheads))
    return out


def backward(dout, q, k, v, out, fwd, prob: Problem, alloc, block_sizes=None, deterministic=False):
    """FA2 Algorithm 2 on kernel arrays: ``(dq, dk, dv)`` (dk, dv summed over each GQA group).

    ``deterministic=True`` computes dQ with :func:`fa2_dq_kernel` instead of atomic adds: bitwise
    reproducible from run to run.
    """
    Br, Bc, Tr, Tc = _split(prob, block_sizes)
    d = prob.headdim
    dq, dk, dv = _allocate_grads(prob, alloc, deterministic)
    delta = _row_dot(out, dout, prob, alloc)
    bh = prob.batch * prob.nheads
    dropout = prob.dropout_p > 0
    opts = (prob.softmax_scale, prob.group, prob.causal_offset, prob.seed, prob.threshold, prob.dropout_scale)
    from_lse = fwd.m is None or fwd.l is None  # only L was saved: P = exp(S - L)
    m, l = (fwd.lse, fwd.lse) if from_lse else (fwd.m, fwd.l)
    main = fa2_backward_kernel(Br, Bc, d, prob.causal, dropout, not deterministic, from_lse)
    main[bh_grid(Tc, prob.batch * prob.nheads_k), Bc](q, k, v, dout, m, l, delta, dq, dk, dv, *opts)
    if deterministic:
        dqk = fa2_dq_kernel(Br, Bc, d, prob.causal, dropout, from_lse)
        dqk[bh_grid(Tr, bh), Br](q, k, v, dout, m, l, delta, dq, *opts)
    # FA2.2 L20: return dQ, dK, dV
    return dq, dk, dv
