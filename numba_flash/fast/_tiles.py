"""HBM -> SRAM tile moves and causal block counts shared by the fast kernels.

Every fast kernel moves row tiles of two ``(b, s, h, d)`` arrays at once (``K_j, V_j`` in the
forwards, ``Q_i, dO_i`` and ``K_j, V_j`` in the backwards) the same way: all loads of a thread are
issued into registers first (one HBM round trip per tile, and the loads of the *next* tile can be in
flight while the current one is used: double buffering in registers, as Numba has no ``cp.async``),
then stored to SRAM after a barrier. And every kernel whose blocks own query rows counts the key
blocks those rows can see the same way. This module holds those pieces once, as device-function
factories cached on their compile-time constants (``inline="always"``, unsigned indices: see
:mod:`numba_flash.fast._regtile` for why that changes nothing in the machine code).

======================  ==========================================================  ====================
factory                 what                                                        used by
======================  ==========================================================  ====================
make_pair_loader        (NROWS, d) rows of two HBM arrays -> registers -> SRAM      all fast kernels
make_scaled_q_loader    Q_i times tau log2 e, HBM -> SRAM (zero rows past N_q)      FA2 forward, fast/tc
make_block_counts       key blocks visible from query rows < row_end (causal)       FA1/FA2 fast kernels
make_word_loader        (NROWS, DW) words (half pairs) -> registers -> SRAM         FA2 half forward
make_own_chunks         the 16-byte chunks of a tile one thread owns               the cp.async loads, passes
make_word_loader_async  (NROWS, DW) words, HBM -> SRAM by cp.async (no registers)  FA2 half and tc forward
make_quiet_nan_pass     a thread's cp.async chunks: NaN -> the quiet NaN, in SRAM   FA2 tc forward
                        (``SCALE``: times a scale first: ``Q_i`` by cp.async)
make_quiet_split        a value's tf32 parts, a NaN quieted first                  the split passes
make_split_pass         the same chunks split into tf32 big and small parts in SRAM FA2 tc forward
make_v_pair_split_pass  V_j's chunks split, the parts in B-fragment pairs          FA2 tc forward
make_row_pair_split_    Q_i's, dO_i's chunks split, the parts in A-fragment quads   FA2 tc backward
pass                    of row pairs (``QDO_PAIRS``)
swizzle16, swizzle16t   the SRAM column of a tile's column in unpadded rows         3xTF32 ``WIDE``
swizzle_pairs           ... in :func:`make_row_pair_split_pass`'s tiles             3xTF32 ``QDO_PAIRS``
make_key_block_order    (key block, head) of a block, heaviest first (causal)       FA2 half/tc backward
make_query_block_order  (query block, head) of a block, heaviest first (causal)     FA2 half/tc forward
======================  ==========================================================  ====================

A loader's ``SWIZZLE`` (None, or :func:`swizzle16`, :func:`swizzle16t` or :func:`swizzle_pairs`) stores column ``x`` of tile row ``r`` at
``SWIZZLE(x, r)``; None stores it at ``x``.

``tests/benchmarks/offline_resources.py`` checks that the kernels' machine code is what it was when
these loops were written out in each kernel.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint32

from ..device.constants import U
from ..tensorcore import ptx

#: The quiet NaN 0x7fc00000, which the 3xTF32 split keeps a NaN (see make_pair_loader's QUIET_NAN).
QNAN = float32(math.nan)


@cuda.jit(device=True, inline="always")
def swizzle16(col, row):
    """The SRAM column of column ``col`` of row ``row`` in a swizzled tile: ``col ^ 16`` in odd rows.

    The 16 floats ``32 k .. 32 k + 15`` and ``32 k + 16 .. 32 k + 31`` of an odd row trade places, so a 16-byte
    load of row ``g`` and one of row ``g + 1`` at the same column fall in different halves of the 32 banks even
    when the row stride is a multiple of 32 (no padding). 16-byte chunks (4-aligned columns) stay whole.
    Needs rows of a multiple of 32 floats."""
    return col ^ ((row & U(1)) << U(4))


@cuda.jit(device=True, inline="always")
def swizzle16t(col, row):
    """:func:`swizzle16`, and also the 8-float groups of rows ``2 r, 2 r + 1`` moved by ``r`` (XOR):
    ``col ^ 16 (row & 1) ^ 8 ((row >> 1) & 3)``.

    For unpadded tiles that are read along their rows by 16-byte loads (as :func:`swizzle16`'s) and also down their
    columns, lane ``(g, t)`` reading column ``8 n + g`` of row ``2 t`` (then ``2 t + 1``) of an 8-row group: the 3xTF32
    backward's B operands of ``dV``, ``dK`` and ``dQ`` (``Q_i, dO_i, K_j`` rows ``2 t, 2 t + 1``). That column sits
    at ``8 (n ^ t) + g`` (``^ 16`` in the odd row), so the 32 lanes hit 32 banks; with :func:`swizzle16` alone the
    four rows ``2 t`` would share a bank (4-way conflicts). The 16-byte loads of rows ``g``, ``g + 1`` still fall in
    different halves of the banks: bit 4 of the XOR differs between them. Needs rows of a multiple of 32 floats."""
    return col ^ (((row & U(1)) << U(4)) ^ ((row & U(6)) << U(2)))


@cuda.jit(device=True, inline="always")
def swizzle_pairs(col, row):
    """The SRAM column of column ``col`` of row ``row`` in :func:`make_row_pair_split_pass`'s tiles: the 16-byte chunks of
    a row moved by a permutation ``s`` of ``row % 8`` (XOR of the chunk index with bit 0 of the row as its bit 0, bit 2 as
    bit 1 and bit 1 as bit 2: ``s = 0, 1, 4, 5, 2, 3, 6, 7``).

    That pass leaves, in the chunk of row ``r`` (even) at columns ``c .. c + 3``, the A-fragment quad ``(X[r, c],
    X[r + 1, c], X[r, c + 1], X[r + 1, c + 1])``, and in row ``r + 1``'s the quad of ``c + 2, c + 3``. Its two readers:
    lane ``(g, t)`` loading the quad of rows ``2 g, 2 g + 1`` at column ``16 k + 4 t`` (16 bytes; a quarter warp is
    ``g = 2 j, 2 j + 1``: ``s(4 j) ^ s(4 j + 2)`` and ``s(4 j + 1) ^ s(4 j + 3)`` are 4, so its 8 chunks are 8 groups of 4
    banks), and the B-fragment pair ``(X[2 t, c], X[2 t + 1, c])`` of column ``c = 8 n + g`` (8 bytes; a half warp reads
    rows ``2 t, 2 t + 1`` of every ``t`` at one chunk column: ``s`` a permutation puts them in 8 groups). Both conflict
    free. Needs rows of a multiple of 32 floats."""
    return col ^ (((row & U(1)) << U(2)) | ((row & U(4)) << U(1)) | ((row & U(2)) << U(3)))


@functools.cache
def make_pair_loader(NROWS: int, DP: int, NT: int, SA: int, SB: int | None = None, STEP_ROWS: bool | None = None,
                     QUIET_NAN: bool = False, SWIZZLE=None):
    """``(NL, load, store)``: move rows ``row0 .. row0 + NROWS - 1`` of two arrays, HBM -> registers -> SRAM.

    ``load(gA, gB, ub, uh, row0, n_rows, d, tid, rA, rB)`` issues the loads of the ``NROWS x DP``
    elements of ``gA[b, row0 + r, h, x]`` and ``gB[...]`` (zero for rows ``>= n_rows`` and columns
    ``x >= d``) into the ``NL``-float register arrays ``rA``, ``rB`` of thread ``tid`` (``NT``
    threads, element ``e = tid + NT it`` is row ``e // DP``, column ``e % DP``: consecutive threads
    on consecutive columns, coalesced). ``store(smem, off_a, off_b, tid, rA, rB)`` writes them to the
    SRAM tiles at ``off_a`` (row stride ``SA`` floats) and ``off_b`` (row stride ``SB``, default ``SA``).

    ``STEP_ROWS`` (default: when ``NT`` is a multiple of ``DP``): each thread keeps one column
    ``x = tid % DP`` and steps ``NT / DP`` rows per load, so the column test and the index division
    are done once instead of per load (the FA2 fast kernels). The FA1 forward and the tensor-core
    kernel pass ``False``: they keep the per-element index form they were measured with.

    ``QUIET_NAN`` (the tensor-core kernel): a NaN is stored as the quiet NaN ``0x7fc00000``. The
    3xTF32 split (:data:`numba_flash.tensorcore.ptx.split_tf32_asm`) adds half a tf32 ulp to the bits, which
    carries the GPU's canonical NaN ``0x7fffffff`` into the sign bit (``-0.0``): without this a NaN in
    K or V vanished from the products. One select per stored element (at the store: a select at the load made the prefetched loads
    wait, 1.5-1.7x slower on an H100); the split stays five instructions.

    ``SWIZZLE`` (the module docstring): both tiles' columns swizzled (the 3xTF32 backward's ``WIDE``).
    """
    NL = (NROWS * DP + NT - 1) // NT  # elements of each array per thread
    EXACT = NROWS * DP % NT == 0
    STEP = NT % DP == 0 if STEP_ROWS is None else bool(STEP_ROWS)
    RSTEP = NT // DP  # rows per load step (STEP)
    SB = SA if SB is None else SB
    uNT, uDP, uSA, uSB, uTOT = U(NT), U(DP), U(SA), U(SB), U(NROWS * DP)
    SAME_STRIDE = SA == SB
    SW = SWIZZLE is not None
    swz = SWIZZLE if SW else swizzle16  # Dev: typed but never called when SW is False
    # Dev: a swizzle reads bits 0-2 of the row; with STEP the rows of a thread repeat them every PER loads, so its
    # stores take PER swizzled columns (registers) and immediates, not one register per load (held across the kernel)
    PER = 8 // math.gcd(RSTEP, 8) if STEP and RSTEP else 1

    @cuda.jit(device=True, inline="always")
    def load(gA, gB, ub, uh, row0, n_rows, d, tid, rA, rB):
        """Issue the loads of rows row0..row0+NROWS of gA, gB (all d columns) into registers; zero outside."""
        x = tid % uDP
        r0 = tid // uDP
        for it in range(NL):
            e = tid + uNT * U(it)
            r = r0 + U(RSTEP * it) if STEP else e // uDP
            xc = x if STEP else e % uDP
            va = float32(0.0)
            vb = float32(0.0)
            if (EXACT or e < uTOT) and xc < U(d) and U(row0) + r < U(n_rows):
                va = gA[ub, U(row0) + r, uh, xc]
                vb = gB[ub, U(row0) + r, uh, xc]
            rA[it] = va
            rB[it] = vb

    @cuda.jit(device=True, inline="always")
    def store(smem, off_a, off_b, tid, rA, rB):
        """Store the registers of :func:`load` to the SRAM tiles at off_a (row stride SA), off_b (SB)."""
        for it in range(NL):
            e = tid + uNT * U(it)
            if EXACT or e < uTOT:
                va = rA[it]
                vb = rB[it]
                if QUIET_NAN:  # at the store, not the load: the loads stay in flight during the compute
                    va = va if va == va else QNAN
                    vb = vb if vb == vb else QNAN
                if SW:  # Dev: the same swizzled column in both tiles
                    if STEP:
                        r = tid // uDP + U(RSTEP * it)
                        x = swz(tid % uDP, tid // uDP + U(RSTEP * (it % PER)))
                    else:
                        r = e // uDP
                        x = swz(e % uDP, r)
                    smem[off_a + r * uSA + x] = va
                    smem[off_b + r * uSB + x] = vb
                elif SAME_STRIDE:
                    a = (e // uDP) * uSA + e % uDP
                    smem[off_a + a] = va
                    smem[off_b + a] = vb
                else:
                    smem[off_a + (e // uDP) * uSA + e % uDP] = va
                    smem[off_b + (e // uDP) * uSB + e % uDP] = vb

    return NL, load, store


@functools.cache
def make_scaled_q_loader(BR: int, DP: int, NT: int, SQ: int, QUIET_NAN: bool = False, SWIZZLE=None, BATCH: int = 1):
    """``load_q(gQ, smem, qbase, ub, uh, row0, s_q, d, tid, scale)``: ``Q_i`` times ``scale`` to SRAM.

    Rows ``row0 .. row0 + BR - 1`` of ``gQ[b, :, h, :]`` times ``scale`` (``tau log2 e``: the forward
    then uses ``exp2``) to the SRAM tile at ``qbase`` (row stride ``SQ``); rows past ``s_q`` and
    columns past ``d`` are zero. ``QUIET_NAN``: a NaN is stored as ``0x7fc00000`` (see :func:`make_pair_loader`).
    ``SWIZZLE``: the module docstring (the 3xTF32 forward's ``WIDE``: :func:`swizzle16`).

    ``BATCH``: how many of a thread's loads are in flight at once. With 1 each load's value is scaled and stored
    before the next load: the sm_90 SASS issues them one at a time (``LD.E``, ``FMUL``, ``STS``, ``LD.E``, ...; the
    loads are generic, and the compiler does not move them above a store to shared memory), so a block starts with one HBM
    round trip per element of its share (64 at the FFMA forward's d = 64 default). With ``BATCH`` > 1 each pass loads
    ``BATCH`` elements into registers, then scales and stores them: the same float32 products, the same bits. No kernel
    passes ``BATCH`` > 1 (eight in flight did not pay in the FFMA forward; the performance log). The pass structure
    stays because its ``BATCH`` = 1 form compiles differently from a plain load-scale-store loop: offline sm_90, the FFMA
    forward's d = 64 build spills 136/112 B with it and 148/124 B with the plain loop.
    """
    NLQ = (BR * DP + NT - 1) // NT  # elements per thread
    EXACT = BR * DP % NT == 0
    NPASS = (NLQ + BATCH - 1) // BATCH
    uNT, uDP, uSQ, uTOT = U(NT), U(DP), U(SQ), U(BR * DP)
    SW = SWIZZLE is not None
    swz = SWIZZLE if SW else swizzle16

    @cuda.jit(device=True, inline="always")
    def load_q(gQ, smem, qbase, ub, uh, row0, s_q, d, tid, scale):
        buf = cuda.local.array(BATCH, float32)
        for ps in range(NPASS):
            for u in range(BATCH):  # Dev: the pass's loads first, all in flight
                e = tid + uNT * U(ps * BATCH + u)
                r = int(e // uDP)
                x = int(e % uDP)
                buf[u] = float32(0.0)
                if ps * BATCH + u < NLQ and (EXACT or e < uTOT) and row0 + r < s_q and x < d:
                    buf[u] = gQ[ub, U(row0 + r), uh, U(x)]  # HBM read: Br*d
            for u in range(BATCH):  # Dev: then their products and stores
                e = tid + uNT * U(ps * BATCH + u)
                r = int(e // uDP)
                x = int(e % uDP)
                val = float32(0.0)
                if ps * BATCH + u < NLQ and (EXACT or e < uTOT) and row0 + r < s_q and x < d:
                    val = float32(buf[u] * scale)
                    if QUIET_NAN:
                        val = val if val == val else QNAN
                if ps * BATCH + u < NLQ and (EXACT or e < uTOT):
                    smem[qbase + U(r) * uSQ + (swz(U(x), U(r)) if SW else U(x))] = val

    return load_q


@functools.cache
def make_block_counts(BR: int, BC: int, CAUSAL: bool):
    """``(n_key_blocks, first_row_block)``: the causal block skipping of the fast kernels.

    ``n_key_blocks(row_end, s_k, causal_offset)``: how many key blocks of ``BC`` columns the query
    rows ``< row_end`` see: all ``ceil(s_k / BC)``, or (``CAUSAL``) those up to the last row's horizon
    ``row_end - 1 + causal_offset`` (0 when no row sees a key). ``first_row_block(col0, causal_offset)``:
    the first block of ``BR`` query rows whose last row sees key ``col0`` (0 when not ``CAUSAL``);
    the blocks before it are fully masked.
    """

    @cuda.jit(device=True, inline="always")
    def n_key_blocks(row_end, s_k, causal_offset):
        if CAUSAL:
            return (min(s_k, max(0, row_end + causal_offset)) + BC - 1) // BC
        return (s_k + BC - 1) // BC

    @cuda.jit(device=True, inline="always")
    def first_row_block(col0, causal_offset):
        if CAUSAL:
            return max(0, col0 - causal_offset) // BR
        return 0

    return n_key_blocks, first_row_block


@functools.cache
def make_warp_horizon(ROWS: int):
    """``warp_sees_no_key(row_first, col0, causal_offset)``: whether every score of a warp's ``ROWS`` query rows
    (``row_first .. row_first + ROWS - 1``) in the key block that starts at column ``col0`` is masked by causality:
    the block's first key is past the last row's horizon ``row_first + ROWS - 1 + causal_offset``. The key blocks a
    thread block visits end at its last row's horizon (:func:`make_block_counts`), so on the diagonal the warps of its
    earlier rows meet key blocks that only its later rows see."""

    @cuda.jit(device=True, inline="always")
    def warp_sees_no_key(row_first, col0, causal_offset):
        return col0 > row_first + ROWS - 1 + causal_offset

    return warp_sees_no_key


@functools.cache
def make_key_block_order(HEAVY_FIRST: bool):
    """``key_block(n_bh) -> (j, bh)``: the key block and the (batch, KV head) of a column-block backward's thread block.

    Without ``HEAVY_FIRST``: ``j = blockIdx.x`` and ``bh`` from grid y, z (:func:`numba_flash._launch.bh_grid`). A GPU
    starts blocks in the order of their linear number (x fastest, then y, z), so every head's key blocks start one
    after another. With ``HEAVY_FIRST`` (causal) the linear number is split the other way, ``j`` major: every head's
    ``j = 0`` first, then every head's ``j = 1`` ... Under a causal mask key block ``j`` sees the fewest query
    blocks the larger it is, so the blocks with the most work start first and the lightest fill the tail (longest
    processing time first). ``j`` comes back at or past ``gridDim.x`` for the padding of the folded grid: return then.
    """

    @cuda.jit(device=True, inline="always")
    def key_block(n_bh):
        if HEAVY_FIRST:
            lin = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
            return lin // n_bh, lin % n_bh
        return cuda.blockIdx.x, cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z

    return key_block


@functools.cache
def make_query_block_order(HEAVY_FIRST: bool):
    """``query_block(n_bh) -> (i, bh)``: the query block and the (batch, head) of a row-block forward's thread block.

    The forwards' blocks own query blocks ``i``; under a causal mask block ``i`` visits the more key blocks the larger
    it is, so the heaviest is the last. Without ``HEAVY_FIRST``: ``i = gridDim.x - 1 - blockIdx.x`` (each head's
    query blocks start heaviest first, one head after another) and ``bh`` from grid y, z. With it (causal) the linear
    number is split ``i``-major as in :func:`make_key_block_order`: every head's last query block first, then every
    head's one before it ... (longest processing time first across heads: the last blocks to start are the lightest
    of all, not the heads' heaviest ones that start late). ``i`` comes back negative for the padding of the folded
    grid: return then.
    """
    block = make_key_block_order(HEAVY_FIRST)

    @cuda.jit(device=True, inline="always")
    def query_block(n_bh):
        x, bh = block(n_bh)
        return cuda.gridDim.x - 1 - x, bh

    return query_block


_W0 = uint32(0)


@functools.cache
def make_word_loader(NROWS: int, DW: int, NT: int, SA: int):
    """``(NL, load, store)``: rows ``row0 .. row0 + NROWS - 1`` of a half array in words, HBM -> registers -> SRAM.

    A *word* is a ``uint32`` holding two adjacent half elements of a row (the kernels see the caller's
    fp16/bf16 tensor as an ``int32`` array of ``(b, s, h, d / 2)``). ``load(gA, ub, uh, row0, n_rows, dw,
    tid, rA)`` issues the loads of the ``NROWS x DW`` words ``gA[b, row0 + r, h, c]`` (zero for rows
    ``>= n_rows`` and words ``c >= dw``) into the ``NL``-word register array ``rA`` (element ``e = tid +
    NT it`` is row ``e // DW``, word ``e % DW``: consecutive threads on consecutive words, coalesced);
    ``store(smem, off, tid, rA)`` writes them to the SRAM tile at ``off`` (row stride ``SA`` words).
    """
    NL = (NROWS * DW + NT - 1) // NT
    EXACT = NROWS * DW % NT == 0
    uNT, uDW, uSA, uTOT = U(NT), U(DW), U(SA), U(NROWS * DW)

    @cuda.jit(device=True, inline="always")
    def load(gA, ub, uh, row0, n_rows, dw, tid, rA):
        for it in range(NL):
            e = tid + uNT * U(it)
            r = e // uDW
            c = e % uDW
            w = _W0
            if (EXACT or e < uTOT) and c < U(dw) and U(row0) + r < U(n_rows):
                w = uint32(gA[ub, U(row0) + r, uh, c])
            rA[it] = w

    @cuda.jit(device=True, inline="always")
    def store(smem, off, tid, rA):
        for it in range(NL):
            e = tid + uNT * U(it)
            if EXACT or e < uTOT:
                smem[off + (e // uDW) * uSA + e % uDW] = rA[it]

    return NL, load, store



@functools.cache
def make_own_chunks(NROWS: int, DW: int, NT: int, SA: int, SWIZZLE=None, ROW_PAIRS: bool = False, PAIR_ROWS: int = 4):
    """``(NC, own_chunk, chunk_at, chunk_rc, word_at)``: the 16-byte chunks (4 words) of an ``NROWS x DW`` SRAM tile (row
    stride ``SA``) that thread ``tid`` of ``NT`` owns, the ``cp.async`` copies of :func:`make_word_loader_async` and the
    passes that follow them over the same chunks (:func:`make_quiet_nan_pass`, :func:`make_split_pass`,
    :func:`make_v_pair_split_pass`).

    ``own_chunk(tid, it) -> (mine, e)`` for ``it < NC``: the thread's chunk ``e = tid + NT it``, ``mine`` False past the
    tile's last chunk (a thread's last ``it`` where the chunks are not a multiple of ``NT``). ``chunk_rc(e) -> (r, c)``:
    its row ``r = e // (DW / 4)`` and first word ``c = 4 (e % (DW / 4))`` (consecutive threads on consecutive 16 bytes
    of a row); ``word_at(off, r, c)``: its SRAM word ``off + r SA + c`` (``SWIZZLE(c, r)`` in place of ``c`` where
    given); ``chunk_at(off, e) -> (r, c, at)``: both. The callers take them in the order their loops had when each
    wrote them out (``e`` and the test first, the address last in the loader), which keeps their sm_90 machine code
    (``bench/offline_resources.py``: every hash as before; one helper returning all at once changed eight).

    ``ROW_PAIRS`` (``NROWS`` a multiple of ``2 PAIR_ROWS``): a thread's chunks come in pairs, ``it = 2 i`` in row ``r``
    with ``r % (2 PAIR_ROWS) < PAIR_ROWS`` and ``it = 2 i + 1`` the same columns of row ``r + PAIR_ROWS``, so that one
    thread holds both rows of each of :func:`make_v_pair_split_pass`'s B-fragment pairs (``PAIR_ROWS`` 4) or of
    :func:`make_row_pair_split_pass`'s row pairs (1); consecutive threads still copy consecutive 16 bytes of a row.
    ``NC`` is then even.
    """
    CW = DW // 4  # 16-byte chunks of a padded row
    if ROW_PAIRS and NROWS % (2 * PAIR_ROWS):
        raise ValueError(f"row pairs (r, r + {PAIR_ROWS}) need a multiple of {2 * PAIR_ROWS} rows, got {NROWS}")
    NU = NROWS * CW // (2 if ROW_PAIRS else 1)  # units a thread takes one at a time: chunks, or pairs of them
    NC = (NU + NT - 1) // NT * (2 if ROW_PAIRS else 1)
    EXACT = NU % NT == 0
    uNT, uCW, uSA, uTOT, u4 = U(NT), U(CW), U(SA), U(NU), U(4)
    uP, u2P = U(PAIR_ROWS), U(2 * PAIR_ROWS)
    SW = SWIZZLE is not None
    swz = SWIZZLE if SW else swizzle16

    @cuda.jit(device=True, inline="always")
    def own_chunk(tid, it):
        if ROW_PAIRS:  # Dev: unit E = pair of rows (r, r + P) at one column: chunk (r + P (it % 2)) CW + E % CW
            E = tid + uNT * U(it // 2)
            u = E // uCW
            return EXACT or E < uTOT, (u2P * (u // uP) + u % uP + uP * U(it % 2)) * uCW + E % uCW
        e = tid + uNT * U(it)
        return EXACT or e < uTOT, e

    @cuda.jit(device=True, inline="always")
    def chunk_rc(e):
        return e // uCW, u4 * (e % uCW)

    @cuda.jit(device=True, inline="always")
    def word_at(off, r, c):
        return off + r * uSA + (swz(c, r) if SW else c)

    @cuda.jit(device=True, inline="always")
    def chunk_at(off, e):
        r, c = chunk_rc(e)
        return r, c, word_at(off, r, c)

    return NC, own_chunk, chunk_at, chunk_rc, word_at


@functools.cache
def make_word_loader_async(NROWS: int, DW: int, NT: int, SA: int, SIM: bool, SWIZZLE=None, ROW_PAIRS: bool = False,
                           PAIR_ROWS: int = 4):
    """``(NC, load_async)``: rows ``row0 .. row0 + NROWS - 1`` of a half array in words, HBM -> SRAM by ``cp.async``.

    "Words" are any 4-byte elements: a float32 array (and a float32 SRAM tile) works the same, with ``DW``
    and ``dw`` then counted in floats (the 3xTF32 forward's K_j, V_j).

    The tile of :func:`make_word_loader` without the registers: ``load_async(smem, off, gA, ub, uh, row0,
    n_rows, dw, tid)`` *issues* 16-byte copies (4 words; :func:`numba_flash.tensorcore.ptx.make_cp_async`, the
    simulator's twin when ``SIM``) of ``gA[b, row0 + r, h, 4c .. 4c + 3]`` to the SRAM tile at ``off`` (row
    stride ``SA`` words), zero-filled for rows ``>= n_rows`` and chunks ``4c >= dw``. Chunk ``e = tid + NT it``
    (``NC`` per thread) is row ``e // (DW / 4)``, chunk ``e % (DW / 4)``: consecutive threads on consecutive
    16 bytes of a row, coalesced. The caller commits the group, waits for it and puts a barrier before
    the tile is read.

    Needs ``DW`` and ``dw`` multiples of 4 (a chunk is all inside d or all past it: d a multiple of 8),
    16-byte aligned rows in HBM (``gA``'s base and row strides) and ``SA``, ``off`` multiples of 4 words.
    A chunk outside the array reads nothing; its address is clamped to row 0, word 0 all the same, so no
    out-of-range address is ever formed. ``SWIZZLE`` (the module docstring): chunks land at swizzled columns (a
    swizzle moves 4-aligned groups of 4 columns whole). ``ROW_PAIRS``: the chunks in pairs of rows ``r, r + PAIR_ROWS``
    (:func:`make_own_chunks`), for :func:`make_v_pair_split_pass` (4) or :func:`make_row_pair_split_pass`
    (1).
    """
    NC, own_chunk, _, chunk_rc, word_at = make_own_chunks(NROWS, DW, NT, SA, SWIZZLE, ROW_PAIRS, PAIR_ROWS)
    u0, u16 = U(0), uint32(16)
    z = uint32(0)
    copy16, _commit, _wait0 = ptx.make_cp_async(SIM)

    @cuda.jit(device=True, inline="always")
    def load_async(smem, off, gA, ub, uh, row0, n_rows, dw, tid):
        for it in range(NC):
            mine, e = own_chunk(tid, it)
            if mine:
                r, c = chunk_rc(e)
                row = U(row0) + r
                inside = c < U(dw) and row < U(n_rows)
                copy16(smem, word_at(off, r, c), gA, (ub, row if inside else u0, uh, c if inside else u0), u16 if inside else z)

    return NC, load_async


@functools.cache
def make_quiet_nan_pass(NROWS: int, DW: int, NT: int, SA: int, SWIZZLE=None, SCALE: bool = False):
    """``quiet(smem, off, tid)``: in the float32 SRAM tile at ``off`` (row stride ``SA``), each NaN among the
    chunks that thread ``tid`` copied with :func:`make_word_loader_async` (same ``NROWS, DW, NT``) becomes the
    quiet NaN ``0x7fc00000``.

    What :func:`make_pair_loader`'s ``QUIET_NAN`` does at its register store, for tiles that arrive by
    ``cp.async`` and never pass through registers: run it after ``cp.async.wait_group`` (a thread's own
    copies have landed) and before the barrier that publishes the tile. Zero-filled chunks hold no NaN.
    One SRAM read per element, and a write only for a NaN. ``SWIZZLE``: as the loader's.

    ``SCALE``: ``quiet(smem, off, tid, scale)`` first multiplies each element by the float32 ``scale`` (one
    rounding, as :func:`make_scaled_q_loader` does in registers) and writes every element back: the 3xTF32
    forward's ``Q_i`` (times ``tau log2 e``) when it arrives by ``cp.async`` (``Q_ASYNC``). Zero-filled chunks
    stay zero for a positive ``scale``.
    """
    NC, own_chunk, chunk_at, _, _ = make_own_chunks(NROWS, DW, NT, SA, SWIZZLE)

    @cuda.jit(device=True, inline="always")
    def each_own_element(smem, off, tid, scale):
        for it in range(NC):
            mine, e = own_chunk(tid, it)
            if mine:
                _, _, base = chunk_at(off, e)
                for w in range(4):
                    v = smem[base + U(w)]
                    if SCALE:
                        v = float32(v * scale)
                        smem[base + U(w)] = v if v == v else QNAN
                    elif v != v:
                        smem[base + U(w)] = QNAN

    if SCALE:
        return each_own_element

    @cuda.jit(device=True, inline="always")
    def quiet(smem, off, tid):
        each_own_element(smem, off, tid, float32(1.0))

    return quiet



@functools.cache
def make_quiet_split(SIM: bool):
    """``split(x) -> (big, small)``: :func:`numba_flash.tensorcore.ptx.make_warp_ops`' ``split_tf32`` (the simulator's twin when
    ``SIM``) of ``x``, a NaN first made the quiet NaN (as :func:`make_quiet_nan_pass` stores it): the parts a warp
    would split from the value that pass leaves in SRAM."""
    split_tf32 = ptx.make_warp_ops(SIM)[0]

    @cuda.jit(device=True, inline="always")
    def split(x):
        return split_tf32(x if x == x else QNAN)

    return split


def _scale_argument(each_split, SCALE: bool):
    """A split pass ``each_split(smem, words, off, small, tid, scale)`` as its factory returns it: itself with ``SCALE``,
    else ``split_pass(smem, words, off, small, tid)``, which splits the values as they are (``scale`` 1, unused)."""
    if SCALE:
        return each_split

    @cuda.jit(device=True, inline="always")
    def split_pass(smem, words, off, small, tid):
        each_split(smem, words, off, small, tid, float32(1.0))

    return split_pass


@functools.cache
def make_split_pass(NROWS: int, DW: int, NT: int, SA: int, SIM: bool, SWIZZLE=None, SCALE: bool = False):
    """``split_pass(smem, words, off, small, tid)``: the chunks of :func:`make_quiet_nan_pass` (same ``NROWS, DW, NT,
    SA, SWIZZLE``) split once for every warp that reads them: each element ``x`` (a NaN first made the quiet NaN, as
    that pass does) becomes the tf32 bit pattern of its big part in place and the small part's at ``small`` words
    further on (:func:`numba_flash.tensorcore.ptx.make_warp_ops`' ``split_tf32``, the simulator's twin when ``SIM``).

    ``smem`` and ``words`` are the float32 and uint32 views of one dynamic SRAM array. What a warp's fragment loads
    then read are the two parts the warp would have computed from ``x`` itself, bit for bit: the same function of the
    same value. The 3xTF32 forward's ``SPLIT_KV`` runs it over ``K_j, V_j`` after ``cp.async.wait_group`` and before
    the barrier that publishes them, in place of the NaN pass. Zero-filled chunks split into two zeros.

    ``SCALE``: ``split_pass(smem, words, off, small, tid, scale)`` splits ``float32(x * scale)`` (one rounding, as
    :func:`make_quiet_nan_pass`'s ``SCALE``): the 3xTF32 backward's ``Q_i`` times ``tau log2 e`` (``SPLIT_QDO``), the
    A operand its forward split from the scaled ``Q_i``.
    """
    NC, own_chunk, chunk_at, _, _ = make_own_chunks(NROWS, DW, NT, SA, SWIZZLE)
    split = make_quiet_split(SIM)

    @cuda.jit(device=True, inline="always")
    def each_split(smem, words, off, small, tid, scale):
        rB = cuda.local.array(4, uint32)
        rS = cuda.local.array(4, uint32)
        for it in range(NC):
            mine, e = own_chunk(tid, it)
            if mine:
                _, _, base = chunk_at(off, e)
                for w in range(4):
                    rB[w], rS[w] = split(float32(smem[base + U(w)] * scale) if SCALE else smem[base + U(w)])
                # Dev: each part's four words stored together, after all four splits: one 16-byte store each (a store
                # between the splits' asm stays a 4-byte store, and the warp's 16-byte-strided 4-byte stores are 4-way
                # bank conflicts: Nsight Compute on SPLIT_KV, the performance log)
                for w in range(4):
                    words[base + U(w)] = rB[w]
                for w in range(4):
                    words[base + small + U(w)] = rS[w]

    return _scale_argument(each_split, SCALE)


@functools.cache
def make_row_pair_split_pass(NROWS: int, DW: int, NT: int, SA: int, SIM: bool, SCALE: bool = False):
    """``split_pass(smem, words, off, small, tid)`` (``SCALE``: ``..., tid, scale)``): :func:`make_split_pass` over a tile
    that :func:`make_word_loader_async` copied in row pairs ``r, r + 1`` (``ROW_PAIRS``, ``PAIR_ROWS = 1``, swizzled by
    :func:`swizzle_pairs`), its parts stored as the ``mma``'s A-fragment quads of row pairs: the chunk of row ``r`` (even)
    at columns ``c .. c + 3`` gets ``(X[r, c], X[r + 1, c], X[r, c + 1], X[r + 1, c + 1])`` and the chunk of row ``r + 1``
    the quad of columns ``c + 2, c + 3`` (big parts in place, small ones ``small`` words further on).

    The 3xTF32 backward's ``QDO_PAIRS``: its ``S`` and ``dP`` take query rows ``2 g, 2 g + 1`` as the fragment rows
    ``g, g + 8``, so a quad is one 16-byte load in the registers the ``mma`` reads (the row-major parts of
    :func:`make_split_pass` are loaded 16 bytes a row, and the compiler then moves every word into the fragment's rows
    ``g, g + 8`` order: the performance log's ``SPLIT_QDO``); its ``dV``, ``dK`` products take ``(X[2 t, c], X[2 t + 1,
    c])``, two adjacent words. Each thread rewrites only the two chunks it copied, after reading both.
    """
    NC, own_chunk, chunk_at, _, _ = make_own_chunks(NROWS, DW, NT, SA, swizzle_pairs, True, 1)
    split = make_quiet_split(SIM)

    @cuda.jit(device=True, inline="always")
    def each_split(smem, words, off, small, tid, scale):
        rB = cuda.local.array(8, uint32)  # the two quads of one part: rows r, r + 1 interleaved, columns c .. c + 3
        rS = cuda.local.array(8, uint32)
        for ip in range(NC // 2):
            mine, e = own_chunk(tid, 2 * ip)
            if mine:
                _, _, src0 = chunk_at(off, e)  # row r (even), columns c .. c + 3; next row r + 1, the same columns
                _, _, src1 = chunk_at(off, own_chunk(tid, 2 * ip + 1)[1])
                for w in range(4):  # column c + w: row r to word 2 w, row r + 1 to word 2 w + 1 of the two quads
                    x0, x1 = smem[src0 + U(w)], smem[src1 + U(w)]
                    rB[2 * w], rS[2 * w] = split(float32(x0 * scale) if SCALE else x0)
                    rB[2 * w + 1], rS[2 * w + 1] = split(float32(x1 * scale) if SCALE else x1)
                for x in range(4):  # Dev: after all the splits: each quad of each part one 16-byte store
                    words[src0 + U(x)] = rB[x]
                for x in range(4):
                    words[src0 + small + U(x)] = rS[x]
                for x in range(4):
                    words[src1 + U(x)] = rB[4 + x]
                for x in range(4):
                    words[src1 + small + U(x)] = rS[4 + x]

    return _scale_argument(each_split, SCALE)


def v_pair_stride(DP: int) -> int:
    """Words of one row ``(key step kt, t)`` of :func:`make_v_pair_split_pass`'s layout: ``2 DP`` and 8 of padding, so
    that the 16-byte loads of lanes ``(g, t)``, ``g < 2``, fall in 8 different groups of 4 banks (``8 t + 4 g``)."""
    return 2 * DP + 8


@functools.cache
def make_v_pair_split_pass(NROWS: int, DP: int, NT: int, SA: int, SIM: bool):
    """``split_v(smem, words, off, out, small, tid)``: this thread's chunks of the ``V_j`` tile at ``off`` (as
    :func:`make_word_loader_async` copied them with ``ROW_PAIRS``, row stride ``SA``) split as :func:`make_split_pass`
    does, the big parts
    to ``out`` and the small ones ``small`` words further, in the order of the 3xTF32 forward's ``WIDE`` B fragments.

    An ``mma.m16n8k8`` B fragment is a register pair ``(V[t, c], V[t + 4, c])`` (key step ``kt``: keys ``8 kt + t`` and
    ``8 kt + t + 4``): two rows of the tile, so a 16-byte load of a row gives a lane four values that each go to a
    different pair, and the compiler moves every one (offline sm_90: 145 ``MOV`` in one step of line 10). Here the
    pairs are adjacent: value ``V[8 kt + t + 4 p, 32 a + 4 g + 2 h + e]`` (``p, h, e < 2``) is word
    ``(4 kt + t) RS + 64 a + 32 h + 4 g + 2 e + p`` (``RS`` = :func:`v_pair_stride`), so lane ``(g, t)`` gets the pairs
    of columns ``32 a + 4 g .. + 3`` (O's renamed columns of tiles ``4 a .. 4 a + 3``, ``WIDE``) in two 16-byte loads
    per part, in the registers the ``mma`` reads. The tile as copied is read only by the thread that copied it, so it
    needs one stage; the pairs need two (warps still read block j's while block j+1's are written).

    The thread holds both rows of each pair (``ROW_PAIRS``: rows ``r, r + 4``), so each part of a chunk pair is two
    16-byte stores (words ``32 h .. 32 h + 3``). The pass's first form took a chunk at a time, and each value was a 4-byte
    store: a warp's, at 16-byte strides in a row, were 4-way bank conflicts (Nsight Compute, the performance log's
    ``SPLIT_KV`` profile).
    """
    NC, own_chunk, chunk_at, _, _ = make_own_chunks(NROWS, DP, NT, SA, None, True)
    RS = v_pair_stride(DP)
    u4, u8 = U(4), U(8)
    split = make_quiet_split(SIM)

    @cuda.jit(device=True, inline="always")
    def pair_dst(out, r, c):
        """The word of ``V[r, c]`` (``c`` a multiple of 4: ``h = e = 0``) in its pair: ``+ p``, ``p = r % 8 // 4``."""
        return out + (u4 * (r // u8) + r % u4) * U(RS) + U(64) * (c // U(32)) + u4 * (c % U(32) // u4) + (r % u8) // u4

    @cuda.jit(device=True, inline="always")
    def split_v_pairs(smem, words, off, out, small, tid):
        rB = cuda.local.array(8, uint32)  # the pair words of one part: (V[r, c], V[r + 4, c], V[r, c + 1], ...)
        rS = cuda.local.array(8, uint32)
        for ip in range(NC // 2):
            mine, e = own_chunk(tid, 2 * ip)
            if mine:
                r, c, src = chunk_at(off, e)  # row r (r % 8 < 4) and, next, row r + 4 at the same columns
                _, _, src4 = chunk_at(off, own_chunk(tid, 2 * ip + 1)[1])
                for w in range(4):  # word 4 h + 2 e + p of the part: column c + 2 h + e of row r + 4 p
                    rB[(w // 2) * 4 + (w % 2) * 2], rS[(w // 2) * 4 + (w % 2) * 2] = split(smem[src + U(w)])
                    rB[(w // 2) * 4 + (w % 2) * 2 + 1], rS[(w // 2) * 4 + (w % 2) * 2 + 1] = split(smem[src4 + U(w)])
                dst = pair_dst(out, r, c)
                for h in range(2):  # Dev: after all the splits, so that each group of 4 words is one 16-byte store
                    for x in range(4):
                        words[dst + U(32 * h + x)] = rB[4 * h + x]
                    for x in range(4):
                        words[dst + small + U(32 * h + x)] = rS[4 * h + x]

    return split_v_pairs
