"""The GPU measurement tools of ``bench/`` work end to end without a GPU, and the docs render their output.

* ``io --measure``: in the simulator it prints one line and exits with status 2; ``--dry-run`` lists
  every algorithm and variant; ncu's CSV is parsed into bytes per kernel (units, thousands
  separators, noise lines); each result row carries the IO model's count at the kernels' tiles.
* ``bench.figure2 --tiny`` runs every panel in the simulator and writes the JSON and the PNGs; the
  docs directives (``docs/_ext/results_json.py``) render that file, and render a "not yet measured"
  note (without failing the build) when no file is committed.

The real measurements need a GPU and Nsight Compute; the commands are on the docs page ``figure2``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from numba_flash_reference import io_model

import pytest

from bench import common, measure_io, ncu  # the repository root is on pytest's pythonpath (pyproject)

ROOT = Path(__file__).resolve().parents[1]


def run_module(*args, timeout=600):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), PYTHONWARNINGS="ignore"
    )
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.simulator_only
def test_io_measure_in_the_simulator_prints_one_line_and_exits_with_status_2():
    proc = run_module("numba_flash", "io", "--measure", timeout=300)
    assert proc.returncode == 2
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0] and "simulator" in lines[0]


def test_io_measure_dry_run_lists_every_algorithm_and_variant_on_both_parts(capsys):
    assert measure_io.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for alg, variants in common.VARIANTS.items():
        for v in variants:
            assert any(alg in ln and (v or "-") in ln and "N=1024" in ln and "b=64" in ln for ln in out.splitlines()), (
                alg,
                v,
            )
    assert (
        "N=65536" in out
        and "dram__bytes_read.sum,dram__bytes_write.sum" in out
        and "--nvtx-include numba_flash_measure/" in out
    )
    cases = measure_io.cases()
    assert len({measure_io.case_key(c) for c in cases}) == len(cases)  # parts merge by key: keys are unique


NCU_CSV = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
some program output
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","kernel","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,048,576"
"0","4242","python3.12","127.0.0.1","kernel","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Mbyte","2.50"
"1","4242","python3.12","127.0.0.1","row_softmax","1","7","(64, 4, 1)","(256, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Kbyte","3"
"1","4242","python3.12","127.0.0.1","row_softmax","1","7","(64, 4, 1)","(256, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","0"
==PROF== Disconnected from process 4242
"""  # noqa: E501  (ncu's CSV rows, as it prints them)


def test_ncu_csv_is_parsed_into_bytes_per_kernel():
    rows = ncu.parse_csv(NCU_CSV)
    assert rows == [
        {"id": "0", "kernel": "kernel", "read": 1048576.0, "write": 2.5e6},
        {"id": "1", "kernel": "row_softmax", "read": 3000.0, "write": 0.0},
    ]
    assert ncu.parse_csv("==PROF== nothing profiled\n") == []
    with pytest.raises(ValueError, match="unknown unit"):
        ncu.parse_csv(NCU_CSV.replace('"Mbyte"', '"furlong"'))


def test_measured_rows_carry_the_io_model_at_the_kernels_tiles():
    gpt2 = dict(b=64, h=16)
    by = {
        (c["algorithm"], c.get("variant"), c["pass"], (c.get("mask_info") or {}).get("pattern")): c
        for c in measure_io.cases(("gpt2",))
    }
    fake = {"dram_read_bytes": 3e9, "dram_write_bytes": 1e9, "dram_bytes": 4e9}
    row = measure_io.complete(by[("flash1", "fast", "forward", None)], {**fake, "tiles_forward": [32, 128]}, 50 * 2**20)
    assert row["model_bytes"] == 4 * io_model.io_alg1_forward(1024, 64, Br=32, Bc=128, **gpt2).total
    assert row["measured_over_model"] == pytest.approx(4e9 / row["model_bytes"])
    assert row["compulsory_bytes"] == 4 * 4 * 64 * 16 * 1024 * 64 and row["l2_bytes"] == 50 * 2**20
    row = measure_io.complete(by[("flash2", "fast", "backward", None)], {**fake, "tiles_backward": [64, 128]})
    assert row["model_bytes"] == 4 * io_model.io_fa2_backward(1024, 64, Br=64, Bc=128, **gpt2).total
    row = measure_io.complete(by[("standard", None, "forward", None)], fake)
    assert row["model_bytes"] == 4 * io_model.io_standard_forward(1024, 64, **gpt2).total
    # Block-sparse: the kernels' exact count, and Proposition 4's beside it (they differ by the documented departures).
    row = measure_io.complete(by[("block-sparse", None, "forward", "butterfly")], {**fake, "tiles_forward": [32, 32]})
    mask = common.block_mask("butterfly", 32, 32)
    assert row["paper_model_bytes"] == 4 * io_model.io_alg5_block_sparse(1024, 64, mask, Br=32, Bc=32, **gpt2).total
    assert row["model_bytes"] < row["paper_model_bytes"]
    assert row["mask_info"] == {"pattern": "butterfly", "density": float(mask.mean())}


def test_matmul_flops_count_six_products_for_standard_and_seven_for_flash():
    shape = dict(batch=64, nheads=16, N=1024, d=64)
    per = 2 * 64 * 16 * 1024 * 1024 * 64
    assert common.matmul_flops("standard", "fwd+bwd", **shape) == 6 * per
    assert common.matmul_flops("flash1", "fwd+bwd", **shape) == 7 * per
    assert common.matmul_flops("block-sparse", "fwd+bwd", **shape, density=0.25) == 7 * per / 4


