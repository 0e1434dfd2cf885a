"""The bug gallery: classic FlashAttention bugs, each planted in a copy of the package, and the test that catches it.

Every entry of :data:`GALLERY` is a small, documented mutation of a readable kernel: a file, the exact
original text, its replacement. :func:`plant` applies it to a *temporary copy* of ``numba_flash/`` and
``reference/`` (the working tree is never touched); :func:`run_bug` runs the entry's tests against the
copy in a fresh pytest process and reports which test failed and with what message. A mutation whose
original text is no longer in the source (someone edited the kernel) raises :class:`MutationError`:
it never silently passes.

From the command line::

    python -m numba_flash bugs                       # list the gallery
    python -m numba_flash bugs --show NAME           # the lesson and the diff of one bug
    python -m numba_flash bugs --run NAME            # plant it, run its tests, show what fails
    python -m numba_flash bugs --run-all             # every simulator bug (2 at a time) + a control run
    python -m numba_flash bugs --run-all --gpu       # the GPU-only bugs, on a GPU

The test suite runs the same check (``tests/test_bug_gallery.py``): every simulator entry must make its
tests fail, and the unmutated copy must pass the same tests (else a broken harness would look like a
caught bug). GPU-only entries (a race between thread blocks, which the simulator never shows because it
runs one block at a time) are ``gpu``-marked there and run with the GPU suite.

It lives in ``tools/``, not in the package, because it needs a source checkout: the tests it runs live in
``tests/``, which the wheel does not ship. ``python -m numba_flash bugs`` finds it next to the package it
imported (an editable install or a clone on ``PYTHONPATH``) and says in one line that it needs a checkout
otherwise.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

#: The installed name of each top-level folder of the repository that the copy needs.
PACKAGES = {"numba_flash": "numba_flash", "reference": "numba_flash_reference"}


class MutationError(RuntimeError):
    """A gallery entry no longer applies: its original text is not (exactly once) in the source."""


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once in the file) by ``new``."""

    old: str
    new: str


@dataclass(frozen=True)
class Bug:
    """One classic bug: where it goes, what it breaks, and which test catches it.

    ``tests`` are pytest node ids relative to the repository root, the first the most direct; run with
    ``-x``, the first failure is the one reported. ``gpu_only`` entries are run on a GPU (their tests are
    ``gpu``-marked); the others in the simulator.
    """

    name: str
    title: str
    file: str
    paper: str
    edits: tuple[Edit, ...]
    lesson: str
    tests: tuple[str, ...]
    caught_by: str
    gpu_only: bool = False
    kind: str = field(default="")

    @property
    def backend(self) -> str:
        return "gpu" if self.gpu_only else "simulator"


E = Edit
FWD = "tests/kernels/test_fa2_kernels.py::test_fa2_forward_equals_standard_attention"
BWD = "tests/kernels/test_fa2_kernels.py::test_fa2_backward_gradients_within_3x_float32_error"
EDGE = "tests/test_edge_values.py"
BARRIERS = "tests/kernels/test_barriers.py::test_kernel_result_holds_when_threads_run_one_at_a_time_between_barriers"
FA1_FWD = (
    "tests/kernels/test_forward_kernels.py::"
    "test_flash1_fast_and_readable_kernels_match_float64_reference_within_twice_float32_error"
)
FA1_BWD = "tests/kernels/test_backward_kernels.py::test_fast_and_readable_recomputation_backward_follow_the_error_rule"
STD_BWD = "tests/kernels/test_backward_kernels.py::test_backward_kernel_gradients_equal_float64_reference"
BSP = "tests/kernels/test_block_sparse_kernels.py"

