"""Command line: ``python -m numba_flash {demo,io,info,handout} ...``.

* ``demo``: run the main job on the current backend (GPU if present, else the simulator) and print a
  table of error against the float64 reference, time and memory.
* ``io``: print the HBM-access table of the IO model (Theorem 2, Theorem 5, Proposition 4); with
  ``--measure`` (on a GPU, from the repository root) measure DRAM bytes with Nsight Compute beside it
  (:mod:`bench.measure_io`).
* ``info``: say which backend runs and with which versions.
* ``variants``: list every kernel (algorithm, pass, variant), its module, and what ``auto`` picks here.
* ``handout``: write the course's student handout (:mod:`numba_flash.handout`).
* ``bugs``: the bug gallery (``tools/bugs.py`` of a source checkout): list it, or plant a bug in a copy and
  run its tests.

Every usage error is one line on stderr and exit status 2 (argparse's ``error:``), never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys


# ----------------------------------------------------------------------------------------------
# Argument types: a bad value ends in argparse's one-line "error:" and exit status 2, never a traceback
# ----------------------------------------------------------------------------------------------
def _checked(text: str, parse, ok, what: str):
    """``parse(text)`` where ``ok`` holds of it; else ArgumentTypeError ``must be <what>, got ...`` (one line)."""
    try:
        x = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not ok(x):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return x


def positive_int(text: str) -> int:
    """An integer >= 1 (sizes, counts)."""
    return _checked(text, int, lambda n: n >= 1, "a positive integer")


def headdim(text: str) -> int:
    """A head dimension the kernels support: 1 to ``numba_flash._launch.MAX_HEADDIM``, read when parsing."""
    d = positive_int(text)
    from ._launch import MAX_HEADDIM

    if d > MAX_HEADDIM:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_HEADDIM} (the largest head dimension the kernels support), got {d}"
        )
    return d


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    return _checked(text, float, lambda x: math.isfinite(x) and 0 < x <= 1, "a number in (0, 1]")


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds)."""
    return _checked(text, float, lambda x: math.isfinite(x) and x > 0, "a positive number")


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
        print(
            f"{k['algorithm']:10s} {k['pass']:9s} {k['variant']:11s} {k['paper']:19s} "
            f"{'yes' if k['available'] else 'no':10s} {'*' if k['auto'] else '':5s} {k['module']}"
        )
    return 0


def _cmd_io(args) -> int:
    from numba_flash_reference import io_model

    if args.measure:
        try:
            from bench import measure_io
        except ImportError:
            print("io --measure: the bench/ tools are not importable; run from the repository root")
            return 2
        return measure_io.run(args)

    print(io_model.format_table(N=args.N, d=args.d, M=args.M, Br=args.Br, Bc=args.Bc, sparsity=args.sparsity))
    return 0


def _cmd_demo(args) -> int:
    from . import demo

    return demo.run(args)


def _cmd_handout(args) -> int:
    from . import handout

    return handout.main(args)


def checkout_tool(name: str):
    """``tools/<name>.py`` of the source checkout this package was imported from, or None when there is none.

    The bug gallery lives in ``tools/`` (it runs the tests of ``tests/``, which the wheel does not ship); an
    editable install or a clone on ``PYTHONPATH`` has it next to ``numba_flash/``.
    """
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = root / "tools" / f"{name}.py"
    if not (path.is_file() and (root / "tests").is_dir()):
        return None
    spec = importlib.util.spec_from_file_location(f"tools.{name}", path)
    if spec.name not in sys.modules:  # the tests import it as tools.bugs: one module object either way
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # before exec: its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[spec.name]


