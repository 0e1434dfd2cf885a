"""The public API behaves like flash-attn's ``flash_attn_func`` on torch tensors and NumPy arrays.

Checked here: torch tensors in and out (same device, same dtype), float16/bfloat16 computed in
float32, non-contiguous inputs, ``return_attn_probs`` returning the logsumexp ``(b, h, s_q)`` in
float32, the NumPy-level function and its output dtype, and the saved statistics. Numerical claims use
the error rule of :mod:`attn_testing` against the float64 oracle. Shapes are small (simulator).
"""

from __future__ import annotations

import functools
from pathlib import Path

from numba_flash import _launch, attention_backward_numpy, attention_numpy, flash_attn_func
from numba_flash_reference.alg0_standard import standard_attention

import numpy as np
import pytest
import torch
from attn_testing import assert_error_rule, assert_stats_rule, make_qkv, naive_attention_float32, naive_stats_float32

ALGORITHMS = ("standard", "flash1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def to_torch(*xs, dtype=torch.float32):
    return tuple(torch.from_numpy(np.ascontiguousarray(x)).to(device=DEVICE, dtype=dtype) for x in xs)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_flash_attn_func_on_torch_tensors_matches_float64_reference(rng, algorithm):
    q, k, v = make_qkv(rng, 1, 19, 23, 2, 1, 8)
    with _launch.poison_outputs():
        out = flash_attn_func(*to_torch(q, k, v), causal=True, algorithm=algorithm, block_sizes=(8, 8))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device.type == DEVICE
    assert tuple(out.shape) == q.shape
    ref = standard_attention(q, k, v, causal=True).O
    assert_error_rule(out.cpu().numpy(), ref, naive_attention_float32(q, k, v, causal=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_are_computed_in_float32_and_returned_in_their_dtype(rng, dtype):
    q, k, v = make_qkv(rng, 1, 17, 17, 1, 1, 8)
    tq, tk, tv = to_torch(q, k, v, dtype=dtype)
    out = flash_attn_func(tq, tk, tv, algorithm="flash1", block_sizes=(8, 8))
    assert out.dtype == dtype
    # The oracle sees exactly the rounded inputs; the float32-naive baseline is rounded to the output
    # dtype too, so both errors include the final rounding to half precision.
    q64, k64, v64 = (x.float().cpu().numpy() for x in (tq, tk, tv))
    ref = standard_attention(q64, k64, v64).O
    naive = torch.from_numpy(naive_attention_float32(q64, k64, v64)).to(dtype).float().numpy()
    assert_error_rule(out.float().cpu().numpy(), ref, naive)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_non_contiguous_inputs_give_the_contiguous_result(rng, algorithm):
    # q from a (b, h, s, d) tensor transposed, k and v every other position of a longer sequence.
    q = torch.from_numpy(rng.standard_normal((1, 2, 13, 8)).astype(np.float32)).to(DEVICE).transpose(1, 2)
    kk = torch.from_numpy(rng.standard_normal((1, 30, 2, 8)).astype(np.float32)).to(DEVICE)
    vv = torch.from_numpy(rng.standard_normal((1, 30, 2, 16)).astype(np.float32)).to(DEVICE)
    k, v = kk[:, ::2], vv[:, ::2, :, ::2]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    with _launch.poison_outputs():
        out = flash_attn_func(q, k, v, algorithm=algorithm, block_sizes=(8, 8))
    dense = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), algorithm=algorithm, block_sizes=(8, 8))
    args = [x.cpu().numpy() for x in (q, k, v)]
    assert_error_rule(out.cpu().numpy(), standard_attention(*args).O, naive_attention_float32(*args))
    np.testing.assert_allclose(out.cpu().numpy(), dense.cpu().numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_return_attn_probs_gives_float32_logsumexp_per_query_row(rng, algorithm):
    q, k, v = make_qkv(rng, 2, 11, 7, 2, 2, 4)
    out, lse, s_dmask = flash_attn_func(
        *to_torch(q, k, v, dtype=torch.float16),
        causal=True,
        return_attn_probs=True,
        algorithm=algorithm,
        block_sizes=(8, 8),
    )
    assert s_dmask is None
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (2, 2, 11) and out.dtype == torch.float16
    q32, k32, v32 = (x.astype(np.float16).astype(np.float32) for x in (q, k, v))
    L = standard_attention(q32, k32, v32, causal=True).L
    got = lse.cpu().numpy()
    inf = np.isinf(L)  # s_q > s_k, causal: the first 4 rows see no key
    assert inf.sum() == 2 * 2 * 4
    np.testing.assert_array_equal(got[inf], L[inf])
    naive_L = naive_stats_float32(q32, k32, causal=True)[2]
    assert_error_rule(got[~inf], L[~inf], naive_L[~inf], what="lse")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_function_returns_an_array_of_the_input_dtype(rng, dtype):
    q, k, v = make_qkv(rng, 1, 9, 12, 1, 1, 4, dtype=dtype)
    out = attention_numpy(q, k, v, algorithm="flash1", block_sizes=(8, 8))
    assert isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == q.shape
    qf, kf, vf = (x.astype(np.float32) for x in (q, k, v))
    assert_error_rule(out, standard_attention(qf, kf, vf).O, naive_attention_float32(qf, kf, vf))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_numpy_function_returns_the_saved_statistics(rng, algorithm):
    q, k, v = make_qkv(rng, 1, 10, 10, 2, 2, 4)
    out, stats = attention_numpy(q, k, v, algorithm=algorithm, block_sizes=(8, 8), return_stats=True)
    assert stats.algorithm == algorithm and stats.block_sizes == (8, 8)
    for x in (stats.lse, stats.m, stats.l):
        assert x.dtype == np.float32 and x.shape == (1, 2, 10)
    assert_stats_rule(stats.m, stats.l, stats.lse, standard_attention(q, k, v), naive_stats_float32(q, k))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_default_softmax_scale_is_one_over_sqrt_headdim(rng, algorithm):
    q, k, v = make_qkv(rng, 1, 8, 8, 1, 1, 16)
    out = attention_numpy(q, k, v, algorithm=algorithm)  # tau = 1/sqrt(16)
    explicit = attention_numpy(q, k, v, softmax_scale=0.25, algorithm=algorithm)
    np.testing.assert_array_equal(out, explicit)
    other = attention_numpy(q, k, v, softmax_scale=0.5, algorithm=algorithm)
    assert np.max(np.abs(other - out)) > 1e-3


def test_torch_cpu_output_stays_on_cpu_and_does_not_alias_the_input(rng):
    q, k, v = (torch.from_numpy(x) for x in make_qkv(rng, 1, 8, 8, 1, 1, 4))
    out = flash_attn_func(q, k, v, algorithm="flash1")
    assert out.device == q.device and out.data_ptr() != q.data_ptr()


# ----------------------------------------------------------------------------------------------
# Read-only inputs
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["standard", "flash1", "flash2"])
def test_read_only_numpy_arrays_are_accepted_by_forward_and_backward(rng, algorithm):
    """Read-only q, k, v, out, dout and stats give the result of writable copies, bit for bit.

    They used to fail with "assignment destination is read-only": the simulator treats a NumPy array
    given to a launch as cuda.InOut and copies it back into the host array after every launch (no
    kernel writes its inputs). The Allocator now passes inputs as device arrays, as on a GPU.
    """
    q, k, v = make_qkv(rng, 1, 9, 12, 2, 1, 4)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    opts = dict(causal=True, dropout_p=0.2, seed=3, algorithm=algorithm, block_sizes=(8, 8))
    out_w, stats_w = attention_numpy(q.copy(), k.copy(), v.copy(), return_stats=True, **opts)
    grads_w = attention_backward_numpy(dout.copy(), q.copy(), k.copy(), v.copy(), out_w.copy(), stats_w)
    for x in (q, k, v, dout):
        x.setflags(write=False)
    out, stats = attention_numpy(q, k, v, return_stats=True, **opts)
    for x in (out, stats.lse, stats.m, stats.l):
        if x is not None:
            x.setflags(write=False)
    grads = attention_backward_numpy(dout, q, k, v, out, stats)
    np.testing.assert_array_equal(out, out_w)
    for a, b in zip(grads, grads_w):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------
# Scalars of every kind
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [np.float32, np.float64, lambda x: np.array(x), lambda x: torch.tensor(x, dtype=torch.float64)],
    ids=["np.float32", "np.float64", "0-d array", "0-d tensor"],
)
def test_numpy_and_0d_scalars_give_the_result_of_python_floats(rng, make):
    q, k, v = make_qkv(rng, 1, 8, 9, 1, 1, 4)
    want = attention_numpy(q, k, v, 0.25, 0.5, algorithm="flash1", seed=np.uint32(4), block_sizes=(8, 8))
    got = attention_numpy(q, k, v, make(0.25), make(0.5), algorithm="flash1", seed=4, block_sizes=(8, 8))
    np.testing.assert_array_equal(got, want)
    t = to_torch(q, k, v)
    got_t = flash_attn_func(*t, make(0.25), make(0.5), algorithm="flash1", seed=np.int64(4), block_sizes=(8, 8))
    np.testing.assert_array_equal(got_t.cpu().numpy(), want)


