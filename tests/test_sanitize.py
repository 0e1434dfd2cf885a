"""The compute-sanitizer workload runs every kernel and checks its results; the GPU script fails on any error.

``bench/gpu/sanitize.sh`` runs ``python -m bench.sanitize`` under NVIDIA compute-sanitizer (memcheck,
racecheck, synccheck, initcheck) on a GPU machine. Here, without a GPU: the workload itself at tiny
shapes (``--check``, in the simulator), and the script's plumbing with a stand-in for
compute-sanitizer (one log per tool, a non-zero exit when a tool reports errors).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from numba_flash import registry

ROOT = Path(__file__).resolve().parents[1]


def test_sanitize_workload_runs_every_registered_kernel_and_checks_its_results():
    res = subprocess.run(
        [sys.executable, "-m", "bench.sanitize", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.rstrip().endswith(
        f"{len(registry.entries())} kernels ran; 0 wrong result(s); kernels that did not run: none"
    )
    rows = [line for line in res.stdout.splitlines() if line.endswith(" ok")]
    for k in registry.entries():  # forward and backward of every algorithm and variant
        tag = f"{k.algorithm:8s} fwd {k.variant}" if k.pass_ == "forward" else f"bwd {k.variant}"
        assert any(k.algorithm in r and tag in r for r in rows), (k, res.stdout)
    assert any("deterministic" in r for r in rows)


FAKE_SANITIZER = """#!/usr/bin/env bash
# Stands in for compute-sanitizer: "--tool T --error-exitcode N cmd ..." reports an error for racecheck.
if [ "$1" = "--version" ]; then echo "fake"; exit 0; fi
tool=$2
if [ "$tool" = racecheck ]; then echo "========= ERROR SUMMARY: 1 error"; exit "$4"; fi
echo "========= ERROR SUMMARY: 0 errors"
"""


def test_sanitize_script_writes_a_log_per_tool_and_fails_when_one_tool_reports_an_error(tmp_path):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, COMPUTE_SANITIZER=str(fake), SANITIZE_NO_SETUP="1", PYTHON=sys.executable)
    res = subprocess.run(
        ["bash", "bench/gpu/sanitize.sh", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode == 1, res.stdout + res.stderr
    for tool in ("memcheck", "racecheck", "synccheck", "initcheck"):
        assert (out / f"sanitize_{tool}.log").exists()
    summary = (out / "sanitize_summary.txt").read_text()
    assert "racecheck: exit 1" in summary and "memcheck: exit 0" in summary and "ERRORS" in summary