def _cmd_bugs(args) -> int:
    if args.gpu and not args.run_all:
        args.parser.error("--gpu only applies with --run-all (the GPU-only bugs are run as a set)")
    if args.jobs is not None and not args.run_all:
        args.parser.error("--jobs only applies with --run-all (one bug runs alone)")
    if args.jobs is not None and args.jobs < 1:
        args.parser.error(f"--jobs must be at least 1, got {args.jobs}")
    args.jobs = 2 if args.jobs is None else args.jobs
    bugs = checkout_tool("bugs")
    if bugs is None:
        args.parser.error(
            "the bug gallery needs a source checkout of numba-flash (it plants bugs in a copy of the "
            "kernels and runs tests/): clone it, `pip install -e .`, and run this from there"
        )
    try:
        return bugs.main(args)
    except bugs.UnknownBug as exc:
        args.parser.error(str(exc))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m numba_flash",
        description="FlashAttention as readable Numba CUDA kernels, on a GPU or in the CUDA simulator.",
    )
    sub = p.add_subparsers(dest="command", metavar="{demo,io,info,variants,handout,bugs}")
    sub.required = True

    d = sub.add_parser("demo", help="standard vs tiled attention on the current backend: error, time, memory")
    d.add_argument("--batch", type=positive_int, default=None, help="batch size (default depends on the backend)")
    d.add_argument("--nheads", type=positive_int, default=None, help="number of heads")
    d.add_argument("--seqlen", type=positive_int, default=None, help="sequence length N")
    d.add_argument("--headdim", type=headdim, default=None, help="head dimension d (at most the kernels' maximum)")
    d.add_argument("--causal", action="store_true", help="use the causal mask")
    d.add_argument("--repeats", type=positive_int, default=None, help="timed repeats per algorithm")
    d.add_argument(
        "--variant",
        default="auto",
        choices=("auto", "readable", "fast", "tensorcore"),
        help="which kernel of each algorithm runs (default: auto, the fastest here)",
    )
    d.set_defaults(func=_cmd_demo)

    io = sub.add_parser("io", help="HBM accesses of standard vs tiled attention (the IO model)")
    io.add_argument("--N", type=positive_int, default=1024, help="sequence length")
    io.add_argument(
        "--d", type=positive_int, default=64, help="head dimension (any d >= 1: the IO model has no kernel limit)"
    )
    io.add_argument("--M", type=positive_int, default=None, help="SRAM size in elements (default: 48 KB of float32)")
    io.add_argument("--Br", type=positive_int, default=None, help="row block size override")
    io.add_argument("--Bc", type=positive_int, default=None, help="column block size override")
    io.add_argument(
        "--sparsity", type=fraction, default=0.25, help="fraction of non-zero blocks for block-sparse, in (0, 1]"
    )
    io.add_argument(
        "--measure",
        action="store_true",
        help="measure DRAM bytes with Nsight Compute on a GPU beside the model (bench/measure_io.py)",
    )
    io.add_argument("--out", default="io_measured.json", help="with --measure: the results file (JSON)")
    io.add_argument("--part", choices=("gpt2", "sweep", "all"), default="all", help="with --measure: which cases")
    io.add_argument(
        "--only",
        action="append",
        choices=("standard", "flash1", "flash2", "block-sparse"),
        help="with --measure: only this algorithm (repeatable)",
    )
    io.add_argument("--dry-run", action="store_true", help="with --measure: list the cases, measure nothing")
    io.add_argument("--timeout", type=positive_float, default=1800, help="with --measure: seconds per case under ncu")
    io.set_defaults(func=_cmd_io)

    info = sub.add_parser("info", help="which backend runs, device and versions")
    info.set_defaults(func=_cmd_info)

    var = sub.add_parser("variants", help="every kernel: algorithm, pass, variant, module, and auto's pick")
    var.set_defaults(func=_cmd_variants)

    ho = sub.add_parser(
        "handout", help="write the course's student handout (tutorials, stubs, autograders; no solutions) to DIR"
    )
    ho.add_argument("dir", help="folder to write DIR/tutorials and DIR/README.md into")
    ho.add_argument("--source", default=None, help="the tutorials/ folder to copy (default: the one of this checkout)")
    ho.add_argument("--force", action="store_true", help="replace DIR/tutorials if it exists")
    ho.set_defaults(func=_cmd_handout)

    bg = sub.add_parser(
        "bugs", help="the bug gallery: classic bugs planted in a copy of the kernels, and the tests that catch them"
    )
    act = bg.add_mutually_exclusive_group()
    act.add_argument(
        "--show", metavar="NAME", help="the lesson and the diff of one bug (NAME or its number in the list)"
    )
    act.add_argument(
        "--run",
        metavar="NAME",
        help="plant one bug (NAME or its number) in a temporary copy and run the tests that should catch it",
    )
    act.add_argument(
        "--run-all", action="store_true", help="every bug of one backend, plus a control run on the unmutated copy"
    )
    bg.add_argument("--gpu", action="store_true", help="with --run-all: the GPU-only bugs, run on the GPU")
    bg.add_argument("--jobs", type=int, default=None, help="with --run-all: bugs run at a time (default 2)")
    bg.set_defaults(func=_cmd_bugs, parser=bg)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `python -m numba_flash bugs | head`: the reader left; no traceback
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit would raise again
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
