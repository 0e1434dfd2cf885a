"""``python -m numba_flash demo`` runs end to end and prints the banner and the comparison table."""

from __future__ import annotations

import os
import subprocess
import sys

import numba_flash


def test_demo_cli_prints_backend_banner_and_a_row_per_algorithm():
    cmd = [
        sys.executable,
        "-m",
        "numba_flash",
        "demo",
        "--batch",
        "1",
        "--nheads",
        "1",
        "--seqlen",
        "12",
        "--headdim",
        "4",
        "--causal",
        "--repeats",
        "1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == numba_flash.describe()
    table = {line.split(",")[0]: line for line in lines if line.startswith("Alg. ")}
    assert set(table) == {"Alg. 0", "Alg. 1-2"}, res.stdout
    for row in table.values():
        cells = row.split()
        err = float(cells[cells.index("ms") - 2])
        assert err < 1e-5, row  # max |error| against the float64 oracle
        assert cells[-1].startswith("numba_flash/") and cells[-1].endswith(".py"), row  # which kernel ran
