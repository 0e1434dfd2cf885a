"""Public API: ``flash_attn_func`` (torch, differentiable) and NumPy-level twins that need no torch.

``flash_attn_func`` has flash-attn 2's signature and semantics (layout ``(batch, seqlen, nheads,
headdim)``, bottom-right causal mask, GQA/MQA, default scale ``1/sqrt(headdim)``), plus keyword-only
extras that a student wants: which algorithm runs, the block sizes, the dropout seed.

Which kernels run (``algorithm=``):

============  ===============================================  =============================
name          forward                                          backward
============  ===============================================  =============================
"standard"    FA1 Algorithm 0 (S and P materialized in HBM)     FA1 Algorithm 3 (P, dP, dS in HBM)
"flash1"      FA1 Algorithms 1-2 (K/V-outer tiled forward)      FA1 Algorithm 4 (recomputation)
"flash2"      FA2 Algorithm 1 (query-outer)                     FA2 Algorithm 2 (D pre-pass)
============  ===============================================  =============================

Which kernel of the algorithm runs (``variant=``): ``"auto"`` (the default: the fastest for this
device; in the simulator the readable kernels, see :func:`numba_flash.registry.auto_order`),
``"readable"`` (the kernel that follows the paper line by line), ``"fast"``, ``"tensorcore"``;
:func:`numba_flash.variants` lists them. :mod:`numba_flash.registry` maps (algorithm, pass, variant) to
a kernel module; every module follows the contract of :class:`numba_flash._launch.KernelModule` on
kernel arrays, and this module does the checking, conversion and dispatch once for all of them.

Precision: the kernels compute in float32 whatever the inputs' floating dtype (float16, bfloat16,
float32, float64), except FA2's tensor-core kernels, which run float16/bfloat16 natively (half inputs,
float32 accumulation and softmax, :mod:`numba_flash.tensorcore.fa2_forward_half` and
:mod:`numba_flash.tensorcore.fa2_backward_half`); outputs and gradients
come back in the input's dtype. float64 inputs therefore
get float32 accuracy (about 1e-7 relative), and ``torch.autograd.gradcheck`` needs a step and
tolerances sized for float32 (see :func:`flash_attn_func`).

CUDA tensors are used zero-copy; NumPy arrays and CPU tensors run in the simulator on a machine
without a GPU (and are copied to the device on a machine with one). Every launch goes through
:mod:`numba_flash._run`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np

from . import _run, registry
from ._launch import (
    Allocator,
    ForwardOutput,
    Problem,
    _is_torch,
    check_attention_args,
    check_backward_args,
    check_block_pair,
    real_scalar,
)
from .registry import ALGORITHMS, DEFAULT_ALGORITHM, Kernel  # noqa: F401  (re-exported)


def _check_block_sizes(block_sizes):
    return None if block_sizes is None else check_block_pair(block_sizes, "block_sizes")


def variants(algorithm=None) -> list[dict]:
    """What can run: one dict per registered kernel, with whether it runs here and ``"auto"``'s choice.

    >>> from numba_flash import variants
    >>> [(k["algorithm"], k["pass"], k["variant"]) for k in variants("flash1")]
    [('flash1', 'forward', 'readable'), ('flash1', 'forward', 'fast'), ('flash1', 'backward', 'readable'), ('flash1',
    'backward', 'fast')]
    """
    if algorithm is not None:
        registry.check_algorithm(algorithm)
    rows = []
    for k in registry.variants(algorithm):
        auto = registry.auto_variant(k.algorithm, k.pass_)
        rows.append(
            {
                "algorithm": k.algorithm,
                "pass": k.pass_,
                "variant": k.variant,
                "paper": k.paper,
                "module": k.module.__name__,
                "when": k.when,
                "available": k.available(),
                "auto": auto == k.variant,
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------
# NumPy level
# ----------------------------------------------------------------------------------------------
@dataclass
class AttentionStats:
    """What a forward call saves for its backward: O(N) per head, never an N x N matrix.

    lse: (b, h, s_q) float32 logsumexp (+inf for rows that see no key). m, l: the row max and row sum,
    which every forward saves apart for its backward (``docs/backward.rst``, "Large logits"); with
    ``m = l = None`` the backward recomputes ``P = exp(S - L)`` from ``lse`` alone. The options are kept so the backward
    runs the same problem. ``forward`` and ``backward`` are the registry entries of the kernels (``.variant``,
    ``.module``): the forward is the one that ran; the backward is the one :func:`attention_backward_numpy` runs.

    fingerprints: ``{"q": ..., "k": ..., "v": ..., "out": ...}``, a :func:`fingerprint` of each array
    the forward saw and returned, so that :func:`attention_backward_numpy` can refuse different ones.
    """

    lse: np.ndarray
    m: np.ndarray | None
    l: np.ndarray | None
    problem: Problem
    algorithm: str
    block_sizes: tuple | None
    forward: Kernel
    backward: Kernel
    fingerprints: dict | None = None

    @property
    def variant(self) -> str:
        """The forward kernel's variant, e.g. ``"readable"``."""
        return self.forward.variant


