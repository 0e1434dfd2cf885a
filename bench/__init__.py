"""GPU measurement tools of numba-flash: HBM traffic under Nsight Compute and FA1's Figure 2.

Run from the repository root (this folder is not installed with the package)::

    python -m numba_flash io --measure --out docs/results/io_measured.json   # DRAM bytes vs the IO model
    python -m bench.figure2 --out docs/results/figure2                     # FA1 Figure 2, JSON + PNGs
    python -m bench.figure2 --tiny --out /tmp/fig2                          # simulator smoke run, seconds

* :mod:`bench.common`: provenance, timing, the kernel calls each (algorithm, variant) makes, the tiles
  they use and the IO model's count for them.
* :mod:`bench.ncu`: running one measured call under ``ncu`` and summing the DRAM bytes of every
  kernel launched inside its NVTX range.
* :mod:`bench.measure_io`: the ``io --measure`` command.
* :mod:`bench.figure2`: the Figure 2 reproduction.
"""
