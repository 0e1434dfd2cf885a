"""FA2 Algorithm 2 line 4 for the fast backward kernels: ``D = rowsum(dO o O)``, a warp per row.

Paper: Dao, "FlashAttention-2", Algorithm 2 lines 3-4 ([FA2-ICLR] Appendix A). Read the readable pre-pass
:mod:`numba_flash.device.prepass` first: the sum is the same, only the threads that compute it differ.

Why a second pre-pass
---------------------
The readable pre-pass gives each thread one query row. Rows of O and dO are ``nheads * d`` elements apart in
the ``(b, N, h, d)`` layout, so the 32 threads of a warp read 32 different rows with every load instruction:
32 memory transactions for 32 elements. On an H100 at b 16, N 1k, h 16, d 128 in bfloat16 that pre-pass took
0.28-0.29 ms of a 2.5-3.6 ms training step; cuDNN's kernel for the same sum took 0.094 ms
(``docs/results/sweeps/host_kernels_h100_a80a359.txt``). The sum reads ``2 b N h d`` elements and writes
``b h N`` floats, so it is bound by HBM bandwidth, and at 0.28 ms it reached a seventh of it.

Here ``LANES`` lanes (a whole warp on a GPU) share a row: lane ``x`` reads elements ``x, x + LANES, ...`` of
the row of O and of dO, so the lanes of one load instruction read one contiguous piece of it. The lanes'
partial sums meet in a butterfly of ``shfl_xor_sync`` (in the simulator, which has no warp intrinsics,
through shared memory) and lane 0 writes ``D_i``. A warp takes ``RPW`` rows one after another and issues the loads
of all of them before the first sum, so more bytes are in flight per warp.

Measured on an H100 at 16k tokens (``python -m bench.prepass_probe``; ``docs/results/sweeps/prepass_probe_h100.txt``):
4 rows a warp (the default) took 0.139-0.141 ms for bf16 at d = 128 (0.164 with one) and 0.17 ms at d = 64 (0.27),
including torch's fill of the float32 dQ for the atomic adds (0.043 ms, a separate kernel). With ``dq`` given, the
kernel also writes that row's zeros into dQ (line 3) and the fill goes; on the H100 the best fused layout was 4-20 % *slower*
than the best unfused one with the fill (3 TB/s) beside it, so the backwards do not use it.

Launch geometry: grid ``(ceil(N_q / (GROUPS RPW)), b h)`` (:func:`numba_flash._launch.bh_grid`), block
``LANES * GROUPS`` threads: 32 x 8 on a GPU, 4 x 4 in the simulator (each simulated thread is a Python thread); each
group of lanes takes ``RPW`` consecutive rows (:data:`ROWS_PER_GROUP`).
"""

from __future__ import annotations

import functools

from numba import cuda, float32

from .._launch import Problem, bh_grid, ceil_div
from ..device.constants import FULL_MASK
from ..device.grid import folded_batch_head
from ..runtime import backend as _backend
from ..runtime import smem as _smem
from ..tensorcore import ptx

#: (lanes per row, row groups per block) on a GPU and in the simulator.
GPU_SHAPE = (32, 8)
SIM_SHAPE = (4, 4)
#: Rows a group of lanes takes one after another (``RPW``): their loads are issued before the first sum. 4 was the
#: fastest of 1, 2, 4, 8 without the fused dQ zeros at d 64 / 128, bf16 and float32 (``bench.prepass_probe``, H100).
ROWS_PER_GROUP = 4


def block_shape(sim: bool) -> tuple[int, int]:
    """``(LANES, GROUPS)``: the lanes that share a row and the lane groups of a block."""
    return SIM_SHAPE if sim else GPU_SHAPE


