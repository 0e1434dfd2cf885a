"""The probes a graded call runs with: arrays that count HBM accesses, a stream of blocks, shared arrays that
catch races. They hold no answer, so they are the one part of the grader that a sandboxed submission's
process imports (:mod:`assignments.sandbox`); :mod:`assignments.grading` re-exports them.

Each probe pickles without its lock (and :class:`BlockStream` without its weak references), so a probe
handed to a sandboxed call goes to the submission's process and comes back with its counts.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

#: The probes active in the grader's process, innermost last: ``(kind, sink)`` with kind ``"smem"``
#: (:func:`assignments.grading.record_shared_memory`) or ``"races"``
#: (:func:`assignments.grading.shared_memory_races`). A sandboxed call runs its launches under the same probes
#: in the worker and appends what they found to each sink.
ACTIVE: list[tuple[str, list]] = []


class KernelSource(NamedTuple):
    """A kernel (or function) that a sandboxed call returned, as its source: what the house-rules checks read."""

    source: str
    first_line: int
    name: str


class _Pickles:
    """Pickle support for probes that hold a lock: the lock is left out and made anew."""

    _UNPICKLED = ("_lock",)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in self._UNPICKLED}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


class _ArrayLike(_Pickles):
    """A probe that stands for the array ``self.data`` in a kernel: its shape, size, dtype and length."""

    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    dtype = property(lambda self: self.data.dtype)

    def __len__(self):
        return len(self.data)


class CountingArray(_ArrayLike):
    """A kernel argument whose every element read, write and atomic update is counted (simulator only).

    Pass it to a ``@cuda.jit`` kernel in place of a NumPy array. The simulator hands non-NumPy
    arguments to its Python threads unchanged, so ``A[i, j]`` inside the kernel calls
    :meth:`__getitem__` here: one counted HBM read per element, ``A[i, j] = x`` one counted write,
    ``cuda.atomic.add(A, (i, j), x)`` one counted atomic (not a read plus a write; needs
    :func:`assignments.grading.install_simulator_patches`). On a real GPU a kernel cannot take this object; IO-budget
    tests are simulator-only.

    Attributes
    ----------
    data : ndarray
        The underlying array (read it after the launch for the kernel's output).
    reads, writes, atomics : ndarray of int64
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
        self.atomics = np.zeros(self.data.shape, np.int64)
        self._lock = threading.Lock()  # simulator threads are real Python threads

    def __getitem__(self, idx):
        value = self.data[idx]  # raises IndexError on an out-of-bounds load (a GPU would read garbage)
        with self._lock:
            self.reads[idx] += 1
        return value

    def __setitem__(self, idx, value):
        self.data[idx] = value
        with self._lock:
            self.writes[idx] += 1

    def atomic_add(self, idx, value):
        """``cuda.atomic.add`` on this array: one counted atomic; returns the old value."""
        with self._lock:
            old = self.data[idx]
            self.data[idx] += value
            self.atomics[idx] += 1
        return old

    def describe(self) -> str:
        """One line: total and per-element maximum of reads, writes (and atomics, if any)."""
        text = (
            f"{self.name}: {int(self.reads.sum())} reads (max {int(self.reads.max(initial=0))} per element), "
            f"{int(self.writes.sum())} writes (max {int(self.writes.max(initial=0))} per element)"
        )
        if self.atomics.any():
            text += f", {int(self.atomics.sum())} atomics (max {int(self.atomics.max())} per element)"
        return text


class BlockStream(_Pickles):
    """Column blocks ``(S_j, V_j)`` handed out one at a time, checking that the consumer keeps only the current one.

    When block ``j`` is requested, blocks ``j - 2`` and older must be garbage (the previous block may
    still be bound to the consumer's loop variables). Problems are recorded in :attr:`problems` (not
    raised into the consumer's code, which could swallow them); :attr:`handed` counts the blocks.
    Defined here, not in an autograder, because the graded code itself iterates it.
    """

    def __init__(self, S, V, Bc):
        self._S, self._V, self._Bc = S, V, Bc
        self._j = 0
        self._alive = []
        self.handed = 0
        self.problems: list[str] = []

    _UNPICKLED = ("_alive",)

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._alive = []  # weak references do not pickle: a stream is consumed in the process it was sent to

    def __iter__(self):
        return self

    def __next__(self):
        import gc
        import weakref

        if self._j >= self._S.shape[1]:
            raise StopIteration
        gc.collect()
        kept = [k for k, ref in enumerate(self._alive[:-1]) if ref() is not None]
        if kept:
            self.problems.append(f"blocks {kept} are still referenced when block {len(self._alive)} is requested")
        j, Bc = self._j, self._Bc
        S_j, V_j = self._S[:, j : j + Bc].copy(), self._V[j : j + Bc].copy()
        self._alive.append(weakref.ref(S_j))
        self._j += Bc
        self.handed += 1
        return S_j, V_j


class SharedRaceArray(_ArrayLike):
    """A shared array whose every access is checked against the barrier epochs of the simulator's threads.

    Each thread counts the barriers it has passed (its *epoch*). Two accesses to one element by two
    threads in the same epoch, at least one a write, are a race: no barrier orders them, whatever
    order they happened to run in.
    """

    def __init__(self, data, where, log):
        self.data = data
        self.where = where
        self._log = log
        self._lock = threading.Lock()
        self._last_write = {}
        self._readers = {}

    @staticmethod
    def _who():
        t = threading.current_thread()
        return tuple(getattr(t, "threadIdx", (-1,))), getattr(t, "_nf_epoch", 0)

    @staticmethod
    def _key(idx):
        if isinstance(idx, tuple):
            return tuple(int(i) for i in idx)
        return (int(idx),)

    def _race(self, kind, key, other, me, epoch):
        if len(self._log) < 20:
            self._log.append(
                f"{kind} race on shared array {self.where}[{', '.join(map(str, key))}]: threads {other} and {me} "
                f"touch it between the same two barriers (barrier interval {epoch})"
            )

    def __getitem__(self, idx):
        me, epoch = self._who()
        key = self._key(idx)
        with self._lock:
            w = self._last_write.get(key)
            if w is not None and w[1] == epoch and w[0] != me:
                self._race("write-read", key, w[0], me, epoch)
            r = self._readers.get(key)
            if r is None or r[0] != epoch:
                self._readers[key] = (epoch, {me})
            else:
                r[1].add(me)
        return self.data[idx]

    def __setitem__(self, idx, value):
        me, epoch = self._who()
        key = self._key(idx)
        with self._lock:
            w = self._last_write.get(key)
            if w is not None and w[1] == epoch and w[0] != me:
                self._race("write-write", key, w[0], me, epoch)
            r = self._readers.get(key)
            if r is not None and r[0] == epoch and (r[1] - {me}):
                self._race("read-write", key, sorted(r[1] - {me})[0], me, epoch)
            self._last_write[key] = (me, epoch)
        self.data[idx] = value
