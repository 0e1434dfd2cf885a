"""``figure2-panel`` and ``measured-io``: render the committed results of ``bench/`` as tables and plots.

Usage in a page::

    .. figure2-panel:: results/figure2/figure2.json
       :panel: left

    .. measured-io:: results/io_measured.json

* The path is relative to the page. **A missing file is not an error**: the directive renders a note
  saying that nothing is measured yet and which command produces the file (the measurements need a
  GPU; the docs build anywhere). A file that exists but cannot be read, or lacks the panel, *is* an
  error, so a broken results file cannot silently vanish from the page.
* ``figure2-panel`` (the output of ``python -m bench.figure2``) shows the panel's table and its plot
  (``figure2_<panel>.png`` next to the JSON, when present); ``:provenance:`` adds the device, date,
  versions and command of the file.
* ``measured-io`` (the output of ``python -m numba_flash io --measure``) shows, per part of the run, the
  DRAM bytes ncu measured beside the IO model's count, the compulsory traffic and a reading of the
  ratio (:func:`reading`).

Every number on the page comes from the file; nothing is typed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

PROVENANCE_KEYS = [
    ("device", "Device"),
    ("compute_capability", "Compute capability"),
    ("l2_bytes", "L2 cache (bytes)"),
    ("driver", "Driver"),
    ("date_utc", "Date (UTC)"),
    ("command", "Command"),
    ("commit", "Commit"),
    ("ncu", "Nsight Compute"),
    ("numba", "numba"),
    ("numba_cuda", "numba-cuda"),
    ("torch", "torch"),
    ("numpy", "NumPy"),
    ("python", "Python"),
]


class ResultsFileError(ValueError):
    pass


def load(path: Path, kind: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise ResultsFileError(
            f"{path}: not a {kind} results file (kind = {data.get('kind') if isinstance(data, dict) else None!r})"
        )
    return data


def fmt(value, digits=3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return " x ".join(str(v) for v in value) if value else "–"
    return str(value)


def reading(row: dict) -> str:
    """What the ratio of measured to modelled DRAM bytes says (one phrase, from the row's numbers)."""
    meas, model, comp = row.get("dram_bytes"), row.get("model_bytes"), row.get("compulsory_bytes")
    if row.get("error"):
        return "error: " + str(row["error"]).splitlines()[0][:80]
    if not meas or not model:
        return "not measured"
    ratio = meas / model
    if comp and model > 1.5 * comp and meas <= 1.15 * comp:
        return "re-reads served by the L2: DRAM sees about the compulsory traffic"
    if 0.85 <= ratio <= 1.15:
        return "≈ model: the counted accesses reach DRAM"
    if ratio < 0.85:
        return "below the model: part of the re-reads hit the L2"
    return "above the model: traffic the model does not count"


def table(title: str, header: list[str], rows: list[list[str]]) -> nodes.table:
    tbl = nodes.table(classes=["results-table"])
    tbl += nodes.title(title, title)
    tgroup = nodes.tgroup(cols=len(header))
    tbl += tgroup
    for _ in header:
        tgroup += nodes.colspec(colwidth=1)
    thead, tbody = nodes.thead(), nodes.tbody()
    tgroup += thead
    tgroup += tbody
    for cells, parent in [(header, thead)] + [(r, tbody) for r in rows]:
        row = nodes.row()
        for c in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(c, c)
            row += entry
        parent += row
    return tbl


def provenance_fields(prov: dict, shown: str) -> nodes.field_list:
    fields = nodes.field_list(classes=["bench-provenance"])
    items = [("Results file", shown)] + [
        (label, fmt(prov.get(key))) for key, label in PROVENANCE_KEYS if prov.get(key) not in (None, "")
    ]
    for label, value in items:
        f = nodes.field()
        f += nodes.field_name(label, label)
        body = nodes.field_body()
        body += nodes.paragraph(value, value)
        f += body
        fields += f
    return fields


class _ResultsDirective(SphinxDirective):
    required_arguments = 1
    has_content = False
    kind = ""
    command = ""

    def _file(self):
        rel, path = self.env.relfn2path(self.arguments[0], self.env.docname)
        self.env.note_dependency(path)
        return Path(path)

    def _missing(self) -> list[nodes.Node]:
        note = nodes.note()
        para = nodes.paragraph()
        para += nodes.Text(
            f"Not yet measured: no results file {self.arguments[0]} is committed. It is produced on a GPU by "
        )
        para += nodes.literal(self.command, self.command)
        para += nodes.Text("; the page renders it as soon as it is committed.")
        note += para
        return [note]

    def _image(self, png: Path, alt: str):
        srcdir = Path(self.env.srcdir).resolve()
        return nodes.image(uri="/" + png.resolve().relative_to(srcdir).as_posix(), alt=alt)


class Figure2Panel(_ResultsDirective):
    option_spec = {"panel": directives.unchanged_required, "provenance": directives.flag}
    kind = "numba_flash.figure2"
    command = "python -m bench.figure2 --out docs/results/figure2"

    def run(self):
        path = self._file()
        if not path.is_file():
            return self._missing()
        panel = self.options.get("panel", "").strip()
        if panel not in ("left", "middle", "right"):
            raise self.error(f"figure2-panel: :panel: must be left, middle or right, got {panel!r}")
        try:
            data = load(path, self.kind)
        except ResultsFileError as exc:
            raise self.error(f"figure2-panel: {exc}") from None
        if panel not in data:
            raise self.error(f"figure2-panel: {self.arguments[0]} has no {panel!r} panel")
        out: list[nodes.Node] = []
        if "provenance" in self.options:
            out.append(provenance_fields(data.get("provenance", {}), self.arguments[0]))
        if data.get("tiny"):
            warn = nodes.warning()
            text = "This file is a --tiny run in the simulator: its timings and sizes are functional only."
            warn += nodes.paragraph(text, text)
            out.append(warn)
        p = data[panel]
        shape = p.get("shape", {})
        title = (
            f"{panel}: batch {shape.get('batch')}, {shape.get('nheads')} heads, N = {shape.get('N')}, d = "
            f"{shape.get('d')}"
        )
        if panel == "left":
            header = [
                "algorithm",
                "kernels (fwd / bwd)",
                "GFLOP (matmul)",
                "HBM GB measured",
                "HBM GB model",
                "HBM GB compulsory",
                "fwd+bwd (ms)",
                "forward (ms)",
            ]
            rows = [
                [
                    r["algorithm"],
                    f"{r.get('variant_forward') or '-'} / {r.get('variant_backward') or '-'}",
                    fmt(r.get("gflop")),
                    fmt(r.get("hbm_gb_measured")),
                    fmt(r.get("hbm_gb_model")),
                    fmt(r.get("hbm_gb_compulsory")),
                    fmt(r.get("runtime_ms")),
                    fmt(r.get("forward_ms")),
                ]
                for r in p["rows"]
            ]
        elif panel == "middle":
            header = ["Br", "Bc", "Tc", "HBM GB measured", "HBM GB model", "forward (ms)", "note"]
            rows = [
                [
                    fmt(r.get("Br")),
                    fmt(r.get("Bc")),
                    fmt(r.get("Tc")),
                    fmt(r.get("hbm_gb_measured")),
                    fmt(r.get("hbm_gb_model")),
                    fmt(r.get("runtime_ms")),
                    (str(r["error"]).splitlines()[0][:60] if r.get("error") else ""),
                ]
                for r in p["rows"]
            ]
        else:
            header = ["mask", "density", "GFLOP (matmul)", "HBM GB model", "forward (ms)", "fwd+bwd (ms)"]
            rows = [
                [
                    r["pattern"],
                    fmt(r.get("density")),
                    fmt(r.get("gflop")),
                    fmt(r.get("hbm_gb_model")),
                    fmt(r.get("forward_ms")),
                    fmt(r.get("runtime_ms")),
                ]
                for r in p["rows"]
            ]
            dense = p.get("flash1_dense") or {}
            rows.append(
                [
                    f"FlashAttention, dense ({dense.get('variant')})",
                    "1",
                    "–",
                    "–",
                    fmt(dense.get("forward_ms")),
                    fmt(dense.get("runtime_ms")),
                ]
            )
        out.append(table(title, header, rows))
        prov = p.get("provenance") or {}
        if prov.get("device"):
            text = (
                f"Measured on {prov['device']}, {prov.get('date_utc') or '?'}, commit "
                f"{str(prov.get('commit') or '?')[:12]}."
            )
            out.append(nodes.paragraph(text, text))
        if data.get("not_measured"):
            text = f"HBM bytes not measured in this file: {data['not_measured']}."
            out.append(nodes.paragraph(text, text))
        png = path.parent / f"figure2_{panel}.png"
        if png.is_file():
            self.env.note_dependency(str(png))
            out.append(self._image(png, f"Figure 2 {panel} panel"))
        return out


class MeasuredIO(_ResultsDirective):
    option_spec = {"part": directives.unchanged}
    kind = "numba_flash.measured_io"
    command = "python -m numba_flash io --measure --out docs/results/io_measured.json"

    def run(self):
        path = self._file()
        if not path.is_file():
            return self._missing()
        try:
            data = load(path, self.kind)
        except ResultsFileError as exc:
            raise self.error(f"measured-io: {exc}") from None
        results = data.get("results") or []
        parts = (
            [self.options["part"].strip()]
            if self.options.get("part")
            else sorted({r.get("part") for r in results}, key=str)
        )
        out: list[nodes.Node] = [provenance_fields(data.get("provenance", {}), self.arguments[0])]
        header = [
            "algorithm",
            "variant",
            "pass",
            "b x h x N x d",
            "tiles",
            "DRAM read GB",
            "DRAM write GB",
            "model GB",
            "measured / model",
            "compulsory GB",
            "K, V of a head (MiB)",
            "reading",
        ]
        for part in parts:
            rows = []
            for r in (x for x in results if x.get("part") == part):
                t = (r.get("tiles") or {}).get(r.get("pass"))
                alg = r["algorithm"] + (
                    f" ({r['mask_info']['pattern']}, s = {r['mask_info']['density']:.3g})" if r.get("mask_info") else ""
                )
                gb = lambda k, r=r: fmt(None if r.get(k) is None else r[k] / 1e9)  # noqa: E731
                rows.append(
                    [
                        alg,
                        r.get("variant") or "–",
                        r.get("pass"),
                        f"{r['batch']} x {r['nheads']} x {r['N']} x {r['d']}",
                        fmt(t),
                        gb("dram_read_bytes"),
                        gb("dram_write_bytes"),
                        gb("model_bytes"),
                        fmt(r.get("measured_over_model")),
                        gb("compulsory_bytes"),
                        fmt(r.get("kv_bytes_per_head", 0) / 2**20),
                        reading(r),
                    ]
                )
            if not rows:
                raise self.error(f"measured-io: {self.arguments[0]} has no results of part {part!r}")
            out.append(table(f"part: {part}", header, rows))
        return out


def setup(app):
    app.add_directive("figure2-panel", Figure2Panel)
    app.add_directive("measured-io", MeasuredIO)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
