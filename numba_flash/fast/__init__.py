"""The fast twins of the readable kernels, and the helpers only they use.

Each module here has the same file name as the readable kernel it speeds up (``numba_flash/<name>.py``)
and the same NumPy reference (``reference/<name>.py``); its docstring says what changed and what it
bought, in measured numbers. :mod:`numba_flash.registry` names each one's variant:

=================================  ============  =================================================
module                             variant       what it is
=================================  ============  =================================================
``fast/alg1_forward.py``           ``fast``      FA1 Algorithms 1-2, register-blocked, > 48 KB SRAM
``fast/alg4_backward.py``          ``fast``      FA1 Algorithm 4, register-blocked
``fast/fa2_forward.py``            ``fast``      FA2 Algorithm 1, register-blocked FFMA
``fast/fa2_forward_tc.py``         ``tensorcore``  FA2 Algorithm 1 on the tensor cores (3xTF32 mma.sync)
``fast/fa2_forward_half.py``       (tensorcore)  the same for fp16/bf16 inputs (m16n8k16), run by fa2_forward_tc
``fast/fa2_backward.py``           ``fast``      FA2 Algorithm 2, register-blocked
``fast/fa2_backward_tc.py``        ``tensorcore``  FA2 Algorithm 2: the half kernel for fp16/bf16, else fa2_backward
``fast/fa2_backward_half.py``      (tensorcore)  FA2 Algorithm 2 for fp16/bf16 inputs (m16n8k16), run by fa2_backward_tc
=================================  ============  =================================================

Helpers: :mod:`~numba_flash.fast._regtile` (register-tile steps shared by the FFMA kernels),
:mod:`~numba_flash.fast._mma` (inline-PTX ``mma.sync`` and its simulator twin),
:mod:`~numba_flash.fast._smem` (dynamic shared memory above 48 KB).
"""
