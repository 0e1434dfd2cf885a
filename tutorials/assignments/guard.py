"""The submission guard: the graded part of an assignment must be the student's own code.

numba-flash is installed on every student machine (the course needs its backend choice, its tutorials
and its NumPy references), and it contains an answer to most exercises: a FlashAttention forward, the
online-softmax merge, the recomputation backward, ... A 20-line wrapper around
``numba_flash_reference.online_softmax`` once passed every test of assignment 1. The autograder
therefore rejects a submission that uses the package (or the grader's own reference code) for the
part being graded, with a message that says why. It works in three layers.

1. **Static check** (:func:`static_problems`, before the submission runs). The submission's source is
   parsed, not executed:

   * imports are limited to an allow-list (:data:`ALLOWED_IMPORTS`: ``numpy``, ``numba``, ``math``,
     ``functools`` and a few more of the standard library); ``import numba_flash``,
     ``from numba_flash_reference.online_softmax import merge``, ``import torch``, ``import sys``,
     ``import importlib`` and relative imports are all rejected, each with its reason;
   * names that load or run code dynamically are rejected: ``__import__``, ``exec``, ``eval``,
     ``compile``, ``open``, ``globals``, ``vars``, ``getattr`` and friends, ``__builtins__``;
   * attribute access to dunders other than ``__init__``/``__name__``/``__doc__`` is rejected
     (``f.__globals__``, ``().__class__.__base__.__subclasses__()``, ``m.__dict__``);
   * any string constant that names the package (``"numba_flash"``, also inside a longer string)
     is rejected; docstrings are exempt.

2. **Import wall** (while the submission is imported and while each graded function runs): the
   package's modules and the grader's modules are taken out of ``sys.modules`` and a finder at the
   head of ``sys.meta_path`` refuses to import them, so an import that slipped past the static check
   (built at run time, say) raises ``ImportError`` naming the rule.

3. **Call tripwire** (the same window): a profile hook on every thread (``sys.setprofile`` and
   ``threading.setprofile``, so the simulator's GPU threads too) sees each Python function call. A
   call to code in the package's files, in an autograder's ``test_autograder.py`` or to a reference
   the grader marked with :func:`oracle` is recorded, and the graded call then fails with
   :class:`SubmissionRejected` naming the function. This catches package code reached by any route
   (an object handed over, a closure, ``gc``), because it looks at what runs, not at how it was named.
   Results are materialized inside the window (arrays copied, array-likes converted), so a lazy
   object cannot run the package later, outside it.

What it does **not** catch, by design or by limits of an in-process check (course staff: see
``docs/instructors.rst``):

* **Copied source.** Retyping or pasting the package's code (or a classmate's) is plagiarism, not a
  call; the tripwire cannot see it. Use a similarity checker (MOSS, JPlag) on the submissions, with the
  package's files as the base. The assignments were chosen so that no package function has the
  graded interface (a1 keeps FA2's un-normalized state and combines split-KV partials, a4 is a
  one-block Numba kernel), so a copy needs real adaptation.
* **C-level calls.** The hook sees Python functions only; the package has no compiled code of its own,
  but a NumPy or Numba routine is, of course, allowed.
* **A hostile submission.** Code that defeats the static check could switch the hook off. The static
  check rejects the gadgets known to do it: an allowed library's attribute that is ``sys``,
  ``importlib``, ``threading`` and the like (:data:`DENIED_ATTRIBUTES`; the red-team submission of
  ``tests/test_tutorials.py`` reached all three through ``numba.core``), ``operator.attrgetter``. A
  gadget not on that list would still get through. The static check makes that deliberate
  and visible in the source; the grade script prints the static report for every submission. This is
  a guard against taking a shortcut through the package, not a sandbox. The assignments of
  :data:`assignments.sandbox.SANDBOXED` are graded in one (:mod:`assignments.sandbox`): a worker process
  that holds no answer, whose irremovable audit hook refuses every route to the package. Run untrusted
  code in a container all the same, as you would any student code.

The grader's own oracles (float64 references, float32 yardsticks) run outside the window; only the
student's functions run inside it (:class:`GuardedModule`).
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import sys
import threading
import types
from pathlib import Path

import numpy as np

#: Top-level modules a submission may import (everything an assignment needs, nothing that answers it).
ALLOWED_IMPORTS = frozenset(
    {
        "__future__", "math", "cmath", "functools", "itertools", "operator", "collections", "dataclasses",
        "typing", "numpy", "numba", "csv", "io", "re", "json", "statistics", "string",
    }
)  # fmt: skip

#: Modules a submission may never use while graded: the package and the grader itself.
FORBIDDEN_MODULES = ("numba_flash", "numba_flash_reference", "assignments", "conftest")

#: Names whose only use in an assignment would be to load or run code behind the static check's back.
FORBIDDEN_NAMES = frozenset(
    {
        "__import__", "exec", "eval", "compile", "open", "globals", "locals", "vars", "breakpoint",
        "getattr", "setattr", "delattr", "__builtins__", "__loader__", "__spec__", "__file__",
    }
)  # fmt: skip

#: Dunder attributes a submission may use (``super().__init__``, ``f.__name__``, ``__doc__``).
ALLOWED_DUNDER_ATTRIBUTES = frozenset({"__init__", "__name__", "__doc__"})

#: Attribute names (and names imported with ``from X import NAME``) that reach the interpreter's machinery: a
#: submission that gets ``sys``, ``importlib`` or ``threading`` through an allowed library
#: (``numba.core.config.sys``, ``numba.core.caching.importlib``, ``numba.core.compiler_lock.threading``) can switch
#: the tripwire off and take the import wall down, and ``operator.attrgetter`` is ``getattr`` by another name.
DENIED_ATTRIBUTES = frozenset(
    {
        "sys", "importlib", "threading", "_thread", "os", "builtins", "gc", "ctypes", "subprocess", "inspect",
        "runpy", "pkgutil", "site", "marshal", "pickle", "imp", "zipimport", "multiprocessing", "sysconfig",
        "shutil", "attrgetter", "methodcaller", "setprofile", "settrace", "meta_path", "path_hooks",
    }
)  # fmt: skip

#: A string constant containing one of these is rejected (docstrings exempt).
FORBIDDEN_SUBSTRINGS = ("numba_flash",)


class SubmissionRejected(AssertionError):
    """The submission uses the package or the grader for the graded part (an AssertionError, so pytest
    reports the test as failed, with this message)."""


def _forbidden_module(name: str) -> bool:
    top = name.split(".", 1)[0]
    return top in FORBIDDEN_MODULES


# ----------------------------------------------------------------------------------------------
# 1. Static check
# ----------------------------------------------------------------------------------------------
def _docstring_nodes(tree) -> set[int]:
    """ids of the string constants that are docstrings or bare string statements (comments)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            ids.add(id(node.value))
    return ids


