"""The dropout keep-mask on the device: the counter hash of ``numba_flash_reference.common``.

Every kernel that drops attention probabilities calls :func:`dropout_keep` with the same
``(seed, bh, row, col)`` the reference uses, so the mask agrees bit for bit with
``numba_flash_reference.common.dropout_keep_mask`` (a test checks this on both backends), and the
backward pass regenerates exactly the forward's mask from the seed (FA1 Algorithm 4 lines 1 and 14)
instead of storing an N x N mask.

All arithmetic is done in uint64 and reduced to 32 bits with an explicit mask: Numba would turn a
mixed signed/unsigned expression into float64, so every operand is converted to ``uint64`` first.
"""

from numba import cuda, uint64

_M32 = uint64(0xFFFFFFFF)
_C1 = uint64(0x7FEB352D)
_C2 = uint64(0x846CA68B)
_S15 = uint64(15)
_S16 = uint64(16)


# [doc:dropout-device]
@cuda.jit(device=True, inline="always")
def mix32(x):
    """lowbias32 finalizer on a 32-bit word held in a uint64."""
    x = x & _M32
    x = x ^ (x >> _S16)
    x = (x * _C1) & _M32
    x = x ^ (x >> _S15)
    x = (x * _C2) & _M32
    x = x ^ (x >> _S16)
    return x


@cuda.jit(device=True, inline="always")
def head_key(seed, bh):
    """k_bh = mix32(seed ^ mix32(bh)): computed once per (batch, head) by a kernel."""
    return mix32((uint64(seed) & _M32) ^ mix32(uint64(bh)))


@cuda.jit(device=True, inline="always")
def row_key(k_bh, row):
    """k_row = mix32(k_bh ^ row): computed once per query row."""
    return mix32(k_bh ^ uint64(row))


@cuda.jit(device=True, inline="always")
def keep(k_row, col, threshold):
    """True iff element (row, col) survives dropout: mix32(k_row ^ col) >= threshold."""
    return mix32(k_row ^ uint64(col)) >= uint64(threshold)


@cuda.jit(device=True, inline="always")
def dropout_keep(seed, bh, row, col, threshold):
    """The whole hash for one element (kernels hoist head_key/row_key out of their loops)."""
    return keep(row_key(head_key(seed, bh), row), col, threshold)
# [/doc:dropout-device]
