"""``test-claims``: the claims the test suite checks, read from the test files at build time.

Usage in a page::

    .. test-claims:: tests/reference
       :pattern: test_*.py

For every test module in the folder (relative to the repository root; ``:recursive:`` descends): its
docstring's first paragraph, then one item per test function: the name (which states the claim), its
``gpu`` / ``slow`` markers, and the first paragraph of its docstring if it has one. Test names are the
claims, so the page cannot drift from the suite; a folder with no test module is a build error.
"""

from __future__ import annotations

import ast
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

MARKS = ("gpu", "slow", "simulator_only")


def _marks(fn: ast.FunctionDef) -> list[str]:
    out = []
    for dec in fn.decorator_list:
        text = ast.unparse(dec)
        for m in MARKS:
            if f"mark.{m}" in text:
                out.append(m)
    return out


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def collect(path: Path) -> tuple[str, list[tuple[str, str, list[str]]]]:
    """(module summary, [(test name, docstring first line, marks), ...]) of one test file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = (ast.get_docstring(tree) or "").strip().split("\n\n")[0].replace("\n", " ")
    module_marks = []
    for node in tree.body:  # pytestmark = pytest.mark.slow / [..]
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            module_marks = [m for m in MARKS if f"mark.{m}" in ast.unparse(node.value)]
    tests = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
                    first = _first_paragraph(ast.get_docstring(fn))
                    tests.append((f"{node.name}.{fn.name}", first, module_marks + _marks(fn)))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            first = _first_paragraph(ast.get_docstring(node))
            tests.append((node.name, first, module_marks + _marks(node)))
    return doc, tests


class TestClaims(SphinxDirective):
    required_arguments = 1
    has_content = False
    option_spec = {"pattern": directives.unchanged_required, "recursive": directives.flag}

    def run(self):
        root = Path(self.config.code_marker_root)
        if not root.is_absolute():
            root = (Path(self.env.app.confdir) / root).resolve()
        folder = root / self.arguments[0]
        pattern = self.options.get("pattern", "test_*.py")
        finder = folder.rglob if "recursive" in self.options else folder.glob
        files = sorted(finder(pattern)) if folder.is_dir() else []
        if not files:
            raise self.error(f"test-claims: no test module matches {self.arguments[0]}/{pattern}")
        out = []
        for f in files:
            self.env.note_dependency(str(f))
            try:
                doc, tests = collect(f)
            except SyntaxError as exc:
                raise self.error(f"test-claims: {f}: {exc}") from None
            if not tests:
                continue
            rel = f.relative_to(root).as_posix()
            out.append(nodes.rubric(rel, "", nodes.literal(rel, rel)))
            if doc:
                out.append(nodes.paragraph(doc, doc))
            items = nodes.bullet_list()
            for name, first, marks in tests:
                para = nodes.paragraph()
                para += nodes.literal(name, name)
                if marks:
                    tag = " [" + ", ".join(marks) + "]"
                    para += nodes.emphasis(tag, tag)
                if first:
                    para += nodes.Text(": " + first)
                items += nodes.list_item("", para)
            out.append(items)
        return out


def setup(app):
    app.add_directive("test-claims", TestClaims)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
