"""The sandbox: a submission graded in a process of its own, where the package cannot be reached at all.

The in-process guard (:mod:`assignments.guard`) watches a submission that shares the grader's process, and
the grader's process holds numba-flash and the references: a determined submission that reaches ``sys``
through an allowed library can switch the watch off (the red team of ``tests/test_tutorials.py`` did, for
a1, a3 and a4, until the static check learned its gadgets). Here the submission runs in a **worker
process** that never holds an answer, and whose restrictions are in place before the submission's first
line runs:

1. The worker imports NumPy, Numba (the simulator), numba-flash's simulator patch layer *by file path*
   (``numba_flash/runtime/simulator.py`` uses nothing of the package) and :mod:`assignments.probes`
   (counting arrays, block streams, race-watching shared arrays: no answers). numba-flash, its
   references and the grader are never imported there.
2. It then installs an **audit hook** (:pep:`578`), which no Python code can remove. From then on the
   hook refuses: importing numba-flash, its references, the grader or the tests (by any route: an
   ``import``, ``importlib``, ``__import__``, unpickling); opening a file of the package, the
   references, the grader, the solutions or the tests (so their source cannot be read and run either),
   or any file for writing; starting a process (``subprocess``, ``os.system``, ``os.exec*``, ``fork``,
   ``posix_spawn``); loading or calling C code through ``ctypes``; renaming or removing files.
3. Only then does it import the submission, and it serves the grader's calls over a pipe: arguments go
   pickled to the worker, results and the arguments a call wrote into (output arrays, counting arrays)
   come back. A refused operation is reported to the grader, and the call fails with
   :class:`assignments.guard.SubmissionRejected`.

The grader's side is :class:`SandboxedModule`, which the autograders use like the guarded module: constants
(``impl.BR``) are fetched, functions run in the worker, a kernel a function returns comes back as its
source (:class:`assignments.probes.KernelSource`) for the house-rules checks.

What it does not do: it is not a container. The worker runs as the same user; it may read files outside
the listed folders (a copy of the package elsewhere on disk is copied source, which a similarity checker
finds) and use the CPU and memory it likes (pytest's timeout and the operating system's limits apply).
The assignments that run in it are :data:`SANDBOXED`, in Numba's CUDA simulator; on a GPU (and for the
other assignments, whose autograders hand the submission's device functions to the grader's own kernels)
the in-process guard grades.
"""

from __future__ import annotations

import builtins
import os
import pickle
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np

from . import guard, probes

#: The assignments graded in the sandbox (in the simulator): those whose graded calls take and return data.
SANDBOXED = frozenset({"a1_online_softmax", "a3_flash_forward", "a4_recompute_backward"})

HERE = Path(__file__).resolve().parent
TUTORIALS = HERE.parent
ROOT = TUTORIALS.parent

#: Modules the worker refuses to import once the submission may run (prefixes of the dotted name).
FORBIDDEN_IMPORTS = ("numba_flash", "numba_flash_reference", "assignments", "conftest", "tests", "torch")
#: Except these, which the worker itself imported first and which hold no answer.
HARMLESS_IMPORTS = ("assignments", "assignments.probes")

#: Audit events refused outright in the worker (prefix match): new processes, C code, file changes.
REFUSED_EVENTS = (
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "pty.spawn", "ctypes.", "os.remove", "os.rename", "os.rmdir", "os.unlink", "os.chmod", "os.chown",
    "os.link", "os.symlink", "os.truncate", "os.putenv", "os.unsetenv", "shutil.", "socket.", "webbrowser.",
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys.set_asyncgen_hooks", "winreg.",
)  # fmt: skip


