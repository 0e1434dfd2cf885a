"""Bad input raises a clear ValueError/TypeError that names the argument, before any kernel launch.

Each test calls the public API with exactly one thing wrong. The ``no_launch`` fixture replaces the
dispatch to the kernel modules with a function that fails the test, so an error raised only after a
launch (or a silently wrong launch) cannot pass.
"""

from __future__ import annotations

import math
from fractions import Fraction

from numba_flash import _run, api
from numba_flash.api import attention_backward_numpy, attention_numpy, flash_attn_func

import numpy as np
import pytest
import torch


@pytest.fixture
def no_launch(monkeypatch):
    def launched(*args, **kwargs):
        raise AssertionError("a kernel module was reached: the argument check came too late")

    monkeypatch.setattr(_run, "forward", launched)  # every launch, NumPy or torch, goes through _run
    monkeypatch.setattr(_run, "backward", launched)


def qkv(rng, b=1, s_q=8, s_k=8, h=2, h_k=2, d=4, dtype=np.float32):
    q = rng.standard_normal((b, s_q, h, d)).astype(dtype)
    k = rng.standard_normal((b, s_k, h_k, d)).astype(dtype)
    v = rng.standard_normal((b, s_k, h_k, d)).astype(dtype)
    return q, k, v


def both_apis(q, k, v, **kw):
    """Call the NumPy-level function, then the torch one on the same (converted) inputs."""
    yield lambda: attention_numpy(q, k, v, **kw)
    conv = lambda x: torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x  # noqa: E731
    yield lambda: flash_attn_func(conv(q), conv(k), conv(v), **kw)


def expect(exc, match, calls):
    for call in calls:
        with pytest.raises(exc, match=match):
            call()


