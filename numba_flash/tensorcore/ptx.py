"""Warp-level matrix multiply-accumulate on the tensor cores (PTX ``mma.sync``) for Numba kernels.

Numba has no tensor-core API, but numba-cuda lowers a function to LLVM IR that NVVM compiles, and
NVVM accepts LLVM *inline assembly*: a string of PTX with operand constraints (numba-cuda itself
emits ``activemask`` this way). :func:`asm_mma` builds such an intrinsic for one ``mma.sync`` shape;
a kernel calls it with tuples of the fragment registers each lane holds and gets the accumulator
fragment back as a tuple. The fragment layouts are the PTX ISA's ("Matrix fragments for mma.m8n8k4
with .f64 floating point type"): for ``m8n8k4.f64``, with ``g = lane // 4`` and ``t = lane % 4``,

* A (8 x 4, row-major) : lane holds ``A[g, t]``
* B (4 x 8, column)    : lane holds ``B[t, g]``
* C, D (8 x 8)         : lane holds ``C[g, 2t]`` and ``C[g, 2t + 1]``

The simulator cannot execute PTX. :func:`make_warp_ops` therefore returns, for the backend in use,
the few warp-level steps a tensor-core kernel needs (split a float32 into two tf32 parts, the
``m16n8k8`` TF32 mma, sums and maxima over the four lanes of a quad): on a GPU they are the inline
PTX and warp shuffles; in the simulator they are Python functions with the *same fragment semantics*
that exchange the lanes' registers through a small shared-memory scratch with block barriers. So
the kernel source is the same on both backends, and the simulator checks the fragment bookkeeping.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from llvmlite import ir
from numba import cuda, float32, types, uint32
from numba.core import cgutils
from numba.core.extending import intrinsic

from ..device.constants import FULL_MASK as _FULL_MASK
from ..fast._regtile import min_keep_nan
from ..runtime import backend as _backend


def available() -> bool:
    """True where ``mma.sync`` runs: the simulator (through the Python twins), or a GPU of compute capability >= 8.0."""
    if _backend.is_simulator():
        return True
    return _backend.device_facts().compute_capability >= (8, 0)


_LLVM = {"f64": ir.DoubleType(), "f32": ir.FloatType(), "b32": ir.IntType(32)}
_NUMBA = {"f64": types.float64, "f32": types.float32, "b32": types.uint32}
_CONSTRAINT = {"f64": "d", "f32": "f", "b32": "r"}


def asm_mma(op: str, nd: int, na: int, nb: int, cd: str, ab: str):
    """An intrinsic ``d = f(a, b, c)`` issuing ``mma.sync`` ``op`` on tuples of fragment registers.

    ``nd``/``na``/``nb``: registers per lane of C/D, A and B; ``cd``/``ab``: their PTX register types
    (``f64``, ``f32``, or ``b32`` for tf32 bit patterns).
    """
    lcd, lab = _LLVM[cd], _LLVM[ab]
    tcd, tab = _NUMBA[cd], _NUMBA[ab]
    operands, n = [], 0
    for count in (nd, na, nb, nd):
        operands.append("{" + ",".join(f"${n + i}" for i in range(count)) + "}")
        n += count
    text = f"{op} {operands[0]}, {operands[1]}, {operands[2]}, {operands[3]};"
    constraints = ",".join([f"={_CONSTRAINT[cd]}"] * nd + [_CONSTRAINT[ab]] * (na + nb) + [_CONSTRAINT[cd]] * nd)
    fnty = ir.FunctionType(ir.LiteralStructType([lcd] * nd), [lab] * (na + nb) + [lcd] * nd)

    @intrinsic
    def mma(typingctx, a, b, c):
        sig = types.UniTuple(tcd, nd)(types.UniTuple(tab, na), types.UniTuple(tab, nb), types.UniTuple(tcd, nd))

        def codegen(context, builder, signature, args):
            ta, tb, tc = args
            ins = ([builder.extract_value(ta, i) for i in range(na)] + [builder.extract_value(tb, i) for i in range(nb)]
                   + [builder.extract_value(tc, i) for i in range(nd)])
            r = builder.call(ir.InlineAsm(fnty, text, constraints), ins)
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(r, i) for i in range(nd)])

        return sig, codegen

    mma.__doc__ = f"``{text}`` ({constraints})"
    return mma


#: D (8x8) = A (8x4) B (4x8) + C in float64 on the FP64 tensor cores (sm_80+). Lane: a = A[g, t],
#: b = B[t, g], c = (C[g, 2t], C[g, 2t+1]).
dmma_m8n8k4_asm = asm_mma("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64", 2, 1, 1, "f64", "f64")
#: sm_90 shapes of the same (Hopper's native DMMA.16x8x8 and friends).
dmma_m16n8k4_asm = asm_mma("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64", 4, 2, 1, "f64", "f64")
dmma_m16n8k8_asm = asm_mma("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64", 4, 4, 2, "f64", "f64")
dmma_m16n8k16_asm = asm_mma("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64", 4, 8, 4, "f64", "f64")
#: TF32 inputs (bit patterns, from :data:`split_tf32_asm`), float32 accumulate (sm_80+).
tf32_m16n8k8_asm = asm_mma("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 4, 4, 2, "f32", "b32")


def _split_tf32_asm(keep_nan: bool = False):
    """An intrinsic ``(big, small) = f(x)``: the 3xTF32 split of a float32 in one PTX block.

    ``big`` = x rounded to tf32 (to nearest, ties away: add half a tf32 ulp to the bits, clear the 13
    low ones; what ``cvt.rna.tf32.f32`` does for finite x, without its inf/NaN test: ptxas gives that
    one an extra FSETP), ``small`` = the
    same rounding of ``x - big`` (exact in float32). Five integer/float instructions, no conversion unit.

    The add carries a NaN whose mantissa bits 12-22 are all ones into the sign: the GPU's arithmetic NaN
    ``0x7fffffff`` becomes ``-0.0``. With ``keep_nan`` the bits are first clamped (as a signed integer) to
    ``0x7fffefff``, one ``IMNMX``: every positive NaN then stays a NaN (``0x7fffe000`` at most), and nothing
    else moves (finite numbers and inf are below the clamp, negative numbers are negative integers). A
    negative NaN ``0xfffff000``-``0xffffffff`` still wraps to ``+0.0``; the GPU's float arithmetic never makes one.
    """
    clamp = "min.s32 r, r, 2147479551; " if keep_nan else ""  # 0x7fffefff
    text = ("{ .reg .b32 r; .reg .f32 f; mov.b32 r, $2; " + clamp + "add.u32 r, r, 4096; and.b32 $0, r, -8192; "
            "mov.b32 f, $0; sub.f32 f, $2, f; mov.b32 r, f; add.u32 r, r, 4096; and.b32 $1, r, -8192; }")
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.LiteralStructType([i32, i32]), [ir.FloatType()])

    @intrinsic
    def split(typingctx, x):
        def codegen(context, builder, signature, args):
            r = builder.call(ir.InlineAsm(fnty, text, "=r,=r,f"), args)
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(r, 0), builder.extract_value(r, 1)])

        return types.UniTuple(types.uint32, 2)(types.float32), codegen

    return split


#: (big, small) tf32 bit patterns of a finite float32 (see :func:`_split_tf32_asm`).
split_tf32_asm = _split_tf32_asm()
#: The same, with a positive NaN kept a NaN in ``big`` (one more instruction; :func:`make_split_keep_nan`).
split_tf32_keep_nan_asm = _split_tf32_asm(keep_nan=True)


@intrinsic
def min_nan_asm(typingctx, x, cap):
    """``min.NaN.f32`` (sm_80+): ``min(x, cap)`` that returns NaN when ``x`` is NaN, one ``FMNMX.NAN``.

    The 3xTF32 backward's cap on ``S - M`` on a GPU (:func:`make_min_keep_nan`). Written as the select
    ``cap if x > cap else x`` (:func:`numba_flash.fast._regtile.min_keep_nan`) LLVM made the same instruction, but the
    non-causal d = 64 build then kept a 256-byte array on the stack (offline sm_90: SASS 6496 -> 5744 instructions,
    0 -> 256 stack bytes) and ran its training step 14-17 % slower on an H200; PTX is opaque to those heuristics."""
    f32 = ir.FloatType()
    fnty = ir.FunctionType(f32, [f32, f32])

    def codegen(context, builder, signature, args):
        return builder.call(ir.InlineAsm(fnty, "min.NaN.f32 $0, $1, $2;", "=f,f,f"), args)

    return types.float32(types.float32, types.float32), codegen


def make_split_keep_nan(simulator: bool | None = None):
    """``split_tf32(x) -> (big, small)`` that keeps the GPU's arithmetic NaN: :data:`split_tf32_keep_nan_asm` on a GPU,
    the simulator's split (:func:`split_tf32_host`, which skips inf and NaN) there.

    For an operand the kernel computes before its split, e.g. the 3xTF32 backward's ``Q_i tau log2 e`` without
    ``SPLIT_QDO``: a NaN product is ``0x7fffffff``, which :data:`split_tf32_asm` turns into ``-0.0`` (tiles loaded from HBM
    are quieted to ``0x7fc00000`` instead, which every split keeps)."""
    sim = _backend.is_simulator() if simulator is None else simulator
    if sim:
        return cuda.jit(device=True)(_split_tf32_sim)

    @cuda.jit(device=True, inline="always")
    def split_tf32_keep_nan(x):
        return split_tf32_keep_nan_asm(x)

    return split_tf32_keep_nan


def make_min_keep_nan(simulator: bool | None = None):
    """The NaN-keeping cap for the backend: :func:`min_nan_asm` on a GPU, the Python select in the simulator."""
    sim = _backend.is_simulator() if simulator is None else simulator
    return min_keep_nan if sim else min_nan_asm

#: registers of the shared-memory scratch each warp needs in the simulator (A 16x8 + B 8x8 of one mma)
SIM_SCRATCH_PER_WARP = 16 * 8 + 8 * 8


def _tf32_bits_host(x) -> np.uint32:
    """cvt.rna.tf32.f32 on the host: round the float32 ``x`` to 10 mantissa bits, ties away from zero."""
    u = int(np.float32(x).view(np.uint32))
    if (u >> 23) & 0xFF != 0xFF:  # finite: add half an ulp of tf32, then drop the 13 low bits
        u = (u + 0x1000) & 0xFFFFFFFF
    return np.uint32(u & 0xFFFFE000)


def _bits_as_f32_host(u) -> float:
    return float(np.uint32(u).view(np.float32))


def split_tf32_host(x) -> tuple[int, int]:
    """The (big, small) tf32 bit patterns of the float32 ``x``, on the host: the simulator's ``split_tf32``
    (:func:`make_warp_ops`), and for a finite ``x`` the GPU's."""
    big = _tf32_bits_host(x)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN here as on the GPU: the NaN-keeping split expects it
        rest = np.float32(np.float32(x) - np.float32(_bits_as_f32_host(big)))
    return int(big), int(_tf32_bits_host(rest))


