"""The one patch layer over Numba's CUDA simulator: a locked shared-array allocation (a numba-cuda 0.30
race), and the hooks the tests and the tutorials' graders build on.

Everything here that changes the simulator lives in this module, so there is one place to review when
numba-cuda changes (the lock checks the upstream method's source hash; the hooks below are scoped to a
``with`` block, or installed once, idempotently). What the tools need:

* :func:`poisoned_shared_memory`: shared arrays (static and dynamic) start full of NaN (integers: all
  bits set), so a read before a write fails a test;
* :func:`watch_shared_arrays`: every static shared array a launch declares is handed to a wrapper (the
  graders' race detector, ``tutorials/assignments/grading.py``);
* :func:`record_shared_memory`: the static and dynamic shared memory of each simulated block;
* :func:`install_barrier_epochs`: each simulated thread counts the barriers it has passed
  (``thread._nf_epoch``), which the race detector compares;
* :func:`route_atomic_add`: ``cuda.atomic.add`` on an object of a given class calls its ``atomic_add``
  (the graders' counting arrays);
* :func:`one_thread_at_a_time`: a fixed, adversarial schedule that runs a block's threads one at a time
  between barriers, with shared memory poisoned, so a missing barrier fails every run (the tests'
  barrier checker, ``tests/kernels/test_barriers.py``).

:data:`GRADER_SAFE` names the functions of this module that run inside a graded submission's kernel
(the allocation, the barrier count, the atomic routing): the graders' call tripwire
(``tutorials/assignments/guard.py``) lets exactly these through, and flags any other call into the
package.

The lock
--------

The bug. Numba's CUDA simulator runs every CUDA thread of a block as a Python thread. Each thread's
``cuda.shared.array(shape, dtype)`` call goes to ``FakeCUDAShared.array`` (numba-cuda 0.30.4,
``numba/cuda/simulator/kernelapi.py``, lines 112-136), which keys the launch's arrays by the calling
source line and does a check-then-insert on a plain dict with no lock::

    res = self._allocations.get(caller)
    if res is None:
        res = np.empty(shape, dtype)
        self._allocations[caller] = res
    return res

When the interpreter switches threads between the ``get`` and the insert, two threads of one block
both find no array, each allocates its own, and the later insert wins: the first thread keeps a
private "shared" array that no other thread writes or reads. A correct kernel then gives wrong,
uninitialised-looking results now and then (the standard backward's ``dk`` off by 7e23). Only the
first block of a launch can lose (later blocks find every key), and dynamic shared memory
(``cuda.shared.array(0, ...)``, one buffer made in ``__init__``) is not affected; local arrays are
per thread and constant arrays are the host array itself, so neither has the pattern.
``docs/notes/numba-cuda-shared-array-race.md`` is the upstream report, with measurements.

The fix. :func:`locked_shared_array` is ``FakeCUDAShared.array`` with the lookup and the insert under
one lock; :func:`install` puts it on the class. It replaces the method rather than wrapping it because
the original identifies the declaration by its *caller's* frame: a wrapper would become that caller
and every declaration would alias. It reads the caller as ``sys._getframe(1)``'s file and line, the
same key ``traceback.extract_stack(...)[-2][0:2]`` gives, without formatting the whole stack.

When. Importing ``numba.cuda`` costs about a second, and ``import numba_flash`` must stay cheap and
must not import it before the backend is chosen. So :mod:`numba_flash.runtime.backend`, once it has chosen
the simulator, calls :func:`install_on_import`: if the simulator's ``kernelapi`` is already imported it
is patched now, otherwise a meta-path finder patches it right after its first import, by whoever
imports it (numba-flash's kernels, the tutorials, a student's kernel). Anything that does
``import numba_flash`` first (as the tests, tutorials and autograders do) runs with the lock.

Only the reviewed upstream method is replaced: :func:`install` compares a hash of its source with the
versions listed in :data:`REVIEWED_SOURCE_SHA256`. A numba-cuda release that changes it is left
alone, with a :class:`RuntimeWarning`, and :func:`simulator_patch_installed` is then False, which
``tests/test_simulator_race.py`` asserts: the suite fails instead of silently running unpatched.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

#: The simulator module whose ``FakeCUDAShared.array`` is replaced.
KERNELAPI = "numba.cuda.simulator.kernelapi"

#: sha256 of ``inspect.getsource(FakeCUDAShared.array)`` for the numba-cuda versions whose method
#: :func:`locked_shared_array` reproduces (plus the lock). Add a version only after reading its code.
REVIEWED_SOURCE_SHA256 = {
    "46c69699220dd500ba43cd23a5eedb48ea3f2ea602876838c887e592d4055d75": "numba-cuda 0.30.4",
}

# One simulated launch runs at a time (the simulator asserts it), so one lock for all launches costs
# nothing; only the threads of one block contend, once per declaration.
_ALLOCATION_LOCK = threading.Lock()

_kernelapi: ModuleType | None = None  # the patched module; its np, types, numpy_support serve the patch
_original_array = None  # upstream FakeCUDAShared.array, kept for without_patch()
_problem: str | None = "not installed yet: numba.cuda.simulator.kernelapi has not been imported"

# Hooks of the tools above, innermost last (each set by a ``with`` block of this module):
_FILLS: list[Callable] = []  # (shape, dtype) -> a new static array (default: numpy.empty)
_WRAPS: list[Callable] = []  # (array, "file:line") -> what the kernel gets for that static array


def locked_shared_array(self, shape, dtype, alignment=None):
    """``FakeCUDAShared.array`` of numba-cuda 0.30.4 with the check-then-insert under a lock.

    Same behaviour otherwise: ``alignment`` is refused, ``shape == 0`` is a view of the launch's
    dynamic shared memory, and a static array is one NumPy array per launch and calling source line
    (so two declarations on one line still alias, as upstream).
    """
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    api = _kernelapi  # upstream's own imports (numpy, numba.cuda.types, numpy_support)
    np = api.np
    if isinstance(dtype, api.types.Type):
        dtype = api.numpy_support.as_dtype(dtype)
    if shape == 0:
        # Dynamic shared memory: every call views the one buffer made with the launch.
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    frame = sys._getframe(1)  # the kernel line that declares the array
    caller = (frame.f_code.co_filename, frame.f_lineno)
    del frame
    with _ALLOCATION_LOCK:  # the fix: no thread can slip in between the lookup and the insert
        res = self._allocations.get(caller)
        if res is None:
            res = _FILLS[-1](shape, dtype) if _FILLS else np.empty(shape, dtype)
            self._allocations[caller] = res
        if _WRAPS:  # Dev: watch_shared_arrays: one wrapper per declaration and launch
            watched = self.__dict__.setdefault("_nf_watched", {})
            if caller not in watched:
                watched[caller] = _WRAPS[-1](res, f"{Path(caller[0]).name}:{caller[1]}")
            return watched[caller]
    return res


def _source_sha256(fn) -> str | None:
    import hashlib  # here, not at the top: import numba_flash stays cheap
    import inspect

    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def install(kernelapi: ModuleType) -> bool:
    """Put :func:`locked_shared_array` on ``kernelapi.FakeCUDAShared``; idempotent.

    Returns whether the patch is in place. When the simulator's internals are not the reviewed ones
    it patches nothing, warns, and :func:`simulator_patch_problem` says why.
    """
    global _kernelapi, _original_array, _problem
    cls = getattr(kernelapi, "FakeCUDAShared", None)
    current = getattr(cls, "array", None)
    if current is locked_shared_array:
        return True
    if current is None:
        _problem = f"{kernelapi.__name__} has no FakeCUDAShared.array"
    else:
        digest = _source_sha256(current)
        if digest in REVIEWED_SOURCE_SHA256:
            _kernelapi, _original_array = kernelapi, current
            cls.array = locked_shared_array
            _problem = None
            return True
        _problem = (
            f"FakeCUDAShared.array in {getattr(kernelapi, '__file__', kernelapi.__name__)} is not a reviewed version "
            f"(source sha256 {digest}); read it: if upstream locked it, delete numba_flash/runtime/simulator.py; if it "
            "still races "
            "and locked_shared_array still matches it apart from the lock, add its hash to REVIEWED_SOURCE_SHA256"
        )
    warnings.warn(
        f"numba-flash did not lock the CUDA simulator's shared-array allocation: {_problem}",
        RuntimeWarning,
        stacklevel=2,
    )
    return False


def simulator_patch_installed() -> bool:
    """True when the simulator's ``FakeCUDAShared.array`` is :func:`locked_shared_array` now."""
    kernelapi = sys.modules.get(KERNELAPI)
    return (
        kernelapi is not None
        and getattr(getattr(kernelapi, "FakeCUDAShared", None), "array", None) is locked_shared_array
    )


