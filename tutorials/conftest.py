"""pytest set-up for the tutorials' autograders (``tutorials/assignments/*/test_autograder.py``).

* ``import numba_flash`` comes first: it chooses the backend (a GPU if there is one, else Numba's CUDA
  simulator) before anything imports ``numba.cuda``. Submissions do not import it themselves (the
  guard forbids it): the grader has chosen the backend before a submission is loaded.
* ``--impl`` (or the environment variable ``NUMBA_FLASH_IMPL``) says which implementation the
  autograders grade: ``stub`` (default, the student's ``stub.py``), ``solution`` (course staff's, from
  ``tutorials/solutions/`` or ``$NUMBA_FLASH_SOLUTIONS``), or a path to a ``.py`` file or to a folder of
  submissions named after the assignments (``a1_online_softmax.py``, ...).
* The fixture ``impl`` is that module, loaded through the guard (``assignments/guard.py``): a
  submission that imports or calls numba-flash for the graded part is rejected with the reason.
  ``rng`` is a generator seeded from the test's id (fresh inputs per test, the same on every run; set
  ``NUMBA_FLASH_TEST_SEED`` to draw new ones).
* In the simulator, :func:`assignments.grading.install_simulator_patches` makes shared-array
  allocation thread-safe, counts atomics on counting arrays and counts barriers for the race detector.
* Markers: ``simulator_only`` tests (IO budgets counted element by element) are skipped on a GPU;
  ``gpu`` tests are skipped in the simulator.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import numba_flash

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # so that ``assignments.grading`` imports

from assignments import grading, guard  # noqa: E402


def pytest_addoption(parser):
    group = parser.getgroup("numba-flash autograder")
    group.addoption(
        "--impl",
        default=None,
        help="implementation to grade: 'stub' (default), 'solution', or a .py file / a folder of "
        f"<assignment>.py files (also: environment variable {grading.IMPL_ENV})",
    )


def pytest_configure(config):
    for line in (
        "gpu: needs a real CUDA GPU (skipped in the simulator)",
        "slow: long in the simulator",
        "simulator_only: counts memory accesses through the CUDA simulator (skipped on a GPU)",
    ):
        config.addinivalue_line("markers", line)
    sys.setswitchinterval(1e-3)  # the simulator's threads hand over the GIL more often: about 2x faster
    grading.install_simulator_patches()
    # the autograders' own helpers (yardsticks, references) are answers too: calling them is a violation
    for path in (HERE / "assignments").glob("*/test_autograder.py"):
        guard.GUARD.forbid_file(path)
    guard.GUARD.forbid_file(HERE / "conftest.py")


def _choice(config):
    return config.getoption("--impl", default=None) or os.environ.get(grading.IMPL_ENV) or "stub"


def pytest_report_header(config):
    return f"numba-flash autograder: grading '{_choice(config)}' on {numba_flash.describe()}"


def pytest_collection_modifyitems(config, items):
    on_gpu = not numba_flash.is_simulator()
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (running in Numba's CUDA simulator)"))
        if "simulator_only" in item.keywords and on_gpu:
            item.add_marker(pytest.mark.skip(reason="counts accesses through the CUDA simulator"))


@pytest.fixture(scope="module")
def impl(request):
    """The graded implementation of the assignment whose folder holds the requesting test module."""
    return grading.load_implementation(Path(request.module.__file__).parent, _choice(request.config))


@pytest.fixture
def rng(request) -> np.random.Generator:
    base = int(os.environ.get("NUMBA_FLASH_TEST_SEED", "0"))
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()) + base)
