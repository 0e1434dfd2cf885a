"""Traceability: every paper line is findable in the code, in order, and every docs marker resolves.

The claims checked here are about the *source*, not the numbers:

* **Paper tags are well formed and ascend.** A paper tag is a comment that *starts* with one or more
  tags and a colon: ``# Alg.1 L9: S_ij = Q_i K_j^T``, ``# Alg.2 L10-L11: ...``,
  ``# FA2.1 L8: ...``, ``# Alg.1 L9 / Alg.2 L10: ...`` (a line of a kernel that computes a step of
  two algorithms). A mention of a line later in a comment (``# Dev: as in Alg.2 L11``) is prose, not
  a tag. Per file and per algorithm the tags ascend in file order, with one exception, the
  **recurrence rule**: a tag may go back to an earlier line only when it and the tag before it both
  lie inside the body of one loop of the paper's algorithm (strictly between the loop's ``for`` line
  and its ``end for`` line, as listed in :data:`LOOPS`). Code that re-enters a loop body, e.g. a
  second pass over the masked diagonal tiles after the unmasked ones, or a line split in two around
  another (FA2.1 L9's ``l`` update after L10's rescale), may repeat the body's lines; nothing else
  goes backwards. A step done by a shared helper is tagged at its call site.
* **Every work line is tagged** in the kernel module *and* in the reference module of its algorithm
  (:data:`WORK_LINES`, :data:`TAGGED_FILES`). The bare ``end for`` / ``end if`` lines are exempt. A
  file that does not exist yet fails (it does not skip): the kernels are part of the package.
* **Docs markers** ``# [doc:NAME]`` ... ``# [/doc:NAME]`` are balanced and nested, once per file, and
  every ``.. code-marker::`` on a docs page names a file and a marker that exist (the Sphinx build
  checks this too; this test says which page is broken without building the docs).
* **Every barrier says what it protects**: each ``cuda.syncthreads()`` line in ``numba_flash/``
  carries a ``# Sync: <what it protects>`` comment on the same line.
"""

from __future__ import annotations

import importlib.util
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Number of numbered lines of each algorithm (paper notes: /work/shared/notes/paper.md and the papers).
N_LINES = {"Alg.0": 4, "Alg.1": 16, "Alg.2": 19, "Alg.3": 6, "Alg.4": 26, "Alg.5": 20, "FA2.1": 17, "FA2.2": 20}

#: (for-line, end-for-line) of each loop of each algorithm. The body is strictly between the two.
LOOPS = {
    "Alg.0": [],
    "Alg.1": [(5, 15), (7, 14)],
    "Alg.2": [(6, 18), (8, 17)],
    "Alg.3": [],
    "Alg.4": [(6, 25), (9, 23)],
    "Alg.5": [(5, 19), (7, 18)],
    "FA2.1": [(3, 16), (6, 11)],
    "FA2.2": [(5, 19), (8, 17)],
}


def _lines(*spans):
    out = set()
    for s in spans:
        lo, hi = s if isinstance(s, tuple) else (s, s)
        out |= set(range(lo, hi + 1))
    return frozenset(out)


#: The numbered lines that do work: every line but the bare "end for" / "end if".
#: FA1 Alg.1: L14-L15 end for. Alg.2: L17-L18 end for. Alg.4: L23, L25 end for.
#: FA2 Alg.1: L11, L16 end for. FA2 Alg.2: L17, L19 end for. Alg.5: L17 end if, L18-L19 end for.
WORK_LINES = {
    "Alg.0": _lines((1, 4)),
    "Alg.1": _lines((1, 13), 16),
    "Alg.2": _lines((1, 16), 19),
    "Alg.3": _lines((1, 6)),
    "Alg.4": _lines((1, 22), 24, 26),
    "Alg.5": _lines((1, 16), 20),
    "FA2.1": _lines((1, 10), (12, 15), 17),
    "FA2.2": _lines((1, 16), 18, 20),
}

#: Which file must tag every work line of which algorithm. The FA1 kernel module implements
#: Algorithm 1 and Algorithm 2 (Algorithm 2 is Algorithm 1 plus scale, mask and dropout).
TAGGED_FILES = [
    ("Alg.1", "reference/alg1_forward.py"),
    ("Alg.1", "numba_flash/alg1_forward.py"),
    ("Alg.2", "reference/alg2_forward.py"),
    ("Alg.2", "numba_flash/alg1_forward.py"),
    ("Alg.4", "reference/alg4_backward.py"),
    ("Alg.4", "numba_flash/alg4_backward.py"),
    ("FA2.1", "reference/fa2_forward.py"),
    ("FA2.1", "numba_flash/fa2_forward.py"),
    ("FA2.2", "reference/fa2_backward.py"),
    ("FA2.2", "numba_flash/fa2_backward.py"),
    # References of the other algorithms (no kernel twin is required for these).
    ("Alg.0", "reference/alg0_standard.py"),
    ("Alg.3", "reference/alg3_backward.py"),
    ("Alg.5", "reference/alg5_block_sparse.py"),
]

