"""Launches on torch CUDA tensors without numba's per-launch host work (:mod:`numba_flash.runtime.direct`).

A short sequence's forward is host-bound on an H100/H200; numba's typing, argument marshalling and
``cuda.as_cuda_array`` imports were most of that host time. The direct path builds numba's kernel arguments
from the tensors itself, after numba has launched the kernel once for the same argument key. Claims checked:

* The argument it builds for a tensor is numba's array struct: ``(meminfo, parent, nitems, itemsize, data,
  *shape, *byte strides)``, C strides for a contiguous tensor, the tensor's own otherwise (checked against
  NumPy's view of the same memory).
* The first launch for a key goes through numba; later launches with the same key (any shape) are direct, and
  carry the tensors' pointers, shapes and the scalars as numba's C types.
* What it cannot take goes to numba: an argument that is no CUDA tensor or scalar, a tensor that requires grad,
  an overload whose types differ from those the key implies, and every launch when it is turned off.
* On a GPU, every pass gives bitwise the same results with it as through numba (forward and backward, bf16 and
  float32, causal, dropout, GQA, a strided q), and the second call of a pass is launched by it; and a thread with no
  current CUDA context (torch's autograd worker can be one) launches directly all the same.
"""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

from numba_flash.runtime import backend as _backend
from numba_flash.runtime import direct as _direct

import numpy as np
import pytest
import torch
from numba.cuda import types


def test_c_strides_are_numpys():
    for shape in [(2, 3, 4, 5), (1, 7), (3,), (4, 1, 1, 8)]:
        assert _direct.c_strides(shape, 4) == np.empty(shape, np.float32).strides


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
def test_the_argument_of_a_tensor_is_numbas_array_struct(view):
    t = torch.arange(2 * 6 * 3 * 4, dtype=torch.float32).reshape(2, 6, 3, 4)
    t = {"contiguous": t, "transposed": t.transpose(1, 2), "sliced": t[:, 1:5]}[view]
    a = t.numpy()
    want = (0, 0, a.size, a.itemsize, a.ctypes.data, *a.shape, *a.strides)
    assert _direct.array_struct(t, contiguous=t.is_contiguous()) == want


class StandInDispatcher:
    """Compiles an overload per call of ``_compile_for_args`` with the argument types it is given."""

    def __init__(self, argument_types):
        self.argument_types = argument_types
        self.compiles = 0

    def _compile_for_args(self, *args):
        self.compiles += 1
        cufunc = SimpleNamespace(kernel="the kernel")
        return SimpleNamespace(
            argument_types=self.argument_types, debug=False, _codelibrary=SimpleNamespace(get_cufunc=lambda: cufunc)
        )


@pytest.fixture
def stand_in(monkeypatch):
    """CPU tensors taken as CUDA tensors; cuda.core's launch replaced by a recorder of its arguments."""
    launched = []
    monkeypatch.setattr(_direct, "_is_cuda_tensor", lambda a: isinstance(a, torch.Tensor))
    monkeypatch.setattr(
        _direct,
        "_launch_core",
        lambda: (
            lambda stream, config, kernel, *args: launched.append((config, kernel, args)),
            lambda grid, block, nbytes: (grid, block, nbytes),
            "stream 0",
        ),
    )
    monkeypatch.setattr(_direct, "_entries", {})
    monkeypatch.setattr(_direct, "ENABLED", True)
    monkeypatch.setattr(_backend, "bind_context", lambda device: True)  # no device behind the stand-ins
    return launched


def _values(args):
    return [a.value if isinstance(a, ctypes._SimpleCData) else a for a in args]


def test_the_first_launch_of_a_key_is_numbas_and_later_ones_are_direct(stand_in):
    disp = StandInDispatcher((types.Array(types.float32, 4, "C"), types.float64, types.int64))
    opted = []
    t = torch.zeros(2, 3, 4, 5)
    assert _direct.launch(disp, (1, 2, 1), 128, 1000, (t, 0.5, 7), lambda f, n: opted.append(n)) is False
    assert stand_in == [] and disp.compiles == 1  # numba launches it, and the overload is recorded
    assert _direct.launch(disp, (1, 2, 1), 128, 1000, (t, 0.5, 7), lambda f, n: opted.append(n)) is True
    ((config, kernel, args),) = stand_in
    assert config == ((1, 2, 1), 128, 1000) and kernel == "the kernel" and opted == [1000]
    assert _values(args) == [*_direct.array_struct(t, True), 0.5, 7]
    assert type(args[-2]) is ctypes.c_double and type(args[-1]) is ctypes.c_int64
    u = torch.zeros(1, 9, 2, 5)  # another shape, the same key: direct, with its own sizes
    assert _direct.launch(disp, 3, 64, 0, (u, 1.5, -2), lambda f, n: None) is True
    assert _values(stand_in[-1][2])[2:13] == [90, 4, u.data_ptr(), 1, 9, 2, 5, 360, 40, 20, 4] and disp.compiles == 1


