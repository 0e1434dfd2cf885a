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

# Number of numbered lines of each algorithm (from the papers: FA1 arXiv 2205.14135, FA2 arXiv 2307.08691).
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
#: Algorithm 1, Algorithm 2 (Algorithm 1 plus scale, mask and dropout) and Algorithm 5 (Algorithm 2
#: plus the block mask's test, line 8) in one kernel body.
TAGGED_FILES = [
    ("Alg.1", "reference/alg1_forward.py"),
    ("Alg.1", "numba_flash/alg1_forward.py"),
    ("Alg.2", "reference/alg2_forward.py"),
    ("Alg.2", "numba_flash/alg1_forward.py"),
    ("Alg.5", "numba_flash/alg1_forward.py"),
    ("Alg.4", "reference/alg4_backward.py"),
    ("Alg.4", "numba_flash/alg4_backward.py"),
    ("FA2.1", "reference/fa2_forward.py"),
    ("FA2.1", "numba_flash/fa2_forward.py"),
    ("FA2.2", "reference/fa2_backward.py"),
    ("FA2.2", "numba_flash/fa2_backward.py"),
    # References of the other algorithms (no kernel twin is required for these).
    ("Alg.0", "reference/alg0_standard.py"),
    ("Alg.0", "numba_flash/alg0_standard.py"),
    ("Alg.3", "reference/alg3_backward.py"),
    ("Alg.3", "numba_flash/alg3_backward.py"),
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
                errors.append(
                    f"{path.name}:{lineno}: malformed paper tag {text!r} "
                    "(expected e.g. '# Alg.1 L9: ...', '# FA2.1 L8-L9: ...')"
                )
            continue
        for alg, a, b in found:
            if not (1 <= a <= b <= N_LINES[alg]):
                errors.append(
                    f"{path.name}:{lineno}: {alg} has lines 1-{N_LINES[alg]}; "
                    f"tag '{alg} L{a}" + (f"-L{b}" if b != a else "") + "' is out of range or reversed"
                )
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
            + (", ".join(f"L{h}..L{e}" for h, e in LOOPS[alg]) or "none")
            + ")"
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
        ("Alg.1", 9, 9),
        ("Alg.1", 10, 10),
        ("Alg.2", 12, 12),
        ("Alg.2", 13, 14),
    ]
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
        for ln in lines[borders[0] + 1 : borders[1]]:
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
    code_names = {
        tok.string for tok in tokenize.generate_tokens(io.StringIO(src).readline) if tok.type == tokenize.NAME
    }
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
    ((line, rows),) = symbol_tables(src)
    assert rows == [("Q_i", "sQ_i", "SRAM")]
    names = {t.string for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.NAME}
    assert "sQ_i" not in names  # the table names a variable the code does not have: the test would fail
    assert variable_names("rS (this thread's entries)") == ["rS"]
    assert variable_names("tau, (seed, threshold)") == ["tau", "seed", "threshold"]


# ------------------------------------------------------------------------------------------------
# Tags tied to code: what the code after a tag must contain
# ------------------------------------------------------------------------------------------------
def _code_only(text: str) -> dict[int, str]:
    """``{line: code}`` with comments removed and every string literal emptied (docstrings say nothing)."""
    lines = text.splitlines()
    out = {k + 1: ln for k, ln in enumerate(lines)}
    for tok in reversed(list(tokenize.generate_tokens(io.StringIO(text).readline))):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        (r0, c0), (r1, c1) = tok.start, tok.end
        keep = "" if tok.type == tokenize.COMMENT else '""'
        if r0 == r1:
            out[r0] = out[r0][:c0] + keep + out[r0][c1:]
        else:
            out[r0] = out[r0][:c0] + keep
            for r in range(r0 + 1, r1):
                out[r] = ""
            out[r1] = out[r1][c1:]
    return out


@dataclass(frozen=True)
class TagSpan:
    """A tag comment and the code it sits on: from the tag to the next tag or the end of its function."""

    lineno: int
    end: int
    tags: tuple[tuple[str, int, int], ...]
    code: str


