"""``io-table``: the IO model's table of HBM accesses, computed when the docs are built.

Usage in a page::

    .. io-table::
       :N: 1024, 4096
       :d: 64
       :sparsity: 0.25

The rows come from :func:`numba_flash_reference.io_model.table_rows` (one dict per row; the keys are
the columns), called once per ``N``; nothing on the page is typed by hand. Options ``:M:``, ``:Br:``,
``:Bc:`` and ``:sparsity:`` are passed through; ``:columns:`` picks and orders columns (an unknown one
is an error); ``:sweep:`` renders :func:`~numba_flash_reference.io_model.sweep_rows` instead (the
saving as a function of the SRAM size ``M``); ``:text:`` renders :func:`~numba_flash_reference.io_model.format_table`
verbatim instead (what ``python -m numba_flash io`` prints).
"""

from __future__ import annotations

import importlib
import inspect

from bench_table import _table  # one table builder for both directives
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

#: Readable headers for the IO model's keys (unknown keys are shown as they are).
LABELS = {
    "MB_fp32": "MB (fp32)",
    "vs_standard": "standard / this",
    "total": "reads + writes",
    "KB_fp32": "KB fp32",
    "KB_fp16": "KB fp16",
    "fwd_FA1": "fwd FA1",
    "fwd_FA2": "fwd FA2",
    "fwd_FA2_swapped": "fwd FA2 (Br, Bc swapped)",
    "fwd_bwd_FA1": "fwd+bwd FA1",
    "fwd_bwd_FA2": "fwd+bwd FA2",
    "M_over_3d2": "M / 3d²",
    "M": "M (elements)",
}


#: Keys that are ratios "standard / this": shown as 2.00×.
RATIOS = {"vs_standard", "fwd_FA1", "fwd_FA2", "fwd_FA2_swapped", "fwd_bwd_FA1", "fwd_bwd_FA2"}


def _int_list(arg):
    try:
        return [int(x) for x in arg.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"expected integers, got {arg!r}") from None


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        if value.is_integer() and abs(value) >= 1000:
            return f"{int(value):,}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


class IOTable(SphinxDirective):
    has_content = False
    option_spec = {
        # docutils lower-cases option names: ":N:" in a page arrives here as "n".
        "n": _int_list,
        "d": directives.positive_int,
        "m": directives.positive_int,
        "br": directives.positive_int,
        "bc": directives.positive_int,
        "sparsity": directives.unchanged_required,
        "filter": directives.unchanged_required,
        "columns": directives.unchanged_required,
        "text": directives.flag,
        "sweep": directives.flag,
        "caption": directives.unchanged,
    }

    def run(self):
        try:
            io_model = importlib.import_module("numba_flash_reference.io_model")
        except ImportError as exc:
            raise self.error(f"io-table: cannot import numba_flash_reference.io_model ({exc})") from None
        self.env.note_dependency(inspect.getsourcefile(io_model))
        if "n" not in self.options or "d" not in self.options:
            raise self.error("io-table: the :N: and :d: options are required")
        names = {"m": "M", "br": "Br", "bc": "Bc"}
        kwargs = {names[k]: self.options[k] for k in names if k in self.options}
        try:
            sparsities = (
                [float(x) for x in self.options["sparsity"].replace(",", " ").split()]
                if "sparsity" in self.options
                else [None]
            )
        except ValueError:
            raise self.error(f"io-table: :sparsity: must be numbers, got {self.options['sparsity']!r}") from None
        filters = {}
        for item in filter(None, (x.strip() for x in self.options.get("filter", "").split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise self.error(f"io-table: :filter: takes key=value pairs, got {item!r}")
            filters[key.strip()] = value.strip()
        d = self.options["d"]
        if "text" in self.options:
            text = "\n\n".join(
                io_model.format_table(N=n, d=d, **kwargs, **({} if sp is None else {"sparsity": sp}))
                for n in self.options["n"]
                for sp in sparsities
            )
            block = nodes.literal_block(text, text)
            block["language"] = "text"
            return [block]
        sweep = "sweep" in self.options
        if sweep and (kwargs or sparsities != [None]):
            raise self.error("io-table: :sweep: varies M itself; it takes only :N: and :d:")
        fn_name = "sweep_rows" if sweep else "table_rows"
        fn = getattr(io_model, fn_name, None)
        if fn is None:
            raise self.error(f"io-table: numba_flash_reference.io_model has no {fn_name}()")
        rows = []
        for n in self.options["n"]:
            for sp in sparsities:
                extra = {} if sp is None else {"sparsity": sp}
                try:
                    got = fn(n, d, **kwargs, **extra)
                except Exception as exc:  # a failing model must fail the build, with its message
                    raise self.error(
                        f"io-table: io_model.{fn_name}(N={n}, d={d}, {kwargs | extra}) raised {exc!r}"
                    ) from None
                if not isinstance(got, list) or not got or not all(isinstance(r, dict) for r in got):
                    raise self.error(f"io-table: io_model.{fn_name} must return a non-empty list of dicts")
                for r in got:
                    rows.append(r if "N" in r or len(self.options["n"]) == 1 else {"N": n, **r})
        for key, value in filters.items():
            if not any(key in r for r in rows):
                raise self.error(f"io-table: :filter: key {key!r} is not a column of the table")
            rows = [r for r in rows if str(r.get(key)) == value]
        if not rows:
            raise self.error(f"io-table: no row matches :filter: {self.options.get('filter')}")
        keys: list[str] = []
        for r in rows:
            keys += [k for k in r if k not in keys]
        if "columns" in self.options:
            cols = [c.strip() for c in self.options["columns"].split(",") if c.strip()]
            unknown = [c for c in cols if c not in keys]
            if unknown:
                raise self.error(f"io-table: unknown column(s) {unknown}; table_rows gives {keys}")
        else:
            cols = keys
        body = []
        for r in rows:
            cells = [
                (f"{r[c]:.2f}×" if c in RATIOS and isinstance(r.get(c), float) else _fmt(r.get(c, ""))) for c in cols
            ]
            if cells not in body:  # rows repeated across several :sparsity: values are shown once
                body.append(cells)
        if len(self.options["n"]) == 1:
            rows_for = f"N = {self.options['n'][0]:,}, d = {d}"
        else:
            rows_for = f"d = {d}"
        default_caption = (
            f"Saving against standard attention as a function of the SRAM size M ({rows_for})"
            if sweep
            else f"HBM accesses in elements per (batch, head) ({rows_for})"
        )
        caption = self.options.get("caption") or default_caption
        return [_table(caption, [LABELS.get(c, c) for c in cols], body)]


def setup(app):
    app.add_directive("io-table", IOTable)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
