"""Claims about head dims above 128, up to flash-attn's 256 (its grid: 160, 192, 224, 256).

* Every (algorithm, variant) computes O, L and the three gradients within the error rule at d = 160,
  192 and 256 (tiny shapes in the simulator; the fast kernels with small tiles there, their default
  tiles under ``slow``; real shapes under ``gpu``).
* The default tiles fit: the readable kernels' static SRAM under 48 KB, the fast kernels' dynamic SRAM
  under the 227 KB opt-in of an H100/H200, at every d from 129 to 256; they are the documented ones
  (``docs/flash2.rst``, "Head dims up to 256").
* The tensor-core module runs the FFMA kernel above d = 128 and says so.
"""

from __future__ import annotations

from numba_flash import (
    _launch,
    alg1_forward,
    alg4_backward,
    attention_backward_numpy,
    attention_numpy,
    fa2_backward,
    fa2_forward,
    registry,
)
from numba_flash._launch import STATIC_SMEM_BYTES, check_attention_args, poison_outputs
from numba_flash.fast import alg1_forward as fast_alg1
from numba_flash.fast import alg4_backward as fast_alg4
from numba_flash.fast import fa2_backward as fast_fa2_bwd
from numba_flash.fast import fa2_forward as fast_fa2_fwd
from numba_flash.tensorcore import fa2_forward_tf32
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, naive_attention_backward_float32, naive_attention_float32

PAIRS = sorted({(k.algorithm, k.variant) for k in registry.variants()})
#: Small tiles for the simulator (few simulated threads); None: the module's defaults.
SIM_TILES = {"standard": None, "flash1": (8, 8), "flash2": (8, 8)}
OPT_IN = 227 * 1024


def check_pair(rng, algorithm, variant, d, block_sizes, b=1, s_q=9, s_k=11, h=2, h_k=1):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    with poison_outputs():
        out, st = attention_numpy(
            q, k, v, causal=True, algorithm=algorithm, variant=variant, block_sizes=block_sizes, return_stats=True
        )
        grads = attention_backward_numpy(dout, q, k, v, out, st)
    ref = standard_attention(q, k, v, causal=True)
    assert_error_rule(out, ref.O, naive_attention_float32(q, k, v, causal=True), what=f"{algorithm}/{variant} O, d={d}")
    assert np.all(np.isfinite(st.lse[np.isfinite(ref.L)]))
    for name, g, r, n in zip(
        ("dq", "dk", "dv"),
        grads,
        standard_backward(dout, q, k, v, causal=True),
        naive_attention_backward_float32(dout, q, k, v, causal=True),
    ):
        assert_error_rule(g, r, n, mult=3.0, what=f"{algorithm}/{variant} {name}, d={d}")
    return st


@pytest.mark.parametrize(("algorithm", "variant"), PAIRS)
@pytest.mark.parametrize("d", [160, 192, 256])
def test_head_dims_up_to_256_follow_the_error_rule(rng, algorithm, variant, d):
    check_pair(rng, algorithm, variant, d, SIM_TILES[algorithm])


@pytest.mark.slow
@pytest.mark.simulator_only  # a GPU runs the default tiles at real shapes
# (test_head_dims_up_to_256_at_realistic_shapes)
@pytest.mark.parametrize(("algorithm", "variant"), PAIRS)
def test_head_dim_256_with_the_default_tiles(rng, algorithm, variant):
    check_pair(rng, algorithm, variant, 256, None)


@pytest.mark.gpu
@pytest.mark.parametrize(("algorithm", "variant"), PAIRS)
@pytest.mark.parametrize("d", [160, 192, 224, 256])
def test_head_dims_up_to_256_at_realistic_shapes(rng, algorithm, variant, d):
    check_pair(rng, algorithm, variant, d, None, b=2, s_q=1000, s_k=1029, h=4, h_k=2)


def _prob(d):
    q = np.zeros((1, 4, 1, d), np.float32)
    return check_attention_args(q, q, q)


