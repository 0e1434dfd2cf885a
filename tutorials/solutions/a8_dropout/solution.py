"""Assignment 8, solution (course staff): attention dropout with a counter-based RNG, forward and backward.

Paper: FA1 Algorithm 2 lines 1, 13-15 (dropout on ``P~`` after the statistics, which use the undropped
``P~``) and Algorithm 4 lines 1, 14-18 (the backward *regenerates* the mask from the seed ``R`` instead
of storing an N x N mask); FA2 Algorithms 1-2 carry the same lines. The RNG is counter-based: the keep
bit of element ``(row, col)`` is a pure function ``hash(seed, row, col)``, so any thread, in any
kernel, in any order, gets the same bit (flash-attn uses Philox, also counter-based). Here the hash is
three rounds of MurmurHash3's 32-bit finalizer (fmix32), chained over seed, row and column.

Kernels: the FA2 forward of assignment 5 (non-causal) and the FA2 backward of assignment 6 (atomic dQ),
each with the dropout lines added. Kept by course staff, never in the handout.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

BR = 8  # rows of a query tile Q_i
BC = 8  # rows of a key/value tile K_j

_M32 = uint64(0xFFFFFFFF)
_C1 = uint64(0x85EBCA6B)
_C2 = uint64(0xC2B2AE35)
_S13 = uint64(13)
_S16 = uint64(16)


@cuda.jit(device=True)
def fmix32(x):
    """MurmurHash3's finalizer on a 32-bit word held in a uint64 (every operand uint64: no float promotion)."""
    x = x & _M32
    x = x ^ (x >> _S16)
    x = (x * _C1) & _M32
    x = x ^ (x >> _S13)
    x = (x * _C2) & _M32
    x = x ^ (x >> _S16)
    return x


@cuda.jit(device=True)
def dropout_keep(seed, row, col, threshold):
    """Alg.2 L14 / Alg.4 L14: True iff element (row, col) survives: ``hash(seed, row, col) >= threshold``."""
    h = fmix32(fmix32(fmix32(uint64(seed)) ^ uint64(row)) ^ uint64(col))
    return h >= uint64(threshold)


@functools.cache
def make_forward(D):
    """FA2 forward (assignment 5, non-causal) with dropout on P~ before P~ V_j."""

    @cuda.jit
    def dropout_forward_kernel(Q, K, V, O, L, tau, seed, threshold, scale):
        sQ_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sV_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sP = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        rO = cuda.local.array(D, float32)  # (d,) registers
        i = cuda.blockIdx.x
        t = cuda.threadIdx.x
        N = Q.shape[0]
        row = i * BR + t
        tau32 = float32(tau)
        # FA2.1 L4: load Q_i (row t)
        if row < N:
            for c in range(D):
                sQ_i[t, c] = Q[row, c]  # HBM read: d per row
        # FA2.1 L5: O_i = 0, l_i = 0, m_i = -inf
        for c in range(D):
            rO[c] = 0.0
        l_i = float32(0.0)
        m_i = float32(-math.inf)
        Tc = (N + BC - 1) // BC
        # FA2.1 L6: for j = 1..Tc
        for j in range(Tc):
            # FA2.1 L7: load K_j, V_j together
            for r in range(t, BC, BR):
                if j * BC + r < N:
                    for c in range(D):
                        sK_j[r, c] = K[j * BC + r, c]  # HBM read: Bc*d per tile
                        sV_j[r, c] = V[j * BC + r, c]
            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before L8 and L10 read them
            n_j = min(BC, N - j * BC)
            if row < N:
                # FA2.1 L8: S = tau Q_i K_j^T (row t)
                m_tilde = float32(-math.inf)
                for cc in range(n_j):
                    s = float32(0.0)
                    for c in range(D):
                        s += sQ_i[t, c] * sK_j[cc, c]
                    sP[t, cc] = s * tau32
                    m_tilde = max(m_tilde, s * tau32)
                # FA2.1 L9: m_new, P~ = exp(S - m_new), l from the UNDROPPED P~ (Alg.2 L13)
                m_new = max(m_i, m_tilde)
                alpha = math.exp(m_i - m_new)
                l_tilde = float32(0.0)
                for cc in range(n_j):
                    p = math.exp(sP[t, cc] - m_new)
                    l_tilde += p
                    # Alg.2 L14: P~_dropped = P~ o Z, Z = keep / (1 - p), the keep bit from the counter hash
                    if dropout_keep(seed, row, j * BC + cc, threshold):
                        sP[t, cc] = p * scale
                    else:
                        sP[t, cc] = 0.0
                l_i = alpha * l_i + l_tilde
                # FA2.1 L10 / Alg.2 L15: O_i = e^(m_i - m_new) O_i + P~_dropped V_j
                for c in range(D):
                    pv = float32(0.0)
                    for cc in range(n_j):
                        pv += sP[t, cc] * sV_j[cc, c]
                    rO[c] = alpha * rO[c] + pv
                m_i = m_new
            cuda.syncthreads()  # Sync: every thread is done with K_j, V_j before L7 overwrites them
        if row < N:
            # FA2.1 L12-L15: O_i / l_i (undropped l: dropout is unbiased, E[Z] = 1), L_i = m_i + log l_i, written once
            for c in range(D):
                O[row, c] = rO[c] / l_i  # HBM write: d per row
            L[row] = m_i + math.log(l_i)  # HBM write: 1 per row

    return dropout_forward_kernel


