"""One way in: which kernel module runs a pass of an algorithm in a variant.

Every kernel of numba-flash is a module that implements one *pass* (``"forward"`` or ``"backward"``)
of one *algorithm* (``"standard"``, ``"flash1"``, ``"flash2"``) in one *variant*:

* ``"readable"``: the kernel that follows the paper line by line (``numba_flash/<name>.py``, tagged
  ``# Alg.1 L9: ...``), the one to read beside the paper and beside ``reference/<name>.py``;
* ``"fast"``: its register-blocked twin (``numba_flash/fast/<name>.py``), same algorithm and schedule;
* ``"tensorcore"``: FA2 on the tensor cores: the forward in 3xTF32 ``mma.sync`` (float32 accuracy) or,
  for float16/bfloat16 inputs, ``m16n8k16``; the backward ``m16n8k16`` for half inputs, the FFMA
  kernel for float32 (:mod:`numba_flash.fast.fa2_backward_tc` says which ran).

:data:`KERNELS` maps ``(algorithm, pass, variant)`` to the module, with plain imports, so a reader
(or a tool) can follow every call statically. Every module follows the one contract of
:class:`numba_flash._launch.KernelModule`. ``variant="auto"`` picks, per pass, the first variant of
:data:`AUTO_ORDER` that exists and is available here: on a GPU of compute capability 8.0+ the
tensor-core forward, otherwise the fast kernels (the simulator runs the tensor-core kernel only when
asked: its warp-level emulation is slow).

>>> from numba_flash import registry
>>> registry.resolve("flash2", "forward", "readable").module.__name__
'numba_flash.fa2_forward'
>>> sorted({v for (a, p, v) in registry.KERNELS})
['fast', 'readable', 'tensorcore']
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from . import _backend, alg0_standard, alg1_forward, alg3_backward, alg4_backward, fa2_backward, fa2_forward
from .fast import alg1_forward as fast_alg1_forward
from .fast import alg4_backward as fast_alg4_backward
from .fast import fa2_backward as fast_fa2_backward
from .fast import fa2_backward_tc, fa2_forward_tc
from .fast import fa2_forward as fast_fa2_forward

ALGORITHMS = ("standard", "flash1", "flash2")
PASSES = ("forward", "backward")
VARIANTS = ("auto", "readable", "fast", "tensorcore")
#: The algorithm used when none is named.
DEFAULT_ALGORITHM = "flash2"

# [doc:registry-table]
#: (algorithm, pass, variant) -> kernel module, and the paper algorithm it implements.
KERNELS: dict[tuple[str, str, str], ModuleType] = {
    ("standard", "forward", "readable"): alg0_standard,  # FA1 Algorithm 0
    ("standard", "backward", "readable"): alg3_backward,  # FA1 Algorithm 3
    ("flash1", "forward", "readable"): alg1_forward,  # FA1 Algorithms 1-2
    ("flash1", "forward", "fast"): fast_alg1_forward,
    ("flash1", "backward", "readable"): alg4_backward,  # FA1 Algorithm 4
    ("flash1", "backward", "fast"): fast_alg4_backward,
    ("flash2", "forward", "readable"): fa2_forward,  # FA2 Algorithm 1
    ("flash2", "forward", "fast"): fast_fa2_forward,
    ("flash2", "forward", "tensorcore"): fa2_forward_tc,
    ("flash2", "backward", "readable"): fa2_backward,  # FA2 Algorithm 2
    ("flash2", "backward", "fast"): fast_fa2_backward,
    ("flash2", "backward", "tensorcore"): fa2_backward_tc,
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

#: The preference of ``variant="auto"``, fastest first.
AUTO_ORDER = ("tensorcore", "fast", "readable")


@dataclass(frozen=True)
class Kernel:
    """One registry entry: what runs, and where to read it."""

    algorithm: str
    pass_: str
    variant: str
    module: ModuleType

    @property
    def paper(self) -> str:
        return PAPER[(self.algorithm, self.pass_)]

    @property
    def path(self) -> str:
        """The module's file, relative to the repository root (e.g. ``numba_flash/fast/fa2_forward.py``)."""
        return self.module.__name__.replace(".", "/") + ".py"

    def available(self) -> bool:
        """Whether this kernel can run on the current backend and device."""
        check = getattr(self.module, "available", None)
        return True if check is None else bool(check())


def _auto_ok(entry: Kernel) -> bool:
    # The tensor-core kernel runs in the simulator only when asked for (its lane exchanges through
    # shared memory make it the slowest kernel there); everything else that is available is fine.
    if entry.variant == "tensorcore" and _backend.is_simulator():
        return False
    return entry.available()


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


def resolve(algorithm, pass_: str, variant="auto") -> Kernel:
    """The kernel that runs ``pass_`` of ``algorithm`` for ``variant`` on this backend.

    Raises ValueError, listing what exists, for a combination that does not exist (e.g.
    ``("standard", "forward", "tensorcore")``) or cannot run here (the tensor-core kernel on a GPU
    older than compute capability 8.0).
    """
    algorithm = check_algorithm(algorithm)
    variant = check_variant(variant)
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
    if variant == "auto":
        for v in AUTO_ORDER:
            module = KERNELS.get((algorithm, pass_, v))
            if module is not None and _auto_ok(entry := Kernel(algorithm, pass_, v, module)):
                return entry
        raise ValueError(f"no {pass_} kernel of algorithm {algorithm!r} can run here")  # pragma: no cover
    module = KERNELS.get((algorithm, pass_, variant))
    if module is None:
        have = [v for (a, p, v) in KERNELS if a == algorithm and p == pass_]
        raise ValueError(f"variant {variant!r} does not exist for the {pass_} of algorithm {algorithm!r}; "
                         f"it has {have} (and 'auto'). Every kernel (algorithm, pass, variant): {list(KERNELS)}")
    entry = Kernel(algorithm, pass_, variant, module)
    if not entry.available():
        raise ValueError(f"variant {variant!r} of the {pass_} of {algorithm!r} cannot run on this device "
                         f"({_backend.describe()}); choose one of "
                         f"{[v for (a, p, v) in KERNELS if a == algorithm and p == pass_ and v != variant]}")
    return entry


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
        raise ValueError(f"variant {variant!r} does not exist for algorithm {algorithm!r}; it has {have} "
                         f"(and 'auto'). Every kernel (algorithm, pass, variant): {list(KERNELS)}")
    return (variant if has["forward"] else "auto"), (variant if has["backward"] else "auto")


def resolve_pair(algorithm, variant="auto") -> tuple[Kernel, Kernel]:
    """(forward, backward) kernels for ``variant`` (names as :func:`pair_variants` gives them).

    A named variant must exist for at least one pass; a pass that lacks it runs its ``"auto"`` kernel
    (e.g. ``variant="tensorcore"`` of ``"flash1"`` does not exist: the named variant must exist for one pass). Both
    kernels that ran are reported in the stats, so this is never silent.
    """
    fwd_variant, bwd_variant = pair_variants(algorithm, variant)
    return resolve(algorithm, "forward", fwd_variant), resolve(algorithm, "backward", bwd_variant)


def variants(algorithm: str | None = None) -> list[Kernel]:
    """Every registered kernel (of one algorithm, if given), in registry order."""
    return [Kernel(a, p, v, m) for (a, p, v), m in KERNELS.items() if algorithm is None or a == algorithm]
