"""numba-flash's NumPy reference ladder: every algorithm of FlashAttention and FlashAttention-2.

Installed as ``numba_flash_reference`` (the source folder is ``reference/``), so that it takes no
generic top-level name in site-packages. It imports nothing but NumPy and the standard library: a
reader can run and study it without Numba, torch or a GPU.

Modules, one per algorithm, named like their kernel twins in ``numba_flash/``:

=====================  ====================================================================
``alg0_standard``      FA1 Algorithm 0: standard attention (materializes S and P), the oracle
``alg1_forward``       FA1 Algorithm 1: tiled forward, K/V-outer, O/l/m rewritten in HBM
``alg2_forward``       FA1 Algorithm 2: Algorithm 1 plus scale, causal mask and dropout
``alg3_backward``      FA1 Algorithm 3: standard backward (materializes P, dP, dS)
``alg4_backward``      FA1 Algorithm 4: recomputation backward with D_i = rowsum(dO_i * O_i)
``alg5_block_sparse``  FA1 Algorithm 5: block-sparse forward
``fa2_forward``        FA2 Algorithm 1: query-outer forward, un-normalized accumulator, L only
``fa2_backward``       FA2 Algorithm 2: backward from L with the D pre-pass
``online_softmax``     the merge identity behind Theorem 1
``io_model``           counted HBM accesses and the closed forms of Theorems 2 and 5, Prop. 4
``common``             semantics shared by all: layout, scale, causal mask, dropout hash, blocks
=====================  ====================================================================
"""

from .common import (  # noqa: F401
    DEFAULT_SRAM_ELEMENTS,
    block_sizes,
    causal_mask,
    dropout_keep_mask,
    dropout_threshold,
)
