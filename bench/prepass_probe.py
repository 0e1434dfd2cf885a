"""Time the fast backwards' pre-pass (:mod:`numba_flash.fast._prepass`) in its layouts, on a GPU.

For each dtype and head dim at the grid's 16k tokens (b N = 16384, h d = 2048): the pre-pass with the dQ zeros
fused, for ``rows_per_group`` 1, 2, 4 and 8; the pre-pass alone plus torch's fill of dQ (``zero_``), the layout
before the fusion; and the fill alone. Each timing is the median of 10, each of 10 back-to-back calls
(:func:`bench.common.cuda_time_ms`), so it is the kernels' time, not the host's. Prints one line per row, with the
bytes moved and the rate.

    python -m bench.prepass_probe [--seqlens 1024 4096] [--headdims 64 128]
"""

from __future__ import annotations

import argparse

from . import common as bu


def _time_shape(torch, name, d, n):
    """[(layout, MB moved, ms)] of the pre-pass at 16k tokens, head dim ``d``, sequence length ``n``."""
    from numba_flash._launch import Allocator, check_attention_args
    from numba_flash.fast import _prepass
    from numba_flash.tensorcore import ptx

    dt = getattr(torch, name)
    h, b = 2048 // d, 16384 // n
    o = torch.randn(b, n, h, d, device="cuda").to(dt)
    do = torch.randn_like(o)
    prob = check_attention_args(o, o, o, 0.0, None, False, 0)
    alloc = Allocator(o)
    half = dt != torch.float32
    ko, kdo = (alloc.to_words(x) for x in (o, do)) if half else (alloc.to_kernel(x) for x in (o, do))
    kind = ptx.HALF_KINDS[name] if half else None
    dq = torch.empty(b, n, h, d, device="cuda")
    in_mb = 2 * o.numel() * o.element_size() / 1e6
    dq_mb = dq.numel() * 4 / 1e6
    rows = [
        (
            f"fused, {r} row(s) a warp",
            in_mb + dq_mb,
            lambda r=r: _prepass.row_dot(ko, kdo, prob, alloc, dq=dq, kind=kind, rows_per_group=r),
        )
        for r in (1, 2, 4, 8)
    ]
    rows += [
        (
            f"D only + zero_, {r} row(s)",
            in_mb + dq_mb,
            lambda r=r: (_prepass.row_dot(ko, kdo, prob, alloc, kind=kind, rows_per_group=r), dq.zero_()),
        )
        for r in (1, 4)
    ]
    rows.append(("zero_ alone", dq_mb, dq.zero_))
    return [(label, mb, bu.cuda_time_ms(fn, warmup=2, repeats=10, calls=10)[0]) for label, mb, fn in rows]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    torch = bu.torch_or_none()
    if torch is None or not bu.ON_GPU:
        print("prepass_probe needs torch and a GPU")
        return 1
    print(bu.header_line(torch), flush=True)
    print(f"{'dtype':9} {'d':>4} {'N':>6} {'layout':24} {'ms':>8} {'MB':>7} {'TB/s':>6}")
    for name in args.dtypes:
        for d in args.headdims:
            for n in args.seqlens:
                for label, mb, ms in _time_shape(torch, name, d, n):
                    print(f"{name:9} {d:4d} {n:6d} {label:24} {ms:8.4f} {mb:7.1f} {mb / 1e3 / ms:6.2f}", flush=True)
                bu.free_memory()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
