"""``flash_attn_func`` works under ``torch.compile``: its passes are torch custom operators.

Dynamo traces with fake tensors, which a Numba launch cannot read; like flash-attn, numba-flash
registers its forward and backward with ``torch.library`` (:mod:`numba_flash._torch_ops`), with
fake implementations for shapes and dtypes and an autograd formula. Checked here: a compiled
function gives bit for bit the output, logsumexp and gradients of the eager one (``backend="eager"``
runs Dynamo alone, ``"aot_eager"`` also AOTAutograd's joint forward/backward graph), in one graph
(``fullgraph=True``); ``torch.library.opcheck`` passes on both operators; importing the API
needs no torch; eager calls skip the operators' dispatch but run their functions, to the same bits. Shapes are tiny
(the simulator runs every kernel call).
"""

from __future__ import annotations

import subprocess
import sys

from numba_flash import flash_attn_func

import numpy as np
import pytest
from attn_testing import make_qkv

torch = pytest.importorskip("torch")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(rng, b=1, s_q=7, s_k=10, h=2, h_k=1, d=4):
    q, k, v = (torch.from_numpy(x).to(DEVICE).requires_grad_(True) for x in make_qkv(rng, b, s_q, s_k, h, h_k, d))
    g = torch.from_numpy(rng.standard_normal((b, s_q, h, d)).astype(np.float32)).to(DEVICE)
    return q, k, v, g


def loss_fn(algorithm, **opts):
    def f(q, k, v, g):
        out, lse, s_dmask = flash_attn_func(
            q, k, v, 0.2, causal=True, return_attn_probs=True, algorithm=algorithm, seed=7, block_sizes=(4, 4), **opts
        )
        return (out * g).sum(), out, lse

    return f


def run(f, q, k, v, g):
    loss, out, lse = f(q, k, v, g)
    grads = torch.autograd.grad(loss, (q, k, v))
    return out.detach(), lse, grads


# "aot_eager" runs Dynamo, then AOTAutograd's joint graph; "eager" runs Dynamo alone (flash2 only: the
# standard path is the slowest in the simulator, and both backends trace the same operators).
@pytest.mark.parametrize(
    ("algorithm", "backend"),
    [("flash2", "eager"), ("flash2", "aot_eager"), ("flash1", "aot_eager"), ("standard", "aot_eager")],
)
def test_compiled_function_gives_the_eager_output_and_gradients(rng, backend, algorithm):
    """Causal, dropout, GQA, s_q != s_k, return_attn_probs: the compiled graph calls the same kernels."""
    q, k, v, g = inputs(rng)
    f = loss_fn(algorithm)
    want = run(f, q, k, v, g)
    torch._dynamo.reset()
    got = run(torch.compile(f, backend=backend, fullgraph=True), q, k, v, g)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not got[1].requires_grad  # the logsumexp is not differentiable, as in eager
    for a, b in zip(got[2], want[2]):
        assert torch.equal(a, b)


def test_compiled_deterministic_readable_backward_matches_eager(rng):
    """The options reach the backward operator: variant and deterministic travel through the graph."""
    q, k, v, g = inputs(rng)
    f = loss_fn("flash2", variant="readable", deterministic=True)
    want = run(f, q, k, v, g)
    torch._dynamo.reset()
    got = run(torch.compile(f, backend="aot_eager", fullgraph=True), q, k, v, g)
    for a, b in zip(got[2], want[2]):
        assert torch.equal(a, b)


def test_compiled_call_without_a_seed_uses_one_seed_for_forward_and_backward(rng):
    """seed=None with dropout: the seed is drawn eagerly (a graph break) from torch's generator, as in
    eager mode, so the same generator state gives the same mask in both passes."""
    q, k, v, g = inputs(rng)

    def f(q, k, v, g):
        return (flash_attn_func(q, k, v, 0.3, algorithm="flash2", block_sizes=(4, 4)) * g).sum()

    torch.manual_seed(123)
    want = torch.autograd.grad(f(q, k, v, g), (q, k, v))
    torch._dynamo.reset()
    torch.manual_seed(123)
    got = torch.autograd.grad(torch.compile(f, backend="aot_eager")(q, k, v, g), (q, k, v))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])  # an FA1 and an FA2 pair of operators
