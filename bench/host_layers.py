"""Host time of one FA2 forward, layer by layer, on a GPU: where a short sequence's call spends its time.

Why it exists: at N <= 1k the half forward is host-bound on an H100 (``flash_attn_func`` about 1 ms of host time
a call against a 0.2-0.7 ms kernel; the performance log's section "Host path: ``_smem.CACHED_OPT_IN`` timed").
Earlier probes timed the layers at N = 1k, where the launch queue fills and single loops moved by 0.4 ms. This
one times each layer on a problem whose kernel takes a few microseconds (b 8, N 256, h 16), so that a loop of
back-to-back calls measures the host alone, and it peels the call one layer at a time:

* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on the same tensors (torch's own host cost);
  ``sdpa-fwd+bwd``: its forward and ``backward(dout)`` on inputs that require grad;
* ``api``: ``flash_attn_func(q, k, v)``; ``api-grad``: the same with inputs that require grad;
  ``api-fwd+bwd``: that forward and ``out.backward(dout)`` (a training step's attention); ``backward``:
  ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)`` on one saved forward (the backward pass alone,
  nothing accumulated); ``api-replay`` and ``api-grad-replay``: ``api`` and ``api-grad`` with the forward's launches
  replayed (:mod:`numba_flash.runtime.replay`, ``NUMBA_FLASH_REPLAY=1``); ``api-replay-core`` / ``api-replay-packed``
  (and ``api-fwd+bwd-replay-core`` / ``-packed``): replayed with cuda.core's launch or with packed launches
  (:class:`numba_flash.runtime.direct.PackedLaunch`), the recipes made anew at each switch;
* ``op``: ``torch.ops.numba_flash.attention_forward`` called directly (no argument checks above it);
* ``run``: the op's body: ``check_attention_args``, ``registry.resolve``, an ``Allocator``, ``_run.forward``, the
  results;
* ``module``: the kernel module's ``forward`` on kernel arrays converted once (plan, outputs, launch);
* ``plan``: the module's ``plan(prob)`` alone;
* ``smem-launch``: ``_smem.launch`` on preallocated arguments (the opt-in's typing, then numba's launch);
* ``dispatch``: ``kernel[grid, block, 0, nbytes](*args)``: numba's dispatcher (types the arguments, launches);
* ``compiled``: the compiled overload's ``launch(args, ...)``: no typing, numba's argument marshalling;
* ``raw``: cuda.core's ``launch`` on marshalled arguments: the floor of any Python launch;

and single operations: ``cuda.as_cuda_array`` of a tensor, its ``__cuda_array_interface__``, ``torch.empty``,
``check_attention_args`` (remembered) and ``check (not remembered)``, ``cuda.get_current_device()``,
``_smem.max_optin_bytes()``, ``Allocator(q)``.

Each line: the median over ``--repeats`` loops of ``--calls`` back-to-back calls (no synchronization inside a
loop; one between loops), microseconds per call. ``--profile`` instead prints, for bf16 at d = 64 (``--dtype``,
``--headdim``: another), a cProfile of ``--calls`` calls of ``flash_attn_func`` without grad, with it (forward only),
and of forward and backward, by own time (replay on, the default): which functions of the host time a call still spends
to cache or drop (cProfile inflates many small Python calls: read it for the order, the layers above for the time; the
autograd engine runs a CUDA backward in a thread of its own, which cProfile does not see). ``--kernels`` instead prints,
for bf16 training steps (forward and ``backward(dout)``) at b 8, N 256, d 64 and at the half grid's short d = 128 cells,
the kernels' GPU time per step (torch.profiler) against the synchronized wall time of a step, replay off and on, SDPA
beside: their difference is the time the GPU waited on the host. ``--timeline`` places that wait: one synchronized call
of the half grid's cells nearest 1.0x (the causal training step at d = 128, N = 1k; the causal forward at N = 512), ours
and SDPA memory-efficient's, event by event (the host's launches, allocations and synchronize, the GPU's kernels, each
from the call's start). Run on a GPU machine from the repository root::

    source bench/gpu/setup_env.sh
    python3 -m bench.host_layers [--calls 300] [--repeats 7]
    python3 -m bench.host_layers --profile [--dtype float32 --headdim 128]
    python3 -m bench.host_layers --kernels
    python3 -m bench.host_layers --timeline [--dtype float32]
"""

from __future__ import annotations

import argparse

from bench import common as bu


