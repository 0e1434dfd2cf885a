"""The fp16 / bf16 FA2 forward and backward on the tensor cores (:mod:`numba_flash.tensorcore.fa2_forward_half`,
:mod:`numba_flash.tensorcore.fa2_backward_half`).

Claims checked (flash-attn's rule for half inputs, ``tests/test_flash_attn.py``: the kernel's error is at
most 2x the error of a naive attention computed *in the same half dtype*, both against a reference
computed in float64 from the same half inputs):

* float16 and bfloat16 inputs run natively and come back in their dtype: O within the rule for ragged
  ``N``, ``s_q != s_k``, head dims that are not a multiple of 16 (zero-padded words), causal masks,
  GQA/MQA and dropout (the same counter-hash mask as every kernel); ``L`` (float32) within 2x the error
  of a float32 logsumexp, since ``S`` is the float32 sum of exact half products; every output element
  written (NaN-poisoned outputs).
* Training on half inputs: the half forward with the half backward (what ``"tensorcore"`` runs, and
  ``"auto"`` on a GPU) gives dQ, dK, dV in the input dtype within 3x the error of naive attention's
  autograd in the same half dtype, on the same ragged/causal/GQA/dropout cases; ``deterministic=True``
  (the dQ kernel, no atomics) too, with dK, dV bitwise equal to the atomic mode's (the same main kernel).
* What the half kernel does not take still runs, through the float32 kernels (the 3xTF32 backward): odd
  head dims (no words) and non-contiguous inputs (copied to words).
* The forward's two load paths compute the same thing: K_j, V_j by ``cp.async`` into two SRAM stages (the
  default where ``d % 8 == 0``) and through registers into one (``CP_ASYNC=False``) give bitwise equal
  O, L, m, l on ragged, causal (blocks that see no key included), GQA, dropout and ``MW = 2`` shapes, at head
  dims whose rows are whole 16-byte chunks but not whole 32-byte ones (d = 24, 40, 48); the cp.async tile
  loader zero-fills the rows past N and the words past d of a poisoned SRAM tile. Where cp.async cannot
  run (d = 110; inputs not 16-byte aligned) the register path runs and the result is the same.
* On a GPU (marker ``gpu``): the same at realistic shapes (N up to 4096, d up to 128), bitwise
  reproducible forwards and deterministic backwards.

Simulator shapes stay tiny (N <= 40, d <= 32, tiles 16): each ``mma`` there is a lane exchange with
two block barriers.
"""

from __future__ import annotations

from numba_flash import api, registry
from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.fast import _plan, _tiles
from numba_flash.runtime import backend as _backend
from numba_flash.tensorcore import fa2_backward_half, fa2_forward_half, ptx
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
from attn_testing import (
    assert_error_rule,
    forward_recording_plan,
    make_qkv,
    naive_stats_float32,
    randn_like,
    torch_attention,
    torch_attention_grads,
    unaligned_copy,
)
from numba import cuda, uint32

torch = pytest.importorskip("torch")

DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]

#: (batch, s_q, s_k, nheads, nheads_k, d, causal, dropout_p, block_sizes): tiny simulator cases.
SIM_CASES = [
    pytest.param(1, 37, 37, 1, 1, 16, False, 0.0, (16, 16), id="ragged-N37-d16"),
    pytest.param(1, 19, 40, 2, 1, 32, True, 0.0, (16, 16), id="causal-sq<sk-gqa-d32"),
    pytest.param(1, 33, 14, 2, 2, 24, True, 0.2, (32, 16), id="causal-sq>sk-masked-rows-dropout-d24"),
    pytest.param(2, 21, 18, 1, 1, 10, False, 0.1, (16, 32), id="d10-dropout-b2"),
]


