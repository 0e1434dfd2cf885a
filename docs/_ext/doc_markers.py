"""The one grammar of docs markers, shared by the Sphinx extension and the traceability test.

A region of source that a docs page shows is wrapped in two comment lines::

    # [doc:alg1-inner-loop]
    ...code...
    # [/doc:alg1-inner-loop]

Each marker is a comment on a line of its own. ``NAME`` is lower-case letters, digits and ``-``
(``alg1-inner-loop``, ``fa2-fwd-rescale``). Regions may nest (a page can show a whole kernel and
another page one loop of it); marker lines inside a shown region are dropped from the shown code.
A name appears at most once per file, so ``(file, name)`` names one region.

Paper tags (``# Alg.1 L9: ...``) are parsed here too (:func:`paper_tags`), so that the docs and
``tests/test_traceability.py`` read them with one grammar: a comment that *starts* with one or more
tags (``Alg.N Lk``, ``Alg.N Lk-Lm``, ``FA2.N Lk``; several joined by ``,`` ``/`` ``;`` or ``and``)
followed by a colon. A page can show the *step* of a region that a tag starts
(:func:`step_lines`): the tagged line and the lines after it, up to the next tagged line or the end
of the enclosing block.

This module imports only the standard library, so tests can use it without Sphinx.
"""

from __future__ import annotations

import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

NAME = r"[a-z0-9][a-z0-9-]*"
#: A marker line: ``# [doc:NAME]`` or ``# [/doc:NAME]``, alone on its line (indentation allowed).
MARKER_LINE = re.compile(rf"^\s*#\s*\[(?P<end>/?)doc:(?P<name>{NAME})\]\s*$")
#: Anything that looks like an attempt at a marker (used to report malformed ones).
MARKER_LIKE = re.compile(r"\[/?doc:")


class MarkerError(ValueError):
    """A marker is missing, unbalanced, duplicated or malformed."""


@dataclass(frozen=True)
class Region:
    """A marked region: ``start``/``end`` are the 1-based line numbers of the two marker lines."""

    name: str
    start: int
    end: int