def static_problems(source: str, filename: str = "<submission>") -> list[str]:
    """Reasons to reject ``source`` before running it (empty list: nothing found).

    >>> static_problems("import numpy as np\\nfrom numba import cuda\\n")
    []
    >>> static_problems("from numba_flash_reference.online_softmax import merge")[0].split(":")[0]
    'line 1'
    """
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        return [f"line {exc.lineno}: syntax error: {exc.msg}"]
    found: set[tuple[int, str]] = set()
    docstrings = _docstring_nodes(tree)
    allowed = ", ".join(sorted(m for m in ALLOWED_IMPORTS if m != "__future__"))
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        problems = []
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                problems.append(
                    f"line {line}: relative import 'from {'.' * node.level}{node.module or ''} import ...': a "
                    "submission is graded as a single file"
                )
                names = []
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in DENIED_ATTRIBUTES:
                        problems.append(
                            f"line {line}: 'from {node.module} import {alias.name}' is not allowed in a "
                            f"submission ({alias.name!r} reaches the interpreter behind the autograder's back)"
                        )
            for name in names:
                top = name.split(".", 1)[0]
                if _forbidden_module(name):
                    problems.append(
                        f"line {line}: import of {name!r}: the graded part must be your own code, not numba-flash's "
                        "(the package and the grader may not be imported by a submission)"
                    )
                elif top not in ALLOWED_IMPORTS:
                    problems.append(
                        f"line {line}: import of {name!r} is not allowed in a submission (allowed: {allowed})"
                    )
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append(
                f"line {line}: {node.id!r} is not allowed in a submission (it loads or runs code behind the "
                "autograder's back)"
            )
        elif isinstance(node, ast.Attribute):
            a = node.attr
            if a.startswith("__") and a.endswith("__") and a not in ALLOWED_DUNDER_ATTRIBUTES:
                problems.append(f"line {line}: attribute {a!r} is not allowed in a submission")
            elif a == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys":
                problems.append(f"line {line}: sys.modules is not allowed in a submission")
            elif a in DENIED_ATTRIBUTES or a in FORBIDDEN_NAMES:
                problems.append(
                    f"line {line}: attribute {a!r} is not allowed in a submission (it reaches the "
                    "interpreter, or loads code, behind the autograder's back)"
                )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for bad in FORBIDDEN_SUBSTRINGS:
                if bad in node.value:
                    problems.append(
                        f"line {line}: the string {node.value!r} names the package ({bad!r}); the graded part must be "
                        "your own code"
                    )
        found.update((line, p) for p in problems)
    return [p for _, p in sorted(found)]


