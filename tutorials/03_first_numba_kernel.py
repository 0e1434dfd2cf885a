"""Tutorial 03: your first Numba CUDA kernels, from one thread per element to shared-memory tiles.

Paper: the first line of standard attention, ``S = Q K^T`` (FA1 Algorithm 0 line 1), computed the way
every FlashAttention kernel computes its score tiles (FA1 Algorithm 1 line 9). Run it (a few seconds
in the simulator, instant on a GPU)::

    python tutorials/03_first_numba_kernel.py                              # GPU if present, else simulator
    NUMBA_FLASH_BACKEND=simulator python tutorials/03_first_numba_kernel.py  # force the simulator

What you learn
--------------
1. The CUDA execution model in Numba: a kernel is one Python function run by many threads, grouped in
   blocks; ``cuda.grid``, bounds guards, ``kernel[grid, block](...)``, host/device copies.
2. Why the naive kernel is memory-bound: counted in the simulator, it reads every element of Q and K
   from global memory (HBM) N times.
3. Tiling with ``cuda.shared.array`` and ``cuda.syncthreads``: a block loads a tile once into on-chip
   SRAM and all its threads reuse it; global reads drop by the tile size. This is FlashAttention's
   idea, on the simplest kernel that has it.
4. Two traps of the simulator (numba-flash's house rules): one ``cuda.shared.array`` per source line,
   and ``cuda`` as a module-level global.

Launch geometry of the tiled kernel: grid ``(N / TILE, N / TILE)``, block ``(TILE, TILE)``; thread
``(tx, ty)`` of block ``(bx, by)`` computes ``S[by*TILE + ty, bx*TILE + tx]``. SRAM: ``2 TILE^2`` float32.

Read alongside: ``numba_flash/alg1_forward.py`` (its tiles are the same ``cuda.shared.array`` s).
Next: ``04_tiled_flash_forward.py``; assignment ``assignments/a2_tiled_matmul`` (the general,
ragged-edged matmul, graded against an IO budget).
"""

# ------------------------------------------------------------------------------------------------
# 0. Backend. Numba decides ONCE, when numba.cuda is first imported, whether kernels run on a GPU or
#    in its CUDA simulator (NUMBA_ENABLE_CUDASIM=1: every CUDA thread becomes a Python thread; same
#    semantics, slow, timings meaningless). `import numba_flash` makes that choice (GPU if present),
#    so it comes before `from numba import cuda`.
#    `cuda` must be a module-level global in a module that defines kernels: the simulator swaps it
#    for a fake module in the kernel's globals while the kernel runs.
# ------------------------------------------------------------------------------------------------
import math
import sys
from pathlib import Path

import numba_flash

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for assignments.grading when run from elsewhere
from assignments.grading import CountingArray, assert_error_rule, matmul_naive32, record_shared_memory

TILE = 8


def section(title):
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}")