@functools.cache
def make_preprocess(D):
    """FA2.2 L3-L4: D = rowsum(dO o O) (it still holds with dropout, FA1 App. B.2), dQ = 0."""

    @cuda.jit
    def preprocess_kernel(O, dO, D_vec, dQ):
        row = cuda.grid(1)
        if row < O.shape[0]:
            acc = float32(0.0)
            for c in range(D):
                acc += dO[row, c] * O[row, c]
                dQ[row, c] = 0.0
            D_vec[row] = acc

    return preprocess_kernel


@functools.cache
def make_backward(D):
    """FA2 backward (assignment 6, atomic dQ) with the mask regenerated from the seed (Alg.4 L14-L18)."""

    @cuda.jit
    def dropout_backward_kernel(Q, K, V, dO, L, D_vec, tau, seed, threshold, scale, dQ, dK, dV):
        sK_j = cuda.shared.array((BC, D), float32)  # (Bc, d) SRAM
        sQ_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sdO_i = cuda.shared.array((BR, D), float32)  # (Br, d) SRAM
        sL_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sD_i = cuda.shared.array(BR, float32)  # (Br,) SRAM
        sdS = cuda.shared.array((BR, BC), float32)  # (Br, Bc) SRAM
        rV = cuda.local.array(D, float32)  # (d,) registers
        rdK = cuda.local.array(D, float32)  # (d,) registers
        rdV = cuda.local.array(D, float32)  # (d,) registers
        j = cuda.blockIdx.x
        t = cuda.threadIdx.x
        N = Q.shape[0]
        key = j * BC + t
        tau32 = float32(tau)
        n_j = min(BC, N - j * BC)
        # FA2.2 L6-L7: load K_j (SRAM), V_j (registers); dK_j = dV_j = 0
        for c in range(D):
            if key < N:
                sK_j[t, c] = K[key, c]
                rV[c] = V[key, c]
            rdK[c] = 0.0
            rdV[c] = 0.0
        Tr = (N + BR - 1) // BR
        for i in range(Tr):
            n_i = min(BR, N - i * BR)
            # FA2.2 L9: load Q_i, dO_i, L_i, D_i together
            for r in range(t, n_i, BC):
                for c in range(D):
                    sQ_i[r, c] = Q[i * BR + r, c]
                    sdO_i[r, c] = dO[i * BR + r, c]
                sL_i[r] = L[i * BR + r]
                sD_i[r] = D_vec[i * BR + r]
            cuda.syncthreads()  # Sync: Q_i, dO_i, L_i, D_i in SRAM before L10 reads them
            if key < N:
                for r in range(n_i):
                    # FA2.2 L10-L11: S = tau Q_i K_j^T, P = exp(S - L_i)
                    s = float32(0.0)
                    for c in range(D):
                        s += sQ_i[r, c] * sK_j[t, c]
                    p = math.exp(s * tau32 - sL_i[r])
                    # Alg.4 L14: Z_ij regenerated from the seed: the forward's mask, bit for bit
                    z = scale if dropout_keep(seed, i * BR + r, key, threshold) else float32(0.0)
                    # Alg.4 L16: dV_j += (P o Z)^T dO_i
                    for c in range(D):
                        rdV[c] += p * z * sdO_i[r, c]
                    # Alg.4 L17-L18: dP = (dO_i V_j^T) o Z
                    dp = float32(0.0)
                    for c in range(D):
                        dp += sdO_i[r, c] * rV[c]
                    dp *= z
                    # Alg.4 L20: dS = P o (dP - D_i)
                    ds = p * (dp - sD_i[r])
                    sdS[r, t] = ds
                    # Alg.4 L22: dK_j += tau dS^T Q_i
                    for c in range(D):
                        rdK[c] += tau32 * ds * sQ_i[r, c]
            cuda.syncthreads()  # Sync: dS complete for every key of the tile before L15 sums over keys
            # FA2.2 L15: dQ_i += tau dS K_j (atomic: other column blocks add to the same rows)
            for e in range(t, n_i * D, BC):
                r = e // D
                c = e % D
                acc = float32(0.0)
                for cc in range(n_j):
                    acc += sdS[r, cc] * sK_j[cc, c]
                cuda.atomic.add(dQ, (i * BR + r, c), tau32 * acc)
            cuda.syncthreads()  # Sync: L15 done reading dS, Q_i, dO_i before the next i overwrites them
        if key < N:
            # FA2.2 L18: write dK_j, dV_j
            for c in range(D):
                dK[key, c] = rdK[c]
                dV[key, c] = rdV[c]

    return dropout_backward_kernel


def dropout_threshold(p):
    """The integer threshold ``floor(p 2^32)``: an element is kept iff its 32-bit hash is ``>= threshold``."""
    return int(math.floor(p * 4294967296.0))


def dropout_forward(Q, K, V, O, L, tau, p, seed):
    """FA2 forward with dropout ``p`` and counter-RNG ``seed``: grid ``ceil(N / BR)`` blocks of ``BR`` threads."""
    N = Q.shape[0]
    make_forward(Q.shape[1])[(N + BR - 1) // BR, BR](Q, K, V, O, L, tau, seed, dropout_threshold(p), 1.0 / (1.0 - p))


def dropout_backward(Q, K, V, O, dO, L, tau, p, seed, D_vec, dQ, dK, dV):
    """FA2 backward with the same dropout mask, regenerated from ``seed``."""
    N, d = Q.shape
    make_preprocess(d)[(N + BR - 1) // BR, BR](O, dO, D_vec, dQ)
    make_backward(d)[(N + BC - 1) // BC, BC](
        Q, K, V, dO, L, D_vec, tau, seed, dropout_threshold(p), 1.0 / (1.0 - p), dQ, dK, dV
    )
