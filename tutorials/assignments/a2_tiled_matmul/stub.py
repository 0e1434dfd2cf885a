"""Assignment 2: a tiled matrix multiply with shared memory, in Numba CUDA.  <-- your file.

Read first: ``tutorials/03_first_numba_kernel.py`` (it builds the naive kernel and explains
``cuda.shared.array`` and ``cuda.syncthreads``).

The task: ``C = A @ B`` for float32 ``A (m, k)``, ``B (k, n)``, with each thread block computing one
``TILE x TILE`` tile of ``C``. The naive kernel (one thread per output, reading its row of A and column
of B straight from global memory) reads every element of A ``n`` times. Yours must read it at most
``ceil(n / TILE)`` times, and every element of B at most ``ceil(m / TILE)`` times, by staging tiles of A
and B in shared memory, as FlashAttention stages tiles of K and V.

Graded (``python -m pytest tutorials/assignments/a2_tiled_matmul``):

* ``C`` is right for ragged shapes (m, k, n not multiples of TILE), to twice the error of a float32
  dot product (your kernel must never read or write out of bounds: the simulator raises IndexError);
* the IO budget above (counted per element in the simulator), and each ``C`` element written once;
* at most ``2 TILE^2`` float32 of shared memory per block, and some (tiles must live in SRAM);
* house style: one ``cuda.shared.array`` per source line (two on one line alias in the simulator) and a
  ``# Sync: <what it protects>`` comment on every ``cuda.syncthreads()``.

Keep ``cuda`` a module-level global (the simulator swaps it). Do not import numba-flash: the autograder
chooses the backend before it loads this file, and a submission that imports the package is rejected.
"""

from __future__ import annotations

from numba import cuda, float32  # noqa: F401  (you will need float32 for the shared tiles)

TILE = 8  # tile edge; the autograder reads it (4 <= TILE and TILE * TILE <= 1024)


@cuda.jit
def matmul_kernel(A, B, C):
    """``C = A @ B`` for float32 ``A (m, k)``, ``B (k, n)``, ``C (m, n)``; one ``TILE x TILE`` tile of C per block.

    Suggested plan (``row``, ``col``: this thread's output element):

    1. Declare two ``(TILE, TILE)`` float32 shared tiles, ``sA`` and ``sB`` (one per line).
    2. For each of the ``ceil(k / TILE)`` tiles along the inner dimension:
       each thread loads ONE element of ``A``'s tile and ONE of ``B``'s tile (0 past the edges);
       barrier; accumulate ``TILE`` products from SRAM; barrier.
    3. Write ``C[row, col]`` if it is inside ``C``.
    """
    # TODO: your kernel
    raise NotImplementedError("a2: matmul_kernel")


def matmul(A, B, C):
    """Launch :func:`matmul_kernel` on ``A (m, k)``, ``B (k, n)``, writing ``C (m, n)``.

    Pass the arrays to the kernel as they are (no copies: the autograder may hand you arrays that
    count their accesses). Choose the grid so that every element of ``C`` has exactly one thread.
    """
    # TODO: grid = (blocks along n, blocks along m); block = (TILE, TILE); launch
    raise NotImplementedError("a2: matmul (the launch)")
