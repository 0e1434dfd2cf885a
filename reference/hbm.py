"""Instrumented "HBM" arrays: every element read from or written to them is counted.

The IO model (:mod:`numba_flash_reference.io_model`) makes Theorems 2 and 5 testable by running the
reference algorithms on :class:`HBMArray` s instead of plain arrays. A reference that is handed
``counter=HBMCounter()`` wraps its HBM-resident inputs and outputs (Q, K, V, O, l, m, dO, ...) in
:class:`HBMArray`; every ``x[...]`` load is then a counted read of ``size`` elements and every
``x[...] = y`` store a counted write. Arrays that live "on chip" (SRAM tiles, accumulators) stay plain
NumPy arrays and cost nothing. The counts therefore follow the code's actual loads and stores, not
comments about them.

Without a counter the wrappers are not used at all (``hbm(x, None)`` returns ``x``), so the ordinary
references run at NumPy speed.

    >>> import numpy as np
    >>> c = HBMCounter()
    >>> gQ = HBMArray(np.zeros((8, 4)), c)
    >>> tile = gQ[0:2]            # reads 2*4 elements
    >>> gQ[2:4] = tile + 1        # writes 2*4 elements
    >>> (c.reads, c.writes)
    (8, 8)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class HBMCounter:
    """Element counts of HBM reads and writes, optionally broken down by array name."""

    reads: int = 0
    writes: int = 0
    by_name: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def _add(self, name, kind, n):
        if kind == "r":
            self.reads += n
        else:
            self.writes += n
        r, w = self.by_name.get(name, (0, 0))
        self.by_name[name] = (r + n, w) if kind == "r" else (r, w + n)

    def read(self, n: int, name: str = "?") -> None:
        """Count ``n`` elements read (for loads that do not go through an HBMArray)."""
        self._add(name, "r", int(n))

    def write(self, n: int, name: str = "?") -> None:
        """Count ``n`` elements written."""
        self._add(name, "w", int(n))


class HBMArray:
    """A NumPy array in "HBM": indexing reads and item assignment writes are counted."""

    __slots__ = ("data", "counter", "name")

    def __init__(self, data: np.ndarray, counter: HBMCounter, name: str = "?"):
        self.data = data
        self.counter = counter
        self.name = name

    @property
    def shape(self):
        return self.data.shape

    def __getitem__(self, idx):
        out = self.data[idx]
        self.counter.read(np.size(out), self.name)
        # A copy: what was read now lives on chip; later writes to HBM must be explicit.
        return np.array(out, copy=True)

    def __setitem__(self, idx, value):
        self.data[idx] = value
        self.counter.write(np.size(self.data[idx]), self.name)


def hbm(x: np.ndarray, counter: HBMCounter | None, name: str = "?"):
    """Wrap ``x`` as an :class:`HBMArray` when counting, else return it unchanged."""
    return x if counter is None else HBMArray(x, counter, name)
