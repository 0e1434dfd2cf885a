"""Replaying a forward's launches: the host path of a call whose arguments were seen before (opt-in).

Why it exists: with the direct launches (:mod:`numba_flash.fast._direct`) an eager ``flash_attn_func`` forward
still spends 120-137 us of an H200's host time a call (SDPA: 13-18 us), in the Python between the call and its one
kernel launch: resolving the kernel, the allocator, the conversions to kernel arrays, the plan, four allocations,
the launch arguments (``docs/results/sweeps/host_layers_h200_e02c4ff.txt``). At N = 512 the half forward's kernel
is faster than SDPA memory-efficient's, and the call is slower only by that host time.

What it does (``NUMBA_FLASH_REPLAY=1``, or :data:`ENABLED`): the first eager forward of a *call key* runs as
always, and records what reached the GPU: the outputs the :class:`~numba_flash._launch.Allocator` allocated
(shape, dtype, fill) and every direct launch (function, launch configuration, the marshalled kernel arguments and
where in them each array's data pointer sits). The recording becomes a *recipe* when every array of every launch is
one of the call's inputs (the same memory as q, k or v) or one of the recorded allocations, and every output the
call returns is one of the allocations (or a dtype view of one). A later call with the same key replays the recipe:
it allocates the outputs, writes the new data pointers into a copy of the recorded arguments and launches. The key
holds everything the normal path decides from: the checked :class:`~numba_flash._launch.Problem` (shapes, scale,
causal, dropout, seed), the kernel's names and tile override, and per input its dtype, shape, strides, device and
data pointer modulo 16 (the ``cp.async`` path needs 16-byte rows).

Where it applies: eager forwards (not while ``torch.compile`` traces) of a kernel module that declares
``REPLAYABLE = True`` (its forward does nothing on the GPU but allocate through the allocator and launch through
:func:`numba_flash.fast._smem.launch`: the FA2 forwards), on CUDA tensors, on a stream the normal path would not join to the launches' (torch's default), without
dropout (a dropout call draws a new seed, which would be a new key every call), outside
:func:`~numba_flash._launch.poison_outputs`. Anything else runs the normal path, as does a key whose recording
was not a recipe (it is remembered as such and not recorded again). A recording in which a launch went through
numba (the first launch of a kernel for its argument types does) is dropped, and the next call records again.
"""

from __future__ import annotations

import os
import threading

#: Whether eager forwards are recorded and replayed (``NUMBA_FLASH_REPLAY=1``; off by default until timed on a GPU).
ENABLED = os.environ.get("NUMBA_FLASH_REPLAY", "0") not in ("", "0")

#: Keys remembered at most (a process that sees ever new shapes drops its oldest recipes first)
MAX_RECIPES = 1024

_recipes: dict = {}  # call key -> _Recipe, or None where the recording was not replayable
_local = threading.local()  # .recorder: the _Recorder of the call this thread is recording, or None


class _Recorder:
    """What one call put on the GPU, in order."""

    def __init__(self):
        self.allocations = []  # (tensor, shape, torch dtype, fill or None)
        self.launches = []  # (cuda.core's launch, stream, kernel, config, kernelargs, [(data pointer position, value)])
        self.numba_launched = False  # a launch went through numba: record the key again on its next call


def active():
    """The recorder of the call this thread is recording, or None (the allocator's and the launcher's hook)."""
    return getattr(_local, "recorder", None)


def allocation(t, fill) -> None:
    """Record an output the allocator made (``fill`` None: ``torch.empty``, else ``torch.full`` with that value), where
    this thread records a call (else nothing)."""
    rec = active()
    if rec is not None:
        rec.allocations.append((t, tuple(t.shape), t.dtype, fill))


def launch(core_launch, stream, kernel, config, kernelargs, pointer_slots) -> None:
    """Record a direct launch, ``core_launch(stream, config, kernel, *kernelargs)`` (:mod:`numba_flash.fast._direct`):
    ``kernelargs`` as marshalled, ``pointer_slots`` the (position, value) of each array's data pointer in them."""
    _local.recorder.launches.append((core_launch, stream, kernel, config, list(kernelargs), pointer_slots))


def numba_launched() -> None:
    """Note that a launch of the recorded call went through numba (the first launch of an argument key always does,
    :mod:`numba_flash.fast._direct`): the recording is dropped and the key recorded again on its next call. Nothing
    where this thread records no call."""
    rec = active()
    if rec is not None:
        rec.numba_launched = True


