"""The course's grading toolkit: what every autograder in ``tutorials/assignments/`` is built from.

The autograders follow GPU-Puzzles and minitorch: each exercise is graded on *claims*, stated in the
test names, about the student's implementation:

* **Correct, to a derived tolerance.** :func:`assert_error_rule` is the rule of numba-flash's own test
  suite (and of flash-attn's): the error against a float64 reference must be at most ``mult`` times
  the error of a plain float32 implementation of the same function on the same inputs (``mult = 2``
  for outputs, 3 for gradients), plus a floor of a few float32 rounding steps (:func:`ulp_floor`).
  Nothing is "close enough" by a hand-picked ``atol``.
* **Within an IO budget.** :class:`CountingArray` wraps a kernel argument so that, in Numba's CUDA
  simulator, every global-memory (HBM) element a kernel reads, writes or atomically updates is
  counted, element by element: "each element of K is read exactly ``Tr`` times" is then a plain
  assertion.
* **Within an SRAM budget.** :func:`record_shared_memory` measures the shared memory a kernel
  declares per block (on a GPU a compiled kernel reports it itself, ``kernel.get_shared_mem_per_block()``).
* **Free of shared-memory races.** :func:`shared_memory_races` runs a launch with every shared array
  watched: two threads touching one element between the same two barriers, one of them writing, is a
  race, whatever the order the simulator's threads happened to run in. This is how a missing
  ``cuda.syncthreads()`` is caught deterministically (on a GPU, use ``compute-sanitizer --tool
  racecheck``).
* **Written in the house style.** :func:`kernel_source_problems` checks the two rules that also keep
  kernels correct in the simulator: one ``cuda.shared.array`` per source line (two on one line alias
  each other in the simulator) and a ``# Sync: <what it protects>`` comment on every barrier.
* **The student's own code.** :func:`load_implementation` loads a submission through
  :mod:`assignments.guard`: a submission that imports or calls numba-flash (or the grader's
  references, marked :func:`guard.oracle`) for the graded part is rejected, with the reason.

Which implementation is graded (:func:`implementation_path`): the student's ``stub.py`` by default,
course staff's solution with ``--impl solution`` (from ``tutorials/solutions/<assignment>/solution.py``,
or from the folder named by ``NUMBA_FLASH_SOLUTIONS``; solutions are never in the students' handout),
or any file or folder of submissions with ``--impl PATH``. See ``tutorials/README.md``.

The simulator-only pieces rely on facts about numba-cuda 0.30's simulator (pinned to 0.30.x): a
kernel argument that is not a NumPy array is passed to the Python "threads" as it is (so its
``__getitem__`` sees every load); ``cuda.atomic.add`` is ``FakeCUDAAtomic.add``; each
``cuda.shared.array`` call is one NumPy allocation per source line and launch, kept in
``FakeCUDAShared._allocations``; ``cuda.syncthreads`` is ``BlockThread.syncthreads``.
:func:`install_simulator_patches` (called by ``tutorials/conftest.py``) takes from numba-flash's one simulator
patch layer (:mod:`numba_flash.runtime.simulator`) the shared-array allocation that holds a lock (numba-cuda 0.30
allocates without one, so two threads could get different arrays for one declaration and a correct kernel fail
now and then), the routing of atomics on a :class:`CountingArray` to its counter, and the barrier count per
thread for the race detector. If a
numba-cuda release renames these, ``tests/test_tutorials.py`` fails (the solutions' budget tests would
see nothing), it does not pass silently.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import textwrap
from pathlib import Path

import numpy as np
from numba import cuda  # a module-level global, as the simulator wants (conftest chose the backend already)

from . import guard, probes, sandbox
from .guard import oracle
from .probes import BlockStream, CountingArray, SharedRaceArray  # noqa: F401  (the autograders' names)

#: Environment variable naming the implementation to grade (``stub``, ``solution`` or a path).
IMPL_ENV = "NUMBA_FLASH_IMPL"
#: Environment variable naming the folder of course staff's solutions (``<folder>/<assignment>/solution.py``).
SOLUTIONS_ENV = "NUMBA_FLASH_SOLUTIONS"
EPS32 = float(np.finfo(np.float32).eps)
TUTORIALS = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# Which implementation is graded
# ----------------------------------------------------------------------------------------------
def solutions_dir() -> Path:
    """Course staff's solutions: ``$NUMBA_FLASH_SOLUTIONS``, else ``tutorials/solutions`` of this tree."""
    env = os.environ.get(SOLUTIONS_ENV)
    return Path(env).expanduser() if env else TUTORIALS / "solutions"