# ------------------------------------------------------------------------------------------------
# 1. A first kernel: y = alpha * x + y (SAXPY), one thread per element.
#    cuda.grid(1) = blockIdx.x * blockDim.x + threadIdx.x, this thread's global index. The grid is
#    rounded up to whole blocks, so the last block has threads past the end: the guard stops them
#    (on a GPU an out-of-bounds store silently corrupts memory; the simulator raises IndexError).
# ------------------------------------------------------------------------------------------------
# [doc:tut03-saxpy]
@cuda.jit
def saxpy_kernel(alpha, x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = alpha * x[i] + y[i]  # HBM: 2 reads, 1 write per thread


# [/doc:tut03-saxpy]


# ------------------------------------------------------------------------------------------------
# 2. S = Q K^T, naively: one thread per element of S, each reading a row of Q and a row of K
#    (K^T's column is K's row) straight from global memory.
# ------------------------------------------------------------------------------------------------
# [doc:tut03-naive-qkt]
@cuda.jit
def qkt_naive_kernel(Q, K, S):
    j, i = cuda.grid(2)  # x walks the columns of S (neighbouring threads write neighbouring addresses)
    if i < S.shape[0] and j < S.shape[1]:
        acc = float32(0.0)
        for c in range(Q.shape[1]):
            acc += Q[i, c] * K[j, c]  # HBM read: 2 per product, 2d per thread
        S[i, j] = acc


# [/doc:tut03-naive-qkt]


# ------------------------------------------------------------------------------------------------
# 3. S = Q K^T with shared-memory tiles (N and d multiples of TILE here; the ragged case is
#    assignment a2). Block (bx, by) computes the TILE x TILE tile S[rows, cols]. It walks along d one
#    tile at a time: each thread loads ONE element of the Q tile and ONE of the K tile into SRAM,
#    then every thread reads TILE values of each from SRAM. Each Q and K element is therefore loaded
#    by N / TILE blocks instead of by N threads.
#
#    cuda.syncthreads() is a barrier for the threads of one block: no thread passes it until all have
#    reached it. Two are needed per tile: after the loads (nobody may read a tile that is not
#    complete) and after the products (nobody may overwrite a tile someone is still reading).
# ------------------------------------------------------------------------------------------------
# [doc:tut03-tiled-qkt]
@cuda.jit
def qkt_tiled_kernel(Q, K, S):
    sQ = cuda.shared.array((TILE, TILE), float32)  # (TILE, TILE) SRAM: Q[rows, one d-tile]
    sK = cuda.shared.array((TILE, TILE), float32)  # (TILE, TILE) SRAM: K[cols, one d-tile]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty  # this thread's row of S (a query)
    col = cuda.blockIdx.x * TILE + tx  # this thread's column of S (a key)
    acc = float32(0.0)
    for t in range(Q.shape[1] // TILE):
        # thread (tx, ty) loads Q[row, t*TILE + tx] and K[block's key ty, t*TILE + tx]:
        # neighbouring tx read neighbouring addresses (coalesced)
        sQ[ty, tx] = Q[row, t * TILE + tx]  # HBM read: 1 per thread
        sK[ty, tx] = K[cuda.blockIdx.x * TILE + ty, t * TILE + tx]  # HBM read: 1 per thread
        cuda.syncthreads()  # Sync: the Q and K tiles are complete in SRAM before anyone reads them
        for c in range(TILE):
            acc += sQ[ty, c] * sK[tx, c]
        cuda.syncthreads()  # Sync: every thread is done with these tiles before the next t overwrites them
    S[row, col] = acc  # HBM write: 1 per thread


# [/doc:tut03-tiled-qkt]


# ------------------------------------------------------------------------------------------------
# 4. The simulator's first trap: it identifies a shared array by the SOURCE LINE that declares it.
#    Two declarations on one line become the SAME array in the simulator (not on a GPU). Hence the
#    house rule: one cuda.shared.array per line.
# ------------------------------------------------------------------------------------------------
@cuda.jit
def aliasing_demo_kernel(out):
    sA, sB = cuda.shared.array(4, float32), cuda.shared.array(4, float32)  # DON'T: both on one line
    i = cuda.threadIdx.x
    sA[i] = 1.0
    sB[i] = 2.0
    cuda.syncthreads()  # Sync: both arrays written before they are read
    out[i] = sA[i]  # 1.0 on a GPU; 2.0 in the simulator, where sA and sB are one array


def main():
    print(f"backend: {numba_flash.describe()}")
    rng = np.random.default_rng(0)

    section("1. SAXPY: one thread per element")
    n = 1000
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    threads = 128
    blocks = math.ceil(n / threads)  # 8 blocks of 128 threads = 1024 threads for 1000 elements
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)  # host -> device copies (no-ops in the simulator)
    saxpy_kernel[blocks, threads](np.float32(2.0), d_x, d_y)
    result = d_y.copy_to_host()
    print(f"{blocks} blocks x {threads} threads; max |y_kernel - (2x + y)| = {np.abs(result - (2 * x + y)).max():.1e}")
    assert np.allclose(result, 2 * x + y, rtol=1e-6, atol=1e-6)

    section("2. and 3. S = Q K^T: naive vs tiled, global-memory reads counted")
    N, d = 24, 16  # multiples of TILE = 8
    Q, K = rng.standard_normal((N, d)).astype(np.float32), rng.standard_normal((N, d)).astype(np.float32)
    S_ref = Q.astype(np.float64) @ K.T
    for name, kernel, grid, block in (
        ("naive", qkt_naive_kernel, (math.ceil(N / TILE), math.ceil(N / TILE)), (TILE, TILE)),
        ("tiled", qkt_tiled_kernel, (N // TILE, N // TILE), (TILE, TILE)),
    ):
        S = np.full((N, N), np.nan, dtype=np.float32)  # poisoned: an unwritten element shows up as NaN
        d_S = cuda.to_device(S)
        kernel[grid, block](cuda.to_device(Q), cuda.to_device(K), d_S)
        S = d_S.copy_to_host()
        print(f"{name}: grid {grid}, block {block}: max |S - Q K^T| = {np.abs(S - S_ref).max():.1e}")
        # numba-flash's error rule: at most twice the error of plain float32 dot products, plus a few ulps
        assert_error_rule(S, S_ref, matmul_naive32(Q, K.T), what=f"S ({name})")
        if numba_flash.is_simulator():
            # In the simulator a kernel argument that is not a NumPy array reaches the Python
            # "threads" as it is, so a CountingArray sees (and counts) every global load and store.
            gQ, gK, gS = CountingArray(Q, "Q"), CountingArray(K, "K"), CountingArray(np.zeros((N, N), np.float32), "S")
            with record_shared_memory() as smem:
                kernel[grid, block](gQ, gK, gS)
            print(f"    {gQ.describe()}\n    {gK.describe()}\n    shared memory per block: {max(smem)} bytes")
            expected_reads = N if name == "naive" else N // TILE
            assert gQ.reads.max() == gQ.reads.min() == expected_reads and gK.reads.max() == expected_reads
    print(f"tiling cut the reads of every Q and K element from N = {N} to N / TILE = {N // TILE}.")
    print("(On a GPU, run this under `ncu --metrics dram__bytes_read.sum` to see the same effect in bytes.)")

    section("4. Simulator trap: two shared arrays on one source line alias each other")
    if numba_flash.is_simulator():
        out = np.zeros(4, dtype=np.float32)
        aliasing_demo_kernel[1, 4](out)
        print(f"sA after writing 1.0 to sA and 2.0 to sB: {out}: the simulator made them one array")
        assert np.all(out == 2.0)
    else:
        print("(a simulator-only effect: on a GPU the two arrays are separate; run with NUMBA_FLASH_BACKEND=simulator)")

    print("\nNext: assignments/a2_tiled_matmul: C = A @ B for any shapes, within an IO budget.")


if __name__ == "__main__":
    main()
