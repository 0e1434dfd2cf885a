"""The half backward's two load paths for Q_i, dO_i (:mod:`numba_flash.tensorcore.fa2_backward_half`, ``CP_ASYNC``).

Claims checked:

* ``cp.async`` into two SRAM stages, issued one step ahead with the statistics in two stages beside them
  (``CP_ASYNC``, the default where it can run), and the register path (one stage, ``CP_ASYNC=False``) compute the same
  gradients: dK and dV bit for bit, and dQ too in the simulator, whose blocks run one at a time (on a GPU the
  order of dQ's atomic adds is free), on shapes with many query steps per key block, so that both stages are
  filled, read and refilled: ragged and causal (query blocks that see no key are skipped), GQA (the step loop
  crosses query heads), dropout (the row keys are staged too) and a head dim whose padded row ends in a chunk
  past d; the gradients follow flash-attn's 3x rule against naive attention in the same half dtype.
* Where ``cp.async`` cannot run, the register path runs: a head dim that is not a multiple of 8 and Q, dO
  whose rows are not 16-byte aligned.
* On a GPU (marker ``gpu``): the same at realistic shapes.

A stage refilled while it is still read shows in the simulator only where a block barrier does not already
separate the two: its ``cp.async`` twin copies at once, but its warp-level ``mma`` and ``ldmatrix`` twins exchange
lanes through block barriers, so inside the compute the threads run in step (the GPU cases with
``deterministic=True`` are the ones for the barrier of each step; mutations checked in the simulator: the next
copies into the current stage, or the statistics read without their stage offset, fail the bitwise tests).
"""

from __future__ import annotations

from numba_flash import api
from numba_flash._launch import Allocator, poison_outputs
from numba_flash.fast import _plan
from numba_flash.tensorcore import fa2_backward_half, fa2_forward_half

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, to_host, torch_attention, unaligned_copy

torch = pytest.importorskip("torch")


def _gradients(monkeypatch, xs, dout, causal, p, seed, bs, cp, deterministic=False):
    """(dq, dk, dv) through ``flash_attn_func`` (variant tensorcore) with the half backward's ``CP_ASYNC`` = ``cp``,
    and the ``CP_ASYNC`` that its ``plan`` was given (after ``backward``'s own fallbacks)."""
    real_defaults, real_plan = fa2_backward_half.default_features, fa2_backward_half.plan
    planned = []

    def plan(prob, block_sizes=None, config=None, features=None, *args, **kw):
        planned.append({**fa2_backward_half.default_features(), **(features or {})}["CP_ASYNC"])  # the patched defaults
        return real_plan(prob, block_sizes, config, features, *args, **kw)

    monkeypatch.setattr(fa2_backward_half, "default_features", lambda: {**real_defaults(), "CP_ASYNC": cp})
    monkeypatch.setattr(fa2_backward_half, "plan", plan)
    try:
        leaves = [x.detach().clone().requires_grad_(True) for x in xs]
        with poison_outputs():
            api.flash_attn_func(
                *leaves, p, causal=causal, seed=seed, variant="tensorcore", block_sizes=bs, deterministic=deterministic
            ).backward(dout)
    finally:
        monkeypatch.setattr(fa2_backward_half, "default_features", real_defaults)
        monkeypatch.setattr(fa2_backward_half, "plan", real_plan)
    assert len(planned) == 1, planned
    return [x.grad for x in leaves], planned[0]


def _half(rng, dtype, b, s_q, s_k, h, h_k, d, device="cpu"):
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    xs = [torch.from_numpy(x).to(device=device, dtype=dtype) for x in (q, k, v)]
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    return xs, torch.randn(xs[0].shape, generator=g).to(device=device, dtype=dtype)


def _assert_3x_rule(grads, xs, dout, causal, p, seed):
    ref = {}
    for dt in (torch.float64, xs[0].dtype):
        leaves = [x.detach().to(dt).requires_grad_(True) for x in xs]
        torch_attention(*leaves, causal, p, seed, dt).backward(dout.to(dt))
        ref[dt] = [x.grad.double().cpu().numpy() for x in leaves]
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref[torch.float64], ref[xs[0].dtype]):
        assert_error_rule(g.double().cpu().numpy(), r, n, mult=3, what=f"{name} (cp.async)")


#: (dtype, batch, s_q, s_k, nheads, nheads_k, d, causal, dropout_p, block_sizes (Br, Bc)): Br 16 gives 3-5 query
#: steps per key block (both stages used, then refilled)
CASES = [
    pytest.param(torch.bfloat16, 1, 53, 37, 2, 1, 16, False, 0.0, (16, 32), id="bf16-ragged-gqa-d16"),
    pytest.param(torch.float16, 1, 45, 50, 1, 1, 24, True, 0.0, (16, 16), id="fp16-causal-d24-padded-chunk"),
    pytest.param(torch.bfloat16, 1, 50, 21, 2, 2, 8, True, 0.15, (16, 16), id="bf16-causal-sq>sk-dropout-d8"),
]