def test_a_strided_tensor_has_its_own_key_and_strides(stand_in):
    disp = StandInDispatcher((types.Array(types.float32, 4, "A"), types.float64, types.int64))
    t = torch.zeros(2, 3, 4, 5).transpose(1, 2)
    assert _direct.launch(disp, 1, 32, 0, (t, 0.5, 7), lambda f, n: None) is False
    assert _direct.launch(disp, 1, 32, 0, (t, 0.5, 7), lambda f, n: None) is True
    assert _values(stand_in[0][2])[9:13] == [240, 20, 80, 4]


def test_what_it_cannot_take_goes_to_numba(stand_in, monkeypatch):
    disp = StandInDispatcher((types.Array(types.float32, 4, "C"), types.float64))
    for args in [
        (np.zeros((1, 1, 1, 1), np.float32), 0.5),
        (torch.zeros(1, 1, 1, 1, requires_grad=True), 0.5),
        (1.0, 2.0),
    ]:
        for _ in range(2):
            assert _direct.launch(disp, 1, 32, 0, args, lambda f, n: None) is False
    wrong = StandInDispatcher((types.Array(types.float32, 4, "A"), types.float64))  # numba typed it otherwise
    for _ in range(3):
        assert _direct.launch(wrong, 1, 32, 0, (torch.zeros(1, 2, 3, 4), 0.5), lambda f, n: None) is False
    monkeypatch.setattr(_direct, "ENABLED", False)
    for _ in range(2):
        assert _direct.launch(disp, 1, 32, 0, (torch.zeros(1, 2, 3, 4), 0.5), lambda f, n: None) is False
    assert stand_in == []


# ----------------------------------------------------------------------------------------------
# On a GPU: the same bits as numba's launch
# ----------------------------------------------------------------------------------------------
def _passes(dtype, d, causal, dropout_p, nheads_k, strided):
    from numba_flash import flash_attn_func

    gen = torch.Generator(device="cuda").manual_seed(1)
    b, n, h = 2, 200, 4
    q = (
        torch.randn(b, h, n, d, device="cuda", generator=gen).to(dtype).transpose(1, 2)
        if strided
        else torch.randn(b, n, h, d, device="cuda", generator=gen).to(dtype)
    )
    k, v, dout = (torch.randn(b, n, hk, d, device="cuda", generator=gen).to(dtype) for hk in (nheads_k, nheads_k, h))
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    out = flash_attn_func(
        q, k, v, dropout_p=dropout_p, causal=causal, seed=5, deterministic=True
    )  # no atomics: bitwise
    out.backward(dout)
    return [x.detach().clone() for x in (out, q.grad, k.grad, v.grad)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(
    "d, causal, dropout_p, nheads_k, strided",
    [(64, False, 0.0, 4, False), (128, True, 0.0, 2, False), (64, True, 0.1, 1, True), (96, False, 0.0, 4, True)],
)
def test_direct_launches_give_numbas_bits(monkeypatch, dtype, d, causal, dropout_p, nheads_k, strided):
    dtype = getattr(torch, dtype)
    direct = []
    real = _direct.launch
    monkeypatch.setattr(_direct, "launch", lambda *a: direct.append(real(*a)) or direct[-1])
    monkeypatch.setattr(_direct, "ENABLED", False)
    via_numba = _passes(dtype, d, causal, dropout_p, nheads_k, strided)
    assert not any(direct)
    monkeypatch.setattr(_direct, "ENABLED", True)
    _passes(dtype, d, causal, dropout_p, nheads_k, strided)  # the first launch of each key: numba's
    first = len(direct)
    for want, got in zip(via_numba, _passes(dtype, d, causal, dropout_p, nheads_k, strided)):
        assert torch.equal(want, got)
    assert any(direct[first:]), "the second call launched nothing directly"


@pytest.mark.gpu
def test_a_thread_with_no_current_context_launches_directly():
    """The first CUDA call of a new thread is a direct launch of a kernel numba launched on another thread: as in
    torch's autograd worker running a backward whose kernels the main thread launched first. Before ``bind_context``
    cuda.core's launch failed there with CUDA_ERROR_INVALID_CONTEXT (``bench.tf32_bwd_sweep``, H100, 2026-11-27)."""
    from numba import cuda

    @cuda.jit
    def add_one(x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1.0

    x = torch.zeros(64, device="cuda")
    assert _direct.launch(add_one, 1, 64, 0, (x,), lambda f, n: None) is False  # the key's first launch: numba's
    add_one[1, 64](x)
    seen = []

    def run():
        try:
            seen.append(_direct.launch(add_one, 1, 64, 0, (x,), lambda f, n: None))
        except Exception as exc:  # reported by the assert below
            seen.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert seen == [True]
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full_like(x, 2.0))