def _forbidden_dirs(submission: Path) -> list[str]:
    """The folders whose files the worker may not open: the package, its references, the grader (but
    :mod:`assignments.probes`), the solutions, the tests, and the submission's own folder (other
    students' files), with ``/proc``."""
    import importlib.util

    dirs = [HERE, ROOT / "tests", ROOT / "numba_flash", ROOT / "reference", TUTORIALS / "solutions", submission.parent]
    for name in ("numba_flash", "numba_flash_reference"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            dirs.append(Path(spec.origin).parent)
    from .grading import solutions_dir

    dirs.append(solutions_dir())
    return sorted({str(Path(d).resolve()) + os.sep for d in dirs} | {"/proc/"})


def _simulator_patch_file() -> str:
    """numba-flash's simulator patch layer, where the grader's process imported it from (it needs nothing else
    of the package, so the worker runs it by file path)."""
    import importlib.util

    spec = importlib.util.find_spec("numba_flash.runtime.simulator")
    return str(Path(spec.origin).resolve())


class SandboxError(RuntimeError):
    """The worker process failed (it died, or answered something the grader cannot read)."""


class _Worker:
    """One worker process and its pipe (parent side)."""

    def __init__(self, path: Path, module_name: str, label: str):
        submission = Path(path).resolve()
        config = {
            "submission": str(submission),
            "module_name": module_name,
            "forbidden_dirs": _forbidden_dirs(submission),
            "allowed_files": [
                str(submission),
                str(HERE / "probes.py"),
                str(HERE / "__init__.py"),
                str(HERE / "_worker.py"),
            ],
            "simulator_patch": _simulator_patch_file(),
            "tutorials": str(TUTORIALS),
            # the grader's own sys.path (its numpy, its numba; the package too, which the hook refuses by name):
            # ``-I`` drops PYTHONPATH, and a worker with other libraries than the grader's would grade otherwise
            "sys_path": [p for p in sys.path if p],
            "forbidden_imports": FORBIDDEN_IMPORTS,
            "harmless_imports": HARMLESS_IMPORTS,
            "refused_events": REFUSED_EVENTS,
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["NUMBA_ENABLE_CUDASIM"] = "1"  # the sandbox grades in the simulator (see the module docstring)
        self.label = label
        # stderr is the grader's own: pytest captures the submission's prints and shows them with a failing test
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-X", "utf8", str(HERE / "_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(submission.parent),
        )
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        self.send(config)

    def send(self, message):
        try:
            pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise SandboxError(f"{self.label}: the sandboxed submission's process has exited") from None

    def receive(self):
        try:
            return pickle.load(self.proc.stdout)
        except EOFError:
            code = self.proc.wait(timeout=30)
            raise SandboxError(
                f"{self.label}: the sandboxed submission's process exited (status {code}); its traceback and "
                "prints are in the captured stderr"
            ) from None

    def request(self, message):
        self.send(message)
        kind, payload = self.receive()
        if kind == "ok":
            return payload
        if kind == "rejected":
            where = message[1] if message[0] == "call" else self.label
            raise guard.SubmissionRejected(
                f"{where}: the sandbox refuses {payload}: the graded part must be your own code, not numba-flash's "
                "or the autograder's"
            )
        if kind == "raise":
            exc_type, text = payload
            cls = getattr(builtins, exc_type, None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = RuntimeError
            raise cls(text)
        raise SandboxError(f"{self.label}: unexpected answer {kind!r} from the sandbox")


def _stop(proc):
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except Exception:  # a worker that does not exit when its pipe closes is killed
            proc.kill()


def _copy_back(orig, new):
    """Write what a sandboxed call wrote into its arguments (``new``, pickled back) into the originals."""
    if isinstance(orig, np.ndarray) and isinstance(new, np.ndarray):
        if orig.flags.writeable and orig.shape == new.shape:
            np.copyto(orig, new, casting="unsafe")
    elif isinstance(orig, probes._Pickles) and type(orig) is type(new):
        orig.__dict__.update(new.__getstate__())
    elif isinstance(orig, (list, tuple)) and isinstance(new, (list, tuple)) and len(orig) == len(new):
        for a, b in zip(orig, new):
            _copy_back(a, b)
        if isinstance(orig, list):
            orig[:] = [b if not isinstance(a, (np.ndarray, probes._Pickles)) else a for a, b in zip(orig, new)]
    elif isinstance(orig, dict) and isinstance(new, dict):
        for k in orig:
            if k in new:
                _copy_back(orig[k], new[k])


class SandboxedModule:
    """A submission module that lives in a worker process (see the module docstring).

    ``impl.NAME`` fetches a constant, or returns a function whose calls run in the worker; ``impl.NAME = x``
    sets it there.
    """

    def __init__(self, path: Path, module_name: str, label: str):
        object.__setattr__(self, "_worker", _Worker(path, module_name, label))
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "path", Path(path))
        object.__setattr__(self, "_functions", {})
        self._worker.request(("load",))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        kind, value = self._worker.request(("get", name))
        if kind == "value":
            return value
        functions = self._functions
        if name not in functions:
            functions[name] = self._proxy(name)
        return functions[name]

    def _proxy(self, name):
        worker, label = self._worker, f"{self.label}: {name}()"

        def call(*args, **kwargs):
            kinds = [kind for kind, _ in probes.ACTIVE]
            result, args_after, kwargs_after, recorded = worker.request(("call", label, name, args, kwargs, kinds))
            _copy_back(args, args_after)
            _copy_back(kwargs, kwargs_after)
            for (_, sink), found in zip(probes.ACTIVE, recorded):
                sink.extend(found)
            return result

        call.__name__ = call.__qualname__ = name
        return call

    def __setattr__(self, name, value):
        self._worker.request(("set", name, value))

    def __repr__(self):
        return f"<sandboxed submission {self.path}>"


def load(path: Path, module_name: str, label: str) -> SandboxedModule:
    """Statically check ``path`` (as :func:`assignments.guard.load` does), then import it in a worker."""
    source = Path(path).read_text(encoding="utf-8")
    problems = guard.static_problems(source, str(path))
    if problems:
        raise guard.SubmissionRejected(f"{label}: {path} is rejected before it runs:\n  " + "\n  ".join(problems))
    return SandboxedModule(path, module_name, label)
