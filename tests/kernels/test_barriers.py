"""Every kernel's barriers are where they must be: the result holds when threads run one at a time.

A missing ``cuda.syncthreads()`` is a race: on a GPU and in the simulator's default schedule it gives a
wrong result only now and then. :func:`numba_flash.runtime.simulator.one_thread_at_a_time` runs every block's threads
strictly one after the other between barriers (thread 0 first), with every shared array full of NaN
when it is allocated, so that a thread reading a tile element that another thread has not written yet
reads NaN (or the previous tile), on every run. A kernel with all its barriers is schedule-independent
and passes; the bug gallery's missing-barrier bugs (``python -m numba_flash bugs``) fail here.

Simulator only: the schedule is the simulator's; on a GPU races are hunted with compute-sanitizer.
"""

from __future__ import annotations

from numba_flash import api, registry
from numba_flash._launch import poison_outputs
from numba_flash.runtime.simulator import one_thread_at_a_time
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, naive_attention_backward_float32, naive_attention_float32
from numba import cuda, float32  # a kernel's module must hold `cuda` as a global (the simulator swaps it)

ENTRIES = registry.entries()
#: (batch, s_q, s_k, nheads, nheads_k, d): ragged, s_q != s_k, GQA, several tiles each way at (8, 8).
SHAPE = (1, 19, 21, 2, 1, 8)
TILES = (8, 8)


def _id(k):
    return f"{k.algorithm}-{k.pass_}-{k.variant}"


@pytest.mark.simulator_only
@pytest.mark.parametrize("kernel", ENTRIES, ids=[_id(k) for k in ENTRIES])
def test_kernel_result_holds_when_threads_run_one_at_a_time_between_barriers(rng, kernel):
    q, k, v = make_qkv(rng, *SHAPE)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    opts = dict(causal=True, algorithm=kernel.algorithm, variant=kernel.variant, block_sizes=TILES)
    if kernel.pass_ == "forward":
        with one_thread_at_a_time(), poison_outputs():
            out = api.attention_numpy(q, k, v, **opts)
        assert_error_rule(
            out,
            standard_attention(q, k, v, causal=True).O,
            naive_attention_float32(q, k, v, causal=True),
            what=f"O ({_id(kernel)}, one thread at a time)",
        )
        return
    out, stats = api.attention_numpy(q, k, v, return_stats=True, **opts)
    assert stats.backward.variant == kernel.variant
    with one_thread_at_a_time(), poison_outputs():
        grads = api.attention_backward_numpy(dout, q, k, v, out, stats)
    ref = standard_backward(dout, q, k, v, causal=True)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=True)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert_error_rule(g, r, n, mult=3, what=f"{name} ({_id(kernel)}, one thread at a time)")


@pytest.mark.simulator_only
def test_one_thread_at_a_time_makes_a_missing_barrier_fail_every_time():
    """The checker itself: a two-thread kernel that loads a tile and reads the other thread's half
    without a barrier reads NaN under the schedule, and the right value with the barrier."""

    def make(with_barrier):
        @cuda.jit
        def kernel(src, dst):
            tile = cuda.shared.array(2, float32)
            t = cuda.threadIdx.x
            tile[t] = src[t]
            if with_barrier:
                cuda.syncthreads()  # Sync: the whole tile in SRAM before the other thread's half is read
            dst[t] = tile[1 - t]

        return kernel

    for with_barrier in (True, False):
        for _ in range(3):
            dst = np.zeros(2, np.float32)
            with one_thread_at_a_time():
                make(with_barrier)[1, 2](np.array([1.0, 2.0], np.float32), dst)
            if with_barrier:
                assert dst.tolist() == [2.0, 1.0]
            else:
                assert np.isnan(dst[0]) and dst[1] == 1.0  # thread 0 ran before thread 1 stored its half
