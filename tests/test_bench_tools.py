"""The benchmark tools in ``bench/`` import, answer ``--help`` and plan what they would run, without a GPU.

The sweeps and microbenchmarks only measure something on a GPU, so nothing else runs them between
GPU sessions: an API change in ``numba_flash`` (a renamed function, a removed keyword) would break
them silently. These tests run in the simulator (and on a GPU):

* every module of the ``bench`` package imports in-process, and ``python -m bench.<tool> --help``
  works in a fresh interpreter from the repository root (no ``sys.path`` edits anywhere);
* every sweep's ``--dry-run`` plans every variant it knows through today's kernel modules;
* every ``python -m bench...`` command written in the docs parses (and, for a sweep, dry-runs), and
  every results file ``bench/README.md`` cites exists;
* the plots read the committed results (and draw them where matplotlib is installed), and the JSONL
  record of a benchmark run round-trips through ``bench.plot_results.load``;
* ``tests/benchmarks/`` holds only the pytest-benchmark suites.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import bench

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__))
#: Helper modules of the GPU measurement tools (imported by them, not run on their own).
LIBRARIES = {"common", "ncu"}
TOOLS = [m for m in MODULES if not m.startswith("_") and m not in LIBRARIES]
SWEEPS = [
    "alg4_sweep",
    "fa2_bwd_sweep",
    "fa2_sweep",
    "half_sweep",
    "sweep_fa1_fast",
    "sweep_forward_tiles",
    "tf32_bwd_sweep",
]
#: Where commands and results files are written down for readers.
DOC_FILES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *ROOT.glob("bench/**/*.md"),
        *ROOT.glob("bench/*.py"),
        *ROOT.glob("docs/*.rst"),
        *ROOT.glob("tests/benchmarks/*.py"),
        *ROOT.glob("numba_flash/**/*.py"),
    }
)


def test_the_bench_package_has_the_tools():
    assert set(SWEEPS) <= set(TOOLS)
    assert {"mma_peak", "offline_resources", "plot_fa2", "plot_results", "common"} <= set(MODULES)
    assert "_utils" not in MODULES, "bench/common.py is the one helper module"


@pytest.mark.parametrize("name", MODULES)
def test_every_bench_module_imports(name):
    module = importlib.import_module(f"bench.{name}")
    if name in TOOLS:
        assert callable(module.main)
    if name in SWEEPS:
        assert callable(module.parser)


def test_every_tool_answers_help_as_a_module_from_the_repository_root():
    # One fresh interpreter per tool (started together: each spends seconds importing numba).
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", f"bench.{name}", "--help"],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name in TOOLS
    }
    failed = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or "usage:" not in out:
            failed[name] = (proc.returncode, err[-2000:])
    assert not failed, failed


def test_offline_resources_skips_with_status_0_when_the_toolchain_is_missing(tmp_path):
    env = dict(os.environ)
    env["NVDISASM"] = str(tmp_path / "no-nvdisasm")  # an explicit choice that does not exist: never a compile
    proc = subprocess.run(
        [sys.executable, "-m", "bench.offline_resources", "--kernel", "fa2_forward_tc", "--d", "64"],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "offline_resources: SKIPPED" in proc.stdout


def test_offline_resources_knows_the_tensor_core_forward_and_every_fast_kernel():
    from bench import offline_resources

    assert set(offline_resources.KERNELS) == set(offline_resources._signatures())
    assert {
        "alg1_forward_fast",
        "fa2_forward_fast",
        "fa2_forward_tc",
        "fa2_forward_half_f16",
        "fa2_forward_half_bf16",
        "alg4_backward_fast",
        "fa2_backward_fast",
        "fa2_backward_fast_dq",
        "fa2_backward_half_f16",
        "fa2_backward_half_bf16",
        "fa2_backward_half_dq_bf16",
        "fa2_backward_tf32",
        "fa2_backward_tf32_dq",
    } == set(offline_resources.KERNELS)


def test_no_sys_path_edits_in_bench_or_in_the_benchmark_suites():
    files = [*ROOT.glob("bench/**/*.py"), *ROOT.glob("tests/benchmarks/*.py")]
    edits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"sys\.path\.(insert|append)|sys\.path\s*[+=]", line)
    ]
    assert files and not edits


def test_tests_benchmarks_holds_only_the_pytest_benchmark_suites():
    names = sorted(p.name for p in (ROOT / "tests" / "benchmarks").iterdir() if p.name != "__pycache__")
    assert "conftest.py" in names
    assert all(n == "conftest.py" or re.fullmatch(r"test_bench_\w+\.py", n) for n in names), names
    assert not list((ROOT / "tests").glob("gpu/*")), "the GPU scripts live in bench/gpu/"


def _variant_names(module) -> set[str]:
    return {name for attr in ("VARIANTS_D64", "VARIANTS_D128") for name in getattr(module, attr, {})}


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_dry_run_plans_every_candidate(name, capsys):
    module = importlib.import_module(f"bench.{name}")
    args = {
        "alg4_sweep": ["--dims", "64,128"],
        "fa2_bwd_sweep": ["--headdims", "64", "128"],
        "fa2_sweep": ["--headdims", "64", "128", "--causal", "both"],
        "sweep_fa1_fast": ["--headdim", "64"],
        "sweep_forward_tiles": ["--headdim", "64", "128"],
        "half_sweep": ["--headdims", "64", "128"],
        "tf32_bwd_sweep": ["--headdims", "64", "128"],
    }[name]
    assert module.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    if name in ("fa2_sweep", "fa2_bwd_sweep"):
        listed = {line.split()[3] for line in out.splitlines()}
        assert listed == _variant_names(module)
        assert "causal=1" in out
    elif name == "sweep_fa1_fast":
        assert all(label in out for label, _ in module.CANDIDATES[64])
    elif name == "alg4_sweep":
        assert all(f"Br={br} Bc={bc} threads={nt}" in out for br, bc, nt in module.D64 + module.D128)
    elif name == "half_sweep":
        assert all(
            f"d={d} NW={nw} MW={mw} Br={16 * nw * mw} Bc={bc} prefetch={pf}:" in out
            for d in (64, 128)
            for nw, mw, bc, pf in module.TILINGS[d]
        )
        assert module.main(["--headdims", "64", "128", "--backward", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert all(
            f"backward d={d} NW={nw} MW={mw} Br={br} Bc={16 * nw * mw} prefetch={pf} red2={red2} cp_async={cp}:" in out
            for d in (64, 128)
            for nw, mw, br, pf, red2, cp in module.BWD_TILINGS[d]
        )
    elif name == "tf32_bwd_sweep":
        assert all(f"d={d} {t:14} threads" in out for d in (64, 128) for t in module.TILINGS[d] if t != "ffma")
    else:
        assert out.count("tiles=") + out.count("skipped") == len(module.CANDIDATES[64]) + len(module.CANDIDATES[128])


def test_a_sweep_refuses_a_variant_it_does_not_know():
    from bench import fa2_sweep

    with pytest.raises(SystemExit, match="unknown variant"):
        fa2_sweep.main(["--headdims", "64", "--variants", "no-such-variant", "--dry-run"])


def _bench_commands():
    """(file, module, arguments) of every ``python -m bench.<tool> ...`` written in the docs."""
    pattern = re.compile(r"python3? -m bench\.(\w+)([^`\n|\\\"]*)")
    for path in DOC_FILES:
        for m in pattern.finditer(path.read_text()):
            args = re.split(r"\s(?:>|&&|;|#)", m.group(2))[0]
            # usage notation: "[--causal]" is an option that may be given; check it given
            yield path.relative_to(ROOT).as_posix(), m.group(1), shlex.split(args.replace("[", " ").replace("]", " "))


#: The GPU measurement tools (Nsight Compute, Figure 2) have no --dry-run of this kind: their own
#: end-to-end checks are in tests/test_bench_measure.py.
MEASUREMENT_TOOLS = {"figure2", "ncu", "measure_io", "common"}
COMMANDS = sorted(set((f, mod, tuple(args)) for f, mod, args in _bench_commands() if mod not in MEASUREMENT_TOOLS))


def test_the_docs_write_down_bench_commands():
    assert len(COMMANDS) >= 20
    assert any(f == "bench/README.md" and mod == "fa2_bwd_sweep" for f, mod, _ in COMMANDS)


@pytest.mark.parametrize(
    ("path", "tool", "args"), COMMANDS, ids=[f"{f}:{m}:{' '.join(a)}"[:80] for f, m, a in COMMANDS]
)
def test_every_bench_command_in_the_docs_parses_and_a_sweep_dry_runs(path, tool, args, capsys):
    assert tool in TOOLS, f"{path} names bench.{tool}, which does not exist"
    module = importlib.import_module(f"bench.{tool}")
    if "--help" in args:
        return  # answered by test_every_tool_answers_help_as_a_module_from_the_repository_root
    if tool in SWEEPS:
        assert module.main([*args, "--dry-run"]) == 0, f"{path}: python -m bench.{tool} {' '.join(args)}"
    elif args:
        module.parser().parse_args(list(args))


def test_every_results_file_the_bench_readme_cites_exists():
    text = (ROOT / "bench" / "README.md").read_text()
    text = re.sub(r"git show \w+:docs/results/\S+", "", text)  # older versions: in git history, not the tree
    cited = set()
    for m in re.finditer(r"docs/results/[\w./{},-]+", text):
        braces = re.search(r"\{([^}]*)\}", m.group(0))
        options = braces.group(1).split(",") if braces else [""]
        for opt in options:
            cited.add(re.sub(r"\{[^}]*\}", opt, m.group(0)).rstrip(".,"))
    missing = sorted(p for p in cited if not p.endswith("/") and not (ROOT / p).exists())
    assert len(cited) >= 10 and not missing, missing


def test_the_gpu_scripts_the_docs_name_exist():
    named = set(
        itertools.chain.from_iterable(re.findall(r"bench/gpu/[\w.]+\.(?:sh|md)", p.read_text()) for p in DOC_FILES)
    )
    assert {
        "bench/gpu/run_all.sh",
        "bench/gpu/run_suite.sh",
        "bench/gpu/run_benchmarks.sh",
        "bench/gpu/setup_env.sh",
    } <= named
    assert all((ROOT / n).exists() for n in named), sorted(n for n in named if not (ROOT / n).exists())


def test_plot_results_loads_the_committed_benchmark_json():
    from bench import plot_results

    rows, machine = plot_results.load([ROOT / "docs/results/forward_h200.json"])
    assert {r["algorithm"] for r in rows} >= {"standard", "flash1", "torch_naive", "sdpa_mem_efficient"}
    assert all(r["tflops"] > 0 for r in rows if r["algorithm"] == "flash1")
    assert machine["numba_flash"]["device"] == "NVIDIA H200"


def test_a_jsonl_record_round_trips_through_plot_results(tmp_path, monkeypatch):
    from bench import common, plot_results

    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("NUMBA_FLASH_BENCH_JSONL", str(path))
    rows = [dict(algorithm="flash2", N=1024, d=64, tflops=1.5), dict(algorithm="flash2", N=2048, d=64, tflops=2.5)]
    for row in rows:
        common.record_jsonl(row)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "provenance" in lines[0] and len(lines) == 3
    got, machine = plot_results.load([path])
    assert got == rows
    assert machine["numba_flash"]["backend"] == common.provenance()["backend"]


@pytest.mark.parametrize(("tool", "results"), [("plot_results", "forward_h200.json"), ("plot_fa2", "fa2_h200.json")])
def test_the_plots_draw_the_committed_results(tool, results, tmp_path):
    pytest.importorskip("matplotlib")
    module = importlib.import_module(f"bench.{tool}")
    png = tmp_path / "out.png"
    module.main([str(ROOT / "docs" / "results" / results), "-o", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_provenance_names_the_command_that_ran():
    from bench import common

    assert common.command_line().startswith("python ")
    assert common.provenance()["command"]


def test_host_overhead_times_every_layer_and_puts_the_launch_path_back(capsys):
    pytest.importorskip("torch")
    from numba_flash import _run

    from bench import host_overhead

    real = _run.forward
    assert host_overhead.main(["--calls", "3", "--repeats", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.endswith("us/call")]
    assert len(lines) == 10, lines  # 3 dispatchers x grad on/off, then 2 dtypes x grad on/off through flash_attn_func
    assert all(float(line.split()[-2]) > 0 for line in lines)
    assert _run.forward is real


def test_ratios_divide_the_baseline_by_ours_cell_by_cell():
    from bench import ratios

    def row(alg, n, t, causal=False, **kw):
        return dict(algorithm=alg, N=n, d=64, causal=causal, time_ms=t, pass_="forward", dtype="bfloat16", **kw)

    rows = [
        row("flash2", 512, 2.0),
        row("sdpa_mem_efficient", 512, 1.0),
        row("flash2", 1024, 1.0),
        row("sdpa_mem_efficient", 1024, 3.0),
        row("flash2", 2048, 1.0),  # no baseline: left out
        row("flash2", 1024, 1.0, shape="fa1_figure2"),
        row("sdpa_mem_efficient", 1024, 9.0, shape="fa1_figure2"),
    ]
    got = ratios.cell_ratios(rows, "flash2", "sdpa_mem_efficient")
    assert got == {("bfloat16", "forward", 64, False): {512: 0.5, 1024: 3.0}}
    assert ratios.cell_ratios(rows, "flash2", "sdpa_mem_efficient", min_n=1024) == {
        ("bfloat16", "forward", 64, False): {1024: 3.0}
    }
    assert "1 of 2 cells below 1.0x sdpa_mem_efficient; range 0.50-3.00" in ratios.format_tables(
        got, "flash2", "sdpa_mem_efficient"
    )


def test_ratios_read_the_committed_grids(capsys):
    from bench import ratios

    assert ratios.main([str(ROOT / "docs" / "results" / "half_h100.json")]) == 0
    out = capsys.readouterr().out
    assert "## bfloat16 fwd+bwd: sdpa_mem_efficient time / flash2 time" in out and "cells below 1.0x" in out


def test_ncu_source_sums_samples_by_reason_opcode_and_region(tmp_path):
    """Nsight Compute's source page (a kernel line, the header, a row per SASS instruction): the samples by stall
    reason, by opcode (predicate and modifiers dropped) and by region (consecutive rows that executed equally often)."""
    import gzip

    from bench import ncu_source

    head = [
        "Address",
        "Source",
        ncu_source.SAMPLES,
        ncu_source.EXECUTED,
        "stall_wait",
        "stall_math",
        "stall_wait (Not Issued)",
    ]
    rows = [
        ("00", "HMMA.1688.F32.TF32 R4, R8, R12, R4", 6, 8, 4, 2, 99),
        ("10", "@P0 FADD R1, R2, R3", 2, 8, 2, 0, 99),
        ("20", "FADD R5, R1, R5", 1, 8, 0, 1, 99),
        ("30", "BRA 0x0", 1, 1, 1, 0, 99),
    ]
    text = "\n".join(
        ['"Kernel Name","k(float*)"', ",".join(f'"{h}"' for h in head)]
        + [",".join(f'"{v:,}"' if isinstance(v, int) else f'"{v}"' for v in r) for r in rows]
    )
    path = tmp_path / "src.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(text)
    got = ncu_source.summarize(ncu_source.read_rows(str(path)), min_share=0.2)
    assert got["samples"] == 10 and got["executed"] == 25
    assert got["reasons"] == [("wait", 0.7), ("math", 0.3)], "the (Not Issued) columns are not counted again"
    assert [(op, s, e) for op, s, e, _ in got["opcodes"]] == [
        ("HMMA", 0.6, 8 / 25),
        ("FADD", 0.3, 16 / 25),
        ("BRA", 0.1, 1 / 25),
    ]
    assert got["opcodes"][0][3] == [("wait", 4 / 6), ("math", 2 / 6)]
    assert [r[:4] for r in got["regions"]] == [(0, 2, 8, 0.9)], "rows 0-2 ran 8 times each; the BRA's 10 % is below 0.2"
    assert "HMMA" in ncu_source.report(got) and ncu_source.opcode("@!PT LDS RZ, [RZ]") == "LDS"


@pytest.mark.parametrize("path", ["tests/benchmarks/test_bench_fa2.py", "tests/benchmarks/test_bench_half.py"])
def test_a_grid_cells_implementations_run_back_to_back(path):
    """In the FA2 grids the implementation is the outermost parametrize decorator, the one pytest varies fastest: a
    cell's implementations (ours, SDPA's backends, torch's naive attention) are timed one after another, under the
    same machine state, rather than all of ours first (in the half grid at 805a132 the same causal kernel took 0.38 ms
    as float16 and 0.53 ms as bfloat16, the bfloat16 cells among the run's first), and a grid's rounds come from
    ``bench.common.grid_rounds``, the same for every implementation."""
    import ast

    tree = ast.parse((ROOT / path).read_text())
    grids = [
        f
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and f.name.startswith("test_bench")
        and any(
            isinstance(d, ast.Call)
            and getattr(d.func, "attr", "") == "parametrize"
            and len(d.args) > 1
            and ast.literal_eval(d.args[0]) == "seqlen"
            for d in f.decorator_list
        )
    ]
    assert len(grids) == 2
    for f in grids:
        first = f.decorator_list[0]
        assert ast.literal_eval(first.args[0]) == "impl", f"{f.name}: impl is not the outermost parametrize"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "time_or_skip_oom"]
    assert calls and all(isinstance(c.args[2], ast.Call) and c.args[2].func.attr == "grid_rounds" for c in calls)


def test_interleaved_rounds_take_a_variants_place_out_of_its_time(monkeypatch):
    """``bench.common.cuda_time_ms_interleaved`` against :func:`bench.common.cuda_time_ms` on a fake GPU that slows
    down with every call (as an H100's clocks fall under sustained load): two identical functions timed one after
    the other differ by their place, timed in rounds they do not; each round starts from another function."""
    import types

    from bench import common as bu

    clock, calls, order = [0.0], [0], []

    class Event:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    def work(name):
        def fn():
            calls[0] += 1
            order.append(name)
            clock[0] += 1.0 + 0.01 * calls[0]  # Dev: each call 1 % slower than the one before

        return fn

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None))
    monkeypatch.setitem(sys.modules, "torch", fake)
    first, second = (
        bu.cuda_time_ms(work("a"), warmup=2, repeats=20)[0],
        bu.cuda_time_ms(work("b"), warmup=2, repeats=20)[0],
    )
    assert second / first > 1.15, "one after the other, the second identical function looks 15 % slower"
    order.clear()
    t = bu.cuda_time_ms_interleaved({"a": work("a"), "b": work("b")}, warmup=2, repeats=20)
    assert abs(t["b"][0] / t["a"][0] - 1) < 0.01, "in rounds they are within 1 %"
    timed = order[4:]  # Dev: after 2 warm-up calls each
    assert len(timed) == 40 and timed[:4] == ["a", "b", "b", "a"], "round r starts from the r-th function"
    order.clear()
    before = calls[0]
    t = bu.cuda_time_ms_interleaved({"a": work("a"), "b": work("b")}, warmup=1, repeats=2, calls=3)
    assert order[2:] == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3, "calls=3: each timing spans 3 calls in a row"
    first_a = [1.0 + 0.01 * (before + 2 + i) for i in (1, 2, 3)]  # Dev: calls 3-5 after the 2 warm-ups
    assert t["a"][1] == pytest.approx(sum(first_a) / 3), (
        "a timing is its calls' time divided by them (the fastest: round 0)"
    )


def test_ncu_takes_features_for_the_tensor_core_forward_only():
    """``bench.ncu``'s spec may name ``features`` (``run_pending.sh ncu_split_kv`` profiles ``SPLIT_KV`` off and on):
    the 3xTF32 forward's kernel module then runs with them, as ``fa2_sweep`` runs its variants; any other case
    refuses."""
    from bench import ncu

    base = {
        "algorithm": "flash2",
        "variant": "tensorcore",
        "pass": "forward",
        "batch": 1,
        "nheads": 1,
        "N": 16,
        "d": 16,
        "causal": True,
        "features": {"HEAVY_FIRST": True},
    }
    for other in ({"pass": "backward"}, {"variant": "fast"}, {"algorithm": "flash1"}):
        with pytest.raises(ValueError, match="only the flash2 tensorcore forward takes them"):
            ncu.tc_forward_with_features({**base, **other})
    out, lse = ncu.tc_forward_with_features({**base, "block_sizes": [16, 16]})()
    assert tuple(out.shape) == (1, 16, 1, 16) and bool((out == out).all())


def test_ncu_sdpa_case_runs_sdpa_forward_and_refuses_a_backward():
    """A ``bench.ncu`` case of ``algorithm`` ``sdpa_mem_efficient`` (``run_pending.sh ncu_sdpa_short``) goes to
    ``sdpa_forward`` (torch SDPA's memory-efficient forward: GPU only), which refuses a backward case before it builds
    any input."""
    from bench import ncu

    spec = {"algorithm": ncu.SDPA, "pass": "backward", "batch": 1, "nheads": 1, "N": 16, "d": 16, "causal": True}
    with pytest.raises(ValueError, match="only the forward pass"):
        ncu.sdpa_forward(spec)
    with pytest.raises(ValueError, match="only the forward pass"):
        ncu.run_child(spec)  # Dev: not flash_attn_func's path, which takes no algorithm named so


def test_suite_account_names_the_collected_tests_no_log_reports(tmp_path, capsys):
    """pytest -v lines with and without pytest-xdist (ids with spaces, a trailing blank), a test rerun in a later log
    (its last report counts), a collected test that no log reports and one reported but not collected."""
    from bench import suite_account

    a = tmp_path / "a.log"
    a.write_text(
        "tests/x.py::t[a b] \n[gw3] [ 42%] PASSED tests/x.py::t[a b] \n[gw1] [ 50%] FAILED tests/x.py::u \n"
        "tests/y.py::v SKIPPED (why)                     [ 60%]\n"
    )
    b = tmp_path / "b.log"
    b.write_text("tests/x.py::u PASSED                            [100%]\ntests/z.py::w XFAIL  [ 99%]")
    got = suite_account.account(suite_account.outcomes(a.read_text().splitlines()))
    assert got["counts"] == {"PASSED": 1, "FAILED": 1, "SKIPPED": 1} and got["failed"] == ["tests/x.py::u"]
    coll = tmp_path / "c.txt"
    coll.write_text(
        "tests/x.py::t[a b]\ntests/x.py::u\ntests/y.py::v\ntests/q.py::never\n\n4 tests collected in 0.1s\n"
    )
    assert suite_account.main([str(a), str(b), "--collected", str(coll)]) == 1
    out = capsys.readouterr().out
    assert "reported: 4 tests in 2 logs: 2 passed, 1 skipped, 1 xfail" in out and "  failed:" not in out, (
        "the rerun wins"
    )
    assert "collected: 4; no outcome in any log: 1; reported but not collected: 1" in out
    assert "  unrun: tests/q.py::never\n" in out and "  not collected: tests/z.py::w\n" in out
    coll.write_text("tests/x.py::t[a b]\ntests/x.py::u\ntests/y.py::v\ntests/z.py::w\n")
    assert suite_account.main([str(a), str(b), "--collected", str(coll)]) == 0