@functools.cache
def make_prepass(KIND, ZERO_DQ: bool, SIM: bool, RPW: int):
    """The pre-pass kernel ``(gO, gdO, gD, gdQ)``; each group of ``LANES`` lanes takes ``RPW`` consecutive rows.

    ``KIND`` None: O and dO are float32 ``(b, N, h, d)``; ``"f16"`` / ``"bf16"``: int32 words of two halves
    ``(b, N, h, d / 2)`` (:meth:`numba_flash._launch.Allocator.to_words`). ``gD`` is ``(b, h, N)`` float32. With
    ``ZERO_DQ`` the kernel also writes zeros into every element of ``gdQ`` (float32 ``(b, N, h, d)``); without
    it ``gdQ`` is not touched (pass any array but ``gD``).
    """
    LANES, GROUPS = block_shape(SIM)
    NT = LANES * GROUPS
    HALF = KIND is not None
    unpack2 = ptx.make_unpack2(KIND, SIM) if HALF else None
    ZERO = float32(0.0)

    if SIM:
        SXN = NT

        @cuda.jit(device=True)
        def lanes_sum(x, sx, tid):
            # the LANES partial sums of a row, through shared memory (the simulator has no shuffles)
            cuda.syncthreads()  # Sync: (simulator) every lane has read the previous row's partial sums
            sx[tid] = x
            cuda.syncthreads()  # Sync: (simulator) every lane's partial sum is stored
            base = tid - tid % LANES
            s = ZERO
            for i in range(LANES):
                s += sx[base + i]
            return s
    else:
        SXN = 1

        @cuda.jit(device=True, inline="always")
        def lanes_sum(x, sx, tid):
            off = LANES // 2
            while off > 0:  # butterfly: after log2(LANES) steps every lane holds the sum
                x += cuda.shfl_xor_sync(FULL_MASK, x, off)
                off //= 2
            return x

    @cuda.jit
    def prepass(gO, gdO, gD, gdQ):
        sx = cuda.shared.array(SXN, float32)  # the simulator's reduction scratch (unused on a GPU)
        nheads = gO.shape[2]
        _, b, h = folded_batch_head(nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        # [doc:fast-prepass]
        tid = cuda.threadIdx.x
        lane = tid % LANES
        row0 = (cuda.blockIdx.x * GROUPS + tid // LANES) * RPW
        acc = cuda.local.array(RPW, float32)
        for r in range(RPW):
            row = row0 + r
            live = row < gO.shape[1] and b < gO.shape[0]  # Dev: uniform over a row's lanes; all lanes reach lanes_sum
            if ZERO_DQ and live:
                # FA2.2 L3: dQ = (0) in HBM, the float32 accumulator of the atomic adds, row by row
                for x in range(lane, gdQ.shape[3], LANES):
                    gdQ[b, row, h, x] = ZERO
            # FA2.2 L4: D_i = rowsum(dO_i o O_i), LANES lanes a row, written to HBM (a separate pre-pass)
            acc[r] = ZERO
            if live:
                for x in range(lane, gO.shape[3], LANES):
                    if HALF:
                        o0, o1 = unpack2(gO[b, row, h, x])  # HBM read: the row's words, LANES consecutive per load
                        g0, g1 = unpack2(gdO[b, row, h, x])
                        acc[r] += g0 * o0
                        acc[r] += g1 * o1
                    else:
                        acc[r] += gdO[b, row, h, x] * gO[b, row, h, x]  # HBM read: LANES consecutive elements per load
        for r in range(RPW):  # Dev: the sums after every row's loads, so RPW rows of loads are in flight at once
            s = lanes_sum(acc[r], sx, tid)
            row = row0 + r
            if row < gO.shape[1] and b < gO.shape[0] and lane == 0:
                gD[b, h, row] = s  # HBM write: 1 per row
        # [/doc:fast-prepass]

    return prepass


def row_dot(out, dout, prob: Problem, alloc, dq=None, kind=None, rows_per_group=None):
    """D ``(b, h, N_q)`` float32 from O and dO: float32 arrays, or with ``kind`` (``"f16"``, ``"bf16"``) their half
    words. With ``dq`` (the float32 accumulator of the atomic adds) the same kernel zeroes it. ``rows_per_group``:
    the kernel's ``RPW`` (None: :data:`ROWS_PER_GROUP`)."""
    sim = _backend.is_simulator()
    lanes, groups = block_shape(sim)
    rpw = ROWS_PER_GROUP if rows_per_group is None else int(rows_per_group)
    delta = alloc.empty((prob.batch, prob.nheads, prob.seqlen_q))
    grid = bh_grid(ceil_div(prob.seqlen_q, groups * rpw), prob.batch * prob.nheads)
    kernel = make_prepass(kind, dq is not None, sim, rpw)
    # Dev: without dq, O stands in for it (never written); the simulator copies each array argument back, so delta
    # passed twice would have its D overwritten by the untouched second copy
    _smem.launch(kernel, grid, lanes * groups, 0, out, dout, delta, out if dq is None else dq)
    return delta
