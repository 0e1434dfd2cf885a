"""The workload that ``bench/gpu/sanitize.sh`` runs under NVIDIA compute-sanitizer: every kernel, both passes.

Every registered kernel (:func:`numba_flash.registry.variants`: each algorithm, pass and variant)
runs forward and backward through :func:`numba_flash.attention_numpy` /
:func:`numba_flash.attention_backward_numpy` on small *ragged* problems: sequence lengths that are not
multiples of any tile, s_q != s_k both ways, GQA and MQA, causal (with rows that see no key when
s_q > s_k) and dropout, the kernels' own tiles and small explicit ones (so that a problem spans
several tiles with a ragged last one), FA2's backward both with atomics and ``deterministic=True``.
Each result is compared with the float64 NumPy reference, so a run that the sanitizer passes
also computed the right numbers. The script exits 1 if any result is wrong or any registered kernel
did not run.

    python -m bench.sanitize            # GPU shapes (small; memcheck slows kernels 10-100x)
    python -m bench.sanitize --check    # the same workload at tiny shapes, in the simulator too

``--check`` also NaN-poisons every output (an element a kernel forgets to write fails the
comparison); the GPU run does not, so that ``initcheck`` sees the outputs as the kernels leave them.
Run from the repository root (``bench`` is not installed with the package).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from numba_flash import attention_backward_numpy, attention_numpy, describe, registry
from numba_flash._launch import MAX_HEADDIM, poison_outputs
from numba_flash_reference.alg0_standard import standard_attention
from numba_flash_reference.alg3_backward import standard_backward

import numpy as np

# (name, batch, s_q, s_k, nheads, nheads_k, headdim, causal, dropout_p, block_sizes)
GPU_CASES = [
    ("gqa-causal-dropout-sq<sk", 1, 77, 133, 4, 2, 40, True, 0.1, None),
    ("mqa-causal-sq>sk-empty-rows", 2, 130, 65, 2, 1, 64, True, 0.0, None),
    ("small-tiles-ragged-dropout", 1, 45, 37, 2, 2, 24, False, 0.2, (16, 16)),
    ("max-headdim-one-query-row", 1, 1, 70, 2, 1, MAX_HEADDIM, True, 0.0, None),
]
CHECK_CASES = [
    ("gqa-causal-dropout-sq<sk", 1, 5, 11, 2, 1, 4, True, 0.2, (4, 4)),
    ("causal-sq>sk-empty-rows", 1, 9, 6, 1, 1, 3, True, 0.0, (4, 4)),
]
#: Error bound relative to max |reference| (float32 kernels on small problems err by ~1e-6).
RTOL = 1e-4


def _relative_error(got, ref) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - ref)) / max(1.0, float(np.max(np.abs(ref)))))


def pairs():
    """(algorithm, variant) pairs whose resolve_pair covers every registered kernel."""
    seen = []
    for k in registry.entries():
        if (k.algorithm, k.variant) not in seen:
            seen.append((k.algorithm, k.variant))
    return seen


def run(cases, poison: bool) -> int:
    rng = np.random.default_rng(0)
    ran, failures = set(), []
    for name, b, s_q, s_k, h, h_k, d, causal, p, bs in cases:
        q = rng.standard_normal((b, s_q, h, d)).astype(np.float32)
        k = rng.standard_normal((b, s_k, h_k, d)).astype(np.float32)
        v = rng.standard_normal((b, s_k, h_k, d)).astype(np.float32)
        dout = rng.standard_normal(q.shape).astype(np.float32)
        seed = int(rng.integers(0, 2**32))
        ref_out = standard_attention(q, k, v, causal=causal, dropout_p=p, seed=seed).O
        ref_grads = standard_backward(dout, q, k, v, causal=causal, dropout_p=p, seed=seed)
        for algorithm, variant in pairs():
            for deterministic in (False, True) if algorithm == "flash2" else (False,):
                t0 = time.perf_counter()
                with poison_outputs() if poison else contextlib.nullcontext():
                    out, stats = attention_numpy(
                        q,
                        k,
                        v,
                        p,
                        causal=causal,
                        algorithm=algorithm,
                        variant=variant,
                        block_sizes=bs,
                        seed=seed,
                        return_stats=True,
                    )
                    grads = attention_backward_numpy(dout, q, k, v, out, stats, deterministic=deterministic)
                ran |= {(algorithm, "forward", stats.forward.variant), (algorithm, "backward", stats.backward.variant)}
                errs = [_relative_error(out, ref_out)] + [_relative_error(g, r) for g, r in zip(grads, ref_grads)]
                ok = max(errs) <= RTOL
                label = (
                    f"{name:28s} {algorithm:8s} fwd {stats.forward.variant:10s} bwd {stats.backward.variant:8s}"
                    f"{' deterministic' if deterministic else '':14s}"
                )
                print(
                    f"{label} max rel err (out, dq, dk, dv) {max(errs):.1e} {time.perf_counter() - t0:6.1f} s "
                    f"{'ok' if ok else 'WRONG'}",
                    flush=True,
                )
                if not ok:
                    failures.append(label)
    missing = sorted(set(registry.entries()) - ran)
    print(f"{len(ran)} kernels ran; {len(failures)} wrong result(s); kernels that did not run: {missing or 'none'}")
    return 1 if failures or missing else 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.sanitize", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="tiny shapes and NaN-poisoned outputs (runs in the simulator)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    print(describe(), flush=True)
    return run(CHECK_CASES if args.check else GPU_CASES, poison=args.check)


if __name__ == "__main__":
    sys.exit(main())
