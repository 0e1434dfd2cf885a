"""A lock around the CUDA simulator's static shared-memory allocation (a numba-cuda 0.30 race).

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
must not import it before the backend is chosen. So :mod:`numba_flash._backend`, once it has chosen
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
from collections.abc import Iterator
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
            res = np.empty(shape, dtype)
            self._allocations[caller] = res
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
            f"(source sha256 {digest}); read it: if upstream locked it, delete numba_flash/_simfix.py; if it still races "
            "and locked_shared_array still matches it apart from the lock, add its hash to REVIEWED_SOURCE_SHA256"
        )
    warnings.warn(f"numba-flash did not lock the CUDA simulator's shared-array allocation: {_problem}", RuntimeWarning, stacklevel=2)
    return False


def simulator_patch_installed() -> bool:
    """True when the simulator's ``FakeCUDAShared.array`` is :func:`locked_shared_array` now."""
    kernelapi = sys.modules.get(KERNELAPI)
    return kernelapi is not None and getattr(getattr(kernelapi, "FakeCUDAShared", None), "array", None) is locked_shared_array


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