def tag_spans(text: str) -> list[TagSpan]:
    """The span of every tag comment of Python source ``text``.

    A span runs from the tag's line to the line before the next tag, but never past the end of the
    function that contains the tag (a tag outside any function: the statement that follows it). Its
    ``code`` has comments and string literals removed, so that a rule is met by code, not by prose.
    """
    import ast

    tree = ast.parse(text)
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    tag_lines = sorted(ln for ln, c in doc_markers.comments(text).items() if doc_markers.paper_tags(c))
    code = _code_only(text)
    spans = []
    for k, s in enumerate(tag_lines):
        end = (tag_lines[k + 1] - 1) if k + 1 < len(tag_lines) else len(code)
        inside = [f for f in funcs if f.lineno <= s <= f.end_lineno]
        if inside:
            end = min(end, max(inside, key=lambda f: f.lineno).end_lineno)
        else:
            after = [n for n in tree.body if n.lineno > s]
            if after:
                end = min(end, after[0].end_lineno)
        tags = tuple(doc_markers.paper_tags(doc_markers.comments(text)[s]))
        spans.append(TagSpan(s, end, tags, "\n".join(code[n] for n in range(s, end + 1) if code[n].strip())))
    return spans


# Operands, by the names the readable kernels, their fast twins and the references give them. A fast
# kernel's step may be a call to a helper of numba_flash.fast._regtile whose name states the operation
# (qkt_tile: Q K^T; pv_tile: P~ V; s_dp_p_ds: S, dP, P, dS; dv_dk_update; dq_tile).
# The tensor-core forwards' steps of numba_flash.tensorcore.forward_steps name theirs likewise (init_o_l_m: line 5;
# online_softmax: line 9; write_o_l: lines 12-15), and the tensor-core backwards' of
# numba_flash.tensorcore.backward_steps (load_q_do_l_d: line 9's Q_i, dO_i, L_i, D_i).
_Q = r"\b(?:s?Q_i|Q|gQ|OFF_Q|qbase|q0)\b"
_K = r"\b(?:s?K_j|K|gK|OFF_K|kbase|k0)\b"
_V = r"\b(?:s?V_j|V|gV|OFF_V|vbase|v0)\b"
_DO = r"\b(?:s?dO_i|dO|gdO|dout|OFF_DO|rdo)\b"
_PRODUCT = r"@|\+=[^\n]*\*|\*\s*\(|\bmma\w*\(|\bmatmul\("
_MAX = r"\bmax\(|\.max\(|\bmaximum\(|row_max"
_EXP = r"\bexp2?\(|softmax_p_tile\(|\bsoftmax\w*\("
_NEG_INF = r"-\s*(?:np|math)\.inf|\bNEG_INF\b|float32\(-math\.inf\)"
_ZERO = r"\bzeros\b|\bZERO\b|=\s*(?:float32\()?0\.0|\bnp\.zeros\("
_DIV_L = r"/\s*(?:\(|np\.where\([^,]*,\s*)?\s*\w*\bl(?:_new|_i|_r)?\b|\binv_l\b|recompute_probabilities\(|row_softmax"
_DS = r"\*\s*\(\s*[\w\[\], ]+\s*-\s*\w*D\w*|s_dp_p_ds\(|ds_kernel"


@dataclass(frozen=True)
class ContentRule:
    """What the code of a paper line must contain: any one of ``alternatives``, each a tuple of regexes
    that must all match the span's code."""

    says: str
    alternatives: tuple[tuple[str, ...], ...]

    def holds(self, code: str) -> bool:
        return any(all(re.search(rx, code) for rx in alt) for alt in self.alternatives)


def rule(says, *alternatives):
    return ContentRule(says, tuple(a if isinstance(a, tuple) else (a,) for a in alternatives))


