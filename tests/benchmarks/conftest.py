"""Benchmark fixtures shared by every file here: the SGEMM ceiling and provenance in the JSON."""

from __future__ import annotations

import bench_utils
import pytest


@pytest.fixture(scope="session")
def sgemm_tflops():
    """cuBLAS SGEMM TFLOP/s (4096^3, fp32, TF32 off) measured in this run; None in the simulator."""
    return bench_utils.sgemm_tflops()


def pytest_benchmark_update_machine_info(config, machine_info):
    """Device, driver, versions, date and command, next to pytest-benchmark's own machine_info."""
    machine_info["numba_flash"] = bench_utils.provenance()
    rate = bench_utils.sgemm_tflops() if bench_utils.ON_GPU else None
    machine_info["numba_flash"]["sgemm_tflops_4096_fp32"] = rate
