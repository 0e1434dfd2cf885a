"""Launch plumbing shared by every kernel module, written once.

* :func:`check_attention_args` / :func:`check_backward_args`: every argument checked, with an error
  that names it, *before* anything is allocated or launched.
* :class:`Problem`: the checked sizes and options a kernel module needs (b, s_q, s_k, h, h_k, d, tau,
  causal, dropout threshold and seed).
* :class:`Allocator`: turns the caller's arrays (NumPy arrays, torch CPU or CUDA tensors) into arrays a
  kernel can take, allocates outputs in the same world, and hands results back in the caller's type
  and dtype. CUDA tensors are the kernel arrays themselves (numba takes them through
  ``__cuda_array_interface__``, :mod:`numba_flash.runtime.direct` without numba's per-launch work); NumPy
  arrays run as they are in the simulator and are copied to and from the device on a GPU.
* Output poisoning: with :func:`poison_outputs` (or ``NUMBA_FLASH_POISON=1``) every output a kernel
  must write is allocated full of NaN, so an element a kernel forgets to write fails the tests.
* :class:`ForwardOutput`: what a forward kernel module returns.
* :class:`ForwardKernelModule` / :class:`BackwardKernelModule`: the one contract every kernel module
  (readable, fast or tensor-core) follows, so that :mod:`numba_flash.registry` can treat them alike.

Kernel modules see only "kernel arrays" (NumPy in the simulator, Numba device arrays or torch CUDA tensors on a GPU) in
float32, in the caller's (batch, seqlen, nheads, headdim) layout with whatever strides it had: kernels
index ``gQ[b, row, h, c]`` and never assume contiguity.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from numba_flash_reference.common import dropout_threshold

import numpy as np
from numba import cuda

from .runtime import backend as _backend
from .runtime import replay as _replay

#: Largest supported head dimension (flash-attn's: 256; the kernels keep a d-long row per thread block tile).
MAX_HEADDIM = 256
#: numba-cuda's static shared-memory limit per block, in bytes.
STATIC_SMEM_BYTES = 48 * 1024

_POISON = os.environ.get("NUMBA_FLASH_POISON", "0") not in ("", "0")


def poisoning() -> bool:
    """Whether outputs are allocated full of NaN now (:func:`poison_outputs`)."""
    return _POISON


@contextlib.contextmanager
def poison_outputs(enabled: bool = True):
    """Within this block, outputs are allocated full of NaN (tests use it to catch unwritten elements)."""
    global _POISON
    old, _POISON = _POISON, enabled
    try:
        yield
    finally:
        _POISON = old


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------
_FLOAT_NAMES = {"float16", "bfloat16", "float32", "float64"}


def _dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def _is_torch(x) -> bool:
    # isinstance rather than a look at type(x).__module__: Dynamo (torch.compile) traces this check.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _device_of(x) -> str:
    if _is_torch(x):
        return str(x.device)
    if hasattr(x, "__cuda_array_interface__"):
        return "cuda"
    return "cpu"


@dataclass(frozen=True)
class Problem:
    """Checked sizes and options of one attention call."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    softmax_scale: float
    causal: bool
    dropout_p: float
    seed: int
    #: the inputs' dtype name ("float16", "bfloat16", "float32", "float64"): the half-precision kernels
    #: (:mod:`numba_flash.tensorcore.fa2_forward_half`) run float16/bfloat16 without converting them
    dtype: str = "float32"

    @property
    def group(self) -> int:
        """Query heads per key/value head (GQA/MQA)."""
        return self.nheads // self.nheads_k

    @property
    def threshold(self) -> int:
        """Dropout threshold floor(p * 2**32) (see numba_flash_reference.common)."""
        return dropout_threshold(self.dropout_p)

    @property
    def dropout_scale(self) -> float:
        """1 / (1 - p): kept probabilities are scaled by it (FA1 Alg.2 L14), so E[P~] = P."""
        return 1.0 / (1.0 - self.dropout_p)

    @property
    def causal_offset(self) -> int:
        """Key j is visible from query row i iff j <= i + causal_offset (bottom-right aligned)."""
        return self.seqlen_k - self.seqlen_q