# [doc:bug-gallery]
#: The gallery, forward bugs first, then backward ones; each entry's tests are the few that catch it.
GALLERY: tuple[Bug, ...] = (
    Bug(
        name="running-max-starts-at-zero",
        title="Running max initialised to 0 instead of -inf",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L5",
        edits=(E("m_i = float32(-math.inf)", "m_i = float32(0.0)"),),
        lesson="m_i^(0) must be -inf: the max of no scores. Starting at 0 claims a score of 0 was already "
        "seen, so while every score of a row is negative the row is normalised against 0 instead of its "
        "own max. Random inputs almost always have a positive score in every row, which hides it; with "
        "every score near -200, exp(S - 0) underflows to 0 in float32 and the whole row of O is 0.",
        tests=(f"{EDGE}::test_forward_with_every_score_near_minus_200_follows_the_error_rule[flash2-readable]",),
        caught_by="scores all near -200: l_i underflows to 0 and O = 0 instead of the softmax average of V",
    ),
    Bug(
        name="exp-without-max",
        title="exp(S) without subtracting the running max",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L9",
        edits=(
            E("alpha = math.exp(m_i - m_safe)", "alpha = float32(1.0)"),
            E("p = math.exp(sS_ij[t, c] - m_safe)", "p = math.exp(sS_ij[t, c])"),
        ),
        lesson="softmax(x) = exp(x - m) / sum exp(x - m) for any m; the max is subtracted so that every "
        "exponent is <= 0. Without it the algebra is still right, but float32 exp overflows to inf above "
        "88 and underflows to 0 below -103: large scores give inf / inf = NaN, very negative ones 0 / 0.",
        tests=(f"{EDGE}::test_forward_with_every_score_near_minus_200_follows_the_error_rule[flash2-readable]",),
        caught_by="scores near -200: every exp underflows, l_i = 0, O = 0",
    ),
    Bug(
        name="no-rescale-of-O",
        title="O not rescaled when the running max grows",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L10",
        edits=(E("acc = alpha * rO_i[x]", "acc = rO_i[x]"),),
        lesson="O_i^(j) = diag(e^(m_old - m_new)) O_i^(j-1) + P~ V_j: the accumulated rows were weighted by "
        "exp(S - m_old), and after a new max they must be brought to exp(S - m_new). Forgetting the factor "
        "overweights the earlier key blocks of every row whose max grew.",
        tests=(f"{FWD}[readable-ragged-N20-d8]",),
        caught_by="3 key blocks of random scores: rows whose max grows after block 1 get the wrong average",
    ),
    Bug(
        name="no-rescale-of-l",
        title="l not rescaled when the running max grows",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L9",
        edits=(E("l_i = alpha * l_i + rowsum", "l_i = l_i + rowsum"),),
        lesson="l_i is a sum of exp(S - m) and must follow m exactly like O does: l_new = e^(m_old - m_new) "
        "l_old + rowsum P~. Without the factor the final division uses a too large l: rows come out "
        "scaled down by a row-dependent factor.",
        tests=(f"{FWD}[readable-ragged-N20-d8]",),
        caught_by="random scores over 3 key blocks: O too small on the rows whose max grew",
    ),
    Bug(
        name="l-from-dropped-P",
        title="l summed from the dropped P~ instead of the undropped one",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L9 (FA1 Alg.2 L13)",
        edits=(
            E(
                "rowsum += p  # l from the undropped P~ (as FA1 Alg.2 L13)\n"
                "                if DROPOUT:\n"
                "                    # Dev: dropout as in FA1 Alg.2 L14, Z regenerated from the counter hash\n"
                "                    p = p * dropout_scale if keep(k_row, col0 + c, threshold) else float32(0.0)\n",
                "if DROPOUT:\n"
                "                    # Dev: dropout as in FA1 Alg.2 L14, Z regenerated from the counter hash\n"
                "                    p = p * dropout_scale if keep(k_row, col0 + c, threshold) else float32(0.0)\n"
                "                rowsum += p\n",
            ),
        ),
        lesson="Dropout acts on the probabilities, after the softmax: O = (softmax(S) o Z) V. The normaliser l "
        "is the softmax's, a sum of the undropped exp(S - m) (FA1 Algorithm 2 line 13). Summing the "
        "dropped and rescaled P~ makes l random: right on average, wrong on every row.",
        tests=(f"{FWD}[readable-odd-d5-dropout-b2]",),
        caught_by="dropout p = 0.1 against the float64 reference with the same mask: every row's scale is off",
    ),
    Bug(
        name="dropout-not-rescaled",
        title="Dropout without the 1 / (1 - p) rescale",
        file="numba_flash/fa2_forward.py",
        paper="FA1 Alg.2 L14",
        edits=(
            E(
                "p = p * dropout_scale if keep(k_row, col0 + c, threshold) else float32(0.0)",
                "p = p if keep(k_row, col0 + c, threshold) else float32(0.0)",
            ),
        ),
        lesson="Inverted dropout keeps an entry with probability 1 - p and scales it by 1 / (1 - p), so that "
        "the expected output equals the output without dropout. Without the scale O shrinks by 1 - p.",
        tests=(f"{FWD}[readable-odd-d5-dropout-b2]",),
        caught_by="dropout p = 0.1: O is about 10% too small",
    ),
    Bug(
        name="O-not-divided-by-l",
        title="O not divided by l at the end",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L12",
        edits=(
            E(
                "inv_l = float32(1.0) / l_i if l_i > 0 else float32(0.0)",
                "inv_l = float32(1.0) if l_i > 0 else float32(0.0)",
            ),
        ),
        lesson="FA2 keeps O un-normalised for the whole inner loop and divides by l_i once, at the end "
        "(line 12). Skipping it returns sum_j exp(S_ij - m_i) v_j, a weighted sum whose weights do not sum to 1.",
        tests=(f"{FWD}[readable-ragged-N20-d8]",),
        caught_by="any input: O is l_i times too large",
    ),
    Bug(
        name="lse-stored-as-m",
        title="logsumexp stored as the row max m",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L13",
        edits=(E("L_i = m_i + math.log(l_i) if l_i > 0", "L_i = m_i if l_i > 0"),),
        lesson="The backward pass recomputes P = exp(S - L) from L = m + log l alone (FA2.2 L11). Storing m "
        "gives P = exp(S - m): rows that do not sum to 1, and every gradient wrong. The forward output "
        "itself is right, so only a test of L (or of the backward) sees it.",
        tests=(f"{FWD}[readable-ragged-N20-d8]",),
        caught_by="the forward test checks L against the float64 logsumexp, +inf exactly on empty rows",
    ),
    Bug(
        name="ragged-tail-not-masked",
        title="Ragged last key block not masked",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L8",
        edits=(
            E(
                "if masked and (col >= s_k or (CAUSAL and col > row + causal_offset)):",
                "if masked and (CAUSAL and col > row + causal_offset):",
            ),
        ),
        lesson="When N is not a multiple of Bc, the last K_j block has rows past the end of K. They are "
        "loaded as zeros, so their scores are 0, not -inf: exp(0 - m) > 0 gives phantom keys with value 0 "
        "a share of every row's probability. Every padded column must be -inf before the row max.",
        tests=(f"{FWD}[readable-ragged-N20-d8]",),
        caught_by="N = 20 with Bc = 8: 4 phantom keys take probability mass from the 20 real ones",
    ),
    Bug(
        name="causal-mask-off-by-one",
        title="Causal mask off by one (a query does not see its own key)",
        file="numba_flash/fa2_forward.py",
        paper="FA2 §3.1.1 (causal)",
        edits=(
            E(
                "if masked and (col >= s_k or (CAUSAL and col > row + causal_offset)):",
                "if masked and (col >= s_k or (CAUSAL and col >= row + causal_offset)):",
            ),
        ),
        lesson="Query i may see key j iff j <= i + (s_k - s_q): the diagonal is visible. With >= the diagonal "
        "is masked too; the first row of a square problem then sees no key at all.",
        tests=(f"{FWD}[readable-causal-sq<sk-gqa-d12]",),
        caught_by="causal s_q = 19, s_k = 27: each row loses its last visible key",
    ),
    Bug(
        name="causal-top-left",
        title="Top-left instead of bottom-right causal mask when s_q != s_k",
        file="numba_flash/fa2_forward.py",
        paper="FA2 §3.1.1 (causal)",
        edits=(
            E(
                "prob.softmax_scale, prob.group, prob.causal_offset, prob.seed",
                "prob.softmax_scale, prob.group, 0, prob.seed",
            ),
        ),
        lesson="flash-attn aligns the causal mask to the bottom-right corner: the last query sees every key "
        "(j <= i + s_k - s_q), which is what a decoder with a KV cache needs. The top-left mask "
        "(j <= i) agrees only when s_q = s_k.",
        tests=(f"{FWD}[readable-causal-sq<sk-gqa-d12]",),
        caught_by="causal with s_q = 19 < s_k = 27: every row sees 8 keys too few",
    ),
    Bug(
        name="gqa-head-by-modulo-forward",
        title="GQA: K/V head of a query head by modulo instead of division (forward)",
        file="numba_flash/fa2_forward.py",
        paper="FA2 §3 (MQA/GQA)",
        edits=(E("hk = h // group", "hk = h % (nheads // group)"),),
        lesson="With h query heads on h_k K/V heads, query heads h_k * g .. h_k * g + G - 1 share one K/V head: "
        "hk = h // G (G = h / h_k). h % h_k interleaves the groups instead. Both agree for MHA (G = 1) "
        "and MQA (h_k = 1), which is why only a GQA case with several K/V heads and G > 1 catches it.",
        tests=(f"{EDGE}::test_forward_gqa_with_several_kv_heads_reads_each_groups_head[flash2-readable]",),
        caught_by="h = 4 query heads on h_k = 2 K/V heads: heads 1 and 2 read the other group's K, V",
    ),
    Bug(
        name="missing-barrier-after-tile-load",
        title="Missing barrier after loading K_j, V_j",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L7",
        edits=(E("            cuda.syncthreads()  # Sync: K_j, V_j in SRAM before L8 and L10 read them\n", ""),),
        lesson="All threads of the block load K_j, V_j together, each a share. Without a barrier a thread "
        "starts computing S_ij while others are still loading: it reads elements that are not there yet. "
        "On a GPU this is a race that shows now and then; a NaN-filled SRAM and a schedule that runs one "
        "thread at a time between barriers make it fail every time in the simulator.",
        tests=(f"{BARRIERS}[flash2-forward-readable]",),
        caught_by="one thread at a time: thread 0 reads the NaN that threads 1.. have not overwritten yet",
        kind="barrier",
    ),
    Bug(
        name="missing-barrier-before-tile-load",
        title="Missing barrier before overwriting K_j, V_j with the next block",
        file="numba_flash/fa2_forward.py",
        paper="FA2.1 L6-L7",
        edits=(
            E(
                "            cuda.syncthreads()  # Sync: every thread is done with K_{j-1}, V_{j-1} before they are "
                "overwritten\n",
                "",
            ),
        ),
        lesson="The SRAM tile is reused for every j. A thread that finishes block j - 1 early must not load "
        "block j over it while another thread is still reading block j - 1: the barrier at the top of "
        "the loop waits for every reader.",
        tests=(f"{BARRIERS}[flash2-forward-readable]",),
        caught_by="one thread at a time: thread 0 loads its share of K_j before thread 1 has read K_{j-1}",
        kind="barrier",
    ),
    Bug(
        name="fa1-O-not-unnormalised",
        title="FA1: O_i not un-normalised by l_i before the update",
        file="numba_flash/alg1_forward.py",
        paper="Alg.1 L12",
        edits=(E("scale_O = sl_i[r] * r_alpha[a]", "scale_O = r_alpha[a]"),),
        lesson="FA1 keeps O_i normalised in HBM between steps. Line 12 multiplies it back by diag(l_i) before "
        "rescaling and adding P~ V_j, then divides by l_new. Dropping diag(l_i) weights the old blocks "
        "by 1 instead of by l_i / l_new.",
        tests=(f"{FA1_FWD}[readable-causal-sq<sk-odd-d]",),
        caught_by="s_k = 40 in key blocks of 16: the earlier blocks get the wrong weight on every row",
    ),
    Bug(
        name="block-mask-read-transposed",
        title="Block-sparse: the block mask read as M_ji instead of M_ij",
        file="numba_flash/alg1_forward.py",
        paper="Alg.5 L8",
        edits=(E("if SPARSE and gmask[mb, mh, i, j] == 0:", "if SPARSE and gmask[mb, mh, j, i] == 0:"),),
        lesson="M_ij = 1 lets query block i (rows) attend to key block j (columns). Swapping the two indices "
        "computes the tiles of M^T: the same for a symmetric mask (all ones, the butterfly), other "
        "tiles for any other square mask, so a symmetric test mask cannot see this bug.",
        tests=(f"{BSP}::test_square_block_mask_that_is_not_symmetric_is_read_as_m_ij_forward_and_backward",),
        caught_by="a 4 x 4 block mask with M != M^T: query block 0 attends to key blocks 0 and 3 instead of 0 and 1",
    ),
    Bug(
        name="fa1-dQ-overwritten",
        title="FA1 backward: dQ_i overwritten instead of accumulated over the key blocks",
        file="numba_flash/alg4_backward.py",
        paper="Alg.4 L21",
        edits=(E("gdQ[bi, row, hi, c] = rdQ_old[a, e] + tau * rdQ[a, e]", "gdQ[bi, row, hi, c] = tau * rdQ[a, e]"),),
        lesson="dQ_i = tau sum_j dS_ij K_j sums over every key block j, and in FA1's loop order j is the outer "
        "loop: dQ_i must be read, added to and written back on every (i, j) (line 21). Writing only the "
        "newest term keeps the last key block's contribution.",
        tests=(f"{FA1_BWD}[ragged-N-d16-readable]",),
        caught_by="N = 37 with Bc = 16: dQ holds only the last of 3 key blocks",
    ),
    Bug(
        name="dK-without-tau",
        title="dK without the softmax scale tau",
        file="numba_flash/alg4_backward.py",
        paper="Alg.4 L22, L24",
        edits=(E("gdK[bi, col, hi, c] = tau * rdK[a, e]", "gdK[bi, col, hi, c] = rdK[a, e]"),),
        lesson="S = tau Q K^T, so dK = tau dS^T Q and dQ = tau dS K: the chain rule through the scale. "
        "Forgetting tau scales dK by 1 / tau = sqrt(d).",
        tests=(f"{FA1_BWD}[ragged-N-d16-readable]",),
        caught_by="d = 16: dK is 4x too large",
    ),
    Bug(
        name="dQ-without-tau",
        title="dQ without the softmax scale tau",
        file="numba_flash/fa2_backward.py",
        paper="FA2.2 L15",
        edits=(
            E("cuda.atomic.add(gdQ, (b, row0 + r, h, x), tau * acc)", "cuda.atomic.add(gdQ, (b, row0 + r, h, x), acc)"),
        ),
        lesson="The same chain rule as for dK: dQ_i += tau dS_ij K_j.",
        tests=(f"{BWD}[readable-causal-sq<sk-gqa-d12-atomic-dq]",),
        caught_by="d = 12: dQ is sqrt(12) times too large",
    ),
    Bug(
        name="dS-without-D",
        title="dS = P o dP, without subtracting D_i",
        file="numba_flash/fa2_backward.py",
        paper="FA2.2 L14",
        edits=(E("dS = P * (dP - sD_i[r])", "dS = P * dP"),),
        lesson="The softmax Jacobian is diag(p) - p p^T, so dS_i = P_i o (dP_i - D_i) with D_i = P_i . dP_i "
        "= dO_i . O_i. Without D_i every row of dS misses the term that keeps it summing to 0.",
        tests=(f"{BWD}[readable-causal-sq<sk-gqa-d12-atomic-dq]",),
        caught_by="dQ and dK against the float64 reference: off by P_ij D_i on every entry",
    ),
    Bug(
        name="D-from-one-tile",
        title="D_i summed over the first tile of columns instead of the whole row",
        file="numba_flash/alg3_backward.py",
        paper="Alg.3 L3",
        edits=(
            E(
                "for col in range(t, s_k, NT):\n            z = float32(1.0)\n            if DROPOUT:\n"
                "                z = dropout_scale if keep(k_row, col, threshold) else ZERO\n            acc +=",
                "for col in range(t, min(s_k, NT), NT):\n            z = float32(1.0)\n            if DROPOUT:\n"
                "                z = dropout_scale if keep(k_row, col, threshold) else ZERO\n            acc +=",
            ),
        ),
        lesson="D_i = sum_l P_il dP_il is a sum over the *whole* row of keys. A kernel that tiles the columns "
        "must finish the row before using D_i (or use the D trick, D_i = dO_i . O_i, which needs no "
        "columns at all). Summing one tile leaves out the other tiles' terms.",
        tests=(f"{STD_BWD}[ragged-N-standard]",),
        caught_by="s_k = 17 with 8 threads per row: D_i misses 9 of 17 terms",
    ),
    Bug(
        name="gqa-head-by-modulo-backward",
        title="GQA: the query heads of a K/V head by modulo instead of by group (backward)",
        file="numba_flash/fa2_backward.py",
        paper="FA2 §3 (MQA/GQA)",
        edits=(E("for h in range(hk * group, (hk + 1) * group):", "for h in range(hk, nheads, nheads_k):"),),
        lesson="dK_j and dV_j of K/V head hk sum over the query heads of its group, hk * G .. hk * G + G - 1. "
        "Summing over the heads h with h % h_k == hk pairs the wrong heads whenever h_k > 1 and G > 1; "
        "MHA and MQA hide it.",
        tests=(f"{EDGE}::test_backward_gqa_with_several_kv_heads_sums_each_group_into_its_head[flash2-readable]",),
        caught_by="h = 4 on h_k = 2: dK, dV of head 0 sum query heads 0 and 2 instead of 0 and 1",
    ),
    Bug(
        name="dropout-mask-transposed-in-backward",
        title="Backward regenerates the dropout mask with row and column swapped",
        file="numba_flash/fa2_backward.py",
        paper="FA1 Alg.4 L14",
        edits=(E("keep(row_key(k_bh, row), col, threshold)", "keep(row_key(k_bh, col), row, threshold)"),),
        lesson="The backward pass must drop exactly the entries the forward dropped: Z is regenerated from the "
        "seed with the same (head, row, col) hash, never stored. In a kernel where the thread owns a key "
        "column it is easy to swap the indices; the result is another, equally plausible mask.",
        tests=(f"{BWD}[readable-causal-sq>sk-masked-rows-dropout-d16-atomic-dq]",),
        caught_by="dropout p = 0.2: dV = (P o Z)^T dO with another Z is far outside the 3x rule",
    ),
    Bug(
        name="non-atomic-dQ",
        title="dQ accumulated with a plain += instead of an atomic add",
        file="numba_flash/fa2_backward.py",
        paper="FA2.2 L15",
        edits=(E("cuda.atomic.add(gdQ, (b, row0 + r, h, x), tau * acc)", "gdQ[b, row0 + r, h, x] += tau * acc"),),
        lesson="In FA2's backward every column block j adds dS_ij K_j into the same dQ_i, from different "
        "thread blocks at the same time. A read-add-write loses the updates that interleave. The "
        "simulator runs one thread block at a time, so it never interleaves them: this bug is caught "
        "only on a GPU.",
        tests=(
            "tests/kernels/test_fa2_kernels.py::test_fa2_backward_gradients_within_3x_float32_error_on_gpu_shapes[readable-N1024-d64-causal]",
            "tests/kernels/test_fa2_kernels.py::test_fa2_backward_gradients_within_3x_float32_error_on_gpu_shapes[readable-N4096-d64-causal]",
        ),
        caught_by="N = 1024: 16 column blocks race on every dQ_i; lost updates put dQ far outside the 3x rule",
        gpu_only=True,
    ),
)
# [/doc:bug-gallery]

