"""Stream order: outputs are ready for the work a caller queues next, on whichever torch stream is current.

The kernels launch on CUDA's legacy default stream (numba's stream 0), which is torch's default stream. A
stream made current with ``with torch.cuda.stream(s):`` is a non-blocking stream that does not wait for it,
so :meth:`numba_flash._launch.Allocator.join_caller_stream` makes it wait after every pass
(:mod:`numba_flash._run`). In the simulator the logic is checked against a stand-in for ``torch.cuda``; on a
GPU the test queues a read of ``out`` on a side stream while the default stream is held busy.
"""

from __future__ import annotations

from types import SimpleNamespace

from numba_flash import _launch, _run, attention_backward_numpy, attention_numpy, flash_attn_func

import numpy as np
import pytest
import torch
from attn_testing import make_qkv


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __eq__(self, other):
        return self.name == other.name

    def __hash__(self):
        return hash(self.name)

    def wait_stream(self, other):
        self.log.append((self.name, "waits for", other.name))


def _fake_torch(current: str, log: list):
    cuda = SimpleNamespace(current_stream=lambda device=None: _Stream(current, log),
                           default_stream=lambda device=None: _Stream("legacy default", log))
    return SimpleNamespace(cuda=cuda)


def _torch_cuda_allocator(monkeypatch, current: str, log: list):
    """An Allocator of kind torch-cuda built against the stand-in ``torch.cuda`` (CPU tensors otherwise)."""
    monkeypatch.setattr(_launch, "_torch", lambda: _fake_torch(current, log))
    like = SimpleNamespace(is_cuda=True, device="cuda:0")
    monkeypatch.setattr(_launch, "_is_torch", lambda x: x is like)
    return _launch.Allocator(like)


def test_on_a_side_stream_the_launches_wait_for_it_and_then_it_waits_for_them(monkeypatch):
    log = []
    alloc = _torch_cuda_allocator(monkeypatch, "side", log)
    assert alloc.kind == "torch-cuda"
    assert log == [("legacy default", "waits for", "side")]  # before any launch: the inputs are ready
    alloc.join_caller_stream()
    assert log[1:] == [("side", "waits for", "legacy default")]  # after the launches: out is written


def test_on_torch_default_stream_nothing_is_joined(monkeypatch):
    log = []
    alloc = _torch_cuda_allocator(monkeypatch, "legacy default", log)
    alloc.join_caller_stream()
    assert log == []


@pytest.mark.parametrize("kind", ["numpy", "torch-cpu", "device"])
def test_arrays_off_torch_cuda_have_no_caller_stream_to_join(monkeypatch, kind):
    alloc = _launch.Allocator(np.zeros((1, 1, 1, 2), np.float32))
    alloc.kind = kind
    monkeypatch.setattr(_launch, "_torch", lambda: pytest.fail("no torch stream should be asked for"))
    alloc.join_caller_stream()


def test_every_pass_joins_the_caller_stream_after_its_launches(rng, monkeypatch):
    """Forward and backward both call ``join_caller_stream`` once, after the kernel module returned."""
    calls = []
    real = _launch.Allocator.join_caller_stream

    def spy(self):
        calls.append(self)
        return real(self)

    monkeypatch.setattr(_launch.Allocator, "join_caller_stream", spy)
    q, k, v = make_qkv(rng, 1, 8, 8, 1, 1, 8)
    out, st = attention_numpy(q, k, v, algorithm="flash2", variant="readable", return_stats=True)
    assert len(calls) == 1
    attention_backward_numpy(np.ones_like(out), q, k, v, out, st)
    assert len(calls) == 2
    assert _run.forward.__module__ == "numba_flash._run"


@pytest.mark.gpu
@pytest.mark.parametrize("busy", ["side stream: the inputs' producer", "default stream: where the kernels launch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_call_on_a_side_stream_reads_its_inputs_and_hands_back_its_output_in_stream_order(dtype, busy):
    """On a side stream, q is written by work still queued behind a sleep, or the default stream (where the
    kernels launch) is held busy; ``out.clone()`` is queued on the side stream at once. Without the two joins
    the kernel read q before it was written, or the clone copied ``out`` before the kernel wrote it."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 2048, 16, 64, device="cuda", dtype=dtype, generator=g) for _ in range(3))
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
