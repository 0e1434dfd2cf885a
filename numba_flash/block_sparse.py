"""Public API of block-sparse FlashAttention (FA1 Algorithm 5): torch and NumPy entry points.

``block_sparse_attn_func`` follows flash-attn's naming and layout (``(batch, seqlen, nheads, headdim)``,
bottom-right causal mask, GQA/MQA, default scale ``1/sqrt(headdim)``) and adds the block mask; the
kernels are :mod:`numba_flash.alg5_block_sparse` (forward: Algorithm 5; backward: Algorithm 4 on the
same non-zero tiles).

The block-mask contract
-----------------------
``block_size = (Br, Bc)`` are the kernel's tiles *and* the mask's blocks (default
:data:`~numba_flash.alg5_block_sparse.DEFAULT_BLOCK_SIZE`, which fits the SRAM of both kernels up to
``headdim = 128``). ``block_mask`` is a bool or integer (0/1) NumPy array or torch tensor (any
device; it is read on the host, it is small) of shape

* ``(Tr, Tc)``: one mask for every batch and head,
* ``(H, Tr, Tc)`` with ``H`` in ``{1, nheads}``: one per query head, or
* ``(B, H, Tr, Tc)`` with ``B`` in ``{1, batch}``: one per batch element and head,

where ``Tr = ceil(seqlen_q / Br)`` and ``Tc = ceil(seqlen_k / Bc)``; :func:`block_mask_shape` computes
them. A 1 at ``(i, j)`` lets query rows ``[i Br, (i+1) Br)`` attend to keys ``[j Bc, (j+1) Bc)``; a 0
hides them (score ``-inf``) and the kernels skip the tile. **Every row of blocks must hold a 1**: a
query with no key block to attend to is almost always a bug in the mask, so it is an error (a
``causal=True`` row that sees no key because ``seqlen_q > seqlen_k`` still outputs 0, as in
flash-attn). ``causal`` and ``dropout_p`` act inside the non-zero tiles exactly as in
:func:`numba_flash.flash_attn_func`; the dropout mask is the project's counter hash
(:mod:`numba_flash.device.dropout`), so results compare bit for bit with the references.

Everything is checked before anything is launched; errors name the argument.

    >>> import numpy as np
    >>> from numba_flash.block_sparse import block_mask_shape, block_sparse_attention_numpy
    >>> block_mask_shape(40, 40, (16, 16))
    (3, 3)
    >>> q, k, v = np.random.default_rng(1).standard_normal((3, 1, 40, 2, 8)).astype(np.float32)
    >>> mask = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=bool)
    >>> out, stats = block_sparse_attention_numpy(q, k, v, mask, return_stats=True)
    >>> out.shape, stats.lse.shape
    ((1, 40, 2, 8), (1, 2, 40))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._launch import Allocator, ForwardOutput, Problem, _is_torch, ceil_div, check_attention_args, check_backward_args
from .alg5_block_sparse import DEFAULT_BLOCK_SIZE, BlockMask, check_block_size


def block_mask_shape(seqlen_q: int, seqlen_k: int, block_size=DEFAULT_BLOCK_SIZE) -> tuple[int, int]:
    """``(Tr, Tc) = (ceil(seqlen_q / Br), ceil(seqlen_k / Bc))``: the last two dimensions of a block mask."""
    Br, Bc = block_size
    return ceil_div(int(seqlen_q), int(Br)), ceil_div(int(seqlen_k), int(Bc))


def check_block_mask(block_mask, prob: Problem, block_size) -> BlockMask:
    """Validate ``block_mask`` against the problem and ``block_size``; return the :class:`BlockMask`.

    Raises
    ------
    TypeError
        ``block_mask`` is not an array or tensor, or its dtype is not bool or integer.
    ValueError
        Wrong number of dimensions, wrong ``(Tr, Tc)``, a batch or head dimension that is neither 1 nor
        the problem's, values other than 0 and 1, or a row of blocks with no 1 (naming the batch, head
        and row block).
    """
    if not hasattr(block_mask, "shape") or not hasattr(block_mask, "dtype"):
        raise TypeError(
            f"block_mask must be a NumPy array or torch tensor of 0/1 flags, got {type(block_mask).__name__}"
        )
    if _is_torch(block_mask):
        if block_mask.is_floating_point() or block_mask.is_complex():
            raise TypeError(f"block_mask must have a bool or integer dtype, got {block_mask.dtype}")
        host = block_mask.detach().cpu().numpy()
    else:
        host = np.asarray(block_mask)
    if host.dtype != np.bool_ and host.dtype.kind not in "iu":
        raise TypeError(f"block_mask must have a bool or integer dtype, got {host.dtype}")
    Br, Bc = block_size
    Tr, Tc = block_mask_shape(prob.seqlen_q, prob.seqlen_k, block_size)
    if host.ndim not in (2, 3, 4):
        raise ValueError(
            f"block_mask must have shape (Tr, Tc), (nheads, Tr, Tc) or (batch, nheads, Tr, Tc), got shape {host.shape}"
        )
    if host.shape[-2:] != (Tr, Tc):
        raise ValueError(
            f"block_mask must end in (Tr, Tc) = ({Tr}, {Tc}) for seqlen_q={prob.seqlen_q}, seqlen_k={prob.seqlen_k} "
            "and "
            f"block_size=({Br}, {Bc}), got shape {host.shape}"
        )
    full = host.reshape((1,) * (4 - host.ndim) + host.shape)
    B, H = full.shape[:2]
    if H not in (1, prob.nheads):
        raise ValueError(f"block_mask has {H} heads; it must have 1 or nheads = {prob.nheads} (shape {host.shape})")
    if B not in (1, prob.batch):
        raise ValueError(
            f"block_mask has batch dimension {B}; it must be 1 or batch = {prob.batch} (shape {host.shape})"
        )
    if host.dtype != np.bool_ and not np.isin(full, (0, 1)).all():
        raise ValueError(f"block_mask must hold only 0 and 1, got values {np.unique(full)[:8].tolist()}")
    mask = full != 0
    empty = np.argwhere(~mask.any(axis=3))
    if len(empty):
        bb, hh, i = (int(n) for n in empty[0])
        rows = f"query rows {i * Br}..{min((i + 1) * Br, prob.seqlen_q) - 1}"
        where = f"row block {i} ({rows})" + (f" of batch {bb}" if B > 1 else "") + (f", head {hh}" if H > 1 else "")
        raise ValueError(
            f"block_mask: {where} has no non-zero block, so its queries would attend to nothing "
            f"({len(empty)} such row block(s)); every row of blocks needs at least one 1"
        )
    return BlockMask(mask=np.ascontiguousarray(mask), block_size=(int(Br), int(Bc)))


def _seed(seed, dropout_p, draw):
    if seed is not None:
        return seed
    positive = isinstance(dropout_p, (int, float)) and not isinstance(dropout_p, bool) and dropout_p > 0
    return draw() if positive else 0


@dataclass
class BlockSparseStats:
    """What the forward saves for the backward: O(N) per head plus the block mask.

    lse: (b, h, s_q) logsumexp (+inf for rows that see no key); m, l: FA1's row max and row sum.
    """

    lse: np.ndarray
    m: np.ndarray
    l: np.ndarray
    problem: Problem
    mask: BlockMask


def _prepare(q, k, v, block_mask, dropout_p, softmax_scale, causal, block_size, seed):
    prob = check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed)
    block_size = check_block_size(block_size, prob.headdim)
    return prob, check_block_mask(block_mask, prob, block_size)


def _run_forward(q, k, v, prob, mask, alloc) -> ForwardOutput:
    from . import alg5_block_sparse

    with alloc.launching():  # as numba_flash._run does: the tensors' GPU, then the caller's stream waits for the
        # launches
        return alg5_block_sparse.forward(alloc.to_kernel(q), alloc.to_kernel(k), alloc.to_kernel(v), mask, prob, alloc)


def _run_backward(dout, q, k, v, out, m, l, prob, mask, alloc):
    from . import alg5_block_sparse

    with alloc.launching():
        kq, kk, kv, ko, kdo = (alloc.to_kernel(x) for x in (q, k, v, out, dout))
        fwd = ForwardOutput(out=None, lse=None, m=alloc.to_kernel(m), l=alloc.to_kernel(l))
        return alg5_block_sparse.backward(kdo, kq, kk, kv, ko, fwd, mask, prob, alloc)


# ----------------------------------------------------------------------------------------------
# NumPy level
# ----------------------------------------------------------------------------------------------
def block_sparse_attention_numpy(
    q,
    k,
    v,
    block_mask,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    *,
    block_size=DEFAULT_BLOCK_SIZE,
    seed=None,
    return_stats=False,
):
    """Block-sparse attention on NumPy arrays through the Numba kernels (no torch needed).

    Parameters
    ----------
    q : array, (batch, seqlen_q, nheads, headdim)
    k, v : arrays, (batch, seqlen_k, nheads_k, headdim); nheads a multiple of nheads_k
    block_mask : bool/integer array, ``(Tr, Tc)``, ``(H, Tr, Tc)`` or ``(B, H, Tr, Tc)`` (module docstring)
    dropout_p : float in [0, 1)
    softmax_scale : float > 0, default 1/sqrt(headdim)
    causal : bool, bottom-right aligned causal mask inside the non-zero tiles
    block_size : (Br, Bc), the mask's blocks and the kernel's tiles
    seed : int in [0, 2**32), the dropout seed (random when None and dropout_p > 0)
    return_stats : also return :class:`BlockSparseStats` for :func:`block_sparse_attention_backward_numpy`

    Returns
    -------
    out : array like q (same dtype), or ``(out, stats)``
    """
    seed = _seed(seed, dropout_p, lambda: int(np.random.default_rng().integers(0, 2**32)))
    prob, mask = _prepare(q, k, v, block_mask, dropout_p, softmax_scale, causal, block_size, seed)
    alloc = Allocator(q)
    fwd = _run_forward(q, k, v, prob, mask, alloc)
    out = alloc.result(fwd.out, np.asarray(q).dtype if alloc.kind == "numpy" else None)
    if not return_stats:
        return out
    return out, BlockSparseStats(
        lse=alloc.result(fwd.lse), m=alloc.result(fwd.m), l=alloc.result(fwd.l), problem=prob, mask=mask
    )


def block_sparse_attention_backward_numpy(dout, q, k, v, out, stats: BlockSparseStats):
    """Gradients ``(dq, dk, dv)`` of ``sum(dout * block_sparse_attention(q, k, v))`` on NumPy arrays.

    ``stats`` is what :func:`block_sparse_attention_numpy` returned with ``return_stats=True``; the
    backward skips the same tiles and regenerates the same dropout mask from the seed.
    """
    if not isinstance(stats, BlockSparseStats):
        raise TypeError(
            "stats must be the BlockSparseStats returned by block_sparse_attention_numpy(..., return_stats=True), got "
            f"{type(stats).__name__}"
        )
    p = stats.problem
    prob = check_attention_args(q, k, v, p.dropout_p, p.softmax_scale, p.causal, p.seed)
    if prob != p:
        raise ValueError("q, k, v do not match the shapes the forward saved in stats")
    check_backward_args(dout, out, prob, q)
    alloc = Allocator(q)
    dq, dk, dv = _run_backward(dout, q, k, v, out, stats.m, stats.l, prob, stats.mask, alloc)
    dt = np.asarray(q).dtype if alloc.kind == "numpy" else None
    return alloc.result(dq, dt), alloc.result(dk, dt), alloc.result(dv, dt)


# ----------------------------------------------------------------------------------------------
# torch level
# ----------------------------------------------------------------------------------------------
_Function = None


def _autograd_function():
    """The torch.autograd.Function, built on first use (importing this module needs no torch)."""
    global _Function
    if _Function is not None:
        return _Function
    import torch

    class BlockSparseAttnFunction(torch.autograd.Function):
        """Saves q, k, v, out and the row statistics m, l (O(N) per head) and the block mask."""

        @staticmethod
        def forward(ctx, q, k, v, prob, mask):
            alloc = Allocator(q)
            fwd = _run_forward(q, k, v, prob, mask, alloc)
            out = alloc.result(fwd.out, q.dtype)
            lse, m, l = (alloc.result(x) for x in (fwd.lse, fwd.m, fwd.l))
            ctx.save_for_backward(q, k, v, out, m, l)
            ctx.options = (prob, mask)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, m, l = ctx.saved_tensors
            prob, mask = ctx.options
            alloc = Allocator(q)
            dq, dk, dv = _run_backward(dout, q, k, v, out, m, l, prob, mask, alloc)
            return alloc.result(dq, q.dtype), alloc.result(dk, k.dtype), alloc.result(dv, v.dtype), None, None

    _Function = BlockSparseAttnFunction
    return _Function


def block_sparse_attn_func(
    q,
    k,
    v,
    block_mask,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    return_attn_probs=False,
    *,
    block_size=DEFAULT_BLOCK_SIZE,
    seed=None,
):
    """Block-sparse attention on torch tensors, differentiable in q, k and v (FA1 Algorithm 5).

    Parameters
    ----------
    q : torch.Tensor, (batch, seqlen_q, nheads, headdim)
    k, v : torch.Tensor, (batch, seqlen_k, nheads_k, headdim)
    block_mask : bool/integer tensor or array, ``(Tr, Tc)``, ``(H, Tr, Tc)`` or ``(B, H, Tr, Tc)`` with
        ``(Tr, Tc) = block_mask_shape(seqlen_q, seqlen_k, block_size)``; every row of blocks needs a 1
    dropout_p : float in [0, 1)
    softmax_scale : float > 0, default 1/sqrt(headdim)
    causal : bool, bottom-right aligned causal mask, applied inside the non-zero tiles
    return_attn_probs : also return the logsumexp (batch, nheads, seqlen_q) in float32 (and None in
        place of flash-attn's dropout-masked S, which is never materialized)
    block_size : (Br, Bc), the mask's blocks and the kernels' tiles (keyword-only)
    seed : dropout seed in [0, 2**32); drawn from torch's generator when None (keyword-only)

    Returns
    -------
    out, or (out, softmax_lse, None) with ``return_attn_probs=True``
    """
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor (use block_sparse_attention_numpy for NumPy arrays), got "
                f"{type(x).__name__}"
            )
    seed = _seed(seed, dropout_p, lambda: int(torch.randint(0, 2**32, (1,), dtype=torch.int64).item()))
    prob, mask = _prepare(q, k, v, block_mask, dropout_p, softmax_scale, causal, block_size, seed)
    out, lse = _autograd_function().apply(q, k, v, prob, mask)
    return (out, lse, None) if return_attn_probs else out