def simulator_patch_problem() -> str | None:
    """Why the patch is not installed (None once it is)."""
    return None if simulator_patch_installed() else _problem


@contextlib.contextmanager
def without_patch() -> Iterator[None]:
    """Run the block with upstream's unlocked allocator, to show the race the patch removes (tests)."""
    if not simulator_patch_installed() or _original_array is None:
        raise RuntimeError(f"the simulator patch is not installed: {simulator_patch_problem()}")
    cls = sys.modules[KERNELAPI].FakeCUDAShared
    cls.array = _original_array
    try:
        yield
    finally:
        cls.array = locked_shared_array


class _PatchAfterExec(importlib.abc.Loader):
    """Wraps kernelapi's loader: runs the module as usual, then installs the patch on it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        install(module)

    def __getattr__(self, name: str):  # get_source, get_filename, ... as the real loader has them
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``numba.cuda.simulator.kernelapi`` through the other finders and wraps its loader.

    numba-cuda's own redirecting finder calls every finder again with the redirected path; the
    ``_searching`` flag makes this one step aside during its own search.
    """

    _searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != KERNELAPI or self._searching:
            return None
        self._searching = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._searching = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchAfterExec(spec.loader)
        return spec


def install_on_import() -> None:
    """Patch the simulator now if it is imported, else right after its first import; idempotent."""
    kernelapi = sys.modules.get(KERNELAPI)
    if kernelapi is not None:
        install(kernelapi)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


