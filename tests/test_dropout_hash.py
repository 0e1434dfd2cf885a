"""The device's dropout hash reproduces the reference's keep-mask bit for bit."""

from numba_flash.device.dropout import dropout_keep
from numba_flash_reference.common import dropout_keep_mask, dropout_threshold

import numpy as np
import pytest
from numba import cuda


@cuda.jit
def _keep_kernel(out, seed, bh, row0, col0, threshold):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = 1 if dropout_keep(seed, bh, row0 + i, col0 + j, threshold) else 0


@pytest.mark.parametrize(
    "seed,bh,row0,col0,p",
    [(0, 0, 0, 0, 0.1), (12345, 7, 100, 3, 0.5), (2**32 - 1, 99, 4093, 8191, 0.17), (42, 3, 0, 0, 0.0)],
)
def test_device_dropout_mask_equals_reference_bit_for_bit(seed, bh, row0, col0, p):
    shape = (19, 23)
    out = np.full(shape, -1, dtype=np.int32)  # poisoned: an unwritten element cannot look like 0 or 1
    _keep_kernel[(3, 3), (8, 8)](out, seed, bh, row0, col0, dropout_threshold(p))
    ref = dropout_keep_mask(seed, bh, range(row0, row0 + shape[0]), range(col0, col0 + shape[1]), p)
    np.testing.assert_array_equal(out, ref.astype(np.int32))
