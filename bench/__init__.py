"""Benchmark tools of numba-flash: sweeps, plots, peak microbenchmarks, offline resource checks.

Run each tool as a module from the repository root (the root is then on ``sys.path``, so
``numba_flash`` and this package import without any path manipulation)::

    python -m bench.fa2_sweep --help
    python -m bench.offline_resources --kernel fa2_forward_tc

``bench/README.md`` says what each tool is and maps every measured row of the fast kernels'
"What it bought" tables to the command that reproduces it; ``bench/gpu/`` holds the shell scripts
for a GPU machine (environment, whole suite, committed benchmarks). The pytest-benchmark suites stay
in ``tests/benchmarks/`` and share :mod:`bench._utils` (timing, FLOP counts, provenance) with these
tools. This package is not installed with numba-flash: it is repository tooling.
"""