@pytest.mark.usefixtures("no_launch")
class TestEveryBadArgumentIsNamed:
    def test_wrong_rank_names_the_array(self, rng):
        q, k, v = qkv(rng)
        expect(ValueError, r"^q must have 4 dimensions", both_apis(q[0], k, v))
        expect(ValueError, r"^k must have 4 dimensions", both_apis(q, k[..., None], v))
        expect(ValueError, r"^v must have 4 dimensions", both_apis(q, k, v[0]))

    def test_mismatched_batch_names_k(self, rng):
        q, _, _ = qkv(rng, b=2)
        _, k, v = qkv(rng, b=3)
        expect(ValueError, r"k has batch size 3 but q has 2", both_apis(q, k, v))

    def test_mismatched_seqlen_k_between_k_and_v_names_v(self, rng):
        q, k, _ = qkv(rng, s_k=8)
        _, _, v = qkv(rng, s_k=9)
        expect(ValueError, r"^v must have the same shape as k", both_apis(q, k, v))

    def test_mismatched_headdim_names_k(self, rng):
        q, _, _ = qkv(rng, d=4)
        _, k, v = qkv(rng, d=5)
        expect(ValueError, r"k has headdim 5 but q has 4", both_apis(q, k, v))

    def test_nheads_not_a_multiple_of_nheads_k_names_both(self, rng):
        q, k, v = qkv(rng, h=3, h_k=2)
        expect(ValueError, r"nheads of q \(3\) must be a multiple of nheads of k and v \(2\)", both_apis(q, k, v))

    def test_headdim_above_256_is_refused(self, rng):
        q, k, v = qkv(rng, s_q=2, s_k=2, d=257)
        expect(ValueError, r"headdim 257 is larger than the supported maximum 256", both_apis(q, k, v))

    def test_dtype_mismatch_names_the_dtypes(self, rng):
        q, k, v = qkv(rng)
        expect(TypeError, r"q, k and v must have the same dtype", both_apis(q, k.astype(np.float64), v))

    def test_integer_dtype_is_refused(self, rng):
        q, k, v = qkv(rng)
        expect(TypeError, r"^q must be float16, bfloat16, float32 or float64", both_apis(q.astype(np.int32), k, v))

    def test_device_mismatch_names_the_devices(self, rng):
        q, k, v = (torch.from_numpy(x) for x in qkv(rng))
        # A CPU tensor mixed with one on another device (meta here; CUDA on a GPU machine).
        with pytest.raises(ValueError, match=r"q, k and v must be on the same device, got meta, cpu, cpu"):
            flash_attn_func(q.to("meta"), k, v)

    @pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, math.nan, "0.1", True, None])
    def test_dropout_p_outside_0_1_is_refused(self, rng, p):
        q, k, v = qkv(rng)
        expect(ValueError, r"^dropout_p must be a number in \[0, 1\)", both_apis(q, k, v, dropout_p=p))

    @pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, -math.inf, math.nan])
    def test_non_finite_or_non_positive_softmax_scale_is_refused(self, rng, scale):
        q, k, v = qkv(rng)
        expect(ValueError, r"^softmax_scale must be finite and positive", both_apis(q, k, v, softmax_scale=scale))

    @pytest.mark.parametrize(
        "scale",
        [
            "0.5",
            True,
            np.bool_(True),
            0.5j,
            np.complex64(0.5),
            np.array(0.5 + 0j),
            np.array([0.5]),
            np.array([0.5, 0.5]),
            torch.tensor([0.5]),
            torch.tensor(True),
            [0.5],
        ],
        ids=[
            "str",
            "bool",
            "np.bool_",
            "complex",
            "np.complex64",
            "0-d complex array",
            "1-element array",
            "2-element array",
            "1-element tensor",
            "0-d bool tensor",
            "list",
        ],
    )
    def test_softmax_scale_that_is_not_a_real_scalar_is_a_type_error(self, rng, scale):
        q, k, v = qkv(rng)
        expect(TypeError, r"^softmax_scale must be a real number", both_apis(q, k, v, softmax_scale=scale))

    @pytest.mark.parametrize(
        "scale",
        [np.float32(np.inf), np.float64(np.nan), np.array(0.0), torch.tensor(-1.0), np.int64(0)],
        ids=["np.float32 inf", "np.float64 nan", "0-d array 0", "0-d tensor -1", "np.int64 0"],
    )
    def test_numpy_or_0d_softmax_scale_that_is_not_finite_and_positive_is_refused(self, rng, scale):
        q, k, v = qkv(rng)
        expect(ValueError, r"^softmax_scale must be finite and positive", both_apis(q, k, v, softmax_scale=scale))

    @pytest.mark.parametrize(
        "p",
        [np.float32(1.0), np.float64(-0.1), np.array([0.1]), np.bool_(False), torch.tensor([0.1]), 0.1j],
        ids=["np.float32 1", "np.float64 -0.1", "1-element array", "np.bool_", "1-element tensor", "complex"],
    )
    def test_numpy_dropout_p_outside_0_1_or_not_a_scalar_is_refused(self, rng, p):
        q, k, v = qkv(rng)
        expect(ValueError, r"^dropout_p must be a number in \[0, 1\)", both_apis(q, k, v, dropout_p=p))

    @pytest.mark.parametrize(
        "seed",
        [np.float64(5.0), np.bool_(True), np.array([5]), np.int64(-1), np.uint64(2**32), torch.tensor(1.5)],
        ids=["np.float64", "np.bool_", "1-element array", "np.int64 -1", "np.uint64 2**32", "0-d float tensor"],
    )
    def test_numpy_seed_that_is_not_a_uint32_integer_is_refused(self, rng, seed):
        q, k, v = qkv(rng)
        expect(ValueError, r"^seed must be an integer in \[0, 2\*\*32\)", both_apis(q, k, v, seed=seed))

    @pytest.mark.parametrize("which", ["q-batch", "q-seqlen", "k-seqlen", "heads", "headdim"])
    def test_zero_size_dimension_is_refused(self, rng, which):
        q, k, v = qkv(rng)
        if which == "q-batch":
            q, k, v = q[:0], k[:0], v[:0]
        elif which == "q-seqlen":
            q = q[:, :0]
        elif which == "k-seqlen":
            k, v = k[:, :0], v[:, :0]
        elif which == "heads":
            q, k, v = q[:, :, :0], k[:, :, :0], v[:, :, :0]
        else:
            q, k, v = q[..., :0], k[..., :0], v[..., :0]
        expect(ValueError, r"has a zero-size dimension", both_apis(q, k, v))

    @pytest.mark.parametrize("name", ["flash3", "Standard", "", 1])
    def test_unknown_algorithm_name_is_refused(self, rng, name):
        q, k, v = qkv(rng)
        expect(
            ValueError,
            r"^algorithm must be one of \('standard', 'flash1', 'flash2'\)",
            both_apis(q, k, v, algorithm=name),
        )

    @pytest.mark.parametrize("bs", [(0, 16), (16, -1), (16,), (8, 8, 8), "ab", 16, (16.0, 16), (True, 8)])
    def test_malformed_block_sizes_are_refused(self, rng, bs):
        q, k, v = qkv(rng)
        expect(ValueError, r"^block_sizes", both_apis(q, k, v, block_sizes=bs))

    def test_causal_must_be_a_bool(self, rng):
        q, k, v = qkv(rng)
        expect(TypeError, r"^causal must be a bool", both_apis(q, k, v, causal=1))

    @pytest.mark.parametrize("seed", [-1, 2**32, 1.5, 5.0, True])
    def test_seed_outside_uint32_is_refused(self, rng, seed):
        q, k, v = qkv(rng)
        expect(ValueError, r"^seed must be an integer in \[0, 2\*\*32\)", both_apis(q, k, v, seed=seed))

    def test_non_array_input_is_a_type_error(self, rng):
        _, k, v = qkv(rng)
        with pytest.raises(TypeError, match=r"^q must be an array or tensor, got list"):
            attention_numpy([[1.0]], k, v)

    def test_flash_attn_func_refuses_numpy_arrays(self, rng):
        q, k, v = qkv(rng)
        with pytest.raises(TypeError, match=r"^q must be a torch.Tensor"):
            flash_attn_func(q, k, v)

    @pytest.mark.parametrize(
        ("scale", "what"), [(1e300, "overflows to inf"), (1e39, "overflows to inf"), (1e-50, "underflows to 0")]
    )
    def test_softmax_scale_finite_in_float64_but_not_in_float32_is_refused(self, rng, scale, what):
        # Before: accepted, and every output was NaN (the kernels scale in float32).
        q, k, v = qkv(rng)
        expect(
            ValueError,
            rf"^softmax_scale must be a positive float32 number .* {what} in float32$",
            both_apis(q, k, v, softmax_scale=scale),
        )

    @pytest.mark.parametrize("flag", ["yes", 1, None])
    def test_return_attn_probs_must_be_a_bool(self, rng, flag):
        q, k, v = (torch.from_numpy(x) for x in qkv(rng))
        with pytest.raises(TypeError, match=r"^return_attn_probs must be a bool"):
            flash_attn_func(q, k, v, return_attn_probs=flag)

    def test_meta_tensors_are_refused_by_name(self, rng):
        q, k, v = (torch.from_numpy(x).to("meta") for x in qkv(rng))
        with pytest.raises(ValueError, match=r"^q is a meta tensor"):
            flash_attn_func(q, k, v)