def _split_tf32_sim(x):
    """The simulator's ``split_tf32``: :func:`split_tf32_host` as the kernels' uint32 pair."""
    big, small = split_tf32_host(x)
    return uint32(big), uint32(small)


def _make_mma_3xtf32(mma_tf32):
    """The 3xTF32 product on top of one backend's single ``mma_tf32``: small parts first, big x big last."""

    def mma_3xtf32(a_big, a_small, b_big, b_small, c, sx, wbase, lane):
        c = mma_tf32(a_small, b_big, c, sx, wbase, lane)
        c = mma_tf32(a_big, b_small, c, sx, wbase, lane)
        return mma_tf32(a_big, b_big, c, sx, wbase, lane)

    return mma_3xtf32


def _sim_mma_of_scratch(sx, A, B, K, c, g, t):
    """The simulator twins' ``mma`` once each lane has put its fragments in the warp's scratch: lane ``(g, t)``'s
    accumulator elements (rows ``g, g + 8``, columns ``2t, 2t + 1``) of ``A B + c``, A row-major 16 x ``K`` at ``A``, B
    row-major ``K`` x 8 at ``B``, each sum in float64 rounded once to float32."""
    cuda.syncthreads()  # Sync: (simulator) the whole warp's fragments are in the scratch
    d = []
    for i, (r, n) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
        acc = float(c[i])
        for kk in range(K):
            acc += float(sx[A + r * K + kk]) * float(sx[B + kk * 8 + n])
        d.append(float32(acc))
    return d[0], d[1], d[2], d[3]


