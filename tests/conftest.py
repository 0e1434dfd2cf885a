"""Shared pytest set-up: backend choice, markers, the report header, fresh random inputs.

``import numba_flash`` comes first so that the backend (GPU or simulator) is chosen before any test
module imports ``numba.cuda``.
"""

from __future__ import annotations

import os
import zlib

import numba_flash  # noqa: F401  (chooses the backend before numba.cuda is imported)
from numba_flash.runtime import backend as _backend

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


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: unknown without xdist (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` without ``--dist``: work stealing instead of xdist's default ``load``. The simulator's costliest tests
    take tens of seconds each; with ``load`` the queue of one worker could end on several of them while the other
    sat idle, and an idle worker now takes tests from the busy one. (A hook, not ``--dist`` in addopts: the GPU
    benchmarks run with ``-p no:xdist``, which would not know the option.)"""
    if config.getoption("dist") == "load":
        from xdist.scheduler import WorkStealingScheduling

        return WorkStealingScheduling(config, log)
    return None


def pytest_report_header(config):
    return f"numba-flash backend: {_backend.describe()}"


def pytest_collection_modifyitems(config, items):
    on_gpu = not _backend.is_simulator()
    runslow = config.getoption("--runslow") or on_gpu
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (running in Numba's CUDA simulator)")
    skip_slow = pytest.mark.skip(reason="slow in the simulator: use --runslow (always runs on a GPU)")
    skip_sim = pytest.mark.skip(reason="simulator-only check")
    skip_tier = pytest.mark.skip(
        reason="exhaustive tier in the simulator (tests/quick_tier.py): use --runslow (always runs on a GPU)"
    )
    tier = _quick_tier_cases(config, items)
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not runslow:
            item.add_marker(skip_slow)
        if "simulator_only" in item.keywords and on_gpu:
            item.add_marker(skip_sim)
        if not runslow and item in tier:
            item.add_marker(skip_tier)


def _quick_tier_cases(config, items) -> set:
    """The items of ``tests/quick_tier.py``'s tests that are not in its quick tier; a usage error when an entry
    names a test or a case that no longer exists in a file that was collected."""
    from quick_tier import QUICK

    by_test, files = {}, set()
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        files.add(path)
        by_test.setdefault(f"{path}::{item.originalname}", []).append(item)
    whole_files = not any("::" in str(a) for a in config.args)
    out, stale = set(), []
    for test, kept in QUICK.items():
        if test.split("::", 1)[0] not in files:
            continue
        found = by_test.get(test, [])
        ids = {it.callspec.id for it in found if hasattr(it, "callspec")}
        missing = [k for k in kept if k not in ids]
        if (missing or not found) and whole_files:
            stale.append(f"{test}: {missing or 'no such test'}")
        out.update(it for it in found if hasattr(it, "callspec") and it.callspec.id not in kept)
    if stale:
        raise pytest.UsageError(
            "tests/quick_tier.py names cases that no longer exist (update it):\n  " + "\n  ".join(stale)
        )
    return out


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
