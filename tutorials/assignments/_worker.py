"""The worker process of :mod:`assignments.sandbox`: run as ``python -I _worker.py``, its configuration pickled
on stdin, the grader's requests and its answers pickled on the same pipe.

It imports NumPy, Numba (the simulator), numba-flash's simulator patch layer by file path and
:mod:`assignments.probes`, installs the audit hook that refuses everything :mod:`assignments.sandbox` lists,
and only then imports the submission. Nothing of numba-flash's package, its references or the grader is
imported here, before or after.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import pickle
import sys
import traceback


def main():
    proto_in = sys.stdin.buffer
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the submission's prints go to stderr, not into the pipe
    sys.stdout = sys.stderr
    config = pickle.load(proto_in)
    sys.dont_write_bytecode = True
    sys.path[:] = [config["tutorials"], *config["sys_path"]]
    sys.setswitchinterval(1e-3)  # as tutorials/conftest.py: the simulator's threads hand over the GIL more often

    from numba import cuda  # noqa: F401  (the simulator, chosen by NUMBA_ENABLE_CUDASIM)

    spec = importlib.util.spec_from_file_location("_nf_simulator_patch", config["simulator_patch"])
    sim = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sim
    spec.loader.exec_module(sim)
    sim.install_on_import()
    sim._kernelapi_module()
    sim.install_barrier_epochs()
    from assignments import probes as _probes
    from assignments.guard import materialize as _materialize  # the guard's, with kernels sent back as their source

    sim.route_atomic_add(_probes.CountingArray)

    refused: list[str] = []
    forbidden_dirs = tuple(config["forbidden_dirs"])
    allowed_files = frozenset(config["allowed_files"])
    forbidden, harmless = tuple(config["forbidden_imports"]), frozenset(config["harmless_imports"])
    refused_events = tuple(config["refused_events"])

    def forbidden_name(name):
        return name not in harmless and any(name == p or name.startswith(p + ".") for p in forbidden)

    def refuse(what):
        refused.append(what)
        raise PermissionError(f"the sandbox refuses {what}: the graded part must be your own code")

    def hook(event, args):
        if event == "import":
            if forbidden_name(args[0] or ""):
                refuse(f"importing {args[0]!r}")
        elif event == "pickle.find_class":
            if forbidden_name(args[0] or ""):
                refuse(f"unpickling from {args[0]!r}")
        elif event == "open":
            path, mode = args[0], args[1]
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                refuse(f"opening {path!r} for writing")
            if isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC):
                refuse(f"opening {path!r} for writing")
            if isinstance(path, (str, bytes, os.PathLike)):
                full = os.path.realpath(os.fsdecode(path))
                if full not in allowed_files and (full + os.sep).startswith(forbidden_dirs):
                    refuse(f"opening {full!r}")
        elif event.startswith(refused_events):
            refuse(f"the operation {event!r}")

    # Past this line nothing in this process can remove the hook; the submission's first line runs after it.
    sys.addaudithook(hook)

    def answer(kind, payload):
        pickle.dump((kind, payload), proto_out, protocol=pickle.HIGHEST_PROTOCOL)
        proto_out.flush()

    def outcome(run, *args):
        """Run ``run(*args)``; answer its result, a refusal, or the exception it raised."""
        del refused[:]
        try:
            result = run(*args)
        except BaseException as exc:  # every failure of the submission is reported to the grader
            if refused:
                return answer("rejected", "; ".join(dict.fromkeys(refused)))
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return answer("raise", (type(exc).__name__, text))
        if refused:
            return answer("rejected", "; ".join(dict.fromkeys(refused)))
        try:
            payload = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # a result the grader cannot receive fails the call, saying why
            return answer("raise", ("TypeError", f"the result cannot be sent back to the grader: {exc}"))
        proto_out.write(payload)
        proto_out.flush()
        return None

    module = None

    def as_source(value):
        """A kernel or function goes back to the grader as its source; anything else as it is."""
        py_func = getattr(value, "py_func", None)
        if callable(value) and (py_func is not None or inspect.isfunction(value)):
            fn = inspect.unwrap(py_func or value)
            lines, first = inspect.getsourcelines(fn)
            return _probes.KernelSource("".join(lines), first, getattr(fn, "__qualname__", "?"))
        return value

    def materialize(value):
        return _materialize(value, as_source)

    def load():
        # compiled from its source, not through the import system, so that no bytecode cache is read or written
        nonlocal module
        import types

        module = types.ModuleType(config["module_name"])
        module.__file__ = config["submission"]
        sys.modules[config["module_name"]] = module  # kernels and dataclasses look their module up by name
        with open(config["submission"], encoding="utf-8") as f:
            code = compile(f.read(), config["submission"], "exec")
        exec(code, module.__dict__)

    def get(name):
        value = getattr(module, name)
        if callable(value):
            return ("callable", None)
        return ("value", materialize(value))

    @contextlib.contextmanager
    def record_into(sink):
        """``sim.record_shared_memory()`` whose sizes go into ``sink`` when the block ends."""
        with sim.record_shared_memory() as sizes:
            yield
        sink.extend(sizes)

    def call(name, args, kwargs, kinds):
        recorded = [[] for _ in kinds]
        with contextlib.ExitStack() as stack:
            for kind, sink in zip(kinds, recorded):
                if kind == "smem":
                    stack.enter_context(record_into(sink))
                elif kind == "races":
                    stack.enter_context(
                        sim.watch_shared_arrays(lambda d, w, log=sink: _probes.SharedRaceArray(d, w, log))
                    )
            result = materialize(getattr(module, name)(*args, **kwargs))
        return result, materialize(list(args)), materialize(kwargs), recorded

    while True:
        try:
            message = pickle.load(proto_in)
        except EOFError:
            return
        op = message[0]
        if op == "load":
            outcome(load)
        elif op == "get":
            outcome(get, message[1])
        elif op == "set":
            outcome(setattr, module, message[1], message[2])
        elif op == "call":
            outcome(call, *message[2:])


if __name__ == "__main__":
    main()