@pytest.mark.parametrize("algorithm", ["standard", "flash2"])
def test_double_backward_is_refused_at_the_first_backward_with_create_graph(rng, algorithm):
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in qkv(rng))
    out = flash_attn_func(q, k, v, algorithm=algorithm, variant="readable")
    with pytest.raises(RuntimeError, match=r"^flash_attn_func: double backward is not supported"):
        torch.autograd.grad(out.sum(), (q, k, v), create_graph=True)
    # the first backward without create_graph still works, and the gradients are not differentiable graphs
    out = flash_attn_func(q, k, v, algorithm=algorithm, variant="readable")
    dq, *_ = torch.autograd.grad(out.sum(), (q, k, v))
    assert dq.shape == q.shape and not dq.requires_grad


def test_block_sizes_too_large_for_static_shared_memory_fail_before_the_readable_kernel_is_built(rng, monkeypatch):
    # The readable FA1 kernel declares its tiles statically: 48 KB at most.
    from numba_flash import alg1_forward

    def built(*args, **kwargs):
        raise AssertionError("the kernel was compiled: the SRAM check came too late")

    monkeypatch.setattr(alg1_forward, "forward_kernel", built)
    q, k, v = qkv(rng, d=64)
    with pytest.raises(ValueError, match=r"^block_sizes \(128, 128\) need .* KB of shared memory at headdim 64"):
        attention_numpy(q, k, v, algorithm="flash1", variant="readable", block_sizes=(128, 128))