@functools.cache
def make_warp_ops(simulator: bool | None = None):
    """``(split_tf32, mma_3xtf32, quad_max, quad_sum)`` for the backend (the simulator's when ``simulator``).

    * ``split_tf32(x) -> (big, small)``: tf32 bit patterns with ``x ~ big + small`` (``big`` = x rounded
      to tf32, ``small`` = the rounded remainder); the 3xTF32 product ``a b ~ a_b b_b + a_b b_s + a_s b_b``
      then has about 22 correct bits, as float32 (CUTLASS's ``OpMultiplyAddFastF32``).
    * (inside) ``mma_tf32(a, b, c, sx, wbase, lane) -> d``: ``D (16x8) = A (16x8) B (8x8) + C`` with tf32 inputs
      and float32 accumulation (``mma.sync.aligned.m16n8k8``). Lane ``(g, t) = (lane // 4, lane % 4)``
      holds ``a = (A[g,t], A[g+8,t], A[g,t+4], A[g+8,t+4])``, ``b = (B[t,g], B[t+4,g])``,
      ``c = (C[g,2t], C[g,2t+1], C[g+8,2t], C[g+8,2t+1])``. ``sx``/``wbase``: the warp's scratch (simulator).
    * ``mma_3xtf32(a_big, a_small, b_big, b_small, c, sx, wbase, lane) -> d``: the float32-accurate
      product ``D = A B + C`` as three of those mma, small parts first, big x big last.
    * ``quad_max(x, sx, wbase, lane)``, ``quad_sum(...)``: over the 4 lanes ``4g .. 4g+3`` of a quad
      (the lanes that share a row of an mma fragment).

    Every lane of the block must call these the same number of times (the simulator's exchange uses
    block barriers; on a GPU ``mma.sync`` needs the whole warp anyway).
    """
    sim = _backend.is_simulator() if simulator is None else simulator
    if not sim:

        @cuda.jit(device=True, inline="always")
        def split_tf32(x):
            return split_tf32_asm(x)

        @cuda.jit(device=True, inline="always")
        def mma_tf32(a, b, c, sx, wbase, lane):
            return tf32_m16n8k8_asm(a, b, c)

        @cuda.jit(device=True, inline="always")
        def quad_max(x, sx, wbase, lane):
            x = max(x, cuda.shfl_xor_sync(_FULL_MASK, x, 1))
            return max(x, cuda.shfl_xor_sync(_FULL_MASK, x, 2))

        @cuda.jit(device=True, inline="always")
        def quad_sum(x, sx, wbase, lane):
            x += cuda.shfl_xor_sync(_FULL_MASK, x, 1)
            return x + cuda.shfl_xor_sync(_FULL_MASK, x, 2)

        return split_tf32, cuda.jit(device=True, inline="always")(_make_mma_3xtf32(mma_tf32)), quad_max, quad_sum

    # Simulator twins: plain Python run by every simulated thread (numpy for the bit patterns).
    def mma_tf32(a, b, c, sx, wbase, lane):
        g, t = lane // 4, lane % 4
        A, B = wbase, wbase + 16 * 8  # scratch: A row-major 16 x 8, then B row-major 8 x 8
        cuda.syncthreads()  # Sync: (simulator) the previous exchange's reads are done
        sx[A + g * 8 + t] = _bits_as_f32_host(a[0])
        sx[A + (g + 8) * 8 + t] = _bits_as_f32_host(a[1])
        sx[A + g * 8 + t + 4] = _bits_as_f32_host(a[2])
        sx[A + (g + 8) * 8 + t + 4] = _bits_as_f32_host(a[3])
        sx[B + t * 8 + g] = _bits_as_f32_host(b[0])
        sx[B + (t + 4) * 8 + g] = _bits_as_f32_host(b[1])
        return _sim_mma_of_scratch(sx, A, B, 8, c, g, t)

    def _quad(x, sx, wbase, lane, op):
        cuda.syncthreads()  # Sync: (simulator) the previous exchange's reads are done
        sx[wbase + lane] = x
        cuda.syncthreads()  # Sync: (simulator) the four values of every quad are in the scratch
        q = wbase + (lane // 4) * 4
        return op(op(sx[q], sx[q + 1]), op(sx[q + 2], sx[q + 3]))

    def quad_max(x, sx, wbase, lane):
        return _quad(x, sx, wbase, lane, max)

    def quad_sum(x, sx, wbase, lane):
        return _quad(x, sx, wbase, lane, lambda u, v: u + v)

    return (cuda.jit(device=True)(_split_tf32_sim), cuda.jit(device=True)(_make_mma_3xtf32(mma_tf32)),
            cuda.jit(device=True)(quad_max), cuda.jit(device=True)(quad_sum))


# ---------------------------------------------------------------------------------------------
# Half precision: fp16 / bf16 inputs, float32 accumulation (mma.sync.m16n8k16)
# ---------------------------------------------------------------------------------------------
#: The two half types and their PTX names. A "word" is a ``uint32`` holding two of them, the element
#: at the lower index in the low 16 bits (the register layout of ``.f16x2`` / ``.bf16x2``).
HALF_KINDS = {"float16": "f16", "bfloat16": "bf16"}
#: D (16x8, f32) = A (16x16) B (16x8) + C, A and B in fp16 (bf16), two per b32 register (sm_80+).
f16_m16n8k16_asm = asm_mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 4, 4, 2, "f32", "b32")
bf16_m16n8k16_asm = asm_mma("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 4, 4, 2, "f32", "b32")

#: floats of the simulator's exchange scratch per warp: one m16n8k16 mma (A 16x16 + B 16x8), or one
#: ldmatrix.x4 (32 rows of 8 halves)
HALF_SIM_SCRATCH_PER_WARP = 16 * 16 + 16 * 8


def _pack2_asm(ptx_type: str):
    """An intrinsic ``word = f(lo, hi)``: two float32 rounded to nearest-even into one half2 word.

    ``cvt.rn.f16x2.f32 d, a, b`` puts ``a`` in the *upper* half and ``b`` in the lower, so ``hi`` goes first.
    """
    text = f"cvt.rn.{ptx_type}x2.f32 $0, $2, $1;"
    fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])

    @intrinsic
    def pack2(typingctx, lo, hi):
        def codegen(context, builder, signature, args):
            return builder.call(ir.InlineAsm(fnty, text, "=r,f,f"), args)

        return types.uint32(types.float32, types.float32), codegen

    return pack2


