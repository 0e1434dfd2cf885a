"""One way in: which kernel module runs a pass of an algorithm in a variant.

Every kernel of numba-flash is a module that implements one *pass* (``"forward"`` or ``"backward"``)
of one *algorithm* (``"standard"``, ``"flash1"``, ``"flash2"``) in one *variant*:

* ``"readable"``: the kernel that follows the paper line by line (``numba_flash/<name>.py``, tagged
  ``# Alg.1 L9: ...``), the one to read beside the paper and beside ``reference/<name>.py``;
* ``"fast"``: its register-blocked twin (``numba_flash/fast/<name>.py``), same algorithm and schedule;
* ``"tensorcore"``: FA2 on the tensor cores. One variant, several kernels: the registry *routes* it by
  the problem's dtype and head dim (:class:`Route`), float16/bfloat16 to the native half kernels
  (``mma.sync.m16n8k16``), float32 up to d = 128 to the 3xTF32 kernels (float32 accuracy), and above
  d = 128 to the FFMA kernels. No kernel module picks another kernel: every choice is in this file.

:data:`KERNELS` maps ``(algorithm, pass, variant)`` to the module, or to the routes of a routed variant,
with plain imports, so a reader (or a tool) can follow every call statically. Every module follows the
one contract of :class:`numba_flash._launch.KernelModule`. :func:`resolve` takes the checked problem
(:class:`numba_flash._launch.Problem`) and returns the one kernel that runs it. ``variant="auto"``
picks, per pass, the first variant of :func:`auto_order` that exists and is available here: on a GPU
of compute capability 8.0+ the tensor-core variant, on an older GPU the fast kernels, and in the
simulator the readable kernels (the ones a student reads, and there the fastest: the simulator's speed is
the host's). The fast and tensor-core twins run in the simulator when asked for by name.

>>> from numba_flash import registry
>>> registry.resolve("flash2", "forward", "readable").module.__name__
'numba_flash.fa2_forward'
>>> sorted({v for (a, p, v) in registry.KERNELS})
['fast', 'readable', 'tensorcore']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

from . import alg0_standard, alg1_forward, alg3_backward, alg4_backward, fa2_backward, fa2_forward
from .fast import alg1_forward as fast_alg1_forward
from .fast import alg4_backward as fast_alg4_backward
from .fast import fa2_backward as fast_fa2_backward
from .fast import fa2_forward as fast_fa2_forward
from .runtime import backend as _backend
from .tensorcore import fa2_backward_half, fa2_backward_tf32, fa2_forward_half, fa2_forward_tf32

ALGORITHMS = ("standard", "flash1", "flash2")
PASSES = ("forward", "backward")
VARIANTS = ("auto", "readable", "fast", "tensorcore")
#: The algorithm used when none is named.
DEFAULT_ALGORITHM = "flash2"


def _always(prob) -> bool:
    return True


@dataclass(frozen=True)
class Route:
    """One kernel of a routed variant: the module, the problems it runs (``runs(prob)``), and that rule in words."""

    module: ModuleType
    when: str
    runs: Callable = _always


# [doc:registry-table]
def tensorcore_routes(half: ModuleType, tf32: ModuleType, ffma: ModuleType) -> tuple[Route, ...]:
    """The ``tensorcore`` variant of a pass, the same rule forward and backward: the half kernel where it
    ``handles`` the problem, else the 3xTF32 one where it does, else the FFMA kernel."""
    return (
        Route(half, "float16 / bfloat16, even d <= 128 (m16n8k16)", half.handles),
        Route(tf32, "d <= 128 (3xTF32)", tf32.handles),
        Route(ffma, "d > 128 (FFMA)"),
    )


#: (algorithm, pass, variant) -> kernel module (or, for a variant of several kernels, its routes, tried
#: in order: the first whose rule holds runs), and the paper algorithm it implements.
KERNELS: dict[tuple[str, str, str], ModuleType | tuple[Route, ...]] = {
    ("standard", "forward", "readable"): alg0_standard,  # FA1 Algorithm 0
    ("standard", "backward", "readable"): alg3_backward,  # FA1 Algorithm 3
    ("flash1", "forward", "readable"): alg1_forward,  # FA1 Algorithms 1-2
    ("flash1", "forward", "fast"): fast_alg1_forward,
    ("flash1", "backward", "readable"): alg4_backward,  # FA1 Algorithm 4
    ("flash1", "backward", "fast"): fast_alg4_backward,
    ("flash2", "forward", "readable"): fa2_forward,  # FA2 Algorithm 1
    ("flash2", "forward", "fast"): fast_fa2_forward,
    ("flash2", "forward", "tensorcore"): tensorcore_routes(fa2_forward_half, fa2_forward_tf32, fast_fa2_forward),
    ("flash2", "backward", "readable"): fa2_backward,  # FA2 Algorithm 2
    ("flash2", "backward", "fast"): fast_fa2_backward,
    ("flash2", "backward", "tensorcore"): tensorcore_routes(fa2_backward_half, fa2_backward_tf32, fast_fa2_backward),
}
# [/doc:registry-table]

#: Paper algorithm of each (algorithm, pass).
PAPER = {
    ("standard", "forward"): "FA1 Algorithm 0",
    ("standard", "backward"): "FA1 Algorithm 3",
    ("flash1", "forward"): "FA1 Algorithms 1-2",
    ("flash1", "backward"): "FA1 Algorithm 4",
    ("flash2", "forward"): "FA2 Algorithm 1",
    ("flash2", "backward"): "FA2 Algorithm 2",
}

#: The preference of ``variant="auto"`` on a GPU, fastest first.
AUTO_ORDER = ("tensorcore", "fast", "readable")
#: ... and in the simulator: the kernels a student reads. The simulator runs every thread as a Python thread,
#: so speed there is the host's, not the GPU's: the readable kernels are the fastest there (4 s against the fast
#: twins' 34-45 s at the README's sizes, whose register tiles and lane exchanges cost Python calls), and a run
#: that steps through ``auto`` lands in the code beside the paper. The twins run there when asked for by name.
AUTO_ORDER_SIMULATOR = ("readable", "fast")


@dataclass(frozen=True)
class Kernel:
    """One registry entry: what runs, and where to read it."""

    algorithm: str
    pass_: str
    variant: str
    module: ModuleType
    #: for a routed variant, the rule under which this module runs (:attr:`Route.when`); "" otherwise
    when: str = ""

    @property
    def paper(self) -> str:
        return PAPER[(self.algorithm, self.pass_)]

    @property
    def path(self) -> str:
        """The module's file, relative to the repository root (e.g. ``numba_flash/fast/fa2_forward.py``)."""
        return self.module.__name__.replace(".", "/") + ".py"

    def available(self) -> bool:
        """Whether this kernel can run on the current backend and device."""
        return _module_available(self.module)

    @property
    def takes_words(self) -> bool:
        """Whether the module takes half inputs as words of two halves (its ``TAKES_WORDS``), not float32 arrays."""
        return bool(getattr(self.module, "TAKES_WORDS", False))


