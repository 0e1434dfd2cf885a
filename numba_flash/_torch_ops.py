"""``flash_attn_func``'s two passes as torch custom operators, so that ``torch.compile`` can trace them.

flash-attn registers its CUDA functions with ``torch.library``; this module does the same for the
Numba kernels. Dynamo cannot run a Numba launch on the fake tensors it traces with, but it can put
an opaque operator in the graph once it knows the operator's output shapes and dtypes:

* ``torch.ops.numba_flash.attention_forward(q, k, v, ...) -> (out, lse, m, l)``: one forward pass.
  ``out`` is in q's dtype; ``lse`` (b, h, s_q), the row max ``m`` and row sum ``l`` (b, h, s_q) are
  float32. Every algorithm's backward reads ``m`` and ``l`` (FA2's too: ``exp(S - L)`` with the rounded
  ``L`` breaks the gradient rule for sharp softmaxes, ``docs/backward.rst``, "Large logits").
* ``torch.ops.numba_flash.attention_backward(dout, q, k, v, out, lse, m, l, ...) -> (dq, dk, dv)``:
  the gradients, each in the dtype of its input, dk and dv summed over each GQA group.

Each has a fake implementation (``register_fake``: shapes and dtypes only, for tracing) and the
forward has its autograd formula (``register_autograd``): it saves q, k, v, out, lse, m and l
(O(N) per head), never S or P, and its backward calls ``attention_backward``.

Custom operators take only tensors and simple types, so the options of ``flash_attn_func`` travel
as plain values, already checked and resolved by :func:`numba_flash.api.flash_attn_func`:
``dropout_p`` and ``softmax_scale`` as floats (the scale already 1/sqrt(d) when it was None),
``seed`` as an int, ``algorithm`` and ``forward_variant`` / ``backward_variant`` as strings (from
:func:`numba_flash.registry.pair_variants`: they may be ``"auto"``, which the op resolves on the
device when it runs; the device query cannot be traced by Dynamo), ``block_sizes`` as two ints ``br, bc`` (0, 0 for the
kernel's own choice), ``deterministic`` as a bool. The forward takes the backward's options too
(``backward_variant``, ``deterministic``) only so that its autograd formula can pass them on.

Eager calls (not traced by ``torch.compile``) run the same two functions, :func:`forward_pass` and
:func:`backward_pass`, through :class:`EagerAttention`, a ``torch.autograd.Function``: the custom operators'
dispatch costs more host time than a short sequence's kernel (:func:`run_forward` chooses). They skip only the
functions' first line, the argument check, which ``flash_attn_func`` has made already (its ``Problem`` is passed on).

This module imports torch, so it is imported on the first call of ``flash_attn_func`` (importing
:mod:`numba_flash` or :mod:`numba_flash.api` needs no torch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _run, registry
from ._launch import Allocator, ForwardOutput, check_attention_args, check_backward_args, poisoning, streams_to_join
from .runtime import replay as _replay


def _block_sizes(br: int, bc: int):
    return None if br == 0 and bc == 0 else (br, bc)


# [doc:torch-custom-ops]
def forward_pass(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    seed: int,
    algorithm: str,
    forward_variant: str,
    backward_variant: str,
    br: int,
    bc: int,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One forward pass: ``(out, lse, m, l)`` (see the module docstring)."""
    prob = check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed)
    return _forward(prob, q, k, v, algorithm, forward_variant, br, bc)


def _replay_key(replayable, pass_name, prob, inputs, kernel, *options):
    """The :mod:`numba_flash.runtime.replay` key of an eager pass (``replayable``), or None where the normal path
    runs."""
    if not replayable or poisoning():
        return None
    key = _replay.call_key(pass_name, prob, inputs, kernel, *options)
    if key is not None and streams_to_join(inputs[0].device) is not None:
        return None  # Dev: a side stream to join: the normal path orders it, a replay would not
    return key