_S_QK = rule(
    "S = (tau) Q K^T: a product of Q_i and K_j",
    (_Q, _K, _PRODUCT),
    (_Q, _K, r"\bs_tile_step\("),
    r"\bqkt_tile\(",
    r"\bs_dp_p_ds\(",
)  # Dev: s_tile_step: the 3xTF32 forwards' mma step of S (fragments.make_s_steps)
_S_TAU_QK = rule("S = tau Q K^T: the product, or the scale by tau", *_S_QK.alternatives, r"\btau\s*\*")
_SPLIT = rule("split into blocks: Tr, Tc or the row/column blocks", r"\bT[rc]\b|seq_blocks|row_blocks|col_blocks")
_LOOP = rule("a loop (or the thread block's index)", r"\bfor\b|\bblockIdx\b|\bkey_block\(|\bquery_block\(")
_LOAD_KV = rule(
    "K_j and V_j read from HBM",
    (r"\bgK\[", r"\bgV\["),
    r"\bload_kv?\(",
    (r"\bload_k_async\(", r"\bload_v_async\("),
    # the readable kernels' shared copy (numba_flash._tiles_readable.load_tile), with the paper's names
    (r"\bload_tile\(\s*sK_j\s*,\s*gK\b", r"\bload_tile\(\s*sV_j\s*,\s*gV\b"),
)
_BLOCK_SIZES = rule("block sizes Br, Bc", r"\bB[rcRC]\b|block_sizes|\bBCC?\b")
_INIT_O_L_M = rule("O = 0, l = 0 and m = -inf", (_ZERO, _NEG_INF), r"\binit_o_l_m\(")
_LOAD_Q_O_L_M = rule("Q_i, O_i, l_i, m_i read from HBM", (r"\bgQ\[", r"\bgO\[", r"\bgl\[", r"\bgm\["))
_ROWMAX = rule("the row max of S (the first of line 10's three steps)", _MAX)
_M_NEW = rule("m_new = max(m_i, m~_ij) and the rescale factors", (r"\bm_new\b", _MAX, r"\bexp2?\(|\brescale\("))
_O_UPDATE_FA1 = rule(
    "O_i <- diag(l_new)^-1 (... P~ V_j): a product with V_j and a division by l",
    ((_V, _PRODUCT, _DIV_L)),
    (r"\bpv_tile\(", _DIV_L),
)
_WRITE_L_M = rule("l and m written to HBM", (r"\bgl\[[^\]]*\]\s*=", r"\bgm\[[^\]]*\]\s*="))
_RETURN = rule("return", r"\breturn\b")
_WRITE_O_L = r"\bwrite_o_l\("  # lines 12-15 in one step of the tensor-core forwards (forward_steps.make_write_o_l)
_PRNG = rule("the PRNG state: the seed", r"\bseed\b|\bhead_key\(")
_MASK = rule(
    "mask(S): -inf (or P = 0) where a key is hidden",
    (r"causal|visible|\bmask", _NEG_INF),
    (r"causal|visible", r"<=|>"),
    r"\bmask_tile\(",
)
_DROPOUT = rule("dropout: the keep-mask Z", r"\bkeep\(|dropout_scale_matrix\(|softmax_p_tile\(")
_DV_UPDATE = rule("dV += (P o Z)^T dO: dV and dO", (r"(?i)\bg?r?dV\w*", _DO, _PRODUCT), r"\bdv_dk_update\(")
_DK_UPDATE = rule("dK += tau dS^T Q: dK and Q_i", (r"(?i)\bg?r?dK\w*", _Q, _PRODUCT), r"\bdv_dk_update\(")
_DP = rule("dP = dO V^T: a product of dO_i and V_j", (_DO, _V, _PRODUCT), r"\bs_dp_p_ds\(")
_DS_RULE = rule("dS = P o (dP - D_i)", _DS)
_DQ_UPDATE = rule("dQ_i += tau dS K_j: dQ and K_j", (r"(?i)\bg?r?dQ\w*", _K), (r"(?i)\bg?r?dQ\w*", r"\bdq_tile\("))
_WRITE_DK_DV = rule("dK_j, dV_j written to HBM", (r"\bgdK\[", r"\bgdV\["), r"\bstore_dk_dv\(")
_D_ROWSUM = rule(
    "D_i = rowsum(dO o O)",
    (r"\b[gs]?D\w*\s*(?:\[[^\]]*\])?\s*\+?=", r"\+=|\bsum\(|\*"),
    r"\brow_dot\(",
    r"\brow_stats\(",
    r"\bs_dp_p_ds\(",
)

