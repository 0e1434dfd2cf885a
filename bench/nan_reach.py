"""Where a NaN in ``Q`` goes in the 3xTF32 backward (:mod:`numba_flash.tensorcore.fa2_backward_tf32`), build by build.

For one query row made NaN (``Q[0, row, 0, 5]``) it prints, per gradient, how many elements are NaN and in which rows,
with ``SPLIT_QDO`` off, on, and on with ``QDO_PAIRS``, on a sharp (scores of standard deviation 16) and a plain softmax,
and on a small ragged shape::

    python -m bench.nan_reach        # on the GPU if there is one; NUMBA_ENABLE_CUDASIM=1: the simulator

Until 2026-11-28 Q's NaN reached all of dV on the simulator and not on a GPU. The forward saves the row as one that
sees no key (``l = 0``, printed per case), so ``row_stats`` gives it ``1/l = 0``; the cap ``min(S' - M, 64)`` was the
builtin ``min``, ``fminf`` on a GPU, which drops the NaN, so the row's ``P`` was ``2^64 * 0 = 0``
(``docs/results/gpu_runs/nan_reach_h200_5cae1b0.txt``, last in the tree at e0e5a9b; the performance log's section on
``QDO_PAIRS`` at 8k / 16k). The cap now keeps the NaN on both backends (``fast._regtile.min_keep_nan``; in this backward
its PTX twin ``fast._mma.min_nan_asm``): with ``SPLIT_QDO`` ``P`` is NaN and so is all of dV, as in torch
(``gpu_runs/nan_reach_h200_51ae00a.txt``, last in the tree at e0e5a9b). Without it, on a GPU, the per-warp split of
``Q_i tau log2 e`` turned the row's NaN (the product's ``0x7fffffff``) into -0.0, so S was finite, ``P`` 0 again and dV
clean. That split is now ``fast._mma.make_split_keep_nan`` (its bits clamped below the carry first), and every build
should show dV all NaN.
"""

from __future__ import annotations

import argparse

from numba_flash.runtime import backend as _backend

import numpy as np

from tests.attn_testing import make_qkv, run_tf32_backward, sharp_problem


def forward_stats(q, k, v, row):
    """The 3xTF32 forward's saved (m, l, L) of query row ``row`` (head 0): what the backward's ``row_stats`` reads."""
    from numba_flash._launch import Allocator, check_attention_args
    from numba_flash.tensorcore import fa2_forward_tf32

    alloc = Allocator(q)
    fwd = fa2_forward_tf32.forward(
        *(alloc.to_kernel(x) for x in (q, k, v)), check_attention_args(q, k, v, 0.0, None, False, 0), alloc, (16, 16)
    )
    return tuple(float(alloc.result(x)[0, 0, row]) for x in (fwd.m, fwd.l, fwd.lse))


def show(tag, q, k, v, dout):
    for split, pairs in ((False, False), (True, False), (True, True)):
        feats = {"WIDE": True, "CP_ASYNC": True, "SPLIT_QDO": split, "QDO_PAIRS": pairs}
        grads, _ = run_tf32_backward(q, k, v, dout, False, 0.0, 7, (16, 16), feats, False)
        parts = []
        for name, x in zip(("dq", "dk", "dv"), grads):
            x = x.reshape(x.shape[0], x.shape[1], -1)
            rows = sorted(set(np.nonzero(np.isnan(x))[1].tolist()))
            finite = np.abs(x[np.isfinite(x)])
            parts.append(
                f"{name}: {int(np.isnan(x).sum())} NaN rows {rows[:30]} max|x| "
                f"{finite.max() if finite.size else float('nan'):.3g}"
            )
        print(f"{tag} split={split:d} pairs={pairs:d}: " + " | ".join(parts), flush=True)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print(_backend.describe(), flush=True)
    for row in (3, 2):
        for sharp in (16.0, 1.0):
            dout, q, k, v = sharp_problem(np.random.default_rng(0), 1, 24, 1, 32, sharp)
            q[0, row, 0, 5] = np.float32(np.nan)
            print("forward m, l, L of the row: %r, %r, %r" % forward_stats(q, k, v, row), flush=True)
            show(f"sharp={sharp} nan-row={row}", q, k, v, dout)
    rng = np.random.default_rng(0)
    q, k, v = make_qkv(rng, 1, 12, 13, 1, 1, 32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    q[0, 3, 0, 5] = np.float32(np.nan)
    show("make_qkv 12x13 nan-row=3", q, k, v, dout)


if __name__ == "__main__":
    main()