BY_NAME = {b.name: b for b in GALLERY}


# ------------------------------------------------------------------------------------------------
# Planting
# ------------------------------------------------------------------------------------------------
def repo_root() -> Path:
    """The source checkout this package was imported from (it holds ``tests/`` and ``reference/``)."""
    root = Path(__file__).resolve().parents[1]
    if not ((root / "tests").is_dir() and (root / "reference").is_dir()):
        raise RuntimeError(f"the bug gallery needs a source checkout (with tests/ and reference/); {root} is not one")
    return root


class UnknownBug(LookupError):
    """A name (or list number) that is not in the gallery; the message is one line, with the close matches."""


def get(name: str) -> Bug:
    """The entry called ``name``, or the ``name``-th of :func:`format_list` (1-based) when ``name`` is a number."""
    if name in BY_NAME:
        return BY_NAME[name]
    if name.strip().lstrip("+-").isdigit():
        k = int(name)
        if 1 <= k <= len(GALLERY):
            return GALLERY[k - 1]
        raise UnknownBug(f"no bug number {k} in the gallery: the numbers are 1 to {len(GALLERY)} (see the list)")
    close = difflib.get_close_matches(name, BY_NAME, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; list them with: python -m numba_flash bugs"
    raise UnknownBug(f"no bug named {name!r} in the gallery{hint}")


def mutate(text: str, bug: Bug) -> str:
    """``text`` with the edits of ``bug`` applied; MutationError unless each original occurs exactly once."""
    for k, edit in enumerate(bug.edits):
        n = text.count(edit.old)
        if n != 1:
            where = "is not in" if n == 0 else f"occurs {n} times in"
            raise MutationError(
                f"bug {bug.name!r}, edit {k + 1}: the original text {edit.old!r} {where} {bug.file} "
                f"(the kernel changed: update the gallery entry in tools/bugs.py)"
            )
        text = text.replace(edit.old, edit.new)
    return text


def diff(bug: Bug, root: Path | None = None) -> str:
    """The unified diff that planting ``bug`` makes."""
    root = repo_root() if root is None else root
    old = (root / bug.file).read_text(encoding="utf-8")
    new = mutate(old, bug)
    return "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{bug.file}", f"b/{bug.file}", n=2)
    )


