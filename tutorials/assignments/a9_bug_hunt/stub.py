"""Assignment 9: the bug hunt.  <-- your file: five kernels, five bugs. Find them, fix them, explain them.

Each kernel below is a small, self-contained piece of FlashAttention machinery, and each has exactly
ONE classic bug: the kind that passes a casual test, or passes in the simulator and fails on a GPU.
The autograder's tests are the ones that catch them; they all fail now. Fix each kernel with the
smallest change (one line, or one line added), run the autograder, and write one or two sentences per
bug in ``FINDINGS``: what was wrong, which input shows it, and which paper line the fix restores.

| kernel | what it computes | symptom to look for |
| --- | --- | --- |
| ``row_softmax`` | ``P = softmax(S)`` per row, one pass for ``m, l`` (online normalizer) | rows whose scores are all
very negative |
| ``split_k_decode`` | one query row per block, keys split over ``BT`` threads, partial states merged | wrong for almost
every input |
| ``causal_rows`` | causal attention, one thread per query row | row 0; every row's own key |
| ``row_logsumexp`` | ``logsumexp(S[row])`` with a block-wide tree reduction in shared memory | right values in the
simulator, a race on a GPU |
| ``attention_with_lse`` | ``O`` and the logsumexp ``L`` the backward pass needs | ``O`` is right |

Read: FA1 Algorithm 1 (lines 2, 10-12), FA2 Algorithm 1 (lines 5, 9-13) and section 3.1.1 (the causal
mask), and the house rule that every barrier says what it protects. Grade yourself with::

    python -m pytest tutorials/assignments/a9_bug_hunt
"""

from __future__ import annotations

import math

from numba import cuda, float32

BT = 8  # threads per block of the split-K kernels (a power of two)
D = 4  # head dimension of the attention kernels (the autograder reads it)

#: One entry per kernel: what was wrong, which input shows it, which paper line the fix restores.
FINDINGS = {
    "row_softmax": "",
    "split_k_decode": "",
    "causal_rows": "",
    "row_logsumexp": "",
    "attention_with_lse": "",
}


# ----------------------------------------------------------------------------------------------
# 1. row_softmax: P = softmax(S) row by row, one thread per row, the online normalizer (one pass for m, l)
# ----------------------------------------------------------------------------------------------
@cuda.jit
def row_softmax_kernel(S, P):
    row = cuda.grid(1)
    if row < S.shape[0]:
        m = 0.0
        l = 0.0
        for c in range(S.shape[1]):
            m_new = max(m, S[row, c])
            l = l * math.exp(m - m_new) + math.exp(S[row, c] - m_new)
            m = m_new
        for c in range(S.shape[1]):
            P[row, c] = math.exp(S[row, c] - m) / l


