"""Device helpers of the readable kernels: the plumbing steps they share, written once.

Only plumbing lives here: a tile copied from HBM into SRAM with its ragged rows zero-filled, and a
register accumulator set to zero before a tile product. The paper's arithmetic (``S_ij = Q_i K_j^T``,
the online softmax, ``dS_ij = P_ij o (dP_ij - D_i)`` ...) stays written out in each kernel, and each
kernel tags the call with the paper line it performs, with the paper's names as arguments::

    # FA2.1 L7: load K_j, V_j from HBM to SRAM (all threads together; ragged rows zero)
    load_tile(sK_j, gK, b, col0, hk, s_k, D, t, BR)  # HBM read: Bc*d

Used by :mod:`numba_flash.alg1_forward`, :mod:`numba_flash.alg4_backward`,
:mod:`numba_flash.fa2_forward` and :mod:`numba_flash.fa2_backward`. A readable-wing module: it imports
nothing from :mod:`numba_flash.fast` or :mod:`numba_flash.tensorcore`.
"""

from __future__ import annotations

from numba import cuda, float32


# [doc:load-tile]
@cuda.jit(device=True, inline="always")
def load_tile(s_tile, g, b, row0, head, n_rows, d, t, nthreads):
    """Copy rows ``row0 .. row0 + R - 1`` of ``g[b, :, head, :]`` (head dim ``d``) into the SRAM tile ``s_tile``.

    ``d`` is the kernel's compile-time head dim ``D``: inlined, the index arithmetic divides by a constant (a
    multiply and a shift), not by a run-time shape.

    The ``nthreads`` threads of the block share the ``R * d`` elements: thread ``t`` copies elements
    ``t, t + nthreads, ...`` in row-major order, so consecutive threads read consecutive addresses of a
    row (coalesced). Rows at or past ``n_rows`` (the ragged last block) are filled with zeros: the
    kernel masks them or never stores them. Padding columns of ``s_tile`` past ``d`` are not written.
    """
    for e in range(t, s_tile.shape[0] * d, nthreads):
        r = e // d
        x = e % d
        s_tile[r, x] = g[b, row0 + r, head, x] if row0 + r < n_rows else float32(0.0)  # HBM read: R*d
# [/doc:load-tile]


@cuda.jit(device=True, inline="always")
def zero_tile(r_acc):
    """Set every entry of the register tile ``r_acc`` (a thread's share of a product) to 0."""
    for a in range(r_acc.shape[0]):
        for c in range(r_acc.shape[1]):
            r_acc[a, c] = float32(0.0)
