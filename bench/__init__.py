"""Benchmark and measurement tools of numba-flash (repository tooling, not installed with the package).

Run each tool as a module from the repository root (the root is then on ``sys.path``, so
``numba_flash`` and this package import without any path manipulation)::

    python -m bench.fa2_sweep --help
    python -m bench.offline_resources --kernel fa2_forward_tc
    python -m numba_flash io --measure --out docs/results/io_measured.json   # DRAM bytes vs the IO model
    python -m bench.figure2 --out docs/results/figure2                     # FA1 Figure 2, JSON + PNGs
    python -m bench.figure2 --tiny --out /tmp/fig2                          # simulator smoke run, seconds

``bench/README.md`` says what each tool is and maps every measured row of the fast kernels'
"What it bought" tables to the command that reproduces it; ``bench/gpu/`` holds the shell scripts
for a GPU machine (environment, whole suite, committed benchmarks). The pytest-benchmark suites stay
in ``tests/benchmarks/`` and share :mod:`bench.common` with these tools.

* :mod:`bench.common`: the one helper module: provenance, inputs, timing, FLOP counts, memory, the
  torch baselines, the kernel calls each (algorithm, variant) makes, the tiles they use and the IO
  model's count for them.
* :mod:`bench.ncu`: running one measured call under ``ncu`` and summing the DRAM bytes of every
  kernel launched inside its NVTX range.
* :mod:`bench.measure_io`: the ``io --measure`` command.
* :mod:`bench.figure2`: the Figure 2 reproduction.
"""
