"""The docs' own Sphinx extensions (docs/_ext/) do what the pages rely on.

Each test builds a throw-away Sphinx project (a few pages, only our extensions, no numba) with
warnings as errors, as CI builds the real docs, and checks the claim on the built HTML or on the
build's exit status and message:

* ``code-marker`` shows exactly the marked region, dedented, with nested marker lines removed and
  the file name as caption; a missing file, a missing marker or an unknown paper tag fails the build.
* ``bench-table`` renders a pytest-benchmark JSON file (provenance header, one table per N, columns
  from ``extra_info``, the kernel names of a ``kernels`` dict, a speed-up column, the plot next to
  the file); a named file that is missing
  fails the build; a ``:glob:`` that matches nothing renders a note and does not fail. ``:where:``
  keeps the matching rows (in one table with ``:one-table:``), ``kernels.KEY`` columns read the launch
  reports; a ``:where:`` with an unknown column or no matching row fails the build.
* ``io-table`` fails the build when the IO model raises, rather than printing a wrong table.
* ``test-claims`` lists the test functions of a folder with their docstrings and markers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The docs' own extensions are exercised by building small Sphinx projects. Sphinx is in the test
# extra, so CI always runs these; only a machine without a runnable Sphinx (our GPU machines carry no
# docs toolchain) skips them.
pytest.importorskip("sphinx.cmd.build", reason="needs Sphinx (pip install -e '.[test]')")

EXT = Path(__file__).resolve().parents[1] / "docs" / "_ext"

CONF = f"""
import sys
sys.path.insert(0, {str(EXT)!r})
extensions = ["code_marker", "bench_table", "io_table", "test_claims"]
code_marker_root = "."
project = "t"
"""

KERNEL = """\
def kernel(gQ, gO):
    # [doc:outer]
    for j in range(4):  # Alg.1 L5: for j = 1..Tc
        # [doc:inner]
        s = gQ[j] * 2.0  # Alg.1 L9: S_ij = Q_i K_j^T
        gO[j] = s  # Alg.1 L12: write O_i
        # [/doc:inner]
    # [/doc:outer]
