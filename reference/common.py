"""Semantics every algorithm shares, written once: layout, scale, causal mask, dropout, block sizes.

These follow flash-attn 2's ``flash_attn_func`` (see the paper notes, section 5):

* **Layout.** ``q`` is ``(batch, seqlen_q, nheads, headdim)``; ``k`` and ``v`` are
  ``(batch, seqlen_k, nheads_k, headdim)``. ``seqlen_q`` may differ from ``seqlen_k``.
* **GQA / MQA.** ``nheads`` must be a multiple of ``nheads_k``; query head ``h`` reads key/value head
  ``h // (nheads // nheads_k)`` (with 6 query heads and 2 KV heads, heads 0-2 use KV head 0).
* **Scale.** ``tau = softmax_scale``, default ``1 / sqrt(headdim)``.
* **Causal mask, bottom-right aligned.** Query row ``i`` may see key column ``j`` iff
  ``j <= i + (seqlen_k - seqlen_q)``. With ``seqlen_q > seqlen_k`` the first rows see no key at all.
* **Fully masked rows** give output 0, ``m = -inf``, ``l = 0`` and logsumexp ``L = +inf`` (flash-attn's
  convention: ``exp(S - L) = 0`` then makes every probability and gradient of that row 0, never NaN).
* **Dropout** keeps ``P_ij`` with probability ``1 - p`` and scales kept entries by ``1 / (1 - p)``.
  The keep-mask is a pure function of ``(seed, batch*nheads + head, row, col)`` (below), so a kernel
  reproduces it bit for bit and the forward and backward passes see the same mask by construction.
  The row statistics ``m, l, L`` are computed from the *undropped* P (FA1 Algorithm 2 line 13).

The dropout hash
----------------
All arithmetic is on unsigned 32-bit words (products reduced modulo 2**32). ``mix32`` is the
"lowbias32" integer finalizer (Chris Wellons, hash-prospector), a bijection on 32-bit words with good
avalanche::

    mix32(x):  x ^= x >> 16;  x = x * 0x7FEB352D mod 2**32
               x ^= x >> 15;  x = x * 0x846CA68B mod 2**32
               x ^= x >> 16;  return x

For ``seed`` in ``[0, 2**32)``, ``bh = batch_index * nheads + head`` (the *query* head), query row ``i``
and key column ``j`` (0-based, positions in the full sequences)::

    k_bh  = mix32(seed ^ mix32(bh))
    k_row = mix32(k_bh ^ i)
    u     = mix32(k_row ^ j)                  # uniform on [0, 2**32)
    keep  = u >= threshold,   threshold = floor(p * 2**32)

so ``P(keep) = 1 - threshold / 2**32``, within ``2**-32`` of ``1 - p``. The host computes ``threshold``
once (:func:`dropout_threshold`) and passes the integer to the kernels, so no float rounding differs
between NumPy and the GPU.

Block sizes
-----------
FA1 Algorithm 1 line 1: ``Bc = ceil(M / (4 d))``, ``Br = min(Bc, d)`` for an SRAM of ``M`` elements.
The default ``M`` is numba-cuda's 48 KB static shared-memory limit in float32 elements.
"""

from __future__ import annotations

import math

import numpy as np

MASK32 = 0xFFFFFFFF
#: numba-cuda's static shared-memory limit (48 KB) counted in float32 elements: the default M.
DEFAULT_SRAM_ELEMENTS = 48 * 1024 // 4