def _installed_path(rel: str) -> str:
    top, _, rest = rel.partition("/")
    if top not in PACKAGES:
        raise MutationError(f"{rel}: the gallery can only mutate files of {', '.join(PACKAGES)}")
    return f"{PACKAGES[top]}/{rest}"


GUARD = '''"""pytest plugin of the bug gallery (written into the copy; loaded with -p _gallery_guard).

* Fail (usage error) unless the planted copy is what gets imported: a harness that tests the working
  tree instead would make every bug look caught or every bug survive.
* In the simulator, run every kernel one thread at a time between barriers (numba_flash.runtime.simulator):
  a schedule a GPU may pick, deterministic (no flaky run from the simulator's own races) and faster.
"""
import os
import sys

import numba_flash
import numba_flash_reference
import pytest

_SCHEDULE = []


def pytest_configure(config):
    copy = os.path.realpath(os.environ["NUMBA_FLASH_GALLERY_COPY"])
    for mod in (numba_flash, numba_flash_reference):
        path = os.path.realpath(mod.__file__)
        if not path.startswith(copy + os.sep):
            raise pytest.UsageError(
                f"bug gallery: {mod.__name__} was imported from {path}, not from the copy in {copy}"
            )
    if numba_flash.runtime.backend.is_simulator():
        from numba_flash.runtime.simulator import one_thread_at_a_time

        _SCHEDULE.append(one_thread_at_a_time())
        _SCHEDULE[0].__enter__()


def pytest_unconfigure(config):
    while _SCHEDULE:
        _SCHEDULE.pop().__exit__(None, None, None)
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\\ngallery-cpu-seconds: {r.ru_utime + r.ru_stime:.2f}")
'''


