"""One pass of a registered kernel on the caller's arrays: the launch step every entry point shares.

:func:`forward` and :func:`backward` turn the caller's arrays into kernel arrays (through the call's
:class:`~numba_flash._launch.Allocator`), warn in the simulator when the pass will take minutes
(:func:`numba_flash.runtime.cost.warn_if_slow`), and call the kernel module inside
:meth:`~numba_flash._launch.Allocator.launching`: on the tensors' GPU, with the caller's torch stream ordered
after its launches. :mod:`numba_flash.api` (NumPy
level) and :mod:`numba_flash._torch_ops` (the torch custom operators behind ``flash_attn_func``) both
launch through here, so a test that replaces these two functions sees every launch.
"""

from __future__ import annotations

from ._launch import Allocator, ForwardOutput, Problem
from .registry import Kernel
from .runtime import cost as _cost


def _converter(kernel: Kernel, prob: Problem, alloc: Allocator):
    """How the caller's arrays become kernel arrays: words of two halves for a module that runs half inputs
    natively (:attr:`~numba_flash.registry.Kernel.takes_words`), float32 otherwise."""
    return alloc.to_words if kernel.takes_words else alloc.to_kernel


def forward(q, k, v, prob: Problem, kernel: Kernel, block_sizes, alloc: Allocator) -> ForwardOutput:
    """``kernel``'s forward on the caller's q, k, v: a :class:`~numba_flash._launch.ForwardOutput` of kernel arrays."""
    _cost.warn_if_slow(kernel, prob, block_sizes, stacklevel=4)
    to_kernel = _converter(kernel, prob, alloc)
    with alloc.launching():
        return kernel.module.forward(to_kernel(q), to_kernel(k), to_kernel(v), prob, alloc, block_sizes=block_sizes)


def backward(
    dout, q, k, v, out, fwd: ForwardOutput, prob: Problem, kernel: Kernel, block_sizes, deterministic, alloc: Allocator
):
    """``kernel``'s backward: (dq, dk, dv) kernel arrays, from the caller's arrays and the forward's statistics
    ``fwd``."""
    _cost.warn_if_slow(kernel, prob, block_sizes, stacklevel=4)
    to_kernel = _converter(kernel, prob, alloc)
    with alloc.launching():
        kq, kk, kv, ko, kdo = (to_kernel(x) for x in (q, k, v, out, dout))
        return kernel.module.backward(
            kdo, kq, kk, kv, ko, fwd, prob, alloc, block_sizes=block_sizes, deterministic=deterministic
        )