def _zero_dim_item(x):
    """The Python scalar held by a 0-d NumPy array or 0-d torch tensor; ``x`` itself otherwise.

    Arrays with one or more dimensions are returned as they are (and then refused), even with one
    element: ``softmax_scale=np.array([0.5])`` is more likely a mistake than a scalar.
    """
    if isinstance(x, np.ndarray):
        return x[()] if x.ndim == 0 else x
    if _is_torch(x) and hasattr(x, "dim") and x.dim() == 0:
        return x.item()
    return x


def real_scalar(x, integral: bool = False):
    """``x`` as a Python float (or int with ``integral=True``), or None when it is not a real scalar.

    Accepted: :class:`numbers.Real` (int, float, fractions), NumPy integer and floating scalars, and
    0-d NumPy arrays or 0-d torch tensors holding one of those. Refused (None): bool (``True`` is not a
    scale), complex, strings, None, arrays or tensors with any dimension. With ``integral=True`` only
    integers are accepted (a float seed such as ``1.0`` is refused, not truncated). Range checks
    (finite, positive, ...) are the caller's, so that its error can name the argument.
    """
    if type(x) is float:  # Dev: the common cases first (bool is not int here: type(True) is bool)
        return None if integral else x
    if type(x) is int:
        return x if integral else float(x)
    x = _zero_dim_item(x)
    if isinstance(x, (bool, np.bool_)):
        return None
    if integral:
        return int(x) if isinstance(x, (numbers.Integral, np.integer)) else None
    if isinstance(x, (numbers.Real, np.integer, np.floating)):
        return float(x)
    return None


def _describe_scalar(x) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__name__} of shape {tuple(x.shape)} and dtype {_dtype_name(x)}"
    return type(x).__name__


#: Checks remembered at most (:func:`check_attention_args`'s memo; the oldest dropped first)
MAX_CHECKED = 1024
_checked: dict = {}  # memo key -> Problem (_check_key)
_PLAIN = (float, int, bool, type(None))


def _check_key(q, k, v, dropout_p, softmax_scale, causal, seed):
    """The memo key of a check whose inputs are torch tensors and whose options plain Python values: every input's
    dtype, shape and device and every option with its type (``causal=1`` is not ``causal=True``), which is all the
    check reads. None for anything else (NumPy arrays, tensor subclasses, NumPy or tensor scalars), and while
    ``torch.compile`` traces (Dynamo would guard on the memo)."""
    torch = sys.modules.get("torch")
    if torch is None or type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    if (
        type(dropout_p) not in _PLAIN
        or type(softmax_scale) not in _PLAIN
        or type(causal) not in _PLAIN
        or type(seed) not in _PLAIN
        or torch.compiler.is_compiling()
    ):
        return None
    return (
        q.dtype,
        q.shape,
        q.device,
        k.dtype,
        k.shape,
        k.device,
        v.dtype,
        v.shape,
        v.device,
        type(dropout_p),
        dropout_p,
        type(softmax_scale),
        softmax_scale,
        type(causal),
        causal,
        type(seed),
        seed,
    )


def check_attention_args(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, seed=0) -> Problem:
    """Validate a forward call; raise ValueError/TypeError naming the bad argument.

    Calls on torch tensors with plain Python options are remembered (:data:`MAX_CHECKED` of them): a call whose
    inputs have the dtypes, shapes and devices and whose options the values and types of one checked before gets
    that call's :class:`Problem` back without the check (9-16 us of an H100 host's time a call; a remembered one 2-3
    us). A call that fails the check is never remembered."""
    key = _check_key(q, k, v, dropout_p, softmax_scale, causal, seed)
    if key is not None:
        prob = _checked.get(key)
        if prob is not None:
            return prob
    prob = _check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed)
    if key is not None:
        if len(_checked) >= MAX_CHECKED:
            del _checked[next(iter(_checked))]
        _checked[key] = prob
    return prob