def test_block_sizes_beyond_the_opt_in_shared_memory_fail_before_the_fast_kernel_is_built(rng, monkeypatch):
    # The fast FA1 twin opts in to dynamic shared memory (about 227 KB on a Hopper GPU), not more.
    from numba_flash.fast import alg1_forward as alg1_forward_fast

    def built(*args, **kwargs):
        raise AssertionError("the kernel was compiled: the SRAM check came too late")

    monkeypatch.setattr(alg1_forward_fast, "alg1_forward_fast_kernel", built)
    q, k, v = qkv(rng, d=64)
    with pytest.raises(
        ValueError, match=r"^block_sizes: tiles .* need \d+ bytes of shared memory at d=64; the device allows"
    ):
        attention_numpy(q, k, v, algorithm="flash1", variant="fast", block_sizes=(1024, 1024))


@pytest.mark.parametrize(
    ("name", "value", "want"),
    [
        ("softmax_scale", np.float32(0.5), 0.5),
        ("softmax_scale", np.float16(0.25), 0.25),
        ("softmax_scale", np.int64(2), 2.0),
        ("softmax_scale", np.array(0.5), 0.5),
        ("softmax_scale", np.array(3, dtype=np.int8), 3.0),
        ("softmax_scale", torch.tensor(0.5), 0.5),
        ("softmax_scale", torch.tensor(2), 2.0),
        ("softmax_scale", Fraction(1, 4), 0.25),
        ("dropout_p", np.float32(0.25), 0.25),
        ("dropout_p", np.array(0.5), 0.5),
        ("dropout_p", torch.tensor(0.125), 0.125),
        ("dropout_p", np.int64(0), 0.0),
        ("seed", np.int64(5), 5),
        ("seed", np.uint32(2**32 - 1), 2**32 - 1),
        ("seed", np.array(7), 7),
        ("seed", torch.tensor(9), 9),
        ("softmax_scale", 2, 2.0),
        ("softmax_scale", 0.5, 0.5),
        ("dropout_p", 0, 0.0),
        ("seed", 5, 5),  # Python's own: the fast path
    ],
)
def test_any_real_scalar_is_accepted_as_softmax_scale_dropout_p_and_seed(rng, name, value, want):
    """Python, NumPy (any width) and 0-d array or tensor scalars are taken as the number they hold."""
    from numba_flash._launch import check_attention_args

    q, k, v = qkv(rng)
    prob = check_attention_args(q, k, v, **{name: value})
    got = {"softmax_scale": prob.softmax_scale, "dropout_p": prob.dropout_p, "seed": prob.seed}[name]
    assert got == want and type(got) is type(want)


# ----------------------------------------------------------------------------------------------
# check_attention_args remembers the checks of torch calls: a remembered answer is the check's answer
# ----------------------------------------------------------------------------------------------
def _torch_qkv(rng, **kw):
    return tuple(torch.from_numpy(x) for x in qkv(rng, **kw))