def layers(torch, dtype, d: int, calls: int, repeats: int) -> list[tuple[str, float]]:
    """``(layer, us per call)`` for one dtype and head dim (see the module docstring)."""
    from numba_flash import _run, flash_attn_func, registry
    from numba_flash._launch import Allocator, _check_attention_args, check_attention_args
    from numba_flash._torch_ops import attention_forward
    from numba_flash.fast import _plan
    from numba_flash.runtime import direct as _direct
    from numba_flash.runtime import replay as _replay
    from numba_flash.runtime import smem as _smem

    from numba import cuda

    b, n, h = 8, 256, 16
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", generator=gen).to(dtype) for _ in range(3))
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    sync = torch.cuda.synchronize
    scale = d**-0.5
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    kernel = registry.resolve("flash2", "forward", "auto", prob)
    module = kernel.module
    alloc = Allocator(q)
    to_kernel = _run._converter(kernel, prob, alloc)
    kq, kk, kv = (to_kernel(x) for x in (q, k, v))
    kernel_fn, grid, threads, nbytes = module.plan(prob)
    fwd = module.forward(kq, kk, kv, prob, alloc)
    args = _plan.fa2_forward_args(kq, kk, kv, fwd, prob)  # what run_fa2_forward launches with
    _smem.launch(kernel_fn, grid, threads, nbytes, *args)
    compiled = kernel_fn._compile_for_args(*args)
    core_launch, make_config, stream = _direct._launch_core()
    config = make_config(grid, threads, nbytes)
    marshalled, retr = [], []
    for ty, val in zip(compiled.argument_types, args):  # numba's own marshalling, done once
        compiled._prepare_args(ty, val, stream, retr, marshalled)
    cufunc = compiled._codelibrary.get_cufunc()
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    qgt, kgt, vgt = (x.detach().clone().requires_grad_(True) for x in (qt, kt, vt))
    dout = torch.randn_like(q)

    def replay(on, fn):  # fn with numba_flash.runtime.replay on or off, whatever the default
        def call():
            was, _replay.ENABLED = _replay.ENABLED, on
            try:
                return fn()
            finally:
                _replay.ENABLED = was

        return call

    def packed(on, fn):  # fn with replays packed (fast._direct.PACKED) or through cuda.core; recipes made anew
        def call():
            if _direct.PACKED != on:
                _direct.PACKED = on
                _replay._recipes.clear()
            return fn()

        return call

    def train_step(fwd, args, grad):
        for x in args:
            x.grad = None
        fwd(*args).backward(grad)

    saved_off = replay(False, lambda: flash_attn_func(qg, kg, vg))()  # forwards whose backwards are timed alone
    saved_on = replay(True, lambda: flash_attn_func(qg, kg, vg))()

    def run_body():
        p = check_attention_args(q, k, v, 0.0, scale, False, 0)
        kern = registry.resolve("flash2", "forward", "auto", p)
        a = Allocator(q)
        f = _run.forward(q, k, v, p, kern, None, a)
        return a.result(f.out, q.dtype), a.result(f.lse), a.result(f.m), a.result(f.l)

    cases = [
        ("sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)),
        ("api", replay(False, lambda: flash_attn_func(q, k, v))),
        ("api-grad", replay(False, lambda: flash_attn_func(qg, kg, vg))),
        ("api-replay", replay(True, lambda: flash_attn_func(q, k, v))),
        ("api-replay-core", packed(False, replay(True, lambda: flash_attn_func(q, k, v)))),
        ("api-replay-packed", packed(True, replay(True, lambda: flash_attn_func(q, k, v)))),
        ("api-grad-replay", replay(True, lambda: flash_attn_func(qg, kg, vg))),
        (
            "sdpa-fwd+bwd",
            lambda: train_step(torch.nn.functional.scaled_dot_product_attention, (qgt, kgt, vgt), dout.transpose(1, 2)),
        ),
        ("api-fwd+bwd", replay(False, lambda: train_step(flash_attn_func, (qg, kg, vg), dout))),
        ("api-fwd+bwd-replay", replay(True, lambda: train_step(flash_attn_func, (qg, kg, vg), dout))),
        (
            "api-fwd+bwd-replay-core",
            packed(False, replay(True, lambda: train_step(flash_attn_func, (qg, kg, vg), dout))),
        ),
        (
            "api-fwd+bwd-replay-packed",
            packed(True, replay(True, lambda: train_step(flash_attn_func, (qg, kg, vg), dout))),
        ),
        ("backward", replay(False, lambda: torch.autograd.grad(saved_off, (qg, kg, vg), dout, retain_graph=True))),
        ("backward-replay", replay(True, lambda: torch.autograd.grad(saved_on, (qg, kg, vg), dout, retain_graph=True))),
        ("op", lambda: attention_forward(q, k, v, 0.0, scale, False, 0, "flash2", "auto", "auto", 0, 0, False)),
        ("run", run_body),
        ("module", lambda: module.forward(kq, kk, kv, prob, alloc)),
        ("plan", lambda: module.plan(prob)),
        ("smem-launch", lambda: _smem.launch(kernel_fn, grid, threads, nbytes, *args)),
        ("dispatch", lambda: kernel_fn[grid, threads, 0, nbytes](*args)),
        ("compiled", lambda: compiled.launch(args, grid, threads, stream, nbytes)),
        ("raw", lambda: core_launch(stream, config, cufunc.kernel, *marshalled)),
        ("as_cuda_array", lambda: cuda.as_cuda_array(q)),
        ("cuda_array_interface", lambda: q.__cuda_array_interface__),
        ("torch.empty", lambda: torch.empty((b, h, n), device="cuda")),
        ("check_attention_args", lambda: check_attention_args(q, k, v, 0.0, scale, False, 0)),
        ("check (not remembered)", lambda: _check_attention_args(q, k, v, 0.0, scale, False, 0)),
        ("get_current_device", cuda.get_current_device),
        ("max_optin_bytes", _smem.max_optin_bytes),
        ("Allocator", lambda: Allocator(q)),
    ]
    was_packed = _direct.PACKED
    try:
        return [(name, bu.host_us_per_call(fn, calls, repeats, warmup=min(calls, 50), sync=sync)) for name, fn in cases]
    finally:
        if _direct.PACKED != was_packed:  # Dev: the packed() cases switch it; leave the process as it was
            _direct.PACKED = was_packed
            _replay._recipes.clear()


def profile(torch, calls: int, top: int = 30, dtype_name: str = "bfloat16", d: int = 64) -> None:
    """The ``--profile`` output of the module docstring, on inputs of ``dtype_name`` and head dim ``d``."""
    import cProfile
    import pstats

    from numba_flash import flash_attn_func

    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype = getattr(torch, dtype_name)
    q, k, v = (torch.randn(8, 256, 16, d, device="cuda", generator=gen).to(dtype) for _ in range(3))
    dout = torch.randn_like(q)

    def fwd_bwd(*args):
        for x in args:
            x.grad = None
        flash_attn_func(*args).backward(dout)

    for what, grad, fn in (
        ("flash_attn_func", False, flash_attn_func),
        ("flash_attn_func", True, flash_attn_func),
        ("flash_attn_func(...).backward(dout)", True, fwd_bwd),
    ):
        args = [x.detach().clone().requires_grad_(grad) for x in (q, k, v)]
        for _ in range(50):  # compile and warm up
            fn(*args)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn(*args)
        prof.disable()
        torch.cuda.synchronize()
        print(f"## {what}, {dtype_name}, d = {d}, inputs requires_grad={grad}: {calls} calls, by own time", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def _training_steps(torch, b: int, n: int, h: int, d: int, causal: bool, dtype=None):
    """``(ours, sdpa)``: one training step's attention each (forward and ``backward(dout)``), on the same data, in
    ``dtype`` (None: bf16)."""
    from numba_flash import flash_attn_func

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, n, h, d, device="cuda", generator=gen).to(dtype or torch.bfloat16).requires_grad_(True)
        for _ in range(3)
    )
    dout = torch.randn_like(q)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))

    def ours():
        for x in (q, k, v):
            x.grad = None
        flash_attn_func(q, k, v, causal=causal).backward(dout)

    def sdpa():
        for x in (qt, kt, vt):
            x.grad = None
        torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).backward(dout.transpose(1, 2))

    return ours, sdpa


