"""``bench-table``: render committed pytest-benchmark JSON results as tables (and their plot).

Usage in a page::

    .. bench-table:: results/forward_h200.json
       :columns: algorithm, d, causal, median, tflops, pct_sgemm, extra_mem_bytes
       :baseline: standard

    .. bench-table::
       :glob: results/*.json

* With a path argument (relative to the page, like ``literalinclude``), the file must exist: a page
  that names a missing results file fails the build.
* With ``:glob:`` instead, every matching file is rendered; when none matches, a note says that no
  results are committed yet (the build does not fail: there is nothing the page promised).
* The header says where the numbers come from: device, date, commit, command, Python and library
  versions (pytest-benchmark's ``machine_info``/``commit_info`` plus what our benchmark conftest adds).
* One table per sequence length ``N`` (``extra_info['N']``, else ``params['N']``). Columns are
  ``extra_info`` keys, ``params.KEY``, or timing statistics (``median``, ``mean``, ``min``, ``max``,
  ``stddev``, shown in ms). A column that no benchmark has is an error (a typo must not vanish).
* A column whose value is a dict (our ``extra_info['kernels']``: kernel name -> launch report) shows
  the dict's keys, so a table can say which kernels (e.g. a readable or a fast variant) produced a row.
* ``:baseline: ALG`` adds a speed-up column: the median of the row whose ``algorithm`` is ``ALG`` and
  whose shape (``:match:``, default ``N, d, batch, nheads, causal``) is the same, over this row's.
* A plot ``<stem>.png`` next to the JSON file is embedded below the tables (``:plot:`` names another
  one, which must then exist; ``:plot: none`` embeds none).
* ``:where: algorithm=flash1|flash2, d=64, causal=False`` keeps only the rows whose column has one of
  the listed values (``|`` separates alternatives; a row without the column is left out). A key that
  no row of the file has, or a filter that leaves no row, is an error (a typo must not empty a table).
* ``:one-table:`` puts every kept row in one table (titled with the ``:where:`` filter) instead of one
  table per ``N``: with ``N`` as a column, a trend across sequence lengths reads down one column.
* A column ``kernels.KEY`` is the value of ``KEY`` in the launch reports of the row's ``kernels``
  dict (e.g. ``kernels.grid_blocks``, ``kernels.waves``): one value when one kernel reports it.

The numbers on the page are therefore always those of the committed files, never typed by hand.
"""

from __future__ import annotations

import glob as globmod
import json
import os
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

STAT_KEYS = ("median", "mean", "min", "max", "stddev", "iqr")
SHAPE_KEYS = ("N", "d", "batch", "nheads", "causal")
# machine_info keys shown first, in this order, with readable labels. Our benchmark conftest puts its
# provenance in machine_info["numba_flash"] (a dict); its keys are looked up there too.
HEADER_KEYS = [
    ("device", "Device"),
    ("describe", "Backend"),
    ("gpu", "GPU"),
    ("driver_version", "CUDA driver"),
    ("driver", "Driver"),
    ("cuda_runtime_torch", "CUDA runtime (torch)"),
    ("sgemm_tflops_4096_fp32", "SGEMM ceiling, same run (TFLOP/s)"),
    ("date_utc", "Date (UTC)"),
    ("command", "Command"),
    ("numba", "numba"),
    ("numba_cuda", "numba-cuda"),
    ("numpy", "NumPy"),
    ("torch", "torch"),
    ("python", "Python"),
    ("python_version", "Python"),
    ("node", "Host"),
]
_SKIP_MACHINE = {
    "cpu",
    "python_compiler",
    "python_implementation",
    "python_implementation_version",
    "python_build",
    "release",
    "system",
    "machine",
    "processor",
    "backend",
}
#: extra_info keys never shown as default columns (constant per file, diagnostic, or duplicates).
_SKIP_COLUMNS = {"N", "device", "error", "oom", "functional_only", "time_ms", "sgemm_tflops"}


class BenchResultsError(ValueError):
    pass


