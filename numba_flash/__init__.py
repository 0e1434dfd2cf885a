"""numba-flash: FlashAttention and FlashAttention-2 as readable Numba CUDA kernels.

Importing this package first chooses the backend (a real GPU if one is present, else Numba's CUDA
simulator on the CPU); see :mod:`numba_flash.runtime.backend`. That must happen before ``numba.cuda`` is
imported anywhere, which is why this import comes first.

The public API is loaded lazily, so ``import numba_flash`` stays cheap.
"""

from ._version import __version__  # noqa: F401  (the one place the version is written)
from .runtime import backend as _backend  # noqa: F401  (must run before numba.cuda is imported)
from .runtime.backend import BACKEND, describe, is_simulator
from .runtime.cost import SimulatorSlowWarning  # (no numba import: cheap)

_LAZY = {
    "variants": ("numba_flash.api", "variants"),
    "flash_attn_func": ("numba_flash.api", "flash_attn_func"),
    "attention_numpy": ("numba_flash.api", "attention_numpy"),
    "attention_backward_numpy": ("numba_flash.api", "attention_backward_numpy"),
    "block_sparse_attn_func": ("numba_flash.block_sparse", "block_sparse_attn_func"),
    "block_sparse_attention_numpy": ("numba_flash.block_sparse", "block_sparse_attention_numpy"),
    "block_sparse_attention_backward_numpy": ("numba_flash.block_sparse", "block_sparse_attention_backward_numpy"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'numba_flash' has no attribute {name!r}")


__all__ = ["BACKEND", "SimulatorSlowWarning", "describe", "is_simulator", *_LAZY]
