"""``bug-gallery``: the bug gallery of ``tools/bugs.py``, rendered from its data.

Usage in a page::

    .. bug-gallery::

A summary table (bug, kernel file, paper line, where it is caught), then one section per bug: the
lesson, the diff that plants it (computed from today's source, so the page cannot drift from the
kernel), the test(s) that catch it and why. A gallery entry whose original text is no longer in the
kernel is a build error, like a lost code marker.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def _table(rows, header, widths):
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    for w in widths:
        group += nodes.colspec(colwidth=w)
    head = nodes.thead()
    group += head
    body = nodes.tbody()
    group += body
    for target, cells in ((head, [header]), (body, rows)):
        for cells_ in cells:
            row = nodes.row()
            for cell in cells_:
                entry = nodes.entry()
                entry += cell if isinstance(cell, nodes.Node) else nodes.paragraph(text=str(cell))
                row += entry
            target += row
    return table


class BugGallery(SphinxDirective):
    has_content = False
    required_arguments = 0

    def run(self):
        from tools import bugs

        root = bugs.repo_root()
        for rel in {b.file for b in bugs.GALLERY} | {"tools/bugs.py"}:
            self.env.note_dependency(str(root / rel))
        rows = []
        for b in bugs.GALLERY:
            ref = nodes.paragraph()
            ref += nodes.reference(b.title, b.title, refid=nodes.make_id(f"bug-{b.name}"))
            rows.append(
                [
                    ref,
                    nodes.paragraph("", "", nodes.literal(b.file, b.file)),
                    b.paper,
                    "GPU only" if b.gpu_only else "simulator",
                ]
            )
        out = [_table(rows, ["bug", "kernel", "paper", "caught in"], [40, 26, 18, 10])]
        for b in bugs.GALLERY:
            try:
                patch = bugs.diff(b, root)
            except bugs.MutationError as exc:
                raise self.error(f"bug-gallery: {exc}") from None
            sec = nodes.section(ids=[nodes.make_id(f"bug-{b.name}")])
            sec += nodes.title(b.title, b.title)
            meta = nodes.paragraph()
            meta += nodes.literal(b.name, b.name)
            meta += nodes.Text(
                f" · {b.file} · {b.paper} · " + ("GPU only" if b.gpu_only else "caught in the simulator")
            )
            sec += meta
            sec += nodes.paragraph(text=b.lesson)
            block = nodes.literal_block(patch, patch)
            block["language"] = "diff"
            sec += block
            caught = nodes.paragraph()
            caught += nodes.strong(text="Caught by: ")
            for k, t in enumerate(b.tests):
                if k:
                    caught += nodes.Text(", ")
                caught += nodes.literal(t, t)
            caught += nodes.Text(f". Why: {b.caught_by}.")
            sec += caught
            out.append(sec)
        return out


def setup(app):
    app.add_directive("bug-gallery", BugGallery)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
