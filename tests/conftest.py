"""Shared pytest set-up: backend choice, markers, the report header, fresh random inputs.

``import numba_flash`` comes first so that the backend (GPU or simulator) is chosen before any test
module imports ``numba.cuda``.
"""

from __future__ import annotations

import os
import zlib

import numba_flash  # noqa: F401  (chooses the backend before numba.cuda is imported)
from numba_flash import _backend

import numpy as np
import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow in the simulator")


def pytest_configure(config):
    # Registered here, after numba_flash chose the backend: naming numba's warning classes in
    # pyproject's filterwarnings would make pytest import numba before the choice is made.
    # Small test launches are meant to be small; numba's "low occupancy" and "host array copied"
    # performance hints are noise in a correctness suite.
    config.addinivalue_line("filterwarnings", "ignore::numba.core.errors.NumbaPerformanceWarning")


def pytest_report_header(config):
    return f"numba-flash backend: {_backend.describe()}"


def pytest_collection_modifyitems(config, items):
    on_gpu = not _backend.is_simulator()
    runslow = config.getoption("--runslow") or on_gpu
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (running in Numba's CUDA simulator)")
    skip_slow = pytest.mark.skip(reason="slow in the simulator: use --runslow (always runs on a GPU)")
    skip_sim = pytest.mark.skip(reason="simulator-only check")
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not runslow:
            item.add_marker(skip_slow)
        if "simulator_only" in item.keywords and on_gpu:
            item.add_marker(skip_sim)


@pytest.fixture
def on_gpu() -> bool:
    return not _backend.is_simulator()


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's id: fresh inputs per case, reproducible per run.

    Set NUMBA_FLASH_TEST_SEED to shift every seed (to draw new inputs for the whole suite).
    """
    base = int(os.environ.get("NUMBA_FLASH_TEST_SEED", "0"))
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()) + base)
