"""FlashAttention-2 Algorithm 1 on the tensor cores, in float32 accuracy (3xTF32 ``mma.sync``).

Paper: Dao, "FlashAttention-2", Algorithm 1 and section 3.3. Same algorithm, semantics, paper tags
and launch grid as the readable kernel :mod:`numba_flash.fa2_forward` and the register-blocked
SIMT kernel :mod:`numba_flash.fast.fa2_forward`; read those first. This file changes *which units
do the two matrix products* (lines 8 and 10), and says why.

Why tensor cores, and why three of them per product
---------------------------------------------------
FlashAttention-2's speed comes from the tensor cores (fp16/bf16 ``mma``); FP32 FFMA on an H200 peaks
at ~67 TFLOP/s and cuBLAS SGEMM reaches ~50. PyTorch's fp32 "memory-efficient" SDPA (the xformers
CUTLASS kernel) does not use FFMA on sm_80+: its ``DefaultGemmType<float>`` is
``OpClassTensorOp`` with ``OpMultiplyAddFastF32``, CUTLASS's **3xTF32**: each float32 ``x`` is split
into ``big = tf32(x)`` (10 mantissa bits) and ``small = tf32(x - big)``, and
``a b ~ a_big b_big + a_big b_small + a_small b_big`` (the dropped ``a_small b_small`` is about
``2^-22 |a b|``):
three TF32 ``mma`` per product, accumulated in float32. ``bench/mma_peak.py`` measured the
rates available from Numba on an H200: TF32 ``mma.m16n8k8`` 245 TFLOP/s (so ~80 for 3xTF32), FP64
``mma.m16n8k8`` 62.5, FP64 ``m8n8k4`` 32.7. Accuracy: the split keeps ~21-22 bits of each input and
the products are exact in float32, so the error rule of the tests (at most 2x the error of a plain
float32 implementation) holds (NumPy emulation: 0.2-0.8x float32's error; checked on the GPU by the
same tests as the other kernels).

What changed from the fast (FFMA) kernel
----------------------------------------
* **Warp tiles in mma fragments.** Each warp owns ``16 MW`` query rows (``MW`` m16 tiles); ``S_ij``
  (``16 MW x Bc``) and ``O_i`` (``16 MW x d``) live in registers as ``m16n8`` accumulator fragments:
  lane ``(g, t) = (lane // 4, lane % 4)`` holds rows ``g, g + 8`` and columns ``2t, 2t + 1`` of each
  8-column tile. The rows of a lane are shared with the 3 other lanes of its quad only, so the row
  max / sum of line 9 are two ``shfl_xor`` steps and, as in FA2 section 3.3, no warp waits for another.
* **P~ goes through SRAM, one warp's rows at a time.** The A operand of ``P~ V_j`` needs lane
  ``(g, t)`` to hold ``P[g, t]`` and ``P[g, t + 4]`` of each 8-key step, but the S accumulator gives
  it ``P[g, 2t]`` and ``P[g, 2t + 1]``. Each lane therefore writes its ``P~`` values to the warp's
  own rows of an SRAM tile ``P`` (``OFF_P``, row stride ``Bc + 4``) and the warp reads them back in
  the A layout after a ``syncwarp`` (no block barrier: no other warp touches those rows). ``V_j`` is
  read in its natural row order. (A first version renamed the keys of each 8-key step so that the S
  fragment *is* the A fragment and P~ stayed in registers; offline, LLVM would not fully unroll that
  P V loop nest, so ``rS`` went to local memory. The performance log has the details.)
* **Bank-conflict-free SRAM.** ``Q_i`` and ``K_j`` rows have stride ``DP + 4`` and ``P`` rows
  ``Bc + 4`` (4 mod 8: the A/B fragment loads ``tile[8m + g, 8k + t]`` hit bank ``4g + t``);
  ``V_j`` rows have a stride that is 8 or 24 mod 32 (``V[8k + t, 8n + g]`` hits bank ``8t + g``):
  :func:`strides` picks them, and ``d`` is padded to ``DP``, a multiple of 8.
* Kept from the fast kernel: ``Q_i`` scaled by ``tau log2 e`` at load (``exp2``), K/V tile loads
  unrolled into registers (optionally prefetched one tile ahead), causal block skipping, dropout by
  the counter hash, > 48 KB dynamic SRAM, per-lane row sums reduced once after the loop.
* **K_j, V_j by cp.async, two stages deep** (``CP_ASYNC``, the default where ``d % 4 == 0`` and K, V are
  16-byte aligned): the half forward's pipeline (:mod:`numba_flash.tensorcore.fa2_forward_half`) for float32
  tiles, 16-byte chunks of 4 floats. The register path turns each NaN into the quiet NaN at its SRAM store
  (``QUIET_NAN``); tiles that arrive by ``cp.async`` get the same from each thread over its own chunks
  after the wait (:func:`numba_flash.fast._tiles.make_quiet_nan_pass`). Offline (sm_90) it takes the
  d = 64 tiling from 255 registers and a 108-byte spill to 252 and none, and from 250 to 222 registers at
  d = 128 (``bench/offline_resources.py --half-tiling``); bitwise the register path's result. On an H100 it
  was faster than the register path at d = 64 with ``Bc = 32`` (slower with ``Bc = 64``) and at d = 128 with the
  register path's tiling, so :func:`config_for` gives the two paths their own tilings (the performance log's
  section "3xTF32 forward: cp.async for K_j, V_j").
* **d = 128: two m16 tiles per warp, O staged per 8-key step** (``STAGE_O_STEP``, on where ``MW = 2`` and
  d > 64). A lane of ``MW = 2`` holds 128 floats of O; staging each key block's ``P~ V_j`` (``rT``) would need
  128 more and spilled. Staging each 8-key step instead (as ``STAGE_S`` stages each k step of S) drops ``rT``,
  and 8 warps of ``MW = 2`` with ``Bc = 16`` (Br = 256) fit in 254 registers (offline sm_90). Each K/V fragment
  read from SRAM then serves two m16 tiles, which paid without causal on an H100 and broke even with it (the
  performance log's section "3xTF32 forward: 8 x 2 x 16 with ``STAGE_O_STEP`` the d = 128 default"). With ``causal`` the
  default below N = 4096 is smaller blocks instead: 128 rows (4 warps of ``MW = 2``, ``Bc = 16``, two blocks per SM)
  from N = 1024, 64 rows (4 warps of ``MW = 1``, ``Bc = 32``) below (:func:`config_for`). ``RESCALE_FMA`` folds line 10's
  rescale of O into the first 8-key step's add, one FFMA: on for the causal 8 x 2 x 16 tiling, where it paid
  (:func:`rescale_fma_on`).

* **Staged accumulation (accuracy).** Accumulating the three products straight into ``S`` and ``O``
  broke the tests' error rule on the GPU (up to 4.4x the float32 error at N = 1024, d = 64; the NumPy
  emulation with exactly rounded sums had predicted 0.2-0.8x): the tensor cores' float32 accumulation
  is not rounded like an FFMA, and ``O`` takes ``3 N / 8`` such accumulations. So each 8-wide k step
  of ``S`` and each ``P~ V_j`` of line 10 runs into a zeroed accumulator that is then added with IEEE
  float32 adds (CUTLASS's "staging"). Errors then measured 0.5-1.05x float32's; the time cost 3-10 %
  (the switches ``STAGE_S`` / ``STAGE_O`` that turned it off: the performance log's removed switches).
* **Not enough for sharp softmaxes in training.** The split keeps ~22 bits of each input, so ``S`` carries
  4-12x the rounding of a float32 ``S``. The forward's own outputs stay within the error rule, but with
  scores of standard deviation >= 16 (one-hot rows) the FFMA backward, which recomputes ``P`` from
  ``S`` in float32, meets this kernel's ``P`` through ``D = rowsum(dO o O)`` and ``l``, and its gradients
  exceed the rule (4-13x the float32 error in the simulator; docs/backward.rst "Large logits").
  ``variant="fast"`` (the FFMA forward, which the backward reproduces exactly) does not.

What it bought (one H200, fp32, FA2 convention ``b * N = 16k``, CUDA-synchronized medians; the
committed benchmark is ``docs/results/fa2_h200.json``, the log with the predictions and the sweeps behind
rows 2-3 ``docs/notes/performance-log.md``, section "FA2 forward on the tensor cores"):

==============================================================  ==============  ==============
forward, d = 64, N = 4096, non-causal                           ms              TFLOP/s
==============================================================  ==============  ==============
fast FFMA kernel (:mod:`numba_flash.fast.fa2_forward`)          17.9            30.7
tensor cores, accumulating in the mma (fails the error rule)    12.6            43.7
+ staged O                                                      13.4            41.2
+ staged S (the default)                                        14.0            39.3
torch naive fp32 / SDPA memory-efficient fp32                   24.6 / 15.5     22.4 / 35.5
==============================================================  ==============  ==============

(rows 2-3 from the performance log's sweep, the others from the benchmark run.) These are the first version's
numbers; ``python -m bench.fa2_sweep`` and the committed grids time the kernel as it is now.

Launch geometry
---------------
grid ``(Tr, batch * nheads)``, block ``32 NW`` threads, ``Br = 16 MW NW``. SRAM (float32, one dynamic
array ``smem`` at offsets ``OFF_*``, :func:`smem_floats`): ``Q_i`` Br (DP+4) + ``K_j`` Bc (DP+4) +
``V_j`` Bc SV + ``P~`` Br (Bc+4), with ``SV`` the V stride of :func:`strides` (+ a 192-float exchange
scratch per warp in the simulator); ``K_j, V_j`` twice with ``CP_ASYNC``. ``SPLIT_KV`` (the default at
8 x 2 x 16) adds the tf32 parts of ``K_j`` and ``V_j`` (:func:`fa2_forward_tc_kernel`): 221.5 KB at d = 128.

GPU: compute capability 8.0 or newer (``mma.sync`` TF32). The simulator runs the same source with
:func:`numba_flash.tensorcore.ptx.make_warp_ops`' Python twins of the fragment operations.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint32, uint64

from .._launch import ForwardOutput, KernelLaunch, Problem, bh_grid, ceil_div
from ..device.constants import U
from ..fast import _plan, _tiles
from ..runtime import backend as _backend
from ..runtime import smem as _smem
from . import forward_steps, fragments, ptx
from .ptx import available

#: Largest head dim the tensor-core kernel runs. Its lane holds 2 x 4 (d / 8) floats of O (O and the staged
#: P~ V_j), 256 registers at d = 256; at d = 128 it already uses 250 (254 at MW = 2 with STAGE_O_STEP). Above it the
#: registry routes ``variant="tensorcore"`` to the FFMA kernel (:mod:`numba_flash.fast.fa2_forward`), so ``"auto"``
#: and ``"tensorcore"`` still run at every head dim up to 256.
TC_MAX_HEADDIM = 128

#: :func:`forward` puts nothing on the GPU but the allocator's outputs and launches through ``_smem.launch``
#: (:func:`numba_flash.fast._plan.run_fa2_forward`): an eager call may be replayed (:mod:`numba_flash.runtime.replay`)
REPLAYABLE = True


#: Causal query lengths from which the ``cp.async`` path's d > 64 default is 8 x 2 x 16 (as without causal) instead of
#: the smaller blocks of :data:`CAUSAL_MID_SEQLEN`: once the lightest blocks fill the tail (``HEAVY_FIRST``), the
#: Br = 256 blocks' fewer K/V reads per MMA win on long rows, and ``Q_ASYNC`` and ``SPLIT_KV``'s 16-byte stores moved
#: the crossover down to 2k (the performance log's sections "The d = 128 forward's tilings again, after ``Q_ASYNC``" and
#: "The causal d = 128 forward's tilings again, and the grid with ``SPLIT_KV``'s new default").
CAUSAL_LONG_SEQLEN = 2048

#: Causal query lengths from which, up to :data:`CAUSAL_LONG_SEQLEN`, the ``cp.async`` path's d > 64 default is 4 x 2 x 16
#: (Br = 128: 8 x 2 x 16's warps, ``STAGE_O_STEP`` and all, in blocks half as tall, 107 KB of SRAM, so two per SM that
#: overlap each other's prologue and epilogue) instead of 4 x 1 x 32. It met the rule set before its run (at least
#: 1.02x in two rounds at every N of the range) from 1k to 2k on an H100 and at 512 on an H200; without causal it
#: lost at every N (the performance log's sections "The d = 128 forward in blocks of 128 rows" and "Where a short
#: d = 128 forward block's time goes, and 4 x 2 x 16 at causal 512").
CAUSAL_MID_SEQLEN = 512


@functools.cache
def config_for(d: int, block_sizes=None, cp_async=None, causal: bool = False, seqlen_q: int = 0):
    """The tiling ``(NW, MW, Bc, DP)``: warps per block, m16 tiles per warp, key block, padded d.

    Defaults (the sweeps are in docs/notes/performance-log.md): on the ``cp.async`` path (``cp_async``; None: where
    :func:`cp_async_ok`) 4 warps of ``MW = 2`` (Br = 128) with ``Bc = 32`` at ``d <= 64`` (faster than ``Bc = 64`` on
    an H100) and 8 warps of ``MW = 2`` (Br = 256) with ``Bc = 16`` above, with ``STAGE_O_STEP`` (its default where
    ``MW = 2`` and d > 64; faster than 8 warps of ``MW = 1`` with ``Bc = 32`` on an H100); with ``causal``, 4 warps of
    ``MW = 1`` with ``Bc = 32`` (Br = 64, two blocks per SM: 64-row blocks even out the causal triangle's unequal
    work at short rows; ``block_sizes=(256, 16)`` gives 8 x 2 x 16) up to ``seqlen_q`` < :data:`CAUSAL_MID_SEQLEN`
    (512); from there 4 warps of ``MW = 2`` with ``Bc = 16`` (Br = 128, two blocks per SM) up to ``seqlen_q`` <
    :data:`CAUSAL_LONG_SEQLEN` (2048); from there on 8 x 2 x 16 again (the two constants say why). On the register path
    (d % 4 != 0, unaligned K or V, ``CP_ASYNC=False``): ``d <= 64``: 4 warps, ``MW = 2``, ``Bc = 64``;
    above: 8 warps, ``MW = 1``, ``Bc = 32`` (at ``Bc = 64`` the SRAM allows one block per SM; H200 sweeps).
    ``block_sizes=(Br, Bc)`` is rounded up to the mma granularity (Br to a multiple of 16, Bc of 8; up to
    Br = 64 the block has ``Br / 16`` warps of one m16 tile, up to Br = 128 4 warps of two, above it 8 warps of
    ``MW = Br / 128``, so the defaults' ``(Br, Bc)`` give back their tilings).
    """
    DP = _plan.padded_headdim(d)
    if block_sizes is None:
        cp = cp_async_ok(d) if cp_async is None else cp_async
        if d > 64:
            if not cp:
                return (8, 1, 32, DP)
            if not causal or seqlen_q >= CAUSAL_LONG_SEQLEN:
                return (8, 2, 16, DP)
            return (4, 2, 16, DP) if seqlen_q >= CAUSAL_MID_SEQLEN else (4, 1, 32, DP)
        return (4, 2, 32 if cp else 64, DP)
    Br, Bc = (int(n) for n in block_sizes)
    m16 = (Br + 15) // 16
    if m16 <= 4:
        NW, MW = m16, 1
    elif m16 <= 8:
        NW, MW = 4, (m16 + 3) // 4
    else:
        NW, MW = 8, (m16 + 7) // 8
    return NW, MW, 8 * ((Bc + 7) // 8), DP


def strides(BC: int, DP: int, wide: bool = False):
    """Row strides (floats) of the Q/K, V and P tiles, chosen so that fragment loads hit 32 banks.

    A fragments of ``Q_i``, ``P~`` and the B fragments of ``K_j^T`` read ``tile[8 m + g, 8 k + t]``
    (``g < 8``, ``t < 4``): conflict free when the stride is 4 mod 8 (bank ``4 g + t`` up to a
    rotation). B fragments of ``V_j`` read ``V[8 k + t, 8 n + g]``: conflict free when the stride is
    8 or 24 mod 32 (bank ``8 t + g``).

    ``wide`` (:func:`wide_ok`): the 16-byte loads of ``WIDE``. A 16-byte load of a warp is served 8 lanes at a
    time; lanes ``(g, t)``, ``g < 2``, read ``Q[g, 16 p + 4 t ..]`` (and ``K`` alike): the Q and K tiles are
    stored unpadded (stride DP, a multiple of 32) and swizzled (:func:`numba_flash.fast._tiles.swizzle16`: odd
    rows in the other 16 banks); they read ``V[t, ND g + 4 q ..]``, so the V stride is the smallest one at which
    those 8 reads of 4 banks each fall in 32 different banks (:func:`_v4_banks_free`).
    """
    if wide:
        if not wide_ok(DP):
            raise ValueError(f"WIDE needs a padded head dim that is a multiple of 32 (wide_ok), got DP={DP}")
        sq = DP
        sv = DP
        while not _v4_banks_free(sv):
            sv += 4
        return sq, sv, BC + 4
    sv = DP
    while sv % 32 not in (8, 24):
        sv += 1
    return DP + 4, sv, BC + 4


def _v4_banks_free(sv: int) -> bool:
    """Whether the 8 lanes ``(g, t)`` (``g < 2``, ``t < 4``) of one phase of ``WIDE``'s V load, reading 4 floats at
    ``t sv + 4 g``, touch 32 different banks."""
    banks = [(t * sv + 4 * g + e) % 32 for g in range(2) for t in range(4) for e in range(4)]
    return len(set(banks)) == 32


def wide_ok(DP: int) -> bool:
    """Whether ``WIDE`` can run at padded head dim ``DP``: whole pairs of 8-wide k steps and whole groups of 32 O
    columns (four 8-column tiles, a lane's 16-byte V loads): ``DP % 32 == 0``."""
    return DP % 32 == 0


def smem_floats(NW: int, MW: int, BC: int, DP: int, simulator: bool = False, stages: int = 1, wide: bool = False,
                split: bool = False) -> int:
    """Dynamic SRAM of the kernel in float32 elements (see the module docstring); ``stages`` copies of
    K_j, V_j (2 with ``CP_ASYNC``); ``wide``: the strides of ``WIDE``; ``split``: ``SPLIT_KV``'s layout (two stages of
    K_j and of its small parts; one stage of V_j as copied and two of its parts in pairs)."""
    SQ, SV, SP = strides(BC, DP, wide)
    if split:
        n = 16 * MW * NW * (SQ + SP) + 4 * BC * SQ + BC * SV + 16 * (BC // 8) * _tiles.v_pair_stride(DP)
    else:
        n = 16 * MW * NW * (SQ + SP) + stages * BC * (SQ + SV)
    return n + (NW * ptx.SIM_SCRATCH_PER_WARP if simulator else 0)


def cp_async_ok(d: int) -> bool:
    """Whether head dim ``d`` can take the ``cp.async`` path: a row of ``d`` floats is whole 16-byte chunks
    (``d % 4 == 0``), so every chunk of a row is 16-byte aligned in HBM and all inside or all past d."""
    return d % 4 == 0


#: Q_i's tile starts the one dynamic SRAM array (the offset of :func:`fa2_forward_tc_kernel`'s ``OFF_Q``)
OFF_Q = U(0)


@functools.cache
def make_tf32_s_step(MW: int, NB: int, DP: int, SQ: int, WIDE: bool, KS: bool, DS, SIM: bool):
    """``mma_qk(smem, words, rS, OFF_Q, kbase, wrow, g, t, sx, wbase, lane)``: line 8, ``S_i^(j) = Q_i K_j^T`` into the
    warp's ``MW x NB`` fragments ``rS``: per 8-wide k step, A = the warp's rows of ``Q_i`` (16 x 8 per m16 tile), B =
    ``K_j^T`` (8 x 8 per key tile), three TF32 ``mma`` each (:func:`numba_flash.tensorcore.fragments.make_s_steps`:
    small parts first, big x big last; each k step into a zeroed accumulator, added with IEEE adds).

    ``WIDE`` (:func:`wide_ok`): the k steps go in pairs over 16 columns of d; lane ``(g, t)`` loads columns
    ``16 p + 4 t .. + 3`` of its rows of Q and K with one 16-byte load each and gives the first two to k step ``2 p``,
    the last two to ``2 p + 1`` (fragment positions ``t`` and ``t + 4``). A and B name the same column at every
    position, so each step is a true 8-term slice of the dot product, but each slice holds other columns than the
    kernel without it: other bits, inside the error rule; the 3xTF32 backward recomputes this S with its own ``WIDE``
    (:func:`wide_on`, :func:`wide_for`). ``KS`` (``SPLIT_KV``): ``K_j``'s tf32 parts come from SRAM,
    the big parts in place and the small ones ``DS`` words further, instead of each warp splitting what it loads.
    """
    KD = DP // 8  # 8-wide k steps of Q K^T
    NS = MW * NB * 4
    NA = MW * 4  # registers of one A operand (4 per m16 tile), for its tf32 big and small parts
    NQW = MW * 8 if WIDE else 1  # WIDE: this lane's 4 columns of its 2 MW rows of Q_i for a pair of k steps
    NKW = NB * 4 if WIDE else 1  # WIDE: the same 4 columns of its key row of each 8-key tile of K_j
    NKS = NKW if KS else 1  # KS: those values of K_j as big / small tf32 parts
    uSQ = U(SQ)
    split, _, _, _ = ptx.make_warp_ops(SIM)
    load_q_pair, split_a_pair, s_tile_step = fragments.make_s_steps(MW, NB, SIM)

    @cuda.jit(device=True, inline="always")
    def mma_qk(smem, words, rS, OFF_Q, kbase, wrow, g, t, sx, wbase, lane):
        rAb = cuda.local.array(NA, uint32)  # A fragments (tf32 big / small parts)
        rAs = cuda.local.array(NA, uint32)
        rQw = cuda.local.array(NQW, float32)  # WIDE: Q_i columns 16 p + 4 t .. + 3 of rows g, g + 8 (per m16 tile)
        rKw = cuda.local.array(NKW, float32)  # WIDE: K_j columns 16 p + 4 t .. + 3 of key row g (per key tile)
        rKb = cuda.local.array(NKS, uint32)  # KS: rKw as tf32 big parts
        rKs = cuda.local.array(NKS, uint32)  # KS: rKw as tf32 small parts
        for a in range(NS):
            rS[a] = float32(0.0)
        for kp in range(KD // 2 if WIDE else 0):  # Dev: WIDE: k steps 2 kp, 2 kp + 1 from one 16-byte load per row
            csw = _tiles.swizzle16(U(16 * kp), g) + U(4) * t  # SRAM column of columns 16 kp + 4 t .. + 3 in rows g, g + 8, 8 nt + g
            load_q_pair(smem, rQw, OFF_Q, wrow, g, uSQ, csw)  # columns 16 kp + 4 t .. + 3 of this lane's rows g, g + 8
            for nt in range(NB):  # the same columns of key row g of each 8-key tile
                k0 = kbase + (U(8 * nt) + g) * uSQ + csw
                for e in range(4):
                    if KS:
                        rKb[nt * 4 + e] = words[k0 + U(e)]
                        rKs[nt * 4 + e] = words[k0 + DS + U(e)]
                    else:
                        rKw[nt * 4 + e] = smem[k0 + U(e)]
            for h2 in range(0, 4, 2):  # this k step's two columns of the four: c = 16 kp + 4 t + h2, c + 1
                split_a_pair(rQw, rAb, rAs, h2)  # a = (Q[g, c], Q[g+8, c], Q[g, c+1], Q[g+8, c+1])
                for nt in range(NB):
                    if KS:
                        bb0, bs0 = rKb[nt * 4 + h2], rKs[nt * 4 + h2]
                        bb1, bs1 = rKb[nt * 4 + h2 + 1], rKs[nt * 4 + h2 + 1]
                    else:
                        bb0, bs0 = split(rKw[nt * 4 + h2])  # b = (K[g, c], K[g, c+1])
                        bb1, bs1 = split(rKw[nt * 4 + h2 + 1])
                    s_tile_step(rS, rAb, rAs, nt, bb0, bb1, bs0, bs1, sx, wbase, lane)
        for ks in range(0 if WIDE else KD):
            for mt in range(MW):
                q0 = OFF_Q + (wrow + U(16 * mt) + g) * uSQ + U(8 * ks) + t
                for c in range(4):  # a = (Q[g, t], Q[g+8, t], Q[g, t+4], Q[g+8, t+4])
                    rAb[mt * 4 + c], rAs[mt * 4 + c] = split(smem[q0 + U(8 * (c % 2)) * uSQ + U(4 * (c // 2))])
            for nt in range(NB):
                k0 = kbase + (U(8 * nt) + g) * uSQ + U(8 * ks) + t  # b = (K[g, t], K[g, t+4])
                bb0, bs0 = split(smem[k0])
                bb1, bs1 = split(smem[k0 + U(4)])
                s_tile_step(rS, rAb, rAs, nt, bb0, bb1, bs0, bs1, sx, wbase, lane)

    return mma_qk


@functools.cache
def make_tf32_pv_step(MW: int, NB: int, DP: int, SV: int, SP: int, OFF_P, RS: int, VPART,
                      STAGE_O_STEP: bool, RESCALE_FMA: bool, WIDE: bool, SPLIT_KV: bool, SIM: bool):
    """``mma_pv(smem, words, rO, ralpha, vbase, vpair, wrow, g, t, sx, wbase, lane)``: line 10,
    ``O_i = diag(e^(m_old - m_new)) O_i + P~ V_j``, with A = the warp's own rows of the ``P~`` tile at ``OFF_P`` (row
    stride ``SP``), read back in the m16n8k8 A layout, and B = ``V_j`` at ``vbase`` (row stride ``SV``), 8 keys a step.

    The key block's ``P~ V_j`` runs into a zeroed ``rT`` that is added to the rescaled O with IEEE float32
    FMAs. ``STAGE_O_STEP`` (instead): O is rescaled first and each 8-key step's product runs into a zeroed
    accumulator added to O (no ``rT``: the registers ``MW = 2`` needs at d = 128). ``RESCALE_FMA`` (with
    ``STAGE_O_STEP``): the rescale rides on the first 8-key step's add, one FFMA ``O = e^(m_old - m_new) O + (P~ V_j)_0``.

    ``WIDE``: the columns of O are renamed: column ``n`` of 8-column tile ``dn = 4 a + e`` is O's column
    ``32 a + 4 n + e``, so lane ``g``'s B fragments of the four tiles ``4 a .. 4 a + 3`` are V's columns
    ``32 a + 4 g .. + 3`` (one 16-byte load per row). ``SPLIT_KV``: ``V_j``'s tf32 parts come from SRAM as the mma's
    B-fragment register pairs at ``vpair`` (big parts, the small ones ``VPART`` words on; row stride ``RS``).
    """
    ND = DP // 8  # 8-column tiles of O
    NO = MW * ND * 4
    NA = MW * 4
    STAGED_RT = not STAGE_O_STEP  # the block's P~ V_j staged in rT (none with STAGE_O_STEP)
    NT_ = NO if STAGED_RT else 1  # registers of rT
    FMA_FIRST = STAGE_O_STEP and RESCALE_FMA  # line 10's rescale in the first 8-key step's add (RESCALE_FMA)
    NR = MW * 2
    NVW = 2 * ND if WIDE else 1  # WIDE: V_j rows t, t + 4 at this lane's ND columns (an 8-key step's B fragments)
    NVS = 8 if SPLIT_KV else 1  # SPLIT_KV: the 4 pairs of one group of 4 O tiles, big / small parts
    uSV, uSP = U(SV), U(SP)
    split, mma3, _, _ = ptx.make_warp_ops(SIM)

    @cuda.jit(device=True, inline="always")
    def o_tile_step(rO, rT, rAb, rAs, dn, bb0, bb1, bs0, bs1, sx, wbase, lane, ralpha):
        """One 8-key step of O's column tile ``dn`` for the warp's MW m16 tiles (A in rAb/rAs, B in bb*/bs*); with
        ``RESCALE_FMA`` O is multiplied by ``ralpha`` in the step's add (1 after the key block's first step)."""
        for mt in range(MW):
            f = (mt * ND + dn) * 4
            if STAGE_O_STEP:  # Dev: this 8-key step into a zeroed accumulator, added to O_i below
                acc = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
            else:
                acc = (rT[f], rT[f + 1], rT[f + 2], rT[f + 3])
            acc = mma3((rAb[mt * 4], rAb[mt * 4 + 1], rAb[mt * 4 + 2], rAb[mt * 4 + 3]),
                       (rAs[mt * 4], rAs[mt * 4 + 1], rAs[mt * 4 + 2], rAs[mt * 4 + 3]), (bb0, bb1), (bs0, bs1), acc,
                       sx, wbase, lane)
            for c in range(4):
                if FMA_FIRST:  # Dev: O_i = e^(m_old - m_new) O_i + this step's P~ V_j, one FFMA (fma(O, 1, x) = O + x later)
                    rO[f + c] = cuda.fma(rO[f + c], ralpha[mt * 2 + c // 2], acc[c])
                elif STAGE_O_STEP:
                    rO[f + c] = rO[f + c] + acc[c]
                else:
                    rT[f + c] = acc[c]

    @cuda.jit(device=True, inline="always")
    def split_p_step(smem, rXb, rXs, kt, wrow, g, t):
        """P~'s A fragments of 8-key step ``kt`` for the warp's MW m16 tiles, split into tf32 parts in ``rXb``, ``rXs``
        (4 a tile): ``a = (P[g, t], P[g+8, t], P[g, t+4], P[g+8, t+4])``."""
        for mt in range(MW):
            p0 = OFF_P + (wrow + U(16 * mt) + g) * uSP + U(8 * kt) + t
            for c in range(4):
                rXb[mt * 4 + c], rXs[mt * 4 + c] = split(smem[p0 + U(8 * (c % 2)) * uSP + U(4 * (c // 2))])

    @cuda.jit(device=True, inline="always")
    def mma_pv(smem, words, rO, ralpha, vbase, vpair, wrow, g, t, sx, wbase, lane):
        rT = cuda.local.array(NT_, float32)  # P~_ij V_j of this block (not STAGE_O_STEP), added to O_i with IEEE float32 adds
        rAb = cuda.local.array(NA, uint32)  # A fragments (tf32 big / small parts)
        rAs = cuda.local.array(NA, uint32)
        rVw = cuda.local.array(NVW, float32)  # WIDE: V_j rows t, t + 4, columns 32 a + 4 g .. + 3 for every a < ND / 4
        rVb = cuda.local.array(NVS, uint32)  # SPLIT_KV: B-fragment pairs of V_j (big parts) for 4 O tiles
        rVs = cuda.local.array(NVS, uint32)  # SPLIT_KV: their small parts
        if STAGED_RT:
            for a in range(NO):
                rT[a] = float32(0.0)
        elif not FMA_FIRST:  # Dev: RESCALE_FMA: the key block's first 8-key step rescales O (o_tile_step)
            for mt in range(MW):
                for dn in range(ND):
                    for c in range(4):
                        rO[(mt * ND + dn) * 4 + c] *= ralpha[mt * 2 + c // 2]
        for kt in range(NB):  # 8 keys per step; a = (P[g, t], P[g+8, t], P[g, t+4], P[g+8, t+4])
            split_p_step(smem, rAb, rAs, kt, wrow, g, t)
            if WIDE and not SPLIT_KV:  # Dev: tile dn = 4 a + e's column g is O's column 32 a + 4 g + e: V's rows t, t + 4 by 16-byte loads
                v0 = vbase + (U(8 * kt) + t) * uSV + U(4) * g
                for e in range(ND):
                    rVw[e] = smem[v0 + U(32 * (e // 4) + e % 4)]
                    rVw[ND + e] = smem[v0 + U(4) * uSV + U(32 * (e // 4) + e % 4)]
            for a in range(ND // 4 if SPLIT_KV else 0):  # Dev: SPLIT_KV: V's pairs for tiles 4 a .. 4 a + 3
                v0 = vpair + (U(4 * kt) + t) * U(RS) + U(64 * a) + U(4) * g
                for w in range(8):  # word 32 (w // 4) + w % 4 of the group: pair w // 2 (tile 4 a + w // 2), key t + 4 (w % 2)
                    rVb[w] = words[v0 + U(32 * (w // 4) + w % 4)]
                    rVs[w] = words[v0 + VPART + U(32 * (w // 4) + w % 4)]
                for e in range(4):  # b = (V[t, c], V[t+4, c]), c = 32 a + 4 g + e
                    o_tile_step(rO, rT, rAb, rAs, 4 * a + e, rVb[2 * e], rVb[2 * e + 1], rVs[2 * e], rVs[2 * e + 1], sx, wbase, lane,
                                ralpha)
            for dn in range(0 if SPLIT_KV else ND):
                if WIDE:
                    bb0, bs0 = split(rVw[dn])  # b = (V[t, c], V[t+4, c]), c = 32 (dn // 4) + 4 g + dn % 4
                    bb1, bs1 = split(rVw[ND + dn])
                else:
                    v0 = vbase + (U(8 * kt) + t) * uSV + U(8 * dn) + g  # b = (V[t, g], V[t+4, g])
                    bb0, bs0 = split(smem[v0])
                    bb1, bs1 = split(smem[v0 + U(4) * uSV])
                o_tile_step(rO, rT, rAb, rAs, dn, bb0, bb1, bs0, bs1, sx, wbase, lane, ralpha)
            for r in range(NR if FMA_FIRST else 0):  # Dev: O is rescaled once, in the first 8-key step
                ralpha[r] = float32(1.0)
        if STAGED_RT:  # Dev: O_i = e^(m_old - m_new) O_i + (P~ V_j), one IEEE float32 FMA per element
            for mt in range(MW):
                for dn in range(ND):
                    for c in range(4):
                        f = (mt * ND + dn) * 4 + c
                        rO[f] = rO[f] * ralpha[mt * 2 + c // 2] + rT[f]

    return mma_pv


@functools.cache
def make_tf32_o_store(MW: int, DP: int, SQ: int, WIDE: bool, SIM: bool):
    """``(store_o_row, write_staged_o)``: line 14 of the 3xTF32 forward, O's row fragments to HBM.

    ``store_o_row(gO, smem, rO, ub, row, uh, mt, hf, wrow, g, t, d, inv_l)`` (the row store of
    :func:`numba_flash.tensorcore.forward_steps.make_write_o_l`): lane ``(g, t)`` writes columns ``8 dn + 2t``,
    ``8 dn + 2t + 1`` of its row. ``WIDE``: it stages them instead (O's renamed columns back in place) in the warp's own
    rows of the ``Q_i`` tile, which no other warp reads, and ``write_staged_o(gO, smem, ub, uh, row0, wrow, lane, s_q,
    d)`` then writes the warp's rows to HBM a row at a time, lane ``l`` at columns ``l, l + 32, ..``: 128 bytes a store,
    where the fragment layout writes 8 rows x 32 bytes (the renamed columns alone would have made that 8 rows x 4
    lanes x 4 bytes, 4x the L2 sectors: 3-7 % slower at N = 1k on an H100). The column swizzle ``x ^ (row % 8)``
    keeps the staging stores free of bank conflicts.
    """
    ND = DP // 8
    uSQ = U(SQ)

    @cuda.jit(device=True, inline="always")
    def store_o_row(gO, smem, rO, ub, row, uh, mt, hf, wrow, g, t, d, inv_l):
        for dn in range(ND):
            for cc in range(2):
                if WIDE:  # Dev: O's renamed column, staged in this warp's own rows of Q_i (write_staged_o)
                    lr = U(16 * mt + 8 * hf) + g
                    x = U(32 * (dn // 4) + dn % 4) + U(4) * (U(2) * t + U(cc))
                    smem[OFF_Q + (wrow + lr) * uSQ + (x ^ (lr & U(7)))] = rO[(mt * ND + dn) * 4 + 2 * hf + cc] * inv_l
                elif 8 * dn + 2 * int(t) + cc < d:
                    gO[ub, U(row), uh, U(8 * dn + cc) + U(2) * t] = rO[(mt * ND + dn) * 4 + 2 * hf + cc] * inv_l  # HBM write: Br*d

    @cuda.jit(device=True, inline="always")
    def write_staged_o(gO, smem, ub, uh, row0, wrow, lane, s_q, d):
        if SIM:
            cuda.syncthreads()  # Sync: (simulator) the warp's staged O rows are in SRAM before they are read back
        else:
            cuda.syncwarp(0xFFFFFFFF)  # Sync: the warp's staged O rows are in SRAM; written and read by its own lanes
        for lr in range(16 * MW):
            row = row0 + int(wrow) + lr
            for jx in range(DP // 32):
                x = U(lane + 32 * jx)
                if row < s_q and x < U(d):
                    gO[ub, U(row), uh, x] = smem[OFF_Q + (wrow + U(lr)) * uSQ + (x ^ U(lr % 8))]  # HBM write: Br*d

    return store_o_row, write_staged_o


@_plan.cache_by_signature
def fa2_forward_tc_kernel(NW: int, MW: int, BC: int, DP: int, CAUSAL: bool, DROPOUT: bool, PREFETCH: bool, SIM: bool,
                          CP_ASYNC: bool = False, STAGE_O_STEP: bool = False, WIDE: bool = False, HEAVY_FIRST: bool = False,
                          Q_ASYNC: bool = False, WARP_SKIP: bool = False, SPLIT_KV: bool = False,
                          RESCALE_FMA: bool = False):
    """The 3xTF32 FA2 forward kernel for one specialization (see the module docstring), composed of steps: line 7 from
    :func:`numba_flash.tensorcore.forward_steps.make_kv_pipeline`, line 8 from :func:`make_tf32_s_step`, line 9 from
    :func:`numba_flash.tensorcore.forward_steps.make_online_softmax`, line 10 from :func:`make_tf32_pv_step`, lines
    12-15 from :func:`numba_flash.tensorcore.forward_steps.make_write_o_l` with :func:`make_tf32_o_store`.

    ``CP_ASYNC`` (d a multiple of 4): K_j, V_j go HBM -> SRAM by ``cp.async`` into two SRAM stages, the copies of
    block j+1 in flight while block j is computed, as in the half forward; each thread then turns the NaNs of its own
    chunks into the quiet NaN in SRAM (:func:`numba_flash.fast._tiles.make_quiet_nan_pass`: the register path does it
    at its store). ``PREFETCH`` (register path): K_{j+1}, V_{j+1} loaded into registers during block j.

    Each 8-wide k step of line 8 (each key block's ``P~ V_j`` of line 10) runs on the tensor cores into a zeroed
    accumulator that is added to S (to O) with IEEE float32 adds. ``STAGE_O_STEP``, ``RESCALE_FMA``: how line 10
    accumulates (:func:`make_tf32_s_step`, :func:`make_tf32_pv_step`). ``STAGE_O_STEP`` gives other bits than the default (one
    more rounded add per 8 keys, not one per key block), ``RESCALE_FMA`` one rounding fewer per key block (L, m, l
    are line 9's and keep theirs). ``WIDE`` (:func:`wide_ok`): every K, Q and V fragment comes from 16-byte SRAM
    loads, one for four floats, with the terms of the dot products in an order that makes that possible (the three
    step factories say how); the strides change with it (:func:`strides`).

    ``Q_ASYNC`` (needs ``CP_ASYNC``): ``Q_i`` goes HBM -> SRAM by ``cp.async`` too, its copies in flight with those of
    ``K_1, V_1``; after the wait each thread multiplies its own chunks by ``tau log2 e`` in SRAM and quiets their NaNs
    (:func:`numba_flash.fast._tiles.make_quiet_nan_pass` with ``SCALE``): the same float32 products as the register
    load, so the same bits. The register load of line 4 is a loop that ptxas does not unroll, and its sm_90 code
    multiplies and stores each value before it issues the next load: each block began with 64-128 HBM round trips in
    a row.

    ``WARP_SKIP`` (causal, GPU only): a warp whose ``16 MW`` rows see no key of key block ``j``
    (:func:`numba_flash.fast._tiles.make_warp_horizon`) skips lines 8-10 for it. Its S would be all ``-inf``: ``m``
    stays, ``e^(m_old - m_new)`` is exactly 1, ``P~`` is 0 and ``P~ V_j`` adds zeros, so O, L, m, l keep their bits
    (for finite V: a NaN or inf of V_j times a masked 0 made the row NaN before, as it does in the N x N reference;
    it does not now, as for the key blocks past the whole block's horizon, which were never visited). The thread
    block's key blocks end at its *last* row's horizon, so on the diagonal its earlier warps meet blocks that only its
    later warps see. The simulator's ``mma`` exchanges fragments through block barriers that every warp must reach,
    so there it cannot be compiled.

    ``SPLIT_KV`` (needs ``WIDE``): ``K_j, V_j`` are split into their tf32 big and small parts once, in SRAM, by the
    threads that copied them, in place of the NaN pass, instead of by every warp at each fragment load. ``K_j``'s big
    parts stay in place and its small parts go ``DS`` words further (:func:`numba_flash.fast._tiles.make_split_pass`),
    two stages of each; ``V_j``'s parts go to a layout whose words are the ``mma``'s B-fragment register pairs
    (:func:`numba_flash.fast._tiles.make_v_pair_split_pass`), two stages; the copied ``V_j`` keeps one stage, as only
    its copying thread reads it. The same bits.

    ``HEAVY_FIRST`` (causal): every head's last (heaviest) query block first
    (:func:`numba_flash.tensorcore.forward_steps.make_query_block`); the same blocks and bits either way.

    Symbol table (paper symbol -> variable -> memory space):

    ========================  ===================  ==================================================
    Q, K, V, O, L             gQ, gK, gV, gO, gL   HBM
    Q_i (times tau log2 e)    smem[OFF_Q ...]      SRAM (Br, DP+4), loaded once (L4)
    K_j                       smem[kbase ...]      SRAM (Bc, DP+4), loaded each step (L7); CP_ASYNC: 2 stages
    V_j                       smem[vbase ...]      SRAM (Bc, SV), loaded each step (L7); CP_ASYNC: 2 stages (SPLIT_KV: 1)
    S_i^(j)                   rS                   registers: MW x (Bc/8) m16n8 fragments per warp
    P~_i^(j)                  smem[OFF_P ...]      SRAM (Br, Bc+4): each warp writes and reads its own rows
    K_j small parts           words[kbase + DS]    SRAM, as K_j (SPLIT_KV; K_j's big parts in place)
    V_j big / small parts     words[vpair ...]     SRAM, B-fragment pairs, 2 stages (SPLIT_KV)
    O_i^(j) (un-normalized)   rO                   registers: MW x (DP/8) m16n8 fragments per warp
    P~_i^(j) V_j (staged)     rT                   registers, like rO (none with STAGE_O_STEP)
    m_i, l_i (base 2)         rm, rl               registers, 2 MW rows per lane (rl: partial sum)
    ========================  ===================  ==================================================
    """
    if WIDE and not (CP_ASYNC and wide_ok(DP)):
        raise ValueError(f"WIDE needs CP_ASYNC and wide_ok(DP) (DP={DP}, CP_ASYNC={CP_ASYNC})")
    if Q_ASYNC and not CP_ASYNC:
        raise ValueError("Q_ASYNC needs CP_ASYNC")
    if WARP_SKIP and (SIM or not CAUSAL):
        raise ValueError("WARP_SKIP needs CAUSAL and a GPU (the simulator's mma exchanges through block barriers)")
    if SPLIT_KV and not WIDE:
        raise ValueError("SPLIT_KV needs WIDE (and so CP_ASYNC)")
    NT = 32 * NW
    BR = 16 * MW * NW
    NB = BC // 8  # 8-column tiles of S (and 8-key steps of P V)
    ND = DP // 8  # 8-column tiles of O
    SQ, SV, SP = strides(BC, DP, WIDE)  # row strides (floats) of the Q_i/K_j, V_j and P~ tiles
    # Offsets (floats) of the tiles in the one dynamic SRAM array `smem` (Q_i at OFF_Q = 0: (Br, SQ), rows of d
    # values, tau log2 e applied, zero-padded to DP):
    OFF_K = U(BR * SQ)  # K_j: (Bc, SQ)
    OFF_V = U(BR * SQ + BC * SQ)  # V_j: (Bc, SV)
    uSTAGE = U(BC * SQ + BC * SV)  # CP_ASYNC: stage 1 (K, V of the odd blocks) follows stage 0 at OFF_K + uSTAGE
    OFF_P = U(BR * SQ) + U(2 if CP_ASYNC else 1) * uSTAGE  # P~_ij: (Br, SP); warp w owns rows 16 MW w .. 16 MW (w+1) - 1
    RS = _tiles.v_pair_stride(DP)  # SPLIT_KV: words of a (key step, t) row of V_j's parts in B-fragment pairs
    VPART = U(NB * 4 * RS)  # SPLIT_KV: words of one part (big or small) of one stage of them
    if SPLIT_KV:  # Dev: K_j's two stages, one stage of V_j as copied, P~, K_j's small parts, V_j's parts in pairs
        uSTAGE = U(BC * SQ)  # K_j only: the copied V_j is read by its copying thread alone, so one stage
        OFF_V = U(BR * SQ + 2 * BC * SQ)
        OFF_P = OFF_V + U(BC * SV)
    DS = OFF_P + U(BR * SP) - OFF_K  # SPLIT_KV: K_j's small parts (both stages), DS words past their big parts
    OFF_VP = OFF_K + DS + U(2 * BC * SQ if SPLIT_KV else 0)  # SPLIT_KV: V_j's pairs, stage s at + 2 s VPART (big, then small at + VPART)
    NS = MW * NB * 4  # registers of rS: MW x NB m16n8 fragments, 4 floats per lane each
    NO = MW * ND * 4  # registers of rO: MW x ND fragments
    NR = MW * 2  # query rows per lane (rows g and g + 8 of each m16 tile)
    SXN = NW * ptx.SIM_SCRATCH_PER_WARP if SIM else 1  # simulator lane-exchange scratch (floats)
    SCR = ptx.SIM_SCRATCH_PER_WARP  # one warp's share of it

    SWZ = _tiles.swizzle16 if WIDE else None  # WIDE: Q_i, K_j columns swizzled (odd rows' 16-float halves traded)
    # K_j, V_j: HBM -> registers (NL floats each per thread) -> SRAM (V with its own stride SV); Q_i: times tau log2 e
    NL, load_pair, store_pair = _tiles.make_pair_loader(BC, DP, NT, SQ, SV, STEP_ROWS=False, QUIET_NAN=True)
    RK = 1 if CP_ASYNC else NL  # register staging of K_j, V_j (none with cp.async)
    load_q = _tiles.make_scaled_q_loader(BR, DP, NT, SQ, QUIET_NAN=True, SWIZZLE=SWZ)
    # CP_ASYNC: K_j, V_j as 16-byte chunks of 4 floats (their own row strides), and the NaN pass over them
    _, load_k_async = _tiles.make_word_loader_async(BC, DP, NT, SQ, SIM, SWZ)
    _, load_v_async = _tiles.make_word_loader_async(BC, DP, NT, SV, SIM, None, SPLIT_KV)  # SPLIT_KV: rows r, r + 4 a thread
    quiet_k = _tiles.make_quiet_nan_pass(BC, DP, NT, SQ, SWZ)
    quiet_v = _tiles.make_quiet_nan_pass(BC, DP, NT, SV)
    split_k = _tiles.make_split_pass(BC, DP, NT, SQ, SIM, SWZ)  # SPLIT_KV: the NaN pass and the warps' split at once
    split_v = _tiles.make_v_pair_split_pass(BC, DP, NT, SV, SIM)  # 16-byte stores of each pair part
    # Q_ASYNC: Q_i as 16-byte chunks, then each thread's chunks times tau log2 e (NaN -> quiet NaN) in SRAM
    _, load_q_async = _tiles.make_word_loader_async(BR, DP, NT, SQ, SIM, SWZ)
    scale_q = _tiles.make_quiet_nan_pass(BR, DP, NT, SQ, SWZ, SCALE=True)
    _copy16, cp_commit, cp_wait0 = ptx.make_cp_async(SIM)
    n_key_blocks, _ = _tiles.make_block_counts(BR, BC, CAUSAL)
    query_block = forward_steps.make_query_block(HEAVY_FIRST)
    warp_sees_no_key = _tiles.make_warp_horizon(16 * MW)

    @cuda.jit(device=True, inline="always")
    def landed(smem, words, kbase, vbase, j, tid, scale_log2, vpair):
        """Each thread's pass over its own landed chunks (CP_ASYNC); ``vpair``: block j's V_j pairs (SPLIT_KV)."""
        if Q_ASYNC and j == 0:
            scale_q(smem, OFF_Q, tid, scale_log2)  # Dev: L4's times tau log2 e, on this thread's own chunks
        if SPLIT_KV:  # Dev: this thread's chunks as tf32 parts: K_j's big in place (small DS on), V_j's in pairs
            split_k(smem, words, kbase, DS, tid)
        else:
            quiet_k(smem, kbase, tid)  # Dev: NaN -> quiet NaN in this thread's chunks (the split keeps it a NaN)
        if SPLIT_KV:
            split_v(smem, words, vbase, vpair, VPART, tid)
        else:
            quiet_v(smem, vbase, tid)

    init_o_l_m = forward_steps.make_init_o_l_m(MW, NO, DROPOUT)
    load_kv_first, load_kv = forward_steps.make_kv_pipeline(BC, OFF_K, OFF_V, uSTAGE, not SPLIT_KV, CP_ASYNC, PREFETCH, Q_ASYNC,
                                                            load_q_async, load_k_async, load_v_async, cp_commit, cp_wait0,
                                                            load_pair, store_pair, landed)
    mma_qk = make_tf32_s_step(MW, NB, DP, SQ, WIDE, SPLIT_KV, DS, SIM)
    mask_s, _ = fragments.make_fragment_steps(MW, NB, BC, CAUSAL)
    online_softmax = forward_steps.make_online_softmax(MW, NB, BC, CAUSAL, DROPOUT, SIM, math.exp2, False, True, OFF_P, SP)
    mma_pv = make_tf32_pv_step(MW, NB, DP, SV, SP, OFF_P, RS, VPART, STAGE_O_STEP, RESCALE_FMA, WIDE, SPLIT_KV, SIM)
    store_o_row, write_staged_o = make_tf32_o_store(MW, DP, SQ, WIDE, SIM)
    write_o_l = forward_steps.make_write_o_l(MW, SIM, DROPOUT, store_o_row)

    # [doc:fa2-tc-kernel]
    @cuda.jit(fastmath=False)
    def kernel(gQ, gK, gV, gO, gL, gm, gl, scale_log2, group, causal_offset, seed, threshold, dropout_scale):
        smem = cuda.shared.array(0, float32)  # Q_i, K_j, V_j, P~; offsets OFF_*
        words = cuda.shared.array(0, uint32)  # the same SRAM as tf32 bit patterns (SPLIT_KV's K_j, V_j parts)
        scale_log2 = float32(scale_log2)  # Dev: float32, as the FFMA kernels and the backward round tau log2 e Q
        sx = cuda.shared.array(SXN, float32)  # the simulator's lane-exchange scratch (unused on a GPU)
        rS = cuda.local.array(NS, float32)  # S_ij, then P~_ij: MW x NB fragments
        rO = cuda.local.array(NO, float32)  # O_i: MW x ND fragments
        rm = cuda.local.array(NR, float32)
        rl = cuda.local.array(NR, float32)
        ralpha = cuda.local.array(NR, float32)
        rkey = cuda.local.array(NR, uint64)
        rKn = cuda.local.array(RK, float32)  # K_j / K_{j+1} in flight (registers; register path)
        rVn = cuda.local.array(RK, float32)

        tid = U(cuda.threadIdx.x)
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        g = U(lane // 4)  # fragment row (and row + 8)
        t = U(lane % 4)  # fragment column pair 2t, 2t + 1
        wbase = warp * SCR
        nheads = gQ.shape[2]
        s_q = gQ.shape[1]
        s_k = gK.shape[1]
        d = gQ.shape[3]
        # FA2.1 L3: for i = 1..Tr -- one thread block per i; Dev: the heaviest (causal) blocks first (HEAVY_FIRST: of all heads)
        i, bh, b, h = query_block(gQ.shape[0], nheads)  # Dev: b*h folded over grid y, z (y <= 65535)
        if b >= gQ.shape[0] or (HEAVY_FIRST and i < 0):
            return  # Dev: past b*h (HEAVY_FIRST: past Tr) in the last z slab of the fold
        ub, uh, uhk = U(b), U(h), U(h // group)
        row0 = i * BR
        wrow = U(16 * MW) * U(warp)  # this warp's first row within the block

        # FA2.1 L4: load Q_i (times tau log2 e: exp2 later) from HBM to SRAM; rows past N_q and columns past d are zero
        if not Q_ASYNC:  # Dev: Q_ASYNC: by cp.async with K_1, V_1 below
            load_q(gQ, smem, OFF_Q, ub, uh, row0, s_q, d, tid, scale_log2)  # HBM read: Br*d
        # FA2.1 L5: on chip, O_i = 0, l_i = 0, m_i = -inf
        init_o_l_m(rO, rm, rl, rkey, seed, bh, row0, wrow, g)

        # Dev: causal block skipping: key blocks past the last row's horizon are never visited
        n_blocks = n_key_blocks(row0 + BR, s_k, causal_offset)
        if n_blocks > 0:  # Dev: L7 of block 1 before the loop (CP_ASYNC: into stage 0, with Q_ASYNC's Q_i)
            load_kv_first(smem, gQ, gK, gV, ub, uh, uhk, row0, s_q, s_k, d, tid, rKn, rVn)
        # FA2.1 L6: for j = 1..Tc
        for j in range(n_blocks):
            col0 = j * BC
            vpair = OFF_VP + U(2 * (j % 2)) * VPART  # SPLIT_KV: this block's V_j pairs
            # FA2.1 L7: K_j, V_j from HBM in SRAM (CP_ASYNC: waited for, split or NaN-quieted, then K_{j+1}, V_{j+1} issued)
            kbase, vbase = load_kv(smem, words, gK, gV, ub, uhk, j, n_blocks, s_k, d, tid, scale_log2, rKn, rVn, vpair)
            if WARP_SKIP and warp_sees_no_key(row0 + int(wrow), col0, causal_offset):
                continue  # Dev: every score of this warp's rows is masked: L8-L10 would leave m, l, O as they are

            # [doc:fa2-tc-inner-loop]
            # FA2.1 L8: S_i^(j) = Q_i K_j^T: per 8-wide k step, A = Q rows (16 x 8 per m tile),
            # B = K_j^T (8 x 8 per key tile); 3xTF32: small parts first, big x big last
            mma_qk(smem, words, rS, OFF_Q, kbase, wrow, g, t, sx, wbase, lane)
            # Dev: the elementwise mask only on blocks the diagonal crosses, or the ragged last block
            mask_s(rS, row0, wrow, g, t, col0, s_k, causal_offset)

            # FA2.1 L9: m_new = max(m_old, rowmax S) (this lane's 2 Bc/8 values, then its quad); P~ = exp2(S - m_new),
            # to this warp's rows of the P~ tile; l_i = e^(m_old - m_new) l_i + rowsum P~, kept per lane
            online_softmax(rS, rm, rl, ralpha, rkey, smem, col0, wrow, g, t, scale_log2, threshold, sx, wbase, lane)
            if SIM:
                cuda.syncthreads()  # Sync: (simulator) P~ rows in SRAM before L10 reads them
            else:
                cuda.syncwarp(0xFFFFFFFF)  # Sync: P~ rows in SRAM before L10; written and read by the lanes of one warp only
            # FA2.1 L10: O_i = diag(e^(m_old - m_new)) O_i + P~ V_j (A = this warp's rows of P~, B = V_j)
            mma_pv(smem, words, rO, ralpha, vbase, vpair, wrow, g, t, sx, wbase, lane)
            # [/doc:fa2-tc-inner-loop]

        if WIDE and n_blocks == 0:
            cuda.syncthreads()  # Sync: no key block ran, so no barrier yet: all threads' Q_i stores are done before O is staged over them
        # FA2.1 L12-L15: O_i = diag(l_i)^-1 O_i, L_i = m_i + log(l_i) (m_i in base 2), both to HBM (WIDE: O staged);
        # Dev: m_i (natural units) and l_i are saved too, apart, for the backward's P
        write_o_l(gO, gL, gm, gl, smem, rO, rm, rl, b, h, ub, uh, row0, wrow, g, t, s_q, d, sx, wbase, lane, dropout_scale)
        if WIDE:  # Dev: WIDE, the rest of line 14: the warp's staged rows of O_i to HBM a row at a time (coalesced)
            write_staged_o(gO, smem, ub, uh, row0, wrow, lane, s_q, d)

    # [/doc:fa2-tc-kernel]
    return kernel


def default_features() -> dict:
    """``PREFETCH``: load K_{j+1}, V_{j+1} into registers during the compute of tile j (None: at d <= 64).
    ``CP_ASYNC``: K_j, V_j by ``cp.async`` into two SRAM stages where :func:`cp_async_ok` and the inputs are
    16-byte aligned (:func:`numba_flash.fast._plan.aligned16`); on by default since an H100 sweep
    timed it (the performance log's section "3xTF32 forward: cp.async for K_j, V_j").
    ``STAGE_O_STEP``: line 10 staged per 8-key step instead of per key block (fewer registers, other bits; see
    :func:`fa2_forward_tc_kernel`); None: on where the tiling has ``MW = 2`` and d > 64 (the ``cp.async`` default
    at d = 128, which does not fit the registers without it; timed in the performance log's section "3xTF32
    forward: O staged per key step"), off elsewhere (8 % slower at d = 64).
    ``WIDE``: 16-byte fragment loads with the dot products' terms reordered (:func:`fa2_forward_tc_kernel`), on the
    ``cp.async`` path where :func:`wide_ok`; None: where the padded head dim is above 64 (:func:`wide_on` says why;
    timed in the performance log's sections "3xTF32 forward: 16-byte fragment loads" and "3xTF32 backward in the
    forward's ``WIDE`` order").
    ``Q_ASYNC``: ``Q_i`` by ``cp.async`` too, with ``K_1, V_1`` (:func:`fa2_forward_tc_kernel`); None: on the ``cp.async`` path
    (:func:`numba_flash.fast._plan.async_on`), off where Q's rows are not 16-byte aligned.
    ``WARP_SKIP``: with causal on a GPU, a warp skips lines 8-10 of a key block none of its rows sees
    (:func:`fa2_forward_tc_kernel`); None: on up to d = 64 (:func:`warp_skip_on` has the timings).
    ``HEAVY_FIRST``: with causal, the blocks of all heads start heaviest first (:func:`fa2_forward_tc_kernel`): 1.02-1.09x
    against each head's blocks in turn on an H200 at every tiling and N timed (the performance log's section "3xTF32
    forward: the heaviest query blocks of all heads first").
    ``SPLIT_KV``: ``K_j, V_j`` split into tf32 parts once per thread block, in SRAM, not by every warp
    (:func:`fa2_forward_tc_kernel`; the same bits); only with ``WIDE``; None: on at 8 x 2 x 16
    (:func:`split_kv_on` says why).
    ``RESCALE_FMA``: with ``STAGE_O_STEP``, line 10's rescale of O in one FFMA with the key block's first 8-key step
    (:func:`fa2_forward_tc_kernel`); None: on for the causal 8 x 2 x 16 tiling only (:func:`rescale_fma_on` has the
    timings).
"""
    return {"PREFETCH": None, "CP_ASYNC": True, "STAGE_O_STEP": None, "WIDE": None, "HEAVY_FIRST": True,
            "Q_ASYNC": None, "WARP_SKIP": None, "SPLIT_KV": None, "RESCALE_FMA": None}


def warp_skip_on(feature, causal: bool, sim: bool, DP: int) -> bool:
    """``WARP_SKIP`` resolved: only with ``causal`` on a GPU (:func:`fa2_forward_tc_kernel`); there ``bool(feature)``,
    None: on where the padded head dim ``DP`` is at most 64. On an H100 it paid at d = 64 up to N = 2k and was even
    above; at d = 128 it did not pay, where the GPU's build of the 4 x 2 x 16 and 8 x 2 x 16 tilings with it keeps
    8-16 bytes a thread in local memory (none without it): the performance log's sections "3xTF32 forward: causal
    warps skip the key blocks none of their rows sees" and "``WARP_SKIP`` at d = 128 once more, interleaved"."""
    if not causal or sim:
        return False
    return bool(feature) if feature is not None else DP <= 64


def split_kv_on(feature, wide: bool, tiling) -> bool:
    """``SPLIT_KV`` resolved: only with ``WIDE`` (and so on the ``cp.async`` path, whose NaN pass its split pass
    replaces); there ``bool(feature)``, None: on at the ``(NW, MW, Bc)`` tiling 8 x 2 x 16 (the d > 64 default, causal
    from :data:`CAUSAL_LONG_SEQLEN`, 2k), with or without ``causal``: there it paid on an H100 with and without causal
    once its split passes stored 16 bytes at a time (with 4-byte stores, 4-way bank conflicts, it had paid with causal
    only). At the causal tilings below 2k it costs their second block per SM and lost clearly, so it is off there
    (``causal`` no longer decides; the tiling does). The performance log's sections "3xTF32 forward: ``K_j, V_j`` split
    into tf32 parts once per block" and "The split passes' 16-byte stores"."""
    if not wide:
        return False
    return bool(feature) if feature is not None else tuple(tiling) == (8, 2, 16)  # Dev: plan: where it fits


def wide_on(feature, DP: int, cp_async: bool) -> bool:
    """``WIDE`` resolved: never off the ``cp.async`` path or where not :func:`wide_ok`; else ``bool(feature)``, None: on
    where ``DP > 64`` (96 and 128). On an H100 it paid at d = 128 with and without causal, and less at d = 64 (the
    performance log's section "3xTF32 forward: 16-byte fragment loads").

    The 3xTF32 backward (:mod:`numba_flash.tensorcore.fa2_backward_tf32`) recomputes S bit for bit as its forward summed it
    (sharp softmaxes break the gradient error rule otherwise: with ``WIDE`` the default and a backward in the former
    order, a sharp-softmax GPU test failed), so it follows this choice (its own ``WIDE``, in this order). With it the
    backward was slower at d = 64 and faster at d = 128, where its unpadded tiles let ``Q_i, dO_i`` arrive by
    ``cp.async`` in two stages (the performance log's section "3xTF32 backward in the forward's ``WIDE`` order"): so on
    above d = 64 only."""
    if not (cp_async and wide_ok(DP)):
        return False
    return bool(feature) if feature is not None else DP > 64


def wide_for(prob: Problem, *kv, features=None) -> bool:
    """Whether :func:`forward` of ``prob`` (with ``features``) sums S in ``WIDE``'s order on the K, V kernel arrays
    ``kv`` (none given: 16-byte aligned ones): what the 3xTF32 backward must follow to recompute S bit for bit
    (:mod:`numba_flash.tensorcore.fa2_backward_tf32`). The same resolution as :func:`forward` and :func:`plan`."""
    if not handles(prob):
        return False
    feats = {**default_features(), **(_plan.register_path_if_unaligned(features, default_features(), *kv) or {})}
    return wide_on(feats["WIDE"], _plan.padded_headdim(prob.headdim), _cp_async(prob.headdim, feats))


def _cp_async(d: int, feats: dict) -> bool:
    """Whether the kernel for head dim ``d`` with the features ``feats`` (defaults filled in) takes the ``cp.async`` path."""
    return bool(feats["CP_ASYNC"]) and cp_async_ok(d)


def stage_o_step(feature, MW: int, DP: int) -> bool:
    """``STAGE_O_STEP`` resolved: ``feature`` unless None, else on where ``MW >= 2`` and ``DP > 64``."""
    return bool(feature) if feature is not None else (MW >= 2 and DP > 64)


#: The ``(NW, MW, Bc)`` tiling at which ``RESCALE_FMA`` is on by default, with causal only (:func:`rescale_fma_on`)
RESCALE_FMA_TILING = (8, 2, 16)


def rescale_fma_on(feature, stage_o_step_on: bool, causal: bool = False, tiling=None) -> bool:
    """``RESCALE_FMA`` resolved: only with ``STAGE_O_STEP`` (``stage_o_step_on``, as :func:`stage_o_step` resolved it),
    whose separate rescale it folds into the first 8-key step's add; there ``bool(feature)``, None: on with ``causal``
    at the ``(NW, MW, Bc)`` tiling :data:`RESCALE_FMA_TILING` (8 x 2 x 16, the causal d > 64 default from 2k).

    On an H200 at d = 128 (host time hidden, interleaved) it paid about 4 % at that tiling from N = 2k to 16k; elsewhere
    it did not pay: causal 4 x 2 x 16 at N 512 and 1k, and non-causal 8 x 2 x 16, whose build keeps 8 bytes a thread
    in local memory with it (none without). The performance log's section "3xTF32 forward: line 10's rescale in one
    FFMA (``RESCALE_FMA``)"."""
    if not stage_o_step_on:
        return False
    if feature is not None:
        return bool(feature)
    return causal and tiling is not None and tuple(tiling) == RESCALE_FMA_TILING


def handles(prob: Problem) -> bool:
    """Whether this kernel runs ``prob``: a head dim up to :data:`TC_MAX_HEADDIM` (the registry routes the float16 /
    bfloat16 problems the half kernel takes there first, and larger head dims to the FFMA kernel)."""
    return prob.headdim <= TC_MAX_HEADDIM


def tiling(prob: Problem, block_sizes=None, features=None) -> tuple:
    """The tiling ``(NW, MW, Bc, DP)`` :func:`plan` launches for ``prob`` (``features`` over the defaults):
    :func:`config_for` of the problem's head dim, mask and query length. ``Br = 16 x [1] x [0]`` and ``Bc = [-2]``."""
    feats = _plan.checked_features(default_features(), features)
    return config_for(prob.headdim, block_sizes, _cp_async(prob.headdim, feats), prob.causal, prob.seqlen_q)


def plan(prob: Problem, block_sizes=None, config=None, features=None):
    """(kernel, grid, threads, dynamic SRAM bytes) of one launch, without launching."""
    if not available():
        raise ValueError("variant='tensorcore' needs mma.sync (compute capability >= 8.0); use variant='fast'")
    if config is None and not handles(prob):
        raise ValueError(f"the 3xTF32 forward runs head dims up to {TC_MAX_HEADDIM}, got {prob.headdim} "
                         "(the registry routes larger ones to the FFMA kernel)")
    d = prob.headdim
    feats = _plan.checked_features(default_features(), features)
    cp_async = _cp_async(d, feats)
    sim = _backend.is_simulator()
    NW, MW, Bc, DP = config if config is not None else tiling(prob, block_sizes, feats)
    prefetch = feats["PREFETCH"] if feats["PREFETCH"] is not None else DP <= 64
    prefetch = bool(prefetch) and not cp_async  # unused by the cp.async path: one compiled kernel, not two
    Br = 16 * MW * NW
    wide = wide_on(feats["WIDE"], DP, cp_async)  # Dev: the swizzled K_j arrives by cp.async only
    split_kv = split_kv_on(feats["SPLIT_KV"], wide, (NW, MW, Bc))
    nbytes = 4 * smem_floats(NW, MW, Bc, DP, sim, 2 if cp_async else 1, wide, split_kv)
    if split_kv and feats["SPLIT_KV"] is None and nbytes > _smem.max_optin_bytes():
        split_kv = False  # Dev: by default only where it fits (not with the simulator's exchange scratch at 8 x 2 x 16)
        nbytes = 4 * smem_floats(NW, MW, Bc, DP, sim, 2 if cp_async else 1, wide)
    _plan.check_sram(nbytes, Br, Bc, d)
    o_step = stage_o_step(feats["STAGE_O_STEP"], MW, DP)
    kernel = fa2_forward_tc_kernel(NW, MW, Bc, DP, prob.causal, prob.dropout_p > 0, prefetch, sim,
                                   cp_async, o_step, wide, prob.causal and bool(feats["HEAVY_FIRST"]),
                                   _plan.async_on(feats["Q_ASYNC"], cp_async), warp_skip_on(feats["WARP_SKIP"], prob.causal, sim, DP),
                                   split_kv,
                                   rescale_fma_on(feats["RESCALE_FMA"], o_step, prob.causal, (NW, MW, Bc)))
    grid = bh_grid(ceil_div(prob.seqlen_q, Br), prob.batch * prob.nheads)
    return kernel, grid, 32 * NW, nbytes


def choose_block_sizes(prob: Problem, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) of the tiles (the kernel contract): :func:`config_for` rounds an override to the tiling. The
    default is the ``cp.async`` path's where :func:`cp_async_ok` (16-byte aligned K and V, as torch allocates)."""
    NW, MW, Bc, DP = config_for(prob.headdim, block_sizes, None, prob.causal, prob.seqlen_q)
    return 16 * MW * NW, Bc


def sram_bytes(prob: Problem, block_sizes=None) -> int:
    """Dynamic shared memory per block, in bytes."""
    return plan(prob, block_sizes)[3]


def compiled_kernels(prob: Problem, block_sizes=None) -> list[KernelLaunch]:
    """The one launch of :func:`forward`, compiled for ``prob`` (not launched)."""
    return _plan.one_launch("FA2 forward tensor cores", plan(prob, block_sizes), *choose_block_sizes(prob, block_sizes))


def forward(q, k, v, prob: Problem, alloc, block_sizes=None, config=None, features=None) -> ForwardOutput:
    """FA2 Algorithm 1 on the tensor cores (3xTF32), on float32 kernel arrays: ``ForwardOutput(out, lse, m, l)``."""
    defaults = default_features()
    features = _plan.register_path_if_unaligned(features, defaults, k, v)  # Dev: cp.async of K, V rows
    features = _plan.registers_if_unaligned(features, defaults, "Q_ASYNC", q)  # Dev: cp.async of Q rows
    fwd = _plan.run_fa2_forward(plan(prob, block_sizes, config, features), q, k, v, prob, alloc)
    # FA2.1 L17: return O, L
    return fwd
