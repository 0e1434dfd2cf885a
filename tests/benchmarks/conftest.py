"""Benchmark fixtures shared by every file here: the SGEMM ceiling and provenance in the JSON.

The helpers come from the repository's ``bench`` package (``bench/common.py``, shared with the sweep
tools in ``bench/``); pytest finds it through ``pythonpath = ["."]`` in ``pyproject.toml``.
"""

from __future__ import annotations

import pytest

from bench import common as bu


@pytest.fixture(scope="session")
def sgemm_tflops():
    """cuBLAS SGEMM TFLOP/s (4096^3, fp32, TF32 off) measured in this run; None in the simulator."""
    return bu.sgemm_tflops()


def pytest_benchmark_update_machine_info(config, machine_info):
    """Device, driver, versions, date and command, next to pytest-benchmark's own machine_info."""
    machine_info["numba_flash"] = bu.provenance()
    rate = bu.sgemm_tflops() if bu.ON_GPU else None
    machine_info["numba_flash"]["sgemm_tflops_4096_fp32"] = rate
