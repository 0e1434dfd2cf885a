"""Assignment 2, solution (course staff): a tiled matrix multiply with shared memory, in Numba CUDA.

What it shows: the tiling that FlashAttention applies to attention, on the simplest kernel that needs
it. Each thread block owns a ``TILE x TILE`` tile of ``C``; it walks along the inner dimension one tile
at a time, loading a tile of ``A`` and one of ``B`` into shared memory (SRAM) with one element per
thread, and every thread then reads ``TILE`` values of each from SRAM instead of HBM. A element is
therefore read from HBM once per block *column* of the grid, ``ceil(n / TILE)`` times, instead of ``n``
times (once per output it contributes to).

Launch geometry: grid ``(ceil(n / TILE), ceil(m / TILE))`` blocks of ``(TILE, TILE)`` threads;
``threadIdx.x`` walks the columns, so neighbouring threads touch neighbouring addresses of a row
(coalesced loads). SRAM: ``2 TILE^2`` float32 = 512 bytes at ``TILE = 8``.

Kept by course staff: ``stub.py`` is the student's copy.
"""

from __future__ import annotations

from numba import cuda, float32

TILE = 8


@cuda.jit
def matmul_kernel(A, B, C):
    """``C = A @ B`` for float32 ``A (m, k)``, ``B (k, n)``, ``C (m, n)``; one ``TILE x TILE`` tile of C per block.

    ==========================  ==============  ==================
    symbol                      variable        memory space
    ==========================  ==============  ==================
    A, B, C                     A, B, C         global (HBM)
    tile of A / of B            sA, sB          shared (SRAM)
    C[row, col] accumulator     acc             registers
    ==========================  ==============  ==================
    """
    sA = cuda.shared.array((TILE, TILE), float32)  # (TILE, TILE) SRAM: A[rows of the block, one k-tile]
    sB = cuda.shared.array((TILE, TILE), float32)  # (TILE, TILE) SRAM: B[one k-tile, cols of the block]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    m, k = A.shape
    n = B.shape[1]

    acc = float32(0.0)
    for t in range((k + TILE - 1) // TILE):
        # each thread loads one element of each tile; past a ragged edge it stores 0, which adds nothing
        a_col = t * TILE + tx
        b_row = t * TILE + ty
        if row < m and a_col < k:
            sA[ty, tx] = A[row, a_col]  # HBM read: 1 per thread, TILE^2 per block
        else:
            sA[ty, tx] = 0.0
        if b_row < k and col < n:
            sB[ty, tx] = B[b_row, col]  # HBM read: 1 per thread, TILE^2 per block
        else:
            sB[ty, tx] = 0.0
        cuda.syncthreads()  # Sync: both tiles are complete in SRAM before any thread reads them
        for p in range(TILE):
            acc += sA[ty, p] * sB[p, tx]
        cuda.syncthreads()  # Sync: every thread is done with these tiles before the next t overwrites them
    if row < m and col < n:
        C[row, col] = acc  # HBM write: 1 per output


def matmul(A, B, C):
    """Launch :func:`matmul_kernel` on ``A (m, k)``, ``B (k, n)``, writing ``C (m, n)``.

    The arrays are passed to the kernel as they are (NumPy arrays, device arrays, or the autograder's
    counting arrays in the simulator).
    """
    m, n = A.shape[0], B.shape[1]
    grid = ((n + TILE - 1) // TILE, (m + TILE - 1) // TILE)  # x: block columns, y: block rows
    matmul_kernel[grid, (TILE, TILE)](A, B, C)