def load_results(path: Path) -> dict:
    """Parse and sanity-check a pytest-benchmark ``--benchmark-json`` file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BenchResultsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise BenchResultsError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    if not data["benchmarks"]:
        raise BenchResultsError(f"{path}: the file holds no benchmarks")
    if not any("median" in (b.get("stats") or {}) for b in data["benchmarks"]):
        raise BenchResultsError(f"{path}: no benchmark in the file has stats.median")
    return data


def seq_len(bench: dict):
    extra, params = bench.get("extra_info") or {}, bench.get("params") or {}
    for src in (extra, params):
        for key in ("N", "seqlen", "seqlen_q"):
            if key in src:
                return src[key]
    return None


def cell_value(bench: dict, col: str):
    """The value of column ``col`` for one benchmark, or KeyError."""
    if col in STAT_KEYS:
        stats = bench.get("stats") or {}  # a run that did not complete (e.g. out of memory) has none
        return stats[col] * 1e3  # seconds -> ms
    if col.startswith("params."):
        return (bench.get("params") or {})[col[len("params.") :]]
    if col == "name":
        return bench["name"]
    if col.startswith("kernels."):  # a field of the launch reports: extra_info["kernels"][name][KEY]
        key = col[len("kernels.") :]
        reports = (bench.get("extra_info") or {}).get("kernels") or {}
        values = [r[key] for r in reports.values() if isinstance(r, dict) and key in r]
        if not values:
            raise KeyError(col)
        return values[0] if len(values) == 1 else tuple(values)
    return (bench.get("extra_info") or {})[col]


def column_label(col: str) -> str:
    labels = {
        "median": "median (ms)",
        "mean": "mean (ms)",
        "min": "min (ms)",
        "max": "max (ms)",
        "stddev": "stddev (ms)",
        "iqr": "IQR (ms)",
        "tflops": "TFLOP/s",
        "pct_sgemm": "% of SGEMM",
        "extra_mem_bytes": "extra memory",
        "hbm_bytes": "bytes moved",
        "bytes_moved": "bytes moved",
        "kernels": "kernels",
        "fwd_ms": "forward (ms)",
        "bwd_ms": "backward (ms)",
        "bwd_tflops": "backward TFLOP/s",
        "pass_": "pass",
        "kernels.grid_blocks": "thread blocks",
        "kernels.blocks_per_sm": "blocks per SM",
        "kernels.waves": "waves",
        "kernels.sm_fill": "SM fill",
        "kernels.threads_per_block": "threads per block",
    }
    for prefix in ("params.", "kernels."):
        if col not in labels and col.startswith(prefix):
            return col[len(prefix) :]
    return labels.get(col, col)


def fmt(col: str, value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):  # e.g. extra_info["kernels"]: name -> launch report; show the names
        return "; ".join(str(k) for k in value) or "–"
    if isinstance(value, tuple):  # a kernels.KEY column of a row with several kernels: one value each
        return " / ".join(fmt(col, v) for v in value)
    if col.endswith("bytes") and isinstance(value, (int, float)):
        v = float(value)
        for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1024 or unit == "TiB":
                return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
            v /= 1024
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    return str(value)


METRIC_KEYS = ("tflops", "pct_sgemm", "extra_mem_bytes", "bytes_moved", "hbm_bytes")


def default_columns(benches: list[dict]) -> list[str]:
    """``algorithm`` (else the test name), the other scalar ``extra_info`` keys, median, then the metrics."""
    seen: list[str] = []
    for b in benches:
        for key, value in (b.get("extra_info") or {}).items():
            if key not in seen and key not in _SKIP_COLUMNS and not isinstance(value, (dict, list)):
                seen.append(key)
    cols = ["algorithm"] if "algorithm" in seen else ["name"]
    cols += [c for c in seen if c != "algorithm" and c not in METRIC_KEYS]
    cols.append("median")
    cols += [c for c in METRIC_KEYS if c in seen]
    return cols


def _machine(data: dict) -> dict:
    """machine_info with nested provenance dicts (ours: ``numba_flash``) flattened into it."""
    flat = {}
    for key, val in (data.get("machine_info") or {}).items():
        if isinstance(val, dict) and key != "cpu":
            for k2, v2 in val.items():
                if not isinstance(v2, (dict, list)):
                    flat.setdefault(k2, v2)
        elif not isinstance(val, (dict, list)):
            flat[key] = val
    return flat


def header_fields(data: dict, benches: list[dict]) -> list[tuple[str, str]]:
    mi = _machine(data)
    ci = data.get("commit_info") or {}
    devices = sorted(
        {str((b.get("extra_info") or {}).get("device")) for b in benches if (b.get("extra_info") or {}).get("device")}
    )
    out: list[tuple[str, str]] = []
    if devices:
        out.append(("Device", ", ".join(devices)))
    if data.get("datetime"):
        out.append(("Date", str(data["datetime"])))
    if ci.get("id"):
        commit = str(ci["id"])[:12] + (" (uncommitted changes)" if ci.get("dirty") else "")
        if ci.get("branch"):
            commit += f" on {ci['branch']}"
        out.append(("Commit", commit))
    shown = set()
    for key, label in HEADER_KEYS:
        if key in mi and mi[key] not in (None, "") and label not in {lbl for lbl, _ in out}:
            if key == "device" and devices:
                continue
            value = mi[key]
            out.append((label, f"{value:.1f}" if isinstance(value, float) else str(value)))
            shown.add(key)
    for key, val in mi.items():
        if key in shown or key in _SKIP_MACHINE or val in (None, "") or key in dict(HEADER_KEYS):
            continue
        out.append((key, str(val)))
    if data.get("version"):
        out.append(("pytest-benchmark", str(data["version"])))
    return out


def _table(title: str, header: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["bench-table"])
    table += nodes.title(title, title)
    tgroup = nodes.tgroup(cols=len(header))
    table += tgroup
    for _ in header:
        tgroup += nodes.colspec(colwidth=1)
    thead = nodes.thead()
    tgroup += thead
    thead += _row(header)
    tbody = nodes.tbody()
    tgroup += tbody
    for r in rows:
        tbody += _row(r)
    return table


def _row(cells: list[str]) -> nodes.row:
    row = nodes.row()
    for c in cells:
        entry = nodes.entry()
        entry += nodes.paragraph(c, c)
        row += entry
    return row


class BenchTable(SphinxDirective):
    required_arguments = 0
    optional_arguments = 1
    has_content = False
    option_spec = {
        "glob": directives.unchanged_required,
        "columns": directives.unchanged_required,
        "baseline": directives.unchanged_required,
        "match": directives.unchanged_required,
        "plot": directives.unchanged_required,
        "where": directives.unchanged_required,
        "one-table": directives.flag,
    }

    def run(self):
        if bool(self.arguments) == ("glob" in self.options):
            raise self.error("bench-table takes either one results file or the :glob: option")
        if self.arguments:
            rel, path = self.env.relfn2path(self.arguments[0], self.env.docname)
            if not os.path.isfile(path):
                raise self.error(f"bench-table: results file {self.arguments[0]!r} not found ({path})")
            return self.render(Path(path), self.arguments[0], explicit_plot=self.options.get("plot"), strict=True)
        if "plot" in self.options:
            raise self.error("bench-table: :plot: needs a single results file, not :glob:")
        if "where" in self.options:
            raise self.error("bench-table: :where: needs a single results file, not :glob:")
        pattern = self.options["glob"]
        _, abs_pattern = self.env.relfn2path(pattern, self.env.docname)
        files = sorted(globmod.glob(abs_pattern))
        if not files:
            para = nodes.note()
            text = (
                f"No benchmark results are committed yet (no file matches {pattern}). "
                "They are produced on a GPU by the benchmark suite; see the commands below."
            )
            para += nodes.paragraph(text, text)
            return [para]
        if "columns" in self.options:  # with :glob:, a column must exist in at least one file
            try:
                all_benches = [b for f in files for b in load_results(Path(f))["benchmarks"]]
            except BenchResultsError as exc:
                raise self.error(f"bench-table: {exc}") from None
            for c in (c.strip() for c in self.options["columns"].split(",") if c.strip()):
                if not any(_has(b, c) for b in all_benches):
                    raise self.error(f"bench-table: no benchmark in {pattern} has column {c!r}")
        out = []
        docdir = Path(self.env.doc2path(self.env.docname)).parent
        for f in files:
            self.env.note_dependency(f)
            shown = os.path.relpath(f, docdir)
            section = nodes.rubric(shown, shown)
            out.append(section)
            out.extend(self.render(Path(f), shown, explicit_plot=None, strict=False))
        return out

    def render(self, path: Path, shown: str, explicit_plot, strict: bool):
        """Header, one table per N and the plot of one results file.

        ``strict`` (a named file): a ``:baseline:`` algorithm the file lacks is an error; with ``:glob:``
        the speed-up column is left out for such a file instead.
        """
        self.env.note_dependency(str(path))
        try:
            data = load_results(path)
        except BenchResultsError as exc:
            raise self.error(f"bench-table: {exc}") from None
        benches = self._where(data["benchmarks"], shown) if "where" in self.options else data["benchmarks"]
        cols = (
            [c.strip() for c in self.options["columns"].split(",") if c.strip()]
            if "columns" in self.options
            else default_columns(benches)
        )
        for c in cols:
            if not any(_has(b, c) for b in benches):
                if strict or "columns" not in self.options:
                    raise self.error(f"bench-table {shown}: no benchmark in the file has column {c!r}")
        if not strict:  # with :glob:, a file may lack some of the requested columns
            cols = [c for c in cols if any(_has(b, c) for b in benches)]
        baseline = self.options.get("baseline")
        match_keys = (
            [k.strip() for k in self.options["match"].split(",")]
            if "match" in self.options
            else [k for k in SHAPE_KEYS if any(_has(b, k) for b in benches)]
        )
        if baseline and not any((b.get("extra_info") or {}).get("algorithm") == baseline for b in benches):
            if strict:
                raise self.error(f"bench-table {shown}: no benchmark has algorithm {baseline!r} (the :baseline:)")
            baseline = None

        result: list[nodes.Node] = []
        fields = nodes.field_list(classes=["bench-provenance"])
        for label, value in header_fields(data, benches):
            field = nodes.field()
            field += nodes.field_name(label, label)
            body = nodes.field_body()
            body += nodes.paragraph(value, value)
            field += body
            fields += field
        fields_src = nodes.field()
        fields_src += nodes.field_name("Results file", "Results file")
        body = nodes.field_body()
        body += nodes.paragraph("", "", nodes.literal(shown, shown))
        fields_src += body
        fields.insert(0, fields_src)
        result.append(fields)

        groups: dict = {}
        for b in benches:
            groups.setdefault("all" if "one-table" in self.options else seq_len(b), []).append(b)
        header = [column_label(c) for c in cols] + ([f"speed-up vs {baseline}"] if baseline else [])
        for n in sorted(groups, key=lambda x: (x is None, x if x is not None else 0)):
            rows = []
            for b in groups[n]:
                row = [fmt(c, _get(b, c)) for c in cols]
                if baseline:
                    row.append(self._speedup(b, groups[n], baseline, match_keys))
                rows.append(row)
            if n == "all":
                title = ", ".join(f"{k} = {' or '.join(v)}" for k, v in self._filters()) or "all benchmarks"
            else:
                title = f"N = {n:,}" if isinstance(n, int) else ("all benchmarks" if n is None else f"N = {n}")
            result.append(_table(title, header, rows))

        plot = None
        if explicit_plot == "none":
            pass
        elif explicit_plot:
            _, p = self.env.relfn2path(explicit_plot, self.env.docname)
            if not os.path.isfile(p):
                raise self.error(f"bench-table: plot {explicit_plot!r} not found ({p})")
            plot = Path(p)
        elif path.with_suffix(".png").is_file():
            plot = path.with_suffix(".png")
        if plot is not None:
            srcdir = Path(self.env.srcdir)
            uri = "/" + plot.resolve().relative_to(srcdir.resolve()).as_posix()
            result.append(nodes.image(uri=uri, alt=f"plot of {shown}"))
        return result

    def _filters(self) -> list[tuple[str, list[str]]]:
        """``:where:`` as [(column, [accepted values])], in the order written."""
        out = []
        for clause in (c.strip() for c in self.options.get("where", "").split(",") if c.strip()):
            key, sep, values = clause.partition("=")
            if not sep or not key.strip() or not values.strip():
                raise self.error(f"bench-table: :where: clause {clause!r} is not COLUMN=VALUE[|VALUE...]")
            out.append((key.strip(), [v.strip() for v in values.split("|")]))
        return out

    def _where(self, benches: list[dict], shown: str) -> list[dict]:
        """The rows that pass every ``:where:`` clause (values compared as text, case-insensitively)."""
        kept = benches
        for key, accepted in self._filters():
            if not any(_has(b, key) for b in benches):
                raise self.error(f"bench-table {shown}: no benchmark in the file has column {key!r} (in :where:)")
            wanted = {a.lower() for a in accepted}
            kept = [b for b in kept if _has(b, key) and str(_get(b, key)).lower() in wanted]
        if not kept:
            raise self.error(f"bench-table {shown}: :where: {self.options['where']} matches no benchmark")
        return kept

    @staticmethod
    def _speedup(b, group, baseline, match_keys) -> str:
        key = tuple(_get(b, k) for k in match_keys)
        for other in group:
            if (other.get("extra_info") or {}).get("algorithm") == baseline and tuple(
                _get(other, k) for k in match_keys
            ) == key:
                num, den = _get(other, "median"), _get(b, "median")
                return f"{num / den:.2f}x" if num and den else "–"
        return "–"


def _has(b: dict, col: str) -> bool:
    try:
        cell_value(b, col)
        return True
    except KeyError:
        return False


def _get(b: dict, col: str):
    try:
        return cell_value(b, col)
    except KeyError:
        return None


def setup(app):
    app.add_directive("bench-table", BenchTable)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