def _check_attention_args(q, k, v, dropout_p, softmax_scale, causal, seed) -> Problem:
    dts = []  # Dev: each input's dtype name and device read once (this runs on every call's host path)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array or tensor, got {type(x).__name__}")
        if len(x.shape) != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}"
            )
        dts.append(_dtype_name(x))
        if dts[-1] not in _FLOAT_NAMES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {dts[-1]}")
    if not (dts[0] == dts[1] == dts[2]):
        raise TypeError(f"q, k and v must have the same dtype, got {dts[0]}, {dts[1]}, {dts[2]}")
    devs = [_device_of(x) for x in (q, k, v)]
    if not (devs[0] == devs[1] == devs[2]):
        raise ValueError(f"q, k and v must be on the same device, got {devs[0]}, {devs[1]}, {devs[2]}")
    if not (_is_torch(q) == _is_torch(k) == _is_torch(v)):
        raise TypeError("q, k and v must all be torch tensors or all be arrays")
    b, s_q, h, d = (int(n) for n in q.shape)
    bk, s_k, h_k, dk = (int(n) for n in k.shape)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if 0 in tuple(x.shape):
            raise ValueError(f"{name} has a zero-size dimension: shape {tuple(x.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the same shape as k {tuple(k.shape)}, got {tuple(v.shape)}")
    if bk != b:
        raise ValueError(f"k has batch size {bk} but q has {b}")
    if dk != d:
        raise ValueError(f"k has headdim {dk} but q has {d}")
    if h % h_k != 0:
        raise ValueError(f"nheads of q ({h}) must be a multiple of nheads of k and v ({h_k})")
    if d > MAX_HEADDIM:
        raise ValueError(f"headdim {d} is larger than the supported maximum {MAX_HEADDIM}")
    p = real_scalar(dropout_p)
    if p is None or not (0.0 <= p < 1.0):
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if softmax_scale is None:
        tau = 1.0 / math.sqrt(d)
    else:
        tau = real_scalar(softmax_scale)
        if tau is None:
            raise TypeError(
                "softmax_scale must be a real number (int, float, NumPy scalar, 0-d array or 0-d tensor) "
                f"or None, got {_describe_scalar(softmax_scale)}"
            )
        if not math.isfinite(tau) or tau <= 0:
            raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale!r}")
        with np.errstate(over="ignore"):  # the overflow is the case this checks
            tau32 = float(np.float32(tau))  # the kernels scale in float32: a finite float64 may be inf or 0 there
        if not math.isfinite(tau32) or tau32 == 0.0:
            what = "overflows to inf" if not math.isfinite(tau32) else "underflows to 0"
            raise ValueError(
                f"softmax_scale must be a positive float32 number (the kernels compute in float32); "
                f"{softmax_scale!r} {what} in float32"
            )
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    seed_ = real_scalar(seed, integral=True)
    if seed_ is None or not (0 <= seed_ < 2**32):
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    return Problem(b, s_q, s_k, h, h_k, d, tau, bool(causal), p, seed_, dts[0])


def check_backward_args(dout, out, prob: Problem, q) -> None:
    """Validate the extra arrays of a backward call against the forward's problem."""
    want = (prob.batch, prob.seqlen_q, prob.nheads, prob.headdim)
    for name, x in (("dout", dout), ("out", out)):
        if not hasattr(x, "shape"):
            raise TypeError(f"{name} must be an array or tensor, got {type(x).__name__}")
        if tuple(int(n) for n in x.shape) != want:
            raise ValueError(f"{name} must have the shape of q {want}, got {tuple(x.shape)}")
        if _device_of(x) != _device_of(q):
            raise ValueError(f"{name} must be on the same device as q ({_device_of(q)}), got {_device_of(x)}")
        if _dtype_name(x) not in _FLOAT_NAMES:
            raise TypeError(f"{name} must be a floating-point array, got {_dtype_name(x)}")