def scan(text: str, filename: str = "<text>") -> dict[str, Region]:
    """All marked regions of ``text``, by name; raise MarkerError on any grammar violation.

    Violations: an opening marker without its closing one (or the reverse), a name opened twice,
    regions that cross instead of nesting, and lines that mention ``[doc:`` but do not match the
    grammar (a typo would otherwise silently hide a region).
    """
    regions: dict[str, Region] = {}
    stack: list[tuple[str, int]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = MARKER_LINE.match(line)
        if m is None:
            if MARKER_LIKE.search(line) and line.lstrip().startswith("#"):
                raise MarkerError(
                    f"{filename}:{lineno}: malformed docs marker {line.strip()!r} "
                    f"(the grammar is '# [doc:NAME]' ... '# [/doc:NAME]', NAME = {NAME})"
                )
            continue
        name = m.group("name")
        if not m.group("end"):
            if name in regions or any(n == name for n, _ in stack):
                raise MarkerError(f"{filename}:{lineno}: docs marker [doc:{name}] opened twice in one file")
            stack.append((name, lineno))
        else:
            if not stack:
                raise MarkerError(f"{filename}:{lineno}: [/doc:{name}] closes a region that was never opened")
            top, start = stack.pop()
            if top != name:
                raise MarkerError(
                    f"{filename}:{lineno}: [/doc:{name}] closes while [doc:{top}] "
                    f"(opened on line {start}) is still open: regions must nest"
                )
            regions[name] = Region(name, start, lineno)
    if stack:
        name, start = stack[-1]
        raise MarkerError(f"{filename}:{start}: [doc:{name}] is never closed by [/doc:{name}]")
    return regions


def extract(path: str | Path, name: str) -> tuple[str, list[int]]:
    """The dedented code of region ``name`` in file ``path``, and the file line number of each code line.

    Marker lines of regions nested inside are removed; leading and trailing blank lines are dropped.
    Raises MarkerError (the file is missing, the marker is missing, or the file's markers are broken).
    """
    path = Path(path)
    if not path.is_file():
        raise MarkerError(f"{path}: file not found (referenced for docs marker [doc:{name}])")
    text = path.read_text(encoding="utf-8")
    regions = scan(text, str(path))
    if name not in regions:
        known = ", ".join(sorted(regions)) or "none"
        raise MarkerError(f"{path}: no docs marker [doc:{name}] (markers in this file: {known})")
    region = regions[name]
    lines = text.splitlines()[region.start : region.end - 1]  # strictly between the two marker lines
    first = region.start + 1
    kept = [(first + k, ln) for k, ln in enumerate(lines) if not MARKER_LINE.match(ln)]
    while kept and not kept[0][1].strip():
        kept.pop(0)
    while kept and not kept[-1][1].strip():
        kept.pop()
    if not kept:
        raise MarkerError(f"{path}: docs marker [doc:{name}] encloses no code")
    code = textwrap.dedent("\n".join(ln for _, ln in kept))
    return code, [n for n, _ in kept]


#: ``.. code-marker:: PATH`` followed (within its option block) by ``:marker: NAME``.
_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\.\s+code-marker::\s*(?P<path>\S+)\s*$")
_OPTION = re.compile(r"^\s*:(?P<key>[\w-]+):\s*(?P<value>.*?)\s*$")


def references_in_rst(text: str) -> list[tuple[int, str, dict[str, str]]]:
    """``(line, path, options)`` for every code-marker directive in an .rst text."""
    refs = []
    lines = text.splitlines()
    for k, line in enumerate(lines):
        m = _DIRECTIVE.match(line)
        if not m:
            continue
        options = {}
        for opt in lines[k + 1 :]:
            o = _OPTION.match(opt)
            if not o:
                break
            options[o.group("key")] = o.group("value")
        refs.append((k + 1, m.group("path"), options))
    return refs


# ------------------------------------------------------------------------------------------------
# Paper tags
# ------------------------------------------------------------------------------------------------
_TAG = r"(?:Alg\.[0-5]|FA2\.[12])\s+L\d+(?:-L\d+)?"
#: A tag comment: one or more tags (separated by ',', '/', ';' or 'and'), then a colon.
TAG_COMMENT = re.compile(rf"^#\s*(?P<tags>{_TAG}(?:\s*(?:,|/|;|and)\s*{_TAG})*)\s*:")
ONE_TAG = re.compile(r"(?P<alg>Alg\.[0-5]|FA2\.[12])\s+L(?P<a>\d+)(?:-L(?P<b>\d+))?")
#: A comment that starts like a tag but does not follow the grammar (a typo, to be reported).
TAG_LIKE = re.compile(r"^#\s*(?:Alg|FA2|FA1|FA)\s*\.?\s*\d*\s*L\d+", re.IGNORECASE)


def comments(text: str) -> dict[int, str]:
    """``{line: comment}`` for every comment token of Python source (strings are not comments)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string
    return out


def paper_tags(comment: str) -> list[tuple[str, int, int]] | None:
    """``[(alg, first_line, last_line), ...]`` if ``comment`` is a tag comment, else None."""
    m = TAG_COMMENT.match(comment)
    if m is None:
        return None
    return [
        (t.group("alg"), int(t.group("a")), int(t.group("b") or t.group("a")))
        for t in ONE_TAG.finditer(m.group("tags"))
    ]


def parse_tag(tag: str) -> tuple[str, int, int]:
    """``"Alg.1 L9"`` -> ``("Alg.1", 9, 9)``; ``"FA2.1 L8-L9"`` -> ``("FA2.1", 8, 9)``."""
    m = ONE_TAG.fullmatch(tag.strip())
    if m is None:
        raise MarkerError(f"malformed paper tag {tag!r} (expected e.g. 'Alg.1 L9' or 'FA2.1 L8-L9')")
    return m.group("alg"), int(m.group("a")), int(m.group("b") or m.group("a"))


def tagged_lines(text: str, region: Region, tag: str) -> list[int]:
    """Lines of ``region`` whose tag comment covers ``tag`` (e.g. ``Alg.1 L9`` matches ``Alg.1 L9-L10``)."""
    alg, a, b = parse_tag(tag)
    out = []
    for lineno, comment in comments(text).items():
        if region.start < lineno < region.end:
            for t_alg, t_a, t_b in paper_tags(comment) or ():
                if t_alg == alg and t_a <= a and b <= t_b:
                    out.append(lineno)
                    break
    return sorted(out)


#: A comment line, alone on its line, that starts a departure from the paper.
DEV_LINE = re.compile(r"^\s*#\s*Dev:")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def step_lines(text: str, region: Region, tag: str) -> list[int]:
    """The lines of every step of ``region`` that ``tag`` starts, in file order.

    A step is the tagged line and the lines after it, up to (not including) the next line that
    carries any paper tag, a comment line that starts a departure (``# Dev: ...`` alone on its line),
    a line indented less than the tagged line (the block ended), or the end of the region. Marker
    lines of nested regions are skipped. Raises MarkerError if no line of the region carries the tag.
    """
    starts = tagged_lines(text, region, tag)
    if not starts:
        raise MarkerError(f"no line of region [doc:{region.name}] carries the paper tag {tag!r}")
    lines = text.splitlines()
    tag_starts = {ln for ln, c in comments(text).items() if paper_tags(c)}
    out: list[int] = []
    for s in starts:
        base = _indent(lines[s - 1])
        out.append(s)
        for ln in range(s + 1, region.end):
            line = lines[ln - 1]
            if MARKER_LINE.match(line):
                continue  # a nested region's marker: not code, not a step boundary
            if ln in tag_starts or DEV_LINE.match(line):
                break
            if line.strip() and _indent(line) < base:
                break
            out.append(ln)
        while out and not lines[out[-1] - 1].strip():
            out.pop()
    return sorted(set(out))


def extract_steps(path: str | Path, name: str, tags: list[str]) -> tuple[str, list[int]]:
    """The code of the steps that ``tags`` start in region ``name`` (dedented; ``...`` between gaps).

    Returns the code and, for each shown line, its line number in the file (None for a ``...``).
    """
    path = Path(path)
    extract(path, name)  # the same checks as for a whole region
    text = path.read_text(encoding="utf-8")
    region = scan(text)[name]
    wanted = sorted({ln for tag in tags for ln in step_lines(text, region, tag)})
    lines = text.splitlines()
    block = textwrap.dedent("\n".join(lines[ln - 1] for ln in wanted)).splitlines()
    shown, numbers = [], []
    for k, ln in enumerate(wanted):
        between = lines[wanted[k - 1] : ln - 1] if k else []
        if k and not all(MARKER_LINE.match(x) or not x.strip() for x in between):
            shown.append(" " * _indent(block[k]) + "...")
            numbers.append(None)
        shown.append(block[k])
        numbers.append(ln)
    return "\n".join(shown), numbers