#: (algorithm, paper line) -> what the code after its tag must contain. A line absent from this table
#: must be in NO_CONTENT_RULE, with the reason.
CONTENT_RULES: dict[tuple[str, int], ContentRule] = {
    ("Alg.0", 1): rule(
        "S = tau Q K^T, written to HBM", (r"\bq\b|\bQ\b", r"\bk\b|\bK\b", r"\bmatmul\(|masked_scores\(|@")
    ),
    ("Alg.0", 2): rule("P = softmax(S)", r"softmax"),
    ("Alg.0", 3): rule("O = P V", (r"\bS\b|\bP\w*", r"\bv\b|\bV\b", r"\bmatmul\(|@")),
    ("Alg.0", 4): _RETURN,
    ("Alg.1", 1): _BLOCK_SIZES,
    ("Alg.1", 2): _INIT_O_L_M,
    ("Alg.1", 3): _SPLIT,
    ("Alg.1", 5): _LOOP,
    ("Alg.1", 6): _LOAD_KV,
    ("Alg.1", 7): _LOOP,
    ("Alg.1", 8): _LOAD_Q_O_L_M,
    ("Alg.1", 9): _S_QK,
    ("Alg.1", 10): _ROWMAX,
    ("Alg.1", 11): _M_NEW,
    ("Alg.1", 12): _O_UPDATE_FA1,
    ("Alg.1", 13): _WRITE_L_M,
    ("Alg.1", 16): _RETURN,
    ("Alg.2", 1): _PRNG,
    ("Alg.2", 2): _BLOCK_SIZES,
    ("Alg.2", 3): _INIT_O_L_M,
    ("Alg.2", 4): _SPLIT,
    ("Alg.2", 6): _LOOP,
    ("Alg.2", 7): _LOAD_KV,
    ("Alg.2", 8): _LOOP,
    ("Alg.2", 9): _LOAD_Q_O_L_M,
    ("Alg.2", 10): _S_TAU_QK,
    ("Alg.2", 11): _MASK,
    ("Alg.2", 12): _ROWMAX,
    ("Alg.2", 13): _M_NEW,
    ("Alg.2", 14): _DROPOUT,
    ("Alg.2", 15): _O_UPDATE_FA1,
    ("Alg.2", 16): _WRITE_L_M,
    ("Alg.2", 19): _RETURN,
    ("Alg.3", 1): rule("dV = (P o Z)^T dO", (r"(?i)\bg?dv\b|\bdV\b", _DO)),
    ("Alg.3", 2): rule("dP = dO V^T", (r"\bdP\b|\bgdP\b", _DO, r"\bv\b|\bV\b")),
    ("Alg.3", 3): rule("dS = P o (dP - D) with D = rowsum(P o dP)", _DS),
    ("Alg.3", 4): rule("dQ = tau dS K", (r"\bdq\b|\bgdQ\b", r"\bdS\b", r"\btau\b")),
    ("Alg.3", 5): rule("dK = tau dS^T Q", (r"\bdk\b|\bdK\b", r"\bdS\b", r"\btau\b")),
    ("Alg.3", 6): _RETURN,
    ("Alg.4", 1): _PRNG,
    ("Alg.4", 2): _BLOCK_SIZES,
    ("Alg.4", 3): _SPLIT,
    ("Alg.4", 4): rule("O, dO, l, m split into Tr blocks", r"\bT[rc]\b|seq_blocks|\bg(?:O|dO|l|m)\b"),
    ("Alg.4", 5): rule("dQ = 0", _ZERO),
    ("Alg.4", 6): _LOOP,
    ("Alg.4", 7): _LOAD_KV,
    ("Alg.4", 8): rule("dK~_j = dV~_j = 0", (r"(?i)dk", r"(?i)dv", _ZERO)),
    ("Alg.4", 9): _LOOP,
    ("Alg.4", 10): rule("Q_i, dO_i (and l_i, m_i) loaded", (r"\bgQ\[", r"\bgdO\["), r"\b(?:load|store)_q\("),
    ("Alg.4", 11): _S_QK,
    ("Alg.4", 12): _MASK,
    ("Alg.4", 13): rule(
        "P = diag(l_i)^-1 exp(S - m_i)", (_EXP, _DIV_L), r"recompute_probabilities\(", r"\bs_dp_p_ds\("
    ),
    ("Alg.4", 14): rule("Z_ij regenerated from the seed", r"\bkeep\(|dropout_scale_matrix\(|\bs_dp_p_ds\("),
    ("Alg.4", 15): rule("P^dropped = P o Z", r"(?i)\bp\w*\s*\*\s*r?z\w*", r"\bs_dp_p_ds\("),
    ("Alg.4", 16): _DV_UPDATE,
    ("Alg.4", 17): _DP,
    ("Alg.4", 18): rule("dP = dP^dropped o Z", r"\*\s*(?:r?Z\w*|z)\b", r"\bs_dp_p_ds\("),
    ("Alg.4", 19): _D_ROWSUM,
    ("Alg.4", 20): _DS_RULE,
    ("Alg.4", 21): _DQ_UPDATE,
    ("Alg.4", 22): _DK_UPDATE,
    ("Alg.4", 24): _WRITE_DK_DV,
    ("Alg.4", 26): _RETURN,
    ("FA2.1", 1): _SPLIT,
    ("FA2.1", 2): rule("O and L split into Tr blocks", r"\bT[rc]\b|\bg(?:O|L)\b"),
    ("FA2.1", 3): _LOOP,
    ("FA2.1", 4): rule("Q_i read from HBM", r"\bgQ\[", r"\bload_q\(\s*gQ\b", r"\bload_tile\(\s*sQ_i\s*,\s*gQ\b"),
    ("FA2.1", 5): _INIT_O_L_M,
    ("FA2.1", 6): _LOOP,
    ("FA2.1", 7): _LOAD_KV,
    ("FA2.1", 8): _S_QK,
    ("FA2.1", 9): rule(
        "m_new = max(m, rowmax S); P~ = exp(S - m_new); l = e^(m_old - m_new) l + rowsum P~",
        (_MAX, _EXP, r"=\s*\w*alpha\w*(?:\[\w+\])?\s*\*|softmax_p_tile\("),
        r"\bonline_softmax\(",
    ),
    ("FA2.1", 10): rule("O = diag(e^(m_old - m_new)) O + P~ V_j", (r"\w*alpha", _V), (r"\w*alpha", r"\bpv_tile\(")),
    ("FA2.1", 12): rule("O_i = diag(l_i)^-1 O_i: a division by l", _DIV_L, _WRITE_O_L),
    ("FA2.1", 13): rule("L_i = m_i + log(l_i)", r"\blog\(", r"\bnatural_stats\(", _WRITE_O_L),
    ("FA2.1", 14): rule("O_i written to HBM", r"\bgO\[[^\]]*\]\s*=", _WRITE_O_L, r"\bstore_o_row\("),
    ("FA2.1", 15): rule("L_i written to HBM", r"\bgL\[[^\]]*\]\s*=", _WRITE_O_L),
    ("FA2.1", 17): _RETURN,
    ("FA2.2", 1): _SPLIT,
    ("FA2.2", 2): rule("O, dO, L split into Tr blocks", r"\bT[rc]\b|\bg(?:O|dO|L)\b"),
    ("FA2.2", 3): rule("dQ = 0", _ZERO, r"\ballocate_grads\("),
    ("FA2.2", 4): _D_ROWSUM,
    ("FA2.2", 5): _LOOP,
    ("FA2.2", 6): _LOAD_KV,
    ("FA2.2", 7): rule("dK_j = dV_j = 0", (r"(?i)dk", r"(?i)dv", _ZERO)),
    ("FA2.2", 8): _LOOP,
    ("FA2.2", 9): rule(
        "Q_i, dO_i, L_i (or m_i and l_i apart), D_i loaded",
        (r"\bgQ\[|\b(?:load|store)_q\(", r"\bgL\[|OFF_L|\brow_stats\(\s*gm\s*,\s*gl\b", r"\bgD\[|OFF_D"),
        (r"\bload_q_do_l_d\(", r"\bgQ\b", r"\bgdO\b", r"\bgm\b", r"\bgD\b"),
    ),
    ("FA2.2", 10): _S_QK,
    ("FA2.2", 11): rule(
        "P = exp(S - L_i), or exp(S - m_i) / l_i with m_i, l_i kept apart",
        (_EXP, r"\bs?L_i\b|\bL_r\b"),
        (_EXP, r"-\s*\w*m_(?:i|r)\b", r"\*\s*\w*il_(?:i|r)\b"),
        r"\bs_dp_p_ds\(",
    ),
    ("FA2.2", 12): _DV_UPDATE,
    ("FA2.2", 13): _DP,
    ("FA2.2", 14): _DS_RULE,
    ("FA2.2", 15): _DQ_UPDATE,
    ("FA2.2", 16): _DK_UPDATE,
    ("FA2.2", 18): _WRITE_DK_DV,
    ("FA2.2", 20): _RETURN,
    ("Alg.5", 1): _PRNG,
    ("Alg.5", 2): _INIT_O_L_M,
    ("Alg.5", 3): _SPLIT,
    ("Alg.5", 5): _LOOP,
    ("Alg.5", 6): _LOAD_KV,
    ("Alg.5", 7): _LOOP,
    ("Alg.5", 8): rule("if M_ij != 0: a test of the block mask", (r"\bif\b", r"\b\w*mask\b")),
    ("Alg.5", 9): _LOAD_Q_O_L_M,
    ("Alg.5", 10): _S_TAU_QK,
    ("Alg.5", 11): _MASK,
    ("Alg.5", 12): _ROWMAX,
    ("Alg.5", 13): _M_NEW,
    ("Alg.5", 14): _DROPOUT,
    ("Alg.5", 15): _O_UPDATE_FA1,
    ("Alg.5", 16): _WRITE_L_M,
    ("Alg.5", 20): _RETURN,
}