# ----------------------------------------------------------------------------------------------
# Arrays: the caller's world <-> kernel arrays
# ----------------------------------------------------------------------------------------------
@cuda.jit
def _fill_kernel(flat, value):
    i = cuda.grid(1)
    if i < flat.size:
        flat[i] = value


class Allocator:
    """Kernel arrays for one call, in the world of its inputs (see the module docstring).

    Parameters
    ----------
    like : the caller's ``q`` (NumPy array, torch tensor, or Numba device array).
    """

    def __init__(self, like):
        self.torch_device = None
        # The caller's torch stream and the one the kernels launch on, where they differ (see join_caller_stream)
        self._caller_stream = self._launch_stream = None
        if _is_torch(like):
            self.kind = "torch-cuda" if like.is_cuda else "torch-cpu"
            if like.is_cuda:
                self.torch_device = like.device
                joined = streams_to_join(like.device)
                if joined is not None:
                    self._caller_stream, self._launch_stream = joined
        elif hasattr(like, "__cuda_array_interface__") and not isinstance(like, np.ndarray):
            self.kind = "device"
        else:
            self.kind = "numpy"
        self.on_device = not _backend.is_simulator()

    # -- inputs ------------------------------------------------------------------------------
    def to_kernel(self, x):
        """A float32 kernel array holding ``x`` (zero-copy where possible; strides kept)."""
        if self.kind == "torch-cuda":
            t = x.detach()
            if t.dtype != _torch().float32:
                t = t.float()
            return self._import(t)
        if self.kind == "device":
            return x if _dtype_name(x) == "float32" else cuda.to_device(x.copy_to_host().astype(np.float32))
        if self.kind == "torch-cpu":
            x = x.detach().float().numpy()
        a = np.asarray(x)
        if a.dtype != np.float32:
            a = a.astype(np.float32)
        if self.on_device:
            return cuda.to_device(np.ascontiguousarray(a))
        # In the simulator too, inputs go in as (simulated) device arrays. A NumPy array given to a
        # simulated launch is treated as cuda.InOut: copied in, and copied *back* into the host
        # array after every launch, whether or not a kernel wrote it. That copy-back failed on
        # read-only arrays ("assignment destination is read-only") and cost a copy per launch; a
        # device array is passed through as it is, as on a GPU. to_device refuses non-contiguous
        # buffers, so a strided view is made contiguous first (C or F order keeps its strides).
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            a = np.ascontiguousarray(a)
        return cuda.to_device(a)

    def to_words(self, x):
        """An ``int32`` kernel array of ``(b, s, h, d / 2)`` *words* of a float16/bfloat16 ``x`` of even head dim.

        Each word holds two adjacent elements of a row (the lower index in the low 16 bits), the
        register layout of ``f16x2`` / ``bf16x2``: zero-copy for torch tensors and NumPy arrays whose
        last dimension is contiguous, a contiguous copy otherwise.
        """
        if self.kind in ("torch-cuda", "torch-cpu"):
            t = x.detach()
            if t.stride(-1) != 1 or t.storage_offset() % 2 or any(s % 2 for s in t.stride()[:-1]):
                # clone, not contiguous(): a contiguous tensor at an odd offset is its own contiguous()
                t = t.clone(memory_format=_torch().contiguous_format)
            w = t.view(_torch().int32)
            if self.kind == "torch-cuda":
                return self._import(w)
            a = w.numpy()
        else:
            a = x.copy_to_host() if self.kind == "device" else np.asarray(x)
            if a.dtype != np.float16:
                raise TypeError(f"to_words needs float16 or bfloat16 data, got {a.dtype}")
            if a.strides[-1] != a.itemsize or any(s % 4 for s in a.strides[:-1]):
                a = np.ascontiguousarray(a)
            a = a.view(np.int32)
        if self.on_device:
            return cuda.to_device(np.ascontiguousarray(a))
        return cuda.to_device(a if (a.flags.c_contiguous or a.flags.f_contiguous) else np.ascontiguousarray(a))

    # -- outputs -----------------------------------------------------------------------------
    def full(self, shape, value, dtype=np.float32):
        shape = tuple(int(n) for n in shape)
        if self.kind == "torch-cuda":
            t = _torch().full(shape, value, dtype=_torch_dtype(dtype), device=self.torch_device)
            _replay.allocation(t, value)  # Dev: where a pass is being recorded (runtime/replay)
            return self._import(t)
        if self.on_device:
            arr = cuda.device_array(shape, dtype=dtype)
            if arr.size:
                flat = arr.reshape(arr.size)
                _fill_kernel[(arr.size + 255) // 256, 256](flat, value)
            return arr
        return np.full(shape, value, dtype=dtype)

    def empty(self, shape, dtype=np.float32):
        """An output every element of which a kernel must write: NaN-filled when poisoning."""
        if _POISON:
            return self.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1, dtype)
        shape = tuple(map(int, shape))
        if self.kind == "torch-cuda":
            t = _torch().empty(shape, dtype=_torch_dtype(dtype), device=self.torch_device)
            _replay.allocation(t, None)  # Dev: where a pass is being recorded (runtime/replay)
            return self._import(t)
        if self.on_device:
            return cuda.device_array(shape, dtype=dtype)
        return np.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype=np.float32):
        return self.full(shape, 0, dtype)

    # -- back to the caller ------------------------------------------------------------------
    def device_guard(self):
        """A context in which the kernels launch on the caller's GPU: ``torch.cuda.device(q.device)`` for torch CUDA
        tensors, nothing for other arrays.

        numba launches in the thread's current CUDA context, which is torch's *current* device, not necessarily
        the one the tensors live on (q on ``cuda:1`` while device 0 is current: the kernel would run on device 0
        with device 1's pointers). torch's own operators guard the device the same way.
        """
        if self.kind == "torch-cuda":
            return _torch().cuda.device(self.torch_device)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def launching(self):
        """The block in which a pass converts its arrays and launches: on the tensors' GPU (:meth:`device_guard`),
        and at its end the caller's stream ordered after the launches (:meth:`join_caller_stream`)."""
        with self.device_guard():
            yield
            self.join_caller_stream()

    def _import(self, t):
        """The torch CUDA tensor ``t`` handed to the kernels as it is (numba takes it through its CUDA array
        interface), with the launch stream first made to wait for the caller's stream (when they differ): what torch
        queued there for ``t`` (its producer, a conversion or a fill, the last use of its memory) is done before any
        kernel reads or writes it. (Until 2026-11-26 it was converted by ``cuda.as_cuda_array``, 13 us a tensor on an
        H200's host, seven a forward, by ``python -m bench.host_layers``.)"""
        if self._caller_stream is not None:
            self._launch_stream.wait_stream(self._caller_stream)
        return t

    def join_caller_stream(self) -> None:
        """Order the caller's current torch stream after this call's launches (torch CUDA tensors; else nothing).

        The kernels launch on CUDA's legacy default stream (numba's stream 0), which is torch's default stream.
        A stream the caller made current (``with torch.cuda.stream(s):``) is a non-blocking stream: it does not
        wait for the legacy stream, nor the legacy stream for it, and torch's ``__cuda_array_interface__``
        names no stream for ``cuda.as_cuda_array`` to wait for. So both directions are joined: every tensor
        this allocator hands to the kernels (converted inputs, filled or empty outputs) makes the legacy stream
        wait for the caller's first (:meth:`_import`), and this, called after the last launch, makes the
        caller's stream wait for the legacy one (what the caller queues next, reading ``out``, sees it written).
        On torch's default stream both are the same stream and nothing is done.
        """
        if self._caller_stream is not None:
            self._caller_stream.wait_stream(self._launch_stream)

    def result(self, arr, like_dtype=None):
        """``arr`` in the caller's world: a torch tensor (same device) or a NumPy array.

        ``like_dtype`` (the caller's input dtype) converts float32 results back, e.g. to float16; an
        ``int32`` word array (:meth:`to_words`, the half kernels' output) is reinterpreted as it, not converted.
        """
        if self.kind == "torch-cuda":
            t = arr if _is_torch(arr) else _torch().as_tensor(arr, device=self.torch_device)
            return t if like_dtype is None else _as_dtype(t, like_dtype)
        host = arr.copy_to_host() if self.on_device else arr
        if self.kind == "torch-cpu":
            t = _torch().from_numpy(np.ascontiguousarray(host))
            return t if like_dtype is None else _as_dtype(t, like_dtype)
        if self.kind == "device":  # half words come back as a float16 device array
            return cuda.to_device(host.view(np.float16)) if host.dtype == np.int32 else arr
        if like_dtype is None:
            return host
        return np.ascontiguousarray(host).view(like_dtype) if host.dtype == np.int32 else host.astype(like_dtype)