def _replayed_or_run(key, inputs, run):
    """``run()``'s outputs: replayed where ``key`` has a recipe, else run (and recorded where ``key`` is new)."""
    if key is not None:
        replayed = _replay.replay(key, inputs)
        if replayed is not None:
            return replayed
    with _replay.recording(key) as recording:
        outputs = run()
        recording.finish(inputs, outputs)
    return outputs


def _forward(prob, q, k, v, algorithm, forward_variant, br, bc, replayable=False):
    """:func:`forward_pass` on arguments already checked into ``prob`` (an eager call's, checked by
    ``flash_attn_func``). ``replayable``: an eager call, which :mod:`numba_flash.runtime.replay` may record and
    replay."""
    kernel = registry.resolve(algorithm, "forward", forward_variant, prob)

    def run():
        alloc = Allocator(q)
        fwd = _run.forward(q, k, v, prob, kernel, _block_sizes(br, bc), alloc)
        out, lse = alloc.result(fwd.out, q.dtype), alloc.result(fwd.lse)
        if fwd.m is None or fwd.l is None:  # pragma: no cover - a kernel module broke its contract
            raise RuntimeError(f"the {kernel.path} forward returned no m, l; every forward must (KernelModule)")
        return out, lse, alloc.result(fwd.m), alloc.result(fwd.l)

    return _replayed_or_run(_replay_key(replayable, "forward", prob, (q, k, v), kernel, br, bc), (q, k, v), run)


attention_forward = torch.library.custom_op("numba_flash::attention_forward", mutates_args=())(forward_pass)


@attention_forward.register_fake
def _attention_forward_fake(
    q, k, v, dropout_p, softmax_scale, causal, seed, algorithm, forward_variant, backward_variant, br, bc, deterministic
):
    b, s_q, h, d = q.shape
    out = q.new_empty((b, s_q, h, d))
    lse = q.new_empty((b, h, s_q), dtype=torch.float32)
    m = q.new_empty((b, h, s_q), dtype=torch.float32)
    l = q.new_empty((b, h, s_q), dtype=torch.float32)
    return out, lse, m, l


def backward_pass(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    m: Tensor,
    l: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    seed: int,
    algorithm: str,
    backward_variant: str,
    br: int,
    bc: int,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """One backward pass: ``(dq, dk, dv)`` from the forward's saved tensors (see the module docstring)."""
    prob = check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed)
    return _backward_checked(prob, dout, q, k, v, out, lse, m, l, algorithm, backward_variant, br, bc, deterministic)


def _backward_checked(
    prob, dout, q, k, v, out, lse, m, l, algorithm, backward_variant, br, bc, deterministic, replayable=False
):
    """:func:`backward_pass` with q, k, v and the options already checked into ``prob`` (by the forward).
    ``replayable``: an eager call's backward, which :mod:`numba_flash.runtime.replay` may record and replay."""
    check_backward_args(dout, out, prob, q)
    kernel = registry.resolve(algorithm, "backward", backward_variant, prob)

    def run():
        alloc = Allocator(q)
        fwd = ForwardOutput(out=None, lse=alloc.to_kernel(lse), m=alloc.to_kernel(m), l=alloc.to_kernel(l))
        dq, dk, dv = _run.backward(dout, q, k, v, out, fwd, prob, kernel, _block_sizes(br, bc), deterministic, alloc)
        return alloc.result(dq, q.dtype), alloc.result(dk, k.dtype), alloc.result(dv, v.dtype)

    inputs = (dout, q, k, v, out, lse, m, l)
    key = _replay_key(replayable, "backward", prob, inputs, kernel, br, bc, deterministic)
    return _replayed_or_run(key, inputs, run)


attention_backward = torch.library.custom_op("numba_flash::attention_backward", mutates_args=())(backward_pass)


