"""One way in: the registry maps (algorithm, pass, variant) to a kernel module, and that module runs.

Claims checked:

* ``variant="readable"`` runs the tagged kernel of every algorithm (the module of the same name as
  the reference, whose paper tags the traceability test checks), forward and backward, on this
  backend; every other registered variant runs its own module. A spy on each module's entry point
  proves which one ran, so a dispatch that silently falls back to another kernel fails.
* Every kernel module follows the one contract (:class:`numba_flash._launch.KernelModule`):
  ``choose_block_sizes``, ``sram_bytes``, ``compiled_kernels`` and ``forward`` / ``backward``.
* An impossible combination raises a ValueError that lists what exists, before any launch.
* ``numba_flash`` has no import cycles; readable modules never import a fast one, and imports run
  one way: api -> registry -> kernels -> plumbing.
"""

from __future__ import annotations

import ast
from pathlib import Path

from numba_flash import api, registry
from numba_flash._launch import BackwardKernelModule, ForwardKernelModule, check_attention_args
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np
import pytest
from attn_testing import assert_error_rule, make_qkv, naive_attention_backward_float32, naive_attention_float32

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = registry.variants()


def _id(k):
    return f"{k.algorithm}-{k.pass_}-{k.variant}"


def _spy(monkeypatch, calls):
    """Wrap every registered module's forward/backward (each module once: the tensor-core variant's FFMA route is the
    fast variant's module) so that a call records which module ran, by name."""
    for module, name in {(k.module, "forward" if k.pass_ == "forward" else "backward") for k in ENTRIES}:
        real = getattr(module, name)

        def spy(*args, _real=real, _who=module.__name__, **kwargs):
            calls.append(_who)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)


def _pairs():
    """(algorithm, variant) combinations the public API accepts: each variant that exists for a pass."""
    return sorted({(k.algorithm, k.variant) for k in ENTRIES})


@pytest.mark.parametrize(("algorithm", "variant"), _pairs(), ids=[f"{a}-{v}" for a, v in _pairs()])
def test_the_public_api_runs_exactly_the_registered_kernel_of_each_variant(rng, monkeypatch, algorithm, variant):
    q, k, v = make_qkv(rng, 1, 13, 11, 2, 1, 8)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    calls = []
    _spy(monkeypatch, calls)
    bs = (8, 8) if variant == "readable" else None
    out, stats = api.attention_numpy(
        q, k, v, causal=True, algorithm=algorithm, variant=variant, block_sizes=bs, return_stats=True
    )
    grads = api.attention_backward_numpy(dout, q, k, v, out, stats)
    assert calls == [stats.forward.module.__name__, stats.backward.module.__name__], (
        "the stats name the modules that ran"
    )
    # The named variant runs in every pass that has it (the other pass runs its "auto" kernel).
    for pass_, ran in (("forward", stats.forward), ("backward", stats.backward)):
        assert (ran.algorithm, ran.pass_) == (algorithm, pass_)
        if (algorithm, pass_, variant) in registry.KERNELS:
            assert ran.variant == variant, f"{pass_} ran {ran}, not the {variant!r} kernel"
        else:
            assert ran.variant == registry.auto_variant(algorithm, pass_)
        assert ran == registry.resolve(algorithm, pass_, ran.variant, stats.problem), (
            "the kernel the registry routes to"
        )
    # And what ran is right.
    ref = standard_attention(q, k, v, causal=True)
    assert_error_rule(out, ref.O, naive_attention_float32(q, k, v, causal=True), what=f"O {algorithm}/{variant}")
    gref = standard_backward(dout, q, k, v, causal=True)
    naive = naive_attention_backward_float32(dout, q, k, v, causal=True)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, gref, naive):
        assert_error_rule(g, r, n, mult=3, what=f"{name} {algorithm}/{variant}")