def streams_to_join(device):
    """``(caller's current stream, launch stream)`` of a call on torch CUDA tensors of ``device`` where the two differ
    and :class:`Allocator` must order them (see :meth:`Allocator.join_caller_stream`); None on torch's default
    stream."""
    torch = _torch()
    current = torch.cuda.current_stream(device)
    # Dev: raw stream 0 is CUDA's legacy default stream, numba's stream 0: nothing to join, and one torch
    # stream query fewer on every call's host path (3 us on an H200's host)
    if current.cuda_stream == 0:
        return None
    launch = torch.cuda.default_stream(device)
    return None if current == launch else (current, launch)


_TORCH_DTYPES: dict = {}


def _torch_dtype(dtype):
    """The torch dtype of an output allocated as NumPy ``dtype`` (float32, int32; uint32 as int32), from a table built
    once."""
    tdt = _TORCH_DTYPES.get(dtype)
    if tdt is None:
        torch = _torch()
        tdt = _TORCH_DTYPES[dtype] = {np.float32: torch.float32, np.int32: torch.int32, np.uint32: torch.int32}[
            np.dtype(dtype).type
        ]
    return tdt


def _as_dtype(t, like_dtype):
    """A torch result in ``like_dtype``: half words (int32) reinterpreted, float32 converted."""
    if t.dtype == _torch().int32:
        return t.contiguous().view(like_dtype)
    converted = t.to(like_dtype)
    _replay.conversion(t, converted)  # Dev: where a pass is being recorded (runtime/replay)
    return converted


