"""Host time of ``flash_attn_func``'s layers above the kernel module: what a short sequence pays before a launch.

Why it exists: at N = 1k on an H100 the bf16 forward kernel takes 0.70 ms, but one ``flash_attn_func`` call
costs 1.15-1.32 ms of host time, against 0.44-0.58 ms for the kernel module's own ``forward`` on arrays
converted once (``docs/results/sweeps/short_seq_probe_h100.txt``, last in the tree at e0e5a9b). This tool splits the
layers above the module, which are plain Python and torch and so can be measured on any machine, without a GPU:

* ``dispatch``: one call of a torch custom operator with ``flash_attn_func``'s signature (13 arguments, 4
  outputs, a fake and an autograd formula registered, the body only allocating its outputs), against a
  ``torch.autograd.Function`` with the same body, and the body alone; with inputs that require grad and without.
* ``api``: ``flash_attn_func`` on the tool's inputs (b 2, N 64, h 4, d 64) with the kernel module replaced by a
  stub (``numba_flash._run.forward`` patched) that converts q, k, v as ``_run.forward`` does and returns
  preallocated outputs: the argument checks, the registry's choice, the eager ``autograd.Function`` (with inputs
  that require grad; since 2026-11-26 eager calls no longer go through the custom operator, which
  ``torch.compile`` traces), the allocator's conversions and results, no plan and no launch. On CPU tensors this is the
  simulator's path (the conversions copy); on a GPU, CUDA tensors (the conversions are ``cuda.as_cuda_array``).

Each line is the median over ``--repeats`` loops of ``--calls`` back-to-back calls, in microseconds per call.
Run from the repository root (any machine)::

    python -m bench.host_overhead [--calls 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform

from bench import common as bu


def _per_call_us(fn, calls: int, repeats: int) -> float:
    return bu.host_us_per_call(fn, calls, repeats, warmup=min(calls, 200))


def dispatch(torch, calls: int, repeats: int) -> list[str]:
    """The ``dispatch`` lines of the module docstring."""

    def body(q):
        return torch.empty_like(q), q.new_empty(q.shape[:3]), q.new_empty(q.shape[:3]), q.new_empty(q.shape[:3])

    # The schema is spelled out: this module's annotations are strings (``from __future__ import annotations``),
    # which torch cannot resolve for a function defined inside another.
    schema = (
        "(Tensor q, Tensor k, Tensor v, float dropout_p, float softmax_scale, bool causal, int seed, str algorithm, "
        "str forward_variant, str backward_variant, int br, int bc, bool deterministic) -> (Tensor, Tensor, Tensor, "
        "Tensor)"
    )

    @torch.library.custom_op("numba_flash_bench::noop_forward", mutates_args=(), schema=schema)
    def noop(
        q,
        k,
        v,
        dropout_p,
        softmax_scale,
        causal,
        seed,
        algorithm,
        forward_variant,
        backward_variant,
        br,
        bc,
        deterministic,
    ):
        return body(q)

    @noop.register_fake
    def _noop_fake(q, *rest):
        return body(q)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3], output[0])
        ctx.mark_non_differentiable(*output[1:])

    def backward(ctx, *grads):
        return (None,) * 13

    noop.register_autograd(backward, setup_context=setup_context)

    class NoopFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, *options):
            out = body(q)
            ctx.save_for_backward(q, k, v, out[0])
            ctx.mark_non_differentiable(*out[1:])
            return out

        @staticmethod
        def backward(ctx, *grads):
            return (None,) * 13

    options = (0.0, 0.125, False, 0, "flash2", "auto", "auto", 0, 0, False)
    lines = []
    for grad in (True, False):
        q, k, v = (torch.randn(1, 64, 2, 64, requires_grad=grad) for _ in range(3))
        for name, fn in (
            ("custom op", noop),
            ("autograd.Function", NoopFunction.apply),
            ("body alone", lambda q, *a: body(q)),
        ):
            us = _per_call_us(lambda fn=fn: fn(q, k, v, *options), calls, repeats)  # noqa: B023
            lines.append(f"dispatch  {name:18} inputs requires_grad={grad!s:5}  {us:7.1f} us/call")
    return lines


def api(torch, calls: int, repeats: int) -> list[str]:
    """The ``api`` lines of the module docstring."""
    from numba_flash import _run, flash_attn_func
    from numba_flash._launch import ForwardOutput

    import numpy as np

    device = "cuda" if bu.ON_GPU else "cpu"
    b, n, h = 2, 64, 4
    lines = []
    real = _run.forward
    try:
        for dtype, d in ((torch.bfloat16, 64), (torch.float32, 64)):
            outs = {}

            def stub(q, k, v, prob, kernel, block_sizes, alloc, outs=outs, d=d, half=dtype != torch.float32):
                to_kernel = _run._converter(kernel, prob, alloc)  # the conversions _run.forward makes, then no module
                for x in (q, k, v):
                    to_kernel(x)
                if "fwd" not in outs:  # the outputs of the first call, handed back by every call after it
                    o = alloc.empty((b, n, h, d // 2), dtype=np.int32) if half else alloc.empty((b, n, h, d))
                    outs["fwd"] = ForwardOutput(
                        out=o, lse=alloc.empty((b, h, n)), m=alloc.empty((b, h, n)), l=alloc.empty((b, h, n))
                    )
                return outs["fwd"]

            _run.forward = stub
            for grad in (False, True):
                q, k, v = (torch.randn(b, n, h, d, device=device, dtype=dtype, requires_grad=grad) for _ in range(3))
                us = _per_call_us(lambda q=q, k=k, v=v: flash_attn_func(q, k, v), calls, repeats)
                lines.append(
                    f"api       flash_attn_func minus the kernel module, {str(dtype)[6:]:8} on {device}, "
                    f"requires_grad={grad!s:5}  {us:7.1f} us/call"
                )
    finally:
        _run.forward = real
    return lines


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.host_overhead``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="back-to-back calls per timed loop")
    ap.add_argument("--repeats", type=int, default=5, help="timed loops; the median is printed")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    torch = bu.torch_or_none()
    if torch is None:
        print("host_overhead needs torch")
        return 1
    prov = bu.provenance()
    print(
        f"# {prov['command']} (--calls {args.calls} --repeats {args.repeats}); {prov['date_utc']}; device: "
        f"{prov['device']}; "
        f"CPU: {_cpu_model()}, {os.cpu_count()} cores; python {prov['python']}, torch {torch.__version__}, numba "
        f"{prov['numba']}",
        flush=True,
    )
    for line in dispatch(torch, args.calls, args.repeats) + api(torch, args.calls, args.repeats):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