def test_a_remembered_check_gives_back_the_problem_the_check_gives(rng, monkeypatch):
    from numba_flash import _launch

    monkeypatch.setattr(_launch, "_checked", {})
    q, k, v = _torch_qkv(rng, s_q=5, s_k=7, h=4, h_k=2, d=6)
    first = _launch.check_attention_args(q, k, v, 0.0, None, True, 3)
    assert first == _launch._check_attention_args(q, k, v, 0.0, None, True, 3) and len(_launch._checked) == 1
    assert _launch.check_attention_args(q, k, v, 0.0, None, True, 3) is first
    assert _launch.check_attention_args(q.clone(), k.clone(), v.clone(), 0.0, None, True, 3) is first  # other data
    others = [
        (q.double(), k.double(), v.double(), 0.0, None, True, 3),
        (q[:, :4], k, v, 0.0, None, True, 3),
        (q, k[:, :6], v[:, :6], 0.0, None, True, 3),
        (q, k.repeat(1, 1, 2, 1), v.repeat(1, 1, 2, 1), 0.0, None, True, 3),
        (q, k, v, 0.25, None, True, 3),
        (q, k, v, 0.0, 0.5, True, 3),
        (q, k, v, 0.0, None, False, 3),
        (q, k, v, 0.0, None, True, 4),
        (q, k, v, 0, None, True, 3),
    ]
    for call in others:
        got = _launch.check_attention_args(*call)
        assert got == _launch._check_attention_args(*call)
        assert got is not first
    assert len(_launch._checked) == 1 + len(others)


def test_a_remembered_check_still_refuses_what_the_check_refuses(rng, monkeypatch):
    # True == 1 and hash(True) == hash(1): a memo keyed by the options' values alone would hand causal=1 the problem
    # of causal=True, and softmax_scale=True that of softmax_scale=1, past the check's TypeError.
    from numba_flash import _launch

    monkeypatch.setattr(_launch, "_checked", {})
    q, k, v = _torch_qkv(rng)
    _launch.check_attention_args(q, k, v, 0.0, 1, True, 0)
    with pytest.raises(TypeError, match="^causal must be a bool"):
        _launch.check_attention_args(q, k, v, 0.0, 1, 1, 0)
    with pytest.raises(TypeError, match="^softmax_scale must be a real number"):
        _launch.check_attention_args(q, k, v, 0.0, True, True, 0)
    with pytest.raises(ValueError, match="k has batch size 1 but q has 2"):  # q alone changed: its whole shape is read
        _launch.check_attention_args(torch.cat([q, q]), k, v, 0.0, 1, True, 0)
    with pytest.raises(ValueError, match="must be on the same device, got meta, cpu, cpu"):
        _launch.check_attention_args(q.to("meta"), k, v, 0.0, 1, True, 0)
    with pytest.raises(TypeError, match="must have the same dtype"):
        _launch.check_attention_args(q, k, v.double(), 0.0, 1, True, 0)
    for _ in range(2):
        with pytest.raises(ValueError, match="^softmax_scale must be finite and positive"):
            _launch.check_attention_args(q, k, v, 0.0, math.nan, True, 0)
    assert len(_launch._checked) == 1  # a failed check is not remembered


@pytest.mark.parametrize("case", ["numpy arrays", "parameter", "tensor scale", "numpy seed", "numpy causal"])
def test_calls_with_other_than_tensors_and_python_options_are_always_checked(rng, case):
    from numba_flash import _launch

    arrays = qkv(rng)
    q, k, v = arrays if case == "numpy arrays" else _torch_qkv(rng)
    if case == "parameter":
        q = torch.nn.Parameter(q)
    options = {
        "tensor scale": (0.0, torch.tensor(0.5), False, 0),
        "numpy seed": (0.0, None, False, np.int64(1)),
        "numpy causal": (0.0, None, np.bool_(True), 0),
    }.get(case, (0.0, None, False, 0))
    assert _launch._check_key(q, k, v, *options) is None
    assert _launch._check_key(*_torch_qkv(rng), 0.0, None, False, 0) is not None