#: Work lines with no content rule, and why.
NO_CONTENT_RULE = {
    ("Alg.1", 4): "O_i, l_i, m_i are the row slices of O, l, m that match Q_i: a split is indexing, done at line 8",
    ("Alg.2", 5): "as Alg.1 L4",
    ("Alg.5", 4): "as Alg.1 L4",
}


def content_errors(text: str, name: str = "<text>") -> list[str]:
    """Tags whose code does not contain what their paper line computes (:data:`CONTENT_RULES`).

    A tag followed directly by another tag (no code of its own) heads the code of the next one and is
    not checked by itself.
    """
    errors = []
    for span in tag_spans(text):
        if not span.code.strip():
            continue
        for alg, a, b in span.tags:
            for line in range(a, b + 1):
                rule_ = CONTENT_RULES.get((alg, line))
                if rule_ is not None and not rule_.holds(span.code):
                    errors.append(
                        f"{name}:{span.lineno}: the code under '{alg} L{line}' (lines {span.lineno}-{span.end}) "
                        f"does not contain {rule_.says}"
                    )
    return errors


@pytest.mark.parametrize("path", [p for p in SOURCE_FILES if parse_tags(p)[0]], ids=_rel)
def test_code_under_each_paper_tag_computes_what_its_line_says(path):
    """A tag sits on the code it names: the code from the tag to the next tag (or the end of the
    function) matches its line's rule (L9: a product of Q_i and K_j; L12: a division by l; ...).
    Applies to every file that carries the tag: readable kernels, fast and tensor-core twins, references."""
    errors = content_errors(path.read_text(encoding="utf-8"), _rel(path))
    assert not errors, "\n".join(errors)