@pytest.mark.parametrize(("dtype", "b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CASES)
def test_cp_async_stages_give_the_register_paths_gradients_bit_for_bit(
    rng, monkeypatch, dtype, b, s_q, s_k, h, h_k, d, causal, p, bs
):
    xs, dout = _half(rng, dtype, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    (cp_grads, cp_planned), (reg_grads, reg_planned) = (
        _gradients(monkeypatch, xs, dout, causal, p, seed, bs, cp) for cp in (True, False)
    )
    assert cp_planned and not reg_planned
    for name, a, r in zip(("dq", "dk", "dv"), cp_grads, reg_grads):
        assert torch.equal(a, r), f"{name}: the cp.async and register paths differ"
    _assert_3x_rule(cp_grads, xs, dout, causal, p, seed)


def test_cp_async_stages_in_the_deterministic_backward_give_the_register_paths_gradients(rng, monkeypatch):
    """Without atomic dQ the main kernel has no barrier after dK, dV: the step's one barrier alone guards the stages."""
    xs, dout = _half(rng, torch.bfloat16, 1, 50, 40, 2, 1, 16)
    (cp_grads, cp_planned), (reg_grads, _) = (
        _gradients(monkeypatch, xs, dout, True, 0.0, 0, (16, 16), cp, True) for cp in (True, False)
    )
    assert cp_planned
    for name, a, r in zip(("dq", "dk", "dv"), cp_grads, reg_grads):
        assert torch.equal(a, r), f"{name}: the cp.async and register paths differ"


def test_the_two_stages_double_the_sram_of_q_and_do_only():
    NW, MW, BR, DP = fa2_backward_half.config_for(128)
    one, two = (fa2_backward_half.smem_words(NW, MW, BR, DP, st) for st in (1, 2))
    assert two - one == 2 * BR * fa2_backward_half.stride(DP)


def test_head_dims_not_a_multiple_of_8_and_unaligned_inputs_take_the_register_path(rng, monkeypatch):
    assert fa2_forward_half.cp_async_ok(24) and not fa2_forward_half.cp_async_ok(12)
    xs, _ = _half(rng, torch.bfloat16, 1, 20, 20, 1, 1, 12)
    prob = api.check_attention_args(*xs)
    NW, MW, BR, DP = fa2_backward_half.config_for(12, (16, 16))
    # asked for, but d = 12 has rows that are not whole 16-byte chunks: one stage, the register path
    assert fa2_backward_half.plan(prob, (16, 16), None, {"CP_ASYNC": True})[5][0] == 4 * fa2_backward_half.smem_words(
        NW, MW, BR, DP, 1
    )
    # d = 16, Q and dO words 4 bytes past a 16-byte boundary: backward() drops CP_ASYNC (at kernel level: through
    # flash_attn_func the simulator's to_device would copy them to an aligned buffer)
    xs, dout = _half(rng, torch.bfloat16, 1, 20, 20, 1, 1, 16)
    prob = api.check_attention_args(*xs)
    alloc = Allocator(xs[0])
    kq, kk, kv, kdo = (alloc.to_words(x) for x in (*xs, dout))
    fwd = fa2_forward_half.forward(kq, kk, kv, prob, alloc)
    sq, sdo = (unaligned_copy(to_host(a)) for a in (kq, kdo))
    assert not _plan.aligned16(sq) and not _plan.aligned16(sdo)
    runs, planned, real_plan = [], [], fa2_backward_half.plan
    monkeypatch.setattr(fa2_backward_half, "plan", lambda *a, **kw: planned.append(a[3]) or real_plan(*a, **kw))
    for q_, do_ in ((sq, sdo), (kq, kdo)):
        with poison_outputs():
            grads = fa2_backward_half.backward(do_, q_, kk, kv, fwd.out, fwd, prob, alloc, features={"CP_ASYNC": True})
        runs.append(([to_host(g) for g in grads], planned[-1]["CP_ASYNC"]))
    assert not runs[0][1], "unaligned Q, dO: backward() must ask for the register path"
    assert runs[1][1], "aligned: the cp.async path"
    for a, r in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(a, r)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("n", "d", "causal", "p", "det"),
    [
        (1000, 64, False, 0.0, False),
        (1000, 128, True, 0.0, False),
        (777, 96, True, 0.1, False),
        (2048, 128, False, 0.0, False),
        (1000, 64, True, 0.0, True),
        (1000, 128, False, 0.0, True),
    ],
)
def test_cp_async_stages_give_the_register_paths_gradients_on_gpu_shapes(rng, monkeypatch, dtype, n, d, causal, p, det):
    """dK, dV bit for bit (dQ too with ``deterministic``: atomic adds land in any order). The deterministic cases are
    where a missing barrier would show: the simulator's lane exchanges put block barriers inside every ``mma``, and
    without atomic dQ the main kernel's one barrier per step alone guards the stages."""
    xs, dout = _half(rng, dtype, 2, n, n, 4, 2, d, device="cuda")
    (cp_grads, cp_planned), (reg_grads, _) = (
        _gradients(monkeypatch, xs, dout, causal, p, 7, None, cp, det) for cp in (True, False)
    )
    assert cp_planned
    for name, a, r in list(zip(("dq", "dk", "dv"), cp_grads, reg_grads))[0 if det else 1 :]:
        assert torch.equal(a, r), f"{name}: the cp.async and register paths differ"
    _assert_3x_rule(cp_grads, xs, dout, causal, p, 7)