# ----------------------------------------------------------------------------------------------
# Hooks for the tests and the graders
# ----------------------------------------------------------------------------------------------
def _kernelapi_module() -> ModuleType:
    """The simulator's kernelapi, with the locked allocation on it (RuntimeError, saying why, where it is not)."""
    from numba.cuda.simulator import kernelapi  # the simulator's own module: only in the simulator

    if not install(kernelapi):
        raise RuntimeError(f"the simulator patch is not installed: {simulator_patch_problem()}")
    return kernelapi


def poison_fill(shape, dtype):
    """A new array full of NaN (floating dtypes) or with all bits set (integers)."""
    import numpy as np

    arr = np.empty(shape, dtype)
    if np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.complexfloating):
        arr.fill(np.nan)
    else:
        arr.view(np.uint8).fill(0xFF)
    return arr


_INIT_HOOKS: list[Callable] = []  # hook(manager) after each FakeCUDAShared.__init__ (one manager per simulated block)


def _shared_init_hooked(self, dynshared_size):
    """``FakeCUDAShared.__init__``, then every hook of :data:`_INIT_HOOKS` on the new manager."""
    _ORIGINAL["shared_init"](self, dynshared_size)
    for hook in _INIT_HOOKS:
        hook(self)


@contextlib.contextmanager
def _shared_init_hook(hook: Callable) -> Iterator[None]:
    """Within the block, ``hook(manager)`` runs after each ``FakeCUDAShared.__init__``."""
    cls = _kernelapi_module().FakeCUDAShared
    if cls.__init__ is not _shared_init_hooked:
        _ORIGINAL["shared_init"] = cls.__init__
        cls.__init__ = _shared_init_hooked
    _INIT_HOOKS.append(hook)
    try:
        yield
    finally:
        _INIT_HOOKS.remove(hook)
        if not _INIT_HOOKS:
            cls.__init__ = _ORIGINAL["shared_init"]


def _poison_dynamic(manager) -> None:
    manager._dynshared.fill(-1)  # all bits set: NaN as float32 / float64