pack2_f16_asm = _pack2_asm("f16")
pack2_bf16_asm = _pack2_asm("bf16")


def _ldmatrix_asm(trans: bool):
    """An intrinsic ``(r0, r1, r2, r3) = f(arr, i)``: ``ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16``.

    ``arr`` is a shared ``uint32`` array and ``i`` the word index of *this lane's* row: lanes ``8 j .. 8 j + 7``
    give the 8 rows (16 bytes each, 16-byte aligned) of matrix ``j``; lane ``l`` receives in ``r_j`` the
    word ``l % 4`` of row ``l // 4`` of matrix ``j`` (``.trans``: the two elements ``(2 (l % 4), l // 4)`` and
    ``(2 (l % 4) + 1, l // 4)`` of it, a column pair). The array's generic address is converted to the
    shared window in the same PTX block (``cvta.to.shared``): Numba gives no shared-space pointer itself.
    """
    text = ("{ .reg .u64 a; cvta.to.shared.u64 a, $4; "
            f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 {{$0, $1, $2, $3}}, [a]; }}")
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ir.IntType(64)])

    @intrinsic
    def ldmatrix(typingctx, arr, index):
        def codegen(context, builder, signature, args):
            aryty, idxty = signature.args
            ary = context.make_array(aryty)(context, builder, args[0])
            idx = context.cast(builder, args[1], idxty, types.intp)
            addr = builder.ptrtoint(builder.gep(ary.data, [idx]), ir.IntType(64))
            r = builder.call(ir.InlineAsm(fnty, text, "=r,=r,=r,=r,l", side_effect=True), [addr])
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(r, i) for i in range(4)])

        return types.UniTuple(types.uint32, 4)(arr, index), codegen

    return ldmatrix