def _inputs(rng, dtype, b, s_q, s_k, h, h_k, d, device="cpu"):
    """Random half q, k, v, and the same values in float64 (the inputs the oracle sees)."""
    q, k, v = make_qkv(rng, b, s_q, s_k, h, h_k, d)
    th = [torch.from_numpy(x).to(device=device, dtype=dtype) for x in (q, k, v)]
    return th, [x.to(torch.float64) for x in th]


def _check(out, lse, th, t64, causal, p, seed):
    """O by the half rule (2x naive attention in the input dtype), L by the float32 rule."""
    dtype = th[0].dtype
    assert out.dtype == dtype and out.shape == th[0].shape
    ref = torch_attention(*t64, causal, p, seed, torch.float64)
    naive = torch_attention(*th, causal, p, seed, dtype)
    assert_error_rule(out.double().cpu().numpy(), ref.cpu().numpy(), naive.double().cpu().numpy(), what=f"O ({dtype})")
    q64, k64 = (x.cpu().numpy() for x in t64[:2])
    naive_L = naive_stats_float32(q64, k64, causal=causal)[2]  # float32 L of the half values: the baseline
    L64 = standard_attention(q64, k64, t64[2].cpu().numpy(), causal=causal).L
    got = lse.double().cpu().numpy()
    inf = np.isinf(L64)
    np.testing.assert_array_equal(got[inf], L64[inf], err_msg="L must be +inf exactly on the rows that see no key")
    assert_error_rule(got[~inf], L64[~inf], naive_L[~inf], what="L")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), SIM_CASES)
