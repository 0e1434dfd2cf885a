"""Stream order and device: the kernels run on the tensors' GPU, after their inputs and before what comes next.

The kernels launch on CUDA's legacy default stream (numba's stream 0), which is torch's default stream. A
stream made current with ``with torch.cuda.stream(s):`` is a non-blocking stream ordered with it in neither
direction, so every tensor the allocator hands to the kernels makes the legacy stream wait for it first, and
:meth:`numba_flash._launch.Allocator.join_caller_stream` makes it wait for the legacy stream after every pass
(:mod:`numba_flash._run`). In the simulator the logic is checked against a stand-in for ``torch.cuda``; on a
GPU the test queues a read of ``out`` on a side stream while the default stream is held busy.

The device: numba launches in the thread's current CUDA context, torch's current device, so every pass runs
under ``torch.cuda.device(q.device)`` (:meth:`numba_flash._launch.Allocator.device_guard`); on a machine with two
GPUs a call on ``cuda:1`` while device 0 is current must give what the same call gives on ``cuda:0``.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from numba_flash import _launch, _run, attention_backward_numpy, attention_numpy, flash_attn_func

import numpy as np
import pytest
import torch
from attn_testing import make_qkv


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log
        self.cuda_stream = 0 if name == "legacy default" else 1 + len(name)  # the raw handle: 0 for the legacy stream

    def __eq__(self, other):
        return self.name == other.name

    def __hash__(self):
        return hash(self.name)

    def wait_stream(self, other):
        self.log.append((self.name, "waits for", other.name))


class _DeviceGuard:
    def __init__(self, device, log):
        self.device, self.log = device, log

    def __enter__(self):
        self.log.append(("enter device", self.device))

    def __exit__(self, *exc):
        self.log.append(("exit device", self.device))


def _fake_torch(current: str, log: list, default: str = "legacy default"):
    cuda = SimpleNamespace(
        current_stream=lambda device=None: _Stream(current, log),
        default_stream=lambda device=None: _Stream(default, log),
        device=lambda device: _DeviceGuard(device, log),
    )
    return SimpleNamespace(cuda=cuda)


def _torch_cuda_allocator(monkeypatch, current: str, log: list, default: str = "legacy default"):
    """An Allocator of kind torch-cuda built against the stand-in ``torch.cuda`` (CPU tensors otherwise)."""
    monkeypatch.setattr(_launch, "_torch", lambda: _fake_torch(current, log, default))
    like = SimpleNamespace(is_cuda=True, device="cuda:1")
    monkeypatch.setattr(_launch, "_is_torch", lambda x: x is like)
    return _launch.Allocator(like)


def test_on_a_side_stream_each_tensor_handed_to_the_kernels_waits_for_it_and_then_it_waits_for_them(monkeypatch):
    """Every import (a converted input, a filled or empty output) orders the launch stream after the caller's, so
    what torch queued there for the tensor is done first; after the launches the caller's stream waits for them."""
    log = []
    alloc = _torch_cuda_allocator(monkeypatch, "side", log)
    assert alloc.kind == "torch-cuda" and log == []
    for t in ("q", "dq zeros"):
        log.append(("import", alloc._import(t)))  # the tensor itself is the kernel array
    assert log == [
        ("legacy default", "waits for", "side"),
        ("import", "q"),
        ("legacy default", "waits for", "side"),
        ("import", "dq zeros"),
    ]
    alloc.join_caller_stream()
    assert log[4:] == [("side", "waits for", "legacy default")]  # after the launches: out is written


def test_on_torch_default_stream_nothing_is_joined(monkeypatch):
    log = []
    alloc = _torch_cuda_allocator(monkeypatch, "legacy default", log)
    log.append(("import", alloc._import("q")))
    alloc.join_caller_stream()
    assert log == [("import", "q")]


def test_torchs_default_stream_is_not_joined_where_it_is_not_the_legacy_stream(monkeypatch):
    """A torch built with per-thread default streams: the current stream's raw handle is not 0, but it is torch's
    default stream, so nothing is joined (as before the shortcut for handle 0)."""
    log = []
    alloc = _torch_cuda_allocator(monkeypatch, "per-thread default", log, default="per-thread default")
    log.append(("import", alloc._import("q")))
    alloc.join_caller_stream()
    assert log == [("import", "q")]


