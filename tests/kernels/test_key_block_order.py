"""The order the column-block backwards start their blocks in (:func:`numba_flash.fast._tiles.make_key_block_order`).

A GPU starts the blocks of a grid in the order of their linear number. The half and 3xTF32 backwards have one block per
(key block ``j``, batch x KV head); under a causal mask block ``j`` has the more query blocks to visit the smaller
``j`` is. ``HEAVY_FIRST`` (the 3xTF32 backward's default with causal; a feature of the half backward) reads the linear number ``j``-major, so that every head's heaviest
block starts before any lighter one.

Claims checked:

* With and without ``HEAVY_FIRST`` every (j, head) pair gets exactly one block, on plain grids and on grids folded
  over z (the y limit lowered to 2, as :mod:`tests.kernels.test_launch_limits` does), and the padding blocks of a
  folded grid get ``j`` past the key blocks or a head past the last (the kernels return for those).
* With ``HEAVY_FIRST`` ``j`` never decreases along the linear number: no lighter block starts before a heavier one.
* The half backward with the order on and off gives dK and dV bit for bit and dQ within flash-attn's 3x rule (the
  atomic adds of dQ come in another order), causal with GQA.
"""

from __future__ import annotations

from numba_flash import _launch
from numba_flash._launch import Allocator, bh_grid, check_attention_args, poison_outputs
from numba_flash.fast import _tiles, fa2_backward_half, fa2_forward_half

import numpy as np
import pytest
from attn_testing import assert_error_rule, half_inputs, to_host, torch_attention_grads
from numba import cuda

torch = pytest.importorskip("torch")


def _visits(heavy_first, tc, n_bh):
    """``[(linear number, j, bh)]`` of every block of the backward's grid ``bh_grid(tc, n_bh)``."""
    key_block = _tiles.make_key_block_order(heavy_first)

    @cuda.jit
    def record(out, n):
        lin = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
        if cuda.threadIdx.x == 0:
            j, bh = key_block(n)
            out[lin, 0] = j
            out[lin, 1] = bh

    grid = bh_grid(tc, n_bh)
    out = np.full((int(np.prod(grid)), 2), -1, np.int64)
    record[grid, 1](out, n_bh)
    return [(i, int(j), int(bh)) for i, (j, bh) in enumerate(out)]


@pytest.mark.parametrize("max_y", [65535, 2], ids=["plain", "folded"])
@pytest.mark.parametrize("heavy_first", [False, True])
@pytest.mark.parametrize(("tc", "n_bh"), [(4, 3), (1, 5), (3, 1)])
def test_every_key_block_of_every_head_gets_one_block_and_heavy_ones_start_first(monkeypatch, heavy_first, max_y, tc, n_bh):
    monkeypatch.setattr(_launch, "MAX_GRID_Y", max_y)
    visits = _visits(heavy_first, tc, n_bh)
    live = [(j, bh) for _, j, bh in visits if j < tc and bh < n_bh]
    assert sorted(live) == [(j, bh) for j in range(tc) for bh in range(n_bh)]
    assert len(visits) - len(live) == len(visits) - tc * n_bh  # the rest: the fold's padding, returned at once
    if heavy_first:
        js = [j for _, j, _ in visits]
        assert js == sorted(js), "a lighter key block starts before a heavier one"


def test_the_half_backward_keeps_its_gradients_with_the_heavy_blocks_first(rng):
    th = half_inputs(rng, torch.bfloat16, 1, 40, 40, 2, 1, 16)
    dout = torch.from_numpy(rng.standard_normal(tuple(th[0].shape)).astype(np.float32)).to(torch.bfloat16)
    prob = check_attention_args(*th, 0.0, None, True, 0)
    alloc = Allocator(th[0])
    kq, kk, kv, kdo = (alloc.to_words(x) for x in (*th, dout))
    fwd = fa2_forward_half.forward(kq, kk, kv, prob, alloc, (16, 16))
    runs = []
    for heavy in (True, False):
        with poison_outputs():
            runs.append([to_host(g) for g in fa2_backward_half.backward(kdo, kq, kk, kv, fwd.out, fwd, prob, alloc, (16, 16),
                                                                         features={"HEAVY_FIRST": heavy})])
    for name, a, b in zip(("dk", "dv"), runs[0][1:], runs[1][1:]):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: the block order changed it")
    ref = torch_attention_grads(th, dout, True, 0.0, 0, torch.float64)
    naive = torch_attention_grads(th, dout, True, 0.0, 0, torch.bfloat16)
    for run in runs:
        assert_error_rule(run[0].astype(np.float64).reshape(ref[0].shape), ref[0], naive[0], mult=3.0, what="dQ")
