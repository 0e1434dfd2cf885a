"""The import graph of ``numba_flash``: modules, import levels, edges, cycles, and the wings' rule.

Run from the repository root::

    python -m tools.module_graph            # counts, levels and the wing rule
    python -m tools.module_graph --edges    # every edge, importer -> imported

Only imports between ``numba_flash`` modules count (``import numba`` does not). An edge is a static
``import`` / ``from ... import`` anywhere in a module, at its top or inside a function, read with
:mod:`ast`, so nothing is imported to draw the graph. A module's level is 0 when it imports no other
package module and otherwise one more than the highest level among what it imports, so the level
count is the length of the longest import chain; a cycle has no level and is reported.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = "numba_flash"
#: Wings that readable modules (the top of the package) must not import.
FAST_WINGS = ("numba_flash.fast", "numba_flash.tensorcore")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package modules that ``name`` (the module at ``path``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(target: str) -> None:
        # The longest prefix of target that is a module of the package ("a.b.c" -> "a.b" if c is a name).
        parts = target.split(".")
        while parts:
            cand = ".".join(parts)
            if cand in modules:
                if cand != name:
                    found.add(cand)
                return
            parts.pop()

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, name, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base)
    return {m for m in found if m.startswith(PACKAGE)}


def graph(root: Path) -> dict[str, set[str]]:
    """module -> the package modules it imports, for every module under ``root/numba_flash``."""
    files = {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    modules = set(files)
    return {name: imports_of(path, name, modules) for name, path in files.items()}


def levels(g: dict[str, set[str]]) -> tuple[dict[str, int], list[str]]:
    """(level of each module, modules on or behind a cycle)."""
    level: dict[str, int] = {}
    state: dict[str, int] = {}  # 1 visiting, 2 done
    cyclic: list[str] = []

    def visit(m: str) -> int | None:
        if state.get(m) == 2:
            return level.get(m)
        if state.get(m) == 1:
            return None
        state[m] = 1
        sub = [visit(d) for d in g[m]]
        state[m] = 2
        if any(s is None for s in sub):
            cyclic.append(m)
            return None
        level[m] = 1 + max(sub) if sub else 0
        return level[m]

    for m in sorted(g):
        visit(m)
    return level, sorted(cyclic)


def is_readable(module: str) -> bool:
    """A module of the readable wing: the package's top and ``device/`` (not fast/, tensorcore/, runtime/)."""
    sub = module.split(".")
    return len(sub) == 2 or (len(sub) >= 3 and sub[1] == "device")


def wing_violations(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a readable module imports ``fast/`` or ``tensorcore/``.

    ``registry`` is the one exception by design: it names every kernel, so it imports every wing.
    """
    bad = []
    for m, deps in sorted(g.items()):
        if not is_readable(m) or m in ("numba_flash.registry",):
            continue
        for d in sorted(deps):
            if d.startswith(FAST_WINGS):
                bad.append((m, d))
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="repository root (default: the current directory)")
    ap.add_argument("--edges", action="store_true", help="print every edge")
    args = ap.parse_args(argv)
    g = graph(Path(args.root))
    level, cyclic = levels(g)
    n_edges = sum(len(d) for d in g.values())
    print(f"modules: {len(g)}")
    print(f"import edges: {n_edges}")
    print(f"import levels: {1 + max(level.values()) if level else 0}")
    print(f"cycles: {'none' if not cyclic else ', '.join(cyclic)}")
    bad = wing_violations(g)
    print(f"readable modules importing fast/ or tensorcore/: {len(bad)}")
    for m, d in bad:
        print(f"  {m} -> {d}")
    if args.edges:
        for m in sorted(g):
            for d in sorted(g[m]):
                print(f"{m} -> {d}")
    return 1 if (cyclic or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