# ------------------------------------------------------------------------------------------------
# bench.figure2 --tiny and the docs page built from its output
# ------------------------------------------------------------------------------------------------
def _figure2(tmp_path, panels):
    out = tmp_path / "fig2"
    proc = run_module("bench.figure2", "--tiny", "--panels", panels, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "figure2.json").read_text())
    assert data["kind"] == "numba_flash.figure2" and data["tiny"] is True and data["provenance"]["commit"]
    for p in panels.split(","):
        rows = data[p]["rows"]
        assert rows and not [r["error"] for r in rows if r.get("error")]
        assert all(r["runtime_ms"] > 0 and r["hbm_gb_model"] > 0 for r in rows)
        assert all(r.get("hbm_gb_measured") is None for r in rows)  # no ncu in a tiny run
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            continue
        assert (out / f"figure2_{p}.png").stat().st_size > 1000
    return out, data


def test_figure2_tiny_runs_end_to_end_and_the_docs_page_renders_it(tmp_path):
    out, data = _figure2(tmp_path, "middle,right")
    right = data["right"]["rows"]
    banded = {r["density"]: r for r in right if r["pattern"] == "banded"}
    assert banded[0.25]["hbm_gb_model"] < banded[1.0]["hbm_gb_model"]  # Proposition 4 in the model column
    assert [r["Bc"] for r in data["middle"]["rows"]] == [8, 16]
    assert data["middle"]["rows"][1]["hbm_gb_model"] < data["middle"]["rows"][0]["hbm_gb_model"]  # fewer passes Tc
    pytest.importorskip("sphinx.cmd.build", reason="needs Sphinx")
    files = {f"results/figure2/{p.name}": p.read_bytes() for p in out.iterdir()}
    files["results/io_measured.json"] = json.dumps(_measured_io_file())
    body = """
        .. figure2-panel:: results/figure2/figure2.json
           :panel: right
           :provenance:

        .. figure2-panel:: results/figure2/figure2.json
           :panel: middle

        .. measured-io:: results/io_measured.json

        .. measured-io:: results/missing.json
    """
    rc, log, html = _build(tmp_path, textwrap.dedent(body), files)
    assert rc == 0, log
    text = (html / "page.html").read_text()
    assert "functional only" in text and "butterfly" in text and "figure2_right.png" in text
    assert "Not yet measured" in text and ">--measure<" in text  # the missing file: a note, not an error
    assert "re-reads served by the L2" in text and "≈ model" in text


def test_docs_directives_fail_on_a_broken_results_file_and_note_a_missing_one(tmp_path):
    pytest.importorskip("sphinx.cmd.build", reason="needs Sphinx")
    rc, log, html = _build(tmp_path / "a", ".. figure2-panel:: results/figure2/figure2.json\n   :panel: left\n", {})
    assert (
        rc == 0
        and "Not yet measured" in (html / "page.html").read_text()
        and "bench.figure2" in (html / "page.html").read_text()
    )
    rc, log, _ = _build(tmp_path / "b", ".. figure2-panel:: f.json\n   :panel: left\n", {"f.json": '{"kind": "other"}'})
    assert rc != 0 and "not a numba_flash.figure2 results file" in log
    rc, log, _ = _build(
        tmp_path / "c", ".. figure2-panel:: f.json\n   :panel: middle\n", {"f.json": '{"kind": "numba_flash.figure2"}'}
    )
    assert rc != 0 and "has no 'middle' panel" in log


@pytest.mark.slow
def test_figure2_tiny_runs_all_three_panels(tmp_path):
    _, data = _figure2(tmp_path, "left,middle,right")
    left = {r["algorithm"]: r for r in data["left"]["rows"]}
    assert left["flash1"]["gflop"] > left["standard"]["gflop"]  # the recomputation
    assert left["flash1"]["hbm_gb_model"] < left["standard"]["hbm_gb_model"]


def _measured_io_file():
    def row(alg, dram, model, comp):
        return {
            "part": "gpt2",
            "algorithm": alg,
            "variant": None,
            "pass": "forward",
            "batch": 8,
            "nheads": 16,
            "N": 1024,
            "d": 64,
            "tiles": {"forward": [128, 64]},
            "dram_bytes": dram,
            "dram_read_bytes": dram * 0.9,
            "dram_write_bytes": dram * 0.1,
            "model_bytes": model,
            "compulsory_bytes": comp,
            "measured_over_model": dram / model,
            "kv_bytes_per_head": 2 * 1024 * 64 * 4,
        }

    return {
        "kind": "numba_flash.measured_io",
        "version": 1,
        "provenance": {"device": "test device", "l2_bytes": 52428800},
        "results": [row("flash2", 1.3e8, 6.0e8, 1.3e8), row("standard", 2.2e9, 2.3e9, 1.3e8)],
    }


def _build(tmp_path, body, files):
    ext = ROOT / "docs" / "_ext"
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ext)!r})\nextensions = ['results_json']\nproject = 't'\n"
    )
    (src / "index.rst").write_text("Index\n=====\n\n.. toctree::\n\n   page\n")
    (src / "page.rst").write_text("Page\n====\n\n" + body)
    for rel, content in files.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    out = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr, out
