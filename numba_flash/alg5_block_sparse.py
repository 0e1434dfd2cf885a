"""FA1 Algorithm 5: block-sparse FlashAttention, forward and backward, on the Algorithm 1 and 4 kernels.

Paper: Dao et al., "FlashAttention" (NeurIPS 2022), Algorithm 5 (Appendix D.1) and Proposition 4.
The NumPy twins are :func:`numba_flash_reference.alg5_block_sparse.flash_forward_alg5` and
:func:`~numba_flash_reference.alg5_block_sparse.flash_backward_alg5`. The public entry points are
:func:`numba_flash.block_sparse.block_sparse_attn_func` (torch, differentiable) and
:func:`numba_flash.block_sparse.block_sparse_attention_numpy`.

What a reader learns
--------------------
* Algorithm 5 is Algorithm 2 with one line added: ``if M_ij != 0`` (line 8) around the inner step.
  So there is no kernel of its own: :func:`forward` runs :func:`numba_flash.alg1_forward.forward_kernel`
  compiled with ``SPARSE=True``, whose one body carries that test (tagged ``Alg.5 L8``, every line of
  Algorithm 5 tagged beside Algorithm 1's and 2's), and :func:`backward` runs
  :func:`numba_flash.alg4_backward.alg4_kernel` with ``sparse=True``, the same test around Algorithm 4's
  inner step. The dense kernels are the same bodies compiled with the flag off. A zero tile costs
  **no FLOP, no barrier and no HBM access**. That is Proposition 4: ``Theta(N d + N^2 d^2 s / M)`` HBM accesses for a fraction
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
``2 Nk d + W (2d + 2)``, writes ``W (d + 2)``) three departures, each marked ``Dev: Alg.5`` in the kernels: a column
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

from dataclasses import dataclass

import numpy as np
from numba import cuda

from . import alg1_forward, alg4_backward
from ._launch import STATIC_SMEM_BYTES, ForwardOutput, Problem, ceil_div, check_block_pair
from .alg1_forward import sram_elements, sram_footprint, thread_layout, use_shuffles
from .alg4_backward import Alg4Config, default_threads

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
    Br, Bc = check_block_pair(block_size, "block_size")
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


# ----------------------------------------------------------------------------------------------
# Forward and backward: the Algorithm 1 and Algorithm 4 kernels with the block mask
# ----------------------------------------------------------------------------------------------
def forward(q, k, v, mask: BlockMask, prob: Problem, alloc) -> ForwardOutput:
    """Algorithm 5 on kernel arrays: ``ForwardOutput(out, lse, m, l)``.

    ``mask`` is a checked :class:`BlockMask` whose tiles are the kernel's (``mask.block_size``);
    :mod:`numba_flash.block_sparse` builds it from the user's ``block_mask``. The kernel is
    :func:`numba_flash.alg1_forward.forward_kernel` with ``SPARSE=True``.
    """
    return alg1_forward.forward(q, k, v, prob, alloc, block_mask=mask)


def backward(dout, q, k, v, out, fwd: ForwardOutput, mask: BlockMask, prob: Problem, alloc):
    """The block-sparse backward on kernel arrays: ``(dq, dk, dv)`` for upstream gradient ``dout``.

    ``fwd`` holds the forward's ``m, l`` (b, h, s_q); ``mask`` the same :class:`BlockMask` the
    forward ran. The kernel is :func:`numba_flash.alg4_backward.alg4_kernel` with ``sparse=True``;
    under GQA/MQA each query head's block writes its partial ``dK, dV`` to scratch and
    :func:`numba_flash.device.gqa.group_sum` adds each group (as for the dense Algorithm 4).
    """
    return alg4_backward.backward(dout, q, k, v, out, fwd, prob, alloc, block_mask=mask)


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