def test_the_launches_run_under_the_tensors_device_and_the_stream_join_comes_before_leaving_it(monkeypatch):
    log = []
    alloc = _torch_cuda_allocator(monkeypatch, "side", log)
    with alloc.device_guard():
        log.append("launches")
        alloc.join_caller_stream()
    assert log == [
        ("enter device", "cuda:1"),
        "launches",
        ("side", "waits for", "legacy default"),
        ("exit device", "cuda:1"),
    ]


@pytest.mark.parametrize("kind", ["numpy", "torch-cpu", "device"])
def test_arrays_off_torch_cuda_have_no_caller_stream_to_join(monkeypatch, kind):
    alloc = _launch.Allocator(np.zeros((1, 1, 1, 2), np.float32))
    alloc.kind = kind
    monkeypatch.setattr(_launch, "_torch", lambda: pytest.fail("no torch stream or device should be asked for"))
    alloc.join_caller_stream()
    with alloc.device_guard():
        pass


def test_every_pass_runs_under_the_device_guard_and_joins_the_caller_stream_inside_it(rng, monkeypatch):
    """Forward and backward each enter ``device_guard`` once and call ``join_caller_stream`` once, inside it."""
    log = []
    real_join, real_guard = _launch.Allocator.join_caller_stream, _launch.Allocator.device_guard

    def join(self):
        log.append("join")
        return real_join(self)

    @contextlib.contextmanager
    def guard(self):
        log.append("enter")
        with real_guard(self):
            yield
        log.append("exit")

    monkeypatch.setattr(_launch.Allocator, "join_caller_stream", join)
    monkeypatch.setattr(_launch.Allocator, "device_guard", guard)
    q, k, v = make_qkv(rng, 1, 8, 8, 1, 1, 8)
    out, st = attention_numpy(q, k, v, algorithm="flash2", variant="readable", return_stats=True)
    assert log == ["enter", "join", "exit"]
    attention_backward_numpy(np.ones_like(out), q, k, v, out, st)
    assert log == ["enter", "join", "exit"] * 2
    assert _run.forward.__module__ == "numba_flash._run"


@pytest.mark.gpu
@pytest.mark.parametrize("busy", ["side stream: the inputs' producer", "default stream: where the kernels launch"])
@pytest.mark.parametrize(
    ("dtype", "d"), [(torch.float32, 64), (torch.bfloat16, 64), (torch.float16, 63)]
)  # d 63: a float32 copy
def test_a_call_on_a_side_stream_reads_its_inputs_and_hands_back_its_output_in_stream_order(dtype, d, busy):
    """On a side stream, q is written by work still queued behind a sleep, or the default stream (where the
    kernels launch) is held busy; ``out.clone()`` is queued on the side stream at once. Without the joins the
    kernel read q (or, at d = 63, its float32 copy made on the side stream) before it was written, or the clone
    copied ``out`` before the kernel wrote it."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 2048, 16, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    ref = flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    if busy.startswith("default"):
        torch.cuda._sleep(200_000_000)  # on the default stream, about 0.1 s
    with torch.cuda.stream(side):
        if busy.startswith("side"):
            torch.cuda._sleep(200_000_000)
        q_side = q * 1  # written on the side stream, after the sleep when there is one
        out = flash_attn_func(q_side, k, v, causal=True)
        copy = out.clone()
    torch.cuda.synchronize()
    assert torch.equal(copy, ref)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_call_on_the_second_gpu_while_the_first_is_current_gives_the_first_gpus_result():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 512, 4, 64, generator=g) for _ in range(3))
    on0 = flash_attn_func(*(x.to("cuda:0") for x in (q, k, v)), causal=True)
    assert torch.cuda.current_device() == 0
    on1 = flash_attn_func(*(x.to("cuda:1") for x in (q, k, v)), causal=True)
    torch.cuda.synchronize("cuda:1")
    assert on1.device == torch.device("cuda:1")
    assert torch.equal(on1.cpu(), on0.cpu())  # same kernel, same inputs: bit for bit
