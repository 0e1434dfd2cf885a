"""Launching a compiled kernel on torch CUDA tensors without numba's per-launch host work.

Why it exists: at N <= 1k the half forward is host-bound. ``python -m bench.host_layers`` on an H200 (the performance
log's host-path sections) timed one FA2 forward's launch at 94 us of host time through
:func:`numba_flash.runtime.smem.launch` (the opt-in's typing of the 13 arguments, then numba's dispatcher: 53 us),
46 us through the compiled overload's own ``launch`` (numba's argument marshalling), and 9 us for cuda.core's
``launch`` on marshalled arguments; and each ``cuda.as_cuda_array`` of a tensor (seven a forward) at 13 us.

What it does: numba passes an array argument to a kernel as its array struct, ``(meminfo, parent, nitems,
itemsize, data, *shape, *strides)`` (meminfo and parent 0, strides in bytes), and a scalar as its C value. The
first launch of a kernel for a given *key* goes through numba (typing, compiling, launching), and the compiled
overload is cached under that key with one marshaller per argument. The key is computed without typing: a
C-contiguous tensor's ``(dtype, ndim)`` (numba types it ``Array(dtype, ndim, "C")``, its CUDA array interface
having no strides), any other tensor's ``(dtype, shape, strides)``, a scalar's Python type (an int's also whether it
fits int64). Later launches with the same key build the struct from the tensors' ``data_ptr``, shape and strides
and call cuda.core's ``launch`` on numba's stream 0, as numba's own launch does. Nothing is converted, so the
torch tensors are the kernel arrays (:class:`numba_flash._launch.Allocator` hands them over as they are).

A launch this module does not take (an argument that is neither a CUDA tensor nor a Python or NumPy scalar,
a compiled overload whose argument types differ from those the key implies, a debug build) goes through numba,
as before. ``NUMBA_FLASH_DIRECT_LAUNCH=0`` turns it off (``ENABLED``), for timing against numba's path.

Packed launches (:class:`PackedLaunch`), for :mod:`numba_flash.runtime.replay`'s recipes: cuda.core's ``launch``
converts every argument to its C value on every call (a 4-D array is 13 of them; a forward launch has about 100),
9-14 us of an H100 host's time. A recorded launch is converted once instead: each argument becomes a ctypes value
of the C type cuda.core would give it (a Python int an ``intptr_t``, a float a ``double``, a ctypes value its own
type), the pointers to them one ``void*`` array, and a replay writes its new data pointers into those values and
calls the driver's ``cuLaunchKernel`` on the same function, stream, grid, block and shared-memory size.
``NUMBA_FLASH_PACKED_LAUNCH=0`` (``PACKED``) keeps cuda.core's launch for replays too.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import numpy as np

from . import backend as _backend
from . import replay as _replay

#: Whether :func:`launch` takes launches at all (``NUMBA_FLASH_DIRECT_LAUNCH=0``: never; numba launches).
ENABLED = os.environ.get("NUMBA_FLASH_DIRECT_LAUNCH", "1") not in ("", "0")

#: Whether replayed launches are packed once and launched through the driver (``NUMBA_FLASH_PACKED_LAUNCH=0``: never).
PACKED = os.environ.get("NUMBA_FLASH_PACKED_LAUNCH", "1") not in ("", "0")

# (dispatcher, device, argument keys) -> (cufunc, marshallers), or None where numba must launch
_entries: dict = {}
_configs: dict = {}
_c_strides: dict = {}
_core = None  # (cuda.core's launch, LaunchConfig builder, numba's stream 0), on first use
_driver = None  # (cuLaunchKernel, cuGetErrorName) of the driver library on first use; False where it cannot be loaded

_INT64 = (-(2**63), 2**63)


def _is_cuda_tensor(a) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor) and a.is_cuda


def _arg(a):
    """``(key, value)`` of one argument: its launch-cache key and what its marshaller takes (a tensor's array struct,
    a scalar itself); ``(None, None)`` for an argument this module does not take. A tensor is read once, here."""
    ta = type(a)
    if ta is float or ta is bool:
        return ta, a
    if ta is int:
        return (int, _INT64[0] <= a < _INT64[1]), a
    if isinstance(a, np.generic):
        return ta, a
    if not _is_cuda_tensor(a) or a.requires_grad:
        return None, None
    if a.is_contiguous():
        return (a.dtype, a.dim()), array_struct(a, True)
    return (a.dtype, tuple(a.shape), a.stride()), array_struct(a, False)


def c_strides(shape, itemsize: int) -> tuple:
    """Byte strides of a C-contiguous array of ``shape``: what numba passes for an array without strides."""
    key = (tuple(shape), itemsize)
    s = _c_strides.get(key)
    if s is None:
        acc, out = itemsize, []
        for n in reversed(key[0]):
            out.append(acc)
            acc *= n
        s = _c_strides[key] = tuple(reversed(out))
    return s


def array_struct(t, contiguous: bool) -> tuple:
    """The kernel argument numba builds for the array ``t`` (a torch tensor): ``(meminfo, parent, nitems, itemsize,
    data, *shape, *strides)`` with byte strides (C strides where ``contiguous``, as for an interface without them)."""
    itemsize = t.element_size()
    n = t.numel()
    shape = tuple(t.shape)
    strides = c_strides(shape, itemsize) if contiguous else tuple(s * itemsize for s in t.stride())
    return (0, 0, n, itemsize, t.data_ptr() if n else 0, *shape, *strides)


def _marshaller(ty, key):
    """A function ``(value, kernelargs) -> None`` that appends one argument of numba type ``ty`` the way numba's
    ``_Kernel._prepare_args`` does; None where ``ty`` is not what ``key`` implies or not a type handled here."""
    from numba.cuda import types

    if isinstance(key, tuple) and key[0] is not int:  # a tensor: its value is its array struct (_arg)
        contiguous = len(key) == 2
        if not isinstance(ty, types.Array) or (contiguous and (ty.layout != "C" or ty.ndim != key[1])):
            return None
        return lambda struct, out: out.extend(struct)
    if isinstance(ty, types.Integer):
        cls = getattr(ctypes, f"c_{ty}")
        return lambda v, out: out.append(cls(v))
    if ty == types.float64:
        return lambda v, out: out.append(ctypes.c_double(v))
    if ty == types.float32:
        return lambda v, out: out.append(ctypes.c_float(v))
    if ty == types.boolean:
        return lambda v, out: out.append(v)
    return None


def _entry(dispatcher, args):
    """(cufunc, marshallers) of the overload numba compiled for ``args``, or None where this module cannot launch it."""
    kernel = dispatcher._compile_for_args(*args)
    if getattr(kernel, "debug", False) or len(kernel.argument_types) != len(args):
        return None
    marshallers = []
    for ty, a in zip(kernel.argument_types, args):
        m = _marshaller(ty, _arg(a)[0])
        if m is None:
            return None
        marshallers.append(m)
    return kernel._codelibrary.get_cufunc(), tuple(marshallers)


def _launch_core():
    global _core
    if _core is None:
        from numba.cuda._compat import CUDA_CORE_GE_1_0
        from numba.cuda.cudadrv import driver
        from numba.cuda.dispatcher import LaunchConfig, launch

        coop = "is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch"
        _core = (
            launch,
            lambda grid, block, nbytes: LaunchConfig(grid=grid, block=block, shmem_size=nbytes, **{coop: False}),
            driver._to_core_stream(0),
        )
    return _core


def launch(dispatcher, grid, block, nbytes: int, args, opt_in) -> bool:
    """Launch ``dispatcher[grid, block, 0, nbytes](*args)`` directly; False (nothing launched) where this module
    does not take the launch. ``opt_in(cufunc, nbytes)`` sets the > 48 KB attribute (once per function and size)."""
    if not ENABLED:
        return False
    keys, values = [], []
    device = None
    for a in args:
        k, value = _arg(a)
        if k is None:
            return False
        if device is None and type(k) is tuple and k[0] is not int:
            device = a.get_device()
        keys.append(k)
        values.append(value)
    if device is None or not _backend.bind_context(device):
        return False
    key = (dispatcher, device, tuple(keys))
    entry = _entries.get(key, False)
    if entry is False:  # the first launch for this key: numba's own path decides the types
        entry = _entries[key] = _entry(dispatcher, args)
        return False
    if entry is None:
        return False
    cufunc, marshallers = entry
    opt_in(cufunc, nbytes)
    kernelargs = []
    recording = _replay.active() is not None
    slots = []  # (position of an array's data pointer in kernelargs, its value), for a recorded call (runtime/replay)
    for m, value in zip(marshallers, values):
        if recording and type(value) is tuple:
            slots.append((len(kernelargs) + 4, value[4]))
        m(value, kernelargs)
    core_launch, make_config, stream = _launch_core()
    ckey = (grid, block, nbytes)
    config = _configs.get(ckey)
    if config is None:
        config = _configs[ckey] = make_config(grid, block, nbytes)
    core_launch(stream, config, cufunc.kernel, *kernelargs)
    if recording:
        _replay.launch(
            core_launch,
            stream,
            cufunc.kernel,
            config,
            kernelargs,
            slots,
            packer=lambda args, positions: packed_launch(cufunc.kernel, stream, grid, block, nbytes, args, positions),
        )
    return True


# [doc:packed-launch]
def _c_value(a):
    """The ctypes value cuda.core's launch passes for the kernel argument ``a`` (a Python int, bool included, as an
    ``intptr_t``; a float as a ``double``; a ctypes value as itself), a fresh one; None for any other type."""
    if type(a) is int or type(a) is bool:
        return ctypes.c_int64(a)  # Dev: a 64-bit host: cuda.core's intptr_t
    if type(a) is float:
        return ctypes.c_double(a)
    if isinstance(a, ctypes._SimpleCData):
        return type(a)(a.value)
    return None


def _dim3(x) -> tuple:
    t = (x,) if isinstance(x, int) else tuple(x)
    return t + (1,) * (3 - len(t))


def _load_driver():
    """``(cuLaunchKernel, cuGetErrorName)`` from the CUDA driver library with their C signatures; False where the
    library or a symbol is missing (replays then launch through cuda.core)."""
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
            fn, name = lib.cuLaunchKernel, lib.cuGetErrorName
        except (OSError, AttributeError):
            _driver = False
        else:
            u, p = ctypes.c_uint, ctypes.c_void_p
            fn.argtypes = [p, u, u, u, u, u, u, u, p, p, p]  # f, grid xyz, block xyz, shared bytes, stream, params,
            # extra
            fn.restype = ctypes.c_int
            name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            name.restype = ctypes.c_int
            _driver = (fn, name)
    return _driver


class PackedLaunch:
    """One recorded launch with its arguments converted once: ``launch(pointers)`` writes ``pointers`` (the new data
    pointers, in the order of ``positions``) into their C values and calls ``cuLaunchKernel``. ``values`` are the
    arguments' ctypes values (:func:`_c_value`), ``positions`` the indices of the data pointers among them."""

    def __init__(self, kernel, handle: int, stream_handle: int, grid, block, nbytes: int, values, positions, driver):
        self.kernel = kernel
        self.values = values  # Dev: kept alive: params points into them
        self.params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))  # void* per argument
        self._slots = [values[p] for p in positions]
        self._launch, self._error_name = driver
        self._args = (handle, *_dim3(grid), *_dim3(block), nbytes, stream_handle, self.params, None)
        self._lock = threading.Lock()  # Dev: two threads replaying one recipe must not interleave writes and launch

    def __call__(self, pointers) -> None:
        with self._lock:
            for slot, ptr in zip(self._slots, pointers):
                slot.value = ptr
            rc = self._launch(*self._args)
        if rc:
            name = ctypes.c_char_p()
            self._error_name(rc, ctypes.byref(name))
            raise RuntimeError(f"cuLaunchKernel of a replayed launch failed: {(name.value or b'?').decode()} ({rc})")


def packed_launch(kernel, stream, grid, block, nbytes: int, kernelargs, positions):
    """A :class:`PackedLaunch` of ``cuda.core.launch(stream, config(grid, block, nbytes), kernel, *kernelargs)``,
    ``positions`` the data pointers' indices in ``kernelargs``; None where :data:`PACKED` is off, the driver library
    cannot be loaded, a handle cannot be read or an argument has a type :func:`_c_value` does not convert."""
    if not PACKED:
        return None
    driver = _load_driver()
    values = [_c_value(a) for a in kernelargs]
    if not driver or any(v is None for v in values):
        return None
    try:
        handle, stream_handle = int(kernel.handle), int(stream.handle)
    except (AttributeError, TypeError, ValueError):
        return None
    return PackedLaunch(kernel, handle, stream_handle, grid, block, nbytes, values, positions, driver)


# [/doc:packed-launch]