def _module_available(module: ModuleType) -> bool:
    check = getattr(module, "available", None)
    return True if check is None else bool(check())


def _variant_available(algorithm: str, pass_: str, variant: str) -> bool:
    """Whether a variant can run here: its module's ``available()``; for a routed variant, its first route's (the
    tensor-core variant needs ``mma.sync``, compute capability 8.0+, whichever of its kernels a problem gets)."""
    entry = KERNELS[(algorithm, pass_, variant)]
    return _module_available(entry[0].module if isinstance(entry, tuple) else entry)


def auto_order() -> tuple[str, ...]:
    """The variants ``"auto"`` tries here, in order: :data:`AUTO_ORDER` on a GPU, :data:`AUTO_ORDER_SIMULATOR` in
    the simulator."""
    return AUTO_ORDER_SIMULATOR if _backend.is_simulator() else AUTO_ORDER


def auto_variant(algorithm, pass_: str) -> str:
    """The variant ``"auto"`` runs for ``pass_`` of ``algorithm`` here: the first of :func:`auto_order` that exists
    and can run here (the tensor-core variant needs compute capability 8.0+)."""
    for v in auto_order():
        if (algorithm, pass_, v) in KERNELS and _variant_available(algorithm, pass_, v):
            return v
    raise ValueError(f"no {pass_} kernel of algorithm {algorithm!r} can run here")  # pragma: no cover


def route(algorithm: str, pass_: str, variant: str, prob) -> Kernel:
    """The kernel of an existing ``(algorithm, pass_, variant)`` that runs ``prob``: the module itself, or, for a
    routed variant, the first route whose rule holds for ``prob``."""
    entry = KERNELS[(algorithm, pass_, variant)]
    if not isinstance(entry, tuple):
        return Kernel(algorithm, pass_, variant, entry)
    if prob is None:
        raise TypeError(
            f"variant {variant!r} of the {pass_} of {algorithm!r} is routed by dtype and head dim: "
            "resolve it with the checked problem (prob=...)"
        )
    for r in entry:
        if r.runs(prob):
            return Kernel(algorithm, pass_, variant, r.module, r.when)
    raise ValueError(f"no kernel of variant {variant!r} runs this problem")  # pragma: no cover - the last route runs
    # all


def check_algorithm(algorithm) -> str:
    """``algorithm`` (default :data:`DEFAULT_ALGORITHM`) checked against :data:`ALGORITHMS`."""
    algorithm = DEFAULT_ALGORITHM if algorithm is None else algorithm
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return algorithm