def _load_doc_markers():
    """docs/_ext/doc_markers.py: the one grammar of docs markers and paper tags (no Sphinx needed)."""
    spec = importlib.util.spec_from_file_location("doc_markers", ROOT / "docs" / "_ext" / "doc_markers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("doc_markers", mod)  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(mod)
    return mod


doc_markers = _load_doc_markers()


@dataclass(frozen=True)
class Tag:
    alg: str
    first: int  # first paper line
    last: int  # last paper line (== first unless a range)
    lineno: int  # line in the source file
    text: str


def parse_tags(path: Path) -> tuple[list[Tag], list[str]]:
    """All paper tags of a file in file order, and the grammar errors found."""
    tags, errors = [], []
    for lineno, text in sorted(doc_markers.comments(path.read_text(encoding="utf-8")).items()):
        found = doc_markers.paper_tags(text)
        if found is None:
            if doc_markers.TAG_LIKE.match(text):
                errors.append(f"{path.name}:{lineno}: malformed paper tag {text!r} "
                              "(expected e.g. '# Alg.1 L9: ...', '# FA2.1 L8-L9: ...')")
            continue
        for alg, a, b in found:
            if not (1 <= a <= b <= N_LINES[alg]):
                errors.append(f"{path.name}:{lineno}: {alg} has lines 1-{N_LINES[alg]}; "
                              f"tag '{alg} L{a}" + (f"-L{b}" if b != a else "") + "' is out of range or reversed")
                continue
            tags.append(Tag(alg, a, b, lineno, text.strip()))
    return tags, errors


def order_errors(tags: list[Tag], alg: str) -> list[str]:
    """Violations of the ascending order / recurrence rule for one algorithm's tags of one file."""
    errors = []
    seq = [t for t in tags if t.alg == alg]
    for prev, cur in zip(seq, seq[1:]):
        if cur.first >= prev.first:
            continue
        lo, hi = min(cur.first, prev.first), max(cur.last, prev.last)
        if any(head < lo and hi < end for head, end in LOOPS[alg]):
            continue  # both inside one loop body: the loop's lines may recur
        errors.append(
            f"line {cur.lineno}: {alg} L{cur.first} follows L{prev.first} (line {prev.lineno}) "
            f"but the two are not inside one loop body of {alg} (loops: "
            + (", ".join(f"L{h}..L{e}" for h, e in LOOPS[alg]) or "none") + ")"
        )
    return errors


def _py_files(*folders):
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if ".venv" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


SOURCE_FILES = _py_files("numba_flash", "reference")


# ------------------------------------------------------------------------------------------------
# Paper tags
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SOURCE_FILES, ids=_rel)
def test_paper_tags_are_well_formed_and_ascend_in_file_order(path):
    tags, errors = parse_tags(path)
    for alg in sorted({t.alg for t in tags}):
        errors += [f"{_rel(path)} {e}" for e in order_errors(tags, alg)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(("alg", "relpath"), TAGGED_FILES, ids=[f"{a}-{p}" for a, p in TAGGED_FILES])
def test_every_work_line_of_the_algorithm_is_tagged(alg, relpath):
    path = ROOT / relpath
    assert path.is_file(), f"{relpath} does not exist: it must implement and tag {alg}"
    tags, _ = parse_tags(path)
    covered = set()
    for t in tags:
        if t.alg == alg:
            covered |= set(range(t.first, t.last + 1))
    missing = sorted(WORK_LINES[alg] - covered)
    assert not missing, f"{relpath} has no tag for {alg} line(s) " + ", ".join(f"L{n}" for n in missing)


# The rule itself must be able to fail: these are the mistakes it exists to catch.
def _tags(alg, *lines):
    return [Tag(alg, a, b, k, "") for k, (a, b) in enumerate((x, x) if isinstance(x, int) else x for x in lines)]


def test_recurrence_rule_rejects_a_step_back_out_of_the_loop_body():
    # A launcher written after its kernel: L1 after L16 of Alg.1 crosses every loop.
    assert order_errors(_tags("Alg.1", 5, 9, 13, 16, 1), "Alg.1")
    # L6 of FA2.1 is the inner loop's header; going back to L4 from L10 leaves the inner body
    # but stays in the outer one (L3..L16), so it is allowed; L2 is outside every loop.
    assert not order_errors(_tags("FA2.1", 3, 4, 6, 10, 4), "FA2.1")
    assert order_errors(_tags("FA2.1", 3, 4, 6, 10, 2), "FA2.1")
    # Algorithm 0 has no loop: nothing may go back.
    assert order_errors(_tags("Alg.0", 1, 2, 1), "Alg.0")


def test_recurrence_rule_accepts_a_second_pass_over_a_loop_body():
    # FA2.1 split into unmasked tiles then diagonal tiles: L7-L10 twice inside the j loop.
    assert not order_errors(_tags("FA2.1", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 7, 8, 9, 10, 12, 13), "FA2.1")
    # A line split around another (L9's l update after L10's rescale).
    assert not order_errors(_tags("FA2.1", 8, 9, 10, 9, 10), "FA2.1")
    # Ranges count by their first line.
    assert not order_errors(_tags("Alg.2", (10, 11), 11, 12), "Alg.2")


def test_tag_grammar_separates_tags_from_prose_and_flags_typos(tmp_path):
    f = tmp_path / "k.py"
    f.write_text(
        "x = 1  # Alg.1 L9: S_ij = Q_i K_j^T\n"
        "# Alg.1 L10 / Alg.2 L12: rowmax\n"
        "# Dev: as in Alg.2 L11, the mask\n"
        "# Alg.2 L13-L14: merge\n"
        "# Alg 1 L11: typo\n"
        "# Alg.1 L99: out of range\n"
        "s = '# Alg.1 L3: in a string, not a comment'\n"
    )
    tags, errors = parse_tags(f)
    assert [(t.alg, t.first, t.last) for t in tags] == [
        ("Alg.1", 9, 9), ("Alg.1", 10, 10), ("Alg.2", 12, 12), ("Alg.2", 13, 14)]
    assert len(errors) == 2 and "malformed" in errors[0] and "out of range" in errors[1]


# ------------------------------------------------------------------------------------------------
# Docs markers
# ------------------------------------------------------------------------------------------------
MARKED_FILES = _py_files("numba_flash", "reference", "tests", "tutorials")
PAGES = sorted((ROOT / "docs").glob("*.rst"))


@pytest.mark.parametrize("path", MARKED_FILES, ids=_rel)
def test_docs_markers_are_balanced_and_unique(path):
    doc_markers.scan(path.read_text(encoding="utf-8"), _rel(path))  # raises MarkerError


def test_marker_grammar_rejects_unbalanced_crossed_and_duplicate_regions():
    for bad in (
        "# [doc:a]\nx\n",  # never closed
        "x\n# [/doc:a]\n",  # never opened
        "# [doc:a]\n# [doc:b]\n# [/doc:a]\n# [/doc:b]\n",  # crossed
        "# [doc:a]\n# [/doc:a]\n# [doc:a]\n# [/doc:a]\n",  # twice
        "# [doc: a]\n",  # malformed
    ):
        with pytest.raises(doc_markers.MarkerError):
            doc_markers.scan(bad)
    regions = doc_markers.scan("# [doc:outer]\n# [doc:inner]\nx\n# [/doc:inner]\n# [/doc:outer]\n")
    assert set(regions) == {"outer", "inner"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_code_markers_referenced_by_the_page_exist(page):
    problems = []
    for lineno, rel, options in doc_markers.references_in_rst(page.read_text(encoding="utf-8")):
        marker = options.get("marker")
        if marker is None:
            problems.append(f"{page.name}:{lineno}: code-marker {rel} has no :marker: option")
            continue
        try:
            doc_markers.extract(ROOT / rel, marker)
            tags = [t.strip() for t in options.get("tag", "").split(";") if t.strip()]
            if tags:
                doc_markers.extract_steps(ROOT / rel, marker, tags)
        except doc_markers.MarkerError as exc:
            problems.append(f"{page.name}:{lineno}: {exc}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------
# Barriers
# ------------------------------------------------------------------------------------------------
SYNC_NAMES = {"syncthreads", "syncthreads_count", "syncthreads_and", "syncthreads_or", "syncwarp"}
SYNC_COMMENT = re.compile(r"#\s*Sync:\s*\S")


def barrier_lines_without_reason(path: Path) -> list[int]:
    """Lines that call a barrier without a ``# Sync: <reason>`` comment on the same line."""
    src = path.read_text(encoding="utf-8")
    calls, reasons = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NAME and tok.string in SYNC_NAMES:
            calls.add(tok.start[0])
        elif tok.type == tokenize.COMMENT and SYNC_COMMENT.search(tok.string):
            reasons.add(tok.start[0])
    return sorted(calls - reasons)


@pytest.mark.parametrize("path", _py_files("numba_flash"), ids=_rel)
def test_every_barrier_says_what_it_protects(path):
    bad = barrier_lines_without_reason(path)
    assert not bad, f"{_rel(path)}: cuda.syncthreads() without '# Sync: ...' on line(s) {bad}"


def test_barrier_check_flags_a_bare_syncthreads(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("cuda.syncthreads()  # Sync: K_j in SRAM\ncuda.syncthreads()\n# cuda.syncthreads() in prose\n")
    assert barrier_lines_without_reason(f) == [2]


# ------------------------------------------------------------------------------------------------
# Symbol tables in kernel docstrings
# ------------------------------------------------------------------------------------------------
#: The kernel modules: each must carry at least one symbol table (paper symbol -> variable -> memory).
KERNEL_MODULES = [
    "numba_flash/alg0_standard.py",
    "numba_flash/alg1_forward.py",
    "numba_flash/alg3_backward.py",
    "numba_flash/alg4_backward.py",
    "numba_flash/fa2_forward.py",
    "numba_flash/fast/fa2_forward.py",
    "numba_flash/fa2_backward.py",
]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARENS = re.compile(r"\(([^()]*)\)")
_IDENT_LIST = re.compile(r"[+\s]*[A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*\s*")


def variable_names(cell: str) -> list[str]:
    """The identifiers a symbol table's variable cell names.

    A parenthesized group counts only if it is a list of identifiers (``(seed, threshold)``,
    ``(+ rdQ)``); otherwise it is a remark (``(this thread's entries)``) and is ignored.
    """
    cell = _PARENS.sub(lambda m: m.group(1) if _IDENT_LIST.fullmatch(m.group(1)) else " ", cell)
    return _IDENT.findall(cell)


def symbol_tables(src: str) -> list[tuple[int, list[tuple[str, str, str]]]]:
    """``(line, rows)`` for each docstring symbol table: a reST simple table after 'Symbol table'.

    A row is ``(paper symbol, variable, memory space)``, split on runs of two or more spaces.
    """
    import ast

    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node, clean=True)
        if not doc or "Symbol table" not in doc:
            continue
        lines = doc.splitlines()
        start = next(k for k, ln in enumerate(lines) if "Symbol table" in ln)
        borders = [k for k in range(start, len(lines)) if re.fullmatch(r"\s*=+(\s+=+)+\s*", lines[k])]
        if len(borders) < 2:
            continue  # prose that mentions a symbol table ("as in :func:`...`"), not a table
        rows = []
        for ln in lines[borders[0] + 1:borders[1]]:
            cells = re.split(r"\s{2,}", ln.strip())
            if len(cells) >= 3:
                rows.append((cells[0], cells[1], cells[2]))
        out.append((getattr(node, "lineno", 1), rows))
    return out


@pytest.mark.parametrize("relpath", KERNEL_MODULES)
def test_kernel_symbol_tables_name_variables_that_exist(relpath):
    """Each kernel module has a symbol table, and every variable it names occurs in the module's code.

    A table that names a renamed or deleted variable misleads the reader who puts it beside the code.
    """
    path = ROOT / relpath
    assert path.is_file(), f"{relpath} does not exist"
    src = path.read_text(encoding="utf-8")
    tables = symbol_tables(src)
    assert tables, f"{relpath}: no docstring has a symbol table (paper symbol -> variable -> memory space)"
    code_names = {tok.string for tok in tokenize.generate_tokens(io.StringIO(src).readline)
                  if tok.type == tokenize.NAME}
    missing = []
    for line, rows in tables:
        assert rows, f"{relpath}:{line}: the symbol table has no rows"
        for paper, variable, _space in rows:
            for name in variable_names(variable):
                if name not in code_names:
                    missing.append(f"line {line}: {paper!r} -> {name!r}")
    assert not missing, f"{relpath}: symbol table names variables the code does not have:\n" + "\n".join(missing)


def test_symbol_table_check_flags_a_stale_variable():
    src = '''def kernel(gQ):
    """K.

    Symbol table (paper symbol -> variable -> memory space):

    =====  ======  ====
    Q_i    sQ_i    SRAM
    =====  ======  ====
    """
    return gQ
'''
    (line, rows), = symbol_tables(src)
    assert rows == [("Q_i", "sQ_i", "SRAM")]
    names = {t.string for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.NAME}
    assert "sQ_i" not in names  # the table names a variable the code does not have: the test would fail
    assert variable_names("rS (this thread's entries)") == ["rS"]
    assert variable_names("tau, (seed, threshold)") == ["tau", "seed", "threshold"]
