"""Assignment 5: the FlashAttention-2 forward kernel (FA2 Algorithm 1), one head, with causal block skipping.  <-- your
file.

Read first: FA2 sections 3.1 (fewer non-matmul FLOPs, causal masking) and 3.2 (parallelism over the
sequence), Algorithm 1; ``tutorials/04_tiled_flash_forward.py`` (FA1 vs FA2 traffic); your assignments
1 (the un-normalized accumulator) and 3 (the FA1 kernel: tiles, barriers, ragged tails).

The task: ``O = softmax(tau Q K^T) V`` and the logsumexp ``L = m + log l`` for one head, ``Q, K, V``
``(N, d)`` float32, with FlashAttention-2's loop order: the OUTER loop over query tiles ``Q_i`` is the
grid (each tile an independent thread block, line 3); each block loads ``Q_i`` ONCE (line 4), keeps
``m_i, l_i`` and an UN-NORMALIZED accumulator ``O_i`` on chip (line 5), streams the key/value tiles
``K_j, V_j`` (lines 6-10), then divides once (line 12) and writes ``O_i`` and ``L_i`` ONCE (lines 13-15).

``causal=True``: query row ``r`` sees keys ``0..r`` only. Skip the key tiles that lie entirely above
the diagonal of the query tile (never load them: about half of all tiles), and mask element by
element only inside the tiles the diagonal crosses.

Launch geometry (given below): grid ``ceil(N / BR)`` blocks, ``BR`` threads each. Suggested ownership:
thread ``t`` of block ``i`` owns query row ``i * BR + t`` (its row of ``S``, ``P~``, its ``m, l`` and
its accumulator row, e.g. ``cuda.local.array(D, float32)``); the threads load ``K_j, V_j`` together.

Graded (``python -m pytest tutorials/assignments/a5_fa2_forward``), ragged N, odd d:

* ``O`` and ``L`` equal the float64 reference (causal and not) to twice the float32 error;
* IO (per element, simulator): Q read exactly once; O and L written exactly once, never read; each
  K and V element read exactly ``Tr = ceil(N / BR)`` times (non-causal); causal: each key read at
  most as often as tile skipping allows and at least by every query tile that needs it;
* shared memory per block at most ``4 ((2 BC + 2 BR) D + BR BC + 8 BR)`` bytes;
* house style: one ``cuda.shared.array`` per line, ``# Sync:`` on barriers, tags ``# FA2.1 L4:``,
  ``L5``, ``L7``, ``L8``, ``L9``, ``L10``, ``L12``, ``L13``, ``L14``, ``L15``.

Simulator traps: ``math.exp`` of a large number raises OverflowError (exponentiate ``x - max <= 0``
only); ``math.exp(-math.inf)`` is 0 (a masked score), ``-inf - (-inf)`` is NaN.
"""

from __future__ import annotations

import functools
import math  # noqa: F401  (math.exp, math.log, math.inf)

from numba import cuda, float32  # noqa: F401

BR = 8  # rows of a query tile Q_i = threads per block (the autograder reads it; 2 <= BR <= 64)
BC = 8  # rows of a key/value tile K_j, V_j (2 <= BC <= 64)


@functools.cache
def make_kernel(D):
    """The FA2 forward kernel specialized for head dimension ``D``."""

    @cuda.jit
    def flash2_forward_kernel(Q, K, V, O, L, tau, causal):
        """FA2 Algorithm 1 for one head, one query tile per block (``cuda.blockIdx.x``)."""
        # TODO FA2.1 L4:  load Q_i (this thread's row) into SRAM
        # TODO FA2.1 L5:  O_i = 0 (registers), l_i = 0, m_i = -inf
        #                 causal: how many key tiles does this query tile need?
        # TODO FA2.1 L6:  for j in range(...):
        # TODO FA2.1 L7:      load K_j, V_j together; barrier
        # TODO FA2.1 L8:      S = tau Q_i K_j^T (this row), -inf above the diagonal if causal
        # TODO FA2.1 L9:      m_new, P~ = exp(S - m_new), l_i
        # TODO FA2.1 L10:     O_i = e^(m_i - m_new) O_i + P~ V_j
        #                     barrier before the next j overwrites K_j, V_j
        # TODO FA2.1 L12-L15: O_i / l_i, L_i = m_i + log l_i, write both once
        raise NotImplementedError("a5: flash2_forward_kernel")

    return flash2_forward_kernel


def flash2_forward(Q, K, V, O, L, tau, causal=False):
    """Run FA2 Algorithm 1 on one head. Given: grid ``ceil(N / BR)`` blocks of ``BR`` threads."""
    N = Q.shape[0]
    make_kernel(Q.shape[1])[(N + BR - 1) // BR, BR](Q, K, V, O, L, tau, causal)
