"""Tutorial 01: the GPU memory hierarchy, and counting HBM traffic.

Paper: Dao et al., "FlashAttention" (FA1), section 2.1 (hardware), section 2.2 (standard attention,
Algorithm 0), section 3.2 (Theorem 2). Run it (seconds, no GPU needed)::

    python tutorials/01_memory_hierarchy.py

What you learn
--------------
1. Why attention is slow: not the FLOPs, the memory traffic. An operation whose arithmetic intensity
   (FLOPs per byte moved) is below the machine's balance is *memory-bound*: it waits for HBM.
2. How numba-flash counts HBM traffic: the NumPy references run on "HBM arrays"
   (:class:`numba_flash_reference.hbm.HBMArray`) that count every element loaded or stored, so the
   count follows the code, not a comment about it.
3. Theorem 2 in numbers: standard attention moves ``Theta(N d + N^2)`` elements, FlashAttention
   ``Theta(N^2 d^2 / M)`` for an SRAM of ``M`` elements, and the saving grows with ``M``.

Read alongside: ``reference/hbm.py``, ``reference/alg0_standard.py``, ``reference/io_model.py``.
Next: ``02_online_softmax.py``.
"""

# ------------------------------------------------------------------------------------------------
# 0. Setup. ``import numba_flash`` first: it picks the backend (a GPU if there is one, otherwise
#    Numba's CUDA simulator) before anything imports numba.cuda. This tutorial runs no kernel, but
#    on a GPU it prints the device's own memory sizes in section 1.
# ------------------------------------------------------------------------------------------------
import numba_flash
from numba_flash_reference import io_model
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg1_forward import flash_forward_alg1
from numba_flash_reference.common import block_sizes
from numba_flash_reference.hbm import HBMArray, HBMCounter

import numpy as np


def section(title):
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}")