ldmatrix_x4_asm = _ldmatrix_asm(False)
ldmatrix_x4_trans_asm = _ldmatrix_asm(True)


def _unpack2_asm(ptx_type: str):
    """An intrinsic ``(lo, hi) = f(word)``: the two halves of a word as float32 (exact).

    fp16: ``cvt.f32.f16`` of each 16-bit half; bf16: a bf16 is the upper 16 bits of a float32, so the low
    half is the word shifted left by 16 and the high half the word with its low 16 bits cleared.
    """
    if ptx_type == "f16":
        text = "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }"
    else:
        text = "{ .reg .b32 l, h; shl.b32 l, $2, 16; and.b32 h, $2, -65536; mov.b32 $0, l; mov.b32 $1, h; }"
    f32 = ir.FloatType()
    fnty = ir.FunctionType(ir.LiteralStructType([f32, f32]), [ir.IntType(32)])

    @intrinsic
    def unpack2(typingctx, word):
        def codegen(context, builder, signature, args):
            w = context.cast(builder, args[0], signature.args[0], types.uint32)
            r = builder.call(ir.InlineAsm(fnty, text, "=f,=f,r"), [w])
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(r, 0), builder.extract_value(r, 1)])

        return types.UniTuple(types.float32, 2)(word), codegen

    return unpack2


unpack2_f16_asm = _unpack2_asm("f16")
unpack2_bf16_asm = _unpack2_asm("bf16")


def _ex2_ftz_asm():
    """An intrinsic ``2^x`` as ``ex2.approx.ftz.f32``: one MUFU.EX2 (see :func:`make_exp2`)."""
    f32 = ir.FloatType()
    fnty = ir.FunctionType(f32, [f32])

    @intrinsic
    def ex2(typingctx, x):
        def codegen(context, builder, signature, args):
            v = context.cast(builder, args[0], signature.args[0], types.float32)
            return builder.call(ir.InlineAsm(fnty, "ex2.approx.ftz.f32 $0, $1;", "=f,f"), [v])

        return types.float32(x), codegen

    return ex2


ex2_ftz_asm = _ex2_ftz_asm()
#: the smallest normal float32, 2^-126
_MIN_NORMAL32 = float(np.finfo(np.float32).tiny)


@functools.cache
def make_exp2(ftz: bool, simulator: bool | None = None):
    """``exp2(x) -> float32``: ``2^x`` for the softmax's ``P = 2^(S' - m)``.

    ``ftz=False``: ``math.exp2`` (CUDA's ``exp2f``), which on a GPU compiles to ``ex2.approx.f32``; ptxas keeps its
    subnormal results with a range test around the MUFU.EX2 (for x < -126: halve x, square the result), four
    instructions. ``ftz=True``: ``ex2.approx.ftz.f32``, the MUFU.EX2 alone, the same value for x >= -126 and 0
    below (where 2^x is subnormal). For ``P`` that is a probability below 2^-126 of its row's largest, less than a
    float32 rounding of the row's sum (>= 1) and of every half-precision product; flash-attn compiles with
    ``--use_fast_math``, which makes every ``exp2f`` this one. In the simulator: ``math.exp2`` rounded to
    float32, flushed to 0 below 2^-126 for ``ftz``.
    """
    if not (_backend.is_simulator() if simulator is None else simulator):
        if ftz:
            @cuda.jit(device=True, inline="always")
            def exp2(x):
                return ex2_ftz_asm(x)
        else:
            @cuda.jit(device=True, inline="always")
            def exp2(x):
                return math.exp2(x)
        return exp2

    def exp2_sim(x):
        r = float32(math.exp2(x))
        if ftz and r < _MIN_NORMAL32:
            return float32(0.0)
        return r

    return cuda.jit(device=True)(exp2_sim)


@functools.cache
def make_unpack2(kind: str, simulator: bool | None = None):
    """``unpack2(word) -> (lo, hi)``: the two ``kind`` halves of a word (:func:`_pack2_asm`'s layout) as float32.

    The half backward's pre-pass ``D = rowsum(dO o O)`` reads O and dO this way (the mma does not need it).
    """
    if kind not in ("f16", "bf16"):
        raise ValueError(f"kind must be 'f16' or 'bf16', got {kind!r}")
    if not (_backend.is_simulator() if simulator is None else simulator):
        asm = unpack2_f16_asm if kind == "f16" else unpack2_bf16_asm

        @cuda.jit(device=True, inline="always")
        def unpack2(word):
            return asm(word)

        return unpack2

    def unpack2(word):
        w = int(word) & 0xFFFFFFFF
        return float32(half_value_host(w, kind)), float32(half_value_host(w >> 16, kind))

    return cuda.jit(device=True)(unpack2)


