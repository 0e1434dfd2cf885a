"""The fast (FFMA) twins of the readable kernels, and the host and device helpers only they use.

Each module here has the same file name as the readable kernel it speeds up (``numba_flash/<name>.py``)
and the same NumPy reference (``reference/<name>.py``); its docstring says what changed and what it
bought, in measured numbers. :mod:`numba_flash.registry` names each one's variant (the tensor-core
kernels live in :mod:`numba_flash.tensorcore`):

=================================  ============  =================================================
module                             variant       what it is
=================================  ============  =================================================
``fast/alg1_forward.py``           ``fast``      FA1 Algorithms 1-2, register-blocked, > 48 KB SRAM
``fast/alg4_backward.py``          ``fast``      FA1 Algorithm 4, register-blocked
``fast/fa2_forward.py``            ``fast``      FA2 Algorithm 1, register-blocked FFMA (and ``tensorcore`` above d = 128)
``fast/fa2_backward.py``           ``fast``      FA2 Algorithm 2, register-blocked (and ``tensorcore`` above d = 128)
=================================  ============  =================================================

Helpers: :mod:`~numba_flash.fast._regtile` (register-tile steps shared by the FFMA kernels),
:mod:`~numba_flash.fast._tiles` (HBM -> SRAM tile moves), :mod:`~numba_flash.fast._plan` (launch plans),
:mod:`~numba_flash.fast._prepass` (the warp-per-row D pre-pass).
"""