# ----------------------------------------------------------------------------------------------
# 2 + 3. The window: import wall and call tripwire
# ----------------------------------------------------------------------------------------------
_ORACLE_CODES: set = set()


def oracle(fn):
    """Mark a grader function as an answer (a reference, a yardstick): calling it from a submission is a
    violation, like calling the package."""
    _ORACLE_CODES.add(fn.__code__)
    return fn


def _package_dirs() -> tuple[str, ...]:
    dirs = []
    for name in ("numba_flash", "numba_flash_reference"):
        mod = sys.modules.get(name)
        if mod is None:
            try:
                import importlib.util

                spec = importlib.util.find_spec(name)
                origin = spec.origin if spec else None
            except (ImportError, ValueError):
                origin = None
        else:
            origin = getattr(mod, "__file__", None)
        if origin:
            dirs.append(str(Path(origin).resolve().parent) + "/")
    return tuple(dirs)


def _grader_safe_codes() -> frozenset:
    """The code objects of the functions numba-flash's simulator patch layer runs inside every simulated kernel (the
    locked shared-array allocation, the barrier count, the routed atomics: ``GRADER_SAFE`` of
    :mod:`numba_flash.runtime.simulator`). They are the grader's machinery, not an answer: the tripwire lets exactly
    these through."""
    sim = sys.modules.get("numba_flash.runtime.simulator")
    return frozenset(f.__code__ for f in getattr(sim, "GRADER_SAFE", ()))