def test_half_forward_is_within_2x_the_error_of_naive_attention_in_its_dtype(
    rng, dtype, b, s_q, s_k, h, h_k, d, causal, p, bs
):
    th, t64 = _inputs(rng, dtype, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    with poison_outputs():
        out, lse, _ = api.flash_attn_func(
            *th, p, causal=causal, variant="tensorcore", block_sizes=bs, seed=seed, return_attn_probs=True
        )
    _check(out, lse, th, t64, causal, p, seed)


def test_half_kernel_handles_even_head_dims_and_leaves_the_rest_to_float32():
    prob = api.check_attention_args(*(np.zeros((1, 4, 1, 8), np.float16),) * 3)
    assert prob.dtype == "float16" and fa2_forward_half.handles(prob)
    for d, dt in ((7, np.float16), (8, np.float32), (2 * fa2_forward_half.HALF_MAX_HEADDIM, np.float16)):
        assert not fa2_forward_half.handles(api.check_attention_args(*(np.zeros((1, 4, 1, d), dt),) * 3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_odd_head_dims_and_strided_inputs_run_and_keep_their_dtype(rng, dtype):
    # d = 7 has no words: the float32 kernels run it. k, v every other position of a longer
    # sequence (not word-aligned rows): copied to words, same result as the contiguous tensors.
    th, t64 = _inputs(rng, dtype, 1, 17, 17, 1, 1, 7)
    with poison_outputs():
        out, lse, _ = api.flash_attn_func(*th, variant="tensorcore", block_sizes=(16, 16), return_attn_probs=True)
    _check(out, lse, th, t64, False, 0.0, 0)
    q = torch.from_numpy(rng.standard_normal((1, 2, 17, 16))).to(dtype).transpose(1, 2)
    kv = torch.from_numpy(rng.standard_normal((2, 1, 34, 2, 16))).to(dtype)
    k, v = kv[0][:, ::2], kv[1][:, ::2]
    assert not (q.is_contiguous() or k.is_contiguous())
    with poison_outputs():
        out = api.flash_attn_func(q, k, v, variant="tensorcore", block_sizes=(16, 16))
    dense = api.flash_attn_func(
        q.contiguous(), k.contiguous(), v.contiguous(), variant="tensorcore", block_sizes=(16, 16)
    )
    assert torch.equal(out, dense)
    # A contiguous q one element into its buffer: its rows are not whole words, and contiguous() would
    # hand back the same tensor (the GPU run of tests/test_replay.py found that).
    shifted = torch.cat([q.new_zeros(1), q.contiguous().flatten()])[1:].view(q.shape)
    assert shifted.is_contiguous() and shifted.storage_offset() == 1
    with poison_outputs():
        out = api.flash_attn_func(shifted, k, v, variant="tensorcore", block_sizes=(16, 16))
    assert torch.equal(out, dense)


def test_numpy_float16_arrays_run_natively_and_come_back_float16(rng):
    q, k, v = (x.astype(np.float16) for x in make_qkv(rng, 1, 20, 20, 1, 1, 16))
    with poison_outputs():
        out = api.attention_numpy(q, k, v, variant="tensorcore", block_sizes=(16, 16))
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    th = [torch.from_numpy(x) for x in (q, k, v)]
    ref = torch_attention(*(x.double() for x in th), False, 0.0, 0, torch.float64).numpy()
    naive = torch_attention(*th, False, 0.0, 0, torch.float16).double().numpy()
    assert_error_rule(out.astype(np.float64), ref, naive)


# ------------------------------------------------------------------------------------------------
# Forward: the cp.async pipeline and the register path
# ------------------------------------------------------------------------------------------------
def _forward_paths(th, causal, p, seed, bs, words=None):
    """The half forward at kernel level with ``CP_ASYNC`` on and off: for each, ``(O, L, m, l)`` as NumPy
    arrays (O as half words), the SRAM bytes and the features it ran with. ``words``: kernel arrays of q, k, v."""
    q = th[0]
    prob = check_attention_args(*th, p, None, causal, seed)
    runs = {}
    for cp in (True, False):
        alloc = Allocator(q)
        kq, kk, kv = words if words is not None else [alloc.to_words(x) for x in th]
        fwd, host, planned = forward_recording_plan(fa2_forward_half, (kq, kk, kv), prob, alloc, bs, {"CP_ASYNC": cp})
        nbytes = fa2_forward_half.plan(prob, bs, None, planned)[3]
        runs[cp] = (host, nbytes, planned, alloc.result(fwd.out, q.dtype), alloc.result(fwd.lse))
    return runs


#: (batch, s_q, s_k, nheads, nheads_k, d, causal, dropout_p, block_sizes): several key blocks each, so the
#: two SRAM stages alternate; ragged N everywhere
CP_CASES = [
    pytest.param(1, 37, 40, 2, 1, 64, False, 0.0, (16, 16), id="ragged-gqa-d64"),
    pytest.param(1, 33, 45, 2, 1, 40, True, 0.0, (16, 16), id="causal-gqa-d40"),
    pytest.param(1, 29, 35, 1, 1, 48, True, 0.1, (32, 16), id="causal-dropout-d48"),
    pytest.param(1, 45, 14, 2, 2, 24, True, 0.0, (16, 16), id="causal-sq>sk-blocks-without-keys-d24"),
    pytest.param(1, 37, 40, 1, 1, 40, True, 0.0, (128, 16), id="mw2-4warps-causal-d40"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), CP_CASES)
def test_cp_async_pipeline_equals_the_register_path_bit_for_bit(rng, dtype, b, s_q, s_k, h, h_k, d, causal, p, bs):
    th, t64 = _inputs(rng, dtype, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    runs = _forward_paths(th, causal, p, seed, bs)
    (cp_out, cp_bytes, cp_feats, out, lse), (reg_out, reg_bytes, reg_feats, _, _) = runs[True], runs[False]
    NW, MW, Bc, DP = fa2_forward_half.config_for(d, bs)
    assert cp_bytes == 4 * fa2_forward_half.smem_words(NW, MW, Bc, DP, 2), "cp.async: two SRAM stages of K_j, V_j"
    assert reg_bytes == 4 * fa2_forward_half.smem_words(NW, MW, Bc, DP, 1)
    assert cp_feats["CP_ASYNC"] and not reg_feats["CP_ASYNC"]
    for name, x, y in zip(("O", "L", "m", "l"), cp_out, reg_out):
        np.testing.assert_array_equal(
            x.view(np.uint32), y.view(np.uint32), err_msg=f"{name}: cp.async and register paths differ"
        )
    _check(out, lse, th, t64, causal, p, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dim_110_and_unaligned_inputs_fall_back_to_the_register_path(rng, dtype):
    # d = 110: a row is 55 words, its 16-byte chunks are not 16-byte aligned in HBM: the plan must not
    # take cp.async even when asked to, and must give the same answer as the register path
    assert not fa2_forward_half.cp_async_ok(110) and fa2_forward_half.cp_async_ok(40)
    th, t64 = _inputs(rng, dtype, 1, 19, 21, 1, 1, 110)
    runs = _forward_paths(th, False, 0.0, 0, (16, 16))
    NW, MW, Bc, DP = fa2_forward_half.config_for(110, (16, 16))
    for cp in (True, False):
        assert runs[cp][1] == 4 * fa2_forward_half.smem_words(NW, MW, Bc, DP, 1), (
            "d = 110: one SRAM stage (register path)"
        )
    for x, y in zip(runs[True][0], runs[False][0]):
        np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))
    _check(runs[True][3], runs[True][4], th, t64, False, 0.0, 0)
    # d = 32, word arrays whose base is 4 bytes past a 16-byte boundary: forward() drops CP_ASYNC
    th, _ = _inputs(rng, dtype, 1, 20, 20, 1, 1, 32)
    words = [unaligned_copy(x.contiguous().view(torch.int32).numpy()) for x in th]
    assert not _plan.aligned16(*words) and _plan.aligned16(*(w.copy() for w in words))
    runs = _forward_paths(th, False, 0.0, 0, (16, 16), words=words)
    assert not runs[True][2]["CP_ASYNC"], "unaligned inputs: forward() must ask for the register path"
    aligned = _forward_paths(th, False, 0.0, 0, (16, 16))
    for x, y in zip(runs[True][0], aligned[True][0]):
        np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))


def _make_async_tile_kernel(NROWS, DW, NT, SA, row_pairs=False):
    NC, load_async = _tiles.make_word_loader_async(NROWS, DW, NT, SA, _backend.is_simulator(), None, row_pairs)
    _copy16, commit, wait0 = ptx.make_cp_async()

    @cuda.jit
    def tile_kernel(gA, row0, n_rows, dw, out):
        """One block: poison an SRAM tile, cp.async rows row0.. of gA[0, :, 0, :] into it, copy it out."""
        smem = cuda.shared.array(0, uint32)  # (NROWS, SA) words
        tid = cuda.threadIdx.x
        for i in range(tid, NROWS * SA, NT):
            smem[i] = uint32(0xFFFFFFFF)
        cuda.syncthreads()  # Sync: the poison is stored before the copies land
        load_async(smem, 0, gA, 0, 0, row0, n_rows, dw, tid)
        commit()
        wait0()
        cuda.syncthreads()  # Sync: every thread's copies landed before the tile is read
        for i in range(tid, NROWS * SA, NT):
            out[i // SA, i % SA] = smem[i]

    return tile_kernel


@pytest.mark.parametrize("row_pairs", [False, True], ids=["chunks", "row-pairs"])
def test_cp_async_tile_loader_zero_fills_rows_past_n_and_words_past_d(rng, row_pairs):
    """Every chunk copied once (or zero-filled), whether a thread takes its chunks one by one or in pairs of rows
    ``r, r + 4`` (``ROW_PAIRS``, the 3xTF32 forward's ``V_j`` with ``SPLIT_KV``; 48 pairs over 32 threads here)."""
    # d = 40: 20 words of a row, padded to DW = 24 (6 chunks of 4 words; the 6th is past d); rows 30.. of 35
    NROWS, DW, NT, SA, dw, n_rows, row0 = 16, 24, 32, 28, 20, 35, 30
    gA = rng.integers(-(2**31), 2**31 - 1, size=(1, n_rows, 1, dw), dtype=np.int64).astype(np.int32)
    out = np.zeros((NROWS, SA), np.uint32)
    _make_async_tile_kernel(NROWS, DW, NT, SA, row_pairs)[1, NT, 0, 4 * NROWS * SA](gA, row0, n_rows, dw, out)
    want = np.zeros((NROWS, DW), np.uint32)
    want[: n_rows - row0, :dw] = gA[0, row0:, 0, :].view(np.uint32)
    np.testing.assert_array_equal(out[:, :DW], want)
    assert (out[:, DW:] == 0xFFFFFFFF).all(), "the 4 padding words of a row are not the tile's: left alone"
    if row_pairs:
        with pytest.raises(ValueError, match="multiple of 8 rows"):
            _tiles.make_own_chunks(12, DW, NT, SA, None, True)


def _check_grads(th, causal, p, seed, device, **kw):
    """Gradients of sum(dout * attention) by the 3x rule against naive attention's autograd in the half dtype."""
    dtype = th[0].dtype
    g = torch.Generator(device="cpu").manual_seed(seed % 2**31)
    dout = torch.randn(th[0].shape, generator=g).to(device=device, dtype=dtype)
    grads = {dt: torch_attention_grads(th, dout, causal, p, seed, dt) for dt in (torch.float64, dtype)}
    xs = [x.detach().clone().requires_grad_(True) for x in th]
    with poison_outputs():
        api.flash_attn_func(*xs, p, causal=causal, seed=seed, **kw).backward(dout)
    for name, x, r, n in zip(("dq", "dk", "dv"), xs, grads[torch.float64], grads[dtype]):
        assert x.grad.dtype == dtype
        assert_error_rule(x.grad.double().cpu().numpy(), r, n, mult=3, what=f"{name} ({dtype})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p", "bs"), SIM_CASES)
def test_half_backward_gives_gradients_within_3x_naive_half_error(
    rng, monkeypatch, dtype, b, s_q, s_k, h, h_k, d, causal, p, bs
):
    th, _ = _inputs(rng, dtype, b, s_q, s_k, h, h_k, d)
    ran = _spy(monkeypatch)
    _check_grads(th, causal, p, int(rng.integers(0, 2**32)), "cpu", variant="tensorcore", block_sizes=bs)
    assert ran == [False], "the half backward (atomic dQ) must be what ran"


def _spy(monkeypatch):
    """Record the ``deterministic`` flag of every call of the half backward."""
    ran = []
    real = fa2_backward_half.backward

    def spy(*args, **kw):
        ran.append(kw.get("deterministic"))
        return real(*args, **kw)

    monkeypatch.setattr(fa2_backward_half, "backward", spy)
    return ran


@pytest.mark.parametrize(
    ("dtype", "case"),
    [
        pytest.param(torch.float16, SIM_CASES[2].values, id="fp16-" + SIM_CASES[2].id),
        pytest.param(torch.bfloat16, SIM_CASES[1].values, id="bf16-" + SIM_CASES[1].id),
    ],
)
def test_deterministic_half_backward_is_within_3x_and_shares_dk_dv_with_the_atomic_one(rng, monkeypatch, dtype, case):
    b, s_q, s_k, h, h_k, d, causal, p, bs = case
    th, _ = _inputs(rng, dtype, b, s_q, s_k, h, h_k, d)
    seed = int(rng.integers(0, 2**32))
    ran = _spy(monkeypatch)
    _check_grads(th, causal, p, seed, "cpu", variant="tensorcore", block_sizes=bs, deterministic=True)
    g = torch.Generator(device="cpu").manual_seed(seed % 2**31)
    dout = torch.randn(th[0].shape, generator=g).to(dtype)
    grads = []
    for det in (False, True):
        xs = [x.detach().clone().requires_grad_(True) for x in th]
        api.flash_attn_func(
            *xs, p, causal=causal, seed=seed, variant="tensorcore", block_sizes=bs, deterministic=det
        ).backward(dout)
        grads.append([x.grad for x in xs])
    assert ran == [True, False, True]
    assert torch.equal(grads[0][1], grads[1][1]) and torch.equal(grads[0][2], grads[1][2]), (
        "dK, dV come from the same main kernel"
    )


def test_float32_and_odd_head_dims_run_the_float32_backward_in_the_tensorcore_variant():
    for dt, d, half in ((np.float16, 16, True), (np.float16, 7, False), (np.float32, 16, False)):
        prob = api.check_attention_args(*(np.zeros((1, 20, 1, d), dt),) * 3)
        names = [
            k.name
            for k in registry.resolve("flash2", "backward", "tensorcore", prob).module.compiled_kernels(prob, (16, 16))
        ]
        assert registry.resolve("flash2", "backward", "tensorcore", prob).takes_words == half
        assert all(("float16" in n) == half and ("3xTF32" in n) != half for n in names), names


# ------------------------------------------------------------------------------------------------
# GPU: realistic shapes
# ------------------------------------------------------------------------------------------------
GPU_CASES = [
    pytest.param(2, 1024, 1024, 4, 4, 64, False, 0.0, id="N1024-d64"),
    pytest.param(1, 4096, 4096, 2, 2, 64, True, 0.0, id="N4096-d64-causal"),
    pytest.param(1, 2048, 2048, 2, 2, 128, False, 0.0, id="N2048-d128"),
    pytest.param(2, 777, 1029, 6, 2, 40, True, 0.0, id="ragged-sq<sk-gqa-d40-causal"),
    pytest.param(2, 1029, 513, 4, 1, 96, True, 0.17, id="ragged-sq>sk-mqa-d96-causal-dropout"),
    pytest.param(1, 1000, 1000, 3, 3, 110, False, 0.1, id="ragged-d110-dropout"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), GPU_CASES)
def test_half_forward_is_within_2x_the_error_of_naive_attention_on_gpu_shapes(
    rng, dtype, b, s_q, s_k, h, h_k, d, causal, p
):
    th, t64 = _inputs(rng, dtype, b, s_q, s_k, h, h_k, d, device="cuda")
    seed = int(rng.integers(0, 2**32))
    with poison_outputs():
        out, lse, _ = api.flash_attn_func(
            *th, p, causal=causal, seed=seed, return_attn_probs=True
        )  # auto: the half kernel
    _check(out, lse, th, t64, causal, p, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_half_forward_is_bitwise_reproducible(rng, dtype):
    th, _ = _inputs(rng, dtype, 2, 1000, 1000, 4, 2, 64, device="cuda")
    outs = [api.flash_attn_func(*th, causal=True, return_attn_probs=True) for _ in range(5)]
    for o, lse, _ in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "s_q", "s_k", "h", "h_k", "d", "causal", "p"), GPU_CASES)
def test_half_training_gives_gradients_within_3x_naive_half_error_on_gpu_shapes(
    rng, monkeypatch, dtype, b, s_q, s_k, h, h_k, d, causal, p
):
    th, _ = _inputs(rng, dtype, b, s_q, s_k, h, h_k, d, device="cuda")
    ran = _spy(monkeypatch)
    _check_grads(th, causal, p, int(rng.integers(0, 2**32)), "cuda")  # auto: the half forward and the half backward
    assert ran == [False]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_half_backward_is_bitwise_reproducible_and_within_3x(rng, dtype):
    th, _ = _inputs(rng, dtype, 2, 1000, 1000, 4, 2, 64, device="cuda")
    _check_grads(th, True, 0.0, 7, "cuda", deterministic=True)
    dout = randn_like(rng, th[0])
    runs = []
    for _ in range(3):
        xs = [x.detach().clone().requires_grad_(True) for x in th]
        api.flash_attn_func(*xs, causal=True, deterministic=True).backward(dout)
        runs.append([x.grad for x in xs])
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, runs[0]))
