"""Replaying a pass's launches: the host path of an eager call whose arguments were seen before.

Why it exists: with the direct launches (:mod:`numba_flash.runtime.direct`) an eager ``flash_attn_func`` forward
still spent 120-158 us of host time a call (SDPA: 13-18 us), in the Python between the call and its one kernel
launch: resolving the kernel, the allocator, the conversions to kernel arrays, the plan, four allocations, the
launch arguments (``python -m bench.host_layers``, H200). At N = 512 the half forward's kernel is
faster than SDPA memory-efficient's, and the call was slower only by that host time. Replayed, the forward takes
65-70 us of an H100's host time and the bf16 forward at N = 512-2k gains 0.06-0.09 ms a call
(``bench.host_layers`` and ``run_pending.sh short_replay``; the performance log has the runs).

What it does (on by default; ``NUMBA_FLASH_REPLAY=0`` or :data:`ENABLED` turns it off): the first eager pass (the
forward, or the backward of an eager training call) of a *call key* runs as always, and records what reached the
GPU, in order: the outputs the :class:`~numba_flash._launch.Allocator` allocated (shape, dtype, fill), every direct
launch (function, launch configuration, the marshalled kernel arguments and where in them each array's data pointer
sits) and every dtype conversion of a result (the float32 dQ of an atomic half backward converted to the input
dtype). The recording becomes a *recipe* when every array of every launch is one of the call's inputs (the same
memory as q, k, v, or the backward's dO, O and statistics) or one of the arrays the call made before it, every
conversion converts such an array, and every output the call returns is one of them (or a dtype view of one). A
later call with the same key replays the recipe: it allocates, writes the new data pointers into the recorded
arguments, launches and converts, in the recorded order. A direct launch's arguments are packed once, when the recipe
is made (:class:`numba_flash.runtime.direct.PackedLaunch`: the driver's ``cuLaunchKernel`` on C values converted once;
4-14 us less host time a forward than cuda.core's launch on an H100); any other launch gets a copy of its recorded
arguments each time. The key holds everything the normal path decides from: the pass, the checked
:class:`~numba_flash._launch.Problem` (shapes, scale, causal, dropout, seed), the kernel's names and the options (tile
override; the backward's ``deterministic``), and per input its dtype, shape, strides, device and data pointer modulo 16
(the ``cp.async`` path needs 16-byte rows).

Where it applies: eager passes (not while ``torch.compile`` traces) of a kernel module that declares
``REPLAYABLE = True`` (its pass does nothing on the GPU but allocate through the allocator and launch through
:func:`numba_flash.runtime.smem.launch`: the FA2 forwards and backwards), on CUDA tensors, on a stream the normal
path would not join to the launches' (torch's default), without dropout (a dropout call draws a new seed, which
would be a new key every call), outside :func:`~numba_flash._launch.poison_outputs`. Anything else runs the normal
path, as does a key whose recording was not a recipe (an input the normal path copies first, such as a half tensor
at an odd offset: it is remembered as such and not recorded again). A recording in which a launch went through
numba (the first launch of a kernel for its argument types does) is dropped, and the next call records again.
"""

from __future__ import annotations

import os
import threading

from . import backend as _backend

#: Whether eager passes are recorded and replayed (on unless ``NUMBA_FLASH_REPLAY=0``; timed on an H100 2026-11-26).
ENABLED = os.environ.get("NUMBA_FLASH_REPLAY", "1") not in ("", "0")

#: Keys remembered at most (a process that sees ever new shapes drops its oldest recipes first)
MAX_RECIPES = 1024

_recipes: dict = {}  # call key -> _Recipe, or None where the recording was not replayable
_local = threading.local()  # .recorder: the _Recorder of the call this thread is recording, or None


class _Recorder:
    """What one call put on the GPU, in order: ``steps`` of ("alloc", tensor, fill or None), ("launch", cuda.core's
    launch, stream, kernel, config, kernelargs, [(data pointer position, value)], packer or None) and ("convert",
    source, result)."""

    def __init__(self):
        self.steps = []
        self.numba_launched = False  # a launch went through numba: record the key again on its next call


def active():
    """The recorder of the call this thread is recording, or None (the allocator's and the launcher's hook)."""
    return getattr(_local, "recorder", None)


def allocation(t, fill) -> None:
    """Record an output the allocator made (``fill`` None: ``torch.empty``, else ``torch.full`` with that value), where
    this thread records a call (else nothing)."""
    rec = active()
    if rec is not None:
        rec.steps.append(("alloc", t, fill))


def conversion(source, result) -> None:
    """Record ``result = source.to(result.dtype)`` (the allocator returning a float32 result in the input's dtype),
    where this thread records a call and ``result`` is a new tensor (else nothing)."""
    rec = active()
    if rec is not None and result is not source:
        rec.steps.append(("convert", source, result))


def launch(core_launch, stream, kernel, config, kernelargs, pointer_slots, packer=None) -> None:
    """Record a direct launch, ``core_launch(stream, config, kernel, *kernelargs)`` (:mod:`numba_flash.runtime.direct`):
    ``kernelargs`` as marshalled, ``pointer_slots`` the (position, value) of each array's data pointer in them.
    ``packer(kernelargs, positions)``: the launch packed once (a callable of the new data pointers), or None."""
    _local.recorder.steps.append(
        ("launch", core_launch, stream, kernel, config, list(kernelargs), pointer_slots, packer)
    )