class _Recipe:
    """Outputs to allocate and launches to repeat with new data pointers."""

    def __init__(self, allocations, launches, outputs):
        self.allocations = allocations  # (shape, torch dtype, fill or None)
        self.launches = launches  # (launch, stream, kernel, config, kernelargs template, [(position, ("in", i) or ("out", j))])
        self.outputs = outputs  # per returned output: (allocation index, dtype to view it as, or None)


def call_key(prob, q, k, v, kernel, br: int, bc: int):
    """The key of an eager forward, or None where this module does not take the call (see the module docstring; the
    caller leaves out calls made while poisoning outputs or from a stream the normal path would join,
    :func:`numba_flash._launch.streams_to_join`)."""
    if not ENABLED or prob.dropout_p > 0 or not getattr(kernel.module, "REPLAYABLE", False) or not q.is_cuda:
        return None
    per_input = tuple((x.dtype, x.shape, x.stride(), x.device, x.data_ptr() % 16) for x in (q, k, v))
    return prob, kernel.algorithm, kernel.variant, br, bc, per_input


def replay(key, q, k, v):
    """The outputs of the recipe for ``key`` run on q, k, v; None where there is none (record the call instead)."""
    recipe = _recipes.get(key, False)
    if recipe is None or recipe is False:
        return None
    import torch

    device = q.device
    allocs = [torch.empty(shape, dtype=dt, device=device) if fill is None else torch.full(shape, fill, dtype=dt, device=device)
              for shape, dt, fill in recipe.allocations]
    inputs = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    with torch.cuda.device(device):
        for core_launch, stream, kernel, config, template, slots in recipe.launches:
            args = list(template)
            for pos, (role, i) in slots:
                args[pos] = inputs[i] if role == "in" else allocs[i].data_ptr()
            core_launch(stream, config, kernel, *args)
    return tuple(allocs[a] if view is None else allocs[a].view(view) for a, view in recipe.outputs)


def recording(key):
    """A context that records the call of ``key`` (nothing when ``key`` is None or already decided)."""
    return _Recording(key if key is not None and key not in _recipes else None)


class _Recording:
    def __init__(self, key):
        self.key = key

    def __enter__(self):
        if self.key is not None:
            _local.recorder = _Recorder()
        return self

    def __exit__(self, *exc):
        if self.key is not None:
            _local.recorder = None

    def finish(self, inputs, outputs) -> None:
        """Turn the recording into the key's recipe (or None), given the call's inputs and returned outputs."""
        if self.key is None:
            return
        rec = _local.recorder
        if not rec.numba_launched:
            if len(_recipes) >= MAX_RECIPES:
                del _recipes[next(iter(_recipes))]
            _recipes[self.key] = _recipe(rec, inputs, outputs)


def _recipe(rec: _Recorder, inputs, outputs):
    """The recipe of a recording, or None where some array is neither an input nor a recorded allocation."""
    in_ptrs = [x.data_ptr() for x in inputs]
    alloc_ptrs = [t.data_ptr() for t, *_ in rec.allocations]
    if len(set(in_ptrs + alloc_ptrs)) != len(in_ptrs) + len(alloc_ptrs):
        return None  # Dev: two inputs (or an input and an output) share memory: a pointer names no one role

    def role(ptr):
        if ptr in in_ptrs:
            return "in", in_ptrs.index(ptr)
        if ptr in alloc_ptrs:
            return "out", alloc_ptrs.index(ptr)
        return None

    launches = []
    for core_launch, stream, kernel, config, kernelargs, slots in rec.launches:
        roles = [(pos, role(ptr)) for pos, ptr in slots]
        if any(r is None for _, r in roles):
            return None
        launches.append((core_launch, stream, kernel, config, kernelargs, roles))
    outs = []
    for t in outputs:
        r = role(t.data_ptr())
        if r is None or r[0] != "out":
            return None
        a = rec.allocations[r[1]][0]
        same = t.shape == a.shape if t.dtype == a.dtype else t.numel() * t.element_size() == a.numel() * a.element_size()
        if not same:  # Dev: a part of an allocation, not the whole of it (or all of it in another dtype)
            return None
        outs.append((r[1], None if t.dtype == a.dtype else t.dtype))
    if not launches:
        return None
    return _Recipe([(shape, dt, fill) for _, shape, dt, fill in rec.allocations], launches, outs)