def row_softmax(S, P):
    row_softmax_kernel[(S.shape[0] + 31) // 32, 32](S, P)


# ----------------------------------------------------------------------------------------------
# 2. split_k_decode: one block per query row; the BT threads split the keys, then thread 0 merges
# ----------------------------------------------------------------------------------------------
@cuda.jit
def split_k_decode_kernel(Q, K, V, O, tau):
    sm = cuda.shared.array(BT, float32)  # (BT,) SRAM: each thread's running max
    sl = cuda.shared.array(BT, float32)  # (BT,) SRAM: each thread's running sum
    sacc = cuda.shared.array((BT, D), float32)  # (BT, d) SRAM: each thread's un-normalized accumulator
    acc = cuda.local.array(D, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    m = -math.inf
    l = 0.0
    for c in range(D):
        acc[c] = 0.0
    for k in range(t, K.shape[0], BT):  # thread t: keys t, t + BT, ...
        s = 0.0
        for c in range(D):
            s += Q[row, c] * K[k, c]
        s *= tau
        m_new = max(m, s)
        alpha = math.exp(m - m_new)
        p = math.exp(s - m_new)
        l = alpha * l + p
        for c in range(D):
            acc[c] = alpha * acc[c] + p * V[k, c]
        m = m_new
    sm[t] = m
    sl[t] = l
    for c in range(D):
        sacc[t, c] = acc[c]
    cuda.syncthreads()  # Sync: every thread's partial state in SRAM before thread 0 merges them
    if t == 0:
        m_all = -math.inf
        for u in range(BT):
            m_all = max(m_all, sm[u])
        l_all = 0.0
        for c in range(D):
            acc[c] = 0.0
        for u in range(BT):
            if sl[u] > 0:
                w = math.exp(sm[u] - m_all)
                l_all += w * sl[u]
                for c in range(D):
                    acc[c] += sacc[u, c]
        for c in range(D):
            O[row, c] = acc[c] / l_all


def split_k_decode(Q, K, V, O, tau):
    split_k_decode_kernel[Q.shape[0], BT](Q, K, V, O, tau)


# ----------------------------------------------------------------------------------------------
# 3. causal_rows: causal attention, one thread per query row, keys straight from global memory
# ----------------------------------------------------------------------------------------------
@cuda.jit
def causal_rows_kernel(Q, K, V, O, tau):
    acc = cuda.local.array(D, float32)
    row = cuda.grid(1)
    if row < Q.shape[0]:
        m = -math.inf
        l = 0.0
        for c in range(D):
            acc[c] = 0.0
        for k in range(row):  # causal: query r sees the keys before it
            s = 0.0
            for c in range(D):
                s += Q[row, c] * K[k, c]
            s *= tau
            m_new = max(m, s)
            alpha = math.exp(m - m_new)
            p = math.exp(s - m_new)
            l = alpha * l + p
            for c in range(D):
                acc[c] = alpha * acc[c] + p * V[k, c]
            m = m_new
        for c in range(D):
            O[row, c] = acc[c] / l


def causal_rows(Q, K, V, O, tau):
    causal_rows_kernel[(Q.shape[0] + 31) // 32, 32](Q, K, V, O, tau)


# ----------------------------------------------------------------------------------------------
# 4. row_logsumexp: L = logsumexp(S[row]) with a block-wide tree reduction in shared memory
# ----------------------------------------------------------------------------------------------
@cuda.jit
def row_logsumexp_kernel(S, L):
    sm = cuda.shared.array(BT, float32)  # (BT,) SRAM: partial maxima
    sl = cuda.shared.array(BT, float32)  # (BT,) SRAM: partial sums
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    m = -math.inf
    l = 0.0
    for c in range(t, S.shape[1], BT):
        m_new = max(m, S[row, c])
        l = l * math.exp(m - m_new) + math.exp(S[row, c] - m_new)
        m = m_new
    sm[t] = m
    sl[t] = l
    cuda.syncthreads()  # Sync: all partials in SRAM before the tree reads them
    stride = BT // 2
    while stride > 0:
        if t < stride:
            m_a = sm[t]
            m_b = sm[t + stride]
            m_ab = max(m_a, m_b)
            if m_ab > -math.inf:
                sl[t] = sl[t] * math.exp(m_a - m_ab) + sl[t + stride] * math.exp(m_b - m_ab)
            sm[t] = m_ab
        stride //= 2
    if t == 0:
        L[row] = sm[0] + math.log(sl[0])


def row_logsumexp(S, L):
    row_logsumexp_kernel[S.shape[0], BT](S, L)


# ----------------------------------------------------------------------------------------------
# 5. attention_with_lse: O and the logsumexp L for the backward pass, one thread per query row
# ----------------------------------------------------------------------------------------------
@cuda.jit
def attention_with_lse_kernel(Q, K, V, O, L, tau):
    acc = cuda.local.array(D, float32)
    row = cuda.grid(1)
    if row < Q.shape[0]:
        m = -math.inf
        l = 0.0
        for c in range(D):
            acc[c] = 0.0
        for k in range(K.shape[0]):
            s = 0.0
            for c in range(D):
                s += Q[row, c] * K[k, c]
            s *= tau
            m_new = max(m, s)
            alpha = math.exp(m - m_new)
            p = math.exp(s - m_new)
            l = alpha * l + p
            for c in range(D):
                acc[c] = alpha * acc[c] + p * V[k, c]
            m = m_new
        for c in range(D):
            O[row, c] = acc[c] / l
        L[row] = m  # the logsumexp, for the backward pass


def attention_with_lse(Q, K, V, O, L, tau):
    attention_with_lse_kernel[(Q.shape[0] + 31) // 32, 32](Q, K, V, O, L, tau)
