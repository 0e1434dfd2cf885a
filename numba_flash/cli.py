"""Command line: ``python -m numba_flash {demo,io,info} ...``.

* ``demo``: run the main job on the current backend (GPU if present, else the simulator) and print a
  table of error against the float64 reference, time and memory.
* ``io``: print the HBM-access table of the IO model (Theorem 2, Theorem 5, Proposition 4).
* ``info``: say which backend runs and with which versions.
* ``variants``: list every kernel (algorithm, pass, variant), its module, and what ``auto`` picks here.
* ``bugs``: the bug gallery (:mod:`numba_flash.bugs`): list it, or plant a bug in a copy and run its tests.
"""

from __future__ import annotations

import argparse
import sys


def _cmd_info(args) -> int:
    from . import describe

    print(describe())
    return 0


def _cmd_variants(args) -> int:
    from . import describe
    from .api import variants

    print(describe())
    print(f"{'algorithm':10s} {'pass':9s} {'variant':11s} {'paper':19s} {'runs here':10s} {'auto':5s} module")
    for k in variants():
        print(f"{k['algorithm']:10s} {k['pass']:9s} {k['variant']:11s} {k['paper']:19s} "
              f"{'yes' if k['available'] else 'no':10s} {'*' if k['auto'] else '':5s} {k['module']}")
    return 0


def _cmd_io(args) -> int:
    from numba_flash_reference import io_model

    print(io_model.format_table(N=args.N, d=args.d, M=args.M, Br=args.Br, Bc=args.Bc, sparsity=args.sparsity))
    return 0


def _cmd_demo(args) -> int:
    from . import demo

    return demo.run(args)


def _cmd_bugs(args) -> int:
    from . import bugs

    return bugs.main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m numba_flash",
        description="FlashAttention as readable Numba CUDA kernels, on a GPU or in the CUDA simulator.",
    )
    sub = p.add_subparsers(dest="command", metavar="{demo,io,info,variants,bugs}")
    sub.required = True

    d = sub.add_parser("demo", help="standard vs tiled attention on the current backend: error, time, memory")
    d.add_argument("--batch", type=int, default=None, help="batch size (default depends on the backend)")
    d.add_argument("--nheads", type=int, default=None, help="number of heads")
    d.add_argument("--seqlen", type=int, default=None, help="sequence length N")
    d.add_argument("--headdim", type=int, default=None, help="head dimension d")
    d.add_argument("--causal", action="store_true", help="use the causal mask")
    d.add_argument("--repeats", type=int, default=None, help="timed repeats per algorithm")
    d.add_argument("--variant", default="auto", choices=("auto", "readable", "fast", "tensorcore"),
                   help="which kernel of each algorithm runs (default: auto, the fastest here)")
    d.set_defaults(func=_cmd_demo)

    io = sub.add_parser("io", help="HBM accesses of standard vs tiled attention (the IO model)")
    io.add_argument("--N", type=int, default=1024, help="sequence length")
    io.add_argument("--d", type=int, default=64, help="head dimension")
    io.add_argument("--M", type=int, default=None, help="SRAM size in elements (default: 48 KB of float32)")
    io.add_argument("--Br", type=int, default=None, help="row block size override")
    io.add_argument("--Bc", type=int, default=None, help="column block size override")
    io.add_argument("--sparsity", type=float, default=0.25, help="fraction of non-zero blocks for block-sparse")
    io.set_defaults(func=_cmd_io)

    info = sub.add_parser("info", help="which backend runs, device and versions")
    info.set_defaults(func=_cmd_info)

    var = sub.add_parser("variants", help="every kernel: algorithm, pass, variant, module, and auto's pick")
    var.set_defaults(func=_cmd_variants)

    bg = sub.add_parser("bugs", help="the bug gallery: classic bugs planted in a copy of the kernels, and the tests that catch them")
    act = bg.add_mutually_exclusive_group()
    act.add_argument("--show", metavar="NAME", help="the lesson and the diff of one bug")
    act.add_argument("--run", metavar="NAME", help="plant one bug in a temporary copy and run the tests that should catch it")
    act.add_argument("--run-all", action="store_true", help="every bug of one backend, plus a control run on the unmutated copy")
    bg.add_argument("--gpu", action="store_true", help="with --run-all: the GPU-only bugs, run on the GPU")
    bg.add_argument("--jobs", type=int, default=2, help="with --run-all: bugs run at a time (default 2)")
    bg.set_defaults(func=_cmd_bugs)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