def test_every_work_line_has_a_content_rule_or_a_reason():
    missing = [
        f"{alg} L{n}"
        for alg, lines in WORK_LINES.items()
        for n in sorted(lines)
        if (alg, n) not in CONTENT_RULES and (alg, n) not in NO_CONTENT_RULE
    ]
    assert not missing, "no content rule for " + ", ".join(missing)


def _swap_tags(text: str, first: str, second: str) -> str:
    """``text`` with the tag comments that start with ``first`` and ``second`` exchanged."""
    lines = text.splitlines(keepends=True)
    a = next(k for k, ln in enumerate(lines) if ln.lstrip().startswith(f"# {first}"))
    b = next(k for k, ln in enumerate(lines) if ln.lstrip().startswith(f"# {second}"))
    ind_a, ind_b = (len(lines[k]) - len(lines[k].lstrip()) for k in (a, b))
    lines[a], lines[b] = " " * ind_a + lines[b].lstrip(), " " * ind_b + lines[a].lstrip()
    return "".join(lines)


def test_swapping_two_tags_fails_the_content_check_though_the_order_check_passes(tmp_path):
    """The lie the order check cannot see: Alg.1 L9 and L12 swapped in alg1_forward.py (both lie inside
    the inner loop, so the recurrence rule accepts L12 before L10 and L9 after L11)."""
    original = (ROOT / "numba_flash" / "alg1_forward.py").read_text(encoding="utf-8")
    assert not content_errors(original)
    swapped = _swap_tags(original, "Alg.1 L9 / Alg.2 L10 / Alg.5 L10:", "Alg.1 L12 / Alg.2 L15 / Alg.5 L15:")
    assert swapped != original
    f = tmp_path / "alg1_forward.py"
    f.write_text(swapped)
    tags, grammar = parse_tags(f)
    assert not grammar and not order_errors(tags, "Alg.1") and not order_errors(tags, "Alg.2")
    errors = content_errors(swapped)
    assert any("'Alg.1 L9'" in e for e in errors) and any("'Alg.1 L12'" in e for e in errors), errors


def test_content_rules_name_the_step_not_the_comment():
    """Comments and strings never satisfy a rule: only code does."""
    src = (
        "def k(Q_i, K_j, m, l):\n    # Alg.1 L9: S_ij = Q_i @ K_j.T\n    x = 'Q_i @ K_j'\n    # FA2.1 L13: L = m + "
        "log(l)\n    return x, m\n"
    )
    errors = content_errors(src)
    assert len(errors) == 2, errors
    assert not content_errors(
        src.replace("x = 'Q_i @ K_j'", "x = Q_i @ K_j.T").replace("return x, m", "return x, m + log(l)")
    )