# ----------------------------------------------------------------------------------------------
# Layout and validation (reference-level; the kernel API has its own, stricter checks)
# ----------------------------------------------------------------------------------------------
def check_qkv(q, k, v):
    """Validate shapes of (b, s, h, d) inputs; return (b, s_q, s_k, h, h_k, d)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, seqlen, nheads, headdim), got shape {x.shape}")
    b, s_q, h, d = q.shape
    bk, s_k, h_k, dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if bk != b:
        raise ValueError(f"k has batch {bk} but q has batch {b}")
    if dk != d:
        raise ValueError(f"k has headdim {dk} but q has headdim {d}")
    if h_k == 0 or h % h_k != 0:
        raise ValueError(f"nheads ({h}) must be a multiple of nheads_k ({h_k})")
    if min(b, s_q, s_k, h, d) < 1:
        raise ValueError(f"every dimension must be >= 1, got q {q.shape}, k {k.shape}")
    return b, s_q, s_k, h, h_k, d


def default_scale(d: int, softmax_scale=None) -> float:
    """tau: the softmax scale, 1/sqrt(d) unless given."""
    return 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)


def kv_head(h: int, nheads: int, nheads_k: int) -> int:
    """The key/value head that query head ``h`` reads under GQA/MQA."""
    return h // (nheads // nheads_k)


def causal_mask(s_q: int, s_k: int, rows=None, cols=None) -> np.ndarray:
    """Boolean (rows, cols) array, True where the key is *visible* (bottom-right aligned).

    ``rows`` and ``cols`` default to all positions; pass index ranges to get one tile.
    """
    i = np.arange(s_q) if rows is None else np.asarray(rows)
    j = np.arange(s_k) if cols is None else np.asarray(cols)
    return j[None, :] <= i[:, None] + (s_k - s_q)


# ----------------------------------------------------------------------------------------------
# Dropout: a counter-based hash, specified above
# ----------------------------------------------------------------------------------------------
# [doc:ref-dropout-hash]
def mix32(x):
    """lowbias32 finalizer on uint32 words (NumPy arrays of uint64 or Python ints)."""
    x = np.asarray(x, dtype=np.uint64) & np.uint64(MASK32)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(MASK32)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & np.uint64(MASK32)
    x ^= x >> np.uint64(16)
    return x


def dropout_threshold(p: float) -> int:
    """The integer threshold floor(p * 2**32): an element is kept iff its hash is >= this."""
    if not (0.0 <= p < 1.0):
        raise ValueError(f"dropout_p must be in [0, 1), got {p}")
    return int(math.floor(p * 4294967296.0))


def dropout_hash(seed: int, bh: int, rows, cols) -> np.ndarray:
    """u = mix32(mix32(mix32(seed ^ mix32(bh)) ^ row) ^ col) for every (row, col): uint64 array."""
    k_bh = mix32(np.uint64(seed & MASK32) ^ mix32(bh))
    rows = np.asarray(rows, dtype=np.uint64)
    cols = np.asarray(cols, dtype=np.uint64)
    k_row = mix32(k_bh ^ rows)
    return mix32(k_row[:, None] ^ cols[None, :])


def dropout_keep_mask(seed: int, bh: int, rows, cols, p: float) -> np.ndarray:
    """Boolean keep-mask for query rows ``rows`` and key columns ``cols`` of head ``bh``."""
    return dropout_hash(seed, bh, rows, cols) >= np.uint64(dropout_threshold(p))


# [/doc:ref-dropout-hash]
def dropout_scale_matrix(seed: int, bh: int, rows, cols, p: float) -> np.ndarray:
    """Z of FA1 Algorithm 4 line 14: 1/(1-p) where kept, 0 where dropped (float64)."""
    if p == 0.0:
        return np.ones((len(rows), len(cols)))
    return dropout_keep_mask(seed, bh, rows, cols, p) / (1.0 - p)


# ----------------------------------------------------------------------------------------------
# Block sizes: FA1 Algorithm 1 line 1
# ----------------------------------------------------------------------------------------------
# [doc:ref-block-sizes]
def block_sizes(d: int, M: int | None = None, Br: int | None = None, Bc: int | None = None):
    """(Br, Bc): ``Bc = ceil(M / 4d)`` and ``Br = min(Bc, d)``, unless overridden."""
    if d < 1:
        raise ValueError(f"headdim must be >= 1, got {d}")
    M = DEFAULT_SRAM_ELEMENTS if M is None else int(M)
    if M < 1:
        raise ValueError(f"M (SRAM size in elements) must be >= 1, got {M}")
    bc = math.ceil(M / (4 * d)) if Bc is None else int(Bc)
    br = min(bc, d) if Br is None else int(Br)
    if br < 1 or bc < 1:
        raise ValueError(f"block sizes must be >= 1, got Br={br}, Bc={bc}")
    return br, bc


# [/doc:ref-block-sizes]
def seq_blocks(n: int, b: int):
    """Row ranges of the ceil(n / b) blocks of a length-n sequence; the last may be ragged."""
    return [range(s, min(s + b, n)) for s in range(0, n, b)]


# ----------------------------------------------------------------------------------------------
# Row statistics helpers used by several references
# ----------------------------------------------------------------------------------------------
def logsumexp_from_stats(m: np.ndarray, l: np.ndarray) -> np.ndarray:
    """L = m + log(l), with L = +inf where a row saw no key (l == 0)."""
    m = np.asarray(m, dtype=np.float64)
    l = np.asarray(l, dtype=np.float64)
    out = np.full_like(m, np.inf)
    ok = l > 0
    out[ok] = m[ok] + np.log(l[ok])
    return out
