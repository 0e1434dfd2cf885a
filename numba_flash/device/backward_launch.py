"""The host side of an FA2 backward's launches, shared by the FFMA and both tensor-core backwards.

Each of :mod:`numba_flash.fast.fa2_backward`, :mod:`numba_flash.tensorcore.fa2_backward_tf32` and
:mod:`numba_flash.tensorcore.fa2_backward_half` plans its kernels (main kernel, and with ``deterministic`` the dQ
kernel), then runs the same four steps: line 4's pre-pass ``D = rowsum(dO o O)``, line 3's gradients in HBM, and the
launches of its kernels with the same arguments. What differs between them (the pre-pass on words or floats, the
gradients' dtype) is passed in.
"""

from __future__ import annotations

from ..runtime import smem as _smem
from .constants import LOG2E


def launch_fa2_backward(kernels, prepass, allocate_grads, dout, q, k, v, out, fwd, prob, alloc, deterministic: bool,
                        from_lse: bool):
    """Launch a planned FA2 backward and return its ``(dq, dk, dv)``.

    ``kernels = (main, grid, dq_kernel, dq_grid, (threads, dq_threads), (nbytes, dq_nbytes))``, as the tensor-core
    plans return them; ``prepass(out, dout, prob, alloc) -> D`` and ``allocate_grads(prob, alloc, deterministic) ->
    (dq, dk, dv)`` are the module's. ``from_lse``: the kernels take the logsumexp ``L`` as both ``m`` and ``l``.
    """
    main, grid, dqk, grid_dq, (nt, nt_dq), (nbytes, nbytes_dq) = kernels
    # Dev: D before dQ's zeros: the GPU runs the pre-pass while the host allocates and launches the rest
    delta = prepass(out, dout, prob, alloc)  # D = rowsum(dO o O), line 4
    dq, dk, dv = allocate_grads(prob, alloc, deterministic)
    tau = prob.softmax_scale
    opts = (tau, tau * LOG2E, prob.group, prob.causal_offset, prob.seed, prob.threshold, prob.dropout_scale)
    m, l = (fwd.lse, fwd.lse) if from_lse else (fwd.m, fwd.l)
    _smem.launch(main, grid, nt, nbytes, q, k, v, dout, m, l, delta, dq, dk, dv, *opts)
    if deterministic:
        _smem.launch(dqk, grid_dq, nt_dq, nbytes_dq, q, k, v, dout, m, l, delta, dq, *opts)
    return dq, dk, dv
