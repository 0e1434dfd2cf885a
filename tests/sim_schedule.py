"""A deterministic barrier checker for Numba's CUDA simulator: threads one at a time, SRAM full of NaN.

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

from __future__ import annotations

import contextlib
import sys
import threading
import traceback

import numpy as np


def _simulator_modules():
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator import kernelapi

    return simkernel, kernelapi


def _poisoned(shape, dtype):
    arr = np.empty(shape, dtype)
    if np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.complexfloating):
        arr.fill(np.nan)
    else:
        arr.view(np.uint8).fill(0xFF)
    return arr


def _make_classes():
    simkernel, kernelapi = _simulator_modules()
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

        def syncthreads(self):
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

            threads = [TurnThread(target, self, grid_point, bp, self._debug, yielded) for bp in np.ndindex(*self._block_dim)]
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

    original_array = kernelapi.FakeCUDAShared.array

    def poisoned_array(self, shape, dtype, alignment=None):
        """``cuda.shared.array`` whose first allocation at a source line is full of NaN."""
        if shape == 0 or alignment is not None:
            return original_array(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        # The simulator identifies a declaration by the caller's (file, line), as the original does.
        caller = traceback.extract_stack(sys._getframe(1), limit=1)[0][0:2]
        res = self._allocations.get(caller)
        if res is None:
            res = _poisoned(shape, dtype)
            self._allocations[caller] = res
        return res

    original_init = kernelapi.FakeCUDAShared.__init__

    def poisoned_init(self, dynshared_size):
        original_init(self, dynshared_size)
        self._dynshared.fill(-1)  # all bits set: NaN as float32 / float64

    return simkernel, kernelapi, OneAtATimeBlockManager, poisoned_array, poisoned_init


@contextlib.contextmanager
def one_thread_at_a_time():
    """Within this block, simulated kernels run one thread at a time with NaN-filled shared memory."""
    simkernel, kernelapi, manager, poisoned_array, poisoned_init = _make_classes()
    call_globals = simkernel.FakeCUDAKernel.__call__.__globals__
    saved = (call_globals["BlockManager"], kernelapi.FakeCUDAShared.array, kernelapi.FakeCUDAShared.__init__)
    call_globals["BlockManager"] = manager
    kernelapi.FakeCUDAShared.array = poisoned_array
    kernelapi.FakeCUDAShared.__init__ = poisoned_init
    try:
        yield
    finally:
        call_globals["BlockManager"], kernelapi.FakeCUDAShared.array, kernelapi.FakeCUDAShared.__init__ = saved
