"""The allocator's outputs (:class:`numba_flash._launch.Allocator`): what a kernel module gets to write into."""

from __future__ import annotations

from numba_flash import _launch

import numpy as np
import pytest
import torch


@pytest.mark.parametrize("like", ["numpy", "torch-cpu"])
def test_empty_rows_are_n_outputs_of_the_shape_from_one_allocation(like):
    """The FA2 forward's lse, m and l come from one allocation (one ``torch.empty`` on the host path, not three):
    distinct rows of the shape asked for, each contiguous, none overlapping another."""
    q = np.zeros((1, 2, 3, 4), np.float32)
    alloc = _launch.Allocator(q if like == "numpy" else torch.from_numpy(q))
    rows = alloc.empty_rows(3, (2, 3, 5))
    assert len(rows) == 3
    row_bytes = 2 * 3 * 5 * 4
    addresses = [_address(r) for r in rows]
    assert addresses == [addresses[0] + i * row_bytes for i in range(3)]  # consecutive rows of one buffer
    for r in rows:
        assert tuple(r.shape) == (2, 3, 5) and np.dtype(r.dtype) == np.float32 and tuple(r.strides) == (60, 20, 4)


def _address(a) -> int:
    iface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return iface["data"][0]

def test_poisoned_empty_rows_are_nan():
    with _launch.poison_outputs():
        rows = _launch.Allocator(np.zeros((1, 1, 1, 2), np.float32)).empty_rows(2, (1, 4))
    for r in rows:
        r = r.copy_to_host() if hasattr(r, "copy_to_host") else r
        assert np.isnan(r).all()