"""


def build(tmp_path: Path, pages: dict[str, str], files: dict[str, str | bytes] | None = None):
    """Build a project with ``pages`` (name -> rst body); return (returncode, output, html dir)."""
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / "conf.py").write_text(CONF)
    toc = "\n".join(f"   {name}" for name in pages)
    (src / "index.rst").write_text(f"Index\n=====\n\n.. toctree::\n\n{toc}\n")
    for name, body in pages.items():
        (src / f"{name}.rst").write_text(body)
    for rel, content in (files or {}).items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    out = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr, out


def page(title: str, body: str) -> str:
    return f"{title}\n{'=' * len(title)}\n\n{textwrap.dedent(body)}\n"


def bench_json(device="NVIDIA H200"):
    def bench(alg, n, median, tflops):
        return {
            "group": f"N={n}",
            "name": f"test_fwd[{alg}-{n}]",
            "fullname": f"tests/b.py::test_fwd[{alg}-{n}]",
            "params": {"alg": alg, "N": n},
            "stats": {
                "median": median,
                "mean": median * 1.01,
                "min": median * 0.99,
                "max": median * 1.1,
                "stddev": median * 0.01,
                "rounds": 20,
            },
            "extra_info": {
                "algorithm": alg,
                "N": n,
                "d": 64,
                "batch": 4,
                "nheads": 8,
                "causal": False,
                "tflops": tflops,
                "extra_mem_bytes": 3 * 2**20,
                "device": device,
                "pct_sgemm": 12.5,
                "functional_only": False,
                "kernels": {f"{alg} kernel (fast)": {"registers": 40}},
            },
        }

    return json.dumps(
        {
            "machine_info": {
                "node": "gpu-1",
                "python_version": "3.12.3",
                "cpu": {"brand": "x"},
                "numba_flash": {
                    "numba": "0.68.0",
                    "driver_version": "13.0",
                    "sgemm_tflops_4096_fp32": 50.7,
                    "command": "bash tests/gpu/run_benchmarks.sh",
                },
            },
            "commit_info": {"id": "0123456789abcdef", "dirty": False, "branch": "main"},
            "datetime": "2026-11-22T10:00:00",
            "version": "5.1.0",
            "benchmarks": [
                bench("standard", 1024, 0.004, 1.1),
                bench("fa2", 1024, 0.001, 4.4),
                bench("standard", 4096, 0.064, 1.2),
                bench("fa2", 4096, 0.016, 4.8),
            ],
        }
    )


def test_code_marker_shows_exactly_the_region_dedented_with_nested_markers_removed(tmp_path):
    rc, out, html = build(
        tmp_path,
        {
            "p": page(
                "P",
                """
        .. code-marker:: k.py
           :marker: outer
           :emphasize-tag: Alg.1 L9

        .. code-marker:: k.py
           :marker: inner
        """,
            ),
            "t": page("T", ".. test-claims:: tests\n"),
        },
        {
            "k.py": KERNEL,
            "tests/test_x.py": 'import pytest\n\n@pytest.mark.slow\ndef test_foo_is_bar():\n    """Foo is bar."""\n',
        },
    )
    assert rc == 0, out
    claims = (html / "t.html").read_text()
    assert "test_foo_is_bar" in claims and "Foo is bar." in claims and "[slow]" in claims
    text = (html / "p.html").read_text()
    assert text.count("k.py [outer]") == 1 and text.count("k.py [inner]") == 1
    assert "[doc:" not in text and "[/doc:" not in text
    assert "def kernel" not in text  # outside every region
    assert '<span class="hll">' in text  # the tagged line is highlighted
    assert '<pre><span></span><span class="k">for</span>' in text  # the region starts dedented


def test_code_marker_fails_the_build_when_the_code_is_not_there(tmp_path):
    cases = {
        "a": (".. code-marker:: k.py\n   :marker: no-such-marker\n", "no docs marker [doc:no-such-marker]"),
        "b": (".. code-marker:: missing.py\n   :marker: outer\n", "file not found"),
        "c": (".. code-marker:: k.py\n   :marker: inner\n   :emphasize-tag: Alg.1 L10\n", "paper tag 'Alg.1 L10'"),
        "d": (".. code-marker:: k.py\n", ":marker: option is required"),
        "e": (".. test-claims:: no-such-folder\n", "no test module matches"),
    }
    rc, out, _ = build(tmp_path, {name: page(name, rst) for name, (rst, _) in cases.items()}, {"k.py": KERNEL})
    assert rc != 0, out
    for name, (_, message) in cases.items():
        assert f"{name}.rst" in out and message in out, (message, out)


def test_bench_table_renders_provenance_groups_by_n_and_embeds_the_plot(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
    rc, out, html = build(
        tmp_path,
        {
            "b": page(
                "B",
                """
        .. bench-table:: results/fwd.json
           :columns: algorithm, kernels, d, median, tflops, pct_sgemm, extra_mem_bytes
           :baseline: standard
        """,
            ),
            "c": page("C", ".. bench-table:: results/fwd.json\n"),
        },
        {"results/fwd.json": bench_json(), "results/fwd.png": png},
    )
    assert rc == 0, out
    default = (html / "c.html").read_text()
    assert "TFLOP/s" in default and "functional_only" not in default and "registers" not in default
    text = (html / "b.html").read_text()
    for expected in (
        "NVIDIA H200",
        "2026-11-22T10:00:00",
        "0123456789ab",
        "bash tests/gpu/run_benchmarks.sh",
        "CUDA driver",
        "50.7",
        "N = 1,024",
        "N = 4,096",
        "TFLOP/s",
        "median (ms)",
        "3.0 MiB",
        "speed-up vs standard",
        "4.00x",
        "fwd.png",
        "fa2 kernel (fast)",
    ):
        assert expected in text, expected
    assert "registers" not in text  # a dict column shows the kernel names, not their launch reports
    assert text.index("N = 1,024") < text.index("N = 4,096")
    assert (html / "_images" / "fwd.png").is_file()


def test_bench_table_fails_the_build_for_a_missing_file_or_column(tmp_path):
    rc, out, _ = build(
        tmp_path,
        {
            "a": page("A", ".. bench-table:: results/none.json\n"),
            "b": page("B", ".. bench-table:: r.json\n   :columns: tflop\n"),
        },
        {"r.json": bench_json()},
    )
    assert rc != 0, out
    assert "results file 'results/none.json' not found" in out and "column 'tflop'" in out, out


def test_bench_table_where_keeps_only_the_matching_rows_in_one_table_with_launch_report_columns(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
    rc, out, html = build(
        tmp_path,
        {
            "b": page(
                "B",
                """
        .. bench-table:: results/fwd.json
           :where: algorithm=fa2, d=64, causal=false
           :one-table:
           :columns: N, kernels.registers, median, tflops
           :plot: none
        """,
            )
        },
        {"results/fwd.json": bench_json(), "results/fwd.png": png},
    )
    assert rc == 0, out
    text = (html / "b.html").read_text()
    assert "algorithm = fa2, d = 64, causal = false" in text  # one table, titled with the filter
    assert "N = 1,024" not in text and "N = 4,096" not in text  # not one table per N
    assert "4.40" in text and "4.80" in text  # the fa2 rows' TFLOP/s ...
    assert "64.00" not in text and "1.20" not in text  # ... and none of the standard rows (median, TFLOP/s)
    assert "registers" in text and "<p>40</p>" in text  # kernels.registers: a field of the launch report
    assert not (html / "_images" / "fwd.png").exists()  # :plot: none


def test_bench_table_where_fails_the_build_for_an_unknown_column_or_no_matching_row(tmp_path):
    rc, out, _ = build(
        tmp_path,
        {
            "a": page("A", ".. bench-table:: r.json\n   :where: algoritm=fa2\n"),
            "b": page("B", ".. bench-table:: r.json\n   :where: algorithm=fa3|fa4\n"),
        },
        {"r.json": bench_json()},
    )
    assert rc != 0, out
    assert "column 'algoritm' (in :where:)" in out and "algorithm=fa3|fa4 matches no benchmark" in out, out


def test_bench_table_glob_without_results_says_so_and_builds(tmp_path):
    rc, out, html = build(tmp_path, {"b": page("B", ".. bench-table::\n   :glob: results/*.json\n")})
    assert rc == 0, out
    assert "No benchmark results are committed yet" in (html / "b.html").read_text()


def test_io_table_fails_the_build_when_the_model_raises(tmp_path, monkeypatch):
    # A fake io_model whose table_rows raises: the page must not build with a wrong or empty table.
    pkg = tmp_path / "fake"
    (pkg / "numba_flash_reference").mkdir(parents=True)
    (pkg / "numba_flash_reference" / "__init__.py").write_text("")
    (pkg / "numba_flash_reference" / "io_model.py").write_text(
        "def table_rows(N, d, M=None, Br=None, Bc=None, sparsity=0.25):\n"
        "    if N > 100:\n        raise ValueError('N too large for this fake')\n"
        "    return [{'algorithm': 'standard', 'hbm_accesses': 4 * N * N}]\n"
        "def format_table(**kw):\n    return 'x'\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(pkg))
    rc, out, html = build(tmp_path, {"io": page("IO", ".. io-table::\n   :N: 64\n   :d: 8\n")})
    assert rc == 0, out
    assert "16,384" in (html / "io.html").read_text()
    rc, out, _ = build(tmp_path / "2", {"io": page("IO", ".. io-table::\n   :N: 64, 128\n   :d: 8\n")})
    assert rc != 0 and "N too large for this fake" in out, out