# ----------------------------------------------------------------------------------------------
# The simulator says when a call will take minutes
# ----------------------------------------------------------------------------------------------
@pytest.mark.simulator_only
def test_simulator_warns_with_an_estimate_before_a_call_that_takes_minutes(monkeypatch):
    from numba_flash import SimulatorSlowWarning, registry

    kernel = registry.resolve("flash2", "forward", "auto")

    class LaunchedError(Exception):
        pass

    def launch(*args, **kwargs):
        raise LaunchedError  # the warning must come first; the minutes-long launch is not run

    monkeypatch.setattr(kernel.module, "forward", launch)
    q = np.ones((2, 1024, 4, 64), np.float32)  # 8 heads of N = 1024: hours in the simulator
    with pytest.warns(SimulatorSlowWarning, match=r"will take about \d+(\.\d)? (min|h) .*seqlen_q = 1024.*shrink"):
        with pytest.raises(LaunchedError):
            attention_numpy(q, q, q, algorithm="flash2")


@pytest.mark.simulator_only
def test_simulator_estimate_grows_with_the_tiles_a_call_visits():
    from numba_flash import registry
    from numba_flash.runtime import cost as _cost

    def estimate(kernel, n, bh=1, d=32):
        return _cost.simulator_seconds(kernel, _launch.check_attention_args(*(np.ones((1, n, bh, d), np.float32),) * 3))

    for alg in ("standard", "flash1", "flash2"):
        for pass_ in ("forward", "backward"):
            kernel = registry.resolve(alg, pass_, "auto")
            est = functools.partial(estimate, kernel)
            assert est(2048) > 3.5 * est(1024) > 0  # N^2 (up to tile rounding)
            assert est(1024, bh=4) == pytest.approx(4 * est(1024))
            assert est(4096) > _cost.WARN_SECONDS  # a long sequence always warns
            assert est(32, d=8) < 10  # the tests' sizes never do


@pytest.mark.simulator_only
def test_small_calls_do_not_warn(rng):
    import warnings

    from numba_flash import SimulatorSlowWarning

    q, k, v = make_qkv(rng, 1, 8, 8, 1, 1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorSlowWarning)
        attention_numpy(q, k, v, algorithm="flash1")


# ----------------------------------------------------------------------------------------------
# The README's example runs
# ----------------------------------------------------------------------------------------------
def readme_block(marker: str) -> str:
    """The first fenced code block after ``<!-- marker -->`` in README.md (as .ci/run extracts commands)."""
    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    start = lines.index(f"<!-- {marker} -->")
    fence = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    return "\n".join(lines[fence + 1 : end])


def test_readme_use_it_example_runs_on_this_machine():
    """The README's "Use it" block, executed as written (on a CPU it runs in the simulator)."""
    import warnings

    from numba_flash import SimulatorSlowWarning

    code = readme_block("use-it")
    assert "flash_attn_func(" in code and ".backward()" in code
    ns: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorSlowWarning)  # "sizes that take seconds" holds
        exec(compile(code, "README.md:use-it", "exec"), ns)
    q, out, lse = ns["q"], ns["out"], ns["lse"]
    assert out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