@contextlib.contextmanager
def poisoned_shared_memory() -> Iterator[None]:
    """Within the block, every static shared array and every launch's dynamic shared memory start poisoned
    (:func:`poison_fill`): an element read before any thread wrote it is NaN."""
    _FILLS.append(poison_fill)
    try:
        with _shared_init_hook(_poison_dynamic):
            yield
    finally:
        _FILLS.remove(poison_fill)


@contextlib.contextmanager
def watch_shared_arrays(wrap: Callable) -> Iterator[None]:
    """Within the block, a kernel gets ``wrap(array, "file:line")`` for each static shared array it declares (one
    wrapper per declaration and launch), e.g. an array that checks every access against the barriers."""
    _kernelapi_module()
    _WRAPS.append(wrap)
    try:
        yield
    finally:
        _WRAPS.remove(wrap)


@contextlib.contextmanager
def record_shared_memory() -> Iterator[list]:
    """Measure the static shared memory per block of the kernels launched inside the block (simulator).

    Every simulated block gets a fresh shared-memory manager that keeps one NumPy array per
    ``cuda.shared.array`` source line (plus the dynamic shared memory the launch asked for); this
    records those managers and sums their arrays. On a GPU, ask a compiled kernel instead:
    ``kernel.get_shared_mem_per_block()``.

    Yields a list that, after the block, holds one byte count per block launched. Use ``max(...)``.
    """
    managers: list = []
    sizes: list[int] = []
    with _shared_init_hook(managers.append):
        yield sizes
    for mgr in managers:
        sizes.append(sum(a.nbytes for a in mgr._allocations.values()) + mgr._dynshared_size)


def _syncthreads_counting(self):
    """``BlockThread.syncthreads`` that first counts the barrier in ``self._nf_epoch``."""
    self._nf_epoch = getattr(self, "_nf_epoch", 0) + 1
    _ORIGINAL["syncthreads"](self)


def _atomic_add_routed(self, array, index, val):
    """``FakeCUDAAtomic.add`` that calls ``array.atomic_add(index, val)`` for the classes :func:`route_atomic_add`
    named."""
    if isinstance(array, _ATOMIC_CLASSES):
        return array.atomic_add(index, val)
    return _ORIGINAL["atomic_add"](self, array, index, val)


_ORIGINAL: dict = {}
_ATOMIC_CLASSES: tuple = ()


def install_barrier_epochs() -> None:
    """From now on every simulated thread counts the barriers it passes (``thread._nf_epoch``); idempotent."""
    from numba.cuda.simulator import kernel as simkernel

    _kernelapi_module()
    if simkernel.BlockThread.syncthreads is not _syncthreads_counting:  # Sync: swaps the method, not a barrier call
        _ORIGINAL["syncthreads"] = simkernel.BlockThread.syncthreads  # Sync: swaps the method, not a barrier call
        simkernel.BlockThread.syncthreads = _syncthreads_counting  # Sync: swaps the method, not a barrier call


def route_atomic_add(cls: type) -> None:
    """From now on ``cuda.atomic.add(array, index, val)`` on an instance of ``cls`` calls ``array.atomic_add(index,
    val)`` (a kernel argument that is not a NumPy array reaches the simulated threads as it is); idempotent."""
    global _ATOMIC_CLASSES
    api = _kernelapi_module()
    if api.FakeCUDAAtomic.add is not _atomic_add_routed:
        _ORIGINAL["atomic_add"] = api.FakeCUDAAtomic.add
        api.FakeCUDAAtomic.add = _atomic_add_routed
    if cls not in _ATOMIC_CLASSES:
        _ATOMIC_CLASSES = (*_ATOMIC_CLASSES, cls)


