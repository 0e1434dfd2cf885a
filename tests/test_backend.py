"""The backend is chosen once, in one place, and always reported."""

import os
import subprocess
import sys

import numba_flash
from numba_flash import _backend


def test_backend_is_chosen_before_numba_cuda_and_reported():
    from numba import config

    assert numba_flash.BACKEND in (_backend.SIMULATOR, _backend.GPU)
    assert bool(config.ENABLE_CUDASIM) == (numba_flash.BACKEND == _backend.SIMULATOR)
    text = numba_flash.describe()
    assert ("simulator" in text) == numba_flash.is_simulator()
    assert "numba-cuda" in text


def test_forcing_the_simulator_through_the_environment_works():
    env = dict(os.environ, NUMBA_FLASH_BACKEND="simulator")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    code = "import numba_flash; from numba import config; print(numba_flash.BACKEND, config.ENABLE_CUDASIM)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["simulator", "1"]


def test_a_bad_backend_name_is_refused_naming_the_variable():
    env = dict(os.environ, NUMBA_FLASH_BACKEND="tpu")
    out = subprocess.run([sys.executable, "-c", "import numba_flash"], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "NUMBA_FLASH_BACKEND" in out.stderr


def test_cli_help_lists_the_subcommands():
    out = subprocess.run([sys.executable, "-m", "numba_flash", "--help"], capture_output=True, text=True, check=True)
    for sub in ("demo", "io", "info"):
        assert sub in out.stdout