def implementation_path(assignment_dir: Path, choice: str | None = None) -> Path:
    """The file to grade for one assignment.

    Parameters
    ----------
    assignment_dir : Path
        The assignment's folder, e.g. ``tutorials/assignments/a1_online_softmax``.
    choice : str, optional
        ``"stub"`` (the student's file), ``"solution"`` (course staff's, from :func:`solutions_dir`),
        a ``.py`` file, or a folder holding, per assignment, ``<assignment>.py`` or
        ``<assignment>/solution.py`` (the layout of ``tutorials/solutions``). Default: the environment
        variable ``NUMBA_FLASH_IMPL``, else ``"stub"``.
    """
    assignment_dir = Path(assignment_dir)
    name = assignment_dir.name
    choice = choice or os.environ.get(IMPL_ENV) or "stub"
    if choice == "stub":
        path = assignment_dir / "stub.py"
    else:
        folder = solutions_dir() if choice == "solution" else Path(choice).expanduser()
        path = folder
        if folder.is_dir():
            path = folder / f"{name}.py"
            if not path.is_file() and (folder / name / "solution.py").is_file():
                path = folder / name / "solution.py"
    if not path.is_file():
        hint = (
            f" (solutions are kept by course staff, not shipped to students; set {SOLUTIONS_ENV} to their folder)"
            if choice == "solution"
            else ""
        )
        raise FileNotFoundError(f"no implementation to grade for {name}: {path} does not exist{hint}")
    return path.resolve()


def load_implementation(assignment_dir: Path, choice: str | None = None):
    """Import the implementation chosen by :func:`implementation_path`, through the guard.

    The assignments of :data:`assignments.sandbox.SANDBOXED` are graded, in the simulator, in a process of
    their own (:class:`assignments.sandbox.SandboxedModule`), where the package cannot be reached; the others
    in this process, as a :class:`guard.GuardedModule` whose functions run inside the guard's window. Either
    way :class:`guard.SubmissionRejected` is raised if the source imports or names the package or the grader.
    """
    path = implementation_path(Path(assignment_dir), choice)
    assignment = Path(assignment_dir).name
    name = f"_graded_{assignment}_{abs(hash(str(path)))}"
    if assignment in sandbox.SANDBOXED and simulator():
        return sandbox.load(path, name, label=assignment)
    return guard.load(path, name, label=assignment)


# ----------------------------------------------------------------------------------------------
# The error rule (the same as tests/attn_testing.py in numba-flash's own suite)
# ----------------------------------------------------------------------------------------------
def ulp_floor(ref) -> float:
    """A few float32 rounding steps at the reference's magnitude: ``4 eps32 max(1, max|ref|)``.

    It only matters where the float32 baseline happens to be exact (e.g. a single key gives
    ``O = V`` exactly) and is far below the effect of any real bug. Non-finite reference entries
    (a fully masked row's ``L = -inf``) are left out of the magnitude.
    """
    ref = np.asarray(ref, dtype=np.float64)
    finite = ref[np.isfinite(ref)]
    return 4 * EPS32 * max(1.0, float(np.max(np.abs(finite))) if finite.size else 1.0)