def copy_packages(dest: Path, root: Path | None = None) -> Path:
    """Copy ``numba_flash/`` and ``reference/`` (as ``numba_flash_reference/``) into ``dest``."""
    root = repo_root() if root is None else root
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for src, name in PACKAGES.items():
        shutil.copytree(root / src, dest / name, ignore=ignore)
    (dest / "_gallery_guard.py").write_text(GUARD, encoding="utf-8")
    return dest


def plant(bug: Bug | None, dest: Path, root: Path | None = None) -> Path:
    """A copy of the packages in ``dest`` with ``bug`` planted (None: the unmutated control copy)."""
    root = repo_root() if root is None else root
    copy_packages(dest, root)
    if bug is not None:
        target = dest / _installed_path(bug.file)
        text = mutate(target.read_text(encoding="utf-8"), bug)
        compile(text, str(target), "exec")  # a mutant must be a program, not a syntax error
        target.write_text(text, encoding="utf-8")
    return dest


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What pytest did on a copy: its exit code, the failed tests (node id, message), output and time."""

    returncode: int
    failures: list[tuple[str, str]]
    output: str
    seconds: float
    cpu_seconds: float = float("nan")

    @property
    def failed(self) -> bool:
        """True when tests ran and at least one failed (pytest exit code 1), not a harness error."""
        return self.returncode == 1 and bool(self.failures)


_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")


def pytest_command(copy: Path, tests, *, stop_first: bool = True, root: Path | None = None) -> list[str]:
    """The pytest command line that runs ``tests`` (node ids relative to the repository root) on ``copy``."""
    root = repo_root() if root is None else root
    # pyproject's ``pythonpath = ["."]`` would put the repository's own numba_flash first on sys.path;
    # override it with the copy first (the repository after it, for ``bench`` and ``tests``).
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(root / "pyproject.toml"),
        "--rootdir",
        str(root),
        "-o",
        f"pythonpath={copy} {root}",
        "-p",
        "_gallery_guard",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-q",
        "--tb=short",
        "-rfE",
    ]
    if stop_first:
        cmd.append("-x")
    return cmd + [str(root / t) for t in tests]


def run_tests(
    copy: Path,
    tests,
    backend: str = "simulator",
    *,
    stop_first: bool = True,
    timeout: float = 900,
    root: Path | None = None,
) -> RunResult:
    """Run ``tests`` in a fresh process that imports the packages from ``copy`` first."""
    root = repo_root() if root is None else root
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["NUMBA_FLASH_BACKEND"] = backend
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["NUMBA_FLASH_GALLERY_COPY"] = str(copy)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    env["COLUMNS"] = "1000"  # pytest's short summary keeps the failure message only if the line fits
    t0 = time.perf_counter()
    proc = subprocess.run(
        pytest_command(copy, tests, stop_first=stop_first, root=root),
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.perf_counter() - t0
    output = proc.stdout + proc.stderr
    prefix = os.path.relpath(root, copy) + "/"  # pytest names tests relative to where it runs (the copy)
    failures = [
        (m.group(2).removeprefix(prefix), m.group(3) or "") for m in map(_SUMMARY.match, output.splitlines()) if m
    ]
    cpu = re.search(r"^gallery-cpu-seconds: ([\d.]+)$", output, re.M)
    return RunResult(proc.returncode, failures, output, seconds, float(cpu.group(1)) if cpu else float("nan"))


def run_bug(
    bug: Bug | None, tests=None, backend: str | None = None, *, timeout: float = 900, root: Path | None = None
) -> RunResult:
    """Plant ``bug`` in a temporary copy and run its tests there, stopping at the first failure.

    ``bug=None`` is the control run: ``tests`` on the unmutated copy, all of them (no ``-x``), on
    ``backend`` (default: the simulator).
    """
    root = repo_root() if root is None else root
    tests = bug.tests if tests is None else tests
    backend = backend or ("simulator" if bug is None else bug.backend)
    with tempfile.TemporaryDirectory(prefix="numba-flash-bug-") as tmp:
        copy = plant(bug, Path(tmp), root)
        return run_tests(copy, tests, backend, stop_first=bug is not None, timeout=timeout, root=root)


def selected(gpu: bool) -> list[Bug]:
    """The entries that run on one backend: the GPU-only ones with ``gpu=True``, the others without."""
    return [b for b in GALLERY if b.gpu_only == gpu]


def control_tests(bugs) -> list[str]:
    """Every test some entry relies on, once each, in gallery order: what the unmutated copy must pass."""
    return list(dict.fromkeys(t for b in bugs for t in b.tests))


# ------------------------------------------------------------------------------------------------
# Command line (python -m numba_flash bugs ...)
# ------------------------------------------------------------------------------------------------
def format_list() -> str:
    lines = [f"{'#':>3s} {'name':38s} {'where':30s} {'paper':24s} {'runs on':10s} title"]
    for k, b in enumerate(GALLERY, 1):
        where = "GPU" if b.gpu_only else "simulator"
        lines.append(f"{k:3d} {b.name:38s} {b.file:30s} {b.paper:24s} {where:10s} {b.title}")
    lines.append(
        f"\n{len(GALLERY)} bugs. Show one: --show NAME (or its number); plant one and run its tests: --run NAME; "
        "all: --run-all [--gpu]"
    )
    return "\n".join(lines)


def _report(bug: Bug, res: RunResult) -> str:
    if res.failed:
        node, msg = res.failures[0]
        return (
            f"CAUGHT    {bug.name:38s} {res.seconds:6.1f} s ({res.cpu_seconds:5.1f} s CPU)  {node}\n          "
            f"{msg[:300]}"
        )
    if res.returncode == 0:
        return f"SURVIVED  {bug.name:38s} {res.seconds:6.1f} s  every test passed: {', '.join(bug.tests)}"
    tail = "\n".join(res.output.strip().splitlines()[-15:])
    return (
        f"ERROR     {bug.name:38s} {res.seconds:6.1f} s  pytest exit code {res.returncode} (harness error, not a "
        f"catch)\n{tail}"
    )


def cmd_show(name: str) -> int:
    bug = get(name)
    print(f"{bug.title}  [{bug.name}]\n{bug.file}, {bug.paper}\n\n{bug.lesson}\n")
    print(diff(bug))
    print(f"Caught by ({bug.backend}): {', '.join(bug.tests)}\nWhy: {bug.caught_by}")
    return 0


def cmd_run(name: str) -> int:
    bug = get(name)
    print(
        f"planting {bug.name} in a copy of the package; running {len(bug.tests)} test(s) on the {bug.backend} ...",
        flush=True,
    )
    print(diff(bug))
    res = run_bug(bug)
    print(_report(bug, res))
    if res.failed:
        print("\nThe failure, as pytest reported it:\n" + _failure_excerpt(res.output))
    return 0 if res.failed else 1


def _failure_excerpt(output: str, limit: int = 40) -> str:
    lines = [re.sub(r"([_=!])\1{30,}", lambda m: m.group(1) * 30, ln) for ln in output.splitlines()]
    start = next((k for k, ln in enumerate(lines) if ln.startswith("____")), 0)
    return "\n".join(lines[start : start + limit])


def cmd_run_all(gpu: bool = False, jobs: int = 2) -> int:
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    bugs = selected(gpu)
    t0 = time.perf_counter()
    print(
        f"control: the unmutated copy must pass the {len(control_tests(bugs))} tests the {len(bugs)} bugs rely on ...",
        flush=True,
    )
    control = run_bug(None, control_tests(bugs), "gpu" if gpu else "simulator")
    ok = control.returncode == 0
    print(f"control {'passed' if ok else 'FAILED'} in {control.seconds:.1f} s", flush=True)
    if not ok:
        print("\n".join(control.output.strip().splitlines()[-30:]))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(run_bug, bugs))
    for bug, res in zip(bugs, results):
        print(_report(bug, res))
        ok = ok and res.failed
    caught = sum(r.failed for r in results)
    cpu = control.cpu_seconds + sum(r.cpu_seconds for r in results)
    print(
        f"\n{caught} of {len(bugs)} bugs caught; {time.perf_counter() - t0:.0f} s in all ({jobs} at a time), "
        f"{cpu:.0f} s of CPU in the pytest processes"
    )
    return 0 if ok else 1


def main(args) -> int:
    """Entry point of ``python -m numba_flash bugs``."""
    if args.show:
        return cmd_show(args.show)
    if args.run:
        return cmd_run(args.run)
    if args.run_all:
        return cmd_run_all(gpu=args.gpu, jobs=args.jobs)
    print(format_list())
    return 0
