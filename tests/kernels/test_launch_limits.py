"""Claims about launch geometry limits: every kernel of every algorithm and variant runs when
``batch * nheads`` exceeds CUDA's grid-y limit (65535).

Kernels whose grid has one block per (batch, head) along y (FA2's ``(Tr, b h)``, the pre-pass, the
row-softmax and GEMM launches of the standard path, the GQA group sum) fold the excess into grid z:
grid ``(x, min(b h, MAX_GRID_Y), ceil(b h / MAX_GRID_Y))`` and ``bh = blockIdx.y + gridDim.y
blockIdx.z`` (blocks past ``b h`` in the last z slab return at once). FA1's kernels have ``b h`` along
grid x (limit 2^31 - 1) and need nothing.

In the simulator the limit is not enforced, so the tests lower ``numba_flash._launch.MAX_GRID_Y`` to 2:
the folded path (several z slabs, a ragged last slab) then runs on tiny shapes, with the same kernel
code as a real 70000-head launch. On a GPU (marker ``gpu``) the real limit is crossed.

The other limit is FA1's parallelism (FA2 §3.2): FA1's grid is ``b h`` blocks, so at the benchmark
convention (``b N = 16k`` tokens) it shrinks as ``1/N``, to fewer blocks than SMs, while FA2's grid
``(Tr, b h)`` stays the same size. Those tests read the grids from the kernel modules' launch plans
(``plan``, nothing is launched or compiled), at the benchmark shapes and at the shapes of the committed
results that docs/flash2.rst quotes ("Why FA1 idles at long sequences").
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from numba_flash import _launch, attention_backward_numpy, attention_numpy, registry
from numba_flash._launch import Problem, poison_outputs
from numba_flash.fast import alg1_forward as fa1_fast
from numba_flash.fast import fa2_forward as fa2_ffma
from numba_flash.runtime import resources as _inspect
from numba_flash.tensorcore import fa2_forward_tf32 as fa2_tc
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, naive_attention_backward_float32, naive_attention_float32

#: Every (algorithm, variant) a caller can name (``auto`` resolves to one of these).
PAIRS = sorted({(k.algorithm, k.variant) for k in registry.variants()})


def _run(q, k, v, dout, algorithm, variant, causal, block_sizes=None):
    with poison_outputs():
        out, st = attention_numpy(
            q, k, v, causal=causal, algorithm=algorithm, variant=variant, block_sizes=block_sizes, return_stats=True
        )
        grads = attention_backward_numpy(dout, q, k, v, out, st)
    return out, grads


@pytest.mark.parametrize(("algorithm", "variant"), PAIRS)
@pytest.mark.parametrize(("b", "h", "h_k"), [(3, 2, 1), (5, 1, 1)], ids=["bh6-gqa-bhk3", "bh5"])
def test_batch_times_heads_past_the_grid_y_limit_folds_into_grid_z(monkeypatch, rng, algorithm, variant, b, h, h_k):
    """With the y limit lowered to 2, b h = 6 runs as 3 z slabs of 2 and b h = 5 (or b h_k = 3) as a
    ragged last slab: every output element is written (NaN-poisoned) and right (error rule)."""
    monkeypatch.setattr(_launch, "MAX_GRID_Y", 2)
    q, k, v = make_qkv(rng, b, 9, 11, h, h_k, 8)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    tiles = None if algorithm == "standard" else (8, 8)
    out, grads = _run(q, k, v, dout, algorithm, variant, True, tiles)
    assert_error_rule(
        out, standard_attention(q, k, v, causal=True).O, naive_attention_float32(q, k, v, causal=True), what="O"
    )
    ref = standard_backward(dout, q, k, v, causal=True)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=True)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert_error_rule(g, r, n, mult=3.0, what=name)


def test_grid_fold_splits_batch_times_heads_over_y_and_z(monkeypatch):
    """The host side of the fold: y never exceeds the limit and y z covers b h with less than one slab spare."""
    assert _launch.MAX_GRID_Y == 65535
    assert _launch.bh_grid(7, 70_000) == (7, 65535, 2)
    assert _launch.bh_grid(3, 65535) == (3, 65535, 1)
    assert _launch.bh_grid(3, 1) == (3, 1, 1)
    monkeypatch.setattr(_launch, "MAX_GRID_Y", 2)
    for bh in range(1, 12):
        x, y, z = _launch.bh_grid(1, bh)
        assert y <= 2 and y * z >= bh and y * (z - 1) < bh


#: One head per block row far past the limit: b h = 70000 (FA2's grid y would be 70000).
@pytest.mark.gpu
@pytest.mark.parametrize(("algorithm", "variant"), PAIRS)
def test_seventy_thousand_heads_run_on_a_gpu(rng, algorithm, variant):
    b, h, n, d = 70, 1000, 16, 32
    q, k, v = make_qkv(rng, b, n, n, h, h, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, grads = _run(q, k, v, dout, algorithm, variant, False)
    for x in (out, *grads):
        assert np.all(np.isfinite(x))  # NaN-poisoned: every (batch, head) block wrote its part
    # the first, a middle and the last (batch, head) against the oracle (its loops over b h are slow)
    for bi, hi in ((0, 0), (35, 517), (69, 999)):
        sl = (slice(bi, bi + 1), slice(None), slice(hi, hi + 1))
        qs, ks, vs, ds = (x[sl] for x in (q, k, v, dout))
        assert_error_rule(out[sl], standard_attention(qs, ks, vs).O, naive_attention_float32(qs, ks, vs), what="O")
        ref, naive = standard_backward(ds, qs, ks, vs), naive_attention_backward_float32(ds, qs, ks, vs)
        for name, g, r, nv in zip(("dq", "dk", "dv"), grads, ref, naive):
            assert_error_rule(g[sl], r, nv, mult=3.0, what=name)


# ----------------------------------------------------------------------------------------------
# FA1's parallelism limit, FA2's fix (FA2 §3.2), read from the launch plans
# ----------------------------------------------------------------------------------------------
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
#: FA2's benchmark convention (FA2 §4.1): b N = 16k tokens, hidden size h d = 2048.
TOKENS, HIDDEN = 16384, 2048


def _bench_problem(N: int, d: int = 64, causal: bool = False, batch: int | None = None) -> Problem:
    h = HIDDEN // d
    return Problem(
        batch=TOKENS // N if batch is None else batch,
        seqlen_q=N,
        seqlen_k=N,
        nheads=h,
        nheads_k=h,
        headdim=d,
        softmax_scale=d**-0.5,
        causal=causal,
        dropout_p=0.0,
        seed=0,
    )


def _blocks(module, prob: Problem) -> int:
    """Thread blocks of the one launch ``module.forward`` makes for ``prob``: its plan's grid, not launched."""
    return math.prod(module.plan(prob)[1])