def test_variant_readable_runs_the_paper_tagged_module_of_every_algorithm():
    # The readable module of each pass is the file named like its NumPy reference, and it carries
    # the paper's tags (tests/test_traceability.py checks that they cover every work line).
    for algorithm in registry.ALGORITHMS:
        fwd, bwd = registry.resolve_pair(algorithm, "readable")
        for k in (fwd, bwd):
            assert k.variant == "readable" and k.module.__name__.count(".") == 1, k
            assert (ROOT / "reference" / Path(k.path).name).is_file(), k.path
            src = (ROOT / k.path).read_text()
            assert "# Alg." in src or "# FA2." in src, f"{k.path} has no paper tags"


def test_flash_attn_func_takes_variant_and_runs_that_kernel(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(x, requires_grad=True) for x in make_qkv(rng, 1, 10, 10, 1, 1, 8))
    calls = []
    _spy(monkeypatch, calls)
    api.flash_attn_func(
        q, k, v, causal=True, algorithm="flash1", variant="readable", block_sizes=(8, 8)
    ).sum().backward()
    assert calls == ["numba_flash.alg1_forward", "numba_flash.alg4_backward"]


@pytest.mark.parametrize(
    ("algorithm", "variant"), [("standard", "tensorcore"), ("standard", "fast"), ("flash1", "tensorcore")]
)
def test_an_impossible_combination_raises_and_lists_what_exists(rng, monkeypatch, algorithm, variant):
    q, k, v = make_qkv(rng, 1, 8, 8, 1, 1, 4)
    calls = []
    _spy(monkeypatch, calls)
    with pytest.raises(ValueError, match=rf"variant '{variant}' does not exist .* it has \[.*'readable'"):
        api.attention_numpy(q, k, v, algorithm=algorithm, variant=variant)
    assert calls == []  # nothing launched


def test_unknown_variant_and_algorithm_names_are_rejected():
    with pytest.raises(ValueError, match="variant must be one of"):
        registry.resolve("flash2", "forward", "turbo")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        registry.resolve("flash3", "forward")


def test_variants_reports_every_kernel_and_the_one_auto_picks_per_pass():
    rows = api.variants()
    assert {(r["algorithm"], r["pass"], r["variant"]) for r in rows} == set(registry.KERNELS)
    for algorithm in registry.ALGORITHMS:
        for pass_ in registry.PASSES:
            autos = [r for r in rows if r["algorithm"] == algorithm and r["pass"] == pass_ and r["auto"]]
            # one variant; a routed one (the tensor cores on a GPU) is a row per route, each with its rule
            assert len({r["variant"] for r in autos}) == 1 and all(r["available"] for r in autos), autos
            assert len({r["when"] for r in autos}) == len(autos), autos


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_every_kernel_module_follows_the_one_contract(rng, entry):
    proto = ForwardKernelModule if entry.pass_ == "forward" else BackwardKernelModule
    assert isinstance(entry.module, proto), f"{entry.module.__name__} lacks part of {proto.__name__}"
    q, k, v = make_qkv(rng, 1, 40, 40, 2, 2, 16)
    if entry.module.__name__.endswith("_half"):  # the half kernels' route: float16 / bfloat16 inputs
        q, k, v = (x.astype(np.float16) for x in (q, k, v))
    prob = check_attention_args(q, k, v, causal=True)
    assert registry.resolve(entry.algorithm, entry.pass_, entry.variant, prob).module is entry.module or entry.when
    Br, Bc = entry.module.choose_block_sizes(prob)
    assert Br >= 1 and Bc >= 1
    assert entry.module.sram_bytes(prob) > 0
    launches = entry.module.compiled_kernels(prob)
    assert launches and all(ln.threads >= 1 and ln.blocks >= 1 and ln.name for ln in launches)
    assert all(hasattr(ln.dispatcher, "py_func") or callable(ln.dispatcher) for ln in launches)


# ------------------------------------------------------------------------------------------------
# Imports run one way
# ------------------------------------------------------------------------------------------------
def _intra_package_imports(path: Path, package_root: Path) -> set[str]:
    """Modules of ``numba_flash`` that ``path`` imports, at any depth (function-local imports too)."""
    rel = path.relative_to(package_root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    pkg = parts if path.name == "__init__.py" else parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("numba_flash"):
                continue
            for alias in node.names:
                cand = f"{mod}.{alias.name}"
                out.add(
                    cand
                    if (package_root.parent / (cand.replace(".", "/") + ".py")).exists()
                    or (package_root.parent / cand.replace(".", "/")).is_dir()
                    else mod
                )
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("numba_flash")}
    me = ".".join(parts)
    return {m for m in out if m != me and m.startswith("numba_flash.") and not m.startswith("numba_flash_reference")}


