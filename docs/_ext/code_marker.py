"""``code-marker``: show a region of source delimited by named markers, never by line numbers.

Usage in a page::

    .. code-marker:: numba_flash/alg1_forward.py
       :marker: alg1-inner-loop
       :emphasize-tag: Alg.1 L9
       :linenos:

* The path is relative to the repository root (the folder above ``docs/``).
* ``:marker:`` (required) names the region ``# [doc:NAME]`` ... ``# [/doc:NAME]`` (grammar in
  :mod:`doc_markers`). The code is dedented and captioned with the file name.
* ``:tag:`` shows only the *step(s)* of the region that paper tags start (``Alg.1 L9``; several
  separated by ``;``): the tagged line and the lines after it, up to the next tagged line or the end
  of the enclosing block (:func:`doc_markers.step_lines`). This is how a derivation page puts one
  paper line as math right before the code that computes it, without a marker per line. A tag that
  no line of the region carries is an error; ``...`` marks a gap between non-adjacent steps.
* ``:emphasize-tag:`` highlights the lines whose comment carries that paper tag (``Alg.1 L9``,
  ``FA2.1 L10``; several separated by ``;``). A tag that no line of the region carries is an error.
* ``:linenos:`` numbers the lines as they are numbered in the file (when the shown lines are
  contiguous in the file).
* ``:caption:`` replaces the default caption.

A missing file, a missing or broken marker, or an unknown tag is a build error, so with
``sphinx -W`` a page can never silently lose its code.
"""

from __future__ import annotations

from pathlib import Path

import doc_markers
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.directives.code import container_wrapper
from sphinx.util.docutils import SphinxDirective


def _tags(option: str) -> list[str]:
    return [t.strip() for t in option.split(";") if t.strip()]


class CodeMarker(SphinxDirective):
    required_arguments = 1
    optional_arguments = 0
    final_argument_whitespace = False
    has_content = False
    option_spec = {
        "marker": directives.unchanged_required,
        "language": directives.unchanged,
        "caption": directives.unchanged,
        "tag": directives.unchanged_required,
        "emphasize-tag": directives.unchanged,
        "linenos": directives.flag,
        "name": directives.unchanged,
        "class": directives.class_option,
    }

    def run(self):
        rel = self.arguments[0]
        if "marker" not in self.options:
            raise self.error(f"code-marker {rel}: the :marker: option is required")
        name = self.options["marker"].strip()
        root = Path(self.config.code_marker_root)
        if not root.is_absolute():
            root = (Path(self.env.app.confdir) / root).resolve()
        path = (root / rel).resolve()
        # A page that names a file must rebuild when the file changes (and fail if it vanishes).
        self.env.note_dependency(str(path))
        try:
            code, numbers = doc_markers.extract(path, name)
            if "tag" in self.options:
                code, numbers = doc_markers.extract_steps(path, name, _tags(self.options["tag"]))
            text = path.read_text(encoding="utf-8")
            region = doc_markers.scan(text)[name]
            emphasized = set()
            for tag in _tags(self.options.get("emphasize-tag", "")):
                hits = set(doc_markers.tagged_lines(text, region, tag)) & set(numbers)
                if not hits:
                    raise doc_markers.MarkerError(f"no shown line of [doc:{name}] carries the paper tag {tag!r}")
                emphasized |= hits
        except doc_markers.MarkerError as exc:
            raise self.error(f"code-marker {rel}: {exc}") from None

        literal = nodes.literal_block(code, code)
        literal["language"] = self.options.get("language", "python")
        literal["classes"] += self.options.get("class", [])
        literal["source"] = str(path)
        hl_args = {}
        contiguous = None not in numbers and numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        if "linenos" in self.options and contiguous:
            literal["linenos"] = True
            hl_args["linenostart"] = numbers[0]
        if emphasized:
            hl_args["hl_lines"] = [k + 1 for k, ln in enumerate(numbers) if ln in emphasized]
        if hl_args:
            literal["highlight_args"] = hl_args
        self.set_source_info(literal)

        caption = self.options.get("caption") or f"{rel} [{name}]"
        if "tag" in self.options and "caption" not in self.options:
            caption += " · " + "; ".join(_tags(self.options["tag"]))
        literal = container_wrapper(self, literal, caption)
        self.add_name(literal)
        return [literal]


def setup(app):
    app.add_config_value("code_marker_root", "..", "env")
    app.add_directive("code-marker", CodeMarker)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
