"""How long a call will take in Numba's CUDA simulator, and the warning given before a slow one.

The simulator runs every CUDA thread of a block as a Python thread, one block after another, so a
launch costs about the same for each (Br x Bc) tile pair it visits: a fixed part (the threads and
their barriers; one ``syncthreads`` costs 4-12 ms) and a part that grows with the tile's work
``Br * Bc * d``. A pass over ``b * h`` heads visits ``b * h * ceil(s_q / Br) * ceil(s_k / Bc)`` tile
pairs, so

    seconds ~ b * h * Tr * Tc * (a + c * Br * Bc * d)

with (a, c) per kernel in :data:`SIM_SECONDS` and the tiles the kernel module itself chooses
(``choose_block_sizes``). The constants were fitted on three problems per kernel (b * h = 1-2,
N = 32-64, d = 8-32; numba-cuda 0.30.4, Python 3.11, a shared 2-core x86 machine, corrected by the
measured CPU-time / wall-time ratio) and reproduce those times within a factor of 2; causal calls
skip some tiles that the estimate counts (up to 2x too high). An estimate to say "this will take
minutes", not a benchmark. :func:`warn_if_slow` warns with
:class:`SimulatorSlowWarning` above :data:`WARN_SECONDS`.

This module imports neither numba nor torch, so ``numba_flash.SimulatorSlowWarning`` is cheap.
"""

from __future__ import annotations

import math
import warnings


class SimulatorSlowWarning(UserWarning):
    """A call is about to run for minutes in Numba's CUDA simulator (no GPU); the message says how long
    and how to shrink the problem. Silence it with
    ``warnings.filterwarnings("ignore", category=numba_flash.SimulatorSlowWarning)``."""


#: Above this estimate (seconds) a call warns before it launches.
WARN_SECONDS = 60.0

#: (algorithm, pass, variant) -> (a seconds per tile pair, c seconds per Br*Bc*d of a tile pair).
SIM_SECONDS = {
    ("standard", "forward", "readable"): (0.0, 31e-6),
    ("standard", "backward", "readable"): (0.007, 58e-6),
    ("flash1", "forward", "readable"): (0.0, 2.9e-6),
    ("flash1", "forward", "fast"): (0.014, 2.7e-6),
    ("flash1", "backward", "readable"): (0.076, 13e-6),
    ("flash1", "backward", "fast"): (0.95, 8.0e-6),
    ("flash2", "forward", "readable"): (0.011, 1.8e-6),
    ("flash2", "forward", "fast"): (0.32, 1.9e-6),
    ("flash2", "forward", "tensorcore"): (0.0, 94e-6),
    ("flash2", "backward", "readable"): (0.24, 4.5e-6),
    ("flash2", "backward", "fast"): (1.36, 7.6e-6),
}
#: For a kernel not in the table (a new variant): the slowest fast/readable constants above.
DEFAULT_SIM_SECONDS = (1.36, 58e-6)


def simulator_seconds(kernel, prob, block_sizes=None) -> float | None:
    """Estimated seconds of one pass of ``kernel`` (a :class:`numba_flash.registry.Kernel`) on ``prob``.

    None when the kernel module cannot tile ``prob`` with ``block_sizes`` (the launch will say why).
    """
    try:
        br, bc = kernel.module.choose_block_sizes(prob, block_sizes)
    except (ValueError, TypeError):
        return None
    tiles = prob.batch * prob.nheads * math.ceil(prob.seqlen_q / br) * math.ceil(prob.seqlen_k / bc)
    a, c = SIM_SECONDS.get((kernel.algorithm, kernel.pass_, kernel.variant), DEFAULT_SIM_SECONDS)
    return tiles * (a + c * br * bc * prob.headdim)


def warn_if_slow(kernel, prob, block_sizes=None, stacklevel: int = 3) -> float | None:
    """In the simulator, warn (:class:`SimulatorSlowWarning`) when ``kernel`` on ``prob`` will take
    more than :data:`WARN_SECONDS`; return the estimate (None on a GPU)."""
    from . import backend as _backend

    if not _backend.is_simulator():
        return None
    seconds = simulator_seconds(kernel, prob, block_sizes)
    if seconds is None or seconds <= WARN_SECONDS:
        return seconds
    warnings.warn(
        f"numba_flash: the {kernel.pass_} pass of {kernel.algorithm!r} (variant {kernel.variant!r}) runs in Numba's "
        f"CUDA simulator (no GPU here) and will take about {_fmt_seconds(seconds)} for batch*nheads = "
        f"{prob.batch * prob.nheads}, seqlen_q = {prob.seqlen_q}, seqlen_k = {prob.seqlen_k}, headdim = "
        f"{prob.headdim}. "
        f"The time grows with batch * nheads * seqlen_q * seqlen_k * headdim (halving both sequence lengths divides it "
        "by about 4): shrink the problem (sequence lengths of 16-64 and headdim 8-32 take seconds) or run on a CUDA "
        "GPU.",
        SimulatorSlowWarning,
        stacklevel=stacklevel,
    )
    return seconds


def _fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
