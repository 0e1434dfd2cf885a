"""Autograder for assignment 10 (the performance lab's graded pieces). Test names are the claims.

Everything here runs on a laptop: the bandwidth probe's kernel in the simulator (correct, each
element read and written once), the FLOP and HBM models against numba-flash's IO model
(:mod:`numba_flash_reference.io_model`, the counts of FA1 Theorem 2 and FA2 Algorithm 1), the Nsight
Compute CSV parser on a sample file, and the roofline. The measurements themselves need a GPU: the
last test runs the lab script there (skipped in the simulator).

Run: ``python -m pytest tutorials/assignments/a10_perf_lab [--impl solution]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from numba_flash_reference import io_model

import numpy as np
import pytest

from .. import grading

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "data" / "ncu_sample.csv"

#: The sample file's totals, in bytes (decimal units: Kbyte = 1e3, Mbyte = 1e6).
SAMPLE_TOTALS = {
    "scores_kernel": (2_097_152, 16_780_000),
    "softmax_kernel": (16_780_000, 16_780_000),
    "pv_kernel": (17_830_000, 1_048_580),
    "fa2_forward_kernel": (9_450_000 + 9_437_184, 1_064_960 + 1_064_960),
}


@pytest.mark.parametrize("n", [5, 1000], ids=["shorter-than-a-block", "longer-than-the-grid"])
def test_copy_kernel_copies_any_length(impl, rng, n):
    src = rng.standard_normal(n).astype(np.float32)
    dst = grading.poisoned(n)
    impl.copy(src, dst)
    np.testing.assert_array_equal(dst, src, err_msg="dst must equal src exactly")


@pytest.mark.simulator_only
def test_copy_kernel_reads_and_writes_each_element_exactly_once(impl, rng):
    """A bandwidth probe that moves each byte once: 2 n 4 bytes per copy, the basis of the memory roof."""
    n = 777
    src = grading.CountingArray(rng.standard_normal(n).astype(np.float32), "src")
    dst = grading.CountingArray(grading.poisoned(n), "dst")
    impl.copy(src, dst)
    assert np.all(src.reads == 1) and src.writes.sum() == 0, f"{src.describe()}; expected exactly 1 read each"
    assert np.all(dst.writes == 1) and dst.reads.sum() == 0, f"{dst.describe()}; expected exactly 1 write each"
    np.testing.assert_array_equal(dst.data, src.data)


def test_attention_flops_counts_the_two_matmuls(impl):
    """FA2 section 4.1: 4 N^2 d per (batch, head) for QK^T and PV; half of it with the causal mask."""
    assert impl.attention_flops(1024, 64, 16) == 4 * 1024 * 1024 * 64 * 16
    assert impl.attention_flops(512, 128, 1, causal=True) == 2 * 512 * 512 * 128
    assert impl.attention_flops(7, 3) == 4 * 49 * 3


@pytest.mark.parametrize("N, d", [(1024, 64), (333, 17)])
def test_standard_attention_hbm_is_theorem_2s_count(impl, N, d):
    """FA1 Algorithm 0: Q, K, V read, S and P written and read back, O written (elements, per head)."""
    ref = io_model.io_standard_forward(N, d)
    assert tuple(impl.standard_attention_hbm(N, d)) == (ref.reads, ref.writes), (
        f"expected (reads, writes) = {(ref.reads, ref.writes)}"
    )


@pytest.mark.parametrize(
    "N, d, Br, Bc, causal",
    [(1024, 64, 64, 64, False), (1000, 64, 128, 64, False), (1000, 32, 64, 48, True), (77, 5, 16, 8, True)],
)
def test_fa2_forward_hbm_matches_the_io_model(impl, N, d, Br, Bc, causal):
    """FA2 Algorithm 1: Q once, K and V once per query tile (causal: the tiles on or below the diagonal), O and L
    once."""
    ref = io_model.io_fa2_forward(N, d, Br=Br, Bc=Bc, causal=causal)
    got = tuple(impl.fa2_forward_hbm(N, d, Br, Bc, causal=causal))
    assert got == (ref.reads, ref.writes), f"(reads, writes) = {got}, expected {(ref.reads, ref.writes)}"


def test_parse_ncu_csv_sums_the_launches_of_each_kernel_in_bytes(impl):
    """ncu's CSV: one row per (launch, metric), ==PROF== lines first, thousands separators, scaled units."""
    got = impl.parse_ncu_csv(SAMPLE.read_text())
    assert set(got) == set(SAMPLE_TOTALS), f"kernels {sorted(got)}, expected {sorted(SAMPLE_TOTALS)}"
    for name, (r, w) in SAMPLE_TOTALS.items():
        assert tuple(int(x) for x in got[name]) == (r, w), (
            f"{name}: (read, write) bytes = {got[name]}, expected {(r, w)}"
        )


def test_parse_ncu_csv_of_output_without_rows_is_empty(impl):
    assert impl.parse_ncu_csv("==PROF== Connected to process 1\n==PROF== Disconnected from process 1\n") == {}


def test_roofline_is_the_lower_of_the_two_roofs(impl):
    """Attainable = min(peak FLOP/s, intensity x peak bandwidth); left of the ridge point a kernel is memory-bound."""
    intensity, attainable, bound = impl.roofline(1e9, 1e9, 100e12, 2e12)  # 1 FLOP/byte
    assert (intensity, attainable, bound) == (1.0, 2e12, "memory")
    intensity, attainable, bound = impl.roofline(1e12, 1e9, 100e12, 2e12)  # 1000 FLOP/byte
    assert (intensity, attainable, bound) == (1000.0, 100e12, "compute")


def test_the_model_says_standard_attention_is_memory_bound_on_an_a100(impl):
    """FA1 section 2: at N = 1024, d = 64, fp16 (2 bytes), standard attention is left of the A100's ridge point."""
    N, d, bh = 1024, 64, 16
    reads, writes = impl.standard_attention_hbm(N, d)
    _, attainable, bound = impl.roofline(impl.attention_flops(N, d, bh), 2 * (reads + writes) * bh, 312e12, 1.555e12)
    assert bound == "memory" and attainable < 312e12


@pytest.mark.gpu
def test_lab_script_measures_on_a_gpu(impl, tmp_path):
    """On a GPU: the lab script times standard and FA2 attention, reads DRAM bytes with ncu (if installed) and writes
    its results."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        str(HERE / "lab.py"),
        "--impl",
        str(impl.module.__file__),
        "--N",
        "256",
        "512",
        "--bh",
        "4",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "results.json").is_file(), proc.stdout[-3000:]
