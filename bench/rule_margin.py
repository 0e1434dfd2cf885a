"""How close the FA2 backwards on a GPU come to the 3x gradient rule, over many draws of one test case's inputs.

Why it exists: in the GPU suite at 805a132 one case of
``tests/kernels/test_fa2_kernels.py::test_fa2_backward_gradients_within_3x_float32_error_on_gpu_shapes`` failed
(``fast``, b 2, s_q 1029, s_k 513, h 4, h_k 1, d 96, causal, dropout 0.17) and passed three times alone. That test
draws q, k, v from its seeded NumPy generator but dO from torch's global generator, whose state depends on what the
worker ran before: alone it sees one dO, in the suite another. This probe runs the test's computation (float64 and
float32 torch attention's gradients, then ours with atomic and deterministic dQ) for ``--draws`` seeds of q, k, v and
dO and prints, per draw, variant and gradient, the ratio ``max|ours - ref| / (3 * max|naive32 - ref| + floor)``: the
rule holds where it is at most 1. A failure of the rule shows as a ratio above 1, with where the largest error sits;
the spread of the ratios says whether a case sits near the bound (the test's outcome then depends on the draw) or far
below it. ``--draws-from`` skips to later draws (draw ``i`` is seeded ``--seed`` + i, 1000 + i by default).

Run on a GPU machine from the repository root::

    source bench/gpu/setup_env.sh
    python3 -m bench.rule_margin [--draws 40] [--variants fast tensorcore readable] [--case 2,777,1029,6,2,40,1,0]
"""

from __future__ import annotations

import argparse

import numpy as np

from tests.attn_testing import make_qkv, max_err, randn_like, torch_attention, ulp_floor

#: The case that failed at 805a132: b, s_q, s_k, h, h_k, d, causal, dropout p
CASE = (2, 1029, 513, 4, 1, 96, True, 0.17)


def margins(torch, variant: str, draws: int, case=CASE, first: int = 0, base_seed: int = 1000):
    """Per draw: ``(draw, deterministic, name, ratio)`` for dQ, dK, dV (see the module docstring)."""
    from numba_flash import flash_attn_func

    b, s_q, s_k, h, h_k, d, causal, p = case
    rows = []
    for draw in range(first, first + draws):
        rng = np.random.default_rng(base_seed + draw)
        tq, tk, tv = (torch.tensor(x, device="cuda") for x in make_qkv(rng, b, s_q, s_k, h, h_k, d))
        seed = int(rng.integers(0, 2**32))
        dout = randn_like(rng, tq)  # Dev: as the test draws it
        grads = {}
        torch.backends.cuda.matmul.allow_tf32 = False
        for dtype in (torch.float64, torch.float32):
            xs = [x.detach().to(dtype).requires_grad_(True) for x in (tq, tk, tv)]
            torch_attention(*xs, causal, p, seed, dtype).backward(dout.to(dtype))
            grads[dtype] = [x.grad.cpu().numpy() for x in xs]
        for deterministic in (False, True):
            xs = [x.detach().clone().requires_grad_(True) for x in (tq, tk, tv)]
            flash_attn_func(
                *xs, p, causal=causal, algorithm="flash2", variant=variant, seed=seed, deterministic=deterministic
            ).backward(dout)
            for name, x, ref, naive in zip(("dq", "dk", "dv"), xs, grads[torch.float64], grads[torch.float32]):
                got = x.grad.double().cpu().numpy()
                bound = 3 * max_err(naive, ref) + ulp_floor(ref)
                ratio = max_err(got, ref) / bound if np.all(np.isfinite(got)) else np.inf
                rows.append(
                    (draw, deterministic, name, ratio, _where(got, ref, naive, case, name) if ratio > 1 else "")
                )
    return rows


def _where(got, ref, naive, case, name) -> str:
    """Where ``got``'s largest error sits: (batch, row, head, column), how many keys that query row sees (dQ) or how
    many query rows see that key (dK, dV; per query head), the reference's value, our error and the naive one's
    there, and the naive one's largest error."""
    b, s_q, s_k, h, h_k, d, causal, p = case
    err = np.abs(got - ref)
    at = np.unravel_index(int(np.argmax(err)), err.shape)
    if name == "dq":
        seen = f"query row {at[1]} sees {max(0, min(s_k, at[1] + s_k - s_q + 1)) if causal else s_k} keys"
    else:
        seen = (
            f"key {at[1]} is seen by {s_q - max(0, at[1] - (s_k - s_q)) if causal else s_q} rows of each of {h // h_k} "
            "query heads"
        )
    return (
        f"at {tuple(int(i) for i in at)} ({seen}), ref {ref[at]:.3e}, ours off by "
        f"{err[at]:.3e}, naive off by {abs(naive[at] - ref[at]):.3e} there and by {max_err(naive, ref):.3e} at most"
    )


def _parse_case(text: str) -> tuple:
    *ints, causal, p = text.split(",")
    return (*(int(x) for x in ints), bool(int(causal)), float(p))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--draws-from", type=int, default=0)
    ap.add_argument(
        "--seed",
        type=int,
        default=1000,
        help="draw i is seeded SEED + i (a test's own draw: "
        "zlib.crc32 of its node id, as tests/conftest.py's rng fixture seeds it, with --draws 1)",
    )
    ap.add_argument(
        "--case",
        default=None,
        help="b,s_q,s_k,h,h_k,d,causal,p (default: the case that failed at 805a132, CASE); causal 0 or 1",
    )
    ap.add_argument("--variants", nargs="+", default=["fast", "tensorcore", "readable"])
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import torch

    from bench import common as bu

    print(bu.header_line(torch), flush=True)
    case = CASE if args.case is None else _parse_case(args.case)
    print(f"case b, s_q, s_k, h, h_k, d, causal, p = {case}; ratio = error / (3 x float32 naive error + floor)")
    worst = 0.0
    for variant in args.variants:
        rows = margins(torch, variant, args.draws, case, first=args.draws_from, base_seed=args.seed)
        for deterministic in (False, True):
            for name in ("dq", "dk", "dv"):
                sel = [row for row in rows if row[1] == deterministic and row[2] == name]
                r = np.array([row[3] for row in sel])
                above = [row for row in sel if row[3] > 1]
                worst = max(worst, float(r.max()))
                print(
                    f"{variant:10s} deterministic={deterministic!s:5s} {name}: ratio median {np.median(r):.3f} "
                    f"max {r.max():.3f} min {r.min():.3f} over {len(r)} draws; above 1 in draws "
                    f"{[row[0] for row in above]}",
                    flush=True,
                )
                for row in above:
                    print(f"    draw {row[0]}: {row[4]}")
    print(f"worst ratio {worst:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
