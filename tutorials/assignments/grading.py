"""The course's grading toolkit: what every autograder in ``tutorials/assignments/`` is built from.

The autograders follow GPU-Puzzles and minitorch: each exercise is graded on *claims*, stated in the
test names, about the student's implementation:

* **Correct, to a derived tolerance.** :func:`assert_error_rule` is the rule of numba-flash's own test
  suite (and of flash-attn's): the error against a float64 reference must be at most ``mult`` times
  the error of a plain float32 implementation of the same function on the same inputs (``mult = 2``
  for outputs, 3 for gradients), plus a floor of a few float32 rounding steps (:func:`ulp_floor`).
  Nothing is "close enough" by a hand-picked ``atol``.
* **Within an IO budget.** :class:`CountingArray` wraps a kernel argument so that, in Numba's CUDA
  simulator, every global-memory (HBM) element a kernel reads or writes is counted, element by element:
  "each element of A is read at most ``ceil(n / TILE)`` times" is then a plain assertion. The NumPy
  assignments use :class:`numba_flash_reference.hbm.HBMArray` (the counter the IO model is built on).
* **Within an SRAM budget.** :func:`record_shared_memory` measures the shared memory a kernel
  declares per block (the simulator keeps one array per ``cuda.shared.array`` line; on a GPU a compiled
  kernel reports it itself, ``kernel.get_shared_mem_per_block()``).
* **Written in the house style.** :func:`kernel_source_problems` checks the two rules that also keep
  kernels correct in the simulator: one ``cuda.shared.array`` per source line (two on one line alias
  each other in the simulator) and a ``# Sync: <what it protects>`` comment on every barrier.

Which implementation is graded (:func:`load_implementation`): the student's ``stub.py`` by default,
``solution.py`` with ``--impl solution`` (or ``NUMBA_FLASH_IMPL=solution``), or any file or folder of
submissions with ``--impl PATH``. See ``tutorials/README.md``.

The simulator-only pieces (:class:`CountingArray`, the shared-memory recorder) rely on two facts about
Numba's CUDA simulator: a kernel argument that is not a NumPy array is passed to the Python "threads"
as it is (so its ``__getitem__`` sees every load), and each ``cuda.shared.array`` call is one NumPy
allocation per source line and launch. The shared-memory recorder reads two private attributes of
numba-cuda 0.30's simulator (``FakeCUDAShared._allocations``, ``_dynshared_size``; numba-cuda is pinned
to 0.30.x): if a release renames them, ``tests/test_tutorials.py`` fails (the solutions' SRAM tests
would see 0 bytes), it does not pass silently.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import os
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np

#: Environment variable naming the implementation to grade (``stub``, ``solution`` or a path).
IMPL_ENV = "NUMBA_FLASH_IMPL"
EPS32 = float(np.finfo(np.float32).eps)


# ----------------------------------------------------------------------------------------------
# Which implementation is graded
# ----------------------------------------------------------------------------------------------
def implementation_path(assignment_dir: Path, choice: str | None = None) -> Path:
    """The file to grade for one assignment.

    Parameters
    ----------
    assignment_dir : Path
        The assignment's folder, e.g. ``tutorials/assignments/a1_online_softmax``.
    choice : str, optional
        ``"stub"`` (the student's file), ``"solution"`` (course staff's), a ``.py`` file, or a folder
        holding one file per assignment named after it (``a1_online_softmax.py``, ...). Default: the
        environment variable ``NUMBA_FLASH_IMPL``, else ``"stub"``.
    """
    choice = choice or os.environ.get(IMPL_ENV) or "stub"
    if choice in ("stub", "solution"):
        path = assignment_dir / f"{choice}.py"
    else:
        path = Path(choice).expanduser()
        if path.is_dir():
            path = path / f"{assignment_dir.name}.py"
    if not path.is_file():
        hint = " (solutions are kept by course staff, not shipped to students)" if choice == "solution" else ""
        raise FileNotFoundError(f"no implementation to grade for {assignment_dir.name}: {path} does not exist{hint}")
    return path.resolve()


def load_implementation(assignment_dir: Path, choice: str | None = None):
    """Import the implementation chosen by :func:`implementation_path` as a fresh module."""
    path = implementation_path(Path(assignment_dir), choice)
    name = f"_graded_{Path(assignment_dir).name}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # kernels and dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------
# The error rule (the same as tests/attn_testing.py in numba-flash's own suite)
# ----------------------------------------------------------------------------------------------
def ulp_floor(ref) -> float:
    """A few float32 rounding steps at the reference's magnitude: ``4 eps32 max(1, max|ref|)``.

    It only matters where the float32 baseline happens to be exact (e.g. a single key gives
    ``O = V`` exactly) and is far below the effect of any real bug.
    """
    ref = np.asarray(ref)
    return 4 * EPS32 * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)


def max_err(a, b) -> float:
    """``max |a - b|`` in float64 (0 for empty arrays)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def assert_error_rule(out, ref64, naive32, mult=2.0, what="output"):
    """Assert ``max|out - ref64| <= mult * max|naive32 - ref64| + ulp_floor(ref64)``; NaN never passes.

    Parameters
    ----------
    out : array_like
        The implementation's result.
    ref64 : array_like
        The float64 reference.
    naive32 : array_like
        A plain float32 implementation of the same function on the same inputs: its error is the
        yardstick (what float32 arithmetic costs anyway).
    mult : float
        2 for outputs, 3 for gradients (flash-attn's own test rule).
    what : str
        Named in the failure message.
    """
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == np.shape(ref64), f"{what}: shape {out.shape}, expected {np.shape(ref64)}"
    bad = int(np.count_nonzero(~np.isfinite(out)))
    assert bad == 0, f"{what}: {bad} of {out.size} elements are NaN or inf (never written, or an overflow)"
    err, base = max_err(out, ref64), max_err(naive32, ref64)
    bound = mult * base + ulp_floor(ref64)
    assert err <= bound, (
        f"{what}: max error {err:.3e} > {mult} x the float32-naive error {base:.3e} + floor {ulp_floor(ref64):.1e}"
    )
    return err


