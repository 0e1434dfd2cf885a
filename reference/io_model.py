"""The IO model: HBM accesses of every algorithm, counted and in closed form (FA1 Thm 2, Prop 4, Thm 5).

Paper: Dao et al., "FlashAttention", section 3.2 (Theorem 2, Proposition 3), Appendix C (proofs),
section 3.3 (Proposition 4) and Theorem 5; Dao, "FlashAttention-2", Algorithms 1 and 2.

What a reader learns
--------------------
FlashAttention's claim is about *memory traffic*, not FLOPs: standard attention makes
``Theta(N d + N^2)`` HBM accesses, FlashAttention ``Theta(N^2 d^2 / M)`` for an SRAM of ``M`` elements.
This module makes the claim checkable in two independent ways:

1. **Counted.** :func:`count_io` runs a reference with ``counter=HBMCounter()``; the reference wraps
   its HBM-resident arrays with :func:`~numba_flash_reference.hbm.hbm`, so every ``x[...]`` load and
   ``x[...] = y`` store in its code is counted, element by element, by array name.
2. **Closed form.** The ``io_*`` functions below give the same numbers *exactly* (not just their
   order of growth) from ``N``, ``d``, ``M``, ``Br``, ``Bc``, including ragged last tiles. The tests
   check that (1) equals (2) and that the trends of Theorem 2 and Proposition 4 hold.

:func:`format_table` (printed by ``python -m numba_flash io``) and :func:`table_rows` (rendered in the
docs) compare the algorithms side by side and show how the saving depends on ``M``.

What is counted (the accounting)
--------------------------------
Elements, not bytes; one read per element loaded from HBM into SRAM, one write per element stored.
Everything on chip (tiles, accumulators, statistics between lines of one step) is free. Not counted:
the zero-initialization of outputs (FA1 Alg.1 L2 ``O = 0, l = 0, m = -inf``, Alg.4 L5, FA2 Alg.2 L3),
which the references make by allocation, as a kernel avoids it by special-casing the first visit;
``R``, the dropout seed (O(1)); the dropout mask, which is recomputed from the hash, never stored.
Below ``Nq = s_q``, ``Nk = s_k``, ``Tr = ceil(Nq / Br)``, ``Tc = ceil(Nk / Bc)``; sums over row blocks of
``|rows_i|`` give exactly ``Nq``, which is why ragged tiles need no correction terms.

Forward, per (batch, query head), multiplied by ``b * h`` (with GQA/MQA each query head loads its KV
head's tiles itself; the forward references loop over query heads):

* Standard attention, Alg.0 (:func:`~numba_flash_reference.alg0_standard.standard_attention`):
  L1 reads Q, K and writes S; L2 reads S and writes P; L3 reads P, V and writes O.
  **reads = 2 Nq Nk + Nq d + 2 Nk d, writes = 2 Nq Nk + Nq d** (``4N^2 + 4Nd`` in all when square).
  The oracle's extra outputs m, l, L are not counted.
* FA1 Algorithms 1 and 2 (:mod:`~numba_flash_reference.alg1_forward`, ``alg2_forward``): L6 reads
  K_j, V_j once (``2 Nk d``); in every one of the ``Tc`` outer steps L8 reads Q_i, O_i, l_i, m_i for
  all rows (``Nq (2d + 2)``) and L12-L13 write O_i, l_i, m_i (``Nq (d + 2)``).
  **reads = 2 Nk d + Tc Nq (2d + 2), writes = Tc Nq (d + 2).** ``Br`` does not appear. Algorithm 2
  skips no tile, so causal masking changes nothing.
* Block-sparse, Alg.5 (:mod:`~numba_flash_reference.alg5_block_sparse`): as Algorithm 2, but the
  per-step terms are paid only for non-zero tiles. With ``W = sum over non-zero tiles (i, j) of
  |rows_i|`` (``= nnz * Br`` when ``Br`` divides ``Nq``): **reads = 2 Nk d + W (2d + 2),
  writes = W (d + 2).** K, V are loaded for every ``j`` (Alg.5 L6 is outside the ``if``).
* FA2 Algorithm 1 (:mod:`~numba_flash_reference.fa2_forward`): L4 reads Q_i once (``Nq d``); L7 reads
  K_j, V_j in every one of the ``Tr`` outer steps; L14-L15 write O_i and L_i once.
  **reads = Nq d + 2 Tr Nk d, writes = Nq (d + 1).** With causal block skipping, row block ``i`` (rows
  ``r0 <= r < r1``) loads ``min(Nk, Bc ceil(c_i / Bc))`` keys, ``c_i = min(Nk, max(0, r1 + Nk - Nq))``,
  instead of ``Nk``. Note the roles of the tiles: the outer tile is now ``Q_i``, so FA2 wants ``Br``
  large; Alg.1 L1's formula makes ``Bc`` the large one (it was designed for FA1's loop order).

Backward (closed forms for ``reference/alg3_backward.py``, ``alg4_backward.py``, ``fa2_backward.py``;
non-causal). Those references loop over KV heads with their ``G = h / h_k`` query heads, so the
K, V, dK, dV terms are multiplied by ``b * h_k`` and all others by ``b * h``:

* Standard backward, Alg.3, lines 1-5 as printed: L1 reads P, dO, writes dV; L2 reads dO, V, writes
  dP; L3 reads P, dP, writes dS; L4 reads dS, K, writes dQ; L5 reads dS, Q, writes dK.
  Per head: **reads = 5 Nq Nk + 3 Nq d + 2 Nk d, writes = 2 Nq Nk + Nq d + 2 Nk d.** P comes from
  the forward pass (its write is the forward's).
* FA1 Algorithm 4: L7 reads K_j, V_j (``2 Nk d``); L10 reads Q_i, O_i, dO_i, dQ_i, l_i, m_i in every
  one of the ``Tc`` outer steps (``Tc Nq (4d + 2)``); L21 writes dQ_i (``Tc Nq d``; its read is L10's);
  L24 writes dK_j, dV_j (``2 Nk d``). **reads = 2 Nk d + Tc Nq (4d + 2), writes = Tc Nq d + 2 Nk d.**
* FA2 Algorithm 2: L4 reads O, dO and writes D (``2 Nq d`` reads, ``Nq`` writes); L6 reads K_j, V_j
  (``2 Nk d``); L9 reads Q_i, dO_i, L_i, D_i every (i, j) (``Tc Nq (2d + 2)``); L15 reads and writes
  dQ_i (``Tc Nq d`` each); L18 writes dK_j, dV_j (``2 Nk d``). **reads = 2 Nq d + 2 Nk d +
  Tc Nq (3d + 2), writes = Nq + Tc Nq d + 2 Nk d.** The paper's line 9 also lists O_i and dQ_i; the
  reference loads neither there (D replaces O; L15 loads dQ_i for the add), and
  ``load_o_at_L9=True`` / ``load_dq_at_L9=True`` give the paper's literal count (``+ Tc Nq d`` each).

Every closed form returns an :class:`IOCount` with the per-array breakdown ``by_name`` (the names the
references give :func:`~numba_flash_reference.hbm.hbm`: Q, K, V, O, l, m, L, S, P, dO, dQ, dK, dV,
dP, dS, D), so a counted run that differs shows *which* array's traffic differs.

Run it::

    >>> from numba_flash_reference import io_model
    >>> io_model.io_standard_forward(N=1024, d=64).total
    4456448
    >>> io_model.io_alg1_forward(N=1024, d=64, M=98304).total < io_model.io_standard_forward(N=1024, d=64).total
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .common import DEFAULT_SRAM_ELEMENTS, block_sizes, seq_blocks
from .hbm import HBMCounter

# ----------------------------------------------------------------------------------------------
# Counts
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IOCount:
    """HBM accesses in elements: ``reads``, ``writes`` and their breakdown by array name.

    ``by_name`` maps an array name to ``(reads, writes)``; names with no traffic are left out, so two
    counts compare equal exactly when every array's traffic agrees.
    """

    reads: int
    writes: int
    by_name: dict = field(default_factory=dict, compare=True)

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @classmethod
    def from_by_name(cls, by_name: dict) -> IOCount:
        clean = {k: (int(r), int(w)) for k, (r, w) in by_name.items() if (r, w) != (0, 0)}
        return cls(sum(r for r, _ in clean.values()), sum(w for _, w in clean.values()), dict(sorted(clean.items())))

    @classmethod
    def from_counter(cls, counter: HBMCounter) -> IOCount:
        """The counts an :class:`~numba_flash_reference.hbm.HBMCounter` collected."""
        return cls.from_by_name(counter.by_name)

    def __add__(self, other: IOCount) -> IOCount:
        names = set(self.by_name) | set(other.by_name)
        z = (0, 0)
        return IOCount.from_by_name(
            {
                k: (
                    self.by_name.get(k, z)[0] + other.by_name.get(k, z)[0],
                    self.by_name.get(k, z)[1] + other.by_name.get(k, z)[1],
                )
                for k in names
            }
        )

    def scaled(self, factor: int) -> IOCount:
        """The count for ``factor`` independent (batch, head) pairs."""
        return IOCount.from_by_name({k: (r * factor, w * factor) for k, (r, w) in self.by_name.items()})

    def bytes(self, itemsize: int = 4) -> int:
        """Bytes moved at ``itemsize`` bytes per element (4 for float32, 2 for fp16)."""
        return self.total * itemsize


def count_io(fn, *args, **kwargs):
    """Run ``fn(*args, counter=HBMCounter(), **kwargs)``; return ``(result, IOCount)``.

    Works for every reference that takes ``counter=``: the forward references and the backward ones
    (``alg3_backward``, ``alg4_backward``, ``fa2_backward``).

    >>> import numpy as np
    >>> from numba_flash_reference.alg1_forward import flash_forward_alg1
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 1, 10, 1, 4))
    >>> _, counted = count_io(flash_forward_alg1, q, k, v, Br=3, Bc=4)
    >>> counted == io_alg1_forward(N=10, d=4, Br=3, Bc=4)
    True
    """
    counter = HBMCounter()
    result = fn(*args, counter=counter, **kwargs)
    return result, IOCount.from_counter(counter)


def _n_k(N, N_k):
    return N if N_k is None else int(N_k)


def _ceil(n, b):
    return -(-int(n) // int(b))


# ----------------------------------------------------------------------------------------------
# Closed forms: forward
# ----------------------------------------------------------------------------------------------


def io_standard_forward(N, d, N_k=None, b=1, h=1, elementwise_passes=0) -> IOCount:
    """FA1 Algorithm 0: ``reads = 2 Nq Nk + Nq d + 2 Nk d``, ``writes = 2 Nq Nk + Nq d`` per head.

    ``elementwise_passes`` models a framework that runs extra elementwise kernels on the N x N matrix
    (a mask, dropout: FA1 Fig. 2's PyTorch baseline) between lines 1 and 3: each reads and writes
    ``Nq Nk`` more elements (counted under the name ``"S"``). Algorithm 0 itself has none.
    """
    Nq, Nk = int(N), _n_k(N, N_k)
    e = int(elementwise_passes) * Nq * Nk
    per_head = {
        "Q": (Nq * d, 0),  # L1
        "K": (Nk * d, 0),  # L1
        "S": (Nq * Nk + e, Nq * Nk + e),  # written at L1, read at L2 (+ extra passes)
        "P": (Nq * Nk, Nq * Nk),  # written at L2, read at L3
        "V": (Nk * d, 0),  # L3
        "O": (0, Nq * d),  # L3
    }
    return IOCount.from_by_name(per_head).scaled(b * h)


def io_alg1_forward(N, d, M=None, Br=None, Bc=None, N_k=None, b=1, h=1) -> IOCount:
    """FA1 Algorithm 1: ``reads = 2 Nk d + Tc Nq (2d + 2)``, ``writes = Tc Nq (d + 2)`` per head.

    ``Tc = ceil(Nk / Bc)`` with ``Bc`` from Alg.1 L1 (or the override). ``Br`` does not matter: each of
    the ``Tc`` outer steps visits all ``Nq`` rows, whatever their grouping into blocks.
    """
    Nq, Nk = int(N), _n_k(N, N_k)
    _, Bc = block_sizes(d, M, Br, Bc)
    Tc = _ceil(Nk, Bc)
    per_head = {
        "K": (Nk * d, 0),  # L6, once per j
        "V": (Nk * d, 0),
        "Q": (Tc * Nq * d, 0),  # L8, every (i, j)
        "O": (Tc * Nq * d, Tc * Nq * d),  # L8 read, L12 write
        "l": (Tc * Nq, Tc * Nq),  # L8 read, L13 write
        "m": (Tc * Nq, Tc * Nq),
    }
    return IOCount.from_by_name(per_head).scaled(b * h)


def io_alg2_forward(N, d, M=None, Br=None, Bc=None, N_k=None, b=1, h=1, causal=False) -> IOCount:
    """FA1 Algorithm 2: the same as Algorithm 1 (:func:`io_alg1_forward`), causal or not.

    Algorithm 2 applies the mask inside every tile and skips none, so ``causal`` changes no count.
    """
    return io_alg1_forward(N, d, M=M, Br=Br, Bc=Bc, N_k=N_k, b=b, h=h)


def io_alg5_block_sparse(N, d, block_mask, M=None, Br=None, Bc=None, N_k=None, b=1, h=1) -> IOCount:
    """FA1 Algorithm 5 with ``block_mask`` (broadcastable to ``(b, h, Tr, Tc)``), summed over (b, h).

    ``reads = 2 Nk d + W (2d + 2)``, ``writes = W (d + 2)`` per head, where
    ``W = sum over non-zero tiles (i, j) of |rows_i|`` (``nnz * Br`` when ``Br`` divides ``Nq``): the
    ``N d`` part of Proposition 4 plus a part proportional to the number of non-zero blocks.
    """
    Nq, Nk = int(N), _n_k(N, N_k)
    Br, Bc = block_sizes(d, M, Br, Bc)
    Tr, Tc = _ceil(Nq, Br), _ceil(Nk, Bc)
    mask = np.broadcast_to(np.asarray(block_mask) != 0, (b, h, Tr, Tc))
    row_sizes = np.array([len(r) for r in seq_blocks(Nq, Br)], dtype=np.int64)  # |rows_i|, the last may be short
    W = int((mask.sum(axis=3) * row_sizes).sum())  # over all (b, h) and non-zero (i, j)
    by_name = {
        "K": (b * h * Nk * d, 0),  # L6, every j
        "V": (b * h * Nk * d, 0),
        "Q": (W * d, 0),  # L9, non-zero tiles only
        "O": (W * d, W * d),  # L9 read, L15 write
        "l": (W, W),  # L9 read, L16 write
        "m": (W, W),
    }
    return IOCount.from_by_name(by_name)


def io_fa2_forward(N, d, M=None, Br=None, Bc=None, N_k=None, b=1, h=1, causal=False) -> IOCount:
    """FA2 Algorithm 1: ``reads = Nq d + 2 Tr Nk d``, ``writes = Nq (d + 1)`` per head (non-causal).

    With ``causal``, row block ``i`` (rows ``r0 .. r1 - 1``) loads only the key blocks within its last
    row's horizon: ``min(Nk, Bc ceil(c_i / Bc))`` keys with ``c_i = min(Nk, max(0, r1 + Nk - Nq))``.
    """
    Nq, Nk = int(N), _n_k(N, N_k)
    Br, Bc = block_sizes(d, M, Br, Bc)
    if causal:
        keys = 0
        for rows in seq_blocks(Nq, Br):
            c = min(Nk, max(0, rows.stop + Nk - Nq))
            keys += min(Nk, Bc * _ceil(c, Bc))
    else:
        keys = _ceil(Nq, Br) * Nk  # Tr passes over all of K and V
    per_head = {
        "Q": (Nq * d, 0),  # L4, once per i
        "K": (keys * d, 0),  # L7
        "V": (keys * d, 0),
        "O": (0, Nq * d),  # L14
        "L": (0, Nq),  # L15
    }
    return IOCount.from_by_name(per_head).scaled(b * h)


# ----------------------------------------------------------------------------------------------
# Closed forms: backward (non-causal; K, V, dK, dV per KV head, the rest per query head)
# ----------------------------------------------------------------------------------------------


def _per_heads(q_side: dict, kv_side: dict, b: int, h: int, h_k) -> IOCount:
    h_k = h if h_k is None else int(h_k)
    if h_k < 1 or h % h_k:
        raise ValueError(f"nheads ({h}) must be a multiple of nheads_k ({h_k})")
    return IOCount.from_by_name(q_side).scaled(b * h) + IOCount.from_by_name(kv_side).scaled(b * h_k)


def io_alg3_backward(N, d, N_k=None, b=1, h=1, h_k=None, elementwise_passes=0) -> IOCount:
    """FA1 Algorithm 3 (standard backward), lines 1-5 as printed in the paper.

    ``reads = 5 Nq Nk + 3 Nq d + 2 Nk d``, ``writes = 2 Nq Nk + Nq d + 2 Nk d`` per head (MHA).
    ``elementwise_passes``: extra elementwise kernels on ``dP`` (the backward of a separate mask or
    dropout kernel), each ``Nq Nk`` reads and writes (counted under ``"dP"``), as in
    :func:`io_standard_forward`.
    """
    Nq, Nk = int(N), _n_k(N, N_k)
    NN = Nq * Nk
    e = int(elementwise_passes) * NN
    q_side = {
        "P": (2 * NN, 0),  # L1, L3
        "dO": (2 * Nq * d, 0),  # L1, L2
        "dP": (NN + e, NN + e),  # written L2, read L3 (+ extra passes)
        "dS": (2 * NN, NN),  # written L3, read L4 and L5
        "dQ": (0, Nq * d),  # L4
        "Q": (Nq * d, 0),  # L5
    }
    kv_side = {
        "dV": (0, Nk * d),  # L1
        "V": (Nk * d, 0),  # L2
        "K": (Nk * d, 0),  # L4
        "dK": (0, Nk * d),  # L5
    }
    return _per_heads(q_side, kv_side, b, h, h_k)


def io_alg4_backward(N, d, M=None, Br=None, Bc=None, N_k=None, b=1, h=1, h_k=None) -> IOCount:
    """FA1 Algorithm 4: ``reads = 2 Nk d + Tc Nq (4d + 2)``, ``writes = Tc Nq d + 2 Nk d`` per head (MHA).

    L7: K_j, V_j; L10: Q_i, O_i, dO_i, dQ_i, l_i, m_i every (i, j); L21: write dQ_i; L24: write
    dK_j, dV_j. L5's ``dQ = 0, dK = dV = 0`` is an allocation (not counted).
    """
    Nq, Nk = int(N), _n_k(N, N_k)
    _, Bc = block_sizes(d, M, Br, Bc)
    Tc = _ceil(Nk, Bc)
    step = Tc * Nq * d
    q_side = {
        "Q": (step, 0),  # L10
        "O": (step, 0),
        "dO": (step, 0),
        "dQ": (step, step),  # L10 read, L21 write
        "l": (Tc * Nq, 0),
        "m": (Tc * Nq, 0),
    }
    kv_side = {
        "K": (Nk * d, 0),  # L7
        "V": (Nk * d, 0),
        "dK": (0, Nk * d),  # L24
        "dV": (0, Nk * d),
    }
    return _per_heads(q_side, kv_side, b, h, h_k)


def io_fa2_backward(
    N, d, M=None, Br=None, Bc=None, N_k=None, b=1, h=1, h_k=None, load_o_at_L9=False, load_dq_at_L9=False
) -> IOCount:
    """FA2 Algorithm 2: the D pre-pass, then column-block-outer loops with a dQ read-modify-write.

    Per head (MHA): ``reads = 2 Nq d + 2 Nk d + Tc Nq (3d + 2)``, ``writes = Nq + Tc Nq d + 2 Nk d``.
    L4 reads O, dO, writes D; L6 reads K_j, V_j; L9 reads Q_i, dO_i, L_i, D_i every (i, j); L15 reads
    and writes dQ_i; L18 writes dK_j, dV_j. The paper's line 9 also lists O_i and dQ_i:
    ``load_o_at_L9`` / ``load_dq_at_L9`` add them (``Tc Nq d`` each), the reference does not load them.
    """
    Nq, Nk = int(N), _n_k(N, N_k)
    _, Bc = block_sizes(d, M, Br, Bc)
    Tc = _ceil(Nk, Bc)
    step = Tc * Nq * d
    q_side = {
        "O": (Nq * d + (step if load_o_at_L9 else 0), 0),  # L4 (+ L9 as printed)
        "dO": (Nq * d + step, 0),  # L4 + L9
        "D": (Tc * Nq, Nq),  # written L4, read L9
        "Q": (step, 0),  # L9
        "L": (Tc * Nq, 0),  # L9
        "dQ": (step + (step if load_dq_at_L9 else 0), step),  # L15 read and write (+ L9 as printed)
    }
    kv_side = {
        "K": (Nk * d, 0),  # L6
        "V": (Nk * d, 0),
        "dK": (0, Nk * d),  # L18
        "dV": (0, Nk * d),
    }
    return _per_heads(q_side, kv_side, b, h, h_k)


# ----------------------------------------------------------------------------------------------
# Sparsity patterns and the comparison table
# ----------------------------------------------------------------------------------------------


def banded_block_mask(Tr: int, Tc: int, sparsity: float) -> np.ndarray:
    """A (Tr, Tc) block mask with ``k = max(1, round(sparsity * Tc))`` non-zero blocks in every row.

    The blocks of row ``i`` form a band that starts at the diagonal block ``floor(i Tc / Tr)`` and wraps
    around (a local-attention-like pattern). Every row has the same count, so the fraction of non-zero
    blocks is exactly ``k / Tc``.
    """
    if not (0.0 < sparsity <= 1.0):
        raise ValueError(f"sparsity (fraction of non-zero blocks) must be in (0, 1], got {sparsity}")
    k = min(Tc, max(1, round(sparsity * Tc)))
    mask = np.zeros((Tr, Tc), dtype=bool)
    for i in range(Tr):
        start = (i * Tc) // Tr
        mask[i, [(start + t) % Tc for t in range(k)]] = True
    return mask


def fa2_block_sizes(d, M=None):
    """FA1's line-1 formula with the roles swapped for FA2's loop order: ``Br = ceil(M/4d)``, ``Bc = min(Br, d)``.

    In FA2's forward the outer (resident) tile is ``Q_i`` and ``K_j, V_j`` stream past it, so the IO
    saving comes from a large ``Br`` (fewer passes over K and V), as it came from a large ``Bc`` in FA1.
    """
    Br_fa1, Bc_fa1 = block_sizes(d, M)
    return Bc_fa1, Br_fa1


def _forward_backward_counts(N, d, M, Br, Bc, sparsity):
    Br_, Bc_ = block_sizes(d, M, Br, Bc)
    Tr, Tc = _ceil(N, Br_), _ceil(N, Bc_)
    mask = banded_block_mask(Tr, Tc, sparsity)
    kw = dict(M=M, Br=Br, Bc=Bc)
    Br2, Bc2 = (Bc_, Br_)  # the swapped tiles (what fa2_block_sizes gives when Br, Bc are not overridden)
    return {
        "std_f": io_standard_forward(N, d),
        "fa1_f": io_alg1_forward(N, d, **kw),
        "fa2_f": io_fa2_forward(N, d, **kw),
        "fa2s_f": io_fa2_forward(N, d, Br=Br2, Bc=Bc2),
        "bs_f": io_alg5_block_sparse(N, d, mask, **kw),
        "std_b": io_alg3_backward(N, d),
        "fa1_b": io_alg4_backward(N, d, **kw),
        "fa2_b": io_fa2_backward(N, d, **kw),
    }, (Br_, Bc_, Tr, Tc, mask)


def table_rows(N, d, M=None, Br=None, Bc=None, sparsity=0.25) -> list[dict]:
    """The comparison table as data: one dict per (pass, algorithm), per (batch, head), ``s_q = s_k = N``.

    Keys: ``pass``, ``algorithm``, ``paper`` (which algorithm of which paper), ``Br``, ``Bc``, ``reads``,
    ``writes``, ``total`` (elements), ``MB_fp32`` (total bytes at 4 bytes per element / 1e6),
    ``vs_standard`` (standard attention's total for the same pass divided by this total: above 1 means
    fewer HBM accesses than standard attention) and ``formula`` (the closed form with ``Nq = Nk = N``).
    """
    c, (Br_, Bc_, Tr, Tc, mask) = _forward_backward_counts(N, d, M, Br, Bc, sparsity)
    s_eff = mask.sum() / mask.size
    nt = ("-", "-")
    specs = [
        ("forward", "standard", "FA1 Alg.0", nt, c["std_f"], "4N^2 + 4Nd"),
        ("forward", "FlashAttention", "FA1 Alg.1/2", (Br_, Bc_), c["fa1_f"], "2Nd + Tc N(3d+4)"),
        ("forward", "FlashAttention-2", "FA2 Alg.1", (Br_, Bc_), c["fa2_f"], "N(2d+1) + 2 Tr N d"),
        ("forward", "FlashAttention-2, Br<->Bc", "FA2 Alg.1", (Bc_, Br_), c["fa2s_f"], "N(2d+1) + 2 Tr N d"),
        ("forward", f"block-sparse FA, s={s_eff:.3g}", "FA1 Alg.5", (Br_, Bc_), c["bs_f"], "2Nd + s Tc N(3d+4)"),
        ("backward", "standard", "FA1 Alg.3", nt, c["std_b"], "7N^2 + 8Nd"),
        ("backward", "FlashAttention", "FA1 Alg.4", (Br_, Bc_), c["fa1_b"], "4Nd + Tc N(5d+2)"),
        ("backward", "FlashAttention-2", "FA2 Alg.2", (Br_, Bc_), c["fa2_b"], "6Nd + N + Tc N(4d+2)"),
        ("fwd+bwd", "standard", "Alg.0 + Alg.3", nt, c["std_f"] + c["std_b"], "11N^2 + 12Nd"),
        ("fwd+bwd", "FlashAttention", "Alg.2 + Alg.4", (Br_, Bc_), c["fa1_f"] + c["fa1_b"], "6Nd + Tc N(8d+6)"),
        (
            "fwd+bwd",
            "FlashAttention-2",
            "FA2 Alg.1 + Alg.2",
            (Br_, Bc_),
            c["fa2_f"] + c["fa2_b"],
            "N(8d+2) + 2 Tr N d + Tc N(4d+2)",
        ),
    ]
    standard = {"forward": c["std_f"].total, "backward": c["std_b"].total, "fwd+bwd": (c["std_f"] + c["std_b"]).total}
    rows = []
    for pass_, alg, paper, (br, bc), count, formula in specs:
        rows.append(
            {
                "pass": pass_,
                "algorithm": alg,
                "paper": paper,
                "Br": br,
                "Bc": bc,
                "reads": count.reads,
                "writes": count.writes,
                "total": count.total,
                "MB_fp32": count.bytes(4) / 1e6,
                "vs_standard": standard[pass_] / count.total,
                "formula": formula,
            }
        )
    return rows


def _default_sweep(N, d, M=None):
    """SRAM sizes for the sweep: ``1024 * 2^k`` elements from ``d`` up to ``4 N d`` (where ``Tc = 1``), the
    default ``M`` and the given one. Theorem 2 covers ``d <= M <= N d``; beyond it FA1 keeps a whole row of
    K and V blocks in SRAM."""
    Ms = {1024 * 2**k for k in range(0, 40) if 1024 * 2**k <= 4 * N * d}
    Ms |= {DEFAULT_SRAM_ELEMENTS, N * d} | ({int(M)} if M is not None else set())
    return sorted(x for x in Ms if d <= x <= 4 * N * d)


def sweep_rows(N, d, Ms=None) -> list[dict]:
    """How the saving depends on the SRAM size ``M`` (block sizes from Alg.1 L1 for each ``M``).

    Keys: ``M`` (elements), ``KB_fp32``, ``KB_fp16``, ``in_thm2_range`` (``M <= N d``), ``Br``, ``Bc``,
    ``Tc``, and standard attention's
    total divided by: ``fwd_FA1``, ``fwd_FA2`` (same tiles), ``fwd_FA2_swapped``
    (:func:`fa2_block_sizes`), ``fwd_bwd_FA1``, ``fwd_bwd_FA2``; and ``M_over_3d2``, Theorem 2's
    leading-order forward ratio ``M / (3 d^2)`` (see :func:`format_table`).
    """
    Ms = _default_sweep(N, d) if Ms is None else list(Ms)
    std_f, std_b = io_standard_forward(N, d), io_alg3_backward(N, d)
    out = []
    for M in Ms:
        Br, Bc = block_sizes(d, M)
        Br2, Bc2 = fa2_block_sizes(d, M)
        f1, f2, f2s = io_alg1_forward(N, d, M=M), io_fa2_forward(N, d, M=M), io_fa2_forward(N, d, Br=Br2, Bc=Bc2)
        b1, b2 = io_alg4_backward(N, d, M=M), io_fa2_backward(N, d, M=M)
        out.append(
            {
                "M": M,
                "KB_fp32": M * 4 / 1024,
                "KB_fp16": M * 2 / 1024,
                "in_thm2_range": d <= M <= N * d,
                "Br": Br,
                "Bc": Bc,
                "Tc": _ceil(N, Bc),
                "fwd_FA1": std_f.total / f1.total,
                "fwd_FA2": std_f.total / f2.total,
                "fwd_FA2_swapped": std_f.total / f2s.total,
                "fwd_bwd_FA1": (std_f + std_b).total / (f1 + b1).total,
                "fwd_bwd_FA2": (std_f + std_b).total / (f2 + b2).total,
                "M_over_3d2": M / (3 * d * d),
            }
        )
    return out


def _range_remark(N, d, M) -> list[str]:
    """One line when ``M`` is outside Theorem 2's range ``d <= M <= N d`` (the table still prints, as counted)."""
    if M < d:
        return [
            f"Note: M = {M:,} < d = {d}: below Theorem 2's range d <= M <= N d. Not even one row of K fits in SRAM;",
            "the block sizes are clamped to 1, and the counts are those of the algorithm run that way, not the "
            "theorem's.",
        ]
    if M > N * d:
        return [
            f"Note: M = {M:,} > N d = {N * d:,}: beyond Theorem 2's range d <= M <= N d; K and V fit in SRAM whole,",
            "so Tc is 1 to 3 and the theorem's Theta(N^2 d^2 / M) no longer describes the count.",
        ]
    return []


def format_table(N, d, M=None, Br=None, Bc=None, sparsity=0.25) -> str:
    """The comparison printed by ``python -m numba_flash io``: counts per (batch, head), and a sweep over M.

    Parameters
    ----------
    N, d : int
        Sequence length (``s_q = s_k = N``) and head dimension.
    M : int, optional
        SRAM size in elements (default 48 KB of float32, numba-cuda's static shared-memory limit).
    Br, Bc : int, optional
        Block-size overrides (Alg.1 L1 otherwise).
    sparsity : float
        Fraction of non-zero blocks for the block-sparse row (rounded to whole blocks per row).

    Returns
    -------
    str
        The tables and a short reading of them (how the ratio depends on ``M`` and ``d``).
    """
    M_ = DEFAULT_SRAM_ELEMENTS if M is None else int(M)
    Br_, Bc_ = block_sizes(d, M_, Br, Bc)
    Tr, Tc = _ceil(N, Br_), _ceil(N, Bc_)
    rows = table_rows(N, d, M=M_, Br=Br, Bc=Bc, sparsity=sparsity)
    head = (
        f"{'pass':<9} {'algorithm':<27} {'paper':<18} {'Br':>5} {'Bc':>5} {'reads':>14} {'writes':>14} "
        f"{'total':>14} {'MB fp32':>10} {'std/this':>9}"
    )
    lines = [
        "IO model: HBM accesses per (batch, head), in elements (FA1 Theorems 2 and 5, Proposition 4; FA2 Algorithms "
        "1-2)",
        f"N = {N} (s_q = s_k), d = {d}, M = {M_:,} elements ({M_ * 4 / 1024:g} KB of fp32), "
        f"Br = {Br_}, Bc = {Bc_}, Tr = {Tr}, Tc = {Tc}",
        *_range_remark(N, d, M_),
        "",
        head,
        "-" * len(head),
    ]
    for r in rows:
        lines.append(
            f"{r['pass']:<9} {r['algorithm']:<27} {r['paper']:<18} {r['Br']:>5} {r['Bc']:>5} {r['reads']:>14,} "
            f"{r['writes']:>14,} {r['total']:>14,} {r['MB_fp32']:>10.3f} {r['vs_standard']:>8.2f}x"
        )
    lines += [
        "",
        "std/this = standard attention's HBM accesses / this algorithm's, same pass (above 1: fewer accesses).",
        "Counting the references' actual loads and stores (HBMCounter) gives exactly these numbers.",
        "",
        "How the saving depends on the SRAM size M (tiles from Alg.1 L1 for each M; FA2* with Br and Bc swapped):",
    ]
    head2 = (
        f"{'M (elem)':>10} {'KB fp32':>8} {'KB fp16':>8} {'Br':>5} {'Bc':>6} {'Tc':>5} {'fwd FA1':>8} {'fwd FA2':>8} "
        f"{'fwd FA2*':>9} {'f+b FA1':>8} {'f+b FA2':>8} {'M/3d^2':>7}"
    )
    lines += [head2, "-" * len(head2)]
    for r in sweep_rows(N, d, _default_sweep(N, d, M_)):
        lines.append(
            f"{r['M']:>10,}{' ' if r['in_thm2_range'] else '*'}{r['KB_fp32']:>8g} {r['KB_fp16']:>8g} {r['Br']:>5} "
            f"{r['Bc']:>6} {r['Tc']:>5} "
            f"{r['fwd_FA1']:>7.2f}x {r['fwd_FA2']:>7.2f}x {r['fwd_FA2_swapped']:>8.2f}x {r['fwd_bwd_FA1']:>7.2f}x "
            f"{r['fwd_bwd_FA2']:>7.2f}x {r['M_over_3d2']:>7.2f}"
        )
    lines += ["(* M > N d: beyond Theorem 2's range d <= M <= N d; Tc = ceil(N / Bc) is then 1 to 3.)"]
    lines += [
        "",
        "Reading it (Theorem 2). Standard attention moves 4N^2 + 4Nd elements forward (S and P are written and read",
        "back); FA1 moves 2Nd + Tc N(3d + 4) with Tc ~ 4Nd/M, i.e. ~12 N^2 d^2 / M. The ratio is ~M/(3d^2): linear",
        "in the SRAM size, falling as d^2; FA1 wins only once M is a few times d^2. Forward + backward, standard",
        "moves ~11 N^2 (Alg.3 adds dP and dS) and FA1 ~32 N^2 d^2 / M: a ratio of ~0.34 M/d^2. FA2's loop order",
        "re-reads K and V once per row block, so it wants Br large (FA2*), as FA1 wants Bc large.",
        "",
    ]
    lines += _gpt2_paragraph()
    return "\n".join(lines)


def gpt2_medium_bytes(M=98304, itemsize=2) -> dict:
    """FA1 Fig. 2's shape in this model: GPT-2 medium attention, forward + backward, in GB (1e9 bytes).

    Batch 64, 16 heads, N = 1024, d = 64, fp16 (``itemsize`` 2), SRAM ``M`` elements (98,304 = an A100's
    192 KB per SM in fp16). Keys: ``standard`` (Alg.0 + Alg.3), ``standard_1pass`` and
    ``standard_2passes`` (plus one or two separate elementwise kernels on the N x N matrices each way: a
    key-padding mask, dropout), ``flash`` (Alg.2 + Alg.4). The paper measured 40.3 GB vs 4.4 GB (arXiv v2)
    and 35.3 GB vs 4.4 GB (NeurIPS version, captioned "key-padding mask and no dropout").
    """
    N, d, heads = 1024, 64, 64 * 16

    def std(passes):
        return (
            io_standard_forward(N, d, elementwise_passes=passes) + io_alg3_backward(N, d, elementwise_passes=passes)
        ).scaled(heads)

    fa1 = (io_alg2_forward(N, d, M=M) + io_alg4_backward(N, d, M=M)).scaled(heads)
    return {
        "M": M,
        "standard": std(0).bytes(itemsize) / 1e9,
        "standard_1pass": std(1).bytes(itemsize) / 1e9,
        "standard_2passes": std(2).bytes(itemsize) / 1e9,
        "flash": fa1.bytes(itemsize) / 1e9,
    }


def _gpt2_paragraph() -> list[str]:
    g = gpt2_medium_bytes()
    g100 = gpt2_medium_bytes(M=51200)
    r = [g[k] / g["flash"] for k in ("standard", "standard_1pass", "standard_2passes")]
    r100 = [g100[k] / g100["flash"] for k in ("standard", "standard_1pass", "standard_2passes")]
    return [
        "The paper's 'up to 9x fewer HBM accesses' (FA1 Fig. 2: GPT-2 medium, batch 64, 16 heads, N = 1024, d = 64,",
        "fwd+bwd on an A100; measured 40.3 GB standard vs 4.4 GB FlashAttention, 35.3 GB vs 4.4 GB in the NeurIPS",
        "version, captioned 'key-padding mask and no dropout') in this model, at fp16:",
        f"  standard, Alg.0 + Alg.3: {g['standard']:.1f} GB; with a separate mask kernel (one more N x N read and "
        "write",
        f"  each way): {g['standard_1pass']:.1f} GB; with separate mask and dropout kernels: "
        f"{g['standard_2passes']:.1f} GB.",
        "  FlashAttention (Alg.2 + Alg.4), M = 98,304 elements (192 KB of fp16, an A100's SRAM per SM): "
        f"{g['flash']:.2f} GB,",
        f"  {r[0]:.1f}x / {r[1]:.1f}x / {r[2]:.1f}x fewer; M = 51,200 (100 KB of fp16): {g100['flash']:.2f} GB, "
        f"{r100[0]:.1f}x / {r100[1]:.1f}x / {r100[2]:.1f}x fewer.",
    ]