def max_err(a, b) -> float:
    """``max |a - b|`` in float64 over the entries where ``b`` is finite (0 for empty arrays).

    Where ``b`` is ``-inf`` (or ``+inf``), ``a`` must be the same infinity: anything else counts as an
    infinite error.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not a.size:
        return 0.0
    fin = np.isfinite(b)
    if np.any(a[~fin] != b[~fin]):
        return float("inf")
    return float(np.max(np.abs(a[fin] - b[fin]))) if fin.any() else 0.0


def assert_error_rule(out, ref64, naive32, mult=2.0, what="output"):
    """Assert ``max|out - ref64| <= mult * max|naive32 - ref64| + ulp_floor(ref64)``; NaN never passes.

    Parameters
    ----------
    out : array_like
        The implementation's result.
    ref64 : array_like
        The float64 reference (``-inf`` allowed where the answer is ``-inf``, e.g. ``L`` of a fully
        masked row; ``out`` must then be ``-inf`` too).
    naive32 : array_like
        A plain float32 implementation of the same function on the same inputs: its error is the
        yardstick (what float32 arithmetic costs anyway).
    mult : float
        2 for outputs, 3 for gradients (flash-attn's own test rule).
    what : str
        Named in the failure message.
    """
    out = np.asarray(out, dtype=np.float64)
    ref64 = np.asarray(ref64, dtype=np.float64)
    assert out.shape == ref64.shape, f"{what}: shape {out.shape}, expected {ref64.shape}"
    bad = int(np.count_nonzero(np.isnan(out) | (np.isinf(out) & np.isfinite(ref64))))
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
# Float64 references and float32 yardsticks for ONE head (N, d). They are oracles: a submission
# that calls one while graded is rejected (guard.oracle).
# ----------------------------------------------------------------------------------------------
def _matmul32(A, B):
    """``A @ B`` with float32 products summed one at a time, in index order: the same bits on every CPU.

    The float32 yardsticks multiply through this, not through ``@``: on float32, ``@`` is the machine's
    BLAS, whose blocking and fused multiply-adds depend on the CPU, so a grade would depend on the laptop
    (numba-flash's own suite saw a 4.9x more accurate BLAS baseline on one CPU: ``docs/testing.rst``)."""
    A, B = np.asarray(A, np.float32), np.asarray(B, np.float32)
    C = np.zeros((A.shape[0], B.shape[1]), np.float32)
    for p in range(A.shape[1]):
        C = C + A[:, p, None] * B[None, p, :]
    return C


def _mm(f):
    """The matrix product of the yardstick in dtype ``f``: :func:`_matmul32` for float32, ``@`` for float64."""
    return _matmul32 if f is np.float32 else np.matmul


def _scores(Q, K, tau, visible, dtype):
    f = dtype
    S = _mm(f)(np.asarray(Q, f), np.asarray(K, f).T) * f(tau)
    if visible is not None:
        S = np.where(visible, S, f(-np.inf))
    return S


def _softmax_rows(S):
    m = S.max(axis=1)
    m_safe = np.where(np.isfinite(m), m, 0).astype(S.dtype)
    E = np.exp(S - m_safe[:, None])
    l = E.sum(axis=1)
    P = E / np.where(l > 0, l, 1).astype(S.dtype)[:, None]
    return P, m, l


@oracle
def attention_full64(Q, K, V, tau, visible=None, Z=None):
    """``(O, m, l, L)`` of ``softmax(tau Q K^T) V`` in float64, with an optional visibility mask and dropout.

    ``visible`` (N, N_k) bool: False entries are masked (``-inf``). ``Z`` (N, N_k): the dropout
    multiplier (``1/(1-p)`` kept, 0 dropped), applied to P before ``@ V`` (FA1 Alg.2 L14-L15); the
    statistics use the undropped P. A row with no visible key gives ``O = 0, l = 0, m = L = -inf``.
    """
    P, m, l = _softmax_rows(_scores(Q, K, tau, visible, np.float64))
    if Z is not None:
        P = P * np.asarray(Z, np.float64)
    with np.errstate(divide="ignore"):
        L = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf)
    return P @ np.asarray(V, np.float64), m, l, L


@oracle
def attention_full_naive32(Q, K, V, tau, visible=None, Z=None):
    """The same as :func:`attention_full64`, entirely in float32: the error yardstick."""
    f = np.float32
    P, m, l = _softmax_rows(_scores(Q, K, tau, visible, f))
    if Z is not None:
        P = P * np.asarray(Z, f)
    with np.errstate(divide="ignore"):
        L = np.where(l > 0, m + np.log(np.where(l > 0, l, f(1))), f(-np.inf)).astype(f)
    return _matmul32(P, V), m, l, L


def _backward(Q, K, V, dO, tau, visible, Z, f):
    Q, K, V, dO = (np.asarray(x, f) for x in (Q, K, V, dO))
    P, _, _ = _softmax_rows(_scores(Q, K, tau, visible, f))
    Zf = np.ones_like(P) if Z is None else np.asarray(Z, f)
    mm = _mm(f)
    dV = mm((P * Zf).T, dO)
    dP = mm(dO, V.T) * Zf
    dS = P * (dP - (P * dP).sum(axis=1, keepdims=True))
    return mm(dS, K) * f(tau), mm(dS.T, Q) * f(tau), dV


@oracle
def attention_backward_full64(Q, K, V, dO, tau, visible=None, Z=None):
    """``(dQ, dK, dV)`` of :func:`attention_full64`'s ``O`` for the upstream gradient ``dO``, in float64
    (FA1 Algorithm 3 with mask and dropout, App. B.2)."""
    return _backward(Q, K, V, dO, tau, visible, Z, np.float64)


@oracle
def attention_backward_full_naive32(Q, K, V, dO, tau, visible=None, Z=None):
    """The standard backward pass in float32: the yardstick for gradients."""
    return _backward(Q, K, V, dO, tau, visible, Z, np.float32)


@oracle
def attention64(Q, K, V, tau):
    """``(O, m, l, L)`` of ``softmax(tau Q K^T) V`` in float64 (FA1 Algorithm 0, the oracle)."""
    return attention_full64(Q, K, V, tau)


@oracle
def attention_naive32(Q, K, V, tau):
    """``(O, m, l)`` of the same attention computed entirely in float32 NumPy: the error yardstick."""
    return attention_full_naive32(Q, K, V, tau)[:3]


@oracle
def attention_backward64(Q, K, V, dO, tau):
    """``(dQ, dK, dV)`` of ``O = softmax(tau Q K^T) V`` in float64 (FA1 Algorithm 3)."""
    return attention_backward_full64(Q, K, V, dO, tau)


@oracle
def attention_backward_naive32(Q, K, V, dO, tau):
    """The standard backward pass (Algorithm 3) computed entirely in float32: the yardstick for gradients."""
    return attention_backward_full_naive32(Q, K, V, dO, tau)


@oracle
def matmul_naive32(A, B):
    """``A @ B`` with float32 products summed one at a time, in index order (what one GPU thread does)."""
    return _matmul32(A, B)


def causal_visible(N, N_k=None) -> np.ndarray:
    """``visible[i, j] = j <= i`` (square, top-left aligned: query ``i`` sees keys ``0..i``)."""
    N_k = N if N_k is None else N_k
    return np.arange(N_k)[None, :] <= np.arange(N)[:, None]


# ----------------------------------------------------------------------------------------------
# Counting global-memory accesses of a kernel in the simulator
# ----------------------------------------------------------------------------------------------
def counting(arrays: dict) -> dict:
    """``{name: CountingArray(array, name)}`` for a dict of NumPy arrays."""
    return {name: CountingArray(a, name) for name, a in arrays.items()}


def simulator() -> bool:
    """True when kernels run in Numba's CUDA simulator (decided by ``import numba_flash`` in conftest)."""
    import numba_flash

    return numba_flash.is_simulator()


@functools.cache
def _mask_kernel(keep):
    @cuda.jit
    def mask_kernel(seed, threshold, out):
        r = cuda.grid(1)  # one thread per row: few threads, which is what keeps the simulator fast
        if r < out.shape[0]:
            for c in range(out.shape[1]):
                out[r, c] = 1 if keep(seed, r, c, threshold) else 0

    return mask_kernel


def keep_mask(keep, seed: int, N: int, N_k: int, threshold: int, label: str = "dropout_keep") -> np.ndarray:
    """The ``(N, N_k)`` boolean mask of a student's device function ``keep(seed, row, col, threshold)``.

    A small grader kernel calls the device function once per element (on either backend), inside the
    guard's window: the mask is the student's own, evaluated the way their kernels evaluate it.
    """
    out = np.zeros((N, N_k), np.int8)
    kernel = _mask_kernel(keep)
    with guard.GUARD:
        kernel[(N + 31) // 32, 32](seed, threshold, out)
    guard.GUARD.check(label)
    return out.astype(bool)


# ----------------------------------------------------------------------------------------------
# Simulator hooks: the locked shared allocation, atomics on CountingArrays, barrier epochs, all from
# numba-flash's one simulator patch layer (numba_flash.runtime.simulator)
# ----------------------------------------------------------------------------------------------
def install_simulator_patches() -> None:
    """Make the simulator fit for grading (idempotent; does nothing on a GPU). See the module docstring.

    All three come from :mod:`numba_flash.runtime.simulator`, which checks that the simulator's internals are
    the reviewed ones (RuntimeError otherwise, so a grade never rests on an unpatched simulator): the locked
    shared-array allocation (installed when numba_flash chose the simulator), barrier epochs per thread for
    :func:`shared_memory_races`, and ``cuda.atomic.add`` on a :class:`CountingArray` routed to its counter.
    """
    if not simulator():
        return
    from numba_flash.runtime import simulator as sim

    if not sim.simulator_patch_installed():
        sim.install_on_import()
        sim._kernelapi_module()  # raises, saying why, where the reviewed patch cannot go in
    sim.install_barrier_epochs()
    sim.route_atomic_add(CountingArray)


@contextlib.contextmanager
def shared_memory_races():
    """Watch every shared array of the launches inside the block; yields the list of races found.

    Simulator only. Slower (every shared access is checked): use it on one small launch.
    """
    if not simulator():
        raise RuntimeError(
            "shared_memory_races works in Numba's CUDA simulator; on a GPU use compute-sanitizer --tool racecheck"
        )
    from numba_flash.runtime import simulator as sim

    install_simulator_patches()
    log: list[str] = []
    probes.ACTIVE.append(("races", log))  # a sandboxed call's launches are watched too (assignments.sandbox)
    try:
        with sim.watch_shared_arrays(lambda data, where: SharedRaceArray(data, where, log)):
            yield log
    finally:
        probes.ACTIVE.remove(("races", log))


@contextlib.contextmanager
def record_shared_memory():
    """Measure the static shared memory per block of the kernels launched inside the block (simulator).

    :func:`numba_flash.runtime.simulator.record_shared_memory`: yields a list that, after the block, holds one
    byte count per block launched (use ``max(...)``). On a GPU, ask a compiled kernel instead:
    ``kernel.get_shared_mem_per_block()``.
    """
    if not simulator():
        raise RuntimeError(
            "record_shared_memory works in Numba's CUDA simulator; on a GPU use kernel.get_shared_mem_per_block()"
        )
    from numba_flash.runtime import simulator as sim

    with sim.record_shared_memory() as sizes:
        probes.ACTIVE.append(("smem", sizes))  # a sandboxed call's launches are measured too (assignments.sandbox)
        try:
            yield sizes
        finally:
            probes.ACTIVE.remove(("smem", sizes))


# ----------------------------------------------------------------------------------------------
# House rules on kernel source
# ----------------------------------------------------------------------------------------------
def _source(fn):
    if isinstance(fn, probes.KernelSource):  # a kernel a sandboxed call returned
        return textwrap.dedent(fn.source), fn.first_line
    fn = getattr(fn, "py_func", fn)
    fn = inspect.unwrap(fn)
    fn = getattr(fn, "py_func", fn)
    return textwrap.dedent(inspect.getsource(fn)), inspect.getsourcelines(fn)[1]


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
    source, first = _source(fn)
    problems = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            text = ast.unparse(node.func)
            if text == "cuda.syncthreads":
                line = lines[node.lineno - 1]
                if "# Sync:" not in line:
                    problems.append(
                        f"line {first + node.lineno - 1}: cuda.syncthreads() without '# Sync: <what it protects>'"
                    )
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        if code.count("cuda.shared.array(") > 1:
            problems.append(f"line {first + i}: two cuda.shared.array on one line (they alias in the simulator)")
    return problems


def kernel_source(fn) -> str:
    """The Python source of a kernel, a function, or a :class:`assignments.probes.KernelSource`."""
    return _source(fn)[0]


def count_calls(fn, dotted_name: str) -> int:
    """How many times ``dotted_name`` (e.g. ``"cuda.syncthreads"``) is called in ``fn``'s source."""
    source, _ = _source(fn)
    tree = ast.parse(source)
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func) == dotted_name
    )


def missing_tags(fn, prefix: str, lines) -> list[str]:
    """The paper tags ``# <prefix> L<n>:`` (e.g. ``FA2.1``) that ``fn``'s source does not carry.

    A range tag ``# FA2.1 L9-L10:`` counts for each line it spans.
    """
    import re

    source, _ = _source(fn)
    covered = set()
    for m in re.finditer(rf"#\s*{re.escape(prefix)} L(\d+)(?:-L(\d+))?:", source):
        lo = int(m.group(1))
        hi = int(m.group(2) or lo)
        covered |= set(range(lo, hi + 1))
    return [f"# {prefix} L{n}:" for n in lines if n not in covered]
