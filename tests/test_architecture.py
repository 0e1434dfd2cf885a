"""The house rules of docs/architecture.rst, checked: one routing table, wings that import one way.

* Every kernel the registry can run is named on the architecture page's table (through the
  registry-table marker) and lives in the wing its variant says.
* The import graph of ``numba_flash`` has no cycle, and no readable module (the top of the package,
  ``device/``) imports ``fast/`` or ``tensorcore/`` (:mod:`tools.module_graph`, read with ``ast``).
* No kernel module picks another kernel: only the registry imports two kernel modules of one
  algorithm and pass.
* Every subpackage is listed in the page's table of wings, and every ``:func:``/``:mod:``/``:class:``
  target on the page exists.
* No function in ``numba_flash`` is longer than :data:`MAX_FUNCTION_LINES` (a kernel factory that grows past it
  is split into step factories, as ``tensorcore/forward_steps.py`` does), and no docstring cites a commit (git
  and the performance log keep the history).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import numba_flash  # noqa: F401  (chooses the backend first)
from numba_flash import registry

import pytest

from tools import module_graph

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "architecture.rst").read_text()

#: The wing each variant's kernels live in (the tensor-core variant's last route is the FFMA kernel above d = 128).
WING = {
    "readable": ("numba_flash.",),
    "fast": ("numba_flash.fast.",),
    "tensorcore": ("numba_flash.tensorcore.", "numba_flash.fast."),
}


def test_every_registered_kernel_lives_in_its_variants_wing():
    kernels = registry.variants()
    assert {k.variant for k in kernels} == set(WING)
    for k in kernels:
        name = k.module.__name__
        assert name.startswith(WING[k.variant]), (k.variant, name)
        if k.variant == "readable":
            assert name.count(".") == 1, f"a readable kernel sits at the top of the package: {name}"


def test_the_routed_variant_runs_every_problem_and_says_which_rule_chose_it():
    for key, entry in registry.KERNELS.items():
        if isinstance(entry, tuple):
            assert all(r.when for r in entry), key
            assert entry[-1].runs is registry._always, f"{key}: the last route must take every problem"


def test_import_graph_has_no_cycle_and_readable_modules_import_no_fast_wing():
    g = module_graph.graph(ROOT)
    _, cyclic = module_graph.levels(g)
    assert cyclic == []
    assert module_graph.wing_violations(g) == []


def test_the_wing_check_catches_a_readable_module_importing_a_tensor_core_kernel():
    g = {
        "numba_flash.fa2_forward": {"numba_flash.tensorcore.ptx"},
        "numba_flash.tensorcore.ptx": set(),
        "numba_flash.registry": {"numba_flash.tensorcore.ptx"},
    }
    assert module_graph.wing_violations(g) == [("numba_flash.fa2_forward", "numba_flash.tensorcore.ptx")]


def test_no_kernel_module_imports_another_kernel_of_its_algorithm_and_pass():
    g = module_graph.graph(ROOT)
    by_pass: dict[tuple[str, str], set[str]] = {}
    for k in registry.variants():
        by_pass.setdefault((k.algorithm, k.pass_), set()).add(k.module.__name__)
    for (alg, pass_), mods in by_pass.items():
        for m in mods:
            others = (mods - {m}) & g[m]
            assert not others, (
                f"{m} imports {sorted(others)}: the registry, not a kernel, picks the {alg} {pass_} kernel"
            )


def test_the_page_shows_the_registry_table_and_lists_every_wing():
    assert ".. code-marker:: numba_flash/registry.py\n   :marker: registry-table" in PAGE
    for pkg in sorted(p.parent.name for p in (ROOT / "numba_flash").glob("*/__init__.py")):
        assert f"``numba_flash/{pkg}/``" in PAGE, f"the wing {pkg}/ is missing from docs/architecture.rst"


@pytest.mark.parametrize("role,target", sorted(set(re.findall(r":(func|mod|class):`~?([\w.]+)`", PAGE))))
def test_every_name_the_page_cites_exists(role, target):
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{target} does not import")


#: The longest a function in ``numba_flash`` may be, docstring included.
MAX_FUNCTION_LINES = 300
#: A commit cited in prose: 7 to 12 hex digits with at least one letter and one digit, not part of a longer word.
COMMIT = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![0-9A-Za-z_])")


def _package_files():
    return sorted((ROOT / "numba_flash").rglob("*.py"))


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, from line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit
    ]


def docstring_commits(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False) or ""
            found += [f"{getattr(node, 'name', 'module')}: {m}" for m in COMMIT.findall(doc)]
    return found


def test_no_function_in_the_package_is_longer_than_300_lines():
    rel = {p.relative_to(ROOT).as_posix(): long_functions(p) for p in _package_files()}
    assert not {k: v for k, v in rel.items() if v}


def test_no_docstring_in_the_package_cites_a_commit():
    rel = {p.relative_to(ROOT).as_posix(): docstring_commits(p) for p in _package_files()}
    assert not {k: v for k, v in rel.items() if v}


def test_the_size_and_commit_checks_catch_what_they_claim(tmp_path):
    f = tmp_path / "k.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(300))
    f.write_text(
        f'"""Fixed in a1b2c3d, timed at 4096 and 0x1f2e."""\n\n\ndef short():\n    return 1\n\n\ndef big():\n{body}\n'
    )
    assert long_functions(f) == ["big (301 lines, from line 8)"]
    assert docstring_commits(f) == ["module: a1b2c3d"]
