"""The launch above 48 KB of dynamic SRAM (:mod:`numba_flash.runtime.smem`), with a stand-in for numba-cuda's
dispatcher.

The opt-in only happens on a GPU (the simulator has no limit), so these tests replace the dispatcher, the device
and the driver call by fakes that behave as the real ones do where it matters: the dispatcher types its arguments
and compiles an overload per argument types, and the "driver" refuses a launch of an overload whose attribute is
below the launch's dynamic SRAM. Claims checked:

* Every launch above 48 KB types its arguments in Python to find the overload, and opts that overload in; new
  argument types get their own overload, opted in before its first launch (the driver would refuse it otherwise).
* A launch that fails for another reason still raises; a request above the device's limit raises before the launch.
* Launches up to 48 KB need no opt-in.
"""

from __future__ import annotations

from types import SimpleNamespace

from numba_flash.runtime import smem as _smem

import pytest

LIMIT = 227 * 1024


class FakeDispatcher:
    """Overloads by argument types; ``[config](*args)`` compiles if needed and 'launches' through a fake driver."""

    def __init__(self, opted):
        self.overloads = {}
        self.python_typings = 0  # calls of _compile_for_args (the Python typing _smem does)
        self.launches = []
        self._opted = opted  # the fake driver's attributes: id(cufunc) -> bytes

    def _compile(self, args):
        sig = tuple(type(a).__name__ for a in args)
        if sig not in self.overloads:
            cufunc = SimpleNamespace(device=SimpleNamespace(id=0), attrs=SimpleNamespace(shared=0))
            self.overloads[sig] = SimpleNamespace(_codelibrary=SimpleNamespace(get_cufunc=lambda c=cufunc: c), sig=sig)
        return self.overloads[sig]

    def _compile_for_args(self, *args):
        self.python_typings += 1
        return self._compile(args)

    def __getitem__(self, config):
        grid, block, stream, nbytes = config

        def run(*args):
            kernel = self._compile(args)  # the real dispatcher types in C here
            if grid == "bad":
                raise ValueError("invalid grid")
            if nbytes > _smem.DEFAULT_LIMIT_BYTES and self._opted.get(id(kernel._codelibrary.get_cufunc()), 0) < nbytes:
                raise RuntimeError("CUDA_ERROR_INVALID_VALUE: too much dynamic shared memory")  # what the driver says
            self.launches.append((kernel.sig, nbytes))

        return run


@pytest.fixture
def fake_gpu(monkeypatch):
    opted = {}

    def set_max_dynamic(cufunc, nbytes):
        if nbytes > LIMIT:
            raise ValueError("too much")
        opted[id(cufunc)] = max(opted.get(id(cufunc), 0), nbytes)
        _smem._opted_in[(id(cufunc), 0)] = opted[id(cufunc)]

    monkeypatch.setattr(_smem._backend, "is_simulator", lambda: False)
    monkeypatch.setattr(_smem, "_set_max_dynamic", set_max_dynamic)
    monkeypatch.setattr(_smem, "_opted_in", {})
    return FakeDispatcher(opted)


def test_every_launch_types_its_arguments_in_python_and_opts_its_overload_in(fake_gpu):
    for _ in range(3):
        _smem.launch(fake_gpu, 1, 32, 100_000, 1.0, 2)
    assert fake_gpu.python_typings == 3 and len(fake_gpu.launches) == 3
    _smem.launch(fake_gpu, 1, 32, 100_000, 1, 2)  # new argument types: a new overload, opted in before its launch
    assert len(fake_gpu.overloads) == 2 and fake_gpu.launches[-1] == (("int", "int"), 100_000)
    _smem.launch(fake_gpu, 1, 32, 150_000, 1.0, 2)  # more SRAM than the attribute allows: raised first
    assert fake_gpu.launches[-1] == (("float", "int"), 150_000)


def test_a_launch_that_fails_for_another_reason_still_raises(fake_gpu):
    _smem.launch(fake_gpu, 1, 32, 100_000, 1.0, 2)
    with pytest.raises(ValueError, match="invalid grid"):
        _smem.launch(fake_gpu, "bad", 32, 100_000, 1.0, 2)
    with pytest.raises(ValueError, match="too much"):
        _smem.launch(fake_gpu, 1, 32, LIMIT + 1, 1.0, 2)


def test_small_launches_need_no_opt_in(fake_gpu):
    _smem.launch(fake_gpu, 1, 32, 48 * 1024, 1.0, 2)
    assert fake_gpu.python_typings == 0 and fake_gpu.launches == [(("float", "int"), 48 * 1024)]
