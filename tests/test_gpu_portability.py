"""Code that the CUDA simulator runs but a GPU refuses, found by reading the source (no GPU needed).

The simulator does no type checking (``docs/backend.rst``, "No type checking, and NaN"), so a test or kernel
can pass on a laptop and fail on the first GPU that runs it. Two such failures were found only on an H200 (2026-11-28,
the performance log): 18 of a Q loader test whose shared array's shape was an expression, and 2 of a split-pass test
that called a device function from the host. Claims checked, over ``numba_flash/``, ``tests/``, ``tutorials/`` and
``bench/``:

* Every ``cuda.shared.array`` / ``cuda.local.array`` shape is a name or a constant (or a tuple of them): a GPU build
  needs a compile-time shape, and an expression such as ``BR * SQ`` is typed as a run-time ``int64``.
* No source line declares two shared arrays: the simulator keys its arrays by source line, so they would alias (but
  for a line marked ``# DON'T``: tutorial 03's demonstration of that trap).
* No code calls a module-level device function of :mod:`numba_flash.fast._tiles` or :mod:`numba_flash.tensorcore.ptx`
  outside a ``cuda.jit`` function: a GPU device function cannot run on the host (a test needs a host formula, as
  ``sram_pass_testing.swizzle16_host``).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIRS = ("numba_flash", "tests", "tutorials", "bench")
DEVICE_MODULES = {"_tiles": ROOT / "numba_flash/fast/_tiles.py", "_mma": ROOT / "numba_flash/tensorcore/ptx.py"}


def _sources():
    return sorted(p for d in DIRS for p in (ROOT / d).rglob("*.py"))


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _is_cuda_jit(decorator: ast.expr) -> bool:
    call = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (
        isinstance(call, ast.Attribute)
        and call.attr == "jit"
        and isinstance(call.value, ast.Name)
        and call.value.id == "cuda"
    )


def _array_calls(tree: ast.Module):
    """``(node, kind)`` for each ``<x>.shared.array(...)`` / ``<x>.local.array(...)`` call."""
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "array"
            and isinstance(f.value, ast.Attribute)
            and f.value.attr in ("shared", "local")
        ):
            yield node, f.value.attr


def shape_problems(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, what)`` of each problem, as every check returns them."""

    def constant(e):
        return isinstance(e, (ast.Name, ast.Constant)) or (
            isinstance(e, ast.Tuple) and all(constant(x) for x in e.elts)
        )

    out = []
    for node, kind in _array_calls(tree):
        shape = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "shape"), None)
        if shape is None or not constant(shape):
            out.append((node.lineno, f"{kind} array of shape {ast.unparse(shape) if shape else '?'}"))
    return out


def same_line_problems(tree: ast.Module) -> list[tuple[int, str]]:
    lines = [node.lineno for node, kind in _array_calls(tree) if kind == "shared"]
    return [(n, f"{lines.count(n)} shared arrays on one line") for n in sorted(set(lines)) if lines.count(n) > 1]


@functools.cache
def device_functions(module: str) -> frozenset[str]:
    """Names of the module-level ``@cuda.jit`` functions of ``numba_flash.fast.<module>``."""
    tree = _tree(DEVICE_MODULES[module])
    return frozenset(
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and any(_is_cuda_jit(d) for d in n.decorator_list)
    )


def host_call_problems(tree: ast.Module) -> list[tuple[int, str]]:
    out = []

    def visit(node, in_jit):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_jit = in_jit or any(_is_cuda_jit(d) for d in node.decorator_list)
        if isinstance(node, ast.Call) and not in_jit:
            f = node.func
            if (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and f.value.id in DEVICE_MODULES
                and f.attr in device_functions(f.value.id)
            ):
                out.append((node.lineno, f"{f.value.id}.{f.attr} called on the host"))
        for child in ast.iter_child_nodes(node):
            visit(child, in_jit)

    visit(tree, False)
    return out


@pytest.mark.parametrize(
    "check",
    [shape_problems, same_line_problems, host_call_problems],
    ids=["constant-shapes", "one-shared-array-a-line", "no-device-function-on-the-host"],
)
def test_the_source_has_nothing_only_the_simulator_runs(check):
    problems = []
    for path in _sources():
        lines = path.read_text().splitlines()
        problems += [
            f"{path.relative_to(ROOT)}:{n}: {what}" for n, what in check(_tree(path)) if "# DON'T" not in lines[n - 1]
        ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("check", "source"),
    [
        (shape_problems, "smem = cuda.shared.array(BR * SQ, float32)"),
        (shape_problems, "acc = cuda.local.array((NR, 2 * NB), float32)"),
        (same_line_problems, "a = cuda.shared.array(4, float32); b = cuda.shared.array(4, float32)"),
        (host_call_problems, "x = _tiles.swizzle16(np.uint32(3), np.uint32(1))"),
        (host_call_problems, "def f(c, r):\n    return _tiles.swizzle_pairs(c, r)"),
    ],
)
def test_each_check_finds_what_a_gpu_refused(check, source):
    """The checks are not vacuous: each flags the code it exists for (the first two are the H200's failures)."""
    assert check(ast.parse(source))


def test_the_checks_leave_what_a_gpu_compiles_alone():
    ok = (
        "TILE = BR * SQ\nsmem = cuda.shared.array(TILE, float32)\nacc = cuda.local.array((NR, 4), float32)\n"
        "@cuda.jit(device=True)\ndef g(c, r):\n    return _tiles.swizzle16(c, r)\n"
        "split_pass = _tiles.make_split_pass(1, 2, 3, 4, True)\n"
    )
    tree = ast.parse(ok)
    assert device_functions("_tiles") >= {"swizzle16", "swizzle16t", "swizzle_pairs"}
    assert not shape_problems(tree) and not same_line_problems(tree) and not host_call_problems(tree)