def poisoned(shape, dtype=np.float32) -> np.ndarray:
    """An output buffer full of NaN: an element the implementation forgets to write fails the test."""
    return np.full(shape, np.nan, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Float64 references and float32 baselines for ONE head (N, d), built on numba_flash_reference
# ----------------------------------------------------------------------------------------------
def attention64(Q, K, V, tau):
    """``(O, m, l, L)`` of ``softmax(tau Q K^T) V`` in float64 (FA1 Algorithm 0, the oracle)."""
    from numba_flash_reference.alg0_standard import standard_attention

    r = standard_attention(*(np.asarray(x, np.float64)[None, :, None, :] for x in (Q, K, V)), softmax_scale=tau)
    return r.O[0, :, 0], r.m[0, 0], r.l[0, 0], r.L[0, 0]


def attention_naive32(Q, K, V, tau):
    """``(O, m, l)`` of the same attention computed entirely in float32 NumPy: the error yardstick."""
    f = np.float32
    Q, K, V = (np.asarray(x, f) for x in (Q, K, V))
    S = (Q @ K.T) * f(tau)
    m = S.max(axis=1)
    E = np.exp(S - m[:, None])
    l = E.sum(axis=1)
    return (E / l[:, None]) @ V, m, l


def attention_backward64(Q, K, V, dO, tau):
    """``(dQ, dK, dV)`` of ``O = softmax(tau Q K^T) V`` in float64 (FA1 Algorithm 3)."""
    from numba_flash_reference.alg3_backward import standard_backward

    g = standard_backward(*(np.asarray(x, np.float64)[None, :, None, :] for x in (dO, Q, K, V)), softmax_scale=tau)
    return tuple(x[0, :, 0] for x in g)


def attention_backward_naive32(Q, K, V, dO, tau):
    """The standard backward pass (Algorithm 3) computed entirely in float32: the yardstick for gradients."""
    f = np.float32
    Q, K, V, dO = (np.asarray(x, f) for x in (Q, K, V, dO))
    S = (Q @ K.T) * f(tau)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    P = E / E.sum(axis=1, keepdims=True)
    dV = P.T @ dO
    dP = dO @ V.T
    dS = P * (dP - (P * dP).sum(axis=1, keepdims=True))
    return (dS @ K) * f(tau), (dS.T @ Q) * f(tau), dV


def matmul_naive32(A, B):
    """``A @ B`` with float32 products summed one at a time, in index order (what one GPU thread does)."""
    A, B = np.asarray(A, np.float32), np.asarray(B, np.float32)
    C = np.zeros((A.shape[0], B.shape[1]), np.float32)
    for p in range(A.shape[1]):
        C = C + A[:, p, None] * B[None, p, :]
    return C


# ----------------------------------------------------------------------------------------------
# Counting global-memory accesses of a kernel in the simulator
# ----------------------------------------------------------------------------------------------
class CountingArray:
    """A kernel argument whose every element read and write is counted (Numba's CUDA simulator only).

    Pass it to a ``@cuda.jit`` kernel in place of a NumPy array. The simulator hands non-NumPy
    arguments to its Python threads unchanged, so ``A[i, j]`` inside the kernel calls
    :meth:`__getitem__` here: one counted HBM read per element, ``A[i, j] = x`` one counted write. On a
    real GPU a kernel cannot take this object; IO-budget tests are simulator-only.

    Attributes
    ----------
    data : ndarray
        The underlying array (read it after the launch for the kernel's output).
    reads, writes : ndarray of int64
        Per-element counts, the shape of ``data``.

    Examples
    --------
    >>> a = CountingArray(np.arange(6.0).reshape(2, 3), "A")
    >>> x = a[1, 2]; a[0, 0] = x
    >>> int(a.reads.sum()), int(a.writes[0, 0])
    (1, 1)
    """

    def __init__(self, data, name: str = "?"):
        self.data = np.asarray(data)
        self.name = name
        self.reads = np.zeros(self.data.shape, np.int64)
        self.writes = np.zeros(self.data.shape, np.int64)
        self._lock = threading.Lock()  # simulator threads are real Python threads

    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    dtype = property(lambda self: self.data.dtype)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        value = self.data[idx]  # raises IndexError on an out-of-bounds load (a GPU would read garbage)
        with self._lock:
            self.reads[idx] += 1
        return value

    def __setitem__(self, idx, value):
        self.data[idx] = value
        with self._lock:
            self.writes[idx] += 1

    def describe(self) -> str:
        """One line: total and per-element maximum of reads and writes."""
        return (
            f"{self.name}: {int(self.reads.sum())} reads (max {int(self.reads.max(initial=0))} per element), "
            f"{int(self.writes.sum())} writes (max {int(self.writes.max(initial=0))} per element)"
        )


def simulator() -> bool:
    """True when kernels run in Numba's CUDA simulator (decided by ``import numba_flash``)."""
    import numba_flash

    return numba_flash.is_simulator()


@contextlib.contextmanager
def record_shared_memory():
    """Measure the static shared memory per block of the kernels launched inside the block (simulator).

    Every simulated launch gets a fresh shared-memory manager that keeps one NumPy array per
    ``cuda.shared.array`` source line (plus the dynamic shared memory the launch asked for); this
    records those managers and sums their arrays. On a GPU, ask a compiled kernel instead:
    ``kernel.get_shared_mem_per_block()``.

    Yields a list that, after the block, holds one byte count per launch. Use ``max(...)``.
    """
    if not simulator():
        raise RuntimeError("record_shared_memory works in Numba's CUDA simulator; on a GPU use kernel.get_shared_mem_per_block()")
    from numba.cuda.simulator import kernelapi

    sizes: list[int] = []
    managers = []
    original_init = kernelapi.FakeCUDAShared.__init__

    def recording_init(self, dynshared_size):
        original_init(self, dynshared_size)
        managers.append(self)

    kernelapi.FakeCUDAShared.__init__ = recording_init
    try:
        yield sizes
    finally:
        kernelapi.FakeCUDAShared.__init__ = original_init
    for mgr in managers:
        sizes.append(sum(a.nbytes for a in mgr._allocations.values()) + mgr._dynshared_size)


# ----------------------------------------------------------------------------------------------
# House rules on kernel source
# ----------------------------------------------------------------------------------------------
def kernel_source_problems(fn) -> list[str]:
    """Problems with a kernel's source: shared arrays sharing a line, barriers without ``# Sync:``.

    Parameters
    ----------
    fn : function or Numba dispatcher
        The kernel (its Python source is inspected, nested kernels in a factory included).

    Returns
    -------
    list of str
        Empty when the source follows both rules.
    """
    fn = getattr(fn, "py_func", fn)
    source = textwrap.dedent(inspect.getsource(fn))
    first = inspect.getsourcelines(fn)[1]
    problems = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            text = ast.unparse(node.func)
            if text == "cuda.syncthreads":
                line = lines[node.lineno - 1]
                if "# Sync:" not in line:
                    problems.append(f"line {first + node.lineno - 1}: cuda.syncthreads() without '# Sync: <what it protects>'")
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        if code.count("cuda.shared.array(") > 1:
            problems.append(f"line {first + i}: two cuda.shared.array on one line (they alias in the simulator)")
    return problems


def count_calls(fn, dotted_name: str) -> int:
    """How many times ``dotted_name`` (e.g. ``"cuda.syncthreads"``) is called in ``fn``'s source."""
    fn = getattr(fn, "py_func", fn)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func) == dotted_name
    )
