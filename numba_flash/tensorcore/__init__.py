"""FlashAttention-2 on the tensor cores, issued from Numba through inline PTX.

Three layers, each importing only the one below it (and :mod:`numba_flash.device`, :mod:`numba_flash.runtime`):

=====================================  =====================================================================
module                                 what it is
=====================================  =====================================================================
``tensorcore/ptx.py``                  ``mma.sync``, ``ldmatrix``, ``cp.async``, the tf32 split, half packing:
                                       inline-PTX intrinsics and their simulator twins; knows nothing of attention
``tensorcore/fragments.py``            attention's steps on m16n8 fragments: masking, row maxima, line 8's
                                       3xTF32 ``mma`` steps of ``S``
``tensorcore/fa2_forward_tf32.py``     FA2 Algorithm 1, float32 accuracy (3xTF32 ``m16n8k8``)
``tensorcore/fa2_backward_tf32.py``    FA2 Algorithm 2, float32 accuracy (3xTF32), the forward's ``S`` bit for bit
``tensorcore/fa2_forward_half.py``     FA2 Algorithm 1 for float16 / bfloat16 (``m16n8k16``, float32 accumulation)
``tensorcore/fa2_backward_half.py``    FA2 Algorithm 2 for float16 / bfloat16
=====================================  =====================================================================

Which of them runs a problem is decided in one place, :data:`numba_flash.registry.KERNELS` (variant
``"tensorcore"``, routed by dtype and head dim); no kernel module here picks another.
"""