def _torch():
    import torch

    return torch


def synchronize() -> None:
    """Wait for the device (no-op in the simulator, where launches are synchronous)."""
    if not _backend.is_simulator():
        cuda.synchronize()


@dataclass
class ForwardOutput:
    """What a forward kernel module returns (kernel arrays).

    out: (b, s_q, h, d) float32. lse: (b, h, s_q) float32 logsumexp L = m + log l (+inf where a row
    sees no key). m, l: (b, h, s_q) FA1 statistics, for the algorithms that keep them (else None).
    """

    out: Any
    lse: Any
    m: Any = None
    l: Any = None


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: CUDA's limit on grid y (and z). Kernels with one block per (batch, head) along y fold the excess into
#: z (:func:`bh_grid`); the tests lower it to run the folded path on tiny shapes in the simulator.
MAX_GRID_Y = 65535


def bh_grid(n_x: int, bh: int) -> tuple[int, int, int]:
    """Grid ``(n_x, y, z)`` with ``bh`` (batch * heads) blocks along y and z: ``y = min(bh, MAX_GRID_Y)``.

    The kernel's (batch, head) index is ``blockIdx.y + gridDim.y * blockIdx.z``; blocks at or past
    ``bh`` (in the last z slab) return at once. Up to 65535 the grid is ``(n_x, bh, 1)``, as before the fold.
    """
    y = max(1, min(bh, MAX_GRID_Y))
    return n_x, y, ceil_div(bh, y)


def check_block_pair(value, name: str) -> tuple[int, int]:
    """``(Br, Bc)`` from ``value``, a pair of positive integers; the ValueError names the argument ``name``."""
    try:
        br, bc = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (Br, Bc) of positive integers, got {value!r}") from None
    for part, n in (("Br", br), ("Bc", bc)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name}: {part} must be a positive integer, got {n!r}")
    return int(br), int(bc)


