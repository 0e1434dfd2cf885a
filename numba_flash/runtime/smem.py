"""Dynamic shared memory beyond 48 KB: the driver opt-in that numba-cuda has no API for.

A kernel declares ``cuda.shared.array(0, float32)`` (dynamic shared memory) and is launched with
``kernel[grid, block, stream, nbytes]``. Up to 48 KB that just works. Beyond it (an H100/H200 allows
up to 227 KB per block) the driver refuses the launch unless the kernel's function handle carries the
attribute ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES >= nbytes`` (CUDA C++:
``cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, nbytes)``).
numba-cuda 0.30 has no keyword for it (NVIDIA/numba-cuda issue #94), so :func:`launch` compiles the
kernel for the launch's argument types, takes the compiled function's driver handle and sets the
attribute through numba-cuda's driver binding, once per (kernel, device, size), before launching.

In the simulator there is no limit and nothing to set: :func:`launch` just launches.

Finding the function handle types the launch's arguments in Python on every launch above 48 KB. A variant that
skipped that once every overload was opted in (``CACHED_OPT_IN``, 2026-11-25) showed no saving of host time on an
H100 and was removed (docs/notes/performance-log.md, "Host path: ``_smem.CACHED_OPT_IN`` timed"). Launches on torch
CUDA tensors skip both numba's typing and the opt-in's after their first (:mod:`numba_flash.runtime.direct`).
"""

from __future__ import annotations

from . import backend as _backend
from . import direct as _direct
from . import replay as _replay

#: Dynamic shared memory any kernel may use without the opt-in, in bytes.
DEFAULT_LIMIT_BYTES = 48 * 1024

_opted_in: dict[tuple[int, int], int] = {}


def max_optin_bytes() -> int:
    """The largest dynamic shared memory one block may opt in to on the current device (bytes)."""
    if _backend.is_simulator():
        return 227 * 1024
    return _backend.device_facts().max_shared_optin


# [doc:smem-opt-in]
def _opt_in(dispatcher, args, nbytes: int) -> None:
    kernel = dispatcher._compile_for_args(*args)  # the overload this launch will use (cached)
    _set_max_dynamic(kernel._codelibrary.get_cufunc(), nbytes)


def _set_max_dynamic(cufunc, nbytes: int) -> None:
    from numba.cuda.cudadrv.driver import binding, driver

    dev_id = cufunc.device.id
    key = (id(cufunc), dev_id)
    if _opted_in.get(key, 0) >= nbytes:
        return
    # The static shared memory of the kernel counts against the same limit.
    static = int(cufunc.attrs.shared)
    if nbytes + static > max_optin_bytes():
        raise ValueError(
            f"kernel needs {nbytes + static} bytes of shared memory per block; the device allows {max_optin_bytes()}"
        )
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, dev_id)
    _opted_in[key] = nbytes


def launch(dispatcher, grid, block, nbytes: int, *args) -> None:
    """``dispatcher[grid, block, 0, nbytes](*args)``, opting in to > 48 KB of dynamic SRAM first."""
    if _backend.is_simulator():
        dispatcher[grid, block, 0, nbytes](*args)
        return
    if _direct.launch(dispatcher, grid, block, nbytes, args, _opt_in_function):  # Dev: torch tensors, after their first
        # launch
        return
    _replay.numba_launched()  # Dev: a recorded call whose launch numba makes is recorded again next time
    if nbytes > DEFAULT_LIMIT_BYTES:
        _opt_in(dispatcher, args, nbytes)
    dispatcher[grid, block, 0, nbytes](*args)


# [/doc:smem-opt-in]


def _opt_in_function(cufunc, nbytes: int) -> None:
    """The opt-in for a function handle already found (:mod:`numba_flash.runtime.direct`'s launches)."""
    if nbytes > DEFAULT_LIMIT_BYTES:
        _set_max_dynamic(cufunc, nbytes)


def function_attributes(dispatcher, args) -> dict:
    """Registers, static shared and local memory per thread of the overload for ``args`` (GPU only)."""
    if _backend.is_simulator():
        return {}
    kernel = dispatcher._compile_for_args(*args)
    a = kernel._codelibrary.get_cufunc().attrs
    return {
        "regs": int(a.regs),
        "static_smem": int(a.shared),
        "local_bytes": int(a.local),
        "max_threads": int(a.maxthreads),
    }