def fingerprint(x) -> str:
    """A cheap fingerprint of an array's shape and values, to tell whether two arrays hold the same data.

    It hashes the shape, a strided sample of about 512 elements, and two sums over *every* element
    (the plain sum and a sum weighted by position), all computed in float64 on a C-ordered copy, so the
    same values give the same fingerprint whatever the array's dtype (float16 values exactly
    representable in float32 or float64 give the same result), memory layout or owner (a copy, a view).

    What it catches: a different array (another batch, a fresh random draw), arrays passed in the
    wrong order (``k`` for ``q``), an ``out`` from another call, an array modified in place between
    the forward and the backward (unless the change keeps both sums to the last bit and misses the
    sample, e.g. values swapped between two positions of equal weight mod 251 outside the sample).
    It is a guard against mistakes, not a proof that two arrays are equal. Cost: a float64 copy
    and three passes over the array, O(size), negligible next to attention's O(seqlen^2).
    """
    if _is_torch(x):
        import torch

        a = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    elif hasattr(x, "copy_to_host") and not isinstance(x, np.ndarray):
        a = x.copy_to_host()
    else:
        a = np.asarray(x)
    flat = np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
    sample = flat[:: max(1, flat.size // 512)]
    weights = (np.arange(flat.size) % 251 + 1).astype(np.float64)
    sums = np.array([flat.sum(), (flat * weights).sum()])
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(tuple(int(n) for n in a.shape)).encode())
    h.update(sample.tobytes())
    h.update(sums.tobytes())
    return h.hexdigest()


def _positive_number(x) -> bool:
    p = real_scalar(x)
    return p is not None and p > 0


def _seed_or_random(seed, dropout_p):
    if seed is not None:
        return seed
    # a malformed dropout_p is left for check_attention_args to name
    return int(np.random.default_rng().integers(0, 2**32)) if _positive_number(dropout_p) else 0


def attention_numpy(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    *,
    algorithm=None,
    variant=None,
    block_sizes=None,
    seed=None,
    return_stats=False,
):
    """Attention on NumPy arrays through the Numba kernels (no torch needed).

    Parameters
    ----------
    q : array, (batch, seqlen_q, nheads, headdim)
    k, v : arrays, (batch, seqlen_k, nheads_k, headdim); nheads must be a multiple of nheads_k
    dropout_p : float in [0, 1) (a Python or NumPy scalar, or a 0-d array)
    softmax_scale : float > 0, default 1/sqrt(headdim) (a Python or NumPy scalar, or a 0-d array)
    causal : bool, bottom-right aligned causal mask
    algorithm : "standard", "flash1" or "flash2" (default :data:`DEFAULT_ALGORITHM`)
    variant : "auto" (default), "readable", "fast" or "tensorcore": which kernel of the algorithm
        (:func:`variants`); kept in the stats so the backward runs the same variant
    block_sizes : (Br, Bc), optional override of the paper's formula
    seed : int in [0, 2**32), the dropout seed (random when None and dropout_p > 0)
    return_stats : also return :class:`AttentionStats` for :func:`attention_backward_numpy`

    Returns
    -------
    out : array like q (same dtype), or ``(out, stats)``

    Notes
    -----
    Computed in float32 whatever q's dtype (float64 inputs get float32 accuracy). Read-only arrays
    are fine: nothing is written into the inputs.
    """
    prob = check_attention_args(q, k, v, dropout_p, softmax_scale, causal, _seed_or_random(seed, dropout_p))
    fwd_kernel, bwd_kernel = registry.resolve_pair(algorithm, variant, prob)
    block_sizes = _check_block_sizes(block_sizes)
    alloc = Allocator(q)
    fwd = _run.forward(q, k, v, prob, fwd_kernel, block_sizes, alloc)
    out = alloc.result(fwd.out, np.asarray(q).dtype if alloc.kind == "numpy" else None)
    if not return_stats:
        return out
    res = alloc.result
    stats = AttentionStats(
        lse=res(fwd.lse),
        m=None if fwd.m is None else res(fwd.m),
        l=None if fwd.l is None else res(fwd.l),
        problem=prob,
        algorithm=fwd_kernel.algorithm,
        block_sizes=block_sizes,
        forward=fwd_kernel,
        backward=bwd_kernel,
        fingerprints={"q": fingerprint(q), "k": fingerprint(k), "v": fingerprint(v), "out": fingerprint(out)},
    )
    return out, stats


def attention_backward_numpy(dout, q, k, v, out, stats: AttentionStats, *, deterministic=False):
    """Gradients (dq, dk, dv) of ``sum(dout * attention(q, k, v))`` on NumPy arrays.

    ``stats`` is what :func:`attention_numpy` returned with ``return_stats=True``; the backward runs
    the same algorithm with the same options and regenerates the same dropout mask from the seed.
    ``q``, ``k``, ``v`` must be the arrays given to that forward and ``out`` the array it returned
    (the same values; copies are fine): each is checked against the :func:`fingerprint` saved in
    ``stats``, and one that differs raises ValueError naming it.
    """
    if not isinstance(stats, AttentionStats):
        raise TypeError(
            "stats must be the AttentionStats returned by attention_numpy(..., return_stats=True), got "
            f"{type(stats).__name__}"
        )
    prob = check_attention_args(
        q, k, v, stats.problem.dropout_p, stats.problem.softmax_scale, stats.problem.causal, stats.problem.seed
    )
    if dataclasses.replace(prob, dtype=stats.problem.dtype) != stats.problem:  # copies in another dtype are fine
        raise ValueError("q, k, v do not match the shapes the forward saved in stats")
    check_backward_args(dout, out, prob, q)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out)):
        if stats.fingerprints is not None and fingerprint(x) != stats.fingerprints[name]:
            what = "the array attention_numpy returned" if name == "out" else f"the {name} given to attention_numpy"
            raise ValueError(
                f"{name} is not {what} for these stats: its values differ (fingerprint mismatch). "
                "Pass the same q, k, v to the backward as to the forward, and the out the forward returned."
            )
    alloc = Allocator(q)
    fwd = ForwardOutput(
        out=None,
        lse=alloc.to_kernel(stats.lse),
        m=None if stats.m is None else alloc.to_kernel(stats.m),
        l=None if stats.l is None else alloc.to_kernel(stats.l),
    )
    dq, dk, dv = _run.backward(dout, q, k, v, out, fwd, prob, stats.backward, stats.block_sizes, deterministic, alloc)
    dt = np.asarray(q).dtype if alloc.kind == "numpy" else None
    return alloc.result(dq, dt), alloc.result(dk, dt), alloc.result(dv, dt)