def test_the_checks_remembered_are_bounded_oldest_first(rng, monkeypatch):
    from numba_flash import _launch

    monkeypatch.setattr(_launch, "_checked", {})
    monkeypatch.setattr(_launch, "MAX_CHECKED", 2)
    q, k, v = _torch_qkv(rng)
    for seed in (1, 2, 3):
        _launch.check_attention_args(q, k, v, 0.0, None, False, seed)
    assert [key[-1] for key in _launch._checked] == [2, 3]


# ----------------------------------------------------------------------------------------------
# attention_backward_numpy refuses q, k, v, out other than the forward's
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def forward_of(rng):
    """A real (tiny) forward: q, k, v (equal shapes, so swaps type-check), dout, out and stats."""
    q, k, v = qkv(rng, s_q=9, s_k=9, h=2, h_k=2, d=4)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, stats = attention_numpy(q, k, v, causal=True, algorithm="flash1", block_sizes=(8, 8), return_stats=True)
    return q, k, v, dout, out, stats


class ReachedTheKernelsError(Exception):
    pass


@pytest.fixture
def backward_reached(monkeypatch):
    def launched(*args, **kwargs):
        raise ReachedTheKernelsError

    monkeypatch.setattr(_run, "backward", launched)


def one_ulp_up(x, index):
    y = x.copy()
    y[index] = np.nextafter(y[index], np.float32(np.inf))
    return y


@pytest.mark.usefixtures("backward_reached")
@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
@pytest.mark.parametrize("change", ["one element one ulp", "another draw", "swapped"])
def test_backward_refuses_arrays_other_than_the_forwards_and_names_them(rng, forward_of, name, change):
    q, k, v, dout, out, stats = forward_of
    args = {"q": q, "k": k, "v": v, "out": out}
    x = args[name]
    if change == "one element one ulp":  # off the strided sample: only the sums can see it
        args[name] = one_ulp_up(x, (0, 5, 1, 3))
    elif change == "another draw":
        args[name] = rng.standard_normal(x.shape).astype(np.float32)
    else:
        other = {"q": "k", "k": "v", "v": "q", "out": "q"}[name]
        args[name] = args[other]
    with pytest.raises(ValueError, match=rf"^{name} is not .*fingerprint mismatch"):
        attention_backward_numpy(dout, args["q"], args["k"], args["v"], args["out"], stats)


@pytest.mark.usefixtures("backward_reached")
def test_backward_accepts_copies_of_the_forwards_arrays_in_any_layout_or_dtype(forward_of):
    """The fingerprint is of the values: a copy, a Fortran-ordered copy or a float64 copy all pass."""
    q, k, v, dout, out, stats = forward_of
    for conv in (np.copy, np.asfortranarray, lambda x: x.astype(np.float64), lambda x: x[:, ::-1][:, ::-1]):
        with pytest.raises(ReachedTheKernelsError):
            attention_backward_numpy(dout, conv(q), conv(k), conv(v), conv(out), stats)


def test_fingerprint_sees_every_element_and_the_order_of_elements(rng):
    x = rng.standard_normal((2, 33, 3, 8)).astype(np.float32)
    fp = api.fingerprint(x)
    assert api.fingerprint(x.copy()) == fp == api.fingerprint(torch.from_numpy(x))
    for index in np.ndindex(x.shape):  # every element, one ulp up
        assert api.fingerprint(one_ulp_up(x, index)) != fp, index
    y = x.copy()
    y[0, 1, 0, 0], y[0, 1, 0, 1] = x[0, 1, 0, 1], x[0, 1, 0, 0]  # two neighbours swapped: same plain sum
    assert api.fingerprint(y) != fp
    assert api.fingerprint(x.reshape(2, 3, 33, 8)) != fp  # same values, another shape
