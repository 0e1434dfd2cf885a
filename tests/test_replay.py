"""Replaying an eager pass's launches (:mod:`numba_flash.runtime.replay`, on unless ``NUMBA_FLASH_REPLAY=0``).

Claims checked:

* A recording becomes a recipe only when every array a launch takes is one of the call's inputs or one of the
  arrays the call made before it (allocated, or converted from one it allocated), every returned output is one of
  those (or a dtype view of one), and no two of them share memory; otherwise the key is remembered as not
  replayable.
* Replaying a recipe allocates as recorded (empty or filled), writes the new data pointers into a copy of the
  recorded kernel arguments, launches each kernel once and converts, in the recorded order.
* Calls it does not take get no key: off, with dropout, a kernel module that is not ``REPLAYABLE``, CPU tensors;
  the forward's and the backward's keys differ.
* On a GPU, ``flash_attn_func`` gives the same bits with it as without (forward and gradients, bf16 and float32,
  causal, GQA, a strided q, an input at an odd offset, atomic and deterministic dQ), and the second call of a key
  is replayed, the forward's and the backward's.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from numba_flash.runtime import backend as _backend
from numba_flash.runtime import direct as _direct
from numba_flash.runtime import replay as _replay

import pytest
import torch

_LAUNCHED: list = []  # what the stand-in of cuda.core's launch was called with: (stream, config, kernel, args)


def _stand_in_launch(stream, config, kernel, *args):
    _LAUNCHED.append((stream, config, kernel, args))


def _record(allocate, launches, convert=(), packer=None):
    """A recording of one call: ``allocate`` [(shape, dtype, fill)]; ``launches(allocs)`` gives the launches
    [(kernel, [args], [(pos, tensor)])], whose pointer slots name tensors; then ``convert`` [(allocation index,
    dtype)]; ``packer`` recorded with every launch. Returns the recorder and the tensors made (allocations, then
    conversions)."""
    rec = _replay._Recorder()
    made = []
    for shape, dtype, fill in allocate:
        t = torch.empty(shape, dtype=dtype) if fill is None else torch.full(shape, fill, dtype=dtype)
        rec.steps.append(("alloc", t, fill))
        made.append(t)
    for kernel, args, slots in launches(made):
        rec.steps.append(
            (
                "launch",
                _stand_in_launch,
                "stream 0",
                kernel,
                "config",
                list(args),
                [(pos, t.data_ptr()) for pos, t in slots],
                packer,
            )
        )
    for i, dtype in convert:
        made.append(made[i].to(dtype))
        rec.steps.append(("convert", made[i], made[-1]))
    return rec, made


def _inputs():
    return tuple(torch.zeros(2, 8, 2, 4) for _ in range(3))


def test_a_recording_of_inputs_and_allocations_is_a_recipe_with_their_roles():
    q, k, v = _inputs()
    rec, (words, lse, dq, dq16) = _record(
        [((2, 8, 2, 2), torch.int32, None), ((2, 2, 8), torch.float32, 0.0), ((2, 8, 2, 4), torch.float32, 0.0)],
        lambda a: [
            ("kernel", [0, q.data_ptr(), 7, 0, 0.5], [(1, q), (3, a[1])]),
            ("kernel2", [k.data_ptr(), 0, 0], [(0, k), (1, a[0]), (2, a[2])]),
        ],
        convert=[(2, torch.float16)],
    )
    recipe = _replay._recipe(rec, (q, k, v), (words.view(torch.float16), lse, dq16))
    assert [s[:4] for s in recipe.steps if s[0] == "alloc"] == [
        ("alloc", (2, 8, 2, 2), torch.int32, None),
        ("alloc", (2, 2, 8), torch.float32, 0.0),
        ("alloc", (2, 8, 2, 4), torch.float32, 0.0),
    ]
    assert [(s[1].kernel, s[2]) for s in recipe.steps if s[0] == "launch"] == [
        ("kernel", [(1, ("in", 0)), (3, ("made", 1))]),
        ("kernel2", [(0, ("in", 1)), (1, ("made", 0)), (2, ("made", 2))]),
    ]
    assert recipe.steps[-1] == ("convert", 2, torch.float16)  # after the launches, as recorded
    assert recipe.outputs == [(0, torch.float16), (1, None), (3, None)]


@pytest.mark.parametrize(
    "case",
    [
        "unknown pointer",
        "output not made",
        "inputs share memory",
        "no launch",
        "part of an allocation",
        "conversion of a stranger",
    ],
)
def test_what_the_recipe_cannot_redo_makes_no_recipe(case):
    q, k, v = _inputs()
    stranger = torch.zeros(3)
    if case == "inputs share memory":
        k = q
    rec, (out,) = _record(
        [((2, 8, 2, 4), torch.float32, None)],
        lambda a: (
            []
            if case == "no launch"
            else [("kernel", [0, 0], [(0, q), (1, stranger if case == "unknown pointer" else a[0])])]
        ),
    )
    outputs = {"output not made": (stranger,), "part of an allocation": (out[:1],)}.get(case, (out,))
    if case == "conversion of a stranger":
        rec.steps.append(("convert", stranger, stranger.half()))
    assert _replay._recipe(rec, (q, k, v), outputs) is None


def test_a_replay_allocates_as_recorded_launches_with_the_new_pointers_and_converts(monkeypatch):
    monkeypatch.setattr(_replay, "_recipes", {})
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_backend, "bind_context", lambda device: True)  # CPU tensors stand in for CUDA ones
    q, k, v = _inputs()
    rec, (words, stats, dq, dq16) = _record(
        [((2, 8, 2, 2), torch.int32, None), ((2, 2, 8), torch.float32, -1.0), ((2, 8, 2, 4), torch.float32, 0.25)],
        lambda a: [("kernel", [0, 1.5, 0, 0, 0], [(0, q), (2, a[0]), (3, a[1]), (4, a[2])])],
        convert=[(2, torch.float16)],
    )
    _replay._recipes["key"] = _replay._recipe(rec, (q, k, v), (words.view(torch.float16), stats, dq16))
    q2, k2, v2 = _inputs()
    _LAUNCHED.clear()
    out, st, dq2 = _replay.replay("key", (q2, k2, v2))
    assert out.dtype == torch.float16 and out.shape == (2, 8, 2, 4) and torch.equal(st, torch.full((2, 2, 8), -1.0))
    assert dq2.dtype == torch.float16 and torch.equal(dq2, torch.full((2, 8, 2, 4), 0.25, dtype=torch.float16))
    ((stream, config, kernel, args),) = _LAUNCHED
    assert (stream, config, kernel) == ("stream 0", "config", "kernel")
    assert args[:4] == (q2.data_ptr(), 1.5, out.data_ptr(), st.data_ptr())
    assert args[4] not in (dq.data_ptr(), q2.data_ptr(), out.data_ptr(), st.data_ptr())  # the new float32 dQ
    assert out.data_ptr() != words.data_ptr()  # new outputs each call
    assert _replay.replay("another key", (q2, k2, v2)) is None


def test_a_recipe_launches_through_the_packer_where_it_packs_and_else_through_the_recorded_launch(monkeypatch):
    monkeypatch.setattr(_replay, "_recipes", {})
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_backend, "bind_context", lambda device: True)  # CPU tensors stand in for CUDA ones
    packed = []  # (kernelargs, positions) each packer call saw; then the pointers each packed launch got

    def packer(kernelargs, positions):
        packed.append((list(kernelargs), positions))
        return None if kernelargs[1] == "no" else lambda pointers: packed.append(pointers)

    q, k, v = _inputs()
    rec, (out,) = _record(
        [((2, 8, 2, 4), torch.float32, None)],
        lambda a: [
            ("kernel", [q.data_ptr(), "yes", a[0].data_ptr()], [(0, q), (2, a[0])]),
            ("kernel2", [0, "no", k.data_ptr()], [(2, k)]),
        ],
        packer=packer,
    )
    _replay._recipes["key"] = _replay._recipe(rec, (q, k, v), (out,))
    assert packed == [([q.data_ptr(), "yes", out.data_ptr()], [0, 2]), ([0, "no", k.data_ptr()], [2])]
    q2, k2, v2 = _inputs()
    _LAUNCHED.clear()
    (out2,) = _replay.replay("key", (q2, k2, v2))
    assert packed[2] == [q2.data_ptr(), out2.data_ptr()]  # the packed launch, with the new pointers in order
    assert _LAUNCHED == [("stream 0", "config", "kernel2", (0, "no", k2.data_ptr()))]  # the other: as recorded


def _fake_driver(calls, rc=0):
    """Stand-ins of ``cuLaunchKernel`` (appends its arguments to ``calls``, returns ``rc``) and ``cuGetErrorName``."""
    import ctypes

    def launch(*args):
        calls.append(args)
        return rc

    def error_name(code, out):
        out._obj.value = b"CUDA_ERROR_STAND_IN"
        return 0

    return ctypes, launch, error_name


def test_a_packed_launch_passes_the_c_values_cuda_core_would_with_the_new_pointers(monkeypatch):
    # cuda.core's launch passes a Python int (a bool too) as an intptr_t, a float as a double, a ctypes value as its
    # own C type; a packed launch must put the same bytes behind each of cuLaunchKernel's kernelParams.

    calls = []
    ctypes, launch, error_name = _fake_driver(calls)
    monkeypatch.setattr(_direct, "_driver", (launch, error_name))
    monkeypatch.setattr(_direct, "PACKED", True)
    kernelargs = [
        0,
        0,
        96,
        4,
        0x7F0000001000,
        2,
        8,
        2,
        4,
        ctypes.c_int32(-7),
        ctypes.c_float(0.5),
        1.5,
        True,
        ctypes.c_uint64(2**63 + 5),
        0x7F0000002000,
    ]
    kernel, stream = SimpleNamespace(handle=0xABC0), SimpleNamespace(handle=0)
    packed = _direct.packed_launch(kernel, stream, (3, 2), 128, 4096, kernelargs, [4, 14])
    assert packed is not None and packed.kernel is kernel
    packed([0x7F0000009000, 0x7F000000A000])
    packed([0x7F000000B000, 0x7F000000C000])
    assert [c[:9] for c in calls] == [(0xABC0, 3, 2, 1, 128, 1, 1, 4096, 0)] * 2  # grid and block as three dims each
    params = calls[-1][9]
    types = [ctypes.c_int64] * 9 + [
        ctypes.c_int32,
        ctypes.c_float,
        ctypes.c_double,
        ctypes.c_int64,
        ctypes.c_uint64,
        ctypes.c_int64,
    ]
    got = [ctypes.cast(params[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(types)]
    assert got == [0, 0, 96, 4, 0x7F000000B000, 2, 8, 2, 4, -7, 0.5, 1.5, 1, 2**63 + 5, 0x7F000000C000]
    assert kernelargs[4] == 0x7F0000001000 and kernelargs[9].value == -7  # the recorded arguments are left alone


def test_a_failed_packed_launch_raises_with_the_drivers_error_name(monkeypatch):

    ctypes, launch, error_name = _fake_driver([], rc=719)
    monkeypatch.setattr(_direct, "_driver", (launch, error_name))
    monkeypatch.setattr(_direct, "PACKED", True)
    packed = _direct.packed_launch(SimpleNamespace(handle=1), SimpleNamespace(handle=0), 1, 32, 0, [0, 1.0], [0])
    with pytest.raises(RuntimeError, match="cuLaunchKernel.*CUDA_ERROR_STAND_IN.*719"):
        packed([0x1000])


@pytest.mark.parametrize("case", ["off", "no driver", "unknown argument type", "no handle"])
def test_launches_it_cannot_pack_are_not_packed(monkeypatch, case):

    import numpy as np

    ctypes, launch, error_name = _fake_driver([])
    monkeypatch.setattr(_direct, "_driver", False if case == "no driver" else (launch, error_name))
    monkeypatch.setattr(_direct, "PACKED", case != "off")
    args = [0, np.bool_(True)] if case == "unknown argument type" else [0, 1]
    kernel = SimpleNamespace() if case == "no handle" else SimpleNamespace(handle=1)
    assert _direct.packed_launch(kernel, SimpleNamespace(handle=0), 1, 32, 0, args, [0]) is None
    monkeypatch.setattr(_direct, "PACKED", True)
    monkeypatch.setattr(_direct, "_driver", (launch, error_name))
    assert (
        _direct.packed_launch(SimpleNamespace(handle=1), SimpleNamespace(handle=0), 1, 32, 0, [0, 1], [0]) is not None
    )


def test_calls_it_does_not_take_have_no_key(monkeypatch):
    q, k, v = _inputs()
    prob = SimpleNamespace(dropout_p=0.0)
    replayable = SimpleNamespace(module=SimpleNamespace(REPLAYABLE=True), algorithm="flash2", variant="tensorcore")
    monkeypatch.setattr(_replay, "ENABLED", False)
    assert _replay.call_key("forward", prob, (q, k, v), replayable, 0, 0) is None
    monkeypatch.setattr(_replay, "ENABLED", True)
    assert _replay.call_key("forward", prob, (q, k, v), replayable, 0, 0) is None  # CPU tensors
    cuda_like = SimpleNamespace(
        is_cuda=True, dtype=torch.float32, shape=(1,), stride=lambda: (1,), device="cuda:0", data_ptr=lambda: 256
    )
    assert _replay.call_key("forward", SimpleNamespace(dropout_p=0.1), (cuda_like,), replayable, 0, 0) is None
    assert _replay.call_key("forward", prob, (cuda_like,), SimpleNamespace(module=SimpleNamespace()), 0, 0) is None
    forward = _replay.call_key("forward", prob, (cuda_like,), replayable, 0, 0)
    assert forward is not None and forward != _replay.call_key("backward", prob, (cuda_like,), replayable, 0, 0)


def test_recording_context_records_only_a_new_key(monkeypatch):
    monkeypatch.setattr(_replay, "_recipes", {"seen": None})
    with _replay.recording("seen"):
        assert _replay.active() is None
    with _replay.recording(None):
        assert _replay.active() is None
    q, k, v = _inputs()
    with _replay.recording("new") as recording:
        assert _replay.active() is not None
        recording.finish((q, k, v), ())
    assert _replay.active() is None and _replay._recipes["new"] is None  # nothing launched: not replayable
    with _replay.recording("numba's first launch") as recording:
        _replay.numba_launched()
        recording.finish((q, k, v), ())
    assert "numba's first launch" not in _replay._recipes  # recorded again on the next call
    monkeypatch.setattr(_replay, "MAX_RECIPES", 2)
    for key in ("a", "b"):
        with _replay.recording(key) as recording:
            recording.finish((q, k, v), ())
    assert list(_replay._recipes) == ["a", "b"]  # the oldest ("seen", then "new") dropped first


# ----------------------------------------------------------------------------------------------
# On a GPU: the same bits as the normal path
# ----------------------------------------------------------------------------------------------
def _calls(dtype, d, causal, nheads_k, layout, n_calls, deterministic=True):
    """``n_calls`` training calls and a no-grad forward on the same inputs: per call [O, L, O without grad, dQ, dK, dV]
    and, last, (q, k, v, dO)."""
    from numba_flash import flash_attn_func

    gen = torch.Generator(device="cuda").manual_seed(3)
    b, n, h = 2, 200, 4
    if layout == "strided":
        q = torch.randn(b, h, n, d, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    elif layout == "odd offset":  # 16-byte rows no longer: the register path, a key of its own
        q = torch.randn(b * n * h * d + 1, device="cuda", generator=gen).to(dtype)[1:].view(b, n, h, d)
    else:
        q = torch.randn(b, n, h, d, device="cuda", generator=gen).to(dtype)
    k, v, dout = (torch.randn(b, n, hk, d, device="cuda", generator=gen).to(dtype) for hk in (nheads_k, nheads_k, h))
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    results = []
    for _ in range(n_calls):
        for x in (q, k, v):
            x.grad = None
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, deterministic=deterministic)
        out.backward(dout)
        with torch.no_grad():
            plain = flash_attn_func(q, k, v, causal=causal)
        results.append([x.detach().clone() for x in (out, lse, plain, q.grad, k.grad, v.grad)])
    return results, (q, k, v, dout)


def _counting_replays(monkeypatch):
    """Replay on, no recipes yet; the list of what each :func:`_replay.replay` call returned, by pass."""
    monkeypatch.setattr(_replay, "ENABLED", True)
    monkeypatch.setattr(_replay, "_recipes", {})
    replays = []
    real = _replay.replay
    monkeypatch.setattr(
        _replay, "replay", lambda key, inputs: replays.append((key[0], real(key, inputs))) or replays[-1][1]
    )
    return replays


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(
    "d, causal, nheads_k, layout",
    [
        (64, False, 4, "contiguous"),
        (128, True, 2, "contiguous"),
        (64, True, 1, "strided"),
        (96, False, 4, "odd offset"),
    ],
)
def test_replayed_calls_give_the_normal_paths_bits(monkeypatch, dtype, d, causal, nheads_k, layout):
    dtype = getattr(torch, dtype)
    monkeypatch.setattr(_replay, "ENABLED", False)
    (want,), _ = _calls(dtype, d, causal, nheads_k, layout, 1)
    replays = _counting_replays(monkeypatch)
    got_calls, _ = _calls(dtype, d, causal, nheads_k, layout, 3)
    for got in got_calls:
        for name, a, b in zip(("O", "L", "O (no grad)", "dQ", "dK", "dV"), got, want):
            assert torch.equal(a, b), name
    # a half q at an odd element offset is copied to whole words by the normal path: no recipe, never replayed
    copied = layout == "odd offset" and dtype != torch.float32
    for pass_name in ("forward", "backward"):
        assert any(r is not None for p, r in replays if p == pass_name) != copied, pass_name
    assert all((recipe is None) == copied for recipe in _replay._recipes.values())
    assert {key[0] for key in _replay._recipes} == {"forward", "backward"}
    # every replayed launch is a packed one (cuLaunchKernel on arguments converted once), not cuda.core's per call

    launchers = [
        step[1]
        for recipe in _replay._recipes.values()
        if recipe is not None
        for step in recipe.steps
        if step[0] == "launch"
    ]
    assert bool(launchers) != copied
    assert all(isinstance(launcher, _direct.PackedLaunch) == _direct.PACKED for launcher in launchers)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_replayed_atomic_backward_keeps_dk_dv_bits_and_dq_within_the_rule(monkeypatch, dtype):
    # dQ by atomic adds is not bitwise reproducible (the order of the adds varies); O, L, dK, dV are. The replayed
    # dQ (a zeroed float32 array, the atomic adds, the conversion to bf16) is held to the backward's 3x rule.
    from attn_testing import assert_error_rule, torch_attention_grads

    dtype = getattr(torch, dtype)
    monkeypatch.setattr(_replay, "ENABLED", False)
    (want,), _ = _calls(dtype, 64, True, 2, "contiguous", 1, deterministic=False)
    replays = _counting_replays(monkeypatch)
    got_calls, (q, k, v, dout) = _calls(dtype, 64, True, 2, "contiguous", 3, deterministic=False)
    assert any(r is not None for p, r in replays if p == "backward")
    grads = {dt: torch_attention_grads((q, k, v), dout, True, 0.0, 0, dt)[0] for dt in (torch.float64, dtype)}
    for got in got_calls:
        for name, a, b in zip(("O", "L", "O (no grad)", "dK", "dV"), got[:3] + got[4:], want[:3] + want[4:]):
            assert torch.equal(a, b), name
        assert_error_rule(got[3].double().cpu().numpy(), grads[torch.float64], grads[dtype], mult=3.0, what="dQ")
