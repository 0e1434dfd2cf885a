"""Numeric constants the kernels share, defined once.

Kernel code reads them as module globals, which Numba freezes into the compiled code as constants.
"""

import math

import numpy as np

#: log2(e): the fast kernels compute exp(x) as exp2(x * LOG2E) (one MUFU.EX2 instruction on a GPU).
LOG2E = 1.4426950408889634
#: ln(2): converts a base-2 logsumexp back to the natural log, L = LN2 * (m2 + log2 l).
LN2 = 0.6931471805599453
#: All 32 lanes of a warp, the mask of ``cuda.shfl_*_sync`` and ``cuda.syncwarp``.
FULL_MASK = 0xFFFFFFFF
#: Unsigned 64-bit index type: HBM indices built from it need no negative-index wrap-around code.
U = np.uint64

assert math.isclose(LOG2E * LN2, 1.0)