def _wall_and_kernels(torch, step, steps: int):
    """(median synchronized wall time of ``step`` in ms, {kernel name: GPU ms per step} from torch.profiler)."""
    import statistics
    import time

    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append(1e3 * (time.perf_counter() - t0))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per_kernel = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.device_time / 1e3 / steps
    return statistics.median(walls), per_kernel


def kernel_time(torch, steps: int = 20) -> None:
    """The ``--kernels`` output of the module docstring: per training step (forward and ``backward(dout)``, bf16), the
    kernels' GPU time (torch.profiler's CUDA activity: numba's launches are in it too), the synchronized wall time of
    one step (median of ``steps``), and their difference (the time the GPU waited on the host), replay off and on."""
    from numba_flash.runtime import replay as _replay

    was = _replay.ENABLED
    for b, n, h, d, causal in (
        (8, 256, 16, 64, False),
        (16, 1024, 16, 128, True),
        (16, 1024, 16, 128, False),
        (8, 2048, 16, 128, True),
    ):
        ours, sdpa = _training_steps(torch, b, n, h, d, causal)
        for name, step, on in (("ours", ours, False), ("ours-replay", ours, True), ("sdpa", sdpa, was)):
            _replay.ENABLED = on
            wall, per_kernel = _wall_and_kernels(torch, step, steps)
            gpu = sum(per_kernel.values())
            print(
                f"b={b} N={n} h={h} d={d} causal={int(causal)} {name:12} wall {wall:7.3f} ms/step, kernels {gpu:7.3f} "
                "ms, "
                f"GPU idle {wall - gpu:6.3f} ms",
                flush=True,
            )
            for kname, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:6]:
                print(f"    {ms:7.3f} ms  {kname[:110]}", flush=True)
    _replay.ENABLED = was