def _red_add_v2_asm():
    """An intrinsic ``f(arr, (i0, .., ik), x, y)``: ``arr[i0, .., ik] += x`` and the next element ``+= y``, in one
    ``red.global.add.v2.f32`` (sm_90).

    ``arr`` is a float32 array in global memory whose last dimension is contiguous, and the last index is
    even (the vector needs 8-byte alignment). Half the reduction instructions of two scalar atomic adds.
    """
    text = "{ .reg .u64 a; cvta.to.global.u64 a, $0; red.global.add.v2.f32 [a], {$1, $2}; }"
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.FloatType(), ir.FloatType()])

    @intrinsic
    def red_add_v2(typingctx, arr, index, x, y):
        def codegen(context, builder, signature, args):
            aryty, idxty, _, _ = signature.args
            ary = context.make_array(aryty)(context, builder, args[0])
            idx = [context.cast(builder, builder.extract_value(args[1], k), idxty[k], types.intp) for k in range(aryty.ndim)]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
            addr = builder.ptrtoint(ptr, ir.IntType(64))
            builder.call(ir.InlineAsm(fnty, text, "l,f,f", side_effect=True), [addr, args[2], args[3]])
            return context.get_dummy_value()

        return types.void(arr, index, types.float32, types.float32), codegen

    return red_add_v2


red_add_v2_asm = _red_add_v2_asm()


@functools.cache
def make_atomic_add2(vector: bool, simulator: bool | None = None):
    """``add2(arr, (b, r, h, c), x, y)``: ``arr[b, r, h, c] += x`` and ``arr[b, r, h, c + 1] += y``, atomically (float32).

    ``vector`` (a GPU of compute capability 9.0+): one ``red.global.add.v2.f32``; otherwise, and in the
    simulator, two ``cuda.atomic.add``. The half backward adds its dQ fragments (two adjacent columns
    per lane) this way.
    """
    if vector and not (_backend.is_simulator() if simulator is None else simulator):

        @cuda.jit(device=True, inline="always")
        def add2(arr, idx, x, y):
            red_add_v2_asm(arr, idx, x, y)

        return add2

    @cuda.jit(device=True, inline="always")
    def add2(arr, idx, x, y):
        cuda.atomic.add(arr, idx, x)
        cuda.atomic.add(arr, (idx[0], idx[1], idx[2], idx[3] + 1), y)

    return add2


def half_bits_host(x, kind: str) -> int:
    """The 16-bit pattern of float32 ``x`` rounded to nearest-even in ``kind`` (``"f16"`` or ``"bf16"``)."""
    x = np.float32(x)
    if kind == "f16":
        with np.errstate(over="ignore"):  # past 65504 rounds to +-inf, as cvt.rn.f16x2.f32 does: not an error
            return int(np.float16(x).view(np.uint16))
    u = int(x.view(np.uint32))
    if x != x:
        return 0x7FC0 | ((u >> 16) & 0x8000)  # a quiet NaN of the same sign
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def half_value_host(bits, kind: str) -> float:
    """The value of a 16-bit ``kind`` pattern, as a float (exact: fp16 and bf16 values are float32 values)."""
    bits = int(bits) & 0xFFFF
    if kind == "f16":
        return float(np.uint16(bits).view(np.float16))
    return float(np.uint32(bits << 16).view(np.float32))


