"""Launching a compiled kernel on torch CUDA tensors without numba's per-launch host work.

Why it exists: at N <= 1k the half forward is host-bound. ``python -m bench.host_layers`` (H200, commit 1c20667,
``docs/results/sweeps/host_layers_h200_1c20667.txt``) timed one FA2 forward's launch at 94 us of host time through
:func:`numba_flash.fast._smem.launch` (the opt-in's typing of the 13 arguments, then numba's dispatcher: 53 us),
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
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

from . import _replay

#: Whether :func:`launch` takes launches at all (``NUMBA_FLASH_DIRECT_LAUNCH=0``: never; numba launches).
ENABLED = os.environ.get("NUMBA_FLASH_DIRECT_LAUNCH", "1") not in ("", "0")

# (dispatcher, device, argument keys) -> (cufunc, marshallers), or None where numba must launch
_entries: dict = {}
_configs: dict = {}
_c_strides: dict = {}
_core = None  # (cuda.core's launch, LaunchConfig builder, numba's stream 0), on first use

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
        _core = (launch, lambda grid, block, nbytes: LaunchConfig(grid=grid, block=block, shmem_size=nbytes, **{coop: False}),
                 driver._to_core_stream(0))
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
    if device is None:
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
    slots = []  # (position of an array's data pointer in kernelargs, its value), for a recorded call (fast/_replay)
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
        _replay.launch(core_launch, stream, cufunc.kernel, config, kernelargs, slots)
    return True