class _ImportWall(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if _forbidden_module(fullname):
            raise ImportError(
                f"{fullname!r} cannot be imported while a submission is graded: the graded part must be your own code"
            )
        return None


class Guard:
    """The window in which submission code runs: import wall + call tripwire. Re-entrant, process-wide."""

    def __init__(self):
        self._lock = threading.RLock()
        self._depth = 0
        self._verdicts: dict = {}
        self.violations: list[str] = []
        self._saved = {}
        self._wall = _ImportWall()
        self._prev_profile = None
        self._prev_thread_profile = None
        self._dirs = ()
        self._safe: frozenset = frozenset()
        self._test_files: set[str] = set()

    def forbid_file(self, path) -> None:
        """Treat calls to functions defined in ``path`` (an autograder module) as violations."""
        self._test_files.add(str(Path(path).resolve()))
        self._verdicts.clear()

    # the profile hook: cheap on the common path (one dict lookup per call)
    def _profile(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        verdict = self._verdicts.get(code)
        if verdict is None:
            filename = code.co_filename
            verdict = code in _ORACLE_CODES or filename.startswith(self._dirs) or filename in self._test_files
            if code in self._safe:  # Dev: numba-flash's simulator patch layer runs inside every simulated kernel
                verdict = False
            elif not verdict and filename and not filename.startswith("<"):
                try:
                    resolved = str(Path(filename).resolve())
                except OSError:
                    resolved = filename
                verdict = resolved.startswith(self._dirs) or resolved in self._test_files
            self._verdicts[code] = verdict
        if verdict:
            self.violations.append(
                f"{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name} ({code.co_filename})"
            )

    def __enter__(self):
        with self._lock:
            self._depth += 1
            if self._depth > 1:
                return self
            self.violations = []
            self._dirs = _package_dirs()
            self._safe = _grader_safe_codes()
            self._saved = {k: sys.modules.pop(k) for k in list(sys.modules) if _forbidden_module(k)}
            sys.meta_path.insert(0, self._wall)
            self._prev_profile = sys.getprofile()
            self._prev_thread_profile = threading.getprofile() if hasattr(threading, "getprofile") else None
            sys.setprofile(self._profile)
            threading.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._depth -= 1
            if self._depth > 0:
                return False
            sys.setprofile(self._prev_profile)
            threading.setprofile(self._prev_thread_profile)
            try:
                sys.meta_path.remove(self._wall)
            except ValueError:
                pass
            sys.modules.update(self._saved)
            self._saved = {}
        return False

    def check(self, what: str) -> None:
        """Raise :class:`SubmissionRejected` if the last window saw a call into the package or the grader."""
        if self.violations:
            first = self.violations[0]
            more = f" (and {len(self.violations) - 1} more calls)" if len(self.violations) > 1 else ""
            self.violations = []
            raise SubmissionRejected(
                f"{what} called {first}{more} while it was graded: the graded part must be your own code, "
                "not numba-flash's or the autograder's"
            )


GUARD = Guard()


def materialize(value, other=None):
    """Copy arrays and convert array-likes inside the window, so nothing lazy escapes it.

    ``other`` maps any other value. Here kernels (dispatchers) and functions stay as they are, for the grader to use
    inside a window of their own; the sandbox's worker (``assignments/_worker.py``) turns a kernel into its source.
    """
    if isinstance(value, (np.ndarray, np.generic)):
        return np.array(value)
    if isinstance(value, (tuple, list)):
        items = [materialize(v, other) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {k: materialize(v, other) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        return np.asarray(value).copy()
    return other(value) if other is not None else value


def guarded(fn, label: str):
    """``fn`` run inside the window; its result materialized there; violations raised afterwards."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with GUARD:
            result = materialize(fn(*args, **kwargs))
        GUARD.check(label)
        return result

    return wrapper


class GuardedModule:
    """A submission module whose functions run inside the guard's window when the grader calls them.

    Functions defined in the submission are wrapped (:func:`guarded`); everything else (constants such
    as ``TILE``, kernels, classes) is returned as it is. ``module`` is the raw module.
    """

    def __init__(self, module: types.ModuleType, label: str):
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "_cache", {})

    def __getattr__(self, name):
        value = getattr(self.module, name)
        if isinstance(value, types.FunctionType) and value.__module__ == self.module.__name__:
            cache = self._cache
            if name not in cache or cache[name].__wrapped__ is not value:
                cache[name] = guarded(value, f"{self.label}: {name}()")
            return cache[name]
        return value

    def __setattr__(self, name, value):  # e.g. a test that tries BR = 4: set it on the module
        setattr(self.module, name, value)

    def __repr__(self):
        return f"<guarded submission {self.module.__file__}>"


def load(path: Path, module_name: str, label: str) -> GuardedModule:
    """Statically check, then import ``path`` inside the window; return it as a :class:`GuardedModule`."""
    import importlib.util

    source = Path(path).read_text(encoding="utf-8")
    problems = static_problems(source, str(path))
    if problems:
        raise SubmissionRejected(f"{label}: {path} is rejected before it runs:\n  " + "\n  ".join(problems))
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # kernels and dataclasses look their module up by name
    with GUARD:
        spec.loader.exec_module(module)
    GUARD.check(f"{label}: importing {Path(path).name}")
    return GuardedModule(module, label)