def test_fa2_parallelizes_over_query_blocks_where_fa1_has_only_batch_times_heads_blocks():
    """FA1's grid is one block per (batch, head): at 16k tokens and 32 heads it halves with every doubling
    of N, down to 32 blocks at N = 16384, under a quarter of an H100's or H200's 132 SMs. FA2's grid
    (Tr, b h) has Tr = ceil(N / Br) query blocks per (batch, head): Tr b h blocks, the same at every N."""
    sms = (_inspect.device_limits() or _inspect._DEFAULT_LIMITS)["sm_count"]
    fa2_blocks = {}
    for N in (1024, 2048, 4096, 8192, 16384):
        prob = _bench_problem(N)
        bh = prob.batch * prob.nheads
        assert bh == TOKENS * (HIDDEN // 64) // N
        assert fa1_fast.plan(prob)[1] == (bh,)  # FA1: b h blocks along x, nothing else
        for module in (fa2_ffma, fa2_tc):
            Br = module.choose_block_sizes(prob)[0]
            grid = module.plan(prob)[1]
            assert grid[0] == math.ceil(N / Br)  # FA2.1 L3: one block per query block Q_i
            assert math.prod(grid) == math.ceil(N / Br) * bh
            fa2_blocks.setdefault(module.__name__, set()).add(math.prod(grid))
    prob = _bench_problem(16384)
    assert prob.batch == 1 and _blocks(fa1_fast, prob) == 32 and 4 * 32 < sms  # 100 of 132 SMs get no block
    for name, counts in fa2_blocks.items():
        assert len(counts) == 1, (name, counts)  # b N fixed: Tr b h = (N / Br) (16384 h / N) at every N
        assert counts.pop() >= 10 * sms, name  # many waves: every SM busy, a small tail


def _committed_rows(name: str, algorithms: tuple[str, ...]) -> list[dict]:
    data = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    return [
        b["extra_info"]
        for b in data["benchmarks"]
        if b["extra_info"].get("algorithm") in algorithms and b["extra_info"].get("pass_", "forward") == "forward"
    ]


@pytest.mark.parametrize(
    ("results", "algorithm", "module"),
    [
        ("forward_h200.json", "flash1", fa1_fast),
        # the H200 grid at 50079fe (the causal d = 128 tiling at N 512 is 4 x 2 x 16 since fd90960); fa2_h100.json ran
        # before that change
        ("fa2_h200.json", "flash2", fa2_tc),
        ("fa2_h200.json", "flash2_ffma", fa2_ffma),
    ],
)
def test_committed_benchmarks_ran_the_grids_the_launch_plans_give(results, algorithm, module):
    """The thread-block counts that docs/flash2.rst shows from the committed results are those the kernels
    launch today: for every forward row, the recorded ``grid_blocks`` is the plan's grid at the row's shape
    (a retiling that changes Br makes the docs' FA2 block counts stale, and fails here)."""
    rows = _committed_rows(results, (algorithm,))
    assert len(rows) >= 5, results  # N = 512 .. 16384 at least
    for row in rows:
        (report,) = row["kernels"].values()
        prob = _bench_problem(row["N"], row["d"], row["causal"], row["batch"])
        assert prob.nheads == row["nheads"], row
        assert _blocks(module, prob) == report["grid_blocks"], (row["N"], row["d"], row["causal"])