def _timeline_events(torch, step, steps: int):
    """The last of ``steps`` profiled calls of ``step`` (each followed by a synchronize; the first ones warm the
    profiler up): [(start us from the call's start, duration us, kind, name)], kind "cpu" for the host's launch,
    allocation and synchronize calls and the autograd engine's nodes, "gpu" for kernels and memsets (torch.profiler
    with CPU and CUDA activity; kineto puts both on the host clock). The profiler adds a few microseconds to each
    host operation it records: read the host times as upper bounds."""
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("timeline::step"):
                step()
                torch.cuda.synchronize()
    events = prof.events()
    # Dev: the host's range of the last call (kineto also puts a GPU range of that name around its kernels)
    t0, t1 = max(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name == "timeline::step" and e.device_type != torch.autograd.DeviceType.CUDA
    )
    host = (
        "cudaLaunchKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaMemsetAsync",
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "aten::empty",
        "aten::fill_",
        "aten::zeros",
        "aten::to",
        "aten::copy_",
        "autograd::engine",
        "EagerAttention",
        "cudaMalloc",
        "cudaFree",
        "nf::",
    )
    rows = []
    for e in events:
        start, dur = e.time_range.start - t0, e.time_range.end - e.time_range.start
        if start < 0 or e.name == "timeline::step":
            continue
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if e.name.startswith("nf::"):
                continue  # Dev: kineto's GPU range of a marked host function, not a kernel (it spans the kernels)
            rows.append((start, dur, "gpu", e.name))
        elif e.name.startswith(host) and start <= t1 - t0:
            rows.append((start, dur, "cpu", e.name))
    return sorted(rows), t1 - t0


def _forward_calls(torch, b: int, n: int, h: int, d: int, causal: bool, dtype=None):
    """``(ours, sdpa)``: one forward call each without grad, in ``dtype`` (None: bf16; the grids' forward cells: ours
    through ``flash_attn_func``, SDPA memory-efficient as ``bench.common.torch_sdpa`` calls it)."""
    from numba_flash import flash_attn_func

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", generator=gen).to(dtype or torch.bfloat16) for _ in range(3))
    return (lambda: flash_attn_func(q, k, v, causal=causal)), (lambda: bu.torch_sdpa(q, k, v, causal, "efficient"))


#: The host functions ``--timeline`` marks with a profiler range ``nf::<name>`` (module, attribute), so that the
#: Python between the call and its launches is placed, not only the torch operations in it.
_MARKED = (
    ("numba_flash.api", "check_attention_args"),
    ("numba_flash._torch_ops", "run_forward"),
    ("numba_flash._torch_ops", "_forward"),
    ("numba_flash._torch_ops", "_backward_checked"),
    ("numba_flash._torch_ops", "check_backward_args"),
    ("numba_flash._torch_ops", "_replay_key"),
    ("numba_flash._torch_ops", "streams_to_join"),
    ("numba_flash.registry", "resolve"),
    ("numba_flash.runtime.replay", "replay"),
    ("numba_flash.runtime.replay", "call_key"),
)


def _marked_functions():
    """A context in which each function of :data:`_MARKED` runs inside ``record_function("nf::<name>")``."""
    import contextlib
    import functools
    import importlib

    from torch.profiler import record_function

    @contextlib.contextmanager
    def patched():
        saved = []
        for mod_name, attr in _MARKED:
            mod = importlib.import_module(mod_name)
            real = getattr(mod, attr)

            @functools.wraps(real)
            def marked(*a, _real=real, _name=f"nf::{attr}", **kw):
                with record_function(_name):
                    return _real(*a, **kw)

            saved.append((mod, attr, real))
            setattr(mod, attr, marked)
        try:
            yield
        finally:
            for mod, attr, real in saved:
                setattr(mod, attr, real)

    return patched()