@attention_backward.register_fake
def _attention_backward_fake(
    dout,
    q,
    k,
    v,
    out,
    lse,
    m,
    l,
    dropout_p,
    softmax_scale,
    causal,
    seed,
    algorithm,
    backward_variant,
    br,
    bc,
    deterministic,
):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, dropout_p, softmax_scale, causal, seed, algorithm, _fv, backward_variant, br, bc, deterministic = inputs
    out, lse, m, l = output
    # What the backward needs: q, k, v, out and O(N) statistics per head; never S or P.
    ctx.save_for_backward(q, k, v, out, lse, m, l)
    ctx.options = (dropout_p, softmax_scale, causal, seed, algorithm, backward_variant, br, bc, deterministic)
    ctx.mark_non_differentiable(lse, m, l)


def _input_gradients(dq, dk, dv):
    """The forward's 13 input gradients: dq, dk, dv for q, k, v; None for the options."""
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


def _refuse_double_backward() -> None:
    """At the first backward with ``create_graph=True`` (grad mode on inside it): a double backward would need the
    backward's own derivative, which no kernel computes. Saying so here beats torch's error at the second one."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "flash_attn_func: double backward is not supported (backward with create_graph=True, "
            "e.g. for a gradient penalty or a Hessian-vector product); its backward is not differentiable"
        )


def _backward(ctx, dout, _dlse, _dm, _dl):
    _refuse_double_backward()
    return _input_gradients(*attention_backward(dout, *ctx.saved_tensors, *ctx.options))


attention_forward.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The same two passes for eager calls: ``EagerAttention.apply(prob, q, k, v, *options) -> (out, lse, m, l)``.

    The custom operators are what ``torch.compile`` traces; called eagerly, their dispatch and autograd wrapper
    cost more host time than a short sequence's kernel (0.1-0.2 ms a training call on an H200's host, the
    performance log's section "Host path: eager calls through an autograd.Function"). This Function runs what
    :func:`forward_pass` and :func:`backward_pass` run after their argument check (``_forward``, ``_backward_checked``)
    with the same saved tensors (``_setup_context``), so an eager
    call and a compiled one give the same bits (``tests/test_torch_compile.py``). ``prob`` is the
    :class:`~numba_flash._launch.Problem` ``flash_attn_func`` checked the arguments into: neither pass checks them
    again (each check is 9-12 us of host time).
    """

    @staticmethod
    def forward(ctx, prob, q, k, v, *options):
        algorithm, forward_variant, br, bc = options[4], options[5], options[7], options[8]
        outputs = _forward(prob, q, k, v, algorithm, forward_variant, br, bc, replayable=True)
        _setup_context(ctx, (q, k, v, *options), outputs)
        ctx.prob = prob
        # Dev: lse, m, l are non-differentiable outputs; with materialized gradients autograd would allocate and
        # fill three (b, h, N) zero tensors on every backward only for them to be ignored (3 fill kernels and
        # 30-60 us of host time on the backward's path, bench.host_layers --timeline). Their gradients arrive as None.
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx, dout, _dlse, _dm, _dl):
        _refuse_double_backward()  # (instead of once_differentiable, whose error comes only at the second backward)
        if dout is None:  # Dev: no gradient reached out (set_materialize_grads(False)): q, k, v get none from it
            return None, *_input_gradients(None, None, None)
        *_, algorithm, backward_variant, br, bc, deterministic = ctx.options
        grads = _backward_checked(
            ctx.prob, dout, *ctx.saved_tensors, algorithm, backward_variant, br, bc, deterministic, replayable=True
        )
        return None, *_input_gradients(*grads)  # None for prob


def run_forward(*args, prob=None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``flash_attn_func``'s forward: the custom operator while ``torch.compile`` traces, else :class:`EagerAttention`
    (or the forward function alone where no input needs a gradient). ``prob``: the arguments as
    :func:`~numba_flash._launch.check_attention_args` checked them (checked here when not given)."""
    if torch.compiler.is_compiling():
        return attention_forward(*args)
    q, k, v, dropout_p, softmax_scale, causal, seed, algorithm, forward_variant, _bv, br, bc, _det = args
    if prob is None:
        prob = check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return EagerAttention.apply(prob, *args)
    return _forward(prob, q, k, v, algorithm, forward_variant, br, bc, replayable=True)


# [/doc:torch-custom-ops]