@functools.cache
def make_half_ops(kind: str, simulator: bool | None = None):
    """``(pack2, mma16, ldsm, ldsm_t)`` for half type ``kind`` (``"f16"`` or ``"bf16"``) on the backend.

    * ``pack2(lo, hi) -> word``: two float32 rounded to nearest-even, ``lo`` in the low 16 bits
      (``cvt.rn.f16x2.f32``); the A operand of ``P~ V_j`` and the output O are made of such words.
    * ``mma16(a, b, c, sx, wbase, lane) -> d``: ``D (16x8) = A (16x16) B (16x8) + C`` with half inputs and
      float32 accumulation (``mma.sync.aligned.m16n8k16``). Lane ``(g, t) = (lane // 4, lane % 4)`` holds
      four A words ``(A[g, 2t:2t+2], A[g+8, 2t:2t+2], A[g, 2t+8:2t+10], A[g+8, 2t+8:2t+10])``, two B
      words ``(B[2t:2t+2, g], B[2t+8:2t+10, g])`` (two k rows of one column) and the accumulator
      ``c = (C[g,2t], C[g,2t+1], C[g+8,2t], C[g+8,2t+1])``: the m16n8k8 layout of :func:`make_warp_ops`
      with each register doubled along k. So two n8 accumulator tiles side by side hold, per lane, exactly
      the four A words of a 16-wide k step: a ``P~`` computed in registers is the A operand of ``P~ V_j``.
    * ``ldsm(smem, i, sx, wbase, lane)`` / ``ldsm_t(...)``: ``ldmatrix.x4`` (``.trans``) from the shared
      ``uint32`` array ``smem``, ``i`` the word index of this lane's row (see :func:`_ldmatrix_asm`): four
      8x8 half matrices in one instruction, each lane getting its fragment words of all four. One A operand
      (16x16), or the B operands of two n8 tiles, per instruction; ``.trans`` reads B from a row-major
      ``V_j`` (keys x columns) as the column pairs the mma wants.

    The simulator's twins exchange the warp's fragments through the scratch ``sx`` (:data:`HALF_SIM_SCRATCH_PER_WARP`
    floats per warp), as :func:`make_warp_ops`' do; products of half values are exact in float32, and the
    sums are rounded to float32 once per output.
    """
    if kind not in ("f16", "bf16"):
        raise ValueError(f"kind must be 'f16' or 'bf16', got {kind!r}")
    sim = _backend.is_simulator() if simulator is None else simulator
    if not sim:
        pack_asm = pack2_f16_asm if kind == "f16" else pack2_bf16_asm
        mma_asm = f16_m16n8k16_asm if kind == "f16" else bf16_m16n8k16_asm

        @cuda.jit(device=True, inline="always")
        def pack2(lo, hi):
            return pack_asm(lo, hi)

        @cuda.jit(device=True, inline="always")
        def mma16(a, b, c, sx, wbase, lane):
            return mma_asm(a, b, c)

        @cuda.jit(device=True, inline="always")
        def ldsm(smem, i, sx, wbase, lane):
            return ldmatrix_x4_asm(smem, i)

        @cuda.jit(device=True, inline="always")
        def ldsm_t(smem, i, sx, wbase, lane):
            return ldmatrix_x4_trans_asm(smem, i)

        return pack2, mma16, ldsm, ldsm_t

    def pack2(lo, hi):
        return uint32(half_bits_host(lo, kind) | (half_bits_host(hi, kind) << 16))

    def mma16(a, b, c, sx, wbase, lane):
        g, t = lane // 4, lane % 4
        A, B = wbase, wbase + 16 * 16  # scratch: A row-major 16 x 16, then B row-major 16 x 8
        cuda.syncthreads()  # Sync: (simulator) the previous exchange's reads are done
        for i, (r, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            sx[A + r * 16 + k] = half_value_host(int(a[i]), kind)
            sx[A + r * 16 + k + 1] = half_value_host(int(a[i]) >> 16, kind)
        for i, k in enumerate((2 * t, 2 * t + 8)):
            sx[B + k * 8 + g] = half_value_host(int(b[i]), kind)
            sx[B + (k + 1) * 8 + g] = half_value_host(int(b[i]) >> 16, kind)
        return _sim_mma_of_scratch(sx, A, B, 16, c, g, t)

    def _ldsm(smem, i, sx, wbase, lane, trans):
        # scratch: the 8 16-bit patterns of each lane's row (lane-major), as floats (exact below 2^24)
        cuda.syncthreads()  # Sync: (simulator) the previous exchange's reads are done
        for w in range(4):
            word = int(smem[i + w])
            sx[wbase + lane * 8 + 2 * w] = word & 0xFFFF
            sx[wbase + lane * 8 + 2 * w + 1] = word >> 16
        cuda.syncthreads()  # Sync: (simulator) the rows of all 32 lanes are in the scratch
        r, c = lane // 4, lane % 4
        out = []
        for j in range(4):  # matrix j: rows from lanes 8 j .. 8 j + 7
            if trans:  # elements (2c, r) and (2c + 1, r): a column pair
                lo, hi = sx[wbase + (8 * j + 2 * c) * 8 + r], sx[wbase + (8 * j + 2 * c + 1) * 8 + r]
            else:  # word c of row r
                lo, hi = sx[wbase + (8 * j + r) * 8 + 2 * c], sx[wbase + (8 * j + r) * 8 + 2 * c + 1]
            out.append(uint32(int(lo) | (int(hi) << 16)))
        return out[0], out[1], out[2], out[3]

    def ldsm(smem, i, sx, wbase, lane):
        return _ldsm(smem, i, sx, wbase, lane, False)

    def ldsm_t(smem, i, sx, wbase, lane):
        return _ldsm(smem, i, sx, wbase, lane, True)

    return (cuda.jit(device=True)(pack2), cuda.jit(device=True)(mma16), cuda.jit(device=True)(ldsm),
            cuda.jit(device=True)(ldsm_t))


# ---------------------------------------------------------------------------------------------
# Asynchronous copies HBM -> SRAM (cp.async, sm_80+)
# ---------------------------------------------------------------------------------------------
def _cp_async_cg16_asm():
    """An intrinsic ``f(smem, i, garr, (i0, .., ik), src_size)``: ``cp.async.cg.shared.global`` of 16 bytes.

    Copies the 16 bytes at ``garr[i0, .., ik]`` (global memory; the last dimension contiguous) to the
    shared ``uint32`` array ``smem`` at word ``i``, without passing through registers: the copy is
    *issued* here and lands later (``.cg``: cached in L2 only). Only the first ``src_size`` bytes are read,
    the rest of the 16 are written as zeros: ``src_size = 0`` writes 16 zero bytes and reads nothing
    (the zero rows past N and words past d of a tile). Both addresses must be 16-byte aligned. The
    copies of a thread become a *group* at :data:`cp_async_commit_asm` and are waited for with
    :func:`cp_async_wait_group_asm`; other threads see them only after a barrier that follows the wait.
    As :func:`_ldmatrix_asm`, the generic addresses are converted in the PTX block (``cvta.to.shared``,
    ``cvta.to.global``); the ``memory`` clobber keeps the compiler from moving SRAM accesses across it.
    """
    text = ("{ .reg .u64 s, g; cvta.to.shared.u64 s, $0; cvta.to.global.u64 g, $1; "
            "cp.async.cg.shared.global [s], [g], 16, $2; }")
    i64 = ir.IntType(64)
    fnty = ir.FunctionType(ir.VoidType(), [i64, i64, ir.IntType(32)])

    @intrinsic
    def cp_async_cg16(typingctx, sarr, sindex, garr, gindex, src_size):
        def codegen(context, builder, signature, args):
            saryty, sidxty, garyty, gidxty, sizety = signature.args
            sary = context.make_array(saryty)(context, builder, args[0])
            sidx = context.cast(builder, args[1], sidxty, types.intp)
            saddr = builder.ptrtoint(builder.gep(sary.data, [sidx]), i64)
            gary = context.make_array(garyty)(context, builder, args[2])
            gidx = [context.cast(builder, builder.extract_value(args[3], k), gidxty[k], types.intp) for k in range(garyty.ndim)]
            gaddr = builder.ptrtoint(cgutils.get_item_pointer(context, builder, garyty, gary, gidx, wraparound=False), i64)
            size = context.cast(builder, args[4], sizety, types.uint32)
            builder.call(ir.InlineAsm(fnty, text, "l,l,r,~{memory}", side_effect=True), [saddr, gaddr, size])
            return context.get_dummy_value()

        return types.void(sarr, sindex, garr, gindex, src_size), codegen

    return cp_async_cg16


#: 16-byte ``cp.async.cg`` HBM -> SRAM with zero fill (see :func:`_cp_async_cg16_asm`).
cp_async_cg16_asm = _cp_async_cg16_asm()


def _cp_async_void_asm(text: str):
    """An intrinsic ``f()`` issuing the operand-free PTX ``text`` (a ``memory`` clobber, never reordered)."""
    fnty = ir.FunctionType(ir.VoidType(), [])

    @intrinsic
    def op(typingctx):
        def codegen(context, builder, signature, args):
            builder.call(ir.InlineAsm(fnty, text, "~{memory}", side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen

    op.__doc__ = f"``{text}``"
    return op


#: ``cp.async.commit_group``: this thread's cp.async issued since the last commit form one group.
cp_async_commit_asm = _cp_async_void_asm("cp.async.commit_group;")


@functools.cache
def cp_async_wait_group_asm(n: int):
    """The intrinsic ``f()``: ``cp.async.wait_group n``, wait until at most ``n`` of this thread's committed
    groups are still in flight (``n`` is an immediate of the instruction: one intrinsic per ``n``)."""
    if not (isinstance(n, int) and 0 <= n <= 7):
        raise ValueError(f"cp.async.wait_group takes an immediate 0..7, got {n!r}")
    return _cp_async_void_asm(f"cp.async.wait_group {n};")


@functools.cache
def make_cp_async(simulator: bool | None = None):
    """``(copy16, commit, wait0)``: asynchronous HBM -> SRAM copies (sm_80+) for the backend.

    * ``copy16(smem, i, garr, (i0, .., ik), src_size)``: issue the copy of the 4 words (16 bytes) at
      ``garr[i0, .., ik]`` .. ``garr[i0, .., ik + 3]`` to ``smem[i]`` .. ``smem[i + 3]`` (``smem`` a shared
      ``uint32`` array and ``garr`` an ``int32``/``uint32`` array in global memory, or both ``float32``: the
      copy moves bits); ``src_size`` in
      {0, 4, 8, 12, 16} bytes are read, the rest zero-filled (``0``: four zero words, ``garr`` not
      read). Both addresses 16-byte aligned on a GPU. :func:`_cp_async_cg16_asm`.
    * ``commit()``: ``cp.async.commit_group``; ``wait0()``: ``cp.async.wait_group 0`` (this thread's copies
      have all landed; a ``syncthreads`` after it makes every thread's copies visible to the block).

    The simulator's twins copy at once (plain Python, 4 words) and make commit and wait no-ops: the
    copy is already done when it is issued, so a missing *wait* cannot show there, but a missing
    barrier before a buffer is refilled still does (the copy overwrites the buffer at once).
    """
    sim = _backend.is_simulator() if simulator is None else simulator
    if not sim:
        wait0_asm = cp_async_wait_group_asm(0)

        @cuda.jit(device=True, inline="always")
        def copy16(smem, i, garr, gidx, src_size):
            cp_async_cg16_asm(smem, i, garr, gidx, src_size)

        @cuda.jit(device=True, inline="always")
        def commit():
            cp_async_commit_asm()

        @cuda.jit(device=True, inline="always")
        def wait0():
            wait0_asm()

        return copy16, commit, wait0

    def copy16(smem, i, garr, gidx, src_size):
        nw = int(src_size) // 4
        head = tuple(gidx[:-1])
        for w in range(4):  # a bit copy: words (int32 -> uint32) or float32 -> float32
            v = garr[head + (int(gidx[-1]) + w,)] if w < nw else 0
            smem[i + w] = v if smem.dtype == garr.dtype else uint32(v)

    def commit():
        pass

    def wait0():
        pass

    return cuda.jit(device=True)(copy16), cuda.jit(device=True)(commit), cuda.jit(device=True)(wait0)
