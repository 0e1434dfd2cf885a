"""FlashAttention-2 Algorithm 2, variant ``"tensorcore"``: which backward kernel runs on the tensor cores.

* float16 / bfloat16 inputs with an even head dim up to 128 (:func:`takes_words`): the native half
  backward :mod:`numba_flash.fast.fa2_backward_half` (``mma.sync.m16n8k16``, float32 accumulation), on
  half words, as the half forward :mod:`numba_flash.fast.fa2_forward_half` runs them.
* float32 kernel arrays (float32 inputs, and half inputs the half kernel does not run) up to head dim 128:
  the 3xTF32 backward :mod:`numba_flash.fast.fa2_backward_tf32`, the twin of the 3xTF32 forward (it
  recomputes the forward's ``S`` bit for bit).
* above head dim 128: the float32 FFMA kernel :mod:`numba_flash.fast.fa2_backward`, as the forward runs
  its FFMA kernel there. :func:`compiled_kernels` names the kernel that runs, so the stats of a call say
  which one it was.
"""

from __future__ import annotations

from .._launch import KernelLaunch, Problem
from . import fa2_backward as fa2_backward_fast
from . import fa2_backward_half, fa2_backward_tf32
from .fa2_backward import backward as _ffma_backward  # bound once: a call here is this module's, not the "fast" entry's
from .fa2_forward_tc import available  # noqa: F401  (the kernel contract's optional available())

#: :func:`backward` puts nothing on the GPU but the allocator's outputs and launches through ``_smem.launch`` (each of
#: the three modules it picks: the pre-pass, the main kernel, the deterministic dQ kernel): an eager call's backward
#: may be replayed (:mod:`numba_flash.fast._replay`)
REPLAYABLE = True


def takes_words(prob: Problem) -> bool:
    """Whether :func:`backward` takes q, k, v, O, dO as half words (the half kernel runs ``prob``)."""
    return fa2_backward_half.handles(prob)


def _module(prob: Problem):
    """The kernel module that runs ``prob``: the half kernel's, the 3xTF32 kernel's or the FFMA kernel's."""
    if takes_words(prob):
        return fa2_backward_half
    return fa2_backward_tf32 if fa2_backward_tf32.handles(prob) else fa2_backward_fast


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the main kernel that runs ``prob``."""
    return _module(prob).choose_block_sizes(prob, block_sizes)


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block of the main kernel that runs ``prob``, in bytes."""
    return _module(prob).sram_bytes(prob, block_sizes)


def compiled_kernels(prob: Problem, block_sizes=None, deterministic=False) -> list[KernelLaunch]:
    """The kernels :func:`backward` launches for ``prob``, compiled (not launched)."""
    module = _module(prob)
    if module is not fa2_backward_fast:
        return module.compiled_kernels(prob, block_sizes, deterministic)
    return [KernelLaunch(f"{k.name} (the tensor-core module above d = 128)", k.dispatcher, k.threads, k.blocks)
            for k in fa2_backward_fast.compiled_kernels(prob, block_sizes, deterministic)]


def backward(dout, q, k, v, out, fwd, prob: Problem, alloc, block_sizes=None, deterministic=False):
    """FA2 Algorithm 2: the half kernel on words for the inputs it :func:`takes_words`, the 3xTF32 kernel on float32
    arrays up to head dim 128, the FFMA kernel above."""
    module = _module(prob)
    run = _ffma_backward if module is fa2_backward_fast else module.backward
    return run(dout, q, k, v, out, fwd, prob, alloc, block_sizes=block_sizes, deterministic=deterministic)
