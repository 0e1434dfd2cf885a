"""Host side shared by the fast kernel modules: checking a launch plan, naming it, running an FA2 forward.

A fast module's ``plan(prob, block_sizes, config, features)`` returns ``(kernel, grid, threads,
dynamic SRAM bytes)`` without launching; :func:`check_sram` is the one check of its SRAM against the
device's opt-in limit, :func:`one_launch` its entry for ``compiled_kernels`` (the kernel contract of
:class:`numba_flash._launch.KernelModule`), and :func:`run_fa2_forward` the launch of the two FA2
forward kernels (FFMA and tensor cores), which take the same arguments and return the same outputs.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from .._launch import ForwardOutput, KernelLaunch, Problem
from ..device.constants import LOG2E
from ..runtime import smem as _smem

#: The k step of the tensor cores' ``m16n8k8`` products: the tensor-core kernels pad the head dim to a multiple of it.
MMA_K = 8


def padded_headdim(d: int) -> int:
    """``DP``: the head dim ``d`` rounded up to a multiple of :data:`MMA_K` (8), the width the tensor-core kernels' tiles
    of Q, K, V and O take in SRAM and registers (the padding columns are zeros)."""
    return MMA_K * ((d + MMA_K - 1) // MMA_K)


def checked_features(defaults: dict, features=None) -> dict:
    """``defaults`` updated with ``features``, after checking that every key of ``features`` is one of ``defaults``'
    (a misspelt switch would otherwise silently run the default): ValueError naming the unknown keys."""
    features = dict(features or {})
    unknown = sorted(set(features) - set(defaults))
    if unknown:
        raise ValueError(f"features: unknown switch(es) {unknown}; this kernel has {sorted(defaults)}")
    return {**defaults, **features}


def check_sram(nbytes: int, Br: int, Bc: int, d: int) -> None:
    """Raise ValueError (naming the tiles) when ``nbytes`` of dynamic SRAM exceed the device's opt-in limit."""
    if nbytes > _smem.max_optin_bytes():
        raise ValueError(f"tiles (Br={Br}, Bc={Bc}, d={d}) need {nbytes} bytes of shared memory; the device allows {_smem.max_optin_bytes()}")


def aligned16(*arrays) -> bool:
    """Whether every kernel array (device, torch CUDA tensor, or the simulator's) has a 16-byte aligned base and 16-byte
    multiples as the strides of its leading dimensions (those of extent > 1): what 16-byte ``cp.async``
    of its rows needs. A slice of a tensor at an odd offset can fail it; the register path then runs."""
    for a in arrays:
        if hasattr(a, "data_ptr"):  # a torch CUDA tensor (the kernel array of a torch caller on a GPU)
            ptr, strides = a.data_ptr(), [st * a.element_size() for st in a.stride()]
        else:
            ptr, strides = (getattr(a, "__cuda_array_interface__", None) or a.__array_interface__)["data"][0], a.strides
        if ptr % 16 or any(st % 16 for st, n in zip(strides[:-1], a.shape[:-1]) if n > 1):
            return False
    return True


def async_on(feature, cp_async: bool) -> bool:
    """A block's one-time tile load by ``cp.async`` resolved (the 3xTF32 forward's ``Q_ASYNC``, its backward's
    ``KV_ASYNC``): never off the kernel's ``cp.async`` path; else ``bool(feature)``, None: on."""
    return cp_async and (feature is None or bool(feature))


def register_path_if_unaligned(features, defaults: dict, *arrays):
    """``features``, with ``CP_ASYNC`` turned off where it is on (here or in ``defaults``) but ``arrays`` are not
    16-byte aligned (:func:`aligned16`): ``cp.async`` of their rows would fault, the register path runs instead.
    The alignment is only read when the feature is on (the call is on every forward's host path)."""
    if {**defaults, **(features or {})}["CP_ASYNC"] and not aligned16(*arrays):
        return {**(features or {}), "CP_ASYNC": False}
    return features


def registers_if_unaligned(features, defaults: dict, name: str, *arrays):
    """``features`` with the :func:`async_on` feature ``name`` off where it would be on but ``arrays`` are not 16-byte
    aligned (:func:`aligned16`): their tile goes through registers, the kernel's
    other tiles keep ``cp.async``. The alignment is read only when the feature would be on."""
    feats = {**defaults, **(features or {})}
    if async_on(feats[name], bool(feats["CP_ASYNC"])) and not aligned16(*arrays):
        return {**(features or {}), name: False}
    return features


def one_launch(what: str, plan, Br: int, Bc: int) -> list[KernelLaunch]:
    """``compiled_kernels`` of a module that launches one kernel: ``[KernelLaunch]`` named with its tiles and SRAM."""
    kernel, grid, threads, nbytes = plan
    return [KernelLaunch(f"{what} (Br, Bc) = ({Br}, {Bc}), {nbytes // 1024} KB dynamic SRAM", kernel, threads, math.prod(grid))]


def run_fa2_forward(plan, q, k, v, prob: Problem, alloc, out_words: bool = False) -> ForwardOutput:
    """Launch an FA2 forward ``plan`` on kernel arrays: ``ForwardOutput(out, lse, m, l)``.

    ``m, l`` (natural units, ``l`` relative to ``m``) are saved besides ``L`` for the backward's
    ``P = exp(S - m) / l``: recomputing ``exp(S - L)`` loses ``ulp(L)`` in every exponent, which breaks
    the error rule for sharp softmaxes (:func:`numba_flash.fast._regtile.make_natural_stats`).
    ``out_words``: the half kernel's O, an ``int32`` array of ``(b, s_q, h, d / 2)`` words of two halves.
    """
    kernel, grid, threads, nbytes = plan
    if out_words:
        out = alloc.empty((prob.batch, prob.seqlen_q, prob.nheads, prob.headdim // 2), dtype=np.int32)
    else:
        out = alloc.empty((prob.batch, prob.seqlen_q, prob.nheads, prob.headdim))
    # Dev: three allocations, not rows of one: the custom operator's outputs may not alias each other (torch checks)
    lse, m, l = (alloc.empty((prob.batch, prob.nheads, prob.seqlen_q)) for _ in range(3))
    fwd = ForwardOutput(out=out, lse=lse, m=m, l=l)
    _smem.launch(kernel, grid, threads, nbytes, *fa2_forward_args(q, k, v, fwd, prob))
    return fwd


def fa2_forward_args(q, k, v, fwd: ForwardOutput, prob: Problem) -> tuple:
    """The arguments of both FA2 forward kernels: the arrays, then tau log2 e, the GQA group, the causal offset and
    the dropout seed, threshold and scale (``bench.host_layers`` launches with the same tuple)."""
    return (q, k, v, fwd.out, fwd.lse, fwd.m, fwd.l, prob.softmax_scale * LOG2E, prob.group, prob.causal_offset, prob.seed,
            prob.threshold, prob.dropout_scale)


def cache_by_signature(factory):
    """:func:`functools.cache` for a kernel factory, keyed on its arguments bound to its signature with the defaults
    filled in: ``f(a)``, ``f(a, False)`` and ``f(a, FLAG=False)`` (``False`` the default) give one kernel object, so a
    plan that passes a new flag at its default and a caller that leaves it out compile and compare the same kernel."""
    sig = inspect.signature(factory)
    cached = functools.cache(factory)

    @functools.wraps(factory)
    def factory_cached(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return cached(*bound.args)

    factory_cached.cache_info, factory_cached.cache_clear = cached.cache_info, cached.cache_clear
    return factory_cached
