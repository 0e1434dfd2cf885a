"""The fast backwards' pre-pass (:mod:`numba_flash.fast._prepass`): ``D = rowsum(dO o O)`` a warp per row, dQ's zeros.

FA2 Algorithm 2 line 4 computes ``D_i = rowsum(dO_i o O_i)`` before the main loop; line 3 sets ``dQ = 0`` for the
atomic adds. The fast backwards (float32 FFMA, 3xTF32, fp16/bf16) compute D in one kernel whose lanes share a row,
which can also write dQ's zeros (measured slower than torch's fill beside it: the backwards leave it off).

Claims checked:

* ``D`` is within 2x the error of a float32 sum of the same products against their float64 sum, for float32 rows
  and for fp16 / bf16 words, on ragged shapes: rows not a multiple of a block's rows, rows shorter than the lanes,
  head dims that are not a multiple of the lanes (odd for float32), several heads and batches.
* With ``dq`` every element of the float32 dQ accumulator is zero afterwards (it was NaN-filled), and ``D`` has the
  same bits as without it; without ``dq`` the array passed is not touched.
* The same with a group of lanes taking several rows one after another (``rows_per_group``, ragged at the end).
* On a GPU (marker ``gpu``): the same at realistic shapes (32 lanes, 8 groups a block).
"""

from __future__ import annotations

from numba_flash._launch import Allocator, check_attention_args, poison_outputs
from numba_flash.fast import _prepass
from numba_flash.tensorcore import ptx

import numpy as np
import pytest
from attn_testing import assert_error_rule, half_inputs, make_qkv, to_host

torch = pytest.importorskip("torch")

#: (b, N, h, d): ragged rows (N % rows != 0), a row shorter than the lanes (d = 2 / 6), d % lanes != 0, d odd.
SIM_SHAPES = [(1, 7, 1, 6), (2, 13, 3, 40), (1, 5, 2, 2), (1, 9, 1, 33)]
GPU_SHAPES = [(2, 1000, 3, 128), (3, 517, 2, 64), (1, 77, 5, 40), (2, 301, 2, 6)]


def _inputs(rng, dtype, b, n, h, d, device):
    """O and dO as torch tensors of ``dtype`` (torch), ``(b, n, h, d)``."""
    o, do, _ = (
        half_inputs(rng, dtype, b, n, n, h, h, d, device=device)
        if dtype != torch.float32
        else [torch.from_numpy(x).to(device) for x in make_qkv(rng, b, n, n, h, h, d)]
    )
    return o, do


def _run(o, do, zero_dq, rpw):
    """The pre-pass on O, dO: ``(D, dq)`` on the host, dq (float32, NaN-filled before) as the kernel left it."""
    prob = check_attention_args(o, o, o, 0.0, None, False, 0)
    alloc = Allocator(o)
    half = o.dtype != torch.float32
    ko, kdo = (alloc.to_words(x) for x in (o, do)) if half else (alloc.to_kernel(x) for x in (o, do))
    with poison_outputs():
        dq = alloc.empty(tuple(o.shape))
        delta = _prepass.row_dot(
            ko,
            kdo,
            prob,
            alloc,
            dq=dq if zero_dq else None,
            kind=ptx.HALF_KINDS[prob.dtype] if half else None,
            rows_per_group=rpw,
        )
    return to_host(delta), to_host(dq)


def _check_rowsum(rng, dtype, b, n, h, d, device, rpw):
    o, do = _inputs(rng, dtype, b, n, h, d, device)
    got, dq = _run(o, do, True, rpw)
    # the float32 products are exact for half inputs, so the float32 and float64 sums differ only in the summing
    prod32 = (do.float() * o.float()).cpu().numpy().transpose(0, 2, 1, 3)  # (b, h, n, d) like D's (b, h, n)
    ref64 = prod32.astype(np.float64).sum(-1)
    naive32 = np.zeros(prod32.shape[:-1], np.float32)
    for x in range(d):  # a plain float32 loop over the row, as the readable pre-pass sums it
        naive32 += prod32[..., x]
    assert_error_rule(got, ref64, naive32, mult=2.0, what="D")
    assert np.all(dq == 0.0), "the pre-pass left dQ elements it should have zeroed"
    again, untouched = _run(o, do, False, rpw)
    assert np.array_equal(again.view(np.uint32), got.view(np.uint32)), "zeroing dQ changed D"
    assert np.isnan(untouched).all(), "without dq the pre-pass wrote into the array it was given"


@pytest.mark.parametrize("rpw", [1, 3], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("b", "n", "h", "d"), SIM_SHAPES)
def test_the_prepass_row_sums_are_within_the_rule_and_zero_dq(rng, dtype, b, n, h, d, rpw):
    if dtype != "float32" and d % 2:
        pytest.skip("half words need an even head dim")
    _check_rowsum(rng, getattr(torch, dtype), b, n, h, d, "cpu", rpw)


@pytest.mark.gpu
@pytest.mark.parametrize("rpw", [1, 4], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(("b", "n", "h", "d"), GPU_SHAPES)
def test_the_prepass_on_gpu_shapes(rng, dtype, b, n, h, d, rpw):
    _check_rowsum(rng, getattr(torch, dtype), b, n, h, d, "cuda", rpw)