def _one_at_a_time_manager():
    """The simulator's BlockManager subclass behind :func:`one_thread_at_a_time` (built on first use: it needs the
    simulator)."""
    import numpy as np
    from numba.cuda.simulator import kernel as simkernel

    BlockThread = simkernel.BlockThread

    class TurnThread(BlockThread):
        """A simulated CUDA thread that runs only when the manager gives it the turn."""

        def __init__(self, f, manager, blockIdx, threadIdx, debug, yielded):
            super().__init__(f, manager, blockIdx, threadIdx, debug)
            self.turn = threading.Event()
            self.finished = False
            self._yielded = yielded

        def _wait_for_turn(self):
            self.turn.wait()
            self.turn.clear()

        def run(self):
            self._wait_for_turn()
            try:
                if not self.abort:
                    super().run()  # BlockThread.run stores an exception in self.exception
            finally:
                self.finished = True
                self._yielded.set()

        def syncthreads(self):  # Sync: the turn-taking barrier itself (gives the turn back, waits for it)
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            self._yielded.set()  # give the turn back: this thread waits at the barrier
            self._wait_for_turn()
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    class OneAtATimeBlockManager(simkernel.BlockManager):
        """Runs the threads of a block one at a time, in linear thread order, switching at barriers."""

        def run(self, grid_point, *args):
            yielded = threading.Event()

            def target():
                self._f(*args)

            threads = [
                TurnThread(target, self, grid_point, bp, self._debug, yielded) for bp in np.ndindex(*self._block_dim)
            ]
            threads.sort(key=lambda t: t.thread_id)
            for t in threads:
                t.start()
            live = list(threads)
            try:
                while live:
                    for t in live:  # one phase: every live thread runs up to its next barrier (or its end)
                        yielded.clear()
                        t.turn.set()
                        yielded.wait()
                        if t.exception:
                            raise t.exception[0].with_traceback(t.exception[1])
                    live = [t for t in live if not t.finished]
            finally:
                for t in threads:
                    if not t.finished:
                        t.abort = True
                        t.turn.set()
                for t in threads:
                    t.join()

    return OneAtATimeBlockManager


@contextlib.contextmanager
def one_thread_at_a_time() -> Iterator[None]:
    """Within this block, simulated kernels run one thread at a time between barriers, with shared memory poisoned.

    Numba's simulator runs every CUDA thread of a block as a Python thread, and Python switches between
    them every millisecond or so. A kernel that forgets a ``cuda.syncthreads()`` therefore *usually* gets
    away with it (the thread that loads a tile often finishes before another reads it) and fails only now
    and then: a missing barrier is a flaky test, not a failing one. :func:`one_thread_at_a_time` makes it a
    failing one:

    * **A fixed, adversarial schedule.** Inside the context, the threads of a block run strictly one at a
      time, in the order of their linear thread index; a thread runs until it reaches a barrier (or ends),
      then the next one runs. Only when every live thread has reached the barrier does the first one go on.
      This is a schedule a GPU is allowed to choose (nothing orders threads between two barriers), and it
      is the worst one for a missing barrier: thread 0 does *all* of its work up to the next barrier before
      thread 1 does any.
    * **Shared memory poisoned.** Every ``cuda.shared.array`` a launch allocates starts full of NaN
      (integers: all bits set), and so does dynamic shared memory.

    Then, in a kernel:

    * a barrier missing *after* a tile load (``K_j, V_j in SRAM before L8 reads them``) makes thread 0
      read the elements of the tile that threads 1, 2, ... have not loaded yet: NaN on the first tile, the
      previous tile afterwards. The output is wrong on every run;
    * a barrier missing *before* a load (``every thread is done with K_{j-1} before it is overwritten``)
      makes thread 0 overwrite its share of the tile with the next one while threads 1, 2, ... still have
      to read the old one: wrong on every run.

    A kernel with all its barriers computes the same result under any schedule, so a correct kernel passes.
    The schedule also removes the simulator's own race on static shared arrays (two threads allocating one
    declaration at once), since only one thread ever runs.

    It costs nothing on a GPU because it is not used there: the tests that use it are ``simulator_only``.
    """
    from numba.cuda.simulator import kernel as simkernel

    manager = _one_at_a_time_manager()
    call_globals = simkernel.FakeCUDAKernel.__call__.__globals__
    saved = call_globals["BlockManager"]
    call_globals["BlockManager"] = manager
    try:
        with poisoned_shared_memory():
            yield
    finally:
        call_globals["BlockManager"] = saved


#: The functions of this module that run inside a simulated kernel (a graded submission's too): the graders'
#: call tripwire allows exactly these (``tutorials/assignments/guard.py``).
GRADER_SAFE = (
    locked_shared_array,
    _syncthreads_counting,
    _atomic_add_routed,
    poison_fill,
    _shared_init_hooked,
    _poison_dynamic,
)
