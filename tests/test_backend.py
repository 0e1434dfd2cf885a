"""The backend is chosen once, in one place, and always reported."""

import os
import subprocess
import sys

import numba_flash
from numba_flash.runtime import backend as _backend


def test_backend_is_chosen_before_numba_cuda_and_reported():
    from numba import config

    assert numba_flash.BACKEND in (_backend.SIMULATOR, _backend.GPU)
    assert bool(config.ENABLE_CUDASIM) == (numba_flash.BACKEND == _backend.SIMULATOR)
    text = numba_flash.describe()
    assert ("simulator" in text) == numba_flash.is_simulator()
    assert "numba-cuda" in text


def test_describe_says_what_auto_runs_here_as_the_registry_decides():
    from numba_flash import registry

    text = numba_flash.describe()
    picks = {(a, p): registry.auto_variant(a, p) for a in ("flash1", "flash2") for p in registry.PASSES}
    if numba_flash.is_simulator():
        assert set(picks.values()) == {"readable"} and "variant='auto' runs the readable kernels" in text
    elif set(picks.values()) == {"fast"}:
        assert "variant='auto' runs the FFMA kernels" in text
    else:
        assert picks[("flash2", "forward")] == picks[("flash2", "backward")] == "tensorcore"
        assert {picks[("flash1", p)] for p in registry.PASSES} == {"fast"}
        assert "variant='auto' runs FA2 on the tensor cores, FA1 on the FFMA kernels" in text


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


def _stand_in_gpus(monkeypatch, models):
    """``numba.cuda.gpus`` as devices of the given (compute capability, opt-in bytes); the current device the last
    one; counts the current-device lookups."""
    from types import SimpleNamespace

    from numba import cuda

    devs = [SimpleNamespace(compute_capability=cc, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=optin) for cc, optin in models]
    lookups = []
    monkeypatch.setattr(cuda, "gpus", devs, raising=False)
    monkeypatch.setattr(cuda, "get_current_device", lambda: lookups.append(1) or devs[-1])
    monkeypatch.setattr(_backend, "_uniform_facts", [])
    return lookups


def test_device_facts_of_identical_gpus_are_read_once_and_need_no_device_lookup(monkeypatch):
    lookups = _stand_in_gpus(monkeypatch, [((9, 0), 232448)] * 2)
    for _ in range(3):
        assert _backend.device_facts() == _backend.DeviceFacts((9, 0), 232448)
    assert lookups == []


def test_device_facts_of_mixed_gpus_come_from_the_current_device_each_time(monkeypatch):
    lookups = _stand_in_gpus(monkeypatch, [((9, 0), 232448), ((8, 6), 101376)])
    for _ in range(2):
        assert _backend.device_facts() == _backend.DeviceFacts((8, 6), 101376)
    assert len(lookups) == 2
