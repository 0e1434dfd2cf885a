"""The order the column-block backwards and the 3xTF32 forward start their blocks in
(:func:`numba_flash.fast._tiles.make_key_block_order`, :func:`numba_flash.fast._tiles.make_query_block_order`).

A GPU starts the blocks of a grid in the order of their linear number. The half and 3xTF32 backwards have one block per
(key block ``j``, batch x KV head); under a causal mask block ``j`` has the more query blocks to visit the smaller
``j`` is. ``HEAVY_FIRST`` (the 3xTF32 backward's default with causal; the half backward keeps the launch order) reads
the linear number ``j``-major, so that every head's heaviest block starts before any lighter one.

Claims checked:

* With and without ``HEAVY_FIRST`` every (j, head) pair gets exactly one block, on plain grids and on grids folded
  over z (the y limit lowered to 2, as :mod:`tests.kernels.test_launch_limits` does), and the padding blocks of a
  folded grid get ``j`` past the key blocks or a head past the last (the kernels return for those).
* With ``HEAVY_FIRST`` ``j`` never decreases along the linear number: no lighter block starts before a heavier one.
* The forwards' blocks own query blocks ``i``, and under a causal mask the last is the heaviest. The 3xTF32
  forward's ``HEAVY_FIRST`` reads the linear number ``i``-major from the last: every (i, head) pair once (plain and
  folded grids), ``i`` never increasing along the linear number; without it each head's blocks go from the last query
  block down, one head after another (the order the kernel had before, and the half forward's). O, L, m and l are bit
  for bit the same with and without it (a block's work does not depend on when it starts), causal with GQA and ragged
  rows (in the simulator, and on a GPU at realistic shapes).
"""

from __future__ import annotations

from numba_flash import _launch
from numba_flash._launch import bh_grid, check_attention_args
from numba_flash.fast import _tiles
from numba_flash.tensorcore import fa2_forward_tf32
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    assert_same_bits,
    make_qkv,
    naive_attention_float32,
    run_tc_forward,
)
from numba import cuda

torch = pytest.importorskip("torch")


def _visits(heavy_first, tc, n_bh, factory=_tiles.make_key_block_order):
    """``[(linear number, j, bh)]`` of every block of the grid ``bh_grid(tc, n_bh)`` (``factory``: the order; the
    forwards' gives the query block ``i`` in place of ``j``)."""
    key_block = factory(heavy_first)

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
def test_every_key_block_of_every_head_gets_one_block_and_heavy_ones_start_first(
    monkeypatch, heavy_first, max_y, tc, n_bh
):
    monkeypatch.setattr(_launch, "MAX_GRID_Y", max_y)
    visits = _visits(heavy_first, tc, n_bh)
    live = [(j, bh) for _, j, bh in visits if j < tc and bh < n_bh]
    assert sorted(live) == [(j, bh) for j in range(tc) for bh in range(n_bh)]
    assert len(visits) - len(live) == len(visits) - tc * n_bh  # the rest: the fold's padding, returned at once
    if heavy_first:
        js = [j for _, j, _ in visits]
        assert js == sorted(js), "a lighter key block starts before a heavier one"


@pytest.mark.parametrize("max_y", [65535, 2], ids=["plain", "folded"])
@pytest.mark.parametrize("heavy_first", [False, True])
@pytest.mark.parametrize(("tr", "n_bh"), [(4, 3), (1, 5), (3, 1)])
def test_every_query_block_of_every_head_gets_one_block_and_heavy_ones_start_first(
    monkeypatch, heavy_first, max_y, tr, n_bh
):
    monkeypatch.setattr(_launch, "MAX_GRID_Y", max_y)
    visits = _visits(heavy_first, tr, n_bh, _tiles.make_query_block_order)
    live = [(i, bh) for _, i, bh in visits if 0 <= i and bh < n_bh]
    assert sorted(live) == [(i, bh) for i in range(tr) for bh in range(n_bh)]
    assert len(visits) - len(live) == len(visits) - tr * n_bh  # the rest: the fold's padding, returned at once
    grid = bh_grid(tr, n_bh)
    if heavy_first:
        i_s = [i for _, i, _ in visits]
        assert i_s == sorted(i_s, reverse=True), "a lighter query block starts before a heavier one"
    else:  # each head from its last query block down (x fastest), then the next head
        assert [(i, bh) for _, i, bh in visits] == [
            (tr - 1 - x, y + grid[1] * z) for z in range(grid[2]) for y in range(grid[1]) for x in range(tr)
        ]


def _tc_forward_both_orders(q, k, v, block_sizes):
    prob = check_attention_args(q, k, v, 0.0, None, True, 0)
    kernels = [fa2_forward_tf32.plan(prob, block_sizes, None, {"HEAVY_FIRST": heavy})[0] for heavy in (True, False)]
    assert kernels[0] is not kernels[1], "the plan ignores HEAVY_FIRST: the comparison below would be of one kernel"
    runs = []
    for heavy in (True, False):
        host, planned = run_tc_forward(q, k, v, True, 0.0, 0, block_sizes, {"HEAVY_FIRST": heavy})
        assert planned["HEAVY_FIRST"] is heavy
        runs.append(host)
    assert_same_bits(*runs, "HEAVY_FIRST on and off")


@pytest.mark.parametrize(
    ("s_q", "s_k", "block_sizes"), [(45, 40, (16, 16)), (40, 21, (32, 8))], ids=["ragged", "sq>sk"]
)
def test_the_tc_forward_keeps_its_outputs_with_the_heavy_blocks_first(rng, s_q, s_k, block_sizes):
    _tc_forward_both_orders(*make_qkv(rng, 1, s_q, s_k, 2, 1, 16), block_sizes)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d", "block_sizes"), [(1000, 128, None), (1000, 128, (256, 16)), (2049, 64, None)])
def test_the_tc_forward_keeps_its_outputs_with_the_heavy_blocks_first_on_gpu(rng, n, d, block_sizes):
    _tc_forward_both_orders(*make_qkv(rng, 2, n, n, 4, 2, d), block_sizes)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "block_sizes"),
    [(fa2_forward_tf32.CAUSAL_MID_SEQLEN, (128, 16)), (fa2_forward_tf32.CAUSAL_LONG_SEQLEN, (256, 16))],
    ids=["mid", "long"],
)
def test_the_tc_forward_causal_defaults_from_512_rows_on_gpu(rng, n, block_sizes):
    """From N = CAUSAL_MID_SEQLEN the causal d = 128 default is 4 x 2 x 16 (two 128-row blocks per SM), from
    CAUSAL_LONG_SEQLEN 8 x 2 x 16, both with the heavy blocks first: each plan, within the forward's error rule (2x
    naive float32's error against float64)."""
    q, k, v = make_qkv(rng, 1, n, n, 1, 1, 128)
    assert fa2_forward_tf32.choose_block_sizes(check_attention_args(q, k, v, 0.0, None, True, 0)) == block_sizes
    (out, *_), _ = run_tc_forward(q, k, v, True, 0.0, 0, None, None)
    assert_error_rule(
        out, standard_attention(q, k, v, causal=True).O, naive_attention_float32(q, k, v, causal=True), what="O"
    )