def block_mask_arrays(block_mask, alloc):
    """``(mask, span, col)``: the block mask's kernel arrays for the FA1 kernels (Algorithm 5).

    ``block_mask`` is a :class:`numba_flash.alg5_block_sparse.BlockMask`, or None for the dense
    kernels, which never read these arguments: then one-element placeholders of the same ranks.
    """
    if block_mask is not None:
        return block_mask.kernel_arrays(alloc)
    return _dense_placeholders(cuda.get_current_device().id if alloc.on_device else None)


_PLACEHOLDERS: dict = {}


def _dense_placeholders(device_id):
    """The dense kernels' placeholders, made once per GPU (``device_id``; None: host arrays), not at every launch."""
    if device_id not in _PLACEHOLDERS:
        arrays = (np.ones((1, 1, 1, 1), np.int32), np.zeros((1, 1, 1, 2), np.int32), np.ones((1, 1, 1), np.int32))
        _PLACEHOLDERS[device_id] = tuple(cuda.to_device(a) for a in arrays) if device_id is not None else arrays
    return _PLACEHOLDERS[device_id]


# ----------------------------------------------------------------------------------------------
# The kernel-module contract
# ----------------------------------------------------------------------------------------------
class KernelLaunch(NamedTuple):
    """One launch of a kernel module, for inspection (:mod:`numba_flash.runtime.resources`) and benchmarks."""

    name: str  # what it computes, with its tiles
    dispatcher: Any  # the compiled ``@cuda.jit`` kernel
    threads: int  # threads per block
    blocks: int  # blocks in the grid


# [doc:kernel-contract]
@runtime_checkable
class KernelModule(Protocol):
    """What every kernel module provides, with the same names (readable, fast and tensor-core alike).

    A module implements one pass (forward or backward) of one algorithm in one variant; the
    registry (:mod:`numba_flash.registry`) maps ``(algorithm, pass, variant)`` to it.
    """

    def choose_block_sizes(self, prob: Problem, block_sizes=None) -> tuple[int, int]:
        """``(Br, Bc)``: the query and key rows of the tiles the kernel runs with for ``prob``.

        ``block_sizes`` is the caller's override; a module that cannot honour it exactly rounds it
        to its tiling (and says how in its docstring), and one that cannot fit it raises ValueError
        naming ``block_sizes``.
        """

    def sram_bytes(self, prob: Problem, block_sizes=None) -> int:
        """Shared memory (SRAM) per thread block of the main kernel, in bytes (static + dynamic)."""

    def compiled_kernels(self, prob: Problem, block_sizes=None) -> list[KernelLaunch]:
        """The kernels one call launches for ``prob``, compiled for its constants (not launched)."""


@runtime_checkable
class ForwardKernelModule(KernelModule, Protocol):
    def forward(self, q, k, v, prob: Problem, alloc: Allocator, block_sizes=None) -> ForwardOutput:
        """O and the O(N) statistics, as :class:`ForwardOutput`, from float32 kernel arrays."""


@runtime_checkable
class BackwardKernelModule(KernelModule, Protocol):
    def backward(
        self,
        dout,
        q,
        k,
        v,
        out,
        fwd: ForwardOutput,
        prob: Problem,
        alloc: Allocator,
        block_sizes=None,
        deterministic: bool = False,
    ) -> tuple[Any, Any, Any]:
        """(dq, dk, dv) kernel arrays; dk, dv summed over each GQA group."""


# [/doc:kernel-contract]
#
# The dropout scale 1/(1-p) has one name, :attr:`Problem.dropout_scale`; the module-level function
# ``available()`` is optional (default: available) and says whether the variant can run here, and so is
# the constant ``TAKES_WORDS`` (default: False): True when ``forward`` takes q, k, v as half words
# (:meth:`Allocator.to_words`) rather than float32 kernel arrays (:mod:`numba_flash._run` reads it).