def timeline(torch, steps: int = 8, dtype=None) -> None:
    """The ``--timeline`` output: the grid cells nearest 1.0x SDPA memory-efficient, one synchronized call
    event by event, ours (replay on, the default) and SDPA memory-efficient's, in ``dtype`` (None: bf16, the half
    grid's; float32: the fa2 grid's, whose causal d = 128 forward at N 512 is its cell furthest below): a training
    step at causal d = 128, N = 1k (b 16, h 16) and the causal forward at N = 512 (b 32, d = 64 and 128, no grad). For
    each: the median synchronized wall time of 20 unprofiled calls, then when the host launched each kernel and when the
    GPU ran it, so that the GPU's idle time is placed (before the first kernel, between two, after the last); our host
    functions of :data:`_MARKED` appear as ``nf::`` ranges (in the profiled calls only)."""
    import statistics
    import time

    def sdpa_train(b, n, h, d, causal):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(b, n, h, d, device="cuda", generator=gen).to(dtype or torch.bfloat16).requires_grad_(True)
            for _ in range(3)
        )
        dout = torch.randn_like(q)

        def step():
            for x in (q, k, v):
                x.grad = None
            bu.torch_sdpa(q, k, v, causal, "efficient").backward(dout)

        return step

    cases = [
        ("train", 16, 1024, 16, 128, True),
        ("forward", 32, 512, 32, 64, True),
        ("forward", 32, 512, 16, 128, True),
    ]
    for what, b, n, h, d, causal in cases:
        if what == "train":
            ours, _ = _training_steps(torch, b, n, h, d, causal, dtype)
            sdpa = sdpa_train(b, n, h, d, causal)
        else:
            ours, sdpa = _forward_calls(torch, b, n, h, d, causal, dtype)
        for name, step in (("ours", ours), ("sdpa-mem-eff", sdpa)):
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            walls = []
            for _ in range(20):
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                walls.append(1e6 * (time.perf_counter() - t0))
            with _marked_functions():
                rows, span = _timeline_events(torch, step, steps)
            busy_until, idle, gpu = 0.0, 0.0, 0.0
            print(
                f"## {what} {str(dtype or torch.bfloat16)[6:]} b={b} N={n} h={h} d={d} causal={int(causal)} {name}: "
                f"wall {statistics.median(walls):.1f} us "
                f"unprofiled (median of 20); the profiled call, us from its start:",
                flush=True,
            )
            for start, dur, kind, ev in rows:
                gap = ""
                if kind == "gpu":
                    if start > busy_until:
                        gap = f"  (GPU idle {start - busy_until:7.1f} us before it)"
                        idle += start - busy_until
                    busy_until = max(busy_until, start + dur)
                    gpu += dur
                print(f"  {start:9.1f} {dur:9.1f}  {kind}  {ev[:80]}{gap}", flush=True)
            print(
                f"  profiled call {span:.1f} us: kernels {gpu:.1f} us, GPU idle before and between kernels {idle:.1f} "
                "us, "
                f"after the last {span - busy_until:.1f} us",
                flush=True,
            )


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.host_layers``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="back-to-back calls per timed loop")
    ap.add_argument("--repeats", type=int, default=7, help="timed loops; the median is printed")
    ap.add_argument("--profile", action="store_true", help="a cProfile of flash_attn_func instead of the layer table")
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16", "float32"),
        help="--profile, --timeline: the inputs' dtype (default bfloat16)",
    )
    ap.add_argument("--headdim", type=int, default=64, help="--profile: the head dim (default 64)")
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="per training step: the kernels' GPU time against the synchronized wall time, replay off and on",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="the grid cells nearest 1.0x (causal training step at d 128, N 1k; causal forward at N 512), "
        "ours and SDPA memory-efficient's, event by event",
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    torch = bu.torch_or_none()
    if torch is None or not bu.ON_GPU:
        print(
            "host_layers needs torch and a GPU (it times numba-cuda's launch path, which the simulator does not have)"
        )
        return 1
    print(bu.header_line(torch), flush=True)
    if args.profile:
        profile(torch, args.calls, dtype_name=args.dtype, d=args.headdim)
        return 0
    if args.kernels:
        kernel_time(torch)
        return 0
    if args.timeline:
        timeline(torch, dtype=getattr(torch, args.dtype))
        return 0
    for dtype in (torch.bfloat16, torch.float32):
        for d in (64, 128):
            for name, us in layers(torch, dtype, d, args.calls, args.repeats):
                print(f"{str(dtype)[6:]:8} d={d:<3} {name:22} {us:8.1f} us/call", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