# ----------------------------------------------------------------------------------------------
# torch level
# ----------------------------------------------------------------------------------------------
def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    return_attn_probs=False,
    *,
    algorithm=None,
    variant=None,
    block_sizes=None,
    seed=None,
    deterministic=False,
):
    """flash-attn 2's ``flash_attn_func`` on torch tensors, differentiable in q, k and v.

    Parameters
    ----------
    q : torch.Tensor, (batch, seqlen_q, nheads, headdim)
    k, v : torch.Tensor, (batch, seqlen_k, nheads_k, headdim)
    dropout_p : float in [0, 1) (a Python, NumPy or 0-d tensor scalar)
    softmax_scale : float > 0, default 1/sqrt(headdim) (a Python, NumPy or 0-d tensor scalar)
    causal : bool, causal mask aligned to the bottom-right corner when seqlen_q != seqlen_k
    return_attn_probs : also return the logsumexp (batch, nheads, seqlen_q) in float32, as flash-attn
        does (its third value, the dropout-masked S, is not materialized here: None)
    algorithm : "standard", "flash1" or "flash2" (keyword-only)
    variant : "auto" (default), "readable", "fast" or "tensorcore" (keyword-only): which kernel of the
        algorithm runs (:func:`variants`); ``"readable"`` runs the paper-shaped kernels of both passes.
        ``"auto"`` runs the fastest kernel of each pass; FA2's tensor-core backward recomputes the tensor-core
        forward's S with the same operations, so training with it meets the gradient rule (sharp softmaxes)
    block_sizes : (Br, Bc) override (keyword-only)
    seed : dropout seed in [0, 2**32); drawn from torch's generator when None (keyword-only)
    deterministic : run a backward without atomics (FA2), bitwise reproducible (keyword-only)

    Returns
    -------
    out, or (out, softmax_lse, None) with ``return_attn_probs=True``

    Notes
    -----
    Precision: the kernels compute in float32 whatever the input dtype (float16, bfloat16, float32
    or float64), except FA2's tensor-core forward (``"auto"`` on a GPU), which runs float16/bfloat16
    natively with float32 accumulation; results and gradients come back in the input's dtype. float64 inputs therefore
    get float32 accuracy (about 1e-7 relative), and ``torch.autograd.gradcheck`` at its defaults
    (``eps=1e-6``, ``atol=1e-5``) fails: its difference quotients divide float32 rounding by 1e-6.
    ``gradcheck(..., eps=1e-2, atol=2e-3, rtol=1e-2, fast_mode=True)`` on inputs of size ~1 passes
    (see ``tests/test_autograd.py`` for the derivation of these numbers).

    torch.compile: the forward and backward are torch custom operators
    (:mod:`numba_flash._torch_ops`), so a function that calls ``flash_attn_func`` compiles. With
    ``dropout_p > 0`` and ``seed=None`` the seed is drawn with ``.item()``, a graph break; pass
    ``seed=`` for one graph.

    In the simulator (no GPU), a call whose estimated time exceeds a minute warns with
    :class:`numba_flash.SimulatorSlowWarning` before it launches.
    """
    import torch

    from . import _torch_ops  # registers torch.ops.numba_flash.* on first use

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor (use attention_numpy for NumPy arrays), got {type(x).__name__}"
            )
    if q.is_meta and k.is_meta and v.is_meta:  # (one meta among others is the device check's mismatch)
        raise ValueError(
            "q is a meta tensor (a shape without data): flash_attn_func needs tensors on the CPU or a CUDA device"
        )
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs must be a bool, got {type(return_attn_probs).__name__}")
    if seed is None:
        seed = int(torch.randint(0, 2**32, (1,), dtype=torch.int64).item()) if _positive_number(dropout_p) else 0
    prob = check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed)
    # Names only (no device query, which torch.compile cannot trace): the custom op resolves them.
    algorithm = registry.check_algorithm(algorithm)
    fwd_variant, bwd_variant = registry.pair_variants(algorithm, variant)
    br, bc = _check_block_sizes(block_sizes) or (0, 0)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    out, lse, _m, _l = _torch_ops.run_forward(
        q,
        k,
        v,
        prob.dropout_p,
        prob.softmax_scale,
        prob.causal,
        prob.seed,
        algorithm,
        fwd_variant,
        bwd_variant,
        br,
        bc,
        deterministic,
        prob=prob,
    )
    return (out, lse, None) if return_attn_probs else out
