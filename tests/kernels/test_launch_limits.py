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
"""

from __future__ import annotations

from numba_flash import _launch, attention_backward_numpy, attention_numpy, registry
from numba_flash._launch import poison_outputs
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, naive_attention_backward_float32, naive_attention_float32

#: Every (algorithm, variant) a caller can name (``auto`` resolves to one of these).
PAIRS = sorted({(k.algorithm, k.variant) for k in registry.variants()})


def _run(q, k, v, dout, algorithm, variant, causal, block_sizes=None):
    with poison_outputs():
        out, st = attention_numpy(q, k, v, causal=causal, algorithm=algorithm, variant=variant, block_sizes=block_sizes, return_stats=True)
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
    assert_error_rule(out, standard_attention(q, k, v, causal=True).O, naive_attention_float32(q, k, v, causal=True), what="O")
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
