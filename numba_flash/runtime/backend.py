"""Backend selection: Numba's CUDA simulator (CPU) or a real GPU, decided in one place.

Numba reads ``NUMBA_ENABLE_CUDASIM`` once, when ``numba.cuda`` is first imported, and the choice
then holds for the whole process. So this module must run before anything imports ``numba.cuda``:
``numba_flash/__init__.py`` imports it first, and ``tests/conftest.py`` imports ``numba_flash``
before any test module.

The rule:

* ``NUMBA_FLASH_BACKEND=simulator`` or ``=gpu`` forces a backend; ``auto`` (the default) detects one.
* An explicit ``NUMBA_ENABLE_CUDASIM`` in the environment is respected as it is.
* Otherwise a GPU is assumed present when the CUDA driver library exists *and* an NVIDIA device node
  or ``nvidia-smi`` exists. The probe creates no CUDA context (it only looks at files), so it is
  cheap and cannot fail half-way.

In the simulator, :mod:`numba_flash.runtime.simulator` locks the simulator's static shared-array allocation
(a numba-cuda race) when ``numba.cuda`` is imported.

``describe()`` says what ran, for the demo's banner and pytest's header; :func:`device_facts` gives the current
GPU's compute capability and opt-in SRAM to the launch plans without a driver call per launch; :func:`bind_context`
makes a device's context current on a thread that launches without numba.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import sys
import threading
from typing import NamedTuple

SIMULATOR = "simulator"
GPU = "gpu"


def gpu_present() -> bool:
    """True when a CUDA driver and an NVIDIA device seem to exist (no CUDA context is created)."""
    has_driver = ctypes.util.find_library("cuda") is not None or os.path.exists(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    )
    has_device = os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None
    return has_driver and has_device


# [doc:backend-choose]
def _choose() -> str:
    forced = os.environ.get("NUMBA_FLASH_BACKEND", "auto").strip().lower()
    if forced not in ("auto", SIMULATOR, GPU):
        raise ValueError(f"NUMBA_FLASH_BACKEND must be 'auto', 'simulator' or 'gpu', got {forced!r}")
    if "numba.cuda" in sys.modules:
        # Too late to switch: report what numba already chose.
        from numba import config

        return SIMULATOR if config.ENABLE_CUDASIM else GPU
    if forced == SIMULATOR:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    elif forced == GPU:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    elif "NUMBA_ENABLE_CUDASIM" not in os.environ:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0" if gpu_present() else "1"
    return SIMULATOR if os.environ["NUMBA_ENABLE_CUDASIM"] not in ("", "0") else GPU


# [/doc:backend-choose]


BACKEND: str = _choose()
if BACKEND == SIMULATOR:
    # The simulator runs each CUDA thread as a Python thread; a short switch interval makes
    # barrier-heavy kernels about 2x faster (measured, see the numba notes in docs/).
    sys.setswitchinterval(1e-3)
    # numba-cuda 0.30's simulator can hand two threads of a block different arrays for one
    # cuda.shared.array declaration; lock that allocation as soon as the simulator is imported
    # (not here: importing numba.cuda costs ~1 s). See runtime/simulator.py and docs/notes.
    from . import simulator

    simulator.install_on_import()


def is_simulator() -> bool:
    return BACKEND == SIMULATOR


class DeviceFacts(NamedTuple):
    """What the launch plans ask of the GPU a kernel runs on."""

    compute_capability: tuple[int, int]
    #: the largest dynamic shared memory one block may opt in to, in bytes
    max_shared_optin: int


_uniform_facts: list = []  # [DeviceFacts or None] once read: the facts every visible GPU shares (None: they differ)


def device_facts() -> DeviceFacts:
    """The current GPU's :class:`DeviceFacts` (GPU backend only).

    ``cuda.get_current_device()`` finds numba's context for the thread's current device: 3-4 us of host time on an
    H200's host, and a call asked it two to four times (the tensor-core kernels' ``available()``, the plans' SRAM
    check and backward policy). The facts are read once for every visible GPU; where they all agree (one GPU, or one
    model), the answer needs no device lookup again. On a machine of mixed GPUs the current device is asked each time.
    """
    from numba import cuda

    if not _uniform_facts:
        facts = {_facts_of(gpu) for gpu in cuda.gpus}
        _uniform_facts.append(facts.pop() if len(facts) == 1 else None)
    return _uniform_facts[0] or _facts_of(cuda.get_current_device())


def _facts_of(dev) -> DeviceFacts:
    return DeviceFacts(tuple(dev.compute_capability), int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))


def describe() -> str:
    """One line saying which backend runs the kernels, with device and versions."""
    import numba
    import numpy

    try:
        from importlib.metadata import version

        ncuda = version("numba-cuda")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        ncuda = "?"
    versions = f"numba {numba.__version__}, numba-cuda {ncuda}, numpy {numpy.__version__}"
    # What variant="auto" runs here (numba_flash.registry.auto_order decides; tests/test_backend.py keeps this
    # sentence equal to it).
    if BACKEND == SIMULATOR:
        return (
            f"Numba CUDA simulator on the CPU (functional only; timings mean nothing; variant='auto' runs the "
            f"readable kernels, the fastest here) [{versions}]"
        )
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    cc = ".".join(map(str, dev.compute_capability))
    auto = (
        "FA2 on the tensor cores, FA1 on the FFMA kernels" if dev.compute_capability >= (8, 0) else "the FFMA kernels"
    )
    return f"GPU: {name} (compute capability {cc}; variant='auto' runs {auto}) [{versions}]"


_thread = threading.local()  # .device: the device whose context bind_context found current on this thread


def bind_context(device: int) -> bool:
    """Whether ``device``'s context is current on this thread, after numba made one current where none was.

    cuda.core's launch (:mod:`numba_flash.runtime.direct`) and a replay's ``cuLaunchKernel``
    (:mod:`numba_flash.runtime.replay`) use the calling thread's current context. numba makes its context current when
    it launches, torch when it switches devices; a thread that has done neither has none. torch's
    autograd worker is such a thread when every kernel of a backward was first launched (by numba) on another thread:
    ``bench.tf32_bwd_sweep``'s warm-up failed so with CUDA_ERROR_INVALID_CONTEXT (H100, 2026-11-27). numba's
    ``current_context()`` then makes GPU 0's primary context current (torch's, and numba's), or returns the one torch
    made current. Checked once per thread and device; False (the caller leaves the launch to numba) where the current
    context is another device's."""
    if getattr(_thread, "device", None) == device:
        return True
    from numba import cuda

    if cuda.current_context().device.id != device:
        return False
    _thread.device = device
    return True