def test_head_dim_limit_is_256():
    assert _launch.MAX_HEADDIM == 256
    check_attention_args(*(np.ones((1, 2, 1, 256), np.float32),) * 3)
    with pytest.raises(ValueError, match="headdim 257"):
        check_attention_args(*(np.ones((1, 2, 1, 257), np.float32),) * 3)


@pytest.mark.parametrize("d", range(129, 257))
def test_default_tiles_above_d128_fit_the_shared_memory(d):
    # readable kernels: static shared arrays, 48 KB
    assert fa2_forward.tile_sram_bytes(*fa2_forward.choose_block_sizes(_prob(d)), d) <= STATIC_SMEM_BYTES
    assert fa2_backward.tile_sram_bytes(*fa2_backward.default_block_sizes(d), d) <= STATIC_SMEM_BYTES
    assert alg4_backward.tile_sram_bytes(*alg4_backward.default_block_sizes(d), d) <= STATIC_SMEM_BYTES
    Br, Bc = alg1_forward.paper_block_sizes(d, threads=(8, 16), shuffles=True)
    assert 4 * alg1_forward.sram_footprint(Br, Bc, d, (8, 16), True) <= STATIC_SMEM_BYTES
    # fast kernels: dynamic SRAM after the opt-in, with their GPU tilings
    assert 4 * fast_fa2_fwd.smem_floats(*fast_fa2_fwd.config_for(d)) <= OPT_IN
    cfg = fast_fa2_bwd.config_for(d)
    fast_fa2_bwd.derived(*cfg)  # raises if the thread maps do not fit
    assert 4 * fast_fa2_bwd.smem_floats(*cfg) <= OPT_IN and 4 * fast_alg4.smem_floats(*cfg) <= OPT_IN
    assert 4 * fast_alg1.smem_floats(*fast_alg1.config_for(d, None, simulator=False)) <= OPT_IN


def test_default_tiles_above_d128_are_the_documented_ones():
    """The tiles docs/flash2.rst lists (Br, Bc), readable and fast."""
    assert {d: fa2_forward.choose_block_sizes(_prob(d)) for d in (160, 192, 256)} == {
        160: (20, 20),
        192: (16, 16),
        256: (12, 12),
    }
    assert {d: fa2_backward.default_block_sizes(d) for d in (160, 192, 256)} == {
        160: (16, 16),
        192: (8, 8),
        256: (8, 8),
    }
    assert {d: alg4_backward.default_block_sizes(d) for d in (160, 192, 256)} == {
        160: (16, 16),
        192: (8, 16),
        256: (8, 12),
    }
    assert {d: alg1_forward.paper_block_sizes(d, threads=(8, 16), shuffles=True) for d in (160, 192, 256)} == {
        160: (16, 20),
        192: (8, 16),
        256: (8, 12),
    }
    assert fast_fa2_fwd.config_for(256) == (256, 2, 8, 32, 256)  # Br = 64, Bc = 32
    assert fast_fa2_bwd.config_for(256) == (256, 32, 32, 256)
    NW, WS, TM, TPR, BCC, NCH, DP = fast_alg1.config_for(256, None, simulator=False)
    assert ((WS // TPR) * TM, BCC * NCH) == (8, 64)


def test_the_tensor_core_variant_routes_to_the_ffma_kernel_above_d128():
    for pass_ in registry.PASSES:
        assert (
            registry.resolve("flash2", pass_, "tensorcore", _prob(160)).module
            is registry.resolve("flash2", pass_, "fast").module
        )
        assert registry.resolve("flash2", pass_, "tensorcore", _prob(128)).module.__name__.startswith(
            "numba_flash.tensorcore."
        )
    [launch] = fa2_forward_tf32.compiled_kernels(_prob(128))
    assert "tensor cores" in launch.name
    with pytest.raises(ValueError, match="head dims up to 128"):
        fa2_forward_tf32.plan(_prob(160))