def test_opcheck_passes_on_the_forward_and_backward_operators(rng, algorithm):
    from numba_flash import _torch_ops

    q, k, v, g = inputs(rng, s_q=5, s_k=6, d=3)
    opts = (0.2, 0.5, True, 3, algorithm, "readable", "readable", 4, 4, False)
    torch.library.opcheck(torch.ops.numba_flash.attention_forward.default, (q, k, v, *opts))
    out, lse, m, l = _torch_ops.attention_forward(q, k, v, *opts)
    assert m.shape == l.shape == (1, 2, 5)  # every forward saves m and l for its backward
    bwd = (
        g,
        q.detach(),
        k.detach(),
        v.detach(),
        out.detach(),
        lse,
        m,
        l,
        0.2,
        0.5,
        True,
        3,
        algorithm,
        "readable",
        4,
        4,
        False,
    )
    torch.library.opcheck(torch.ops.numba_flash.attention_backward.default, bwd)


def test_eager_calls_run_the_operators_passes_without_their_dispatch(rng, monkeypatch):
    """Eager calls go through ``EagerAttention`` (cheaper on the host than the custom operators' dispatch), which
    runs the operators' own forward and backward functions: the same outputs and gradients, bit for bit, and the
    same non-differentiable statistics."""
    from numba_flash import _torch_ops

    q, k, v, g = inputs(rng)
    opts = (0.2, 0.5, True, 7, "flash2", "auto", "auto", 4, 4, True)  # deterministic: no atomics on a GPU
    want = _torch_ops.attention_forward(q, k, v, *opts)
    want_grads = torch.autograd.grad((want[0] * g).sum(), (q, k, v))
    for name in ("attention_forward", "attention_backward"):
        monkeypatch.setattr(_torch_ops, name, lambda *a, name=name: pytest.fail(f"an eager call went through {name}"))
    got = _torch_ops.run_forward(q, k, v, *opts)
    assert got[0].requires_grad and not any(x.requires_grad for x in got[1:])
    got_grads = torch.autograd.grad((got[0] * g).sum(), (q, k, v))
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        assert torch.equal(a, b)
    with torch.no_grad():  # no graph to record: the forward function alone
        assert torch.equal(_torch_ops.run_forward(q, k, v, *opts)[0], want[0])


def test_an_eager_training_call_checks_its_arguments_once(rng, monkeypatch):
    """``flash_attn_func`` checks q, k, v and the options once; its eager forward and backward take the checked
    ``Problem`` instead of checking again (each check is 9-12 us of a short call's host time), and the backward still
    checks what it adds (dout, out)."""
    from numba_flash import _launch, _torch_ops, api

    calls = []

    def counted(name, real):
        return lambda *a, **kw: calls.append(name) or real(*a, **kw)

    monkeypatch.setattr(api, "check_attention_args", counted("api", _launch.check_attention_args))
    monkeypatch.setattr(_torch_ops, "check_attention_args", counted("op", _launch.check_attention_args))
    monkeypatch.setattr(_torch_ops, "check_backward_args", counted("backward", _launch.check_backward_args))
    q, k, v, g = inputs(rng)
    out = flash_attn_func(q, k, v, causal=True, algorithm="flash2", block_sizes=(4, 4))
    (out * g).sum().backward()
    assert calls == ["api", "backward"]


def test_an_eager_backward_gets_no_zero_gradients_for_the_statistics(rng, monkeypatch):
    """lse, m and l are non-differentiable outputs: autograd hands the eager backward None for them rather than three
    (b, h, N) zero tensors it would allocate and fill on every training step (``set_materialize_grads(False)``),
    and the gradients of q, k, v are those of the custom operators' path."""
    from numba_flash import _torch_ops

    seen = []
    real = _torch_ops.EagerAttention.backward

    def spy(ctx, dout, dlse, dm, dl):
        seen.append((dout, dlse, dm, dl))
        return real(ctx, dout, dlse, dm, dl)

    monkeypatch.setattr(_torch_ops.EagerAttention, "backward", staticmethod(spy))
    q, k, v, g = inputs(rng)
    opts = (0.0, 0.5, True, 0, "flash2", "auto", "auto", 4, 4, True)
    want_grads = torch.autograd.grad((_torch_ops.attention_forward(q, k, v, *opts)[0] * g).sum(), (q, k, v))
    got_grads = torch.autograd.grad((_torch_ops.run_forward(q, k, v, *opts)[0] * g).sum(), (q, k, v))
    assert len(seen) == 1 and seen[0][0] is not None and seen[0][1:] == (None, None, None)
    for a, b in zip(got_grads, want_grads):
        assert torch.equal(a, b)


def test_importing_the_api_does_not_import_torch():
    code = "import sys, numba_flash.api; assert 'torch' not in sys.modules, 'torch was imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