def numba_launched() -> None:
    """Note that a launch of the recorded call went through numba (the first launch of an argument key always does,
    :mod:`numba_flash.runtime.direct`): the recording is dropped and the key recorded again on its next call. Nothing
    where this thread records no call."""
    rec = active()
    if rec is not None:
        rec.numba_launched = True


class _Recipe:
    """What to redo, in order, with new data pointers: ``steps`` of ("alloc", shape, torch dtype, fill or None),
    ("launch", launcher, [(position, ("in", i) or ("made", j))]) and ("convert", j, torch dtype), where ``made`` j is
    the j-th array an "alloc" or a "convert" step made and ``launcher(pointers)`` launches with the new data pointers
    (in the order of the positions): a packed launch, or a :class:`_CoreLaunch`."""

    def __init__(self, steps, outputs):
        self.steps = steps
        self.outputs = outputs  # per returned output: (index of a made array, dtype to view it as, or None)


class _CoreLaunch:
    """A recorded launch redone through the launch function it was made with: ``launch(pointers)`` copies the recorded
    arguments, writes the new data pointers at ``positions`` and calls ``core_launch(stream, config, kernel,
    *args)``."""

    def __init__(self, core_launch, stream, kernel, config, template, positions):
        self.core_launch, self.stream, self.kernel, self.config = core_launch, stream, kernel, config
        self.template, self.positions = template, positions

    def __call__(self, pointers) -> None:
        args = list(self.template)
        for pos, ptr in zip(self.positions, pointers):
            args[pos] = ptr
        self.core_launch(self.stream, self.config, self.kernel, *args)


def call_key(pass_name: str, prob, inputs, kernel, *options):
    """The key of an eager pass (``"forward"`` on (q, k, v), ``"backward"`` on (dO, q, k, v, O, L, m, l)), or None
    where this module does not take the call (see the module docstring; the caller leaves out calls made while
    poisoning outputs or from a stream the normal path would join, :func:`numba_flash._launch.streams_to_join`)."""
    if not ENABLED or prob.dropout_p > 0 or not getattr(kernel.module, "REPLAYABLE", False) or not inputs[0].is_cuda:
        return None
    per_input = tuple((x.dtype, x.shape, x.stride(), x.device, x.data_ptr() % 16) for x in inputs)
    return pass_name, prob, kernel.algorithm, kernel.variant, options, per_input


def replay(key, inputs):
    """The outputs of the recipe for ``key`` run on ``inputs``; None where there is none (record the call instead)."""
    recipe = _recipes.get(key, False)
    if recipe is None or recipe is False:
        return None
    import torch

    device = inputs[0].device
    if not _backend.bind_context(device.index):  # Dev: the replay's launches need the context current on this thread
        return None
    in_ptrs = [x.data_ptr() for x in inputs]
    made = []
    with torch.cuda.device(device):
        for step in recipe.steps:
            if step[0] == "alloc":
                _, shape, dt, fill = step
                made.append(
                    torch.empty(shape, dtype=dt, device=device)
                    if fill is None
                    else torch.full(shape, fill, dtype=dt, device=device)
                )
            elif step[0] == "launch":
                _, launcher, slots = step
                launcher([in_ptrs[i] if role == "in" else made[i].data_ptr() for _, (role, i) in slots])
            else:  # "convert"
                made.append(made[step[1]].to(step[2]))
    return tuple(made[j] if view is None else made[j].view(view) for j, view in recipe.outputs)


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
    """The recipe of a recording, or None where some array is neither an input nor one the call made before it."""
    in_ptrs = [x.data_ptr() for x in inputs]
    made = []  # the tensors the "alloc" and "convert" steps made, in order
    steps = []

    def role(ptr):
        if ptr in in_ptrs:
            return "in", in_ptrs.index(ptr)
        for j, t in enumerate(made):
            if t.data_ptr() == ptr:
                return "made", j
        return None

    for step in rec.steps:
        if step[0] == "alloc":
            _, t, fill = step
            made.append(t)
            steps.append(("alloc", tuple(t.shape), t.dtype, fill))
        elif step[0] == "launch":
            _, core_launch, stream, kernel, config, kernelargs, slots, packer = step
            roles = [(pos, role(ptr)) for pos, ptr in slots]
            if any(r is None for _, r in roles):
                return None
            positions = [pos for pos, _ in slots]
            launcher = packer(kernelargs, positions) if packer is not None else None
            if launcher is None:
                launcher = _CoreLaunch(core_launch, stream, kernel, config, kernelargs, positions)
            steps.append(("launch", launcher, roles))
        else:  # "convert"
            _, source, result = step
            r = role(source.data_ptr())
            if r is None or r[0] != "made" or (made[r[1]].shape, made[r[1]].dtype) != (source.shape, source.dtype):
                return None  # Dev: only a whole array the call made is converted by a replay
            made.append(result)
            steps.append(("convert", r[1], result.dtype))
    ptrs = in_ptrs + [t.data_ptr() for t in made]
    if len(set(ptrs)) != len(ptrs):
        return None  # Dev: two inputs (or an input and an output) share memory: a pointer names no one role
    if not any(step[0] == "launch" for step in steps):
        return None
    outs = []
    for t in outputs:
        r = role(t.data_ptr())
        if r is None or r[0] != "made":
            return None
        a = made[r[1]]
        same = (
            t.shape == a.shape if t.dtype == a.dtype else t.numel() * t.element_size() == a.numel() * a.element_size()
        )
        if not same:  # Dev: a part of an array the call made, not the whole of it (or all of it in another dtype)
            return None
        outs.append((r[1], None if t.dtype == a.dtype else t.dtype))
    return _Recipe(steps, outs)