def import_graph() -> dict[str, set[str]]:
    pkg = ROOT / "numba_flash"
    graph = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[name] = _intra_package_imports(path, pkg)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as a list of modules, or None. Package ``__init__`` edges to submodules are
    ignored (importing ``numba_flash.x`` runs ``numba_flash/__init__`` first, which is not a cycle)."""
    color, stack = {}, []

    def visit(n):
        color[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if m == "numba_flash" or m.count(".") == 1 and m.endswith(".fast") and n.startswith(m):
                continue
            if color.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in color and (c := visit(m)):
                return c
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(graph):
        if n not in color and (c := visit(n)):
            return c
    return None


def test_numba_flash_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_finds_a_planted_cycle():
    graph = {"numba_flash.a": {"numba_flash.b"}, "numba_flash.b": {"numba_flash.c"}, "numba_flash.c": {"numba_flash.a"}}
    assert find_cycle(graph) == ["numba_flash.a", "numba_flash.b", "numba_flash.c", "numba_flash.a"]


def test_imports_run_one_way_api_registry_kernels_plumbing():
    graph = import_graph()
    readable = {k.module.__name__ for k in ENTRIES if k.variant == "readable"}
    fast = {k.module.__name__ for k in ENTRIES if k.variant != "readable"}
    for mod in readable:
        assert not graph[mod] & fast, f"{mod} (readable) imports a fast kernel: {graph[mod] & fast}"
        assert not any(m.startswith("numba_flash.fast") for m in graph[mod]), mod
    for mod in readable | fast:
        assert "numba_flash.api" not in graph[mod] and "numba_flash.registry" not in graph[mod], mod
    assert "numba_flash.api" not in graph["numba_flash.registry"]


def test_auto_resolves_each_pass_on_the_device_training_or_not():
    """``"auto"`` names no kernel before the device is asked; a named variant is kept for the passes that have it."""
    assert registry.pair_variants("flash2", "auto") == ("auto", "auto")
    assert registry.pair_variants("flash2", "tensorcore") == ("tensorcore", "tensorcore")
    assert registry.pair_variants("flash1", "auto") == ("auto", "auto")
    assert registry.pair_variants("standard", "readable") == ("readable", "readable")


@pytest.mark.gpu
def test_auto_trains_fa2_with_the_tensor_core_pair_on_a_gpu():
    """The forward and the backward of ``"auto"`` are the twins whose backward recomputes the forward's S."""
    fwd, bwd = (registry.auto_variant("flash2", p) for p in registry.PASSES)
    want = (
        "tensorcore" if registry.KERNELS["flash2", "forward", "tensorcore"][0].module.available() else "fast"
    )  # mma.sync: 8.0+
    assert (fwd, bwd) == (want, want)


PLANNED = sorted(
    {e.module for e in ENTRIES if hasattr(e.module, "plan") and hasattr(e.module, "default_features")},
    key=lambda m: m.__name__,
)


@pytest.mark.parametrize("module", PLANNED, ids=lambda m: m.__name__)
def test_a_features_dict_with_an_unknown_switch_raises_and_names_it(rng, module):
    # Dev: MAXREG and Q_BATCH were the FFMA kernels' switches until no default route turned them on: gone, they are
    # unknown
    q, k, v = make_qkv(rng, 1, 24, 24, 1, 1, 16)
    if module.__name__.endswith("_half"):  # the half kernels' route: float16 / bfloat16 inputs
        q, k, v = (x.astype(np.float16) for x in (q, k, v))
    prob = check_attention_args(q, k, v, 0.0, None, False, 0)
    for name in ("NO_SUCH_SWITCH", "MAXREG", "Q_BATCH"):
        if name in module.default_features():
            continue
        with pytest.raises(ValueError, match=name):
            module.plan(prob, features={name: 1})