def main():
    print(f"backend: {numba_flash.describe()}")

    # --------------------------------------------------------------------------------------------
    # 1. The hierarchy. FA1 section 2.1 quotes the A100: 40-80 GB of HBM at 1.5-2.0 TB/s, and
    #    192 KB of on-chip SRAM (shared memory + L1) on each of 108 streaming multiprocessors, at
    #    about 19 TB/s. SRAM is ~10x faster and ~100,000x smaller. A kernel loads inputs from HBM
    #    into registers and SRAM, computes, and writes results back to HBM.
    # --------------------------------------------------------------------------------------------
    section("1. The memory hierarchy")
    a100 = {"HBM bytes": 40e9, "HBM bandwidth (B/s)": 1.5e12, "SRAM per SM (bytes)": 192 * 1024, "SMs": 108}
    sram_total = a100["SRAM per SM (bytes)"] * a100["SMs"]
    print(
        f"A100 (FA1 sec. 2.1): HBM {a100['HBM bytes'] / 1e9:.0f} GB at {a100['HBM bandwidth (B/s)'] / 1e12:.1f} TB/s; "
        f"SRAM {sram_total / 2**20:.1f} MB in all ({a100['SRAM per SM (bytes)'] // 1024} KB x {a100['SMs']} SMs) at "
        "~19 TB/s"
    )
    print(f"HBM / SRAM capacity: {a100['HBM bytes'] / sram_total:,.0f}x")
    if not numba_flash.is_simulator():
        from numba import cuda

        dev = cuda.get_current_device()
        for attr in ("MULTIPROCESSOR_COUNT", "MAX_SHARED_MEMORY_PER_BLOCK", "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"):
            print(f"this GPU: {attr} = {getattr(dev, attr, 'n/a')}")
    else:
        print("(on a GPU this section also prints the device's SM count and shared memory sizes)")

    # --------------------------------------------------------------------------------------------
    # 2. Arithmetic intensity = FLOPs / bytes moved. The machine balance of an A100 is
    #    312 TFLOP/s (fp16 tensor cores) / 1.5 TB/s ~ 200 FLOPs per byte: an operation with fewer
    #    FLOPs per byte than that is limited by HBM bandwidth, not by arithmetic.
    #    For one head of attention in fp16 (2 bytes per element), N = 1024, d = 64:
    # --------------------------------------------------------------------------------------------
    section("2. Arithmetic intensity: which steps of attention are memory-bound")
    N, d, B = 1024, 64, 2
    balance = 312e12 / 1.5e12
    steps = [
        # (step, FLOPs, elements read + written)
        ("S = Q K^T   (Alg.0 L1)", 2 * N * N * d, 2 * N * d + N * N),
        ("P = softmax(S) (Alg.0 L2)", 5 * N * N, 2 * N * N),  # max, subtract, exp, sum, divide
        ("O = P V     (Alg.0 L3)", 2 * N * N * d, N * N + 2 * N * d),
    ]
    print(f"machine balance (A100 fp16): {balance:.0f} FLOPs/byte")
    for name, flops, elems in steps:
        intensity = flops / (elems * B)
        kind = "memory-bound" if intensity < balance else "compute-bound"
        print(
            f"  {name:<28} {flops / 1e6:8.1f} MFLOP  {elems * B / 1e6:6.2f} MB  {intensity:6.1f} FLOPs/byte  -> {kind}"
        )
    # Every step is below the balance: the N x N matrices S and P make each step move ~N^2 elements
    # for O(1) (softmax) or O(d) (matmuls) FLOPs each. Fusing the three steps removes S and P from HBM.
    assert all(f / (e * B) < balance for _, f, e in steps)

    # --------------------------------------------------------------------------------------------
    # 3. Counting HBM traffic. An HBMArray wraps a NumPy array: x[...] is a counted read of the
    #    elements it returns (a copy: what was read now lives "on chip"), x[...] = y a counted write.
    # --------------------------------------------------------------------------------------------
    section("3. Counting HBM accesses with HBMArray")
    counter = HBMCounter()
    gX = HBMArray(np.arange(12.0).reshape(3, 4), counter, "X")
    row = gX[1]  # reads 4 elements
    gX[2] = 2 * row  # writes 4 elements
    print(
        f"after one row read and one row write: reads={counter.reads}, writes={counter.writes}, by name "
        f"{counter.by_name}"
    )
    assert (counter.reads, counter.writes) == (4, 4)

    # The references take counter=...: standard attention (Algorithm 0) writes S and P to HBM and
    # reads them back. Counted on a small problem (batch 1, one head):
    rng = np.random.default_rng(0)
    N, d = 256, 32
    q, k, v = rng.standard_normal((3, 1, N, 1, d))
    counter = HBMCounter()
    standard_attention(q, k, v, counter=counter)
    counted = io_model.IOCount.from_counter(counter)
    print(f"\nAlgorithm 0, N={N}, d={d}: {counted.total:,} element accesses; by array: {counted.by_name}")
    closed = io_model.io_standard_forward(N, d)  # 4 N^2 + 4 N d, from the paper's three steps
    print(f"closed form 4N^2 + 4Nd = {4 * N * N + 4 * N * d:,}")
    assert counted == closed and closed.total == 4 * N * N + 4 * N * d

    # --------------------------------------------------------------------------------------------
    # 4. FlashAttention (Algorithm 1) never writes S or P. Its outer loop (over K/V tiles of Bc rows)
    #    reads each K_j, V_j once, but every one of the Tc = N/Bc outer steps re-reads and rewrites
    #    O, l, m for all rows: reads = 2Nd + Tc N (2d + 2), writes = Tc N (d + 2). With the paper's
    #    block size Bc = ceil(M / 4d) that is ~ 12 N^2 d^2 / M: Theorem 2.
    # --------------------------------------------------------------------------------------------
    section("4. Theorem 2: FlashAttention's traffic depends on the SRAM size M")
    print(
        f"{'M (elements)':>14} {'Br':>4} {'Bc':>5} {'Tc':>4} {'FA1 accesses':>14} {'standard':>12} {'standard/FA1':>13}"
    )
    ratios = []
    for M in (512, 2048, 8192):  # Theorem 2's range is d <= M <= N d
        counter = HBMCounter()
        flash_forward_alg1(q, k, v, M=M, counter=counter)  # counted on the real loops
        counted = io_model.IOCount.from_counter(counter)
        assert counted == io_model.io_alg1_forward(N, d, M=M)  # the closed form is exact, not just O()
        Br, Bc = block_sizes(d, M)  # Alg.1 L1: Bc = ceil(M / 4d), Br = min(Bc, d)
        ratios.append(closed.total / counted.total)
        print(
            f"{M:>14,} {Br:>4} {Bc:>5} {-(-N // Bc):>4} {counted.total:>14,} {closed.total:>12,} {ratios[-1]:>12.2f}x"
        )
    # The saving grows with M (roughly as M / 3d^2). With a small SRAM (M = d^2 / 2 here) FlashAttention
    # moves MORE than standard attention: the theorem's saving needs M >> d^2.
    assert ratios == sorted(ratios) and ratios[0] < 1 < ratios[-1]

    # --------------------------------------------------------------------------------------------
    # 5. The whole comparison (forward, backward, FA2, block-sparse), as `python -m numba_flash io`
    #    prints it, for the GPT-2 medium shape of FA1's Figure 2 (N = 1024, d = 64).
    # --------------------------------------------------------------------------------------------
    section("5. The IO model's table (python -m numba_flash io --N 1024)")
    print(io_model.format_table(N=1024, d=64))

    # Questions to try:
    #  * At N = 1024, d = 64, what M makes FA1's forward move 9x fewer elements than standard
    #    attention (the paper's "up to 9x fewer HBM accesses")? Use io_model.io_alg1_forward.
    #  * Why does FA2 want Br large while FA1 wants Bc large? (Compare the FA2* column.)


if __name__ == "__main__":
    main()