def check_variant(variant) -> str:
    """``variant`` (default ``"auto"``) checked against :data:`VARIANTS`."""
    variant = "auto" if variant is None else variant
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return variant


def resolve(algorithm, pass_: str, variant="auto", prob=None) -> Kernel:
    """The kernel that runs ``pass_`` of ``algorithm`` for ``variant`` on this backend, for the checked problem
    ``prob`` (a :class:`numba_flash._launch.Problem`; needed for a routed variant, see :func:`route`).

    Raises ValueError, listing what exists, for a combination that does not exist (e.g.
    ``("standard", "forward", "tensorcore")``) or cannot run here (the tensor-core kernel on a GPU
    older than compute capability 8.0).
    """
    algorithm = check_algorithm(algorithm)
    variant = check_variant(variant)
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
    if variant == "auto":
        return route(algorithm, pass_, auto_variant(algorithm, pass_), prob)
    if (algorithm, pass_, variant) not in KERNELS:
        have = [v for (a, p, v) in KERNELS if a == algorithm and p == pass_]
        raise ValueError(
            f"variant {variant!r} does not exist for the {pass_} of algorithm {algorithm!r}; "
            f"it has {have} (and 'auto'). Every kernel (algorithm, pass, variant): {list(KERNELS)}"
        )
    if not _variant_available(algorithm, pass_, variant):
        raise ValueError(
            f"variant {variant!r} of the {pass_} of {algorithm!r} cannot run on this device "
            f"({_backend.describe()}); choose one of "
            f"{[v for (a, p, v) in KERNELS if a == algorithm and p == pass_ and v != variant]}"
        )
    return route(algorithm, pass_, variant, prob)


def pair_variants(algorithm, variant="auto") -> tuple[str, str]:
    """(forward, backward) variant names that :func:`resolve_pair` resolves, found without the device.

    A named variant must exist for at least one pass; a pass that lacks it gets ``"auto"``. ``"auto"``
    stays ``"auto"`` for both passes, training or not: on a GPU both resolve to the tensor-core pair, whose
    backward recomputes the forward's ``S`` with the forward's operations (float32: the 3xTF32 pair; until
    2026-11-25 float32 training ran the FFMA pair, see ``docs/backward.rst``, "Large logits"). Only the
    table is read, so this runs inside ``torch.compile``'s tracing (the device query of ``"auto"`` and
    of :meth:`Kernel.available` takes numba's driver lock, which Dynamo cannot trace); the custom ops
    of :mod:`numba_flash._torch_ops` resolve these names on the device at run time.
    """
    algorithm = check_algorithm(algorithm)
    variant = check_variant(variant)
    if variant == "auto":
        return "auto", "auto"
    has = {p: (algorithm, p, variant) in KERNELS for p in PASSES}
    if not any(has.values()):
        have = list(dict.fromkeys(v for (a, _p, v) in KERNELS if a == algorithm))
        raise ValueError(
            f"variant {variant!r} does not exist for algorithm {algorithm!r}; it has {have} "
            f"(and 'auto'). Every kernel (algorithm, pass, variant): {list(KERNELS)}"
        )
    return (variant if has["forward"] else "auto"), (variant if has["backward"] else "auto")


def resolve_pair(algorithm, variant="auto", prob=None) -> tuple[Kernel, Kernel]:
    """(forward, backward) kernels for ``variant`` (names as :func:`pair_variants` gives them).

    A named variant must exist for at least one pass; a pass that lacks it runs its ``"auto"`` kernel
    (e.g. ``variant="tensorcore"`` of ``"flash1"`` does not exist: the named variant must exist for one pass). Both
    kernels that ran are reported in the stats, so this is never silent.
    """
    fwd_variant, bwd_variant = pair_variants(algorithm, variant)
    return resolve(algorithm, "forward", fwd_variant, prob), resolve(algorithm, "backward", bwd_variant, prob)


class Entry(NamedTuple):
    """One key of :data:`KERNELS`: a pass of an algorithm in a variant (a routed variant is one entry)."""

    algorithm: str
    pass_: str
    variant: str


def entries(algorithm: str | None = None) -> list[Entry]:
    """Every ``(algorithm, pass, variant)`` of :data:`KERNELS` (of one algorithm, if given), in registry order."""
    return [Entry(*key) for key in KERNELS if algorithm is None or key[0] == algorithm]


def variants(algorithm: str | None = None) -> list[Kernel]:
    """Every registered kernel (of one algorithm, if given), in registry order: a routed variant gives one entry per
    route, with its rule in :attr:`Kernel.when`."""
    out = []
    for (a, p, v), entry in KERNELS.items():
        if algorithm is None or a == algorithm:
            routes = entry if isinstance(entry, tuple) else (Route(entry, ""),)
            out += [Kernel(a, p, v, r.module, r.when) for r in routes]
    return out
